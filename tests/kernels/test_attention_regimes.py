"""Passes cut at the attention's rounding boundaries: every position gets the bits its single
step would give, whatever the speculative schedule (Gemma 3's 256-wide heads need it)."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.export.gguf.regimes import attention_session, probe_boundaries
from edgespec.graph.passes import pass_pieces, regime

pytest.importorskip("onnx")

BOUNDARIES = (65, 193, 321)


def test_pieces_cover_the_pass_and_hold_one_regime_each() -> None:
    rng = np.random.default_rng(0)
    for _ in range(2000):
        past, count = int(rng.integers(0, 400)), int(rng.integers(1, 140))
        min_width = int(rng.integers(1, 3))
        pieces = pass_pieces(past, count, min_width, BOUNDARIES)
        assert [b for b, _, _ in pieces] == [0] + [e for _, e, _ in pieces[:-1]]
        assert pieces[-1][1] == count
        for begin, end, width in pieces:
            assert width >= max(end - begin, min_width)
            total = past + begin + width
            for i in range(begin, end):
                assert regime(total, BOUNDARIES) == regime(past + i + min_width, BOUNDARIES)


def test_without_boundaries_a_pass_stays_whole() -> None:
    assert pass_pieces(60, 9, 2, ()) == [(0, 9, 9)]
    assert pass_pieces(60, 1, 2, ()) == [(0, 1, 2)]
    assert pass_pieces(62, 3, 2, BOUNDARIES) == [(0, 1, 2), (1, 3, 2)]


def _decode(session, q, k, v, capacity, schedule, boundaries):  # type: ignore[no-untyped-def]
    """Each position's attention output [hidden], running passes of the given widths (cut at
    ``boundaries``, each padded to two positions) over one KV buffer."""
    kv_heads, head_dim = 1, k.shape[-1]
    past_k = np.zeros((1, kv_heads, capacity, head_dim), np.float32)
    past_v = np.zeros_like(past_k)
    rows, position, widths = [], 0, iter(schedule)
    while position < len(q):
        count = min(next(widths), len(q) - position)
        for begin, end, width in pass_pieces(position, count, 2, boundaries):
            start = position + begin
            index = [min(start + i, start + end - begin - 1) for i in range(width)]
            out, past_k, past_v = session.run(
                None,
                {
                    "q": q[None, index],
                    "k": k[None, index],
                    "v": v[None, index],
                    "past_k": past_k,
                    "past_v": past_v,
                    "seqlens_k": np.array([start + width - 1], np.int32),
                    "total": np.array(start + width, np.int32),
                },
            )
            rows.extend(out[0, : end - begin])
        position += count
    return np.stack(rows)


def test_cut_passes_give_every_position_its_single_step_bits() -> None:
    heads, head_dim, capacity, length = 4, 256, 256, 220
    boundaries = probe_boundaries(heads=heads, kv_heads=1, head_dim=head_dim, capacity=capacity)
    assert all(0 < b <= capacity for b in boundaries)
    session = attention_session(heads=heads, kv_heads=1, head_dim=head_dim, capacity=capacity)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((length, heads * head_dim)).astype(np.float32)
    k = rng.standard_normal((length, head_dim)).astype(np.float32)
    v = rng.standard_normal((length, head_dim)).astype(np.float32)
    single = _decode(session, q, k, v, capacity, iter(lambda: 1, None), boundaries)
    schedule = [9, 3, 5, 2, 8, 4, 7, 6] * 40
    cut = _decode(session, q, k, v, capacity, schedule, boundaries)
    assert np.array_equal(cut, single)
    if boundaries:  # the machine's kernel does round by total: uncut passes show it (which
        # schedules do depends on where the boundaries fall: one of these straddles each)
        schedules = ([9, 3, 5, 2, 8, 4, 7, 6] * 40, [2, 3] * 200, [5] * 200)
        uncut = [_decode(session, q, k, v, capacity, s, ()) for s in schedules]
        assert any(not np.array_equal(rows, single) for rows in uncut)
