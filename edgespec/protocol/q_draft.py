"""The draft's probabilities at the drafted positions (q_draft) on the wire, for rejection
rounds: ``sparse`` (the nonzero entries as float64: exact, and small when the draft samples
from a top-k or top-p truncated distribution) or ``fp16`` rows (base64, little-endian; compact
but rounded)."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgespec.errors import ConfigError, ProtocolError
from edgespec.protocol.validation import checked_token_ids, required_field

#: Rows with at most this many nonzero probabilities travel sparse by default.
MAX_SPARSE = 1024
Q_FORMATS = ("sparse", "fp16")


def encode_q_draft(
    q_draft: np.ndarray, *, q_format: str | None = None, max_sparse: int = MAX_SPARSE
) -> dict[str, Any]:
    """``sparse`` when every row has at most ``max_sparse`` nonzeros (or when asked), else fp16."""
    rows = np.asarray(q_draft, dtype=np.float64)  # [k, vocab]
    if q_format is None:
        widest = int(np.count_nonzero(rows, axis=-1).max()) if rows.size else 0
        q_format = "sparse" if widest <= max_sparse else "fp16"
    if q_format == "sparse":
        ids = [np.flatnonzero(row) for row in rows]
        return {
            "format": "sparse",
            "ids": [[int(i) for i in row_ids] for row_ids in ids],
            "probs": [
                [float(p) for p in row[row_ids]] for row, row_ids in zip(rows, ids, strict=True)
            ],
        }
    if q_format == "fp16":
        packed = rows.astype("<f2").tobytes()
        return {
            "format": "fp16",
            "vocab_size": rows.shape[-1],
            "rows": base64.b64encode(packed).decode("ascii"),
        }
    raise ConfigError(f"unknown q_draft format {q_format!r}", fix=f"use one of {Q_FORMATS}")


def decode_q_draft(data: Any, *, k: int, vocab_size: int) -> np.ndarray:
    """[k, vocab_size] float64 rows, each nonnegative with a positive sum."""
    if not isinstance(data, Mapping):
        raise ProtocolError("'q_draft' must be an object")
    fmt = data.get("format")
    rows = np.zeros((k, vocab_size), dtype=np.float64)
    if fmt == "sparse":
        ids, probs = required_field(data, "ids", list), required_field(data, "probs", list)
        if len(ids) != k or len(probs) != k:
            raise ProtocolError(f"'q_draft' must have k = {k} rows of ids and of probs")
        for row, (row_ids, row_probs) in enumerate(zip(ids, probs, strict=True)):
            checked = checked_token_ids("q_draft.ids", row_ids, vocab_size)
            if not isinstance(row_probs, list) or len(row_probs) != len(checked):
                raise ProtocolError(f"q_draft row {row}: ids and probs differ in length")
            if any(isinstance(p, bool) or not isinstance(p, (int, float)) for p in row_probs):
                raise ProtocolError(f"q_draft row {row}: probs must be numbers")
            rows[row, list(checked)] = row_probs
    elif fmt == "fp16":
        packed = required_field(data, "rows", str)
        try:
            raw = base64.b64decode(packed, validate=True)
        except ValueError as error:
            raise ProtocolError("'q_draft.rows' is not valid base64") from error
        if len(raw) != 2 * k * vocab_size:
            raise ProtocolError(
                f"'q_draft.rows' holds {len(raw)} bytes, not 2 x {k} x {vocab_size}"
            )
        rows[:] = np.frombuffer(raw, dtype="<f2").reshape(k, vocab_size)
    else:
        raise ProtocolError(f"'q_draft.format' must be one of {Q_FORMATS}, not {fmt!r}")
    if not np.all(np.isfinite(rows)) or np.any(rows < 0.0):
        raise ProtocolError("q_draft probabilities must be finite and nonnegative")
    if k and not all(math.isfinite(s) and s > 0.0 for s in rows.sum(axis=-1)):
        raise ProtocolError("every q_draft row needs a positive sum")
    return rows
