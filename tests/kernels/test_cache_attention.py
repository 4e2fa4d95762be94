"""edgespec's CacheAttention operator (``csrc/cache_attention.c``): attention over an in-place
KV cache against a float64 reference (with and without a sliding window, several query heads
per KV head), the same bits for a row at any pass width, thread count or cache binding, on
both code paths (AVX2 and portable C), padding rows kept out of the cache, and bad lengths
refused in one line; the float16-cache operator (CacheAttentionHalf) the same over keys and
values rounded to float16 as they are written, its rounding IEEE's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from edgespec.graph.kernels import (
    CACHE_ATTENTION,
    CACHE_ATTENTION_HALF,
    GGUF_DOMAIN,
    gguf_kernel_library,
)

pytestmark = pytest.mark.skipif(
    gguf_kernel_library() is None, reason="the GGUF kernels did not build in this install"
)

CAPACITY = 640
POSITIONS = 600  # crosses four of the kernel's 128-position blocks
# (query heads, KV heads, head width, window): Gemma 3's, Qwen2.5-1.5B's and SmolLM2's shapes
# (narrowed), and a width that is not a multiple of 8 (the portable loop on every path).
SHAPES = [(4, 1, 64, 200), (12, 2, 32, 0), (9, 3, 16, 0), (4, 2, 12, 50)]


def attention_session(
    heads: int,
    kv_heads: int,
    d: int,
    window: int,
    threads: int = 2,
    *,
    half: bool = False,
    sink: int = 0,
) -> object:
    from onnx import TensorProto, helper

    from edgespec.graph.kernels import register_gguf_kernels

    cache = [1, kv_heads, CAPACITY, d]
    cache_type = TensorProto.FLOAT16 if half else TensorProto.FLOAT
    node = helper.make_node(
        CACHE_ATTENTION_HALF if half else CACHE_ATTENTION,
        ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total"],
        ["y", "present_k", "present_v"],
        domain=GGUF_DOMAIN,
        num_heads=heads,
        kv_num_heads=kv_heads,
        window=window,
        **({"sink": sink} if sink else {}),
    )
    floats = TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "cache-attention",
        [
            helper.make_tensor_value_info("q", floats, [1, "s", heads * d]),
            helper.make_tensor_value_info("k", floats, [1, "s", kv_heads * d]),
            helper.make_tensor_value_info("v", floats, [1, "s", kv_heads * d]),
            helper.make_tensor_value_info("past_k", cache_type, cache),
            helper.make_tensor_value_info("past_v", cache_type, cache),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
            helper.make_tensor_value_info("total", TensorProto.INT32, []),
        ],
        [
            helper.make_tensor_value_info("y", floats, [1, "s", heads * d]),
            helper.make_tensor_value_info("present_k", cache_type, cache),
            helper.make_tensor_value_info("present_v", cache_type, cache),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(GGUF_DOMAIN, 1)]
    )
    model.ir_version = 10
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    register_gguf_kernels(options, required=True)
    return onnxruntime.InferenceSession(model.SerializeToString(), options)


def inputs(heads: int, kv_heads: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(heads * 100 + d)
    q = rng.standard_normal((POSITIONS, heads * d), dtype=np.float32)
    k = rng.standard_normal((POSITIONS, kv_heads * d), dtype=np.float32)
    v = rng.standard_normal((POSITIONS, kv_heads * d), dtype=np.float32)
    return q, k, v


def reference(
    heads: int, kv_heads: int, d: int, window: int, *, half: bool = False, sink: int = 0
) -> np.ndarray:
    """Causal attention in float64; position i sees i - window + 1 .. i with a window
    (llama.cpp's), and 0 .. sink - 1 too with a sink, query head h reading KV head
    h // (heads / kv_heads); with ``half``, as
    llama.cpp over a float16 cache: the query, keys and values rounded to float16 first, and
    the softmax's probabilities rounded to float16 before they weigh the values."""
    q, k, v = inputs(heads, kv_heads, d)
    if half:
        q, k, v = q.astype(np.float16), k.astype(np.float16), v.astype(np.float16)
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    group = heads // kv_heads
    i, j = np.arange(POSITIONS)[:, None], np.arange(POSITIONS)[None, :]
    hidden = (j > i) | ((window > 0) & (i - j >= window) & (j >= sink))
    out = np.zeros((POSITIONS, heads * d))
    for head in range(heads):
        kv = head // group
        scores = q[:, head * d : (head + 1) * d] @ k[:, kv * d : (kv + 1) * d].T / np.sqrt(d)
        scores[hidden] = -np.inf
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        if half:
            weights = weights.astype(np.float16).astype(np.float64)
        out[:, head * d : (head + 1) * d] = weights @ v[:, kv * d : (kv + 1) * d]
    return out


def run_passes(
    session: object,
    shape: tuple[int, int, int, int],
    widths: list[int],
    *,
    in_place: bool = True,
    half: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The POSITIONS rows in passes of ``widths``; returns the outputs [POSITIONS, heads × D]
    and the key cache [kv_heads, CAPACITY, D] after them. ``in_place``: present bound to
    past's buffers (the runtime's path); else fresh outputs copied back (the plain path)."""
    heads, kv_heads, d, _ = shape
    q, k, v = inputs(heads, kv_heads, d)
    cache_type = np.float16 if half else np.float32
    caches = [np.zeros((1, kv_heads, CAPACITY, d), cache_type) for _ in range(2)]
    outputs, position = [], 0
    for width in widths:
        end = position + width
        feeds = {
            "q": q[None, position:end],
            "k": k[None, position:end],
            "v": v[None, position:end],
            "seqlens_k": np.array([end - 1], np.int32),
            "total": np.array(end, np.int32),
        }
        if in_place:
            binding = session.io_binding()  # type: ignore[attr-defined]
            for name, value in feeds.items():
                binding.bind_cpu_input(name, value)
            for name, cache in zip(("k", "v"), caches, strict=True):
                value = onnxruntime.OrtValue.ortvalue_from_numpy(cache)
                binding.bind_ortvalue_input(f"past_{name}", value)
                binding.bind_ortvalue_output(f"present_{name}", value)
            binding.bind_output("y")
            session.run_with_iobinding(binding)  # type: ignore[attr-defined]
            y = binding.get_outputs()[2].numpy()
        else:
            y, *present = session.run(  # type: ignore[attr-defined]
                None, {**feeds, "past_k": caches[0], "past_v": caches[1]}
            )
            for cache, new in zip(caches, present, strict=True):
                cache[...] = new
        outputs.append(np.array(y[0]))
        position = end
    return np.concatenate(outputs), caches[0][0]


@pytest.mark.parametrize("half", [False, True], ids=["float32-cache", "float16-cache"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "q{}-kv{}-d{}-w{}".format(*s))
def test_attention_matches_the_reference_and_gives_a_row_the_same_bits_in_any_pass(
    shape: tuple[int, int, int, int], half: bool
) -> None:
    heads, kv_heads, d, _ = shape
    two_threads = attention_session(*shape, half=half)
    whole, keys = run_passes(two_threads, shape, [POSITIONS], half=half)
    expected = reference(*shape, half=half)
    # float16 probabilities: the kernel's float32 softmax and the reference's float64 one can
    # round a probability apart (one float16 step of it, 2^-11 relative)
    tolerance = 2e-4 if half else 1e-5
    assert np.abs(whole - expected).max() < tolerance * max(1.0, np.abs(expected).max())
    # The cache holds the keys at their positions (rounded as numpy rounds them to float16),
    # nothing past them.
    _, k, _ = inputs(heads, kv_heads, d)
    stored = k.reshape(POSITIONS, kv_heads, d).transpose(1, 0, 2).astype(keys.dtype)
    assert np.array_equal(
        keys[:, :POSITIONS].view(np.uint16 if half else np.uint32),
        stored.view(np.uint16 if half else np.uint32),
    )
    assert not keys[:, POSITIONS:].any()
    # One-token steps, verify-sized passes, prefill chunks, one thread, the plain path.
    steps, _ = run_passes(two_threads, shape, [1] * POSITIONS, half=half)
    mixed, _ = run_passes(two_threads, shape, [5, 1, 9, 2, 128, 3, 200, 252], half=half)
    one_thread, _ = run_passes(
        attention_session(*shape, threads=1, half=half), shape, [128] * 4 + [88], half=half
    )
    plain, _ = run_passes(two_threads, shape, [3, 7, 300, 290], in_place=False, half=half)
    for other in (steps, mixed, one_thread, plain):
        assert np.array_equal(whole, other)


def test_the_float16_cache_rounds_the_probabilities_as_llama_cpp_does() -> None:
    """Equal keys and values of ones: a row that sees n positions weighs each by 1/n, rounded
    to float16 first, so its output is n × float16(1/n) (1/3: 0.33325195; 1/5: 0.19995117),
    where float probabilities would give 1."""
    d, rows = 64, 6
    session = attention_session(2, 1, d, 0, half=True)
    rng = np.random.default_rng(3)
    query = rng.standard_normal((1, rows, 2 * d), dtype=np.float32)
    ones = np.ones((1, rows, d), np.float32)
    zeros = np.zeros((1, 1, CAPACITY, d), np.float16)
    y, _, _ = session.run(  # type: ignore[attr-defined]
        None,
        {
            "q": query,
            "k": ones,
            "v": ones,
            "past_k": zeros,
            "past_v": zeros,
            "seqlens_k": np.array([rows - 1], np.int32),
            "total": np.array(rows, np.int32),
        },
    )
    n = np.arange(1, rows + 1, dtype=np.float32)
    expected = n * (1 / n).astype(np.float16).astype(np.float32)
    assert expected[2] != 1.0 and expected[4] != 1.0
    assert np.array_equal(
        y[0].reshape(rows, 2, d), np.broadcast_to(expected[:, None, None], (rows, 2, d))
    )


def test_the_float16_cache_rounds_every_float_as_ieee_does() -> None:
    """Keys written through the operator against numpy's float16 rounding, bit for bit: ties
    at every exponent, float16 subnormals and their ties, the overflow edge, zeros, infinities."""
    d = 64
    rng = np.random.default_rng(7)
    exponents = rng.integers(-40, 17, size=4096).astype(np.float32)
    mantissas = (1 + rng.integers(0, 1 << 23, size=4096) / (1 << 23)).astype(np.float32)
    ties = np.float32(1 + 2.0**-11) * np.exp2(np.arange(-24, 16, dtype=np.float32))
    edges = np.array(
        [
            65504,
            65519.99,
            65520,
            1e6,
            2.0**-24,
            3 * 2.0**-25,
            2.0**-25,
            2.0**-26,
            0.0,
            -0.0,
            np.inf,
            -np.inf,
        ],
        np.float32,
    )
    values = np.concatenate([mantissas * np.exp2(exponents), ties, ties * 3, edges])
    values *= np.where(rng.random(values.size) < 0.5, -1, 1).astype(np.float32)
    rows = -(-values.size // d)
    keys = np.zeros(rows * d, np.float32)
    keys[: values.size] = values
    keys = keys.reshape(1, rows, d)
    session = attention_session(1, 1, d, 0, half=True)
    zeros = np.zeros((1, 1, CAPACITY, d), np.float16)
    _, written, _ = session.run(  # type: ignore[attr-defined]
        None,
        {
            "q": np.zeros_like(keys),
            "k": keys,
            "v": np.zeros_like(keys),
            "past_k": zeros,
            "past_v": zeros,
            "seqlens_k": np.array([rows - 1], np.int32),
            "total": np.array(rows, np.int32),
        },
    )
    with np.errstate(over="ignore"):  # the overflow edge rounds to infinity, as it should
        expected = keys[0].astype(np.float16)
    assert np.array_equal(written[0, 0, :rows].view(np.uint16), expected.view(np.uint16))


def test_padding_rows_stay_out_of_the_cache_and_output_zeros() -> None:
    """A pass of 4 rows told that 2 are real (seqlens_k = past + 1): the real rows' outputs
    are those of a 2-row pass, the padding rows' are zero, and the cache ends after row 2."""
    shape = (4, 1, 64, 0)
    session = attention_session(*shape)
    q, k, v = inputs(4, 1, 64)
    cache = [np.zeros((1, 1, CAPACITY, 64), np.float32) for _ in range(2)]

    def run(width: int, real: int) -> tuple[np.ndarray, np.ndarray]:
        y, keys, _ = session.run(  # type: ignore[attr-defined]
            None,
            {
                "q": q[None, :width],
                "k": k[None, :width],
                "v": v[None, :width],
                "past_k": cache[0],
                "past_v": cache[1],
                "seqlens_k": np.array([real - 1], np.int32),
                "total": np.array(width, np.int32),
            },
        )
        return y[0], keys[0, 0]

    padded, padded_keys = run(4, 2)
    exact, _ = run(2, 2)
    assert np.array_equal(padded[:2], exact) and not padded[2:].any()
    assert np.array_equal(padded_keys[:2], k[:2]) and not padded_keys[2:].any()


def test_lengths_that_do_not_fit_the_cache_are_refused_in_one_line() -> None:
    session = attention_session(4, 1, 64, 0)
    q, k, v = inputs(4, 1, 64)
    cache = np.zeros((1, 1, CAPACITY, 64), np.float32)
    feeds = {"q": q[None, :2], "k": k[None, :2], "v": v[None, :2], "past_k": cache}
    feeds |= {"past_v": cache, "seqlens_k": np.array([CAPACITY], np.int32)}
    with pytest.raises(Exception, match="CacheAttention: seqlens_k and total_sequence_length"):
        session.run(None, feeds | {"total": np.array(CAPACITY + 1, np.int32)})  # type: ignore[attr-defined]


PORTABLE_CHECK = """
import json, sys
sys.path[:0] = [{tests!r}, {tests!r} + "/.."]
import numpy as np
from edgespec.graph.kernels import gguf_kernel_path
from test_cache_attention import SHAPES, attention_session, reference, run_passes
errors, invariant = [], []
for shape in SHAPES:
    for half in (False, True):
        session = attention_session(*shape, half=half)
        whole, _ = run_passes(session, shape, [600], half=half)
        mixed, _ = run_passes(session, shape, [1, 2, 9, 128, 460], half=half)
        # as a fraction of what the test allows (float16 probabilities round apart)
        allowed = 2e-3 if half else 1e-4
        errors.append(float(np.abs(whole - reference(*shape, half=half)).max()) / allowed)
        invariant.append(bool(np.array_equal(whole, mixed)))
print(json.dumps({{"path": gguf_kernel_path(), "errors": errors, "invariant": invariant}}))
"""


def test_the_portable_path_computes_the_same_attention(tmp_path: Path) -> None:
    """Forced in a fresh process (a process picks its path once), outside the checkout, on
    the same library as this process."""
    from edgespec.graph import kernels

    tests = str(Path(__file__).parent)
    environment = {
        **os.environ,
        "EDGESPEC_GGUF_KERNEL_PATH": "portable",
        kernels.ENVIRONMENT: str(gguf_kernel_library()),
    }
    done = subprocess.run(
        [sys.executable, "-c", PORTABLE_CHECK.format(tests=tests)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=environment,
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["path"] == "portable"
    assert all(report["invariant"]) and max(report["errors"]) < 1


@pytest.mark.parametrize("half", [False, True], ids=["float32-cache", "float16-cache"])
@pytest.mark.parametrize("window", [200, 500], ids=["window-past-the-sink", "window-reaching-it"])
def test_a_sink_keeps_the_first_positions_in_every_window(window: int, half: bool) -> None:
    """A draft's window over its history with a sink: row i sees 0 .. 127 and
    i - window + 1 .. i. With a window of 200 the last steps' windows begin blocks past the
    sink (its block read apart from theirs); with 500 every window reaches the sink's block
    (one run of blocks). One pass or one-token steps, the same bits."""
    shape = (12, 2, 32, window)
    session = attention_session(*shape, half=half, sink=128)
    whole, _ = run_passes(session, shape, [POSITIONS], half=half)
    expected = reference(*shape, half=half, sink=128)
    tolerance = 2e-4 if half else 1e-5
    assert np.abs(whole - expected).max() < tolerance * max(1.0, np.abs(expected).max())
    # the sink changes the rows whose window begins past it, and only those
    without_sink = reference(*shape, half=half)
    changed = np.abs(expected - without_sink).max(axis=1) > 1e-6
    assert changed[window:].all() and not changed[:window].any()
    steps, _ = run_passes(session, shape, [1] * POSITIONS, half=half)
    assert np.array_equal(whole, steps)


def test_a_sink_that_is_not_whole_blocks_is_refused_in_one_line() -> None:
    with pytest.raises(Exception, match="sink 0 or a multiple of 128"):
        attention_session(12, 2, 32, 200, sink=100)
