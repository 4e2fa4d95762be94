"""Telemetry probes on fake sysfs trees: discovery by content, units, totals, wrap-around,
permission errors; memory probes; energy integration against exact integrals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from edgespec.telemetry.discover import discover
from edgespec.telemetry.energy import EnergyMeter, Sample, Sampler, measure_idle_power, trapezoid
from edgespec.telemetry.memory import MemoryProbe
from edgespec.telemetry.sources import SourceInfo, battery_state, discover_nvml
from edgespec.telemetry.sysfs import Tree

from support.fake_sysfs import agx_orin, battery, nano_jetpack4, orin_nx, rapl, write


def test_orin_nx_uses_vdd_in_only(tmp_path: Path) -> None:
    found = discover(Tree(orin_nx(tmp_path)))
    source = found.best
    assert source is not None and source.info.name == "ina3221-hwmon"
    assert source.info.scope == "board input (VDD_IN)"
    assert source.read() == pytest.approx(5.0 * 1.2)  # mV × mA, not the sum of rails


def test_agx_orin_without_vdd_in_sums_rails_of_both_devices(tmp_path: Path) -> None:
    source = discover(Tree(agx_orin(tmp_path))).best
    assert source is not None and source.info.scope.startswith("SoC rails (sum of")
    assert source.read() == pytest.approx(5.0 * (1.0 + 0.6 + 0.2 + 0.1))


def test_nano_jetpack4_iio_layout(tmp_path: Path) -> None:
    source = discover(Tree(nano_jetpack4(tmp_path))).best
    assert source is not None and source.info.name == "ina3221-iio"
    assert "POM_5V_IN" in source.info.scope
    assert source.read() == pytest.approx(3.2)


def test_hwmon_found_through_class_hwmon_by_name_not_path(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "/sys/class/hwmon/hwmon0/name": "coretemp",
            "/sys/class/hwmon/hwmon0/in1_label": "VDD_IN",
            "/sys/class/hwmon/hwmon5/name": "ina3221",
            "/sys/class/hwmon/hwmon5/in1_label": "VDD_IN",
            "/sys/class/hwmon/hwmon5/in1_input": 19000,
            "/sys/class/hwmon/hwmon5/curr1_input": 500,
        },
    )
    source = discover(Tree(tmp_path)).best
    assert source is not None and source.read() == pytest.approx(9.5)


def test_rapl_counts_packages_not_subzones_and_unwraps(tmp_path: Path) -> None:
    zone = tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj"
    rapl(tmp_path, energy_uj=999_000_000, max_range_uj=1_000_000_000)
    source = discover(Tree(tmp_path)).best
    assert source is not None and source.info.name == "rapl"
    assert source.info.kind == "counter" and source.info.detail == "package-0"
    assert source.read() == 0.0
    zone.write_text("500000\n")  # wrapped: 1 J to the top of the range, then 0.5 J
    assert source.read() == pytest.approx(1.5)
    zone.write_text("2500000\n")
    assert source.read() == pytest.approx(3.5)


def test_rapl_psys_zone_is_used_alone(tmp_path: Path) -> None:
    rapl(tmp_path, energy_uj=10)
    write(
        tmp_path,
        {
            "/sys/class/powercap/intel-rapl:1/name": "psys",
            "/sys/class/powercap/intel-rapl:1/energy_uj": 7,
        },
    )
    source = discover(Tree(tmp_path)).best
    assert source is not None and source.info.scope == "platform (psys)"


def test_rapl_permission_denied_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    rapl(tmp_path, energy_uj=1)

    def read(path: Path) -> str:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return path.read_text()

    found = discover(Tree(tmp_path, read=read))
    assert found.best is None
    reasons = {item.name: item.reason for item in found.unavailable}
    assert reasons["rapl"].startswith("permission")
    assert "rapl: unavailable: permission" in found.reason()


def test_discharging_battery_power_now(tmp_path: Path) -> None:
    source = discover(Tree(battery(tmp_path, power_uw=12_500_000))).best
    assert source is not None and source.info.name == "battery"
    assert source.read() == pytest.approx(12.5)
    assert battery_state(Tree(tmp_path)).percent == 80
    assert battery_state(Tree(tmp_path)).plugged is False


def test_discharging_battery_current_times_voltage(tmp_path: Path) -> None:
    tree = Tree(battery(tmp_path, power_uw=None, current_ua=-1_500_000, voltage_uv=11_400_000))
    source = discover(tree).best
    assert source is not None and source.info.detail == "BAT0 current×voltage"
    assert source.read() == pytest.approx(1.5 * 11.4)


def test_charging_battery_is_not_an_energy_source(tmp_path: Path) -> None:
    tree = Tree(battery(tmp_path, power_uw=9_000_000, status="Charging"))
    found = discover(tree)
    assert found.best is None
    assert "Charging" in {u.name: u.reason for u in found.unavailable}["battery"]
    assert battery_state(tree).plugged is True


def test_empty_tree_reports_every_reason(tmp_path: Path) -> None:
    found = discover(Tree(tmp_path))
    assert found.best is None
    assert {u.name for u in found.unavailable} == {"rapl", "nvml", "ina3221", "battery"}
    assert battery_state(Tree(tmp_path)).percent is None


def test_nvml_missing_package_is_not_installed() -> None:
    def importer(name: str) -> object:
        raise ImportError(name)

    result = discover_nvml(importer)
    assert result.describe() == "nvml: unavailable: not installed (pip install nvidia-ml-py)"


def test_memory_probe_reads_rss_peak_available_and_nvmap(tmp_path: Path) -> None:
    orin_nx(tmp_path)
    status = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB"
    write(tmp_path, {"/proc/self/status": status})
    snapshot = MemoryProbe(Tree(tmp_path)).snapshot()
    assert snapshot.rss_bytes == 100 * 2**20 and snapshot.peak_rss_bytes == 200 * 2**20
    assert snapshot.mem_available_bytes == 11_000_000 * 1024  # MemAvailable, not MemFree
    assert snapshot.as_dict()["nvmap_used_mb"] == 512.0


def test_memory_probe_on_this_machine_sees_this_process() -> None:
    assert (MemoryProbe().rss_bytes() or 0) > 10 * 2**20


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TracePower:
    """A synthetic power trace P(t) read at the fake clock's time."""

    def __init__(self, clock: FakeClock, watts, kind: str = "power") -> None:
        self.clock, self.watts = clock, watts
        self.info = SourceInfo(name="fake", kind=kind, scope="test", update_interval_s=0.01)

    def read(self) -> float:
        return self.watts(self.clock.now)


@pytest.mark.parametrize(
    ("watts", "exact"),
    [
        (lambda t: 4.0, 4.0 * 2.0),  # constant: exact for the trapezoid rule
        (lambda t: 3.0 + 2.0 * t, 3.0 * 2.0 + 4.0),  # linear ramp: exact too
        (lambda t: 5.0 + math.sin(3.0 * t), 10.0 + (1.0 - math.cos(6.0)) / 3.0),
        (lambda t: 2.0 + t * t, 4.0 + 8.0 / 3.0),
    ],
)
def test_sampled_power_integrates_to_the_exact_energy(watts, exact: float) -> None:
    clock = FakeClock()
    sampler = Sampler(TracePower(clock, watts), clock=clock)
    sampler.start(background=False)
    for step in range(1, 401):  # 5 ms steps over 2 s
        clock.now = step * 0.005
        sampler.sample()
    # Trapezoid error bound: (b - a) h² max|P''| / 12 = 2 × 25e-6 × 9 / 12 < 4e-5.
    assert sampler.energy_j == pytest.approx(exact, abs=4e-5)
    assert sampler.window_s == pytest.approx(2.0)


def test_trapezoid_uneven_steps() -> None:
    samples = [Sample(time_s=t, value=2 * t) for t in (0.0, 0.1, 0.5, 0.55, 2.0)]
    assert trapezoid(samples) == pytest.approx(4.0)  # ∫0..2 2t dt


def test_meter_reports_counter_energy_per_token_and_net(tmp_path: Path) -> None:
    clock, cpu = FakeClock(), FakeClock()
    source = TracePower(clock, lambda t: 7.0 * t, kind="counter")  # a counter at 7 W
    meter = EnergyMeter(source, baseline_w=1.0, clock=clock, cpu_clock=cpu)
    meter.start(background=False)
    clock.now, cpu.now = 2.0, 1.5
    meter.stop()
    stats = meter.as_stats(tokens=10)
    assert stats["energy_j"] == pytest.approx(14.0)
    assert stats["energy_j_net"] == pytest.approx(12.0)
    assert stats["energy_j_per_token"] == pytest.approx(1.4)
    assert stats["cpu_s_per_token"] == pytest.approx(0.15)
    assert stats["energy_source"]["too_short"] is False


def test_meter_without_source_gives_null_figures_and_the_reason() -> None:
    cpu = FakeClock()
    meter = EnergyMeter(None, unavailable_reason="rapl: unavailable: permission", cpu_clock=cpu)
    meter.start()
    cpu.now = 0.2
    meter.stop()
    stats = meter.as_stats(tokens=4)
    assert stats["energy_j"] is None and stats["energy_j_per_token"] is None
    assert stats["energy_source"] == {"name": None, "reason": "rapl: unavailable: permission"}
    assert stats["cpu_s_per_token"] == pytest.approx(0.05)


def test_short_window_is_flagged_for_a_slow_sensor() -> None:
    clock = FakeClock()
    source = TracePower(clock, lambda t: 10.0)
    source.info = SourceInfo(name="battery", kind="power", scope="b", update_interval_s=5.0)
    meter = EnergyMeter(source, clock=clock)
    meter.start(background=False)
    clock.now = 3.0
    meter.stop()
    assert meter.as_stats(tokens=3)["energy_source"]["too_short"] is True


def test_background_sampler_thread_integrates_constant_power() -> None:
    clock = FakeClock()
    sampler = Sampler(TracePower(clock, lambda t: 6.0), interval_s=0.001)
    sampler.start()
    sampler.stop()
    # Whatever the number of samples the thread took, constant power integrates exactly.
    assert sampler.energy_j == pytest.approx(6.0 * sampler.window_s)
    assert len(sampler.samples) >= 2


def test_idle_baseline_with_fake_clock() -> None:
    clock = FakeClock()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    idle = measure_idle_power(
        TracePower(clock, lambda t: 3.0), seconds=1.0, clock=clock, sleep=sleep
    )
    assert idle == pytest.approx(3.0)


class FakeNvml:
    """The few pynvml calls edgespec makes; energy in millijoules."""

    def __init__(self, *, fail: bool = False) -> None:
        self.fail, self.energy_mj = fail, 5_000

    def nvmlInit(self) -> None:
        if self.fail:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H100"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return self.energy_mj


def test_nvml_counter_through_an_injected_module(tmp_path: Path) -> None:
    nvml = FakeNvml()
    found = discover(Tree(tmp_path), nvml_importer=lambda name: nvml)
    source = found.best
    assert source is not None and source.info.name == "nvml" and source.info.scope == "GPU"
    assert source.info.detail == "NVIDIA H100" and source.read() == pytest.approx(5.0)
    broken = discover_nvml(lambda name: FakeNvml(fail=True))
    assert broken.describe().startswith("nvml: unavailable: no usable GPU (NVML Shared")


def test_doctor_on_a_fake_jetson_without_loading_models(tmp_path: Path) -> None:
    from edgespec.measure.doctor import diagnose, format_report

    from support.fake_bundle import make_bundle

    target = make_bundle(tmp_path / "target")
    report = diagnose(target=target, measure=False, tree=Tree(orin_nx(tmp_path / "root")))
    assert report["energy"]["used"] == "ina3221-hwmon"
    assert report["memory"]["nvmap_used_mb"] == 512.0
    assert report["pair"]["estimate"]["context"] == 256 and report["pair"]["fits"] is True
    cpu = next(p for p in report["providers"] if p["name"] == "CPUExecutionProvider")
    assert cpu["creates_session"] is True  # the fake bundle carries a one-node ONNX graph
    text = format_report(report)
    assert "ina3221-hwmon: board input (VDD_IN)" in text and "[used]" in text
    assert "rapl: unavailable: not present" in text


def test_peak_rss_reset_on_this_machine() -> None:
    probe = MemoryProbe()
    if probe.reset_peak():
        snapshot = probe.snapshot()
        assert snapshot.peak_rss_bytes is not None and snapshot.rss_bytes is not None
        assert snapshot.peak_rss_bytes <= snapshot.rss_bytes + 8 * 2**20
