"""The tokenizer of a GGUF file, rebuilt for the ``tokenizers`` library from its metadata.

GGUF stores a byte-level BPE vocabulary (``tokenizer.ggml.model`` "gpt2") as its token
strings, merges and token types, plus the name of the pre-tokenizer llama.cpp applies
(``tokenizer.ggml.pre``); or a SentencePiece vocabulary ("llama": Llama 2, Mistral, TinyLlama,
Gemma) as token strings, scores and types, which llama.cpp tokenizes by repeatedly merging the
adjacent pair whose union is the highest-scoring token. That is BPE with one merge per way of
splitting each token in two, ranked by the token's score, over characters with byte fallback;
"▁" stands for a space, and with ``add_space_prefix`` one is put before the text and after
every special token. Control and user-defined tokens become special tokens. BOS is prepended
only when the file says ``add_bos_token`` (SmolLM2's does not), and the end-of-sequence ids
are the file's ``eos_token_id`` and ``eot_token_id``: what llama.cpp uses, not what a later
conversion guessed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.errors import UnsupportedModelError
from edgespec.export.gguf.reader import GGUFFile, field_value

#: llama.cpp's token types (llama_token_type): control and user-defined tokens are matched
#: whole, before BPE; byte tokens (<0x41>) are SentencePiece's byte fallback.
NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6
SPACE = "\u2581"  # SentencePiece's "▁"
#: Pre-tokenizer splits by llama.cpp's ``tokenizer.ggml.pre`` name. Byte-level BPE with the
#: GPT-2 pattern serves "gpt-2"; SmolLM2's ("smollm") and Qwen's also split digits one by one.
SPLIT_DIGITS = frozenset({"smollm", "qwen2", "deepseek-llm", "llama-bpe"})


@dataclass(frozen=True, kw_only=True)
class GGUFTokenizer:
    """The written tokenizer and the facts the manifest records."""

    tokenizer: Any
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    add_bos_token: bool
    special_tokens: dict[str, str]
    chat_template: str | None


def build_tokenizer(source: GGUFFile) -> GGUFTokenizer:
    from tokenizers import AddedToken

    fields = source.fields
    kind = field_value(fields, "tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise UnsupportedModelError(
            f"{source.path.name} has a {kind!r} tokenizer; the GGUF importer reads byte-level "
            "BPE ('gpt2') and SentencePiece ('llama') vocabularies",
            fix="export the Hugging Face checkpoint with edgespec export MODEL_DIR instead",
        )
    tokens = [str(t) for t in field_value(fields, "tokenizer.ggml.tokens")]
    types = list(field_value(fields, "tokenizer.ggml.token_type", [NORMAL] * len(tokens)))
    tokenizer = (
        _byte_level_bpe(fields, tokens) if kind == "gpt2" else _sentencepiece(fields, tokens, types)
    )
    specials = [tokens[i] for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

    def token_id(key: str) -> int | None:
        value = field_value(fields, f"tokenizer.ggml.{key}")
        return None if value is None else int(value)

    bos, eos, eot = token_id("bos_token_id"), token_id("eos_token_id"), token_id("eot_token_id")
    add_bos = bool(field_value(fields, "tokenizer.ggml.add_bos_token", False))
    if add_bos and bos is not None:
        from tokenizers import processors

        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", special_tokens=[(tokens[bos], bos)]
        )
    named = {
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": token_id("padding_token_id"),
        "unk_token": token_id("unknown_token_id") if kind == "llama" else None,
    }
    return GGUFTokenizer(
        tokenizer=tokenizer,
        bos_token_id=bos,
        eos_token_ids=tuple(dict.fromkeys(i for i in (eos, eot) if i is not None)),
        pad_token_id=named["pad_token"],
        add_bos_token=add_bos,
        special_tokens={name: tokens[i] for name, i in named.items() if i is not None},
        chat_template=field_value(fields, "tokenizer.chat_template"),
    )


def _byte_level_bpe(fields: Any, tokens: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    merges = [tuple(str(m).split(" ", 1)) for m in field_value(fields, "tokenizer.ggml.merges", [])]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    splits: list[Any] = []
    if str(field_value(fields, "tokenizer.ggml.pre", "")) in SPLIT_DIGITS:
        splits.append(pre_tokenizers.Digits(individual_digits=True))
    splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(splits)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def sentencepiece_merges(
    tokens: list[str], scores: list[float], types: list[int]
) -> list[tuple[str, str]]:
    """Every split of a normal token into two normal tokens, as a BPE merge, highest-scoring
    union first (ties: the lower token id, then the earlier split)."""
    mergeable = {t: i for i, t in enumerate(tokens) if types[i] == NORMAL}
    ranked = []
    for token, index in mergeable.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-scores[index], index, cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _sentencepiece(fields: Any, tokens: list[str], types: list[int]) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = [float(s) for s in field_value(fields, "tokenizer.ggml.scores", [0.0] * len(tokens))]
    unknown = field_value(fields, "tokenizer.ggml.unknown_token_id")
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=sentencepiece_merges(tokens, scores, types),
            unk_token=None if unknown is None else tokens[int(unknown)],
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    # Normalizers run on each stretch of text between special tokens, as llama.cpp's prefix.
    steps = [normalizers.Replace(" ", SPACE)]
    decode = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if bool(field_value(fields, "tokenizer.ggml.add_space_prefix", True)):
        steps.insert(0, normalizers.Prepend(SPACE))
        decode.append(decoders.Strip(content=" ", left=1, right=0))
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.decoder = decoders.Sequence(decode)
    return tokenizer


def save_tokenizer_files(built: GGUFTokenizer, root: Path) -> list[str]:
    """tokenizer.json, tokenizer_config.json (chat template, special tokens) and, when the
    file has one, chat_template.jinja; returns the file names."""
    built.tokenizer.save(str(root / "tokenizer.json"), pretty=False)  # 2.2 MB, not 3.5 MB
    config = {
        "add_bos_token": built.add_bos_token,
        "chat_template": built.chat_template,
        **built.special_tokens,
    }
    (root / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    files = ["tokenizer.json", "tokenizer_config.json"]
    if built.chat_template:
        (root / "chat_template.jinja").write_text(built.chat_template, encoding="utf-8")
        files.append("chat_template.jinja")
    return files
