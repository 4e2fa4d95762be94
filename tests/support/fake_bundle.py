"""A bundle directory with a consistent manifest and placeholder files, for unit tests.

``load_bundle`` checks the manifest and the files' sizes and hashes, never the ONNX content, so
these bundles need no model.
"""

from __future__ import annotations

import json
from pathlib import Path

from edgespec.manifest import (
    SCHEMA_VERSION,
    GraphSpec,
    Manifest,
    MemoryEstimate,
    ModelSpec,
    QuantizationSpec,
    SourceSpec,
    TensorSpec,
    TokenizerSpec,
    VerificationRecord,
    file_record,
    write_manifest,
)


def tokenizer_json(tokens: list[str]) -> str:
    vocab = {token: index for index, token in enumerate(tokens)}
    return json.dumps(
        {
            "version": "1.0",
            "added_tokens": [],
            "normalizer": None,
            "pre_tokenizer": None,
            "post_processor": None,
            "decoder": None,
            "truncation": None,
            "padding": None,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": tokens[0]},
        }
    )


def make_bundle(
    root: Path,
    *,
    tokens: list[str] | None = None,
    sha256: str = "t" * 64,
    vocab_type: str = "BPE",
    bos: int | None = 0,
    layers: int = 2,
) -> Path:
    tokens = tokens or ["<s>", "</s>", "<pad>", "a", "b", "c"]
    root.mkdir(parents=True)
    (root / "model.onnx").write_bytes(_identity_graph())
    (root / "tokenizer.json").write_text(tokenizer_json(tokens), encoding="utf-8")
    kv = [
        TensorSpec(
            name=f"past_key_values.{i}.{kind}",
            dtype="float32",
            shape=("batch_size", 2, "past_sequence_length", 16),
        )
        for i in range(layers)
        for kind in ("key", "value")
    ]
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        edgespec_version="0.1.0",
        created_at="2026-11-22T00:00:00+00:00",
        source=SourceSpec(model="tiny", kind="local", revision=None, config_sha256="c" * 64),
        model=ModelSpec(
            model_type="llama",
            architecture="LlamaForCausalLM",
            parameters=1000,
            num_layers=layers,
            num_attention_heads=4,
            num_kv_heads=2,
            head_dim=16,
            hidden_size=64,
            vocab_size=len(tokens),
            max_position_embeddings=256,
            max_length=256,
        ),
        graph=GraphSpec(
            file="model.onnx",
            opset=18,
            inputs=(TensorSpec(name="input_ids", dtype="int64", shape=("batch_size", "seq")), *kv),
            outputs=(TensorSpec(name="logits", dtype="float32", shape=("batch_size", "seq", 6)),),
            input_ids="input_ids",
            attention_mask="attention_mask",
            position_ids=None,
            logits="logits",
            past_key=tuple(f"past_key_values.{i}.key" for i in range(layers)),
            past_value=tuple(f"past_key_values.{i}.value" for i in range(layers)),
            present_key=tuple(f"present.{i}.key" for i in range(layers)),
            present_value=tuple(f"present.{i}.value" for i in range(layers)),
            kv_dtype="float32",
            logits_dtype="float32",
        ),
        tokenizer=TokenizerSpec(
            file="tokenizer.json",
            files=("tokenizer.json",),
            sha256=sha256,
            vocab_type=vocab_type,
            vocab_size=len(tokens),
            bos_token_id=bos,
            eos_token_ids=(1,),
            pad_token_id=2,
            add_bos_token=bos is not None,
            special_tokens={"bos_token": "<s>", "eos_token": "</s>"},
            has_chat_template=False,
        ),
        quantization=QuantizationSpec(scheme="none", weight_dtype="float32", bits=32),
        verification=VerificationRecord(performed=False),
        memory=MemoryEstimate(
            weight_bytes=280, kv_bytes_per_token=512, logits_bytes_per_position=24, file_bytes=280
        ),
        files=(
            file_record(root, "model.onnx", "graph"),
            file_record(root, "tokenizer.json", "tokenizer"),
        ),
    )
    write_manifest(root, manifest)
    return root


def _identity_graph() -> bytes:
    """A graph ONNX Runtime loads (inspect loads it), built by hand as a serialized ModelProto:
    one Identity node from x to y, float [1], opset 13. No onnx package needed."""

    def field(number: int, payload: bytes) -> bytes:  # length-delimited protobuf field
        return bytes([number << 3 | 2]) + _varint(len(payload)) + payload

    def value_info(name: bytes) -> bytes:
        dims = field(1, field(1, b"\x08\x01"))  # shape { dim { dim_value: 1 } }
        tensor = b"\x08\x01" + field(2, dims)  # elem_type FLOAT, shape
        return field(1, name) + field(2, field(1, tensor))

    node = field(1, b"x") + field(2, b"y") + field(4, b"Identity")
    graph = (
        field(1, node) + field(2, b"g") + field(11, value_info(b"x")) + field(12, value_info(b"y"))
    )
    opset = b"\x10\x0d"  # version 13, default domain
    return b"\x08\x08" + field(7, graph) + field(8, opset)  # ir_version 8


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
