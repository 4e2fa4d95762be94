"""A function run in a fresh interpreter that imports the function's own module and nothing
of the caller's script.

multiprocessing's ``spawn`` runs the caller's main script again in the child. A user's script
without an ``if __name__ == "__main__":`` guard (``Engine.load(model=...)`` at its top level,
the first use of a catalog model) then starts a second import of the same model in the
child, which waits forever for the lock the first import holds. ``python -c`` with the
function named by its module and name runs only that function.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The child: the parent's import path, the function by module and name, its arguments, all
#: from standard input; its result pickled into the file named by its one argument.
_CHILD = """
import importlib, pickle, sys
path, module, name, args = pickle.load(sys.stdin.buffer)
sys.path[:] = path
result = getattr(importlib.import_module(module), name)(*args)
with open(sys.argv[1], "wb") as out:
    pickle.dump(result, out)
"""


@dataclass(frozen=True, kw_only=True)
class ChildResult:
    """How the child ended (``exitcode``: 0, a status, or -N for signal N, as
    multiprocessing reports it) and what the function returned (None unless it exited 0)."""

    exitcode: int
    value: Any = None


def run_in_child(function: Callable[..., Any], *args: Any) -> ChildResult:
    """``function(*args)`` (a module-level function; arguments and result picklable) in a
    fresh interpreter; its output goes where this process's goes."""
    payload = pickle.dumps((list(sys.path), function.__module__, function.__name__, args))
    with tempfile.TemporaryDirectory() as scratch:
        result_path = Path(scratch) / "result.pickle"
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(result_path)], input=payload, check=False
        )
        if done.returncode != 0 or not result_path.is_file():
            return ChildResult(exitcode=done.returncode)
        return ChildResult(exitcode=0, value=pickle.loads(result_path.read_bytes()))
