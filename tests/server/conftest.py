"""Fixtures the real-engine tiers share: the draft edgespec ships for SmolLM2."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def shipped_draft() -> Path:
    """The draft edgespec ships for SmolLM2 (converted once, then cached)."""
    from edgespec.models.bundles import draft_bundle
    from edgespec.models.catalog import default_model

    bundle = draft_bundle(default_model())
    assert bundle is not None
    return bundle.root
