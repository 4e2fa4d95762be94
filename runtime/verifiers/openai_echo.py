"""How an OpenAI-compatible engine's echoed completion names tokens, and where our tokens sit
in it: the token texts of our tokenizer (``TokenPieces``), the parsed echo (``Echo``) and the
alignment of a token sequence with it (``align``). Used by ``openai_compat``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgespec.errors import OpenAIMismatchError, RemoteError

#: How engines that return token ids name a token in log-probabilities (vLLM).
TOKEN_ID_KEY = re.compile(r"token_id:(\d+)")
#: What a byte-level decoder yields for bytes that are not a whole UTF-8 character.
REPLACEMENT_CHARACTER = "\ufffd"


class TokenPieces:
    """Each token's text the way engines name tokens in log-probabilities: its bytes decoded
    as UTF-8 with the invalid bytes left out (llama-cpp-python's ``errors="ignore"``).

    ``tokenizer`` is a ``tokenizers.Tokenizer`` (the draft's, which must be the engine's)."""

    def __init__(
        self, tokenizer: Any, *, bos_ids: Sequence[int] = (), eos_ids: Sequence[int] = ()
    ) -> None:
        self.tokenizer = tokenizer
        self.bos_ids = frozenset(bos_ids)
        self.eos_ids = tuple(eos_ids)
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        decoded = tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
        self.pieces = [text.replace(REPLACEMENT_CHARACTER, "") for text in decoded]
        self._by_piece: dict[str, list[int]] = {}
        # Tokens of whole characters first: a token holding part of a character has the
        # text of its whole-character prefix, so it is only the second guess for that text.
        for index in sorted(range(size), key=lambda i: REPLACEMENT_CHARACTER in decoded[i]):
            self._by_piece.setdefault(self.pieces[index], []).append(index)

    def text(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=False))

    def matches(self, key: str, token: int) -> bool:
        """Whether the engine's name ``key`` for a token is ``token``."""
        named = TOKEN_ID_KEY.fullmatch(key)
        return int(named.group(1)) == token if named else self.pieces[token] == key

    def candidates(self, key: str) -> list[int]:
        """The tokens the engine may mean by ``key``: one for a token id or a text only one
        token has; several, whole characters first, for a text that several tokens share."""
        named = TOKEN_ID_KEY.fullmatch(key)
        return [int(named.group(1))] if named else list(self._by_piece.get(key, ()))


@dataclass(frozen=True, kw_only=True)
class Echo:
    """An echoed completion: per entry, the engine's token name, its log-probability and the
    top tokens there (None where the engine gives none, the first entry)."""

    tokens: tuple[str, ...]
    token_logprobs: tuple[float | None, ...]
    top_logprobs: tuple[dict[str, float] | None, ...]
    finish_reason: str | None

    @classmethod
    def from_json(cls, data: Any) -> Echo:
        try:
            choice = data["choices"][0]
            logprobs = choice["logprobs"]
            tokens = tuple(str(t) for t in logprobs["tokens"])
            token_logprobs = tuple(
                None if v is None else float(v) for v in logprobs["token_logprobs"]
            )
            top_logprobs = tuple(
                None if top is None else {str(k): float(v) for k, v in top.items()}
                for top in logprobs["top_logprobs"]
            )
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            raise RemoteError(
                f"the engine's completion has no usable prompt log-probabilities ({error!r})",
                fix="verify on llama.cpp's llama-server, vLLM, 'edgespec serve', or an engine "
                "that echoes prompts with logprobs on /v1/completions (llama-cpp-python: "
                "start it with --logits_all true)",
            ) from error
        if not len(tokens) == len(token_logprobs) == len(top_logprobs):
            raise RemoteError("the engine's log-probability lists differ in length")
        return cls(
            tokens=tokens,
            token_logprobs=token_logprobs,
            top_logprobs=top_logprobs,
            finish_reason=choice.get("finish_reason"),
        )


@dataclass(frozen=True, kw_only=True)
class Alignment:
    """Where our tokens sit in an echo. ``matched``: how many leading positions the engine
    echoed as our tokens. ``entries``: the echo entry of each of those positions and of the
    first differing one, whose top tokens still depend on our tokens alone (causality)."""

    matched: int
    entries: dict[int, int]


def align(sequence: Sequence[int], echo: Echo, pieces: TokenPieces) -> Alignment:
    """Lines ``sequence`` up with ``echo``: engines list every prompt token (vLLM) or every
    one but BOS (llama-cpp-python), then the next token."""
    best = Alignment(matched=-1, entries={})
    for hidden in (frozenset(), pieces.bos_ids):
        shown = [i for i, token in enumerate(sequence) if token not in hidden]
        count = 0
        while count < min(len(shown), len(echo.tokens)) and pieces.matches(
            echo.tokens[count], sequence[shown[count]]
        ):
            count += 1
        matched = shown[count] if count < len(shown) else len(sequence)
        if matched > best.matched:
            last = min(count + 1, len(shown), len(echo.tokens))
            best = Alignment(matched=matched, entries={shown[e]: e for e in range(last)})
    return best


def history_mismatch(
    position: int, sequence: Sequence[int], pieces: TokenPieces
) -> OpenAIMismatchError:
    return OpenAIMismatchError(
        f"the engine tokenized the committed text differently from us at position {position} "
        f"(our token {pieces.pieces[sequence[position]]!r}): a text-prompt engine re-tokenizes "
        "what it is sent, and the target's own tokens here are not that tokenization",
        fix="serve the target on an engine that takes token-id prompts (vLLM), or on "
        "'edgespec serve'",
    )


def top_token(entry: dict[str, float]) -> tuple[str, float]:
    return max(entry.items(), key=lambda item: item[1])
