"""Streaming detokenisation and stop strings, independent of any model.

``TextStream`` turns committed token ids into text deltas that are safe to show (never half
a character); ``StopMatcher`` sits after it and cuts the text at the first stop string,
holding back any tail that could still grow into one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from edgespec.errors import ConfigError

#: What a byte-level decoder yields for bytes that are not (yet) a whole UTF-8 character.
REPLACEMENT_CHARACTER = "\ufffd"


class TextStream:
    """Incremental detokenisation of committed tokens.

    Two things make "decode the new tokens" wrong. Byte-level BPE can split one character
    across tokens, so the new tokens alone may end in (or start with) a partial character that
    decodes to U+FFFD. And many decoders decode a token differently at the start of a sequence
    than inside one (SentencePiece's leading space, for one). So each push decodes a window:
    ``ids[prefix_offset:]``, where ``ids[prefix_offset:read_offset]`` is already-emitted context
    and everything past ``read_offset`` is pending. The delta is the window's text beyond the
    context's text, emitted only when it does not end in U+FFFD; otherwise the pending tokens
    wait for the next push. A genuine trailing U+FFFD is therefore shown with the next token
    that ends in another character, or by ``finish()``.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._pieces: list[str] = []
        self._finished = False

    @property
    def text(self) -> str:
        """Everything emitted so far, ``finish()`` included."""
        return "".join(self._pieces)

    def push(self, token_ids: Sequence[int]) -> str:
        """Appends committed tokens and returns the text they finalised (may be empty)."""
        if self._finished:
            raise RuntimeError("push after finish(): start a new TextStream")
        self._ids.extend(int(token) for token in token_ids)
        if len(self._ids) == self._read_offset:
            return ""
        context_text = self._decode(self._prefix_offset, self._read_offset)
        window_text = self._decode(self._prefix_offset, len(self._ids))
        # Hold back while the tail is an unfinished character, or the new tokens add nothing
        # yet (a special token skipped, a byte that only starts a character).
        if len(window_text) <= len(context_text) or window_text.endswith(REPLACEMENT_CHARACTER):
            return ""
        delta = window_text[len(context_text) :]
        # The emitted pending tokens become the context for the next window.
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._pieces.append(delta)
        return delta

    def finish(self) -> str:
        """Returns whatever is still held back (a trailing U+FFFD included); ends the stream."""
        if self._finished:
            return ""
        self._finished = True
        context_text = self._decode(self._prefix_offset, self._read_offset)
        window_text = self._decode(self._prefix_offset, len(self._ids))
        delta = window_text[len(context_text) :]
        self._read_offset = len(self._ids)
        self._pieces.append(delta)
        return delta

    def _decode(self, start: int, stop: int) -> str:
        if start == stop:
            return ""
        return self._tokenizer.decode(
            self._ids[start:stop], skip_special_tokens=self._skip_special_tokens
        )


@dataclass(frozen=True)
class StopResult:
    """What ``StopMatcher.feed`` lets through: ``emit`` is safe to show; ``stopped`` says a
    stop string completed (``emit`` then ends just before it)."""

    emit: str
    stopped: bool


class StopMatcher:
    """Cuts streamed text at the first stop string, even one split across deltas.

    ``feed`` holds back the longest tail of the text that is a proper prefix of some stop
    string, because the next delta may complete it; everything before that tail can no longer
    be part of a match and is emitted. When several stop strings occur, the one that completes
    first wins (ties: the one that starts first, i.e. the longer). This is what a token-by-token
    loop would see, so the result does not depend on how the text was split into deltas.
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        # A bare string is a Sequence[str] too; iterating it would make each character a stop.
        if isinstance(stop_strings, str):
            raise ConfigError(
                f"stop strings must be a list of strings, got the string {stop_strings!r}",
                fix=f"pass [{stop_strings!r}]",
            )
        for stop in stop_strings:
            if not isinstance(stop, str) or not stop:
                raise ConfigError(
                    f"stop string {stop!r} is not a non-empty string",
                    fix="remove it or give the text that should end generation",
                )
        self._stop_strings = tuple(dict.fromkeys(stop_strings))
        self._longest = max((len(stop) for stop in self._stop_strings), default=0)
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        """Whether a stop string has completed; later feeds emit nothing."""
        return self._stopped

    def feed(self, delta: str) -> StopResult:
        """Adds ``delta``; returns the text now safe to show and whether a stop completed."""
        if self._stopped:
            return StopResult(emit="", stopped=True)
        text = self._held + delta
        cut = self._first_stop(text)
        if cut is not None:
            self._held = ""
            self._stopped = True
            return StopResult(emit=text[:cut], stopped=True)
        keep = self._partial_tail(text)
        self._held = text[len(text) - keep :]
        return StopResult(emit=text[: len(text) - keep], stopped=False)

    def flush(self) -> str:
        """Returns the held-back tail at the end of generation ("" after a stop)."""
        held, self._held = self._held, ""
        return "" if self._stopped else held

    def _first_stop(self, text: str) -> int | None:
        """Start of the stop string that ends first in ``text``, or None.

        Emitted text never holds the start of a match (``_partial_tail`` kept it back), so
        searching the held tail plus the new delta finds every match.
        """
        best: tuple[int, int] | None = None
        for stop in self._stop_strings:
            start = text.find(stop)
            if start >= 0:
                key = (start + len(stop), start)
                best = key if best is None else min(best, key)
        return None if best is None else best[1]

    def _partial_tail(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        for size in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[len(text) - size :]
            if any(stop.startswith(tail) for stop in self._stop_strings):
                return size
        return 0
