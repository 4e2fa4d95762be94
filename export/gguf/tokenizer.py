"""The tokenizer of a GGUF file, rebuilt for the ``tokenizers`` library from its metadata.

GGUF stores a byte-level BPE vocabulary (``tokenizer.ggml.model`` "gpt2") as its token
strings, merges and token types, plus the name of the pre-tokenizer llama.cpp applies
(``tokenizer.ggml.pre``): a list of regular expressions, each cutting every piece the previous
ones left into its matches and the text between them, before BPE runs inside each piece. Each
name llama.cpp knows maps to one such list; ``PRE_TOKENIZERS`` holds the ones rebuilt here, and
any other name is refused (splitting with the wrong list changes the tokens: Qwen2's lets a
letter run start with one non-letter, so ``_intervals`` is one piece, where GPT-2's splits it).
A SentencePiece vocabulary ("llama": Llama 2, Mistral, TinyLlama, Gemma) comes as token
strings, scores and types, which llama.cpp tokenizes by repeatedly merging the adjacent pair
whose union is the highest-scoring token. That is BPE with one merge per way of splitting each
token in two, ranked by the token's score, over characters with byte fallback; "▁" stands for
a space, and with ``add_space_prefix`` one is put before the text and after every special
token. Control, user-defined and unknown tokens become special tokens (llama.cpp matches them
whole before anything else). BOS is prepended when the file's ``add_bos_token`` says so, or,
without that key, when llama.cpp's default for the vocabulary does (SentencePiece and Llama 3:
yes; SmolLM2's file says no), and the end-of-sequence ids are the file's ``eos_token_id`` and
``eot_token_id``: what llama.cpp uses, not what a later conversion guessed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.errors import UnsupportedModelError
from edgespec.export.gguf.reader import GGUFFile, field_value

#: llama.cpp's token types (llama_token_type): unknown, control and user-defined tokens are
#: matched whole, before BPE; byte tokens (<0x41>) are SentencePiece's byte fallback.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
SPACE = "\u2581"  # SentencePiece's "▁"
#: Bumped when the same GGUF file gives another tokenizer.json (caches of imported bundles key
#: on it with the graph revision). 2: each pre-tokenizer's own expressions, instead of GPT-2's
#: for every byte-level file.
TOKENIZER_REVISION = 2


#: Token texts llama.cpp makes control tokens whatever type the file gives them (it takes
#: them for end-of-generation markers), so it matches them whole in text.
END_MARKERS = frozenset(
    {
        *("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "</s>"),
        *("<|end_of_text|>", "<end_of_turn>", "<end_of_utterance>", "<eos>", "<turn|>"),
        *("<|return|>", "<|call|>", "<|calls|>", "<|flush|>", "<|tool_response>", "[e~["),
        *("<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<\uff5cend\u2581of\u2581sentence\uff5c>"),
    }
)
#: Fill-in-the-middle markers by role (``tokenizer.ggml.ROLE_token_id``): llama.cpp makes them
#: control tokens when the file names no token for the role.
FIM_MARKERS = {
    "fim_pre": (
        *("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<|code_prefix|>", "<|prefix|>"),
        *("<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>"),
    ),
    "fim_suf": (
        *("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<|code_suffix|>", "<|suffix|>"),
        *("<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>"),
    ),
    "fim_mid": (
        *("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<|code_middle|>", "<|middle|>"),
        *("<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>"),
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}


@dataclass(frozen=True, kw_only=True)
class PreTokenizer:
    """One of llama.cpp's byte-level pre-tokenizers: the ``tokenizer.ggml.pre`` names that
    select it and the expressions it splits text with, in order."""

    names: tuple[str, ...]
    splits: tuple[str, ...]
    #: A piece that is itself a token becomes that token without merging (llama.cpp's
    #: ``ignore_merges``; Llama 3's merges cannot rebuild every token of its vocabulary).
    ignore_merges: bool = False
    #: llama.cpp's ``add_bos`` when the file has no ``tokenizer.ggml.add_bos_token``.
    add_bos: bool = False


# The pieces of the expressions. Contractions are ASCII: llama.cpp matches them by code point
# (or lower-cased ASCII in the case-insensitive forms), never by Unicode case folding.
_CONTRACTIONS = "'s|'t|'re|'ve|'m|'ll|'d"
_ANY_CASE_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#: GPT-2's: a contraction, or one optional space before a run of letters, of digits, or of
#: other non-space characters; whitespace keeps its last space for the next word.
_GPT2 = _CONTRACTIONS + r"| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def _llama3_style(letter: str, digits: str) -> str:
    """Llama 3's shape, shared by Qwen2: a letter run may start with one character that is not
    a letter, digit or line break (``_intervals``, ``.append``); digit runs are cut to
    ``digits``; other characters take one space before and the line breaks after them; line
    breaks group with the whitespace before them. ``letter`` is what counts as a letter."""
    return (
        _ANY_CASE_CONTRACTIONS
        + rf"|[^\r\n{letter}\p{{N}}]?[{letter}]+|{digits}"
        + rf"| ?[^\s{letter}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )


#: DeepSeek LLM's letters: the Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee, Glagolitic,
#: Coptic, fullwidth and other scripts with letter case, as ranges of code points.
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
    "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
    "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943"
)
#: DeepSeek's punctuation: ASCII's, fullwidth forms of it, curly quotes, the ideographic space,
#: comma and full stop.
_DEEPSEEK_PUNCTUATION = "!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002"
#: CJK ideographs, Samaritan up to them, and Hangul, kept apart from other text. (Escapes, not
#: characters: some of these code points change under Unicode normalization.)
_DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"

#: The byte-level pre-tokenizers rebuilt here, each tested against llama.cpp's tokenizer on
#: its vocabulary (tests/real_models/test_tokenizer_llama_cpp.py); the names are llama.cpp's.
PRE_TOKENIZERS = (
    PreTokenizer(names=("gpt-2", "phi-2", "mpt", "olmo"), splits=(_GPT2,)),
    # SmolLM2, StarCoder and kin: every digit on its own, then GPT-2's.
    PreTokenizer(
        names=("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
        splits=(r"\p{N}", _GPT2),
    ),
    PreTokenizer(
        names=("llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"),
        splits=(_llama3_style(r"\p{L}", r"\p{N}{1,3}"),),
        ignore_merges=True,
        add_bos=True,
    ),
    PreTokenizer(
        names=("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"),
        splits=(_llama3_style(r"\p{L}", r"\p{N}"),),
    ),
    # GPT-4o's (Phi-4-mini, Llama 4): a word is an optional leading non-letter, then letters
    # other than a-z, then letters other than A-Z (or the two the other way round), then an
    # any-case contraction; digits in threes; punctuation keeps following newlines and
    # slashes. llama.cpp's form, whose lookaheads stand in for the letter case classes.
    PreTokenizer(
        names=("gpt-4o", "llama4", "kanana2", "talkie"),
        splits=(
            rf"[^\r\n\p{{L}}\p{{N}}]?((?=[\p{{L}}])([^a-z]))*((?=[\p{{L}}])([^A-Z]))+"
            rf"{_ANY_CASE_CONTRACTIONS}?"
            rf"|[^\r\n\p{{L}}\p{{N}}]?((?=[\p{{L}}])([^a-z]))+((?=[\p{{L}}])([^A-Z]))*"
            rf"{_ANY_CASE_CONTRACTIONS}?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
    ),
    # Qwen3.5: combining marks count as letters.
    PreTokenizer(names=("qwen35",), splits=(_llama3_style(r"\p{L}\p{M}", r"\p{N}"),)),
    PreTokenizer(
        names=("falcon",),
        splits=(r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    ),
    PreTokenizer(
        names=("deepseek-llm",),
        splits=(
            r"[\r\n]",
            rf"\s?[{_DEEPSEEK_LETTERS}]+",
            rf"\s?[{_DEEPSEEK_PUNCTUATION}]+",
            r"\s+$",
            _DEEPSEEK_CJK,
            r"\p{N}+",
        ),
    ),
    PreTokenizer(
        names=("deepseek-coder",),
        splits=(r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DEEPSEEK_CJK, r"\p{N}"),
    ),
    # What llama.cpp uses for a file without the key (it warns that quality suffers).
    PreTokenizer(
        names=("default",),
        splits=(r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    ),
)
_BY_NAME = {name: pre for pre in PRE_TOKENIZERS for name in pre.names}


def pre_tokenizer(name: str, file_name: str) -> PreTokenizer:
    """The pre-tokenizer ``tokenizer.ggml.pre`` names; an unknown one is one line naming it and
    the supported ones."""
    if name not in _BY_NAME:
        raise UnsupportedModelError(
            f"{file_name} uses the pre-tokenizer {name!r}, which the GGUF importer does not "
            f"rebuild; it supports {', '.join(_BY_NAME)}",
            fix="export the Hugging Face checkpoint with edgespec export MODEL_DIR instead",
        )
    return _BY_NAME[name]


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
    pre = None
    if kind == "gpt2":
        # llama.cpp reads a file without the key with its "default" expressions.
        name = str(field_value(fields, "tokenizer.ggml.pre", "")) or "default"
        pre = pre_tokenizer(name, source.path.name)
    tokens = [str(t) for t in field_value(fields, "tokenizer.ggml.tokens")]
    types = list(field_value(fields, "tokenizer.ggml.token_type", [NORMAL] * len(tokens)))
    if pre is None:
        tokenizer = _sentencepiece(fields, tokens, types)
    else:
        tokenizer = _byte_level_bpe(fields, tokens, pre)
    promoted = _promoted(fields)
    specials = [
        token
        for token, kind in zip(tokens, types, strict=True)
        if kind in (UNKNOWN, CONTROL, USER_DEFINED) or token in promoted
    ]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

    def token_id(key: str) -> int | None:
        value = field_value(fields, f"tokenizer.ggml.{key}")
        return None if value is None else int(value)

    bos, eos, eot = token_id("bos_token_id"), token_id("eos_token_id"), token_id("eot_token_id")
    add_bos = bool(
        field_value(fields, "tokenizer.ggml.add_bos_token", True if pre is None else pre.add_bos)
    )
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


def _promoted(fields: Any) -> frozenset[str]:
    """The texts llama.cpp makes control tokens in this file, whatever their type."""
    unnamed = [
        markers
        for role, markers in FIM_MARKERS.items()
        if field_value(fields, f"tokenizer.ggml.{role}_token_id") is None
    ]
    return END_MARKERS.union(*unnamed)


def _byte_level_bpe(fields: Any, tokens: list[str], pre: PreTokenizer) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    merges = [tuple(str(m).split(" ", 1)) for m in field_value(fields, "tokenizer.ggml.merges", [])]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges))
    # "isolated": the text between two matches is a piece too, as in llama.cpp.
    splits = [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in pre.splits]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
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
    # Compact, as export.bundle writes it (docs/benchmarks/export.md, "Export").
    built.tokenizer.save(str(root / "tokenizer.json"), pretty=False)
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
