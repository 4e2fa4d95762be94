"""A Qwen2-shaped GGUF of any size, with random weights and a real file's tokenizer, for
measuring the import's memory on models larger than those the package index holds.

    python tools/synthetic_gguf.py --like QWEN2.gguf --out qwen2-7b-shaped.gguf \
        [--embedding 3584 --feed-forward 18944 --heads 28 --kv-heads 4] [--seed 0]

Every metadata field of ``--like`` is copied (the tokenizer, the chat template, rope and norm
settings, the block count) except the shapes, which come from the options (the defaults are
Qwen2.5-7B's). Every tensor keeps its type in ``--like`` (so a Q4_K_M file gives a Q4_K_M mix:
Q6_K in the same layers' ``attn_v`` and ``ffn_down`` and in the output head) and gets random
blocks whose scales are set so that weights have a standard deviation of about 0.02 and the
forward stays finite. The text such a model writes is noise; its import runs every stage and
check a real file of the same size runs (parity against the file's weights is as exact as for
a real model; ``--min-top1`` may need lowering, as a random model's logits are near-ties).
Then ``python benchmarks/import_memory.py qwen2-7b-shaped.gguf --out DIR -- --min-top1 0``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.gguf_writer import WriterState

ARCHITECTURE = "qwen2"
#: (type) -> (offsets of float16 scale fields in a block, each field's value). Q4_K's block is
#: d, dmin (two float16), 12 bytes of 6-bit scales, 128 bytes of 4-bit codes; weights are
#: d * scale * q - dmin * min with q in 0..15 and scale, min in 0..63 (mean 31.5), so
#: d = 1.4e-4 gives a spread of about 0.02 and dmin = 7.5 d centres them. Q6_K's block ends
#: with d (float16) after 128 + 64 bytes of codes and 16 int8 scales; q - 32 in -32..31.
SCALE_FIELDS = {
    GGMLQuantizationType.Q4_K: ((0, 1.4e-4), (2, 1.05e-3)),
    GGMLQuantizationType.Q6_K: ((208, 2.0e-5),),
}


def _shape_map(reader: GGUFReader, args: argparse.Namespace) -> dict[int, int]:
    """Each dimension of --like's tensors -> the new model's."""

    def field(name: str) -> int:
        value = reader.get_field(f"{ARCHITECTURE}.{name}")
        if value is None:
            raise SystemExit(f"--like is not a {ARCHITECTURE} file: {name} is missing")
        return int(value.contents())

    embedding, heads = field("embedding_length"), field("attention.head_count")
    kv_heads, head_dim = field("attention.head_count_kv"), embedding // heads
    new_head_dim = args.embedding // args.heads
    return {
        embedding: args.embedding,
        field("feed_forward_length"): args.feed_forward,
        kv_heads * head_dim: args.kv_heads * new_head_dim,
    }


def _random_blocks(
    kind: GGMLQuantizationType, rows: int, columns: int, rng: np.random.Generator
) -> np.ndarray:
    """(rows, bytes per row) uint8 of random blocks with sane float16 scales."""
    block_size, type_size = GGML_QUANT_SIZES[kind]
    blocks = rows * (columns // block_size)
    data = rng.integers(0, 256, size=(blocks, type_size), dtype=np.uint8)
    if kind not in SCALE_FIELDS:
        raise SystemExit(f"{kind.name} is not among the types this script writes")
    for offset, value in SCALE_FIELDS[kind]:
        data[:, offset : offset + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return data.reshape(rows, -1)


def write(like: Path, out: Path, args: argparse.Namespace) -> int:
    reader = GGUFReader(like)
    dims = _shape_map(reader, args)
    writer = GGUFWriter(out, ARCHITECTURE)
    replaced = {
        f"{ARCHITECTURE}.embedding_length": args.embedding,
        f"{ARCHITECTURE}.feed_forward_length": args.feed_forward,
        f"{ARCHITECTURE}.attention.head_count": args.heads,
        f"{ARCHITECTURE}.attention.head_count_kv": args.kv_heads,
        "general.name": f"synthetic {ARCHITECTURE}, {args.embedding} wide",
        "general.size_label": "synthetic",
    }
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        value = replaced.get(field.name, field.contents())
        sub_type = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub_type)

    plan = []
    for tensor in reader.tensors:
        shape = [dims.get(int(d), int(d)) for d in tensor.shape]  # GGUF order: columns first
        kind = GGMLQuantizationType(tensor.tensor_type)
        plan.append((tensor.name, kind, shape))
        columns, rows = shape[0], int(np.prod(shape[1:]))
        if kind == GGMLQuantizationType.F32:
            nbytes, byte_shape = rows * columns * 4, [rows, columns][-len(shape) :]
            writer.add_tensor_info(tensor.name, byte_shape, np.dtype(np.float32), nbytes)
        else:
            block_size, type_size = GGML_QUANT_SIZES[kind]
            byte_shape = [rows, columns // block_size * type_size]
            nbytes = rows * byte_shape[1]
            writer.add_tensor_info(tensor.name, byte_shape, np.dtype(np.uint8), nbytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()

    rng = np.random.default_rng(args.seed)
    written = 0
    for index, (name, kind, shape) in enumerate(plan):
        columns, rows = shape[0], int(np.prod(shape[1:]))
        if kind == GGMLQuantizationType.F32:
            # norms near 1, biases near 0: (columns,) float32
            centre = 1.0 if name.endswith("norm.weight") else 0.0
            data = (centre + 0.02 * rng.standard_normal(rows * columns)).astype(np.float32)
        else:
            written += _write_in_slices(writer, kind, rows, columns, rng)
            if index % 20 == 0 or index == len(plan) - 1:
                print(
                    f"\r{index + 1}/{len(plan)} tensors, {written / 1e9:.2f} GB", end="", flush=True
                )
            continue
        writer.write_tensor_data(data)
        written += data.nbytes
    writer.close()
    print(f"\nwrote {out} ({out.stat().st_size / 1e9:.2f} GB)")
    return 0


def _write_in_slices(
    writer: GGUFWriter,
    kind: GGMLQuantizationType,
    rows: int,
    columns: int,
    rng: np.random.Generator,
) -> int:
    """Writes the next tensor's random blocks a slice of rows at a time (GGUFWriter's own
    write_tensor_data takes a whole tensor; an output head would be 0.3-1 GB at once)."""
    assert writer.fout is not None
    out = writer.fout[0]
    info = writer.tensors[0].pop(next(iter(writer.tensors[0])))
    writer.write_padding(out, out.tell())
    written = 0
    for start in range(0, rows, 8192):
        part = _random_blocks(kind, min(8192, rows - start), columns, rng)
        part.tofile(out)
        written += part.nbytes
    assert written == info.nbytes
    writer.write_padding(out, written)
    writer.state = WriterState.WEIGHTS
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--like", type=Path, required=True, help="a qwen2 GGUF to take from")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--embedding", type=int, default=3584)
    parser.add_argument("--feed-forward", type=int, default=18944)
    parser.add_argument("--heads", type=int, default=28)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return write(args.like, args.out, args)


if __name__ == "__main__":
    sys.exit(main())
