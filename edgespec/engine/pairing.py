"""Can a draft bundle serve a target bundle? Tokenizer compatibility, checked before loading.

Speculation compares token ids, so draft and target must map ids to the same strings. An
identical tokenizer (same canonical hash) always passes. Otherwise the rules the field uses
(llama.cpp's ``common_speculative_are_compatible``, transformers' assisted generation) apply:
same vocabulary type, vocabulary sizes within ``MAX_VOCAB_SIZE_DIFFERENCE``, identical special
tokens, and identical token strings for every id both vocabularies hold.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgespec.manifest import Bundle, load_bundle

MAX_VOCAB_SIZE_DIFFERENCE = 128
#: Token ids whose strings fingerprint a vocabulary (:func:`vocabulary_fingerprint`).
FINGERPRINT_IDS = 32_000


def vocabulary_fingerprint(bundle: Bundle) -> str:
    """sha256 of the token strings of ids 0 .. ``FINGERPRINT_IDS`` - 1 (all of a smaller
    vocabulary): models of one family share it whatever their size, and padding or added
    tokens past those ids do not change it. It finds a catalog draft for a target cheaply;
    :func:`check_pair` still decides."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(bundle.tokenizer_path))
    digest = hashlib.sha256()
    for token_id in range(min(FINGERPRINT_IDS, tokenizer.get_vocab_size(with_added_tokens=True))):
        digest.update((tokenizer.id_to_token(token_id) or "").encode("utf-8") + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True, kw_only=True)
class PairCheck:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True, kw_only=True)
class PairReport:
    """``compatible`` is the verdict; ``reason`` names the first failed check, or why it passed."""

    draft: str
    target: str
    compatible: bool
    identical_tokenizer: bool
    reason: str
    checks: tuple[PairCheck, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_pair(draft: str | Path | Bundle, target: str | Path | Bundle) -> PairReport:
    """Checks that ``draft`` can propose tokens for ``target``; BundleError on bad bundles."""
    draft_bundle = draft if isinstance(draft, Bundle) else load_bundle(draft)
    target_bundle = target if isinstance(target, Bundle) else load_bundle(target)
    checks = (
        [_identical_check(draft_bundle, target_bundle)]
        if draft_bundle.manifest.tokenizer.sha256 == target_bundle.manifest.tokenizer.sha256
        else _compatibility_checks(draft_bundle, target_bundle)
    )
    failed = next((check for check in checks if not check.passed), None)
    return PairReport(
        draft=str(draft_bundle.root),
        target=str(target_bundle.root),
        compatible=failed is None,
        identical_tokenizer=checks[0].name == "identical_tokenizer",
        reason=(failed or checks[-1]).detail,
        checks=tuple(checks),
    )


def _identical_check(draft: Bundle, target: Bundle) -> PairCheck:
    digest = target.manifest.tokenizer.sha256
    return PairCheck(
        name="identical_tokenizer",
        passed=True,
        detail=f"identical tokenizers (sha256 {digest[:12]}…)",
    )


def _compatibility_checks(draft: Bundle, target: Bundle) -> list[PairCheck]:
    d_tok, t_tok = draft.manifest.tokenizer, target.manifest.tokenizer
    d_model, t_model = draft.manifest.model, target.manifest.model
    checks = [
        PairCheck(
            name="vocab_type",
            passed=d_tok.vocab_type == t_tok.vocab_type,
            detail=f"vocabulary type is {d_tok.vocab_type} in the draft and {t_tok.vocab_type} "
            "in the target",
        ),
        _size_check("tokenizer_vocab_size", d_tok.vocab_size, t_tok.vocab_size),
        _size_check("model_vocab_size", d_model.vocab_size, t_model.vocab_size),
    ]
    special_pairs = [
        ("bos_token_id", d_tok.bos_token_id, t_tok.bos_token_id),
        ("eos_token_ids", d_tok.eos_token_ids, t_tok.eos_token_ids),
        ("pad_token_id", d_tok.pad_token_id, t_tok.pad_token_id),
        ("add_bos_token", d_tok.add_bos_token, t_tok.add_bos_token),
        ("special_tokens", d_tok.special_tokens, t_tok.special_tokens),
    ]
    first_special = next((p for p in special_pairs if p[1] != p[2]), None)
    checks.append(
        PairCheck(name="special_tokens", passed=True, detail="special tokens are identical")
        if first_special is None
        else PairCheck(
            name="special_tokens",
            passed=False,
            detail=f"{first_special[0]} is {first_special[1]!r} in the draft and "
            f"{first_special[2]!r} in the target",
        )
    )
    checks.append(_token_strings_check(draft, target))
    if all(check.passed for check in checks):
        checks.append(
            PairCheck(
                name="compatible_tokenizers",
                passed=True,
                detail="different tokenizer files, but the vocabularies agree on every shared id",
            )
        )
    return checks


def _size_check(name: str, draft_size: int, target_size: int) -> PairCheck:
    difference = abs(draft_size - target_size)
    return PairCheck(
        name=name,
        passed=difference <= MAX_VOCAB_SIZE_DIFFERENCE,
        detail=f"{name.replace('_', ' ')} is {draft_size} in the draft and {target_size} in the "
        f"target (difference {difference}, at most {MAX_VOCAB_SIZE_DIFFERENCE} allowed)",
    )


def _token_strings_check(draft: Bundle, target: Bundle) -> PairCheck:
    from tokenizers import Tokenizer

    draft_tokenizer = Tokenizer.from_file(str(draft.tokenizer_path))
    target_tokenizer = Tokenizer.from_file(str(target.tokenizer_path))
    shared = min(
        draft_tokenizer.get_vocab_size(with_added_tokens=True),
        target_tokenizer.get_vocab_size(with_added_tokens=True),
    )
    for token_id in range(shared):
        draft_token = draft_tokenizer.id_to_token(token_id)
        target_token = target_tokenizer.id_to_token(token_id)
        if draft_token != target_token:
            return PairCheck(
                name="token_strings",
                passed=False,
                detail=f"token id {token_id} is {draft_token!r} in the draft and "
                f"{target_token!r} in the target",
            )
    return PairCheck(
        name="token_strings",
        passed=True,
        detail=f"all {shared} shared token ids map to the same strings",
    )


def check_head(head: Bundle, target: Bundle) -> str | None:
    """Why ``head`` cannot draft for ``target`` (None when it can): it must be a head, made
    for the very file the target was imported from, and the target must return features."""
    record = head.manifest.extra.get("head")
    if not isinstance(record, dict) or head.manifest.graph.feature_input is None:
        return "it is not a head (edgespec distill --head makes one)"
    made_for = record.get("target", {})
    if made_for.get("source_sha256") != target.manifest.source.config_sha256:
        return (
            f"it was made for {made_for.get('bundle', 'another model')}, not for the file "
            f"{target.manifest.source.model}"
        )
    if made_for.get("hidden_size") != target.manifest.model.hidden_size:
        return "its feature width differs from the target's hidden size"
    if target.manifest.graph.features is None:
        return "the target returns no features (imported by an older edgespec: import it again)"
    return None
