"""A GGUF weight as the file's own blocks for edgespec's GGUF kernels: stored in rows of 8
where its outputs allow, stacked with weights sharing its input, or interleaved with its
partner as a gated MLP's gate and up."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.export.gguf.matmul_nbits import BlockShape
from edgespec.export.gguf.rows8 import rows8_fits, to_rows8
from edgespec.graph.kernels import GGUF_KERNEL_TYPES


@dataclass(frozen=True, kw_only=True)
class RawBlocks:
    """A weight as the file's own blocks for the GGUF kernels: ``data`` uint8 [N, row bytes],
    row n holding output n's K inputs."""

    data: np.ndarray
    kind: str
    rows: int
    columns: int

    @property
    def rows8(self) -> bool:
        """Stored in the kernels' rows-of-8 layout (the same bits, moved: 8 outputs' blocks
        interleaved so one register holds codes of all 8), where the outputs form groups of 8."""
        return rows8_fits(self.kind, self.rows)

    def stored(self) -> np.ndarray:
        """The bytes the bundle stores: the file's blocks, in rows of 8 where they fit."""
        return to_rows8(self.data, self.kind) if self.rows8 else self.data

    @property
    def shape(self) -> BlockShape:
        kernel = GGUF_KERNEL_TYPES[self.kind]
        return BlockShape(
            bits=kernel.bits,
            rows=self.rows,
            columns=self.columns,
            block=kernel.block,
            source_type=self.kind,
            grid_kept=True,
        )


def stack_raw(parts: list[RawBlocks]) -> RawBlocks:
    """Weights of one type sharing an input, stacked along the outputs (rows are independent)."""
    return RawBlocks(
        data=np.concatenate([p.data for p in parts]),
        kind=parts[0].kind,
        rows=sum(p.rows for p in parts),
        columns=parts[0].columns,
    )


#: GgufMatMul's ``activation`` attribute for SwiGLU: W's outputs are a gate and an up
#: projection in alternate groups of 8, Y = silu(gate) * up (half W's outputs).
SWIGLU = 1


def interleave_by_8(gate: RawBlocks, up: RawBlocks) -> RawBlocks:
    """Gate and up [F, row bytes] as one [2F, row bytes]: gate rows 8j .. 8j + 7, then up rows
    8j .. 8j + 7, for j = 0 .. F/8 - 1 (the layout GgufMatMul's SwiGLU reads: each task of 16
    outputs holds 8 gates and their ups)."""
    groups = gate.rows // 8
    data = np.stack(
        [gate.data.reshape(groups, 8, -1), up.data.reshape(groups, 8, -1)], axis=1
    ).reshape(2 * gate.rows, -1)
    return RawBlocks(data=data, kind=gate.kind, rows=2 * gate.rows, columns=gate.columns)
