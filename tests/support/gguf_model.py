"""Writes a saved Hugging Face Llama (weights, config, byte-level BPE tokenizer.json) as an
F32 GGUF file that llama.cpp loads, with the ``gguf`` package. Test support for the
OpenAI-compatible engine verifier: no converter script or download is needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def _unrotate(weight: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face stores Q/K rows per head as [first halves | second halves] for its
    rotate-half RoPE; llama.cpp's Llama expects the pairs interleaved.
    weight: (heads * head_dim, hidden) -> same shape, rows reordered within each head."""
    rows, columns = weight.shape
    return (
        weight.reshape(heads, 2, rows // heads // 2, columns).swapaxes(1, 2).reshape(rows, columns)
    )


def write_llama_gguf(
    model_dir: Path,
    out_path: Path,
    *,
    add_bos: bool = False,
    weight_type: str | None = None,
    architecture: str = "llama",
    with_tokenizer: bool = True,
    pre: str = "gpt-2",
    rope_freqs: np.ndarray | None = None,
    rope_scaling: dict[str, Any] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """``weight_type`` (Q4_0, Q4_1, Q8_0...) quantizes the 2-D weights with the ``gguf``
    package's reference code (the embedding as Q8_0); ``architecture``, ``with_tokenizer`` and
    ``pre`` (the pre-tokenizer's name) write files the importer must refuse. ``rope_freqs``
    ([head_dim / 2] frequency factors, as Llama 3.x files carry them) and ``rope_scaling``
    ({"type": ..., "factor": ..., "original_context_length": ..., "context_length": ...},
    as llama.cpp's converter writes linear and YaRN configs) change the rotary angles;
    ``extra_tensors`` are added as float32 (Phi-3's ``rope_factors_long.weight``, say). A Phi-3
    checkpoint keeps its fused ``attn_qkv`` and double-width ``ffn_up``, as llama.cpp's
    converter writes them."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = model.config
    if config.model_type not in ("llama", "qwen2", "qwen3", "phi3"):
        raise ValueError(f"only Llama, Qwen2/3 and Phi-3 are written, not {config.model_type}")
    # llama.cpp's Qwen2 uses NeoX rotary (halves), so its Q/K rows keep Hugging Face's order.
    interleave = config.model_type == "llama"
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(tokenizer["model"]["vocab"])
    specials = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    vocab.update(specials)
    tokens = [""] * len(vocab)
    for piece, index in vocab.items():
        tokens[index] = piece
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    if not merges:
        # llama.cpp refuses a BPE vocabulary without merges; a merge of two characters that
        # are not in the vocabulary never applies.
        merges = ["\u0100 \u0101"]
    head_dim = config.hidden_size // config.num_attention_heads

    writer = gguf.GGUFWriter(
        str(out_path), config.model_type if architecture == "llama" else architecture
    )
    writer.add_name("edgespec-test-llama")
    scaling = dict(rope_scaling or {})
    writer.add_context_length(int(scaling.pop("context_length", config.max_position_embeddings)))
    if "type" in scaling:
        writer.add_string(f"{config.model_type}.rope.scaling.type", str(scaling.pop("type")))
    for key, found in scaling.items():
        add = writer.add_uint32 if isinstance(found, int) else writer.add_float32
        add(f"{config.model_type}.rope.scaling.{key}", found)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    # Phi-3-style partial rotary: the first partial_rotary_factor of each head turns.
    writer.add_rope_dimension_count(int(head_dim * getattr(config, "partial_rotary_factor", 1.0)))
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if with_tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(
            [
                gguf.TokenType.CONTROL if i in specials.values() else gguf.TokenType.NORMAL
                for i in range(len(tokens))
            ]
        )
        writer.add_token_merges(merges)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    if config.pad_token_id is not None:
        writer.add_pad_token_id(config.pad_token_id)
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(False)

    state = {name: t.detach().numpy().astype(np.float32) for name, t in model.state_dict().items()}
    from edgespec.export.hf_source import LAYER_NAMES as layer_names
    from edgespec.export.hf_source import QK_NORM_NAMES as qk_norm_names

    def add(name: str, weight: np.ndarray, kind: str | None) -> None:
        if kind is None or weight.ndim != 2:
            writer.add_tensor(name, weight)
            return
        qtype = gguf.GGMLQuantizationType[kind]
        quantized = gguf.quants.quantize(np.ascontiguousarray(weight), qtype)
        writer.add_tensor(name, quantized, raw_shape=quantized.shape, raw_dtype=qtype)

    add("token_embd.weight", state["model.embed_tokens.weight"], weight_type and "Q8_0")
    if config.model_type == "phi3":
        layer_names = {
            "input_layernorm": "attn_norm",
            "self_attn.qkv_proj": "attn_qkv",
            "self_attn.o_proj": "attn_output",
            "post_attention_layernorm": "ffn_norm",
            "mlp.gate_up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down",
        }
    for layer in range(config.num_hidden_layers):
        for hf_name, gguf_name in layer_names.items():
            weight = state[f"model.layers.{layer}.{hf_name}.weight"]
            if hf_name == "self_attn.q_proj" and interleave:
                weight = _unrotate(weight, config.num_attention_heads)
            elif hf_name == "self_attn.k_proj" and interleave:
                weight = _unrotate(weight, config.num_key_value_heads)
            add(f"blk.{layer}.{gguf_name}.weight", np.ascontiguousarray(weight), weight_type)
            bias = state.get(f"model.layers.{layer}.{hf_name}.bias")
            if bias is not None:
                writer.add_tensor(f"blk.{layer}.{gguf_name}.bias", bias)
        for hf_name, gguf_name in qk_norm_names.items():  # Qwen3
            norm = state.get(f"model.layers.{layer}.{hf_name}.weight")
            if norm is not None:
                writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", norm)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    for name, values in (extra_tensors or {}).items():
        writer.add_tensor(name, np.asarray(values, dtype=np.float32))
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    lm_head = state.get("lm_head.weight", state["model.embed_tokens.weight"])
    add("output.weight", lm_head, weight_type and "Q8_0")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


SPM_CORPUS = (
    "the quick brown fox jumps over the lazy dog then the other dog thinks "
    "speculative decoding drafts tokens that the target verifies in one pass"
)


def add_spm_vocab(writer: Any, *, seed: int, add_space_prefix: bool) -> int:
    """Writes a SentencePiece ("llama") vocabulary: control and unknown tokens, the 256
    byte-fallback tokens, a user-defined token, and every piece of up to five characters of
    the corpus's words (with "▁" for the space before them), under seeded random scores so
    that merge order matters. Returns the vocabulary size."""
    import gguf

    rng = np.random.default_rng(seed)
    pieces: dict[str, None] = {}
    for word in SPM_CORPUS.split():
        marked = "\u2581" + word
        for start in range(len(marked)):
            for end in range(start + 1, min(len(marked), start + 5) + 1):
                pieces[marked[start:end]] = None
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "<|user|>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.USER_DEFINED]
    tokens += list(pieces)
    types += [gguf.TokenType.NORMAL] * len(pieces)
    scores = [0.0] * (len(tokens) - len(pieces)) + list(rng.uniform(-20, 0, len(pieces)))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([float(s) for s in scores])
    writer.add_token_types([int(t) for t in types])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(add_space_prefix)
    return len(tokens)


def finish_gguf(writer: Any, out_path: Path) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def write_spm_vocab_gguf(out_path: Path, *, seed: int = 0, add_space_prefix: bool = True) -> Path:
    """A GGUF holding only Llama hyperparameters and a SentencePiece vocabulary, for comparing
    tokenizations with llama.cpp (``vocab_only``)."""
    import gguf

    writer = gguf.GGUFWriter(str(out_path), "llama")
    writer.add_name("edgespec-test-spm-vocab")
    writer.add_context_length(64)
    writer.add_embedding_length(32)
    writer.add_block_count(1)
    writer.add_feed_forward_length(64)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(add_spm_vocab(writer, seed=seed, add_space_prefix=add_space_prefix))
    return finish_gguf(writer, out_path)


def write_gemma3_gguf(
    out_path: Path,
    *,
    seed: int = 0,
    layers: int = 7,
    sliding_window: int = 4,
    head_dim: int = 16,
    weight_type: str | None = None,
    gemma2: bool = False,
    softcaps: tuple[float, float] | None = (2.0, 3.0),
) -> Path:
    """A random-weight Gemma 3 in F32 as llama.cpp's converter lays it out (norm weights
    already hold Gemma's 1 + w): layers 0-4 and 6 attend to the last ``sliding_window``
    positions, layer 5 to all; Q/K norms, post-attention and post-MLP norms, a tied
    embedding, and the SentencePiece test vocabulary. ``weight_type`` (Q8_0, ...) quantizes
    the layers' matrices with the ``gguf`` package's reference code. ``gemma2`` writes Gemma
    2 instead: no Q/K norms, even layers sliding, scores and logits capped (``softcaps``: 2
    and 3 by default, so that random weights feel them; None leaves the keys out, and
    llama.cpp then caps at its defaults, 50 and 30)."""
    import gguf

    hidden, heads, kv_heads, ffn = 64, 4, 1, 128
    rng = np.random.default_rng(seed)
    arch = "gemma2" if gemma2 else "gemma3"
    writer = gguf.GGUFWriter(str(out_path), arch)
    if gemma2 and softcaps is not None:
        writer.add_float32(f"{arch}.attn_logit_softcapping", softcaps[0])
        writer.add_float32(f"{arch}.final_logit_softcapping", softcaps[1])
    writer.add_name(f"edgespec-test-{arch}")
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_sliding_window(sliding_window)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = add_spm_vocab(writer, seed=seed, add_space_prefix=False)
    writer.add_vocab_size(vocab)

    def matrix(rows: int, columns: int) -> np.ndarray:
        return (rng.standard_normal((rows, columns)) / np.sqrt(columns)).astype(np.float32)

    def norm(size: int) -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(size)).astype(np.float32)

    def add_matrix(name: str, rows: int, columns: int) -> None:
        weight = matrix(rows, columns)
        if weight_type is None:
            writer.add_tensor(name, weight)
            return
        qtype = gguf.GGMLQuantizationType[weight_type]
        quantized = gguf.quants.quantize(weight, qtype)
        writer.add_tensor(name, quantized, raw_shape=quantized.shape, raw_dtype=qtype)

    writer.add_tensor("token_embd.weight", matrix(vocab, hidden) * 4)
    for layer in range(layers):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", norm(hidden))
        add_matrix(p + "attn_q.weight", heads * head_dim, hidden)
        add_matrix(p + "attn_k.weight", kv_heads * head_dim, hidden)
        add_matrix(p + "attn_v.weight", kv_heads * head_dim, hidden)
        if not gemma2:
            writer.add_tensor(p + "attn_q_norm.weight", norm(head_dim))
            writer.add_tensor(p + "attn_k_norm.weight", norm(head_dim))
        add_matrix(p + "attn_output.weight", hidden, heads * head_dim)
        writer.add_tensor(p + "post_attention_norm.weight", norm(hidden))
        writer.add_tensor(p + "ffn_norm.weight", norm(hidden))
        add_matrix(p + "ffn_gate.weight", ffn, hidden)
        add_matrix(p + "ffn_up.weight", ffn, hidden)
        add_matrix(p + "ffn_down.weight", hidden, ffn)
        writer.add_tensor(p + "post_ffw_norm.weight", norm(hidden))
    writer.add_tensor("output_norm.weight", norm(hidden))
    return finish_gguf(writer, out_path)
