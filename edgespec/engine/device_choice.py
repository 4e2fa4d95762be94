"""The drafter and k measured for a pair on this device (``edgespec pair --profile``), and the
pair's costs measured by a first generation, kept in the cache so that later generations (in
any process) use them without flags or measuring again.

The key is the pair's bundles (their file checksums) and the device (machine, cores and ONNX
Runtime's version): a choice measured on another machine, or for other weights, is not used.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgespec.engine.options import DRAFTER_NAMES, MAX_K
from edgespec.manifest import Bundle
from edgespec.models.store import cache_dir
from edgespec.runtime.k_policy import CostProfile


@dataclass(frozen=True, kw_only=True)
class DeviceChoice:
    """The drafter and k with the best expected speedup among those measured here."""

    drafter: str
    k: int
    expected_speedup: float
    #: Every drafter's measured alpha, best k and expected speedup, by name.
    measured: dict[str, dict[str, float]]
    #: The costs measured with it, for the chosen drafter: ``target_step_s``,
    #: ``draft_step_s`` (0 for prompt lookup) and ``verify_cost`` (T(w)/T(1), w = 1, 2, ...);
    #: generation seeds its per-round k policy with them. None in a choice stored without.
    costs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTER_NAMES or not 0 <= self.k <= MAX_K:
            raise ValueError(f"not a drafting choice: {self.drafter} at k {self.k}")

    def cost_profile(self) -> CostProfile | None:
        """The stored costs as the k policy reads them (None when not stored or not sane)."""
        return sane_costs(self.costs)

    @property
    def alpha(self) -> float | None:
        """The chosen drafter's measured acceptance rate."""
        found = self.measured.get(self.drafter, {}).get("alpha")
        return float(found) if isinstance(found, (int, float)) and 0 < found < 1 else None


def sane_costs(costs: Any) -> CostProfile | None:
    """Costs kept as JSON (``target_step_s``, ``draft_step_s``, ``verify_cost``) as the k
    policy reads them; None when missing, malformed or not sane."""
    try:
        profile = CostProfile(
            target_step_s=float(costs["target_step_s"]),
            draft_step_s=float(costs["draft_step_s"]),
            verify_cost=tuple(float(cost) for cost in costs["verify_cost"]),
            target_position_s=float(costs.get("target_position_s", 0.0)),
            draft_position_s=float(costs.get("draft_position_s", 0.0)),
            draft_window=int(costs.get("draft_window", 0)),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    sane = profile.target_step_s > 0 and profile.draft_step_s >= 0
    return profile if sane and len(profile.verify_cost) >= 2 else None


def _write_json(data: Any, path: Path) -> None:
    """``data`` as ``path``, whole or not at all (written aside, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(partial, path)


def device_key(target: Bundle, draft: Bundle | None) -> str:
    """The pair's weights and this device, hashed."""
    import onnxruntime

    parts = [
        *(f"{record.path}:{record.sha256}" for record in target.manifest.files),
        *(
            f"draft {record.path}:{record.sha256}"
            for record in (draft.manifest.files if draft else ())
        ),
        platform.machine(),
        str(os.cpu_count()),
        onnxruntime.__version__,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def choice_path(target: Bundle, draft: Bundle | None, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "profiles" / f"{device_key(target, draft)}.json"


def save_choice(
    choice: DeviceChoice, target: Bundle, draft: Bundle | None, cache: Path | None = None
) -> Path:
    path = choice_path(target, draft, cache)
    _write_json(asdict(choice), path)
    return path


def load_choice(
    target: Bundle, draft: Bundle | None, cache: Path | None = None
) -> DeviceChoice | None:
    """The stored choice for this pair on this device; None when none was measured (or the
    file cannot be read: it is then measured again, never trusted)."""
    path = choice_path(target, draft, cache)
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
        return DeviceChoice(**data)
    except (OSError, ValueError, TypeError):
        return None


def costs_path(
    target: Bundle,
    draft: Bundle | None,
    *,
    threads: int,
    providers: Sequence[str],
    draft_window: int = 0,
    cache: Path | None = None,
) -> Path:
    """Where the pair's measured costs on this device are kept: they depend on the threads, the
    execution providers, the build of the GGUF kernels (a new build may step faster) and the
    draft's attention window too, so each setting has its own file."""
    from edgespec.graph.kernels import gguf_kernel_build

    setting = f"{threads}|{'+'.join(providers)}|{gguf_kernel_build()}"
    setting += f"|window {draft_window}" if draft_window else ""
    setting = hashlib.sha256(setting.encode()).hexdigest()[:8]
    # "costs2": the costs with what each position of history adds (older files lack it).
    name = f"{device_key(target, draft)}-costs2-{setting}.json"
    return (cache or cache_dir()) / "profiles" / name


def save_costs(profile: CostProfile, path: Path) -> None:
    _write_json(asdict(profile), path)


def load_costs(path: Path) -> CostProfile | None:
    """The costs kept at ``path``; None when there are none or they cannot be read or make no
    sense (they are then measured again, never trusted)."""
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return sane_costs(data)
