"""How much memory a pair needs, from its manifests alone, and admission against a budget.

For each model at a context of ``n`` tokens::

    weights                                  (manifest: bytes of the stored weights)
  + 2 × kv_bytes_per_token × n               (the graph returns a fresh ``present`` while the
                                              ``past`` is still held; the IO-binding cache is
                                              two ping-pong buffers: two copies either way)
  + n × vocab × (logits item + 4 if not fp32) (a prefill of the whole context returns logits for
                                              every position; non-fp32 logits are converted)

then ``MARGIN`` (25 %) on top for ONNX Runtime's activations, pre-packed weights and arena
slack, plus ``SESSION_BYTES`` per model for what a session costs whatever its size, plus the
process's resident size before loading (interpreter, numpy, ONNX Runtime, tokenizers),
measured by the caller. The total is linear in ``n``, so the longest context that
fits a budget is solved for directly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from edgespec.errors import BudgetError
from edgespec.manifest import Bundle

MIB = 1024 * 1024
#: Added to the models' weights, KV and logits for what the manifests cannot know.
MARGIN = 0.25
#: Fixed cost of one ONNX Runtime CPU session, whatever its size (measured on a tiny pair's
#: two sessions: docs/benchmarks.md, "Memory and energy").
SESSION_BYTES = 12 * MIB
#: Shortest context worth suggesting.
MIN_CONTEXT = 64
#: Approximate bytes per weight of int4 MatMulNBits with fp16 scales per 32-weight block.
INT4_BYTES_PER_PARAMETER = 0.5 + 2 / 32


@dataclass(frozen=True, kw_only=True)
class ModelCost:
    """One model's fixed bytes and bytes per context token (before the margin)."""

    name: str
    weight_bytes: int
    bytes_per_token: int
    parameters: int
    bits: int
    max_length: int

    @classmethod
    def of(cls, name: str, bundle: Bundle) -> ModelCost:
        manifest = bundle.manifest
        memory = manifest.memory
        logits_item = memory.logits_bytes_per_position // max(manifest.model.vocab_size, 1)
        logits = memory.logits_bytes_per_position + (
            4 * manifest.model.vocab_size if logits_item != 4 else 0
        )
        return cls(
            name=name,
            weight_bytes=memory.weight_bytes,
            bytes_per_token=2 * memory.kv_bytes_per_token + logits,
            parameters=manifest.model.parameters,
            bits=manifest.quantization.bits,
            max_length=manifest.model.max_length,
        )


@dataclass(frozen=True, kw_only=True)
class PairEstimate:
    """Bytes for the models in ``models`` at ``context`` tokens, margin and base included."""

    models: tuple[ModelCost, ...]
    context: int
    base_bytes: int
    margin: float = MARGIN
    session_bytes: int = SESSION_BYTES

    def at(self, context: int) -> int:
        fixed = sum(m.weight_bytes for m in self.models)
        per_token = sum(m.bytes_per_token for m in self.models)
        sessions = self.session_bytes * len(self.models)
        return self.base_bytes + sessions + int((fixed + per_token * context) * (1.0 + self.margin))

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
            ModelCost(
                name=m.name,
                weight_bytes=min(m.weight_bytes, int(m.parameters * INT4_BYTES_PER_PARAMETER)),
                bytes_per_token=m.bytes_per_token,
                parameters=m.parameters,
                bits=4,
                max_length=m.max_length,
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
            "margin": self.margin,
            "session_mb": round(self.session_bytes / MIB, 1),
            "models": {
                m.name: {
                    "weights_mb": round(m.weight_bytes / MIB, 2),
                    "kv_and_logits_mb": round(m.bytes_per_token * self.context / MIB, 2),
                    "bits": m.bits,
                }
                for m in self.models
            },
        }


def estimate_pair(
    target: Bundle | None, draft: Bundle | None, *, base_bytes: int, context: int | None = None
) -> PairEstimate:
    """The models held on this device: no target when a remote server verifies."""
    models = [ModelCost.of("target", target)] if target is not None else []
    if draft is not None:
        models.append(ModelCost.of("draft", draft))
    if not models:
        raise ValueError("estimate_pair needs a target or a draft")
    longest = min(m.max_length for m in models)
    return PairEstimate(
        models=tuple(models),
        context=longest if context is None else min(context, longest),
        base_bytes=base_bytes,
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
        f"{estimate.context} tokens (weights, KV cache, logits, {estimate.margin:.0%} margin, "
        f"{estimate.session_bytes / MIB:.0f} MB per session and {estimate.base_bytes / MIB:.0f} "
        "MB already used by this process), over the "
        f"memory budget of {budget_mb:.0f} MB",
        fix=(
            "what would fit: " + "; or ".join(options)
            if options
            else "nothing smaller fits: raise the budget or use a smaller pair"
        ),
    )
