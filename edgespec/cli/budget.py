"""Budget options of the decoding commands, the energy summary line, and ``edgespec doctor``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgespec.cli.models import add_model_argument, resolve_model

if TYPE_CHECKING:
    from edgespec.engine.generation import GenerationStats


def add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("budgets (see docs/budgets.md)")
    group.add_argument(
        "--memory-budget-mb",
        type=float,
        default=None,
        metavar="MB",
        help="refuse to load a pair whose memory estimate exceeds MB (the message says what "
        "would fit); speculation stops if RSS nears it",
    )
    group.add_argument(
        "--shrink-context",
        action="store_true",
        help="with --memory-budget-mb: shorten the max context to fit instead of refusing",
    )
    group.add_argument(
        "--power-budget-w",
        type=float,
        default=None,
        metavar="W",
        help="keep the measured power under W watts: shrink k, then stop speculating (default: "
        "no power budget; needs an energy source, see edgespec doctor)",
    )
    group.add_argument(
        "--energy-budget-j-per-token",
        type=float,
        default=None,
        metavar="J",
        help="keep the energy per generated token under J joules, the same way (default: none)",
    )
    group.add_argument(
        "--min-battery-pct",
        type=float,
        default=None,
        metavar="PCT",
        help="on battery below PCT percent, stop speculating",
    )


def budget_options(args: argparse.Namespace) -> dict[str, Any]:
    """``Engine.load`` keyword arguments from the budget options."""
    from edgespec.config import BudgetConfig

    budget = BudgetConfig(
        memory_mb=args.memory_budget_mb,
        power_w=args.power_budget_w,
        energy_per_token_j=args.energy_budget_j_per_token,
        min_battery_pct=args.min_battery_pct,
    )
    return {
        "memory_budget_mb": args.memory_budget_mb,
        "shrink_context": args.shrink_context,
        "budget": budget if budget.watches_anything else None,
    }


def energy_line(stats: GenerationStats) -> str:
    """``cpu 0.012 s/token, 0.41 J/token (rapl, CPU package)`` or the reason energy is n/a."""
    cpu = stats.cpu_s_per_token
    parts = [f"cpu {cpu:.4f} s/token" if cpu is not None else "cpu n/a"]
    source = stats.energy_source
    per_token = stats.energy_j_per_token
    if per_token is not None:
        short = ", window too short for the sensor" if source.get("too_short") else ""
        parts.append(f"{per_token:.3f} J/token ({source['name']}, {source['scope']}{short})")
    else:
        parts.append("energy n/a")
    budget = stats.budget
    if budget and budget["decisions"]:
        parts.append(f"budget mode {budget['mode']} ({budget['decisions'][-1]['reason']})")
    return ", ".join(parts)


def add_doctor_command(commands: Any) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="what this device offers: providers, cores, memory, energy sources, and the "
        "pair's memory estimate with recommended quantization and k",
        description="Report ONNX Runtime providers (and which really create a session), CPU "
        "cores, memory, the energy and power sources found (and why others are unavailable), "
        "and for the default or given pair its memory estimate and a recommended "
        "quantization and k.",
    )
    doctor.add_argument(
        "--target",
        type=Path,
        default=None,
        metavar="DIR",
        help="target bundle to estimate (default: the default model)",
    )
    add_model_argument(doctor)
    doctor.add_argument(
        "--draft",
        type=Path,
        default=None,
        metavar="DIR",
        help="draft bundle (default: $EDGESPEC_DRAFT with the default target)",
    )
    doctor.add_argument(
        "--memory-budget-mb",
        type=float,
        default=None,
        metavar="MB",
        help="check the estimate against MB instead of MemAvailable",
    )
    doctor.add_argument(
        "--no-measure",
        action="store_true",
        help="do not load the pair (its default k is then not shown)",
    )
    doctor.add_argument(
        "--context",
        type=int,
        default=None,
        metavar="N",
        help="price the KV cache at N tokens of context (default: 4096, or the model's own "
        "if shorter)",
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.set_defaults(handler=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from edgespec.measure.doctor import diagnose, format_report

    resolve_model(args)
    report = diagnose(
        target=args.target,
        draft=args.draft,
        memory_budget_mb=args.memory_budget_mb,
        context=args.context,
        measure=not args.no_measure,
    )
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    # The device part is printed either way; a pair that cannot be read is still a failure.
    return 1 if "error" in report["pair"] else 0
