"""Phi-3's fused projections in a GGUF file, seen as Llama's separate ones.

llama.cpp's converter keeps Phi-3's ``attn_qkv`` ([q; k; v] rows) and its ``ffn_up`` of twice
the MLP's width ([gate; up] rows: llama.cpp's SwiGLU multiplies the second half by SiLU of the
first). Every GGUF block type quantizes a row on its own, so the parts are row ranges of the
file's tensors: :class:`RowSlice` presents one as the reader's tensors look (no copy: a view
of the mapped file), under the names the graph builder reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgespec.errors import UnsupportedModelError


@dataclass(frozen=True)
class RowSlice:
    """Rows ``start`` .. ``stop`` - 1 of a GGUF tensor, with the reader's attributes:
    ``shape`` innermost first (columns, rows), ``data`` one row of blocks per row."""

    name: str
    parent: Any
    start: int
    stop: int

    @property
    def tensor_type(self) -> Any:
        return self.parent.tensor_type

    @property
    def shape(self) -> np.ndarray:
        return np.array([int(self.parent.shape[0]), self.stop - self.start], dtype=np.uint64)

    @property
    def data(self) -> np.ndarray:
        rows = int(self.parent.shape[1])
        return np.asarray(self.parent.data).reshape(rows, -1)[self.start : self.stop]

    @property
    def n_elements(self) -> int:
        return int(self.parent.shape[0]) * (self.stop - self.start)


def split_phi3(
    tensors: dict[str, Any], *, layers: int, q_rows: int, kv_rows: int, ffn: int, file: str
) -> dict[str, Any]:
    """``tensors`` with each layer's fused ``attn_qkv`` and double-width ``ffn_up`` replaced by
    row ranges named ``attn_q``/``attn_k``/``attn_v`` and ``ffn_gate``/``ffn_up``."""
    split = dict(tensors)
    for layer in range(layers):
        prefix = f"blk.{layer}."
        parts = {
            "attn_qkv": (("attn_q", q_rows), ("attn_k", kv_rows), ("attn_v", kv_rows)),
            "ffn_up": (("ffn_gate", ffn), ("ffn_up", ffn)),
        }
        for fused, pieces in parts.items():
            tensor = split.pop(prefix + fused + ".weight", None)
            if tensor is None:
                if fused == "attn_qkv" and prefix + "attn_q.weight" in split:
                    continue  # already separate, as llama.cpp also accepts
                raise UnsupportedModelError(
                    f"{file} has no tensor {prefix}{fused}.weight",
                    fix="re-convert the model with a current llama.cpp converter",
                )
            rows = int(tensor.shape[1])
            if rows != sum(count for _, count in pieces):
                raise UnsupportedModelError(
                    f"{file}'s {prefix}{fused}.weight has {rows} rows, not the "
                    f"{sum(count for _, count in pieces)} its heads and MLP width give",
                    fix="re-convert the model with a current llama.cpp converter",
                )
            start = 0
            for name, count in pieces:
                split[f"{prefix}{name}.weight"] = RowSlice(
                    f"{prefix}{name}.weight", tensor, start, start + count
                )
                start += count
    return split
