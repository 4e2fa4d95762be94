"""Memory probes: process RSS and peak, system ``MemAvailable``, Jetson unified memory.

On Jetson the GPU shares DRAM with the CPU, and allocations made through NvMap (CUDA, TensorRT)
do not show in a process's RSS: ``NvMapMemUsed`` in ``/proc/meminfo`` is the only place they
appear. ``MemAvailable`` (not ``MemFree``) is what the kernel estimates can be allocated
without swapping.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.telemetry.sysfs import Tree

MIB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class MemorySnapshot:
    """Bytes; None where this system does not report the figure."""

    rss_bytes: int | None
    peak_rss_bytes: int | None
    mem_total_bytes: int | None
    mem_available_bytes: int | None
    nvmap_used_bytes: int | None

    def as_dict(self) -> dict[str, float | None]:
        def mib(value: int | None) -> float | None:
            return None if value is None else round(value / MIB, 1)

        return {
            "rss_mb": mib(self.rss_bytes),
            "peak_rss_mb": mib(self.peak_rss_bytes),
            "mem_total_mb": mib(self.mem_total_bytes),
            "mem_available_mb": mib(self.mem_available_bytes),
            "nvmap_used_mb": mib(self.nvmap_used_bytes),
        }


def _kib_fields(text: str) -> dict[str, int]:
    """``Key:   123 kB`` lines (``/proc/meminfo``, ``/proc/<pid>/status``) as bytes."""
    fields = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1
            fields[key.strip()] = int(parts[0]) * scale
    return fields


class MemoryProbe:
    """Reads ``/proc/meminfo`` and ``/proc/<pid>/status`` (``self`` by default) under a root."""

    def __init__(self, tree: Tree | None = None, *, pid: str = "self") -> None:
        self.tree = tree or Tree()
        self.pid = pid

    def snapshot(self) -> MemorySnapshot:
        meminfo = _kib_fields(self.tree.maybe_text(self.tree.path("/proc/meminfo")) or "")
        status_text = self.tree.maybe_text(self.tree.path(f"/proc/{self.pid}/status"))
        status = _kib_fields(status_text or "")
        return MemorySnapshot(
            rss_bytes=status.get("VmRSS"),
            peak_rss_bytes=status.get("VmHWM"),
            mem_total_bytes=meminfo.get("MemTotal"),
            mem_available_bytes=meminfo.get("MemAvailable"),
            nvmap_used_bytes=meminfo.get("NvMapMemUsed"),
        )

    def reset_peak(self) -> bool:
        """Resets the peak RSS (``VmHWM``) to the current RSS by writing 5 to
        ``/proc/<pid>/clear_refs`` (Linux 4.0+); False where that is not possible."""
        try:
            self.tree.path(f"/proc/{self.pid}/clear_refs").write_text("5\n", encoding="ascii")
        except OSError:
            return False
        return True

    def rss_bytes(self) -> int | None:
        """This process's RSS, from /proc or else (on the real ``/``: macOS, Windows) psutil."""
        rss = self.snapshot().rss_bytes
        if rss is None and self.pid == "self" and self.tree.is_system:
            import psutil

            return int(psutil.Process().memory_info().rss)
        return rss


def base_rss_bytes(probe: MemoryProbe) -> int:
    """This process's RSS with the runtime's native libraries loaded (ONNX Runtime and
    tokenizers take tens of MB before any model is): the base of a memory estimate."""
    import onnxruntime  # noqa: F401
    import tokenizers  # noqa: F401

    return probe.rss_bytes() or 0
