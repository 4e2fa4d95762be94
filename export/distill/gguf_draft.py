"""A distilled draft written as a GGUF beside its GGUF target: the target's tokenizer metadata,
llama.cpp's Llama layout, 8-bit (Q8_0) weights. The importer then turns it into the same
in-place-KV, block-quantized graph as the target (and checks it against llama.cpp), and
llama.cpp itself can use the file as a draft model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.export.distill.torch_teacher import permute_rope_rows
from edgespec.export.gguf.reader import OUTPUT_VOCABULARY_KEY, GGUFFile

#: Metadata the draft copies from its target: everything the tokenizer and chat need.
COPIED_PREFIXES = ("tokenizer.",)
#: Block quantization of the draft's matrices (rows must be multiples of 32).
DRAFT_QUANT = "Q8_0"


#: The distillation record travels in the file (JSON); the importer puts it in the bundle's
#: manifest (``extra["distillation"]``), so a shipped draft GGUF keeps its record.
RECORD_KEY = "edgespec.distillation"


def write_draft_gguf(
    draft: Any,
    target: GGUFFile,
    path: Path,
    *,
    name: str,
    record: dict[str, Any] | None = None,
    output_vocabulary: np.ndarray | None = None,
) -> Path:
    """Writes the transformers Llama ``draft`` to ``path`` (atomically) and returns it; with
    ``output_vocabulary`` (ascending token ids) its head scores those tokens only."""
    from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, quants

    config = draft.config
    heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    scratch = path.with_name(path.name + ".partial")
    writer = GGUFWriter(str(scratch), "llama")
    writer.add_name(name)
    # The draft serves this target: the same context (and so the same default KV capacity).
    writer.add_context_length(target.architecture.context_length)
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    if record is not None:
        writer.add_string(RECORD_KEY, json.dumps(record))
    if output_vocabulary is not None:
        writer.add_array(OUTPUT_VOCABULARY_KEY, [int(t) for t in output_vocabulary])
    for field in target.fields.values():
        if field.name.startswith(COPIED_PREFIXES):
            _copy_field(writer, field)
    quant = GGMLQuantizationType[DRAFT_QUANT]
    tensors = _gguf_tensors(draft, heads, kv_heads)
    if output_vocabulary is not None:  # the tied embedding's rows of the kept tokens
        table = dict(tensors)["token_embd.weight"]
        tensors.append(("output.weight", table[np.asarray(output_vocabulary)]))
    for gguf_name, value in tensors:
        if value.ndim == 2:
            writer.add_tensor(gguf_name, quants.quantize(value, quant), raw_dtype=quant)
        else:
            writer.add_tensor(gguf_name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    scratch.replace(path)
    return path


def _gguf_tensors(draft: Any, heads: int, kv_heads: int) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) in llama.cpp's layout: Q/K rows permuted for its rope."""
    names = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    tied = bool(getattr(draft.config, "tie_word_embeddings", True))
    out: list[tuple[str, np.ndarray]] = []
    for name, tensor in draft.state_dict().items():
        value = tensor.detach().float().cpu().numpy()
        if name == "model.embed_tokens.weight":
            out.append(("token_embd.weight", value))
        elif name == "model.norm.weight":
            out.append(("output_norm.weight", value))
        elif name == "lm_head.weight":
            if not tied:
                out.append(("output.weight", value))
        elif name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            if rest == "self_attn.q_proj.weight":
                value = permute_rope_rows(value, heads)
            elif rest == "self_attn.k_proj.weight":
                value = permute_rope_rows(value, kv_heads)
            out.append((f"blk.{layer}.{names[rest]}", value))
        elif not name.endswith("rotary_emb.inv_freq"):
            raise ValueError(f"draft tensor {name} has no GGUF name")
    return out


def read_record(path: Path) -> dict[str, Any] | None:
    """The distillation record a draft GGUF carries (None when it has none)."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get(RECORD_KEY)
    if field is None:
        return None
    record: dict[str, Any] = json.loads(bytes(field.parts[field.data[0]]).decode())
    return record


def rewrite_record(path: Path, record: dict[str, Any]) -> Path:
    """Replaces the distillation record of the draft GGUF at ``path`` (atomically), every
    other field and every tensor's bytes unchanged: a record completed after training
    (earlier rounds, what it was measured at) without requantizing the weights."""
    return _copy_gguf(path, path, record=record)


def reduce_output_vocabulary(
    path: Path,
    out: Path,
    kept: np.ndarray,
    record: dict[str, Any] | None = None,
    *,
    requantize: dict[str, str] | None = None,
    head_type: str | None = None,
) -> Path:
    """A copy of the draft GGUF at ``path`` whose head scores the ``kept`` token ids only:
    ``output.weight`` is its own head's rows of those tokens (the tied embedding's when it has
    no separate head), byte for byte unless ``head_type`` names another block type for them,
    so the draft's logits for them are unchanged and its step skips the other rows.
    ``requantize`` maps block types to narrower ones for the layers' weights (see
    :func:`requantized`)."""
    from gguf import GGMLQuantizationType, GGUFReader

    kept = np.unique(np.asarray(kept, np.int64))
    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    table = tensors["token_embd.weight"]
    head = tensors.get("output.weight")
    # A head of its own over the whole vocabulary (an already reduced one is not: its rows
    # are the kept tokens only, so the tied embedding's rows are taken again).
    if head is not None and len(np.asarray(head.data)) == len(np.asarray(table.data)):
        table = head
    rows = np.asarray(table.data)[kept]  # [N, row bytes] for block types, [N, hidden] float
    kept_rows = (rows, table.tensor_type, kept)
    if head_type is not None and table.tensor_type != GGMLQuantizationType[head_type]:
        kept_rows = (*requantized_blocks(rows, table.tensor_type, head_type), kept)
    return _copy_gguf(path, out, record=record, head=kept_rows, requantize=requantize)


def requantized(tensor: Any, kind: str) -> tuple[np.ndarray, Any]:
    """A GGUF reader's tensor in the block type ``kind`` (its values dequantized, then
    quantized again by gguf-py's reference quantizer): a draft's layers at fewer bits read
    fewer bytes a step. Exactness does not depend on the draft's weights: the target checks
    every proposal."""
    return requantized_blocks(np.asarray(tensor.data), tensor.tensor_type, kind)


def requantized_blocks(data: np.ndarray, source_type: Any, kind: str) -> tuple[np.ndarray, Any]:
    """Rows ``data`` of GGML type ``source_type`` ([rows, row bytes] for block types, [rows,
    columns] for floats) in the block type ``kind``, and that type."""
    from gguf import GGMLQuantizationType, quants

    values = quants.dequantize(np.asarray(data), source_type).astype(np.float32)
    target = GGMLQuantizationType[kind]
    return quants.quantize(values, target), target


def _copy_gguf(
    path: Path,
    out: Path,
    *,
    record: dict[str, Any] | None = None,
    head: tuple[np.ndarray, Any, np.ndarray] | None = None,
    requantize: dict[str, str] | None = None,
) -> Path:
    from gguf import GGUFReader, GGUFWriter

    reader = GGUFReader(str(path))
    architecture = reader.fields["general.architecture"].contents()
    scratch = out.with_name(out.name + ".partial")
    writer = GGUFWriter(str(scratch), architecture)
    replaced = {"general.architecture", *(() if record is None else (RECORD_KEY,))}
    if head is not None:
        replaced.add(OUTPUT_VOCABULARY_KEY)
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name not in replaced:
            _copy_field(writer, field)
    if record is not None:
        writer.add_string(RECORD_KEY, json.dumps(record))
    if head is not None:
        writer.add_array(OUTPUT_VOCABULARY_KEY, [int(t) for t in head[2]])
    for tensor in reader.tensors:
        if head is not None and tensor.name == "output.weight":
            continue
        data, kind = tensor.data, tensor.tensor_type
        # The embedding is looked up a row per token, not read whole each step: kept as is.
        if requantize and kind.name in requantize and tensor.name != "token_embd.weight":
            data, kind = requantized(tensor, requantize[kind.name])
        writer.add_tensor(tensor.name, data, raw_dtype=kind)
    if head is not None:
        writer.add_tensor("output.weight", head[0], raw_dtype=head[1])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    scratch.replace(out)
    return out


def _copy_field(writer: Any, field: Any) -> None:
    """One metadata field of a GGUF reader, written as it was (arrays with their item type)."""
    from gguf import GGUFValueType

    kind = field.types[0]
    sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
    writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
