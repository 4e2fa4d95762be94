"""Fake sysfs/procfs trees of real devices, for the telemetry probes (files as the kernel
writes them: one value and a newline)."""

from __future__ import annotations

from pathlib import Path


def write(root: Path, files: dict[str, str | int]) -> Path:
    for relative, value in files.items():
        path = root / relative.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n", encoding="utf-8")
    return root


def link(root: Path, alias: str, target: str) -> None:
    """``alias`` → ``target``, as the kernel links class and bus entries to devices."""
    path = root / alias.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(root / target.lstrip("/"), target_is_directory=True)


def hwmon_channels(directory: str, rails: dict[int, tuple[str, int, int]]) -> dict[str, str | int]:
    """{channel: (label, mV, mA)} as ``in*_label``, ``in*_input``, ``curr*_input``."""
    files: dict[str, str | int] = {f"{directory}/name": "ina3221"}
    for channel, (label, millivolts, milliamps) in rails.items():
        files[f"{directory}/in{channel}_label"] = label
        files[f"{directory}/in{channel}_input"] = millivolts
        files[f"{directory}/curr{channel}_input"] = milliamps
    return files


def orin_nx(root: Path) -> Path:
    """Jetson Orin NX, JetPack 5/6: one INA3221 on hwmon with VDD_IN and a sum channel."""
    directory = "/sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon3"
    files = hwmon_channels(
        directory,
        {1: ("VDD_IN", 5000, 1200), 2: ("VDD_CPU_GPU_CV", 5000, 400), 3: ("VDD_SOC", 5000, 300)},
    )
    files[f"{directory}/in7_label"] = "sum of shunt voltages"
    files[f"{directory}/in7_input"] = 40
    files["/proc/meminfo"] = (
        "MemTotal:       15956480 kB\nMemFree:          812000 kB\n"
        "MemAvailable:   11000000 kB\nNvMapMemUsed:     524288 kB"
    )
    write(root, files)
    link(root, "/sys/class/hwmon/hwmon3", directory)
    return root


def agx_orin(root: Path) -> Path:
    """Jetson AGX Orin: two INA3221 devices, no VDD_IN rail (the total is their sum)."""
    first = "/sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"
    second = "/sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0041/hwmon/hwmon2"
    files = hwmon_channels(
        first,
        {
            1: ("VDD_GPU_SOC", 5000, 1000),
            2: ("VDD_CPU_CV", 5000, 600),
            3: ("VIN_SYS_5V0", 5000, 200),
        },
    )
    files.update(hwmon_channels(second, {2: ("VDDQ_VDD2_1V8AO", 5000, 100)}))
    write(root, files)
    link(root, "/sys/class/hwmon/hwmon1", first)
    link(root, "/sys/class/hwmon/hwmon2", second)
    # The bus view of the same devices must not count them twice.
    link(root, "/sys/bus/i2c/drivers/ina3221/1-0040", first.rsplit("/hwmon/", 1)[0])
    return root


def nano_jetpack4(root: Path) -> Path:
    """Jetson Nano, JetPack 4: the IIO ina3221x layout, power in mW, POM_5V_IN total."""
    device = "/sys/devices/7000c400.i2c/i2c-6/6-0040/iio:device0"
    write(
        root,
        {
            f"{device}/name": "ina3221x",
            f"{device}/rail_name_0": "POM_5V_IN",
            f"{device}/in_power0_input": 3200,
            f"{device}/rail_name_1": "POM_5V_GPU",
            f"{device}/in_power1_input": 800,
            f"{device}/rail_name_2": "POM_5V_CPU",
            f"{device}/in_power2_input": 1100,
        },
    )
    link(root, "/sys/bus/iio/devices/iio:device0", device)
    return root


def rapl(root: Path, *, energy_uj: int, max_range_uj: int = 262143328850) -> Path:
    """One package zone with a core sub-zone (which must not be counted twice)."""
    return write(
        root,
        {
            "/sys/class/powercap/intel-rapl:0/name": "package-0",
            "/sys/class/powercap/intel-rapl:0/energy_uj": energy_uj,
            "/sys/class/powercap/intel-rapl:0/max_energy_range_uj": max_range_uj,
            "/sys/class/powercap/intel-rapl:0:0/name": "core",
            "/sys/class/powercap/intel-rapl:0:0/energy_uj": 5,
            "/sys/class/powercap/intel-rapl:0:0/max_energy_range_uj": max_range_uj,
        },
    )


def battery(
    root: Path,
    *,
    power_uw: int | None,
    current_ua: int = 0,
    voltage_uv: int = 0,
    status: str = "Discharging",
    capacity: int = 80,
) -> Path:
    files: dict[str, str | int] = {
        "/sys/class/power_supply/AC/type": "Mains",
        "/sys/class/power_supply/AC/online": 0 if status == "Discharging" else 1,
        "/sys/class/power_supply/BAT0/type": "Battery",
        "/sys/class/power_supply/BAT0/status": status,
        "/sys/class/power_supply/BAT0/capacity": capacity,
    }
    if power_uw is not None:
        files["/sys/class/power_supply/BAT0/power_now"] = power_uw
    else:
        files["/sys/class/power_supply/BAT0/current_now"] = current_ua
        files["/sys/class/power_supply/BAT0/voltage_now"] = voltage_uv
    return write(root, files)
