"""edgespec's GGUF kernels as ONNX Runtime operators (GgufMatMul, GgufGather: csrc/gguf_ops.c):
products and lookups on llama.cpp's blocks (Q4_0 ... Q8_0, Q2_K ... Q6_K, IQ4_NL, IQ4_XS) against
the ``gguf`` package's own dequantization, bit-identical rows whatever a pass's width or thread
count, on the path this process runs, and a missing library reported in one line. Every
instruction-set path against the portable reference: test_kernel_paths.py."""

from __future__ import annotations

import shutil
import sysconfig

import numpy as np
import onnxruntime
import pytest

from edgespec.errors import BundleError
from edgespec.export.gguf.rows8 import ROWS8_OFFSET, to_rows8
from edgespec.graph import kernels
from edgespec.graph.kernels import (
    GGUF_DOMAIN,
    gguf_kernel_library,
    gguf_kernel_path,
    register_gguf_kernels,
)

from support.gguf_blocks import random_blocks
from support.kernel_inputs import one_signed, saturated

built = pytest.mark.skipif(
    gguf_kernel_library() is None, reason="the GGUF kernels did not build in this install"
)
# Widths and counts that cross the kernel's 32-row passes and 16-output tasks.
ROWS, OUTPUTS, INPUTS = 37, 40, 512
LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
# IQ4_NL and IQ4_XS: 4-bit indices into a table of 16 signed values.
TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", *LEGACY, "IQ4_NL", "IQ4_XS"]
# The x86-64 paths: the same products (every sum an exact integer), other instructions.
X86_PATHS = ("avx-vnni", "avx512-vnni", "avx2")
# A kind is a block type, "/rows8" when W is stored in the kernels' rows-of-8 layout.
KINDS = [*TYPES, *(f"{kind}/rows8" for kind in TYPES)]


def _type(kind: str) -> str:
    return kind.split("/")[0]


def _session(
    op: str,
    kind: str,
    blocks: np.ndarray,
    threads: int = 2,
    addend: str = "",
    *,
    activation: int = 0,
) -> onnxruntime.InferenceSession:
    """One GgufMatMul (x [rows, INPUTS]) or GgufGather (ids [count]) over ``blocks``; with
    ``addend`` "bias" or "residual", GgufMatMul's third input ``a`` ([OUTPUTS] or Y's shape);
    ``activation`` its attribute
    (1: SwiGLU over gates and ups in alternate groups of 8)."""
    import gguf
    from onnx import TensorProto, helper, numpy_helper

    ggml_type = int(gguf.GGMLQuantizationType[_type(kind)])
    if kind.endswith("/rows8"):
        blocks, ggml_type = to_rows8(blocks, _type(kind)), ggml_type + ROWS8_OFFSET
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", INPUTS])
        if op == "GgufMatMul"
        else helper.make_tensor_value_info("ids", TensorProto.INT64, ["count"])
    ]
    if addend:
        shape = [OUTPUTS] if addend == "bias" else ["rows", OUTPUTS]
        inputs.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, shape))
    names = [inputs[0].name, "w", *(["a"] if addend else [])]
    initializers = [numpy_helper.from_array(blocks, "w")]
    node = helper.make_node(
        op,
        names,
        ["y"],
        domain=GGUF_DOMAIN,
        ggml_type=ggml_type,
        in_features=INPUTS,
        out_features=len(blocks),
        **({"activation": activation} if activation else {}),
    )
    graph = helper.make_graph(
        [node],
        "kernel",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(GGUF_DOMAIN, 1)]
    )
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    register_gguf_kernels(options, required=True)
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _blocks(rng: np.random.Generator, kind: str) -> np.ndarray:
    """Random blocks of ``kind`` for a weight [OUTPUTS, INPUTS], float16 factors set small
    (in the file's layout, whatever the kind's)."""
    return random_blocks(rng, _type(kind), OUTPUTS, INPUTS)


def _dequantized(kind: str, blocks: np.ndarray) -> np.ndarray:
    import gguf

    quant = gguf.GGMLQuantizationType[_type(kind)]
    return gguf.quants.dequantize(blocks, quant).reshape(OUTPUTS, INPUTS)


def test_the_kernels_build_wherever_a_c_compiler_is() -> None:
    """The library is built at install; a fallback-only install is for machines without a
    compiler, so where one is found the library must be there (and report its path)."""
    compiler = sysconfig.get_config_var("CC") or "cc"
    if shutil.which(compiler.split()[0]) is None and shutil.which("cc") is None:
        pytest.skip("no C compiler here: the install falls back to MatMulNBits graphs")
    assert gguf_kernel_library() is not None
    assert gguf_kernel_path() in (*X86_PATHS, "neon-dotprod", "neon", "portable")


@built
@pytest.mark.parametrize("kind", KINDS)
def test_products_follow_the_files_dequantized_weights(kind: str) -> None:
    """x @ W.T from the blocks as stored, within the rounding of 8-bit activations (llama.cpp
    quantizes activations the same way: 8 bits per 256 inputs)."""
    rng = np.random.default_rng(1)
    blocks = _blocks(rng, kind)
    x = rng.standard_normal((ROWS, INPUTS)).astype(np.float32)
    got = _session("GgufMatMul", kind, blocks).run(None, {"x": x})[0]
    expected = x.astype(np.float64) @ _dequantized(kind, blocks).T.astype(np.float64)
    assert got.shape == (ROWS, OUTPUTS)
    assert np.abs(got - expected).max() <= 0.02 * np.abs(expected).max()


@built
@pytest.mark.parametrize("kind", KINDS)
def test_the_widest_integer_sums_do_not_overflow(kind: str) -> None:
    """Every code and scale at its largest against inputs of one sign (127 or -127 after
    quantization): the sums that a 16-bit partial sum would overflow first still follow the
    dequantized weights, on the path this CPU takes and in passes of one row and of several."""
    blocks = saturated(_blocks(np.random.default_rng(5), kind), _type(kind))
    session = _session("GgufMatMul", kind, blocks)
    expected = one_signed(5, INPUTS).astype(np.float64) @ _dequantized(kind, blocks).T.astype(
        np.float64
    )
    for rows in (1, 5):
        got = session.run(None, {"x": one_signed(rows, INPUTS)})[0]
        assert np.abs(got - expected[:rows]).max() <= 1e-3 * np.abs(expected).max(), kind


@built
@pytest.mark.parametrize("kind", KINDS)
def test_a_row_gives_the_same_bits_in_any_pass_and_on_any_thread_count(kind: str) -> None:
    """What lets a target step unpadded and still verify exactly: row m's outputs are the same
    bits alone, among 5 rows, among 37 (past one 32-row pass), on 1 thread or 2."""
    rng = np.random.default_rng(2)
    blocks = _blocks(rng, kind)
    x = rng.standard_normal((ROWS, INPUTS)).astype(np.float32)
    two, one = _session("GgufMatMul", kind, blocks), _session("GgufMatMul", kind, blocks, 1)
    whole = two.run(None, {"x": x})[0]
    assert np.array_equal(one.run(None, {"x": x})[0], whole)
    assert np.array_equal(two.run(None, {"x": x[30:35]})[0], whole[30:35])
    for row in (0, 33, ROWS - 1):
        assert np.array_equal(two.run(None, {"x": x[row : row + 1]})[0], whole[row : row + 1])


@built
@pytest.mark.parametrize("addend", ["bias", "residual"])
def test_a_bias_or_residual_is_added_as_an_add_would(addend: str) -> None:
    """GgufMatMul's third input (the graph's bias and residual adds, fused): the product's bits
    plus the addend, exactly as a separate Add gives them."""
    rng = np.random.default_rng(5)
    blocks = _blocks(rng, "Q4_K")
    x = rng.standard_normal((ROWS, INPUTS)).astype(np.float32)
    a = rng.standard_normal((OUTPUTS,) if addend == "bias" else (ROWS, OUTPUTS))
    a = a.astype(np.float32)
    product = _session("GgufMatMul", "Q4_K", blocks).run(None, {"x": x})[0]
    fused = _session("GgufMatMul", "Q4_K", blocks, addend=addend)
    assert np.array_equal(fused.run(None, {"x": x, "a": a})[0], product + a)
    if addend == "residual":  # rows that are not X's: refused by the kernel, in its words
        with pytest.raises(Exception, match="addend"):
            fused.run(None, {"x": x, "a": np.zeros((2, OUTPUTS), np.float32)})


@built
@pytest.mark.parametrize("kind", KINDS)
def test_lookups_are_the_files_dequantized_rows(kind: str) -> None:
    rng = np.random.default_rng(3)
    blocks = _blocks(rng, kind)
    ids = np.array([3, 0, OUTPUTS - 1, 3], dtype=np.int64)
    got = _session("GgufGather", kind, blocks).run(None, {"ids": ids})[0]
    np.testing.assert_allclose(got, _dequantized(kind, blocks)[ids], rtol=1e-6, atol=1e-9)
    with pytest.raises(Exception, match="outside the table"):
        _session("GgufGather", kind, blocks).run(None, {"ids": np.array([OUTPUTS], np.int64)})


@built
def test_an_unread_block_type_is_refused_when_the_session_loads() -> None:
    blocks = np.zeros((OUTPUTS, INPUTS // 256 * 110), np.uint8)
    with pytest.raises(Exception, match=r"ggml_type must be Q4_0 .* or IQ4_XS"):
        _session("GgufMatMul", "IQ2_XXS", blocks)


def test_a_graph_that_needs_missing_kernels_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(kernels.ENVIRONMENT, "off")
    kernels.gguf_kernel_library.cache_clear()
    kernels.gguf_kernel_path.cache_clear()
    try:
        options = onnxruntime.SessionOptions()
        assert register_gguf_kernels(options, required=False) is False
        with pytest.raises(BundleError) as caught:
            register_gguf_kernels(options, required=True)
        message = str(caught.value)
        assert "not built" in message and "\n" not in message
        assert "re-import" in caught.value.fix
        assert gguf_kernel_path() == "unavailable"
    finally:
        monkeypatch.delenv(kernels.ENVIRONMENT)
        kernels.gguf_kernel_library.cache_clear()
        kernels.gguf_kernel_path.cache_clear()


@built
@pytest.mark.parametrize("kind", ["Q4_K", "Q4_0"])
def test_the_avx2_activation_quantizer_gives_the_scalar_ones_bits(kind: str) -> None:
    """Every product starts by quantizing X per block; the AVX2 quantizer must give the
    scalar loop's int8 values, scales and sums exactly, or the two paths' products drift."""
    import ctypes

    import gguf

    if gguf_kernel_path() not in X86_PATHS:
        pytest.skip(f"this CPU runs the {gguf_kernel_path()} path: no AVX2 quantizer")
    library = ctypes.CDLL(str(gguf_kernel_library()))
    quantize = library.edgespec_gguf_quantize
    quantize.restype = ctypes.c_int
    rng = np.random.default_rng(7)
    rows, k = 5, 1024
    block, span = (256, 16) if kind == "Q4_K" else (32, 32)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero block: scale 0, codes 0
    x[1] = np.round(x[1] * 8) / 2  # values on halves: ties round to even in both
    x[2, :block] *= 1e-30  # tiny magnitudes
    results = []
    for vectorized in (0, 1):
        q = np.zeros((rows, k), np.int8)
        scale = np.zeros((rows, k // block), np.float32)
        sums = np.zeros((rows, k // span), np.int16)
        assert (
            quantize(
                x.ctypes.data_as(ctypes.c_void_p),
                ctypes.c_int64(rows),
                ctypes.c_int64(k),
                int(gguf.GGMLQuantizationType[kind]),
                vectorized,
                q.ctypes.data_as(ctypes.c_void_p),
                scale.ctypes.data_as(ctypes.c_void_p),
                sums.ctypes.data_as(ctypes.c_void_p),
            )
            == 0
        )
        results.append((q, scale, sums))
    (q0, scale0, sums0), (q1, scale1, sums1) = results
    assert np.array_equal(q0, q1) and np.array_equal(scale0, scale1)
    assert np.array_equal(sums0, sums1)
    # and they are what they claim: sums of the codes, codes within [-127, 127]
    assert np.array_equal(sums0, q0.reshape(rows, -1, span).sum(axis=2, dtype=np.int16))
    assert np.abs(q0).max() <= 127 and not q0[0, :256].any()


@built
@pytest.mark.parametrize("kind", ["Q4_K", "Q4_K/rows8", "Q6_K/rows8", "Q4_0/rows8", "Q5_0"])
def test_swiglu_is_silu_of_the_gates_times_the_ups_with_the_same_bits_in_any_pass(
    kind: str,
) -> None:
    """GgufMatMul with activation 1 (the gated MLP in one node): W holds gate and up rows in
    alternate groups of 8, Y is silu(x @ gate.T) * (x @ up.T), each row's bits the same in any
    pass; an attribute it does not know, or a width not in groups of 16, is refused."""
    from edgespec.export.gguf.raw_blocks import RawBlocks, interleave_by_8

    rng = np.random.default_rng(11)
    gate, up = _blocks(rng, kind), _blocks(rng, kind)
    both = interleave_by_8(
        RawBlocks(data=gate, kind=_type(kind), rows=OUTPUTS, columns=INPUTS),
        RawBlocks(data=up, kind=_type(kind), rows=OUTPUTS, columns=INPUTS),
    ).data
    assert np.array_equal(both[8:16], up[:8]) and np.array_equal(both[16:24], gate[8:16])
    x = rng.standard_normal((ROWS, INPUTS)).astype(np.float32) * 4
    session = _session("GgufMatMul", kind, both, activation=1)
    got = session.run(None, {"x": x})[0]
    products = [x.astype(np.float64) @ _dequantized(kind, w).T for w in (gate, up)]
    expected = products[0] / (1 + np.exp(-products[0])) * products[1]
    assert got.shape == (ROWS, OUTPUTS)
    assert np.abs(got - expected).max() <= 0.03 * np.abs(expected).max()
    for rows in (slice(0, 1), slice(30, 35), slice(ROWS - 1, ROWS)):
        assert np.array_equal(session.run(None, {"x": x[rows]})[0], got[rows])
    with pytest.raises(Exception, match="activation must be"):
        _session("GgufMatMul", kind, both, activation=2)
    with pytest.raises(Exception, match="activation must be"):
        _session("GgufMatMul", kind, both[:40], activation=1)
