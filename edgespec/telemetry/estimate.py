"""How much memory a pair needs, from its bundles alone, and admission against a budget.

What a process running a pair holds at its peak, measured stage by stage (load the tokenizer,
create the sessions, run a pass, prefill in chunks, decode; docs/benchmarks/memory.md, "Memory
estimate against measured peak")::

    the process before loading                 (measured by the caller: interpreter, numpy,
                                                ONNX Runtime, tokenizers)
  + TOKENIZER_FACTOR × tokenizer.json's size   (once per process: the parsed vocabulary and
                                                merges take several times the file's size)
  per model:
  + the session's resident size                (measured by the exporter in a fresh process
                                                once a pass has read every weight: ONNX
                                                Runtime's packed copies of MatMulNBits
                                                weights included; for a bundle without it,
                                                SESSION_BYTES + the weights but for an
                                                embedding table that only lookups read)
  + (kv_bytes_per_token                        (an in-place cache is one buffer whose pages
     + PREFILL_CHUNK × heads × 4) × n           are taken as positions are written; a concat
                                                cache holds two copies; a prefill chunk's
                                                attention scores grow with the context)
  + LOGITS_ROWS × vocab × 4 × 2                (a verify pass's rows of float32 logits, in
                                                ONNX Runtime's output and the runtime's copy)

then ``MARGIN`` on the models' terms for ONNX Runtime's arena slack. Prefill runs in chunks
of ``PREFILL_CHUNK`` tokens and asks for the last row's logits only, so no term grows with
vocabulary × context. The total is linear in ``n``, so the longest context that fits a
budget is solved for directly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from edgespec.errors import BudgetError
from edgespec.manifest import DEFAULT_CONTEXT, Bundle

MIB = 1024 * 1024
#: Added to the models' terms for ONNX Runtime's arena slack and what the terms leave out.
MARGIN = 0.10
#: Fixed cost of one ONNX Runtime CPU session, whatever its size (measured below it).
SESSION_BYTES = 12 * MIB
#: A parsed tokenizer's resident size over its tokenizer.json's (the largest measured ratio
#: among the catalog's tokenizers: docs/benchmarks/memory.md, "Memory estimate against the measured
#: peak").
TOKENIZER_FACTOR = 21
#: Tokens per prefill pass (as :data:`edgespec.graph.paths.PREFILL_CHUNK`).
PREFILL_CHUNK = 128
#: The widest verify pass whose logits are returned row by row (k + 1 at k 15).
LOGITS_ROWS = 16
#: Shortest context worth suggesting.
MIN_CONTEXT = 64
#: Approximate bytes per weight of int4 MatMulNBits with fp16 scales per 32-weight block.
INT4_BYTES_PER_PARAMETER = 0.5 + 2 / 32


@dataclass(frozen=True, kw_only=True)
class ModelCost:
    """One model's fixed bytes and bytes per context token (before the margin)."""

    name: str
    weight_bytes: int
    #: Logits rows, a session's fixed cost: what the model holds whatever the context.
    workspace_bytes: int
    bytes_per_token: int
    parameters: int
    bits: int
    max_length: int

    @property
    def fixed_bytes(self) -> int:
        return self.weight_bytes + self.workspace_bytes

    @classmethod
    def of(cls, name: str, bundle: Bundle) -> ModelCost:
        manifest = bundle.manifest
        model = manifest.model
        copies = 1 if manifest.graph.kv_sharing == "shared" else 2
        scores = PREFILL_CHUNK * model.num_attention_heads * 4
        memory = manifest.memory
        logits = LOGITS_ROWS * model.vocab_size * 4 * 2
        if memory.resident_bytes:  # measured by the exporter: the session's fixed cost in it
            weights, workspace = memory.resident_bytes, logits
        else:
            # An embedding table that only lookups read stays out of memory but for its rows.
            weights, workspace = memory.weight_bytes - memory.gathered_bytes, SESSION_BYTES + logits
        return cls(
            name=name,
            weight_bytes=weights,
            workspace_bytes=workspace,
            bytes_per_token=copies * manifest.memory.kv_bytes_per_token + scores,
            parameters=model.parameters,
            bits=manifest.quantization.bits,
            max_length=manifest.context(model.max_length),
        )


def tokenizer_bytes(bundle: Bundle) -> int:
    """The resident size of ``bundle``'s parsed tokenizer."""
    path = bundle.tokenizer_path
    return TOKENIZER_FACTOR * path.stat().st_size if path.is_file() else 0


@dataclass(frozen=True, kw_only=True)
class PairEstimate:
    """Bytes for the models in ``models`` at ``context`` tokens, margin and base included."""

    models: tuple[ModelCost, ...]
    context: int
    base_bytes: int
    tokenizer_bytes: int = 0
    margin: float = MARGIN

    def at(self, context: int) -> int:
        fixed = sum(m.fixed_bytes for m in self.models)
        per_token = sum(m.bytes_per_token for m in self.models)
        models = int((fixed + per_token * context) * (1.0 + self.margin))
        return self.base_bytes + self.tokenizer_bytes + models

    @property
    def total_bytes(self) -> int:
        return self.at(self.context)

    @property
    def total_mb(self) -> float:
        return self.total_bytes / MIB

    def longest_context(self, budget_bytes: int) -> int:
        """The longest context (≤ ``context``) that fits ``budget_bytes``; 0 if none does."""
        fixed = self.at(0)
        per_token = sum(m.bytes_per_token for m in self.models) * (1.0 + self.margin)
        if budget_bytes < fixed:
            return 0
        return min(self.context, int((budget_bytes - fixed) / per_token) if per_token else 0)

    def without(self, name: str) -> PairEstimate:
        models = tuple(m for m in self.models if m.name != name)
        return replace(self, models=models)

    def with_int4(self, name: str) -> PairEstimate:
        models = tuple(
            replace(
                m,
                weight_bytes=min(m.weight_bytes, int(m.parameters * INT4_BYTES_PER_PARAMETER)),
                bits=4,
            )
            if m.name == name
            else m
            for m in self.models
        )
        return replace(self, models=models)

    def as_dict(self) -> dict[str, object]:
        return {
            "total_mb": round(self.total_mb, 1),
            "context": self.context,
            "base_mb": round(self.base_bytes / MIB, 1),
            "tokenizer_mb": round(self.tokenizer_bytes / MIB, 1),
            "margin": self.margin,
            "models": {
                m.name: {
                    "weights_mb": round(m.weight_bytes / MIB, 2),
                    "workspace_mb": round(m.workspace_bytes / MIB, 2),
                    "kv_mb": round(m.bytes_per_token * self.context / MIB, 2),
                    "bits": m.bits,
                }
                for m in self.models
            },
        }


def estimate_pair(
    target: Bundle | None,
    draft: Bundle | None,
    *,
    base_bytes: int,
    context: int | None = None,
    head: Bundle | None = None,
) -> PairEstimate:
    """The models held on this device (no target when a remote server verifies; a head on
    the target beside it when one drafts) at ``context`` (None: the default context, 4,096,
    within the models' own)."""
    models = [ModelCost.of("target", target)] if target is not None else []
    if draft is not None:
        models.append(ModelCost.of("draft", draft))
    if head is not None:
        models.append(ModelCost.of("head", head))
    if not models:
        raise ValueError("estimate_pair needs a target or a draft")
    longest = min(m.max_length for m in models)
    text_bundle = target if target is not None else draft
    assert text_bundle is not None
    return PairEstimate(
        models=tuple(models),
        context=min(context or DEFAULT_CONTEXT, longest),
        base_bytes=base_bytes,
        tokenizer_bytes=tokenizer_bytes(text_bundle),
    )


@dataclass(frozen=True, kw_only=True)
class Admission:
    """The context the engine may use under ``budget_mb`` and the estimate at that context."""

    estimate: PairEstimate
    budget_mb: float | None
    shrunk_from: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "estimate": self.estimate.as_dict(),
            "budget_mb": self.budget_mb,
            "context": self.estimate.context,
            "shrunk_from": self.shrunk_from,
        }


def alternatives(estimate: PairEstimate, budget_bytes: int) -> list[str]:
    """What would fit ``budget_bytes``, in words: a shorter context, remote verification (the
    draft alone on this device), a smaller quantization of the target."""
    found = []
    longest = estimate.longest_context(budget_bytes)
    if longest >= MIN_CONTEXT:
        found.append(
            f"a max context of {longest} tokens (instead of {estimate.context}): pass "
            "shrink_context=True / --shrink-context"
        )
    names = {m.name for m in estimate.models}
    if "draft" in names:
        alone = estimate.without("target")
        if alone.total_bytes <= budget_bytes:
            found.append(
                f"remote verification (the draft alone needs {alone.total_mb:.0f} MB here)"
            )
    target = next(m for m in estimate.models if m.name == "target")
    if target.bits > 4:
        smaller = estimate.with_int4("target")
        if smaller.total_bytes <= budget_bytes:
            found.append(
                f"an int4 target (about {smaller.total_mb:.0f} MB: edgespec export --quant int4)"
            )
    return found


def admit(estimate: PairEstimate, *, budget_mb: float | None, shrink_context: bool) -> Admission:
    """Admits the pair at its full context, or at the longest context that fits when
    ``shrink_context`` allows; otherwise raises :class:`BudgetError` naming the estimate, the
    budget and what would fit."""
    if budget_mb is None:
        return Admission(estimate=estimate, budget_mb=None)
    budget = int(budget_mb * MIB)
    if estimate.total_bytes <= budget:
        return Admission(estimate=estimate, budget_mb=budget_mb)
    longest = estimate.longest_context(budget)
    if shrink_context and longest >= MIN_CONTEXT:
        shrunk = replace(estimate, context=longest)
        return Admission(estimate=shrunk, budget_mb=budget_mb, shrunk_from=estimate.context)
    options = alternatives(estimate, budget)
    raise BudgetError(
        f"the pair needs an estimated {estimate.total_mb:.0f} MB at a context of "
        f"{estimate.context} tokens (weights, KV cache, workspace, {estimate.margin:.0%} "
        f"margin, {estimate.tokenizer_bytes / MIB:.0f} MB of tokenizer and "
        f"{estimate.base_bytes / MIB:.0f} MB already used by this process), over the "
        f"memory budget of {budget_mb:.0f} MB",
        fix=(
            "what would fit: " + "; or ".join(options)
            if options
            else "nothing smaller fits: raise the budget or use a smaller pair"
        ),
    )
