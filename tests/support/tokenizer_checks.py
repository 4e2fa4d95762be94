"""Tokenizers against llama.cpp's: the shared corpus and the comparison the tokenizer and
real-size tiers run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "tokenizer_corpus.json"


def corpus() -> list[str]:
    return list(json.loads(CORPUS.read_text(encoding="utf-8"))["texts"])


def tokenizer_disagreements(
    tokenizer_json: Path, path: Path, texts: list[str], llama_cpp: Any
) -> list[str]:
    """The texts on which ``tokenizer_json`` and llama.cpp's tokenizer of the GGUF ``path``
    differ, each with both tokenizations; the first text is also compared with the BOS token
    the file asks for."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    found = []
    for text in texts:
        ours = tokenizer.encode(text, add_special_tokens=False).ids
        theirs = llm.tokenize(text.encode(), add_bos=False, special=True)
        if ours != theirs:
            found.append(f"{text[:40]!r}: ours {ours[:16]}, llama.cpp {theirs[:16]}")
    ours = tokenizer.encode(texts[0]).ids
    theirs = llm.tokenize(texts[0].encode(), add_bos=True, special=True)
    if ours != theirs:
        found.append(f"with BOS {texts[0][:40]!r}: ours {ours[:8]}, llama.cpp {theirs[:8]}")
    return found
