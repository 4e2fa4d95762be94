"""The memory estimate from manifests and admission against a budget (no models needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgespec.errors import BudgetError
from edgespec.manifest import load_bundle
from edgespec.telemetry.estimate import (
    LOGITS_ROWS,
    MIB,
    PREFILL_CHUNK,
    SESSION_BYTES,
    TOKENIZER_FACTOR,
    ModelCost,
    PairEstimate,
    admit,
    estimate_pair,
)

from support.fake_bundle import make_bundle


def cost(name: str, *, weights_mb: float, per_token_kb: float, bits: int = 32) -> ModelCost:
    return ModelCost(
        name=name,
        weight_bytes=int(weights_mb * MIB),
        workspace_bytes=0,
        bytes_per_token=int(per_token_kb * 1024),
        parameters=int(weights_mb * MIB / 4),
        bits=bits,
        max_length=2048,
    )


def pair(context: int = 2048) -> PairEstimate:
    return PairEstimate(
        models=(
            cost("target", weights_mb=400, per_token_kb=256),
            cost("draft", weights_mb=40, per_token_kb=64),
        ),
        context=context,
        base_bytes=100 * MIB,
        margin=0.25,
    )


def test_estimate_arithmetic() -> None:
    # (400 + 40 MB + 320 KB × 2048) × 1.25 + 100 MB = (440 + 640) × 1.25 + 100 = 1450 MB
    assert pair().total_mb == pytest.approx(1450.0)
    assert pair().longest_context(int(1450 * MIB)) == 2048
    # 1000 MB: (1000 - 100) / 1.25 = 720 MB; minus 440 MB of weights = 280 MB of 320 KB tokens
    assert pair().longest_context(1000 * MIB) == 896
    assert pair().longest_context(500 * MIB) == 0


def test_estimate_from_manifests(tmp_path: Path) -> None:
    target = load_bundle(make_bundle(tmp_path / "t"))
    draft = load_bundle(make_bundle(tmp_path / "d", layers=1))
    estimate = estimate_pair(target, draft, base_bytes=0)
    assert estimate.context == 256
    target_cost = estimate.models[0]
    spec = target.manifest.model
    # 2 copies of a concat graph's KV (512 B/token) + a prefill chunk's attention scores; no
    # logits per context token: prefill asks for the last row only.
    scores = PREFILL_CHUNK * spec.num_attention_heads * 4
    assert target_cost.bytes_per_token == 2 * 512 + scores
    workspace = SESSION_BYTES + LOGITS_ROWS * spec.vocab_size * 8
    assert target_cost.workspace_bytes == workspace
    tokenizer = TOKENIZER_FACTOR * target.tokenizer_path.stat().st_size
    assert estimate.tokenizer_bytes == tokenizer
    per_token = target_cost.bytes_per_token + estimate.models[1].bytes_per_token
    models = 2 * (280 + workspace) + per_token * 256
    assert estimate.total_bytes == tokenizer + int(models * 1.10)
    assert estimate_pair(target, None, base_bytes=0, context=100).context == 100


def test_budget_below_the_estimate_refuses_and_says_what_would_fit() -> None:
    with pytest.raises(BudgetError) as raised:
        admit(pair(), budget_mb=1100, shrink_context=False)
    message = str(raised.value)
    assert "estimated 1450 MB at a context of 2048 tokens" in message
    assert "memory budget of 1100 MB" in message
    assert "a max context of 1152 tokens" in message
    assert "remote verification (the draft alone needs" in message
    assert "an int4 target (about 1020 MB" in message


def test_budget_too_small_for_anything() -> None:
    with pytest.raises(BudgetError, match="nothing smaller fits"):
        admit(pair(), budget_mb=50, shrink_context=True)


def test_shrink_context_when_allowed() -> None:
    admission = admit(pair(), budget_mb=1000, shrink_context=True)
    assert admission.estimate.context == 896 and admission.shrunk_from == 2048
    assert admission.estimate.total_bytes <= 1000 * MIB


def test_generous_budget_admits_at_full_context() -> None:
    admission = admit(pair(), budget_mb=4096, shrink_context=False)
    assert admission.estimate.context == 2048 and admission.shrunk_from is None
    assert admit(pair(), budget_mb=None, shrink_context=False).budget_mb is None


def test_a_measured_resident_size_replaces_the_weights(tmp_path: Path) -> None:
    import json

    root = make_bundle(tmp_path / "t")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["memory"] |= {"resident_bytes": 50 * MIB, "gathered_bytes": 100}
    (root / "manifest.json").write_text(json.dumps(manifest))
    cost = estimate_pair(load_bundle(root), None, base_bytes=0).models[0]
    vocab = manifest["model"]["vocab_size"]
    # The exporter's measurement holds the session's fixed cost and the packed weights.
    assert cost.weight_bytes == 50 * MIB
    assert cost.workspace_bytes == LOGITS_ROWS * vocab * 8
    del manifest["memory"]["resident_bytes"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    unmeasured = estimate_pair(load_bundle(root), None, base_bytes=0).models[0]
    assert unmeasured.weight_bytes == manifest["memory"]["weight_bytes"] - 100
