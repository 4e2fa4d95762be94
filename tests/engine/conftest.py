"""The engine tier's fixtures: engines over the exported tiny pairs, loaded once per module."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from edgespec.api import Engine
from edgespec.manifest import load_bundle


@pytest.fixture(scope="module")
def engines(exported: Callable[..., Path]) -> Callable[[str, str], Engine]:
    """``engines(arch, quant)``: that target with the tiny Mistral draft (shared tokenizer)."""
    cache: dict[tuple[str, str], Engine] = {}

    def get(architecture: str, quant: str) -> Engine:
        if (architecture, quant) not in cache:
            target = exported(architecture, quant)
            assert load_bundle(target).manifest.verification.batch_invariant
            cache[(architecture, quant)] = Engine.load(
                target=target, draft=exported("mistral", "fp32")
            )
        return cache[(architecture, quant)]

    return get
