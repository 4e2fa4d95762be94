"""Random GGUF blocks of every type the kernels read, and a GGUF file whose K-quant
embedding is also its LM head (written with the ``gguf`` package)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from support.gguf_model import add_spm_vocab, finish_gguf

#: Bytes per super-block of 256 weights, and where its float16 fields start (with IQ4_XS,
#: whose blocks are super-blocks as well).
K_QUANTS = {
    "Q2_K": (84, 80, 2),
    "Q3_K": (110, 108, 1),
    "Q4_K": (144, 0, 2),
    "Q5_K": (176, 0, 2),
    "Q6_K": (210, 208, 1),
    "IQ4_XS": (136, 0, 1),
}
#: IQ4_NL's block of 32 weights in the same form (its float16 d first).
IQ4_NL = (18, 0, 1)


def random_k_blocks(rng: np.random.Generator, kind: str, rows: int, columns: int) -> np.ndarray:
    """A weight [rows, columns] of random llama.cpp K-quant (or IQ4) blocks (any bytes are valid
    but the float16 scales, set small): uint8 [rows, bytes per row]. Another type gets random bytes
    of its block size (for files the importer must refuse before reading them)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    count = rows * columns // block
    blocks = rng.integers(0, 256, (count, size), dtype=np.uint8)
    if kind in K_QUANTS or kind == "IQ4_NL":
        _, at, halves = K_QUANTS.get(kind, IQ4_NL)
        fields = rng.uniform(2e-4, 6e-4, (count, halves)).astype(np.float16)
        blocks[:, at : at + 2 * halves] = fields.view(np.uint8)
    return blocks.reshape(rows, -1)


def random_blocks(rng: np.random.Generator, kind: str, rows: int, columns: int) -> np.ndarray:
    """A weight [rows, columns] of random blocks of any type the GGUF kernels run, in the file's
    layout, float16 factors set small: the K-quants and IQ4_XS as ``random_k_blocks``, the
    legacy types (Q4_0 ... Q8_0) and IQ4_NL with d (and Q4_1's and Q5_1's minimum m) in
    [1e-3, 3e-3]."""
    if kind in K_QUANTS:
        return random_k_blocks(rng, kind, rows, columns)
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    blocks = rng.integers(0, 256, (rows * columns // block, size), dtype=np.uint8)
    halves = 2 if kind in ("Q4_1", "Q5_1") else 1  # d, and the minimum m
    factors = rng.uniform(1e-3, 3e-3, (len(blocks), halves)).astype(np.float16)
    blocks[:, : 2 * halves] = factors.view(np.uint8)
    return blocks.reshape(rows, -1)


def write_tied_k_quant_gguf(
    out_path: Path,
    *,
    seed: int = 0,
    layers: int = 2,
    layer_type: str = "Q4_K",
    architecture: str = "llama",
    pre: str | None = None,
) -> Path:
    """A random-weight Llama as llama.cpp's Q4_K_M writes a tied model: Q4_K layers, Q6_K
    output projections of attention values and MLP, a Q6_K embedding that is also the LM head
    (no ``output.weight``), and the SentencePiece test vocabulary. ``layer_type`` replaces
    Q4_K, ``architecture`` names another one, and ``pre`` writes a three-token byte-level BPE
    vocabulary with that pre-tokenizer instead: files the importer must refuse."""
    import gguf

    hidden, heads, kv_heads, ffn = 256, 4, 2, 512
    head_dim = hidden // heads
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out_path), architecture)
    writer.add_name("edgespec-test-tied-k-quants")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    if pre is None:
        vocab = add_spm_vocab(writer, seed=seed, add_space_prefix=True)
    else:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(["a", "b", "ab"])
        writer.add_token_merges(["a b"])
        vocab = 3
    writer.add_vocab_size(vocab)

    def add(name: str, kind: str, rows: int, columns: int) -> None:
        blocks = random_k_blocks(rng, kind, rows, columns)
        writer.add_tensor(
            name,
            blocks,
            raw_shape=blocks.shape,
            raw_dtype=gguf.GGMLQuantizationType[kind],
        )

    def norm(size: int) -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(size)).astype(np.float32)

    add("token_embd.weight", "Q6_K", vocab, hidden)
    for layer in range(layers):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", norm(hidden))
        add(p + "attn_q.weight", layer_type, heads * head_dim, hidden)
        add(p + "attn_k.weight", layer_type, kv_heads * head_dim, hidden)
        add(p + "attn_v.weight", "Q6_K", kv_heads * head_dim, hidden)
        add(p + "attn_output.weight", layer_type, hidden, heads * head_dim)
        writer.add_tensor(p + "ffn_norm.weight", norm(hidden))
        add(p + "ffn_gate.weight", layer_type, ffn, hidden)
        add(p + "ffn_up.weight", layer_type, ffn, hidden)
        add(p + "ffn_down.weight", "Q6_K", hidden, ffn)
    writer.add_tensor("output_norm.weight", norm(hidden))
    return finish_gguf(writer, out_path)
