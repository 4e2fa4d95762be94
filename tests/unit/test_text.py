"""Streaming detokenisation and stop strings (tokenizers built in code, no models)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from edgespec.errors import ConfigError
from edgespec.runtime.text import REPLACEMENT_CHARACTER, StopMatcher, StopResult, TextStream

TEXTS = [
    "naïve café — 日本語 🙂",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding on edge devices: draft, verify, commit.",
    "Ünïcödé everywhere: 東京 🙂🚀 — done.",
]


@pytest.fixture(scope="module")
def byte_bpe() -> Tokenizer:
    # A small vocabulary leaves most multi-byte characters split across byte tokens.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=290,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "</s>"],
        show_progress=False,
    )
    tokenizer.train_from_iterator(TEXTS * 3, trainer)
    return tokenizer


@pytest.fixture(scope="module")
def metaspace() -> Tokenizer:
    """A SentencePiece-like tokenizer: a token decodes differently at the start of a text."""
    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "▁again": 3, "!": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    return tokenizer


def random_splits(ids: Sequence[int], rng: np.random.Generator) -> Iterator[list[int]]:
    """Cuts ``ids`` into consecutive chunks of random sizes, empty chunks included."""
    position = 0
    while position < len(ids):
        size = int(rng.integers(0, 4))
        yield list(ids[position : position + size])
        position += size


def stream_all(
    tokenizer: Tokenizer, chunks: Iterator[list[int]], *, skip_special_tokens: bool = True
) -> tuple[list[str], str, TextStream]:
    stream = TextStream(tokenizer, skip_special_tokens=skip_special_tokens)
    deltas = [stream.push(chunk) for chunk in chunks]
    return deltas, stream.finish(), stream


def test_fixture_splits_characters_across_tokens(byte_bpe: Tokenizer) -> None:
    ids = byte_bpe.encode(TEXTS[0]).ids
    assert any(REPLACEMENT_CHARACTER in byte_bpe.decode([token]) for token in ids)


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_join_to_the_full_decode_for_random_splits(byte_bpe: Tokenizer, text: str) -> None:
    ids = byte_bpe.encode(text).ids
    expected = byte_bpe.decode(ids)
    rng = np.random.default_rng(len(text))
    for _ in range(50):
        deltas, tail, stream = stream_all(byte_bpe, random_splits(ids, rng))
        assert "".join(deltas) + tail == expected
        assert stream.text == expected
        assert all(REPLACEMENT_CHARACTER not in delta for delta in deltas)


def test_partial_character_is_held_back(byte_bpe: Tokenizer) -> None:
    ids = byte_bpe.encode(TEXTS[0]).ids
    expected = byte_bpe.decode(ids)
    stream = TextStream(byte_bpe)
    for token in ids:
        delta = stream.push([token])
        assert REPLACEMENT_CHARACTER not in delta
        assert expected.startswith(stream.text)
    assert stream.finish() == ""
    assert stream.text == expected


def test_one_token_at_a_time_across_texts(byte_bpe: Tokenizer) -> None:
    ids = [token for text in TEXTS for token in byte_bpe.encode(text).ids]
    deltas, tail, _ = stream_all(byte_bpe, ([token] for token in ids))
    assert "".join(deltas) + tail == byte_bpe.decode(ids)
    assert all(REPLACEMENT_CHARACTER not in delta for delta in deltas)


def test_random_ids_with_invalid_bytes_still_join(byte_bpe: Tokenizer) -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        ids = rng.integers(0, byte_bpe.get_vocab_size(), size=40).tolist()
        deltas, tail, _ = stream_all(byte_bpe, random_splits(ids, rng))
        assert "".join(deltas) + tail == byte_bpe.decode(ids)


def test_genuine_replacement_character_is_released(byte_bpe: Tokenizer) -> None:
    text = f"a{REPLACEMENT_CHARACTER}b"
    ids = byte_bpe.encode(text).ids
    deltas, tail, _ = stream_all(byte_bpe, ([token] for token in ids))
    assert "".join(deltas) + tail == text
    stream = TextStream(byte_bpe)
    stream.push(byte_bpe.encode(f"x{REPLACEMENT_CHARACTER}").ids)
    assert stream.finish().endswith(REPLACEMENT_CHARACTER)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_special_tokens(byte_bpe: Tokenizer, skip_special_tokens: bool) -> None:
    ids = [
        byte_bpe.token_to_id("<s>"),
        *byte_bpe.encode(TEXTS[3]).ids,
        byte_bpe.token_to_id("</s>"),
    ]
    expected = byte_bpe.decode(ids, skip_special_tokens=skip_special_tokens)
    assert ("<s>" in expected) is not skip_special_tokens
    rng = np.random.default_rng(3)
    for _ in range(20):
        deltas, tail, _ = stream_all(
            byte_bpe, random_splits(ids, rng), skip_special_tokens=skip_special_tokens
        )
        assert "".join(deltas) + tail == expected


def test_context_dependent_decoding(metaspace: Tokenizer) -> None:
    ids = metaspace.encode("Hello world again world").ids
    assert metaspace.decode(ids[1:2]) == "world"  # alone, the leading space is dropped
    deltas, tail, _ = stream_all(metaspace, ([token] for token in ids))
    assert deltas == ["Hello", " world", " again", " world"]
    assert "".join(deltas) + tail == metaspace.decode(ids)


def test_push_after_finish_fails(byte_bpe: Tokenizer) -> None:
    stream = TextStream(byte_bpe)
    stream.push(byte_bpe.encode("abc").ids)
    stream.finish()
    assert stream.finish() == ""
    with pytest.raises(RuntimeError, match="finish"):
        stream.push([1])


def compositions(text: str) -> Iterator[list[str]]:
    """Every way to cut ``text`` into consecutive non-empty pieces."""
    for mask in itertools.product((False, True), repeat=len(text) - 1):
        pieces, start = [], 0
        for index, cut in enumerate(mask, start=1):
            if cut:
                pieces.append(text[start:index])
                start = index
        pieces.append(text[start:])
        yield pieces


def run_matcher(stop_strings: Sequence[str], pieces: Sequence[str]) -> tuple[list[str], bool, str]:
    matcher = StopMatcher(stop_strings)
    shown: list[str] = []
    stopped = False
    for piece in pieces:
        result = matcher.feed(piece)
        shown.append(result.emit)
        if result.stopped:
            stopped = True
            break
    return shown, stopped, matcher.flush()


def test_stop_string_split_in_every_way() -> None:
    text = "ab<|end|>cd"
    for pieces in compositions(text):
        shown, stopped, flushed = run_matcher(["<|end|>"], pieces)
        assert stopped
        assert "".join(shown) == "ab"
        assert flushed == ""
        assert all("<" not in emit for emit in shown)


def test_partial_stop_prefix_without_a_stop_is_released_in_every_way() -> None:
    text = "a<|en<|b<|"
    for pieces in compositions(text):
        shown, stopped, flushed = run_matcher(["<|end|>"], pieces)
        assert not stopped
        assert "".join(shown) + flushed == text


def test_hold_back_and_release() -> None:
    matcher = StopMatcher(["<|end|>"])
    assert matcher.feed("ab<|e") == StopResult(emit="ab", stopped=False)
    assert matcher.feed("x") == StopResult(emit="<|ex", stopped=False)
    assert matcher.feed("<") == StopResult(emit="", stopped=False)
    assert matcher.flush() == "<"


@pytest.mark.parametrize(
    ("stop_strings", "text", "shown"),
    [
        (["STOP", "END"], "xx END yy STOP", "xx "),
        (["END", "STOP"], "xx STOP yy END", "xx "),
        (["abcd", "bc"], "zabcd", "za"),  # "bc" completes first
        (["bcd", "abcd"], "zabcd", "z"),  # both complete together: the earlier start wins
    ],
)
def test_earliest_stop_wins_in_every_split(stop_strings: list[str], text: str, shown: str) -> None:
    for pieces in compositions(text):
        emitted, stopped, flushed = run_matcher(stop_strings, pieces)
        assert stopped
        assert "".join(emitted) == shown
        assert flushed == ""


def test_text_after_a_stop_is_never_emitted() -> None:
    matcher = StopMatcher(["\n\n"])
    assert matcher.feed("one\n\ntwo\n\nthree") == StopResult(emit="one", stopped=True)
    assert matcher.stopped
    assert matcher.feed("more") == StopResult(emit="", stopped=True)
    assert matcher.flush() == ""


def test_no_stop_strings_pass_through() -> None:
    matcher = StopMatcher([])
    assert matcher.feed("anything") == StopResult(emit="anything", stopped=False)
    assert matcher.flush() == ""


@pytest.mark.parametrize("stop_strings", [[""], ["ok", ""], "STOP"])
def test_invalid_stop_strings(stop_strings: Sequence[str]) -> None:
    with pytest.raises(ConfigError):
        StopMatcher(stop_strings)


def test_stream_into_matcher(byte_bpe: Tokenizer) -> None:
    """The two together: a stop string made of split bytes still cuts the text."""
    ids = byte_bpe.encode("naïve café — 日本語 🙂 tail").ids
    stream, matcher = TextStream(byte_bpe), StopMatcher(["日本"])
    shown = ""
    for token in ids:
        result = matcher.feed(stream.push([token]))
        shown += result.emit
        if result.stopped:
            break
    assert result.stopped
    assert shown == "naïve café — "
