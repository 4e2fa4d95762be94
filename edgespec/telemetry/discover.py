"""Which energy source this device offers, and why the others are unavailable."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgespec.telemetry.sources import (
    EnergySource,
    discover_battery,
    discover_nvml,
    discover_rails,
    discover_rapl,
)
from edgespec.telemetry.sysfs import Tree, Unavailable


@dataclass(frozen=True, kw_only=True)
class Discovery:
    """``sources`` in order of preference (the first is used); ``unavailable`` with reasons."""

    sources: tuple[EnergySource, ...]
    unavailable: tuple[Unavailable, ...]

    @property
    def best(self) -> EnergySource | None:
        return self.sources[0] if self.sources else None

    def reason(self) -> str:
        """Why no source is used (one line), for ``energy_source`` when there is none."""
        return "; ".join(item.describe() for item in self.unavailable) or "no source found"

    def as_dict(self) -> dict[str, Any]:
        return {
            "used": self.best.info.name if self.best else None,
            "found": [
                {
                    "name": s.info.name,
                    "kind": s.info.kind,
                    "scope": s.info.scope,
                    "detail": s.info.detail,
                    "update_interval_s": s.info.update_interval_s,
                }
                for s in self.sources
            ],
            "unavailable": [{"name": u.name, "reason": u.reason} for u in self.unavailable],
        }


def discover(
    tree: Tree | None = None, *, nvml_importer: Callable[[str], Any] | None = None
) -> Discovery:
    """Counters first (exact: RAPL, then NVML), then sampled sensors (INA3221, battery).

    NVML is probed only on the real ``/`` (a fake tree has no GPU driver) unless an importer
    is given.
    """
    tree = tree or Tree()
    candidates: list[EnergySource | Unavailable] = [discover_rapl(tree)]
    if tree.is_system or nvml_importer is not None:
        candidates.append(discover_nvml(nvml_importer))
    else:
        candidates.append(Unavailable(name="nvml", reason="not probed under a fake root"))
    candidates += [discover_rails(tree), discover_battery(tree)]
    return Discovery(
        sources=tuple(c for c in candidates if not isinstance(c, Unavailable)),
        unavailable=tuple(c for c in candidates if isinstance(c, Unavailable)),
    )
