"""Drafts made of a model's own layers: a shallower copy of a GGUF (some of its blocks kept,
renumbered), in the catalog's draft form (a 32,768-token 4-bit head, 4-bit layers).

    python tools/layer_drafts.py SOURCE.gguf OUT.gguf --keep 0-2,5,8,11,25-27 \
        [--head 32768] [--full-layers]

With the 1.5B target as SOURCE this is self-speculation without training (the target's first,
last and some middle layers drafting for it); with the 0.5B it is a shallower draft. Import
the result with ``edgespec export OUT.gguf --out DIR``, then compare the drafts with
``python benchmarks/draft_forms.py TARGET DRAFT [DRAFT ...]`` (step, acceptance, pair speed).
The layers are copied, not shared with the target: a bundle of its own.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter


def parse_keep(text: str) -> list[int]:
    """ "0-2,5,8" -> [0, 1, 2, 5, 8]."""
    kept: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        kept += range(int(low), int(high or low) + 1)
    return sorted(set(kept))


def truncated_gguf(source: Path, out: Path, keep: list[int]) -> Path:
    """``source`` with only the blocks ``keep`` (renumbered 0..len-1) and its block count set
    to match; every other tensor and field as it was."""
    reader = GGUFReader(str(source))
    architecture = str(reader.fields["general.architecture"].contents())
    count_key = f"{architecture}.block_count"
    blocks = int(reader.fields[count_key].contents())
    if not keep or keep[-1] >= blocks:
        raise SystemExit(f"--keep must name blocks of 0..{blocks - 1}")
    renumber = {old: new for new, old in enumerate(keep)}
    writer = GGUFWriter(str(out), architecture)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        value = len(keep) if field.name == count_key else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for tensor in reader.tensors:
        match = re.match(r"blk\.(\d+)\.(.*)", tensor.name)
        name = tensor.name
        if match:
            if int(match.group(1)) not in renumber:
                continue
            name = f"blk.{renumber[int(match.group(1))]}.{match.group(2)}"
        writer.add_tensor(name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    from edgespec.export.draft_head import reduced_head_gguf
    from edgespec.models.catalog import DRAFT_HEAD_TYPE, DRAFT_REQUANTIZE

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--keep", required=True, help="blocks to keep: 0-2,5,8,25-27")
    parser.add_argument("--head", type=int, default=32768, help="draft head tokens (0: full)")
    args = parser.parse_args(argv)
    keep = parse_keep(args.keep)
    with tempfile.TemporaryDirectory(dir=args.out.parent) as folder:
        shallow = truncated_gguf(args.source, Path(folder) / "shallow.gguf", keep)
        if args.head:
            _, record = reduced_head_gguf(
                shallow,
                args.out,
                args.head,
                requantize=DRAFT_REQUANTIZE,
                head_type=DRAFT_HEAD_TYPE,
            )
            print(record["output_vocabulary_made_by"])
        else:
            shallow.replace(args.out)
    print(f"wrote {args.out}: blocks {keep} ({len(keep)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
