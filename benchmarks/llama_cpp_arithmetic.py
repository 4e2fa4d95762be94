"""How close can any arithmetic get to llama.cpp's top-1? A numpy forward of a Q4_1 GGUF whose
linear layers compute in one of four ways, each scored against llama.cpp's own logits:

    python benchmarks/llama_cpp_arithmetic.py GGUF TOKENIZER_JSON [--positions 700]
        [--modes exact,llama,mlas,mlas_qsum]

* ``exact``: float64 products with the file's dequantized weights;
* ``llama``: llama.cpp's documented Q4_1 x Q8_1 (and Q8_0 x Q8_0) dot products: activations
  quantized per block of 32 to 8 bits (scale amax / 127 and the block's quantized sum, both
  stored as float16; round half away from zero), weights' minimum times that quantized sum;
* ``mlas``: what an edgespec 4-bit graph computes (MatMulNBits at accuracy level 4):
  activations quantized per block with a float32 scale (round half to even), the weights as
  d × (q - 8), and the Q4_1 offsets (m + 8d) times the exact float block sums;
* ``mlas_qsum``: the same with the offsets times the quantized block sums, as llama.cpp does.

Norms, rotary and attention run in float64 for every mode. Texts: ``agreement_texts.json``
(the start of this project's README and runtime guide), ``--positions`` tokens each,
teacher-forced (as ``gguf_vs_llama_cpp.py --agreement``). Prints one JSON line per mode:
top-1 agreement with llama.cpp and llama.cpp's own top-2 margin at each position where they
part.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf_vs_llama_cpp import agreement_texts

from edgespec.export.gguf import check
from edgespec.export.gguf.legacy_quants import _blocks, _half, _nibbles
from edgespec.export.gguf.reader import float_tensor, open_gguf
from edgespec.export.gguf.rope import rotary_caches

import harness


def _fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


class Linears:
    """The file's blocks per weight: (kind, codes [N, K / 32, 32], d [N, K / 32], m or None)."""

    def __init__(self, source: object) -> None:
        self.source = source
        self.blocks: dict[str, tuple] = {}

    def weight(self, name: str) -> tuple:
        if name not in self.blocks:
            tensor = self.source.tensor(name)  # type: ignore[attr-defined]
            kind = tensor.tensor_type.name
            if kind == "Q4_1":
                raw = _blocks(tensor, 20)
                codes = _nibbles(raw[..., 4:]).astype(np.float32)
                self.blocks[name] = (kind, codes, _half(raw, 0), _half(raw, 2))
            elif kind == "Q8_0":
                raw = _blocks(tensor, 34)
                codes = np.ascontiguousarray(raw[..., 2:]).view(np.int8).astype(np.float32)
                self.blocks[name] = (kind, codes, _half(raw, 0), None)
            else:
                self.blocks[name] = ("F", float_tensor(tensor).astype(np.float64), None, None)
        return self.blocks[name]

    def __call__(self, x: np.ndarray, name: str, mode: str) -> np.ndarray:
        kind, codes, d, m = self.weight(name)
        if kind == "F":
            return x @ codes.T
        if mode == "exact":
            return x @ float_tensor(self.source.tensor(name)).astype(np.float64).T  # type: ignore[attr-defined]
        rows, width = x.shape
        blocks = x.astype(np.float32).reshape(rows, width // 32, 32)
        scale = np.abs(blocks).max(-1) / np.float32(127)
        inverse = np.where(scale > 0, 1 / np.where(scale > 0, scale, 1), 0).astype(np.float32)
        scaled = blocks * inverse[..., None]
        if mode == "llama":
            q = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)
            quantized_sum, scale = _fp16(scale * q.sum(-1)), _fp16(scale)
        else:
            q = np.rint(scaled)
            quantized_sum = scale * q.sum(-1)
        if kind == "Q4_1" and mode != "llama":
            # MatMulNBits' form: d × (q - 8), the rest of the weight in the offsets term.
            weight_codes, offsets = codes - 8, m + 8 * d
        else:
            weight_codes, offsets = codes, m
        sums = blocks.sum(-1) if mode == "mlas" else quantized_sum
        out = np.zeros((rows, codes.shape[0]))
        for start in range(0, rows, 16):
            part = slice(start, start + 16)
            dots = np.einsum("tbk,nbk->tnb", q[part], weight_codes, optimize=True)
            out[part] = (dots * (d[None] * scale[part, None, :])).sum(-1)
            if kind == "Q4_1":
                out[part] += (offsets[None] * sums[part, None, :]).sum(-1)
        return out


def forward(source: object, linears: Linears, tokens: list[int], mode: str) -> np.ndarray:
    arch = source.architecture  # type: ignore[attr-defined]
    length, d = len(tokens), arch.head_dim
    cos, sin = rotary_caches(head_dim=d, theta=arch.rope_theta, capacity=length)
    causal = np.triu(np.full((length, length), -np.inf), 1)
    group = arch.num_heads // arch.num_kv_heads

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        weight = float_tensor(source.tensor(name)).astype(np.float64)  # type: ignore[attr-defined]
        return check._rms(x, weight, arch.rms_norm_eps)

    x = float_tensor(source.tensor("token_embd.weight"))[tokens].astype(np.float64)  # type: ignore[attr-defined]
    for layer in range(arch.num_layers):
        p = f"blk.{layer}."
        h = norm(x, p + "attn_norm.weight")
        q, k, v = (linears(h, f"{p}attn_{n}.weight", mode) for n in "qkv")
        q = check._rope(q.reshape(length, arch.num_heads, d), cos, sin, arch.rope_interleaved)
        k = check._rope(k.reshape(length, arch.num_kv_heads, d), cos, sin, arch.rope_interleaved)
        v = v.reshape(length, arch.num_kv_heads, d)
        heads = []
        for head in range(arch.num_heads):
            scores = q[:, head] @ k[:, head // group].T / np.sqrt(d) + causal
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            heads.append(probs / probs.sum(-1, keepdims=True) @ v[:, head // group])
        x = x + linears(np.concatenate(heads, -1), p + "attn_output.weight", mode)
        h = norm(x, p + "ffn_norm.weight")
        gate, up = (linears(h, f"{p}ffn_{n}.weight", mode) for n in ("gate", "up"))
        x = x + linears(gate / (1 + np.exp(-gate)) * up, p + "ffn_down.weight", mode)
    head = "token_embd.weight" if arch.tied_embeddings else "output.weight"
    return linears(norm(x, "output_norm.weight"), head, mode)


def main() -> None:
    parser = harness.argument_parser(__doc__)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("tokenizer", type=Path, help="a bundle's tokenizer.json")
    parser.add_argument("--positions", type=int, default=700)
    parser.add_argument("--modes", default="exact,llama,mlas,mlas_qsum")
    args = parser.parse_args()
    lines = harness.JsonLines(args.jsonl)
    from llama_cpp import Llama
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    texts = agreement_texts(3000)
    sequences = [tokenizer.encode(text).ids[: args.positions] for text in texts]
    llm = Llama(model_path=str(args.gguf), n_ctx=1024, logits_all=True, n_threads=2, verbose=False)
    theirs = []
    for ids in sequences:
        llm.reset()
        llm.eval(ids)
        theirs.append(np.array(llm.scores[: len(ids)], copy=True))  # the buffer is reused
    source = open_gguf(args.gguf)
    linears = Linears(source)
    for mode in args.modes.split(","):
        agree = positions = 0
        margins: list[float] = []
        for ids, reference in zip(sequences, theirs, strict=True):
            same = forward(source, linears, ids, mode).argmax(-1) == reference.argmax(-1)
            top2 = np.sort(reference, -1)[:, -2:]
            margins += [round(float(v), 3) for v in (top2[:, 1] - top2[:, 0])[~same]]
            agree += int(same.sum())
            positions += len(ids)
        line = {"mode": mode, "top1_agreement": round(agree / positions, 4), "positions": positions}
        lines.write({**line, "llama_cpp_margin_where_parted": sorted(margins)})


if __name__ == "__main__":
    main()
