"""Inputs that push the GGUF kernels' integer sums to their largest (tests/kernels)."""

from __future__ import annotations

import numpy as np


def saturated(blocks: np.ndarray, kind: str) -> np.ndarray:
    """``blocks`` with every code byte (and the K-quants' sub-block scales) 0xFF, their
    float16 factors kept: each product's integer terms at their largest (IQ4_NL's and
    IQ4_XS's bytes 0: the table's -127 and IQ4_XS's scale -32)."""
    import gguf

    _, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    out = blocks.copy().reshape(-1, size)
    if kind.startswith("IQ4"):  # d, then IQ4_XS's scales and the indices
        out[:, 2:] = 0
    elif kind in ("Q6_K", "Q3_K"):  # codes, scales, then d
        out[:, : size - 2] = 0xFF
    elif kind == "Q2_K":  # scales, codes, then d and dmin
        out[:, : size - 4] = 0xFF
    else:  # d (and dmin or m) first
        out[:, 2 * (2 if kind in ("Q4_K", "Q5_K", "Q4_1", "Q5_1") else 1) :] = 0xFF
    return out.reshape(blocks.shape)


def one_signed(rows: int, inputs: int) -> np.ndarray:
    """Inputs [rows, inputs] that quantize to 127 (even rows) or -127 (odd rows) everywhere."""
    signs = np.where(np.arange(rows) % 2 == 0, 1.0, -1.0).astype(np.float32)
    return np.repeat(signs[:, None], inputs, axis=1)
