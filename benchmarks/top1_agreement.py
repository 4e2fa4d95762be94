"""Teacher-forced top-1 agreement of bundles with a reference bundle of the same model.

    python benchmarks/top1_agreement.py REFERENCE BUNDLE [BUNDLE ...] [--positions 700]

For quantized exports against the float32 export of the same checkpoint (which matches
PyTorch within 1e-4): both read the texts of ``agreement_texts.json``, the start of this
project's README and runtime guide (``--positions`` tokens each, at most about 1,500; the
reference's tokenizer), 64 tokens per
pass, and the script prints, per bundle, the share of positions whose argmax equals the
reference's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf_vs_llama_cpp import agreement_texts
from tokenizers import Tokenizer

from edgespec.manifest import load_bundle
from edgespec.runtime.model import ModelOptions, OnnxModel

import harness


def logits(bundle: Path, sequences: list[list[int]], threads: int) -> list[np.ndarray]:
    model = OnnxModel(load_bundle(bundle), options=ModelOptions(intra_op_threads=threads))
    results = []
    for ids in sequences:
        cache = model.new_cache()
        passes = [np.array(model.forward(ids[s : s + 64], cache)) for s in range(0, len(ids), 64)]
        results.append(np.concatenate(passes))
    return results


def main() -> None:
    parser = harness.argument_parser(__doc__, threads=2)
    parser.add_argument("reference", type=Path)
    parser.add_argument("bundles", type=Path, nargs="+")
    parser.add_argument("--positions", type=int, default=700)
    args = parser.parse_args()
    lines = harness.JsonLines(args.jsonl)
    tokenizer = Tokenizer.from_file(str(args.reference / "tokenizer.json"))
    texts = agreement_texts(5 * args.positions)
    sequences = [tokenizer.encode(text).ids[: args.positions] for text in texts]
    reference = logits(args.reference, sequences, args.threads)
    for bundle in args.bundles:
        ours = logits(bundle, sequences, args.threads)
        agree = np.concatenate(
            [a.argmax(-1) == b.argmax(-1) for a, b in zip(ours, reference, strict=True)]
        )
        line = {
            "bundle": str(bundle),
            "top1_agreement": float(agree.mean()),
            "positions": agree.size,
        }
        lines.write(line)


if __name__ == "__main__":
    main()
