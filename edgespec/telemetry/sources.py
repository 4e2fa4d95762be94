"""Energy counters and power sensors, found by what their files say, never by driver paths.

A source's ``read()`` returns cumulative joules (``kind == "counter"``: RAPL, NVML) or the
current draw in watts (``kind == "power"``: INA3221 rails, a discharging battery); the meter in
``edgespec.telemetry.energy`` turns either into the energy of a window. A source that exists but
cannot be used is reported as :class:`~edgespec.telemetry.sysfs.Unavailable` with the reason,
never as an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from edgespec.telemetry.sysfs import Tree, Unavailable

#: The total-input rails of Jetson boards: Orin (VDD_IN) and Nano/TX (POM_5V_IN).
TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")


@dataclass(frozen=True, kw_only=True)
class SourceInfo:
    """``scope`` says what the figure covers (board input, SoC rails, CPU package, GPU)."""

    name: str
    kind: str
    scope: str
    update_interval_s: float
    detail: str = ""


class EnergySource(Protocol):
    info: SourceInfo

    def read(self) -> float: ...


@dataclass(frozen=True, kw_only=True)
class RaplZone:
    name: str
    energy_path: Path
    max_range_uj: int


class RaplSource:
    """Linux powercap RAPL: ``energy_uj`` counters that wrap at ``max_energy_range_uj``.

    Top-level zones only (sub-zones such as ``core`` are inside their package). A ``psys``
    zone covers the whole platform and is used alone; otherwise the ``package-*`` zones are
    summed. ``read()`` must be called at least once per wrap period (minutes at full power);
    the sampler calls it every interval.
    """

    def __init__(self, tree: Tree, zones: tuple[RaplZone, ...]) -> None:
        self.tree = tree
        self.zones = zones
        platform = any(zone.name == "psys" for zone in zones)
        self.info = SourceInfo(
            name="rapl",
            kind="counter",
            scope="platform (psys)" if platform else "CPU package",
            update_interval_s=0.001,
            detail=", ".join(zone.name for zone in zones),
        )
        self._last: list[int | None] = [None] * len(zones)
        self._total_uj = 0

    def read(self) -> float:
        for index, zone in enumerate(self.zones):
            raw = int(self.tree.number(zone.energy_path))
            last = self._last[index]
            if last is not None:
                # After a wrap the counter restarted from 0 below the previous reading.
                self._total_uj += raw - last if raw >= last else zone.max_range_uj - last + raw
            self._last[index] = raw
        return self._total_uj / 1e6


def discover_rapl(tree: Tree) -> RaplSource | Unavailable:
    zones = []
    for zone_dir in tree.glob("/sys/class/powercap/*"):
        name = tree.maybe_text(zone_dir / "name")
        # Top-level zones are intel-rapl:N; sub-zones (intel-rapl:N:M) sit inside them.
        if name is None or zone_dir.name.count(":") != 1 or not (zone_dir / "energy_uj").exists():
            continue
        max_range = tree.maybe_text(zone_dir / "max_energy_range_uj")
        zones.append(
            RaplZone(
                name=name,
                energy_path=zone_dir / "energy_uj",
                max_range_uj=int(max_range) if max_range else 2**32,
            )
        )
    if not zones:
        return Unavailable(name="rapl", reason="not present (no powercap zones)")
    if any(zone.name == "psys" for zone in zones):
        zones = [zone for zone in zones if zone.name == "psys"]
    else:
        zones = [zone for zone in zones if zone.name.startswith("package")] or zones
    source = RaplSource(tree, tuple(zones))
    try:
        source.read()
    except PermissionError:
        return Unavailable(
            name="rapl",
            reason="permission (energy_uj is root-only since Linux 5.10; run as root or "
            "grant read access to /sys/class/powercap/*/energy_uj)",
        )
    except (OSError, ValueError) as error:
        return Unavailable(name="rapl", reason=f"unreadable ({error})")
    return source


class NvmlSource:
    """NVIDIA NVML total energy (millijoules since the driver loaded; Volta and newer)."""

    def __init__(self, nvml: Any, handle: Any, device: str) -> None:
        self._nvml = nvml
        self._handle = handle
        self.info = SourceInfo(
            name="nvml", kind="counter", scope="GPU", update_interval_s=0.02, detail=device
        )

    def read(self) -> float:
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) / 1e3


def discover_nvml(importer: Callable[[str], Any] | None = None) -> NvmlSource | Unavailable:
    """nvidia-ml-py is optional: without it NVML is "unavailable: not installed"."""
    import importlib

    try:
        nvml = (importer or importlib.import_module)("pynvml")
    except ImportError:
        return Unavailable(name="nvml", reason="not installed (pip install nvidia-ml-py)")
    try:
        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        device = nvml.nvmlDeviceGetName(handle)
        source = NvmlSource(nvml, handle, device if isinstance(device, str) else device.decode())
        source.read()
    except Exception as error:  # NVMLError has many subclasses: no driver, no GPU, no support
        return Unavailable(name="nvml", reason=f"no usable GPU ({error})")
    return source


@dataclass(frozen=True, kw_only=True)
class Rail:
    """One power rail: ``power_w()`` from mV × mA (hwmon) or mW (IIO)."""

    label: str
    paths: tuple[Path, ...]
    scale: float


class RailSource:
    """Jetson INA3221 rails; the total-input rail when present, else the sum of all rails."""

    def __init__(self, tree: Tree, rails: tuple[Rail, ...], *, layout: str) -> None:
        self.tree = tree
        total = [rail for rail in rails if rail.label.upper() in TOTAL_RAILS]
        self.rails = tuple(total[:1]) or rails
        labels = ", ".join(rail.label for rail in self.rails)
        self.info = SourceInfo(
            name=f"ina3221-{layout}",
            kind="power",
            scope=f"board input ({labels})" if total else f"SoC rails (sum of {labels})",
            update_interval_s=0.1,
            detail=labels,
        )

    def read(self) -> float:
        watts = 0.0
        for rail in self.rails:
            product = rail.scale
            for path in rail.paths:
                product *= self.tree.number(path)
            watts += product
        return watts


def _hwmon_rails(tree: Tree) -> list[Rail]:
    """JetPack 5/6: hwmon devices whose ``name`` is ina3221, wherever the driver put them
    (``/sys/class/hwmon`` links to every hwmon device), with ``in*_label``, ``in*_input`` (mV)
    and ``curr*_input`` (mA) for each channel."""
    rails = []
    for hwmon in tree.glob("/sys/class/hwmon/hwmon*"):
        if (tree.maybe_text(hwmon / "name") or "").lower() != "ina3221":
            continue
        for label_path in sorted(hwmon.glob("in*_label")):
            channel = label_path.name[2:].removesuffix("_label")
            label = tree.maybe_text(label_path) or ""
            volts, amps = hwmon / f"in{channel}_input", hwmon / f"curr{channel}_input"
            if label.lower().startswith("sum of") or not (volts.exists() and amps.exists()):
                continue
            rails.append(Rail(label=label, paths=(volts, amps), scale=1e-6))
    return rails


def _iio_rails(tree: Tree) -> list[Rail]:
    """JetPack 4: IIO devices (``/sys/bus/iio/devices`` links to each) whose ``name`` is
    ina3221x, with ``rail_name_N`` and ``in_powerN_input`` (mW)."""
    rails = []
    for device in tree.glob("/sys/bus/iio/devices/iio:device*"):
        if (tree.maybe_text(device / "name") or "").lower() != "ina3221x":
            continue
        for name_path in sorted(device.glob("rail_name_*")):
            channel = name_path.name.removeprefix("rail_name_")
            power = device / f"in_power{channel}_input"
            if power.exists():
                label = tree.maybe_text(name_path) or f"rail {channel}"
                rails.append(Rail(label=label, paths=(power,), scale=1e-3))
    return rails


def discover_rails(tree: Tree) -> RailSource | Unavailable:
    for layout, rails in (("hwmon", _hwmon_rails(tree)), ("iio", _iio_rails(tree))):
        if rails:
            source = RailSource(tree, tuple(rails), layout=layout)
            try:
                source.read()
            except PermissionError:
                return Unavailable(name=source.info.name, reason="permission")
            except (OSError, ValueError) as error:
                return Unavailable(name=source.info.name, reason=f"unreadable ({error})")
            return source
    return Unavailable(name="ina3221", reason="not present (no ina3221 hwmon or IIO device)")


@dataclass(frozen=True, kw_only=True)
class BatteryState:
    """Charge in percent and whether mains power is connected (None: unknown)."""

    percent: float | None
    plugged: bool | None


class BatterySource:
    """A discharging battery's draw: ``power_now`` (µW) or ``current_now`` × ``voltage_now``."""

    def __init__(self, tree: Tree, battery: Path) -> None:
        self.tree = tree
        self.battery = battery
        self.use_power_now = (battery / "power_now").exists()
        self.info = SourceInfo(
            name="battery",
            kind="power",
            scope="system draw from the battery",
            # Fuel gauges update every few seconds (many every 5-15 s).
            update_interval_s=5.0,
            detail=f"{battery.name} {'power_now' if self.use_power_now else 'current×voltage'}",
        )

    def read(self) -> float:
        if self.use_power_now:
            return abs(self.tree.number(self.battery / "power_now")) / 1e6
        current = abs(self.tree.number(self.battery / "current_now"))
        return current * self.tree.number(self.battery / "voltage_now") / 1e12


def _batteries(tree: Tree) -> list[Path]:
    return [
        supply
        for supply in tree.glob("/sys/class/power_supply/*")
        if (tree.maybe_text(supply / "type") or "").lower() == "battery"
    ]


def discover_battery(tree: Tree) -> BatterySource | Unavailable:
    for battery in _batteries(tree):
        status = tree.maybe_text(battery / "status") or "Unknown"
        if status.lower() != "discharging":
            return Unavailable(
                name="battery",
                reason=f"{battery.name} is {status}: on mains power the battery does not see "
                "the system's draw",
            )
        has_power = (battery / "power_now").exists()
        if not has_power and not (battery / "current_now").exists():
            return Unavailable(name="battery", reason=f"{battery.name} reports no power or current")
        return BatterySource(tree, battery)
    return Unavailable(name="battery", reason="not present")


def battery_state(tree: Tree) -> BatteryState:
    """From sysfs when there is a battery there, else (on the real ``/``) psutil's
    ``sensors_battery``."""
    for battery in _batteries(tree):
        capacity = tree.maybe_text(battery / "capacity")
        status = (tree.maybe_text(battery / "status") or "").lower()
        return BatteryState(
            percent=float(capacity) if capacity else None,
            plugged=None if status in ("", "unknown") else status != "discharging",
        )
    if tree.is_system:
        import psutil

        sensors = getattr(psutil, "sensors_battery", None)
        found = sensors() if sensors is not None else None
        if found is not None:
            return BatteryState(percent=float(found.percent), plugged=found.power_plugged)
    return BatteryState(percent=None, plugged=None)
