"""edgespec's NEON kernels (``csrc/gguf_neon.c``), checked where no ARM CPU is: the kernel
sources with ``tests/c/kernel_check.c`` cross-compiled for AArch64 and run under
qemu-aarch64, on a CPU with the dot-product instructions (qemu's ``max``) and on one without
(Cortex-A72). Every rows-of-8 product equals the AVX2 path's bit for bit (the same driver
built for this machine) and follows the dequantized weights; the NEON activation quantizer
gives the scalar loop's bits. Skips, saying why, where the cross compiler or qemu is missing
(``.ci/run`` installs both)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgespec.export.gguf.rows8 import ROWS8_OFFSET, to_rows8

from support.gguf_blocks import random_blocks

ROOT = Path(__file__).resolve().parents[2]
# Every C file in csrc/ is a source of the library (setup.py's KERNEL_SOURCES).
SOURCES = sorted((ROOT / "csrc").glob("*.c"))
DRIVER = ROOT / "tests" / "c" / "kernel_check.c"
TYPES = [
    *("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"),
    *("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"),
    *("IQ4_NL", "IQ4_XS"),
]
# 37 rows cross the kernels' 32-row passes; 40 outputs are 5 groups of 8.
ROWS, OUTPUTS, INPUTS = 37, 40, 512
CPUS = {"max": "neon-dotprod", "cortex-a72": "neon"}


def _compile(compiler: str, out: Path, *flags: str) -> Path:
    command = [compiler, "-O2", "-std=gnu11", f"-I{ROOT / 'csrc'}", *flags]
    subprocess.run([*command, *map(str, SOURCES), str(DRIVER), "-lm", "-o", str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The driver for AArch64 (static, for qemu) and for this machine."""
    missing = [
        tool for tool in ("aarch64-linux-gnu-gcc", "qemu-aarch64", "cc") if not shutil.which(tool)
    ]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not found: install gcc-aarch64-linux-gnu and qemu-user "
            "to check the NEON kernels here"
        )
    where = tmp_path_factory.mktemp("neon")
    return {
        # -ffp-contract=off: as setup.py builds the library on AArch64
        "arm": _compile(
            "aarch64-linux-gnu-gcc", where / "kernel_check_arm", "-static", "-ffp-contract=off"
        ),
        "host": _compile("cc", where / "kernel_check_host"),
    }


def _run(
    drivers: dict[str, Path],
    where: Path,
    cpu: str | None,
    mode: str,
    payload: bytes,
    path: str = "",
) -> tuple[bytes, str]:
    """The driver's output file and the kernel path it ran: under qemu on ``cpu``, or on this
    machine when ``cpu`` is None; ``path`` sets EDGESPEC_GGUF_KERNEL_PATH."""
    source, out = where / f"{mode}.in", where / f"{mode}-{cpu}-{path}.out"
    source.write_bytes(payload)
    if cpu is None:
        command = [str(drivers["host"])]
    else:
        command = ["qemu-aarch64", "-cpu", cpu, str(drivers["arm"])]
    env = {**os.environ, "EDGESPEC_GGUF_KERNEL_PATH": path}
    done = subprocess.run(
        [*command, mode, str(source), str(out)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return out.read_bytes(), done.stdout.strip()


def _product_input(
    kind: str, seed: int, rows8: bool, swiglu: bool = False, outputs: int = OUTPUTS
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The driver's matmul input, x [ROWS, INPUTS] and W's blocks [outputs, row bytes] in the
    file's layout."""
    import gguf

    rng = np.random.default_rng(seed)
    blocks = random_blocks(rng, kind, outputs, INPUTS)
    x = rng.standard_normal((ROWS, INPUTS)).astype(np.float32)
    ggml_type = int(gguf.GGMLQuantizationType[kind])
    stored = to_rows8(blocks, kind) if rows8 else blocks
    header = np.array(
        [ggml_type + (ROWS8_OFFSET if rows8 else 0), ROWS, INPUTS, outputs, int(swiglu)],
        np.int64,
    )
    return header.tobytes() + x.tobytes() + stored.tobytes(), x, blocks


def _bits_or_skip(drivers: dict[str, Path], where: Path, mode: str, payload: bytes) -> bytes:
    """The output of this machine's x86-64 path (AVX2, or its VNNI form: the same bits), or a
    skip where it runs another path."""
    host, host_path = _run(drivers, where, None, mode, payload)
    if host_path not in ("avx-vnni", "avx512-vnni", "avx2"):
        pytest.skip(f"this machine runs the {host_path} path: no AVX2 bits to compare")
    return host


def _expected(kind: str, x: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    import gguf

    weight = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind])
    return x.astype(np.float64) @ weight.reshape(len(blocks), INPUTS).T.astype(np.float64)


@pytest.mark.parametrize("cpu", sorted(CPUS))
@pytest.mark.parametrize("kind", TYPES)
def test_neon_products_are_the_avx2_paths_bits(
    drivers: dict[str, Path], tmp_path: Path, kind: str, cpu: str
) -> None:
    """A product in rows of 8 on NEON, with and without the dot-product instructions: the
    AVX2 path's bits (where this machine runs AVX2) and x @ W.T from the dequantized blocks
    within the 8-bit activations' rounding."""
    payload, x, blocks = _product_input(kind, seed=TYPES.index(kind), rows8=True)
    arm, path = _run(drivers, tmp_path, cpu, "matmul", payload)
    assert path == CPUS[cpu]
    got = np.frombuffer(arm, np.float32).reshape(ROWS, OUTPUTS)
    expected = _expected(kind, x, blocks)
    assert np.abs(got - expected).max() <= 0.02 * np.abs(expected).max()
    assert arm == _bits_or_skip(drivers, tmp_path, "matmul", payload)


def test_neon_swiglu_products_are_the_avx2_paths_bits(
    drivers: dict[str, Path], tmp_path: Path
) -> None:
    """A gated MLP's product with SwiGLU in its epilogue (gates and ups in alternate groups of
    8): silu(gate) * up from the dequantized weights, and the AVX2 path's bits on both CPUs."""
    outputs = 48  # SwiGLU's tasks are 16 outputs: 8 gates, their 8 ups
    payload, x, blocks = _product_input("Q4_K", 12, rows8=True, swiglu=True, outputs=outputs)
    both = _expected("Q4_K", x, blocks).reshape(ROWS, outputs // 16, 2, 8)
    gate, up = both[:, :, 0].reshape(ROWS, -1), both[:, :, 1].reshape(ROWS, -1)
    expected = gate / (1 + np.exp(-gate)) * up
    arms = [_run(drivers, tmp_path, cpu, "matmul", payload)[0] for cpu in CPUS]
    for arm in arms:
        got = np.frombuffer(arm, np.float32).reshape(ROWS, outputs // 2)
        assert np.abs(got - expected).max() <= 0.02 * np.abs(expected).max()
    host = _bits_or_skip(drivers, tmp_path, "matmul", payload)
    assert all(arm == host for arm in arms)


@pytest.mark.parametrize(
    "shape",
    [  # rows, past, heads, kv_heads, d, window: the 1.5B's, the 0.5B's, SmolLM2's, Gemma's
        (1, 1500, 12, 2, 128, 0),
        (5, 700, 14, 2, 64, 0),
        (3, 300, 9, 3, 64, 0),
        (4, 900, 4, 1, 256, 512),
    ],
)
def test_neon_attention_is_the_avx2_paths_bits(
    drivers: dict[str, Path], tmp_path: Path, shape: tuple[int, ...]
) -> None:
    """CacheAttention on NEON over several blocks of 128 positions (a sliding window in the
    last shape): softmax(q k / sqrt(d)) v in float64 within float32's rounding, and the AVX2
    path's bits (the same FMA chains and sums in the same order; the blocks' merge calls the
    C library's expf, which gives the same bits on both here)."""
    rows, past, heads, kv_heads, d, window = shape
    capacity = past + rows + 7
    rng = np.random.default_rng(past)
    query = rng.standard_normal((rows, heads * d)).astype(np.float32)
    keys, values = rng.standard_normal((2, kv_heads, capacity, d)).astype(np.float32)
    header = np.array([rows, past, heads, kv_heads, d, capacity, window], np.int64)
    payload = header.tobytes() + query.tobytes() + keys.tobytes() + values.tobytes()
    expected = np.zeros((rows, heads, d))
    for r in range(rows):
        seen = slice(max(0, past + r - window + 1) if window else 0, past + r + 1)
        for head in range(heads):
            k, v = (
                keys[head // (heads // kv_heads), seen],
                values[head // (heads // kv_heads), seen],
            )
            scores = k.astype(np.float64) @ query[r, head * d : (head + 1) * d] / np.sqrt(d)
            weights = np.exp(scores - scores.max())
            expected[r, head] = weights / weights.sum() @ v
    arms = []
    for cpu in CPUS:
        arm, path = _run(drivers, tmp_path, cpu, "attention", payload)
        assert path == CPUS[cpu]
        got = np.frombuffer(arm, np.float32).reshape(rows, heads, d)
        assert np.abs(got - expected).max() <= 1e-5
        arms.append(arm)
    host = _bits_or_skip(drivers, tmp_path, "attention", payload)
    assert all(arm == host for arm in arms)


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_0"])
def test_file_layout_products_and_the_forced_portable_path_on_arm(
    drivers: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    """Weights in the file's layout run the portable loops under the NEON path, and
    EDGESPEC_GGUF_KERNEL_PATH=portable runs them for every product: both follow the
    dequantized weights."""
    for rows8, path, reported in ((False, "", "neon-dotprod"), (True, "portable", "portable")):
        payload, x, blocks = _product_input(kind, seed=11, rows8=rows8)
        out, ran = _run(drivers, tmp_path, "max", "matmul", payload, path)
        assert ran == reported
        got = np.frombuffer(out, np.float32).reshape(ROWS, OUTPUTS)
        expected = _expected(kind, x, blocks)
        assert np.abs(got - expected).max() <= 0.02 * np.abs(expected).max()


@pytest.mark.parametrize("kind", ["Q4_K", "Q4_0"])
def test_the_neon_activation_quantizer_gives_the_scalar_ones_bits(
    drivers: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    """Blocks of zeros, values on halves (ties round to even) and tiny magnitudes: the NEON
    quantizer's int8 values, scales and sums are the scalar loop's, on both CPUs."""
    import gguf

    rng = np.random.default_rng(7)
    rows, k = 5, 1024
    block = 256 if kind == "Q4_K" else 32
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[0, :256] = 0.0
    x[1] = np.round(x[1] * 8) / 2
    x[2, :block] *= 1e-30
    header = np.array([int(gguf.GGMLQuantizationType[kind]), rows, k], np.int64)
    for cpu in CPUS:
        out, path = _run(drivers, tmp_path, cpu, "quantize", header.tobytes() + x.tobytes())
        assert path == CPUS[cpu]
        vectorized, scalar = out[: len(out) // 2], out[len(out) // 2 :]
        assert vectorized == scalar
        q = np.frombuffer(vectorized[: rows * k], np.int8).reshape(rows, k)
        assert (q[0, :256] == 0).all() and np.abs(q).max() == 127
