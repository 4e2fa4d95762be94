"""The memory estimate from manifests and admission against a budget (no models needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgespec.errors import BudgetError
from edgespec.manifest import load_bundle
from edgespec.telemetry.estimate import (
    MIB,
    SESSION_BYTES,
    ModelCost,
    PairEstimate,
    admit,
    estimate_pair,
)

from fake_bundle import make_bundle


def cost(name: str, *, weights_mb: float, per_token_kb: float, bits: int = 32) -> ModelCost:
    return ModelCost(
        name=name,
        weight_bytes=int(weights_mb * MIB),
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
        session_bytes=0,
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
    # 2 copies of the KV (512 B/token) + fp32 logits (24 B/position).
    assert target_cost.bytes_per_token == 2 * 512 + 24
    sessions = 2 * SESSION_BYTES
    assert estimate.total_bytes == sessions + int((280 * 2 + 2 * (2 * 512 + 24) * 256) * 1.25)
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
