"""``edgespec pair``: whether a draft (or a head) can serve a target, and with ``--profile``
what it is worth on this device."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from edgespec.cli.models import add_model_argument, resolve_model
from edgespec.engine.pairing import check_pair
from edgespec.errors import ConfigError
from edgespec.models.bundles import default_pair


def add_pair_command(commands: Any) -> None:
    """Adds ``pair``."""
    pair = commands.add_parser(
        "pair",
        help="check that a draft bundle can serve a target bundle",
        description="Check that DRAFT can propose tokens for TARGET: identical tokenizers, or "
        "compatible ones (same vocabulary type, sizes within 128, identical special tokens "
        "and token strings). Exit code 0 if compatible, 1 if not.",
    )
    pair.add_argument(
        "draft",
        metavar="DRAFT",
        type=Path,
        nargs="?",
        help="draft bundle (default: the default pair's)",
    )
    pair.add_argument(
        "target",
        metavar="TARGET",
        type=Path,
        nargs="?",
        help="target bundle (default: the default model)",
    )
    add_model_argument(pair)
    pair.add_argument("--json", action="store_true", help="print the report as JSON")
    pair.add_argument(
        "--profile",
        action="store_true",
        help="also measure alpha by draft position and c on this device, and recommend k",
    )
    pair.add_argument(
        "--head",
        type=Path,
        default=None,
        metavar="DIR",
        help="check (and with --profile, measure) a head on TARGET instead of a draft: the "
        "head, the combined drafter over it and prompt lookup race (and a DRAFT's model "
        "drafts, when one is named before TARGET), and the winner is kept",
    )
    pair.set_defaults(handler=run_pair)


def run_pair(args: argparse.Namespace) -> int:
    if args.head is not None:
        return _run_head_pair(args)
    resolve_model(args)
    if args.draft is None or args.target is None:
        if args.draft is not None:
            raise ConfigError("pair got a DRAFT but no TARGET", fix="give both, or neither")
        pair = default_pair(verify_checksums=False)
        args.target = pair.target.root
        if pair.draft is None:
            return _report_draftless(args)
        args.draft = pair.draft.root
    from edgespec.measure.profile import profile_pair

    report = check_pair(args.draft, args.target)
    profile = profile_pair(args.draft, args.target) if args.profile and report.compatible else None
    if args.json:
        print(json.dumps({**report.to_dict(), "profile": profile}, indent=2))
    else:
        verdict = "compatible" if report.compatible else "NOT compatible"
        print(f"{verdict}: {report.reason}")
        if not report.compatible:
            print(
                "  the draft must use the target's tokenizer (or one with the same "
                "vocabulary); export a draft trained with it"
            )
        if profile is not None:
            print("\n".join(_profile_lines(profile)))
    return 0 if report.compatible else 1


def _run_head_pair(args: argparse.Namespace) -> int:
    """``pair --head HEAD [TARGET]``: whether the head was made for the target, and with
    ``--profile`` the head's drafters measured and the fastest kept."""
    from edgespec.engine.pairing import check_head
    from edgespec.manifest import load_bundle
    from edgespec.measure.profile import profile_pair

    if args.draft is not None and args.target is None:  # one positional: the target
        args.target, args.draft = args.draft, None
    if args.draft is not None and not args.profile:
        raise ConfigError(
            "pair --head checks a head on a TARGET; a DRAFT beside it only races in --profile",
            fix="drop the DRAFT, or add --profile",
        )
    resolve_model(args)
    if args.target is None:
        args.target = default_pair(verify_checksums=False).target.root
    problem = check_head(load_bundle(args.head), load_bundle(args.target))
    profile = (
        profile_pair(args.draft, args.target, head=args.head)
        if args.profile and problem is None
        else None
    )
    if args.json:
        found = {"compatible": problem is None, "reason": problem or "made for this target"}
        print(json.dumps({**found, "profile": profile}, indent=2))
    else:
        print("compatible: the head was made for this target" if problem is None else problem)
        if profile is not None:
            print("\n".join(_profile_lines(profile)))
    return 0 if problem is None else 1


def _report_draftless(args: argparse.Namespace) -> int:
    """The default target has no draft model ($EDGESPEC_TARGET without $EDGESPEC_DRAFT): it
    drafts by prompt lookup."""
    from edgespec.measure.profile import profile_pair

    reason = (
        f"the default target ({args.target}) has no draft model: generation drafts by prompt "
        "lookup (--drafter ngram), which needs none; pass DRAFT TARGET to check a pair"
    )
    profile = profile_pair(None, args.target) if args.profile else None
    if args.json:
        print(json.dumps({"compatible": True, "reason": reason, "profile": profile}, indent=2))
    else:
        print(reason)
        if profile is not None:
            print("\n".join(_profile_lines(profile)))
    return 0


def _profile_lines(profile: dict[str, Any]) -> list[str]:
    by_position = ", ".join(f"{a:.2f}" for a in profile["alpha_by_position"])
    lines = [
        f"measured on {profile['measured_on']}: c {profile['c']:.3f} (a bare draft pass), "
        "verify cost "
        + ", ".join(f"{cost:.2f}" for cost in profile["verify_cost"][1:6])
        + " (2-6 tokens)"
    ]
    for name, figures in profile["by_drafter"].items():
        lines.append(
            f"  {name:<9} alpha {figures['alpha']:.2f}, c {figures['c']:.2f} (as generation "
            f"paid it), best k {figures['recommended_k']}, "
            f"expected {figures['expected_speedup']:.2f}x"
        )
    if profile.get("race_tok_s"):
        lines.append(
            "raced, taking turns on the same prompts: "
            + ", ".join(f"{name} {rate:.1f} tok/s" for name, rate in profile["race_tok_s"].items())
        )
    chosen = profile["drafter"]
    lines.append(
        f"choice: {chosen} at k {profile['recommended_k']}, expected speedup "
        f"{profile['expected_speedup']:.2f}x"
        + (f" (alpha by draft position: {by_position})" if chosen != "none" else "")
    )
    if "saved_to" in profile:
        lines.append(
            "generate, chat and serve now use it by default on this device "
            f"({profile['saved_to']}); --drafter and --k override it"
        )
    return lines
