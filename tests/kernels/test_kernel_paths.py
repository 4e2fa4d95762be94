"""The GGUF kernels' harness, in the manner of llama.cpp's test-backend-ops: every block type
the kernels read x layout (the file's own, rows of 8) x instruction-set path (portable, avx2,
avx-vnni, avx512-vnni, neon-dotprod, neon) is one test id, run in this process through the
C test API (``edgespec_gguf_matmul_on``, csrc/gguf_test_api.c) against the portable reference
(csrc/gguf_reference.c) on random blocks, at 1, 3, 8, 9 and 37 rows (37 crosses a 32-row
pass), as a plain product and with SwiGLU's epilogue. A path this CPU (or build) lacks skips,
saying so; the NEON paths run under qemu in test_neon_kernels.py.

Tolerance: every path computes the same integer dot products per block; only the float steps
that scale and add them differ (FMA or not, lanes summed in another order), so an output may
differ from the reference by a few float32 roundings of its block terms: at most
``TOLERANCE`` (1e-5) times the largest magnitude of the reference's outputs (measured at 512
inputs: at most 3e-7, every type, layout and x86 path). The x86 paths also
give one another's bits exactly (dpbusd and maddubs add the same integers), and each path's
row is the same bits alone and inside a pass (batch invariance).

The rows-of-8 layout is specified once (csrc/gguf_rows8.h); its writer (the exporter's
rows8.py) and the C reader round-trip every type here."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from edgespec.export.gguf.raw_blocks import RawBlocks
from edgespec.export.gguf.rows8 import ROWS8_OFFSET, to_rows8
from edgespec.graph.kernels import gguf_kernel_library

from support.gguf_blocks import random_blocks
from support.kernel_inputs import one_signed, saturated

TYPES = [
    *("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"),
    *("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"),
    *("IQ4_NL", "IQ4_XS"),
]
LAYOUTS = ("file", "rows8")
PATHS = ("portable", "avx2", "avx-vnni", "avx512-vnni", "neon-dotprod", "neon")
X86_PATHS = ("avx2", "avx-vnni", "avx512-vnni")
ROW_COUNTS = (1, 3, 8, 9, 37)
INPUTS = 512
# Outputs per layout: the file's layout is what the exporter keeps for a weight whose outputs
# do not form groups of 8 (44 here); SwiGLU takes groups of 16 (48) in either layout.
CASES = {"file": ((44, 0), (48, 1)), "rows8": ((48, 0), (48, 1))}
TOLERANCE = 1e-5
NOT_HERE = -2  # edgespec_gguf_matmul_on: this CPU or build lacks the path

_library = gguf_kernel_library()
built = pytest.mark.skipif(_library is None, reason="the GGUF kernels did not build here")


def _kernels() -> ctypes.CDLL:
    library = ctypes.CDLL(str(_library))
    library.edgespec_gguf_matmul_on.argtypes = [
        ctypes.c_char_p,
        *(ctypes.c_void_p,) * 3,
        *(ctypes.c_int64,) * 3,
        ctypes.c_int,
        ctypes.c_int,
    ]
    library.edgespec_gguf_dequantize.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    return library


def _ggml_type(kind: str, layout: str) -> int:
    import gguf

    return int(gguf.GGMLQuantizationType[kind]) + (ROWS8_OFFSET if layout == "rows8" else 0)


def _stored(blocks: np.ndarray, kind: str, layout: str) -> np.ndarray:
    return np.ascontiguousarray(to_rows8(blocks, kind) if layout == "rows8" else blocks)


def matmul_on(
    path: str, x: np.ndarray, w: np.ndarray, ggml_type: int, outputs: int, activation: int
) -> np.ndarray | None:
    """y = x @ W.T (SwiGLU of it with ``activation`` 1) on ``path``; None where it is absent."""
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty((len(x), outputs // 2 if activation else outputs), np.float32)
    done = _kernels().edgespec_gguf_matmul_on(
        path.encode(),
        x.ctypes.data,
        w.ctypes.data,
        y.ctypes.data,
        len(x),
        INPUTS,
        outputs,
        ggml_type,
        activation,
    )
    if done == NOT_HERE:
        return None
    assert done == 0, (path, ggml_type, outputs, activation)
    return y


def _skip_absent(path: str) -> None:
    where = " (test_neon_kernels.py runs it under qemu)" if path.startswith("neon") else ""
    pytest.skip(f"this CPU or build has no {path} path{where}")


@built
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", TYPES)
def test_a_path_computes_the_portable_references_products(
    kind: str, layout: str, path: str
) -> None:
    """Each row count's outputs within TOLERANCE of the portable reference's, and every row the
    same bits alone, in 3, 8, 9 or 37 rows (a prefix of the widest pass)."""
    rng = np.random.default_rng(TYPES.index(kind))
    for outputs, activation in CASES[layout]:
        w = _stored(random_blocks(rng, kind, outputs, INPUTS), kind, layout)
        ggml_type = _ggml_type(kind, layout)
        x = rng.standard_normal((max(ROW_COUNTS), INPUTS)).astype(np.float32)
        whole = matmul_on(path, x, w, ggml_type, outputs, activation)
        if whole is None:
            _skip_absent(path)
        reference = matmul_on("portable", x, w, ggml_type, outputs, activation)
        assert reference is not None
        scale = np.abs(reference).max()
        for rows in ROW_COUNTS:
            got = matmul_on(path, x[:rows], w, ggml_type, outputs, activation)
            assert got is not None
            assert np.array_equal(got, whole[:rows]), (rows, activation, "batch invariance")
            error = np.abs(got - reference[:rows]).max()
            assert error <= TOLERANCE * scale, (rows, activation, error / scale)


@built
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", TYPES)
def test_the_x86_paths_give_one_anothers_bits(kind: str, layout: str) -> None:
    """avx2, avx-vnni and avx512-vnni (whose several-row passes run on 512-bit registers) add
    the same integers with other instructions: the same bits at every row count, also with
    every code at its largest against inputs of one sign (the widest sums a lane holds)."""
    rng = np.random.default_rng(100 + TYPES.index(kind))
    outputs = CASES[layout][0][0]
    blocks = random_blocks(rng, kind, outputs, INPUTS)
    x = rng.standard_normal((max(ROW_COUNTS), INPUTS)).astype(np.float32)
    runs = {}
    for path in X86_PATHS:
        ys = []
        for w, inputs in ((blocks, x), (saturated(blocks, kind), one_signed(9, INPUTS))):
            w = _stored(w, kind, layout)
            for rows in (*ROW_COUNTS, 2, 4, 5, 7, 20):
                if rows <= len(inputs):
                    ys.append(
                        matmul_on(path, inputs[:rows], w, _ggml_type(kind, layout), outputs, 0)
                    )
        if ys[0] is not None:
            runs[path] = ys
    if len(runs) < 2:
        pytest.skip(f"this CPU has {len(runs)} of the x86 paths {X86_PATHS}: nothing to compare")
    first = next(iter(runs.values()))
    for path, ys in runs.items():
        assert all(np.array_equal(a, b) for a, b in zip(ys, first, strict=True)), path


@built
@pytest.mark.parametrize("kind", TYPES)
def test_the_rows8_writer_and_the_c_reader_round_trip(kind: str) -> None:
    """The exporter's rows-of-8 writer moves bits and the C reader (csrc/gguf_rows8.c) puts
    them back: every row read from the rows-of-8 bytes is the same floats as from the file's
    bytes, and those follow the gguf package's dequantization. The layout moves the file's bits
    (Q8_0's whole bytes, the other types' nibbles, fifth bits, bit pairs and 6-bit factors)."""
    import gguf

    rng = np.random.default_rng(200 + TYPES.index(kind))
    blocks = random_blocks(rng, kind, 48, INPUTS)
    moved = to_rows8(blocks, kind)
    assert moved.shape == blocks.shape and not np.array_equal(moved, blocks)
    assert np.unpackbits(moved).sum() == np.unpackbits(blocks).sum()
    if kind == "Q8_0":
        assert np.array_equal(np.sort(moved, axis=None), np.sort(blocks, axis=None))
    read = {}
    for layout in LAYOUTS:
        out = np.empty((48, INPUTS), np.float32)
        stored = _stored(blocks, kind, layout)
        code = _kernels().edgespec_gguf_dequantize(
            stored.ctypes.data, _ggml_type(kind, layout), INPUTS, 48, out.ctypes.data
        )
        assert code == 0
        read[layout] = out
    assert np.array_equal(read["rows8"], read["file"])
    expected = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind]).reshape(48, -1)
    np.testing.assert_allclose(read["file"], expected, rtol=1e-6, atol=1e-9)


def test_the_exporter_keeps_the_files_layout_where_outputs_do_not_form_groups_of_8() -> None:
    """The layout is the exporter's choice per weight: rows of 8 where the outputs are a
    multiple of 8, the file's bytes as they are otherwise (then every path runs the portable
    reference: test_a_path_computes_the_portable_references_products, layout "file")."""
    rng = np.random.default_rng(7)
    for rows, in_rows8 in ((48, True), (44, False)):
        data = random_blocks(rng, "Q4_K", rows, INPUTS)
        raw = RawBlocks(data=data, kind="Q4_K", rows=rows, columns=INPUTS)
        assert raw.rows8 is in_rows8
        assert np.array_equal(raw.stored(), to_rows8(data, "Q4_K") if in_rows8 else data)
    with pytest.raises(ValueError, match="rows-of-8"):
        to_rows8(random_blocks(rng, "Q4_0", 12, INPUTS), "Q4_0")
