"""What the manifest records of an in-place graph bundle, and the names of the graph's files.

``graph_spec`` and ``model_spec`` serve both importers (a GGUF file here, a Hugging Face
checkpoint through :mod:`edgespec.export.hf_graph`); ``write_gguf_manifest`` writes the whole
manifest of a GGUF import: the source file, the tokenizer, the quantization the file's tensor
types gave, the checks' record and the memory estimate."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.config import ExportConfig
from edgespec.export.bundle import file_records, tokenizer_sha256, write_bundle_manifest
from edgespec.export.gguf.attention import KVLayout, attention_boundaries
from edgespec.export.gguf.graph import IO, past_names, present_names
from edgespec.export.gguf.reader import GGUFArchitecture, GGUFFile
from edgespec.export.half_attention import add_half_attention
from edgespec.manifest import (
    GraphSpec,
    MemoryEstimate,
    ModelSpec,
    QuantizationSpec,
    SourceSpec,
    TensorSpec,
    TokenizerSpec,
)
from edgespec.verification import VerificationRecord

GRAPH_FILE, DATA_FILE = "model.onnx", "model.onnx.data"


def write_gguf_manifest(
    source: GGUFFile,
    staging: Path,
    config: ExportConfig,
    tokenizer: Any,
    tokenizer_files: list[str],
    builder: Any,
    verification: VerificationRecord,
    *,
    capacity: int,
    layout: KVLayout,
    accuracy: int,
    min_width: int,
    extra: dict[str, Any],
    resident_bytes: int = 0,
) -> None:
    """The manifest of a GGUF import, written into ``staging`` beside its files
    (``resident_bytes``: a session's measured resident size, 0 when not measured)."""
    arch = source.architecture
    kinds = Counter(t.tensor_type.name for t in source.tensors.values())
    requantized = sorted({w.source_type for w in builder.quantized if not w.grid_kept})
    roles = {
        GRAPH_FILE: "graph",
        DATA_FILE: "graph_data",
        **{f: "tokenizer" for f in tokenizer_files},
    }
    graph = add_half_attention(staging, graph_spec(source, layout, min_width), roles)
    weight_bytes = (staging / DATA_FILE).stat().st_size
    write_bundle_manifest(
        staging,
        config,
        source=SourceSpec(
            model=source.path.name, kind="gguf", revision=None, config_sha256=_sha256(source.path)
        ),
        model=_model_spec(source, capacity),
        graph=graph,
        tokenizer=_tokenizer_spec(tokenizer, tokenizer_files, staging, arch.vocab_size),
        quantization=_quantization_spec(kinds, builder, accuracy),
        verification=verification,
        memory=MemoryEstimate(
            weight_bytes=weight_bytes,
            kv_bytes_per_token=2
            * arch.num_layers
            * arch.num_kv_heads
            * arch.head_dim
            * np.dtype(layout.kv_dtype).itemsize,
            logits_bytes_per_position=arch.vocab_size * 4,
            file_bytes=weight_bytes + (staging / GRAPH_FILE).stat().st_size,
            gathered_bytes=gathered_bytes(source),
            resident_bytes=resident_bytes,
        ),
        files=file_records(staging, roles),
        packages=("onnx", "onnxruntime", "gguf", "tokenizers", "numpy"),
        extra={
            "gguf": {
                "file": source.path.name,
                "tensor_types": dict(kinds),
                "grid_kept": not requantized and not builder.dequantize,
                "dequantized": builder.dequantize,
                "requantized_types": requantized,
                # A draft's head scores these many tokens (None: the whole vocabulary).
                "output_vocabulary": len(arch.output_vocabulary) or None,
            },
            # The rotary scaling the cos/sin tables carry ("none", "linear x8", ...).
            "rope_scaling": arch.rope_scaling.describe,
            **extra,
        },
    )


def _model_spec(source: GGUFFile, capacity: int) -> ModelSpec:
    arch = source.architecture
    parameters = sum(int(t.n_elements) for t in source.tensors.values())
    return model_spec(
        arch,
        model_type=arch.arch,
        architecture=f"gguf:{arch.arch}",
        parameters=parameters,
        positions=arch.context_length,
        capacity=capacity,
    )


def model_spec(
    arch: GGUFArchitecture,
    *,
    model_type: str,
    architecture: str,
    parameters: int,
    positions: int,
    capacity: int,
) -> ModelSpec:
    """The manifest's model record of an in-place graph built from ``arch`` (either importer)."""
    return ModelSpec(
        model_type=model_type,
        architecture=architecture,
        parameters=parameters,
        num_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        hidden_size=arch.hidden_size,
        vocab_size=arch.vocab_size,
        max_position_embeddings=positions,
        max_length=capacity,
    )


def _tokenizer_spec(
    tokenizer: Any, files: list[str], staging: Path, vocab_size: int
) -> TokenizerSpec:
    return TokenizerSpec(
        file="tokenizer.json",
        files=tuple(files),
        sha256=tokenizer_sha256(staging / "tokenizer.json"),
        vocab_type="BPE",
        vocab_size=vocab_size,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_ids=tokenizer.eos_token_ids,
        pad_token_id=tokenizer.pad_token_id,
        add_bos_token=tokenizer.add_bos_token,
        special_tokens=tokenizer.special_tokens,
        has_chat_template=bool(tokenizer.chat_template),
    )


def _quantization_spec(kinds: Counter[str], builder: Any, accuracy: int) -> QuantizationSpec:
    quantized = bool(builder.quantized)
    scheme = "gguf_blocks" if builder.kernel_ops else "matmul_nbits"
    op_types = ("MatMulNBits", "Gather", *sorted(builder.kernel_ops)) if quantized else ()
    return QuantizationSpec(
        scheme=scheme if quantized else "none",
        weight_dtype=(
            "/".join(sorted(k.lower() for k in kinds if k != "F32")) if quantized else "fp32"
        )
        or "fp32",
        bits=min((w.bits for w in builder.quantized), default=32),
        block_size=min((w.block for w in builder.quantized), default=32) if quantized else None,
        accuracy_level=accuracy,
        symmetric=False,
        op_types=op_types,
        tool="edgespec GGUF importer",
    )


def graph_spec(source: Any, layout: KVLayout, min_width: int) -> GraphSpec:
    """The in-place graph's I/O record (any source with an ``architecture``: a GGUF file, or a
    Hugging Face checkpoint through :mod:`edgespec.export.hf_graph`)."""
    arch = source.architecture
    kv = (1, arch.num_kv_heads, "capacity", arch.head_dim)
    layers = range(arch.num_layers)
    inputs = [
        TensorSpec(name=IO["input_ids"], dtype="int64", shape=(1, "sequence")),
        TensorSpec(name=IO["seqlens_k"], dtype="int32", shape=(1,)),
        TensorSpec(name=IO["total_sequence_length"], dtype="int32", shape=()),
        TensorSpec(name=IO["logits_rows"], dtype="int64", shape=("rows",)),
    ]
    kv_dtype = layout.kv_dtype
    inputs += [TensorSpec(name=n, dtype=kv_dtype, shape=kv) for i in layers for n in past_names(i)]
    outputs = [
        TensorSpec(name=IO["logits"], dtype="float32", shape=(1, "rows", arch.vocab_size)),
        TensorSpec(name=IO["features"], dtype="float32", shape=(1, "sequence", arch.hidden_size)),
    ]
    outputs += [
        TensorSpec(name=n, dtype=kv_dtype, shape=kv) for i in layers for n in present_names(i)
    ]
    return GraphSpec(
        attention_boundaries=attention_boundaries(arch, layout),
        file=GRAPH_FILE,
        opset=21,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        input_ids=IO["input_ids"],
        attention_mask=None,
        position_ids=None,
        logits=IO["logits"],
        past_key=tuple(past_names(i)[0] for i in layers),
        past_value=tuple(past_names(i)[1] for i in layers),
        present_key=tuple(present_names(i)[0] for i in layers),
        present_value=tuple(present_names(i)[1] for i in layers),
        kv_dtype=kv_dtype,
        logits_dtype="float32",
        kv_sharing="shared",
        seqlens_k=IO["seqlens_k"],
        total_sequence_length=IO["total_sequence_length"],
        logits_rows=IO["logits_rows"],
        features=IO["features"],
        min_pass_width=min_width,
    )


def gathered_bytes(source: GGUFFile) -> int:
    """The embedding table's bytes when only lookups read it: the model has an output weight
    of its own (or a draft's reduced head); 0 when the tied head reads the table whole."""
    arch = source.architecture
    if arch.tied_embeddings and not arch.output_vocabulary:
        return 0
    return int(getattr(source.tensor("token_embd.weight"), "n_bytes", 0))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
