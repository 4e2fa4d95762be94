"""Protocol v1 without models: the shared JSON vectors, exact q_draft transport, validation."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.config import SamplingConfig
from edgespec.errors import ProtocolError
from edgespec.protocol.q_draft import decode_q_draft, encode_q_draft
from edgespec.protocol.server_info import ServerInfo
from edgespec.protocol.sessions import (
    OpenRequest,
    OpenResponse,
    VerifyRequest,
    VerifyResponse,
    uniforms_used,
)
from edgespec.runtime.acceptance import accept_sampled
from edgespec.runtime.sampling import probabilities

VECTORS = json.loads((Path(__file__).parents[1] / "vectors" / "protocol_v1.json").read_text())
LIMITS = {"vocab_size": VECTORS["vocab_size"], "max_length": VECTORS["max_length"]}
MESSAGES = {
    kind.__name__: kind
    for kind in (OpenRequest, OpenResponse, VerifyRequest, VerifyResponse, ServerInfo)
}


def parse(kind: str, data: Any, **extra: Any) -> Any:
    if kind in ("OpenRequest", "VerifyRequest"):
        return MESSAGES[kind].from_json(data, **LIMITS)
    if kind == "VerifyResponse":
        return VerifyResponse.from_json(data, k=extra.get("k", 8))
    return MESSAGES[kind].from_json(data)


@pytest.mark.parametrize("vector", VECTORS["valid"], ids=lambda v: v["name"])
def test_valid_vectors_decode_and_encode_back(vector: dict[str, Any]) -> None:
    message = parse(vector["kind"], vector["json"], k=vector.get("k", 8))
    if isinstance(message, VerifyRequest) and message.q_draft is not None:
        assert np.array_equal(message.q_draft, np.asarray(vector["q_draft_dense"]))
        q_format = vector["json"]["q_draft"]["format"]
        assert message.to_json(q_format=q_format) == vector["json"]
    else:
        assert message.to_json() == vector["json"]


@pytest.mark.parametrize("vector", VECTORS["invalid"], ids=lambda v: v["name"])
def test_invalid_vectors_are_refused_with_a_message(vector: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse(vector["kind"], vector["json"], k=1)
    assert vector["error"] in str(caught.value)


def test_sparse_q_draft_is_exact_for_truncated_sampling() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 500))
    for sampling in (
        SamplingConfig(temperature=0.7, top_k=40),
        SamplingConfig(temperature=1.3, top_p=0.8),
    ):
        q = probabilities(logits, sampling)
        encoded = encode_q_draft(q)
        assert encoded["format"] == "sparse"
        assert len(encoded["ids"][0]) <= 500
        through = json.loads(json.dumps(encoded))  # float64 survives JSON exactly
        assert np.array_equal(decode_q_draft(through, k=4, vocab_size=500), q)


def test_dense_rows_travel_as_fp16() -> None:
    q = probabilities(
        np.random.default_rng(1).normal(size=(2, 2000)), SamplingConfig(temperature=1)
    )
    encoded = encode_q_draft(q)
    assert encoded["format"] == "fp16"
    assert len(json.dumps(encoded)) < 2 * 2 * 2000 * 1.4  # base64 of 2 bytes per probability
    decoded = decode_q_draft(encoded, k=2, vocab_size=2000)
    assert np.allclose(decoded, q, rtol=1e-3, atol=1e-7)


class CountingGenerator:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.draws = 0

    def random(self) -> float:
        self.draws += 1
        return float(self.rng.random())


@given(seed=st.integers(0, 2**32), k=st.integers(0, 6))
@settings(max_examples=40, deadline=None)
def test_uniforms_used_counts_what_the_rejection_test_draws(seed: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    sampling = SamplingConfig(temperature=1.0, top_k=3)
    q = probabilities(rng.normal(size=(k, 6)), sampling)
    p = probabilities(rng.normal(size=(k + 1, 6)), sampling)
    draft = [int(np.flatnonzero(row)[0]) for row in q]
    counter = CountingGenerator(seed)
    outcome = accept_sampled(draft, q, p, counter)  # type: ignore[arg-type]
    assert counter.draws == uniforms_used(outcome.n_accepted, k) <= k + 1


@given(
    data=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=20,
    )
)
@settings(max_examples=80, deadline=None)
def test_arbitrary_json_is_refused_cleanly(data: Any) -> None:
    for kind in ("OpenRequest", "VerifyRequest", "VerifyResponse", "OpenResponse", "ServerInfo"):
        with contextlib.suppress(ProtocolError):
            parse(kind, data, k=2)


def test_round_trip_of_every_record() -> None:
    sampling = SamplingConfig(temperature=0.5, top_k=3, top_p=0.9, seed=4, mode="match")
    opened = OpenRequest(prompt=(1, 2), sampling=sampling)
    assert OpenRequest.from_json(opened.to_json(), **LIMITS) == opened
    response = OpenResponse(session_id="s", length=1, suggested_k=2)
    assert OpenResponse.from_json(response.to_json()) == response
    info = ServerInfo(
        vocab_size=8,
        max_length=32,
        eos_token_ids=(0, 1),
        tokenizer_sha256="x",
        max_k=8,
        target_step_s=0.1,
        verify_cost=(1.0, 1.5),
    )
    assert ServerInfo.from_json(info.to_json()) == info
