"""What drafts for a target named alone (a bundle or a GGUF file, no draft): the draft of the
catalog model of its vocabulary, found by its file or by a fingerprint of its tokens."""

from __future__ import annotations

from edgespec.engine.pairing import check_pair, vocabulary_fingerprint
from edgespec.manifest import Bundle
from edgespec.models import catalog
from edgespec.models.bundles import draft_bundle as draft_bundle_of
from edgespec.models.fetch import notify_stderr
from edgespec.models.store import Notify

#: Drafters that draft from no draft model: a target named alone gets no catalog draft.
MODEL_FREE_DRAFTERS = frozenset({"ngram", "none", "head"})
#: Drafters that read no head: none is loaded for them.
HEADLESS_DRAFTERS = frozenset({"model", "ngram", "none"})


def drafts_with_a_model(drafter: str | None) -> bool:
    return drafter not in MODEL_FREE_DRAFTERS


def catalog_draft_for(
    target: Bundle, *, verify_checksums: bool, notify: Notify = notify_stderr
) -> Bundle | None:
    """What drafts for a target named by its bundle or GGUF file and no draft: the draft of
    the catalog model of the same vocabulary (the file's own model, or another size of its
    family), fetched and made on first use, when it passes the pairing check; else None
    (prompt lookup drafts). Either way said in one line."""
    relative = catalog.drafting_relative(
        sha256=target.manifest.source.config_sha256, fingerprint=vocabulary_fingerprint(target)
    )
    name = target.root.name
    if relative is None:
        notify(
            f"edgespec: no catalog draft shares {name}'s vocabulary: prompt lookup drafts "
            "(pass --draft DIR|FILE.gguf to draft with a model)"
        )
        return None
    draft = draft_bundle_of(relative, verify_checksums=verify_checksums, notify=notify)
    if draft is None:
        return None
    report = check_pair(draft, target)
    if not report.compatible:
        notify(
            f"edgespec: {relative.name}'s draft does not fit {name} ({report.reason}): prompt "
            "lookup drafts"
        )
        return None
    notify(f"edgespec: drafting for {name} with {relative.name}'s draft ({relative.draft_label})")
    return draft
