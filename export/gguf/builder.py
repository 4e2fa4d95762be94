"""Building blocks of the GGUF graph: nodes and initializers, llama.cpp's block-quantized
weights as edgespec's GGUF kernels (the file's blocks: :mod:`raw_blocks`) or as
MatMulNBits (with Q4_1's offset term), and the fusion of residual adds into the next RMSNorm."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from edgespec.export.gguf.matmul_nbits import (
    BlockShape,
    BlockWeights,
    Factors,
    concatenate,
)
from edgespec.export.gguf.raw_blocks import (
    SWIGLU,
    RawBlocks,
    interleave_by_8,
    stack_raw,
)
from edgespec.export.gguf.reader import float_tensor, tensor_rows
from edgespec.export.gguf.rows8 import ROWS8_OFFSET
from edgespec.export.gguf.weights import block_weights
from edgespec.graph.kernels import (
    GGUF_DOMAIN,
    GGUF_GATHER,
    GGUF_KERNEL_TYPES,
    GGUF_MATMUL,
)

#: Initializers at least this large go to the data file (onnx.save's default threshold).
EXTERNAL_THRESHOLD = 1024


@dataclass
class ExternalData:
    """The graph's data file, written as initializers are made: the graph being built holds
    each weight's location and length, never the weight, so an import's memory does not grow
    with the model."""

    stream: BinaryIO
    location: str

    def tensor(self, name: str, value: np.ndarray) -> Any:
        from onnx import TensorProto, helper

        tensor = TensorProto(
            name=name,
            data_type=helper.np_dtype_to_tensor_dtype(value.dtype),
            dims=value.shape,
            data_location=TensorProto.EXTERNAL,
        )
        offset = self.stream.tell()
        self.stream.write(value.reshape(-1).view(np.uint8).data)
        entries = {"location": self.location, "offset": offset, "length": value.nbytes}
        for key, entry in entries.items():
            tensor.external_data.add(key=key, value=str(entry))
        return tensor


@dataclass(frozen=True, kw_only=True)
class BlockNames:
    """The initializer names of one block-quantized weight."""

    packed: str
    scales: str
    offsets_t: str | None


@dataclass
class GraphBuilder:
    """Collects nodes and initializers; ``accuracy_level`` is MatMulNBits' compute type;
    ``dequantize`` turns every block-quantized weight into a float32 one (a float graph of
    the file's weights, as llama.cpp dequantizes them); ``kernel_types``: the GGUF block types
    that run on edgespec's GGUF kernels, stored as the file's blocks; ``data``, when set,
    receives the large initializers as they are made."""

    accuracy_level: int
    dequantize: bool = False
    kernel_types: frozenset[str] = frozenset()
    data: ExternalData | None = None
    nodes: list[Any] = field(default_factory=list)
    initializers: list[Any] = field(default_factory=list)
    quantized: list[BlockShape] = field(default_factory=list)
    float_weights: int = 0
    kernel_ops: set[str] = field(default_factory=set)
    matmul_nbits_bits: set[int] = field(default_factory=set)

    def raw_blocks(self, tensor: Any) -> RawBlocks | None:
        """The tensor as the file's blocks for the GGUF kernels, or None where they do not
        run it (another type, a width not a multiple of its block)."""
        if not self.kernel_types or self.dequantize:
            return None
        kind = tensor.tensor_type.name
        rows, columns = tensor_rows(tensor)
        if kind not in self.kernel_types or columns % GGUF_KERNEL_TYPES[kind].block:
            return None
        data = np.asarray(tensor.data).reshape(rows, -1)
        return RawBlocks(data=data, kind=kind, rows=rows, columns=columns)

    def raw_initializer(self, name: str, raw: RawBlocks) -> str:
        self.quantized.append(raw.shape)
        return self.constant(f"{name}.gguf_blocks", raw.stored())

    def gguf_matmul(
        self, x: str, blocks: str, raw: RawBlocks, output: str, addend: str | None = None
    ) -> str:
        """x [.., K] @ W.T (+ ``addend``: a bias [N] or a residual [.., N]) → [.., N] on the
        file's blocks (edgespec's GGUF kernels)."""
        inputs = [x, blocks, *([addend] if addend else [])]
        return self._kernel_node(GGUF_MATMUL, inputs, raw, output)

    def swiglu(self, x: str, gate: Any, up: Any, name: str) -> str | None:
        """silu(x @ gate.T) * (x @ up.T) → [.., F] as one GgufMatMul whose kernel applies the
        activation to its own outputs (no Split, Sigmoid and Muls after it), where both
        weights run on the kernels in one type and F is a multiple of 8; None otherwise."""
        raws = [self.raw_blocks(gate), self.raw_blocks(up)]
        first, second = raws
        if (
            first is None
            or second is None
            or first.kind != second.kind
            or first.rows != second.rows
            or first.rows % 8
        ):
            return None
        both = interleave_by_8(first, second)
        del raws, first, second
        blocks = self.raw_initializer(name, both)
        return self._kernel_node(GGUF_MATMUL, [x, blocks], both, name, activation=SWIGLU)

    def gguf_gather(self, ids: str, blocks: str, raw: RawBlocks, output: str) -> str:
        """Rows ``ids`` of W, dequantized: [.., K] float32."""
        return self._kernel_node(GGUF_GATHER, [ids, blocks], raw, output)

    def _kernel_node(
        self, op: str, inputs: list[str], raw: RawBlocks, output: str, **attributes: Any
    ) -> str:
        self.kernel_ops.add(op)
        return self.node(
            op,
            inputs,
            output,
            domain=GGUF_DOMAIN,
            ggml_type=GGUF_KERNEL_TYPES[raw.kind].ggml_id + (ROWS8_OFFSET if raw.rows8 else 0),
            in_features=raw.columns,
            out_features=raw.rows,
            **attributes,
        )

    def blocks(self, tensor: Any) -> BlockWeights | None:
        """The tensor's MatMulNBits form, or None for a float weight."""
        return None if self.dequantize else block_weights(tensor)

    def float_matrix(self, tensor: Any) -> np.ndarray:
        """The weight as float32 [N, K]."""
        return float_tensor(tensor)

    def node(self, op: str, inputs: list[str], output: str, **attributes: Any) -> str:
        from onnx import helper

        domain = attributes.pop("domain", "")
        self.nodes.append(
            helper.make_node(op, inputs, [output], name=output, domain=domain, **attributes)
        )
        return output

    def constant(self, name: str, value: np.ndarray | np.generic) -> str:
        from onnx import numpy_helper

        value = np.ascontiguousarray(value)
        if self.data is not None and value.nbytes >= EXTERNAL_THRESHOLD:
            self.initializers.append(self.data.tensor(name, value))
        else:
            self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def block_initializers(self, name: str, weights: BlockWeights) -> BlockNames:
        self.quantized.append(weights.shape)
        scales = (
            self.factored(f"{name}.scales", weights.scale_factors)
            if weights.scale_factors is not None
            else self.half_stored(f"{name}.scales", weights.scales)
        )
        return BlockNames(
            packed=self.constant(f"{name}.qweight", weights.packed),
            scales=scales,
            # [K / 32, N]: the offsets term is blocksum(x) [.., K / 32] @ this.
            offsets_t=self.offsets_t(name, weights, scales),
        )

    def factored(self, name: str, factors: Factors) -> str:
        """A K-quant's per-block values [N, K / block] as the file stores them: a float16 per
        super-block times an integer per block, multiplied in float32 when the session
        loads (folded into one initializer, as :meth:`half_stored`'s Cast is)."""
        per_super = self.node(
            "Cast", [self.constant(f"{name}.super", factors.per_super)], f"{name}.super_f", to=1
        )
        per_block = self.node(
            "Cast", [self.constant(f"{name}.block", factors.per_block)], f"{name}.block_f", to=1
        )
        product = self.node("Mul", [per_super, per_block], f"{name}.product")
        rows = factors.per_block.shape[0]
        shape = self.constant(f"{name}.shape", np.array([rows, -1]))
        return self.node("Reshape", [product, shape], name)

    def half_stored(self, name: str, values: np.ndarray) -> str:
        """A float32 constant stored as float16 when that is exact (llama.cpp's scales and
        minimums are float16 fields), cast back when the session loads it: ONNX Runtime folds
        the Cast into a float32 initializer before MatMulNBits packs its weights, so only the
        file shrinks."""
        half = values.astype(np.float16)
        if not np.array_equal(half.astype(np.float32), values):
            return self.constant(name, values)
        return self.node("Cast", [self.constant(f"{name}.f16", half)], name, to=1)

    def offsets_t(self, name: str, weights: BlockWeights, scales: str) -> str | None:
        """The offsets [K / 32, N]; from the file's float16 minimums when it has them:
        minimums + shift * scales, the same float32 operations as the importer's."""
        if weights.offsets is None:
            return None
        if weights.minimum_factors is not None:
            minimums = self.factored(f"{name}.minimums", weights.minimum_factors)
            minimums = self.node("Transpose", [minimums], f"{name}.minimums_t", perm=[1, 0])
        elif weights.minimums is None or not np.array_equal(
            weights.minimums.astype(np.float16).astype(np.float32), weights.minimums
        ):
            return self.constant(f"{name}.offsets_t", weights.offsets.T)
        else:
            minimums = self.half_stored(
                f"{name}.minimums_t", np.ascontiguousarray(weights.minimums.T)
            )
        shift = self.constant(f"{name}.shift", np.float32(weights.minimum_shift))
        scales_t = self.node("Transpose", [scales], f"{name}.scales_t", perm=[1, 0])
        shifted = self.node("Mul", [scales_t, shift], f"{name}.shifted")
        return self.node("Add", [minimums, shifted], f"{name}.offsets_t")

    def linear(
        self, x: str, tensor: Any, name: str, *, addend: str | None = None, output: str = ""
    ) -> str:
        """x [.., K] @ weight.T → [.., N]: the GGUF kernels or MatMulNBits on the file's
        blocks, else MatMul. With ``addend`` (a bias or a residual), ``output`` is the sum:
        one GGUF kernel adds it itself, other products are followed by an Add."""
        raw = self.raw_blocks(tensor)
        if raw is not None:
            blocks = self.raw_initializer(name, raw)
            return self.gguf_matmul(x, blocks, raw, output or name, addend)
        return self._plus(self._linear_product(x, tensor, name), addend, output)

    def _plus(self, product: str, addend: str | None, output: str) -> str:
        return product if addend is None else self.node("Add", [addend, product], output)

    def _linear_product(self, x: str, tensor: Any, name: str) -> str:
        weights = self.blocks(tensor)
        if weights is None:
            matrix = self.float_matrix(tensor)  # [N, K]
            self.float_weights += matrix.size
            return self.node("MatMul", [x, self.constant(f"{name}.weight_t", matrix.T)], name)
        return self.matmul_nbits(x, self.block_initializers(name, weights), weights.shape, name)

    def linear_stacked(
        self, x: str, tensors: list[Any], name: str, *, addend: str | None = None, output: str = ""
    ) -> str:
        """x @ [W1 | W2 | ...].T → [.., N1 + N2 + ...]: one MatMulNBits over the stacked blocks
        when the weights allow it (fewer kernel calls per layer), one float MatMul when all are
        float, else one linear each. On the GGUF kernels, runs of one block type are stacked.
        ``addend`` and ``output`` as in :meth:`linear`."""
        raws = [self.raw_blocks(tensor) for tensor in tensors]
        if any(raw is not None for raw in raws):
            return self._stacked_runs(x, tensors, raws, name, addend, output)
        return self._plus(self._stacked_product(x, tensors, name), addend, output)

    def _stacked_product(self, x: str, tensors: list[Any], name: str) -> str:
        parts = [self.blocks(tensor) for tensor in tensors]
        if all(p is None for p in parts):
            matrix = np.concatenate([self.float_matrix(t) for t in tensors])  # [N1 + N2 + ..., K]
            self.float_weights += matrix.size
            return self.node("MatMul", [x, self.constant(f"{name}.weight_t", matrix.T)], name)
        present = [p for p in parts if p is not None]
        stacked = concatenate(present) if len(present) == len(parts) else None
        del parts, present  # the stacked copy is what gets stored; free the parts first
        if stacked is None:
            outputs = [self.linear(x, t, f"{name}.{i}") for i, t in enumerate(tensors)]
            return self.node("Concat", outputs, name, axis=-1)
        names = self.block_initializers(name, stacked)
        return self.matmul_nbits(x, names, stacked.shape, name)

    def _stacked_runs(
        self,
        x: str,
        tensors: list[Any],
        raws: list[RawBlocks | None],
        name: str,
        addend: str | None,
        output: str,
    ) -> str:
        """Consecutive weights of one kernel type become one GgufMatMul; the rest their own
        linear; the outputs concatenated in order."""
        outputs: list[str] = []
        start = 0
        while start < len(tensors):
            first = raws[start]
            stop = start + 1
            while (
                first is not None
                and stop < len(tensors)
                and (following := raws[stop]) is not None
                and following.kind == first.kind
            ):
                stop += 1
            whole = start == 0 and stop == len(tensors)
            part_name = name if whole else f"{name}.{start}"
            if first is None:
                outputs.append(self.linear(x, tensors[start], part_name))
            else:
                run = stack_raw([r for r in raws[start:stop] if r is not None])
                blocks = self.raw_initializer(part_name, run)
                if whole:  # one kernel: it adds the addend itself
                    return self.gguf_matmul(x, blocks, run, output or name, addend)
                outputs.append(self.gguf_matmul(x, blocks, run, part_name))
            start = stop
        product = outputs[0] if len(outputs) == 1 else self.node("Concat", outputs, name, axis=-1)
        return self._plus(product, addend, output)

    def matmul_nbits(self, x: str, names: BlockNames, weights: BlockShape, output: str) -> str:
        self.matmul_nbits_bits.add(weights.bits)
        product = self.node(
            "MatMulNBits",
            [x, names.packed, names.scales],
            output if names.offsets_t is None else f"{output}.blocks",
            domain="com.microsoft",
            K=weights.columns,
            N=weights.rows,
            bits=weights.bits,
            block_size=weights.block,
            accuracy_level=self.accuracy_level,
        )
        if names.offsets_t is None:
            return product
        # Q4_1's per-block minimum: sum x over each block, then one small float MatMul.
        size = weights.block
        shape = self.constant(
            f"{output}.block_shape", np.array([1, -1, weights.columns // size, size])
        )
        blocks = self.node("Reshape", [x, shape], f"{output}.x_blocks")
        sums = self.node(
            "ReduceSum",
            [blocks, self.constant(f"{output}.axis", np.array([-1]))],
            f"{output}.sums",
            keepdims=0,
        )
        offsets = self.node("MatMul", [sums, names.offsets_t], f"{output}.offsets")
        return self.node("Add", [product, offsets], output)

    def rms_norm(self, x: str, tensor: Any, name: str, epsilon: float) -> str:
        scale = self.constant(f"{name}.weight", float_tensor(tensor))
        return self.node("SimplifiedLayerNormalization", [x, scale], name, axis=-1, epsilon=epsilon)
