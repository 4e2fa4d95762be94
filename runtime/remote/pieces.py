"""The draft tokenizer's token texts the way OpenAI-compatible engines name tokens in
log-probabilities (``TokenPieces``): by text, or by id as ``token_id:N``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

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
