"""Whether an OpenAI-compatible engine's tokenizer is the draft's: the probe text both
tokenize, compared id for id before any generation."""

from __future__ import annotations

from edgespec.errors import IncompatiblePairError, RemoteError
from edgespec.runtime.remote.transport import Peer

#: Text whose tokenization tells two tokenizers apart: code, digits, accents, CJK, emoji.
VOCABULARY_PROBE = (
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # 1234567 Grüße, "
    "東京 🙂\n\nThe quick brown fox jumps over the lazy dog."
)


def engine_ids(target: Peer, model: str = "") -> list[int] | None:
    """The engine's token ids of :data:`VOCABULARY_PROBE` (``POST /tokenize``), or None where
    it has no such route."""
    # One body both engines read: llama-server's "content"/"add_special", vLLM's "prompt"/
    # "add_special_tokens" (each ignores the other's fields).
    body = {
        "content": VOCABULARY_PROBE,
        "add_special": False,
        "model": model,
        "prompt": VOCABULARY_PROBE,
        "add_special_tokens": False,
    }
    exchange = target.request("POST", "/tokenize", body, retry=False)
    tokens = exchange.data.get("tokens") if isinstance(exchange.data, dict) else None
    if exchange.status != 200 or not isinstance(tokens, list):
        return None
    return [int(token["id"]) if isinstance(token, dict) else int(token) for token in tokens]


def probe_history(target: Peer, length: int = 32, model: str = "") -> list[int]:
    """``length`` token ids of the probe text by the engine's own tokenizer (repeated), the
    history a cost probe's rounds follow."""
    ids = engine_ids(target, model)
    if not ids:
        raise RemoteError(f"{target.peer} did not tokenize a probe text")
    return (ids * (length // len(ids) + 1))[:length]


def check_vocabulary(target: Peer, model: str, draft_ids: list[int]) -> None:
    """Raises :class:`IncompatiblePairError` when the engine tokenizes
    :data:`VOCABULARY_PROBE` into other ids than the draft's tokenizer (``draft_ids``): drafted
    token ids would then name other tokens there. Engines without ``/tokenize`` are not asked.
    """
    served = engine_ids(target, model)
    if served is None:
        return
    if served != draft_ids:
        first = next(
            (
                i
                for i, pair in enumerate(zip(served, draft_ids, strict=False))
                if len(set(pair)) > 1
            ),
            min(len(served), len(draft_ids)),
        )
        raise IncompatiblePairError(
            f"the served model's tokenizer is not the draft's: a probe text tokenizes into "
            f"{len(served)} ids there and {len(draft_ids)} here, first differing at token "
            f"{first}",
            fix="draft with a model of the served model's family (the same tokenizer), or "
            "serve the target the draft was made for",
        )
