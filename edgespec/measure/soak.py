"""A soak: many generations with a memory budget; RSS must stay under it and not grow.

``python -m edgespec.measure.soak --memory-budget-mb 600`` runs 200 generations on the default pair
(or ``--target``/``--draft``) over the bench's code prompts and prints RSS figures; exit 1 when RSS
went over the budget or grew. Growth is the least-squares slope of RSS over the generations
after the warm-up (the first 10 %), times their number.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from edgespec.api import Engine
from edgespec.config import BudgetConfig
from edgespec.measure.bench import load_prompts
from edgespec.telemetry.estimate import MIB
from edgespec.telemetry.memory import MemoryProbe

#: RSS may drift this much over a soak (allocator noise) and still count as not growing.
GROWTH_TOLERANCE_MB = 4.0


@dataclass(frozen=True, kw_only=True)
class SoakReport:
    generations: int
    budget_mb: float | None
    estimate_mb: float
    rss_mb: tuple[float, ...]
    #: The peak RSS during the soak (VmHWM after a reset, else the largest sample).
    peak_rss_mb: float
    growth_mb: float
    tokens: int
    #: Mode changes the budget policy made over the soak (0 when it never intervened).
    budget_decisions: int
    under_budget: bool
    steady: bool

    @property
    def passed(self) -> bool:
        return self.under_budget and self.steady

    def summary(self) -> dict[str, object]:
        data = asdict(self)
        rss = data.pop("rss_mb")
        data.update(
            first_rss_mb=rss[0],
            last_rss_mb=rss[-1],
            max_rss_mb=max(rss),
            passed=self.passed,
        )
        return data


def slope_growth(values: Sequence[float]) -> float:
    """Least-squares slope × (len - 1): how much the series rose across its length."""
    count = len(values)
    if count < 2:
        return 0.0
    mean_x, mean_y = (count - 1) / 2, sum(values) / count
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values))
    variance = sum((x - mean_x) ** 2 for x in range(count))
    return covariance / variance * (count - 1)


def run_soak(
    engine: Engine,
    *,
    generations: int = 200,
    max_new_tokens: int = 64,
    prompts: Sequence[str] | None = None,
    probe: MemoryProbe | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> SoakReport:
    probe = probe or MemoryProbe()
    prompts = prompts or load_prompts("code")
    # The process's lifetime peak may predate the soak (an export in the same process):
    # reset it, or else fall back to the RSS sampled after each generation.
    peak_reset = probe.reset_peak()
    admission = engine.telemetry.admission
    budget = admission.budget_mb if admission is not None else None
    rss: list[float] = []
    tokens = decisions = 0
    for index in range(generations):
        result = engine.generate(
            prompts[index % len(prompts)], max_new_tokens=max_new_tokens, seed=index
        )
        tokens += result.stats.new_tokens
        decisions += len((result.stats.budget or {}).get("decisions", ()))
        rss.append((probe.rss_bytes() or 0) / MIB)
        if (index + 1) % 20 == 0:
            progress(f"{index + 1}/{generations} generations, RSS {rss[-1]:.1f} MB")
    hwm = probe.snapshot().peak_rss_bytes if peak_reset else None
    peak = max(max(rss), hwm / MIB if hwm else 0.0)
    growth = slope_growth(rss[max(1, generations // 10) :])
    return SoakReport(
        generations=generations,
        budget_mb=budget,
        estimate_mb=admission.estimate.total_mb if admission is not None else 0.0,
        rss_mb=tuple(rss),
        peak_rss_mb=peak,
        growth_mb=growth,
        tokens=tokens,
        budget_decisions=decisions,
        under_budget=budget is None or peak <= budget,
        steady=growth <= GROWTH_TOLERANCE_MB,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgespec.measure.soak", description=__doc__)
    parser.add_argument("--target", type=Path, default=None)
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--memory-budget-mb", type=float, default=None)
    parser.add_argument("--generations", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--prompts", default="code", help="a bench prompt set (code, edit) or a file"
    )
    args = parser.parse_args(argv)
    budget = args.memory_budget_mb
    engine = Engine.load(
        target=args.target,
        draft=args.draft,
        memory_budget_mb=budget,
        budget=BudgetConfig(memory_mb=budget) if budget is not None else None,
    )
    report = run_soak(
        engine,
        generations=args.generations,
        max_new_tokens=args.max_new_tokens,
        prompts=load_prompts(args.prompts),
        progress=lambda m: print(f"  soak: {m}", file=sys.stderr, flush=True),
    )
    print(json.dumps(report.summary(), indent=2))
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
