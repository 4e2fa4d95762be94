"""How many texts the GGUF importer's rebuilt tokenizer splits exactly as llama.cpp does.

For each GGUF file (a full model or one of llama.cpp's vocabulary-only ``ggml-vocab-*.gguf``),
builds the tokenizer the importer writes and compares its tokens with llama-cpp-python's
(``vocab_only``, special tokens parsed, no BOS) on every text of
``tests/fixtures/tokenizer_corpus.json`` and, beside a vocabulary file, its ``.gguf.inp``.
Prints one line per file: its pre-tokenizer and ``identical/total``; ``--show`` prints the
first differing texts too.

    python benchmarks/tokenizer_vs_llama_cpp.py FILE.gguf [FILE.gguf ...] [--show 3]
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import harness

CORPUS = harness.ROOT / "tests" / "fixtures" / "tokenizer_corpus.json"
SEPARATOR = "\n__ggml_vocab_test__\n"


def texts_for(path: Path) -> list[str]:
    texts = list(json.loads(CORPUS.read_text(encoding="utf-8"))["texts"])
    inputs = path.with_name(path.name + ".inp")
    if inputs.is_file():
        texts += inputs.read_text(encoding="utf-8").split(SEPARATOR)
    return texts


def compare(path: Path, show: int) -> str:
    import llama_cpp
    from gguf import GGUFReader

    from edgespec.export.gguf.tokenizer import build_tokenizer

    fields = GGUFReader(str(path)).fields
    pre = fields["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in fields else None
    kind = fields["tokenizer.ggml.model"].contents()
    built = build_tokenizer(SimpleNamespace(fields=fields, path=path))
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    texts = texts_for(path)
    differing = []
    for text in texts:
        ours = built.tokenizer.encode(text, add_special_tokens=False).ids
        theirs = llm.tokenize(text.encode(), add_bos=False, special=True)
        if ours != theirs:
            differing.append(f"    {text[:50]!r}: ours {ours[:12]}, llama.cpp {theirs[:12]}")
    line = f"{path.name}  {kind}/{pre}  {len(texts) - len(differing)}/{len(texts)} identical"
    return "\n".join([line, *differing[:show]])


def main() -> None:
    parser = harness.argument_parser(__doc__, part="paragraph", jsonl=False)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--show", type=int, default=0, help="differing texts to print per file")
    args = parser.parse_args()
    for path in args.files:
        try:
            print(compare(path, args.show), flush=True)
        except Exception as error:  # one file's refusal must not hide the others' figures
            print(f"{path.name}  error: {str(error).splitlines()[0][:160]}", flush=True)


if __name__ == "__main__":
    main()
