"""The import's child processes (its resident-memory reading, llama.cpp's logits) run only
the function they are given: a user's script is not run again in them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from edgespec.export.child_process import run_in_child


def test_a_script_without_a_main_guard_runs_once(tmp_path: Path) -> None:
    """multiprocessing's spawn would run this script's top level again in the child (where a
    first import of a catalog model waits forever for the parent's lock); here it runs once,
    and the child's result comes back."""
    marker = tmp_path / "runs.txt"
    script = tmp_path / "script.py"
    script.write_text(
        "import os, sys\n"
        "from edgespec.export.child_process import run_in_child\n"
        "with open(sys.argv[1], 'a') as runs:\n"
        "    runs.write('ran\\n')\n"
        "child = run_in_child(os.getpid)\n"
        "print(child.exitcode, child.value != os.getpid())\n"
    )
    done = subprocess.run(
        [sys.executable, str(script), str(marker)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True"]
    assert marker.read_text().splitlines() == ["ran"]


def test_a_child_that_fails_reports_its_status_and_no_value() -> None:
    child = run_in_child(os.abort)
    assert child.exitcode < 0 and child.value is None
    assert run_in_child(sys.exit, 3).exitcode == 3
