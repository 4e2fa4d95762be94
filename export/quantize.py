"""fp32 ONNX graph → the requested storage format, with ONNX Runtime's own tools.

* int4 / int8: weight-only ``MatMulNBits`` (block-wise). Activations stay float;
  ``accuracy_level`` 4 lets the CPU kernel quantize them to int8 per row block. int4 also
  stores the embedding table as ``GatherBlockQuantized`` (ONNX Runtime quantizes Gather at 4
  bits only); a lookup reads one row per token, so it cannot break batch invariance. The
  recipe (:data:`RECIPES`) says how block scales are chosen: round to nearest with a
  symmetric grid (the default for int8), round to nearest with zero points, or HQQ
  (half-quadratic optimisation of scales and zero points; needs torch). ``--quant int4``
  tries each and keeps the one that agrees best with PyTorch.
* int8-dynamic: ``MatMulInteger`` after ``DynamicQuantizeLinear``. One activation scale covers
  every position of a pass, so a k+1 position verify pass can pick a different argmax than k+1
  single steps: the export measures this and refuses it unless told otherwise.
* fp16: every float tensor, KV cache and logits included, becomes float16.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.errors import ExportError
from edgespec.manifest import QuantizationSpec

#: A protobuf cannot exceed 2 GiB; larger graphs keep their weights in this side file.
EXTERNAL_DATA_FILE = "model.onnx_data"
_EXTERNAL_DATA_THRESHOLD_BYTES = 1_800_000_000
_NBITS = {"int4": 4, "int8": 8}
_NBITS_OP_TYPES = {"int4": ("MatMul", "Gather"), "int8": ("MatMul",)}


#: How block scales (and zero points) are chosen; int4 exports try them in this order.
RECIPES = ("rtn-symmetric", "rtn-asymmetric", "hqq")


@dataclass(frozen=True, kw_only=True)
class QuantRequest:
    quant: str
    block_size: int
    accuracy_level: int
    recipe: str = "rtn-symmetric"


def describe(request: QuantRequest) -> QuantizationSpec:
    """The manifest record for ``request`` (before anything runs)."""
    import onnxruntime

    tool = f"onnxruntime {onnxruntime.__version__}"
    if request.quant in ("int4", "int8"):
        return QuantizationSpec(
            scheme="matmul_nbits",
            weight_dtype=request.quant,
            bits=_NBITS[request.quant],
            block_size=request.block_size,
            accuracy_level=request.accuracy_level,
            symmetric=request.recipe == "rtn-symmetric",
            op_types=_NBITS_OP_TYPES[request.quant],
            tool=f"{tool} MatMulNBitsQuantizer ({request.recipe})",
        )
    if request.quant == "int8-dynamic":
        return QuantizationSpec(
            scheme="dynamic_int8",
            weight_dtype="int8",
            bits=8,
            op_types=("MatMul",),
            tool=f"{tool} quantize_dynamic",
        )
    if request.quant == "fp16":
        return QuantizationSpec(
            scheme="fp16", weight_dtype="float16", bits=16, tool=f"{tool} float16 converter"
        )
    return QuantizationSpec(scheme="none", weight_dtype="float32", bits=32)


def quantize_graph(source: Path, target: Path, request: QuantRequest) -> None:
    """Writes ``target`` (plus ``EXTERNAL_DATA_FILE`` beside it when large) from ``source``."""
    import onnx

    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)
    try:
        if request.quant in ("int4", "int8"):
            save_graph(_weight_only(onnx.load(str(source)), request), target)
        elif request.quant == "int8-dynamic":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(
                source,
                target,
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul"],
                use_external_data_format=source.stat().st_size > _EXTERNAL_DATA_THRESHOLD_BYTES,
            )
        elif request.quant == "fp16":
            from onnxruntime.transformers.float16 import convert_float_to_float16

            model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=False)
            save_graph(model, target)
        else:
            raise ExportError(
                f"quantize_graph was asked for {request.quant!r}, which needs no quantization",
                fix="this is a bug in edgespec; please report it",
            )
    except ExportError:
        raise
    except Exception as error:  # the quantizers raise assorted types on odd graphs
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise ExportError(
            f"ONNX Runtime could not quantize the graph to {request.quant} ({first_line})",
            fix="try another --quant or --block-size",
        ) from error


def _weight_only(model: object, request: QuantRequest) -> object:
    """MatMulNBits (and for int4 GatherBlockQuantized) weights by ``request.recipe``."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    bits, op_types = _NBITS[request.quant], _NBITS_OP_TYPES[request.quant]

    def run(graph: object, config: object) -> object:
        quantizer = MatMulNBitsQuantizer(graph, algo_config=config)
        # All-zero blocks (padding rows) divide 0/0 before np.where masks them: harmless.
        with np.errstate(divide="ignore", invalid="ignore"):
            quantizer.process()
        return quantizer.model.model

    def round_to_nearest(types: tuple[str, ...], symmetric: bool) -> object:
        return DefaultWeightOnlyQuantConfig(
            block_size=request.block_size,
            is_symmetric=symmetric,
            accuracy_level=request.accuracy_level,
            bits=bits,
            op_types_to_quantize=types,
        )

    if request.recipe != "hqq":
        return run(model, round_to_nearest(op_types, request.recipe == "rtn-symmetric"))
    hqq = HQQWeightOnlyQuantConfig(
        block_size=request.block_size, bits=bits, op_types_to_quantize=("MatMul",)
    )
    with warnings.catch_warnings():  # HQQ wraps read-only numpy weights in torch tensors
        warnings.simplefilter("ignore", UserWarning)
        quantized = run(model, hqq)
    for node in quantized.graph.node:  # type: ignore[attr-defined]
        if node.op_type == "MatMulNBits":  # HQQ leaves the compute type unset
            node.attribute.append(_int_attribute("accuracy_level", request.accuracy_level))
    rest = tuple(t for t in op_types if t != "MatMul")  # the embedding: round to nearest
    return run(quantized, round_to_nearest(rest, True)) if rest else quantized


def _int_attribute(name: str, value: int) -> object:
    from onnx import helper

    return helper.make_attribute(name, value)


def save_graph(model: object, target: Path) -> None:
    import onnx

    assert isinstance(model, onnx.ModelProto)
    large = model.ByteSize() > _EXTERNAL_DATA_THRESHOLD_BYTES
    onnx.save_model(
        model,
        str(target),
        save_as_external_data=large,
        all_tensors_to_one_file=True,
        location=EXTERNAL_DATA_FILE,
    )
