"""What a generation drafts with: the one place that decides the drafter and k.

Strongest first: the generation's own options (``drafter``, ``k``); the pair's choice measured
on this device (``edgespec pair --profile``, stored by :mod:`edgespec.engine.device_choice`);
what the bundles recommend from measurement when they were made (a built pair's selection
record, a distilled draft's record); edgespec's defaults (the model drafter with a draft,
prompt lookup without, k ``auto`` for both: each round's k from the measured costs at the
history's length and the running acceptance; k ``DEFAULT_K`` for a drafter recommended
without a k).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgespec.engine.device_choice import DeviceChoice
from edgespec.engine.options import DEFAULT_K, DRAFTER_NAMES, MAX_K, GenerationOptions
from edgespec.runtime.k_policy import CostProfile


@dataclass(frozen=True, kw_only=True)
class Drafting:
    """The pair's drafting when a generation's options name none, and where it comes from."""

    has_draft: bool
    #: Whether a head on the target is loaded: then the combined drafter, over the head,
    #: drafts by default.
    has_head: bool = False
    #: The drafter recommended or measured (None: the model with a draft, else prompt lookup).
    drafter: str | None
    k: int | str
    #: Where ``k`` comes from, in words (``edgespec doctor`` and ``Engine.default_k_source``).
    k_source: str
    #: The acceptance rate a per-round k policy starts from (the stored choice's, measured).
    seed_alpha: float | None = None
    #: The costs stored with the device's choice (None: measured on first need).
    stored_costs: CostProfile | None = None

    def drafter_for(self, options: GenerationOptions) -> str:
        if options.drafter or self.drafter:
            return options.drafter or self.drafter or ""
        if self.has_head:
            return "combined"
        return "model" if self.has_draft else "ngram"

    #: The k a default ``auto`` becomes under rejection sampling: its tokens depend on how
    #: many were drafted each round, and a k chosen from measured times would make a seeded
    #: generation's text vary from run to run (``match`` sampling's does not).
    rejection_k: int | None = None

    def k_for(self, options: GenerationOptions) -> int | str:
        if options.k is not None:
            return options.k
        rejection = options.temperature > 0 and options.sampling_mode == "rejection"
        return self.rejection_k if rejection and self.rejection_k is not None else self.k


def decide_drafting(
    *,
    has_draft: bool,
    has_head: bool = False,
    draft_extra: dict[str, Any] | None,
    build_record: dict[str, Any],
    measured: DeviceChoice | None,
) -> Drafting:
    """The pair's default drafting from the device's measured choice (``measured``), a built
    pair's record (``build_record``), a distilled draft's manifest (``draft_extra``) and
    edgespec's defaults, in that order."""
    recommended = _recommended(draft_extra or {})
    selection = build_record.get("selection", {})
    drafter: str | None = recommended.get("drafter")
    k: int | str
    if "recommended_k" in selection:
        k = int(selection["recommended_k"])
        k_source = "the pair's build record (measured when the pair was built)"
    elif "k" in recommended:
        k = int(recommended["k"])
        k_source = "the draft's distillation record (measured when it was made)"
    elif not has_draft:
        k, k_source = "auto", "edgespec's default for prompt lookup: auto"
    elif drafter is None:
        # k per round from the measured costs, seeded at the prompt's length and then learnt
        # from the rounds: a fixed k keeps drafting where, thousands of tokens into a text,
        # the draft's steps and the wider verify pass cost more than they save.
        k = "auto"
        k_source = (
            "edgespec's default with a draft model: auto, k per round from the measured costs "
            f"({DEFAULT_K} under rejection sampling, whose seeded text depends on k)"
        )
    else:
        k = DEFAULT_K
        k_source = f"edgespec's default (no recommended k in the bundle): {DEFAULT_K}"
    if measured is None:  # this pair was not profiled on this device
        return Drafting(
            has_draft=has_draft,
            has_head=has_head,
            drafter=drafter,
            k=k,
            k_source=k_source,
            rejection_k=DEFAULT_K if k == "auto" and has_draft else None,
        )
    k_source = (
        f"measured on this device by 'edgespec pair --profile': the {measured.drafter} "
        f"drafter, expected {measured.expected_speedup:.2f}x"
    )
    stored = measured.cost_profile()
    if measured.drafter == "none" or stored is None:
        return Drafting(
            has_draft=has_draft,
            has_head=has_head,
            drafter=measured.drafter,
            k=measured.k,
            k_source=k_source,
        )
    # k then adapts round by round from the stored costs and the running acceptance, down to
    # plain target steps where a prompt's drafts stop paying (a chat turn after code): a fixed
    # k measured on code prompts would keep drafting.
    return Drafting(
        has_draft=has_draft,
        has_head=has_head,
        drafter=measured.drafter,
        k="auto",
        k_source=k_source
        + f", k per round from its measured costs (k {measured.k} on its prompts)",
        seed_alpha=measured.alpha,
        stored_costs=stored,
    )


def _recommended(extra: dict[str, Any]) -> dict[str, Any]:
    """What a distilled draft's manifest (``extra``) recommends from measurement:
    ``{"drafter": ..., "k": ...}``, or {} (only known drafters and k values count)."""
    recommended = dict(extra.get("distillation", {}).get("recommended") or {})
    if recommended.get("drafter") not in DRAFTER_NAMES:
        recommended.pop("drafter", None)
    if not (isinstance(recommended.get("k"), int) and 0 <= recommended["k"] <= MAX_K):
        recommended.pop("k", None)
    return recommended
