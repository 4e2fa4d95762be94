"""Edit requests for the built-in mix: "rewrite this function ..." around functions of the
Python standard library, found on the machine that distils (nothing downloads).

An edit answer copies most of its prompt, which is where a draft (and prompt lookup) earns
the most; a draft trained on chat requests alone is rejected on such answers. The benchmark
sets quote click, jinja2 and packaging, never the standard library, so a draft trained on
these can be measured on them.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import numpy as np

#: Standard-library modules whose top-level functions and methods are quoted.
STDLIB_MODULES = (
    "argparse", "ast", "base64", "bisect", "calendar", "colorsys", "configparser", "csv",
    "difflib", "dis", "email.utils", "fnmatch", "fractions", "ftplib", "functools",
    "genericpath", "getopt", "gettext", "glob", "gzip", "heapq", "hmac", "html",
    "http.cookies", "imaplib", "inspect", "ipaddress", "json.decoder", "json.encoder",
    "locale", "logging", "mailbox", "mimetypes", "ntpath", "numbers", "operator",
    "optparse", "pathlib", "pdb", "pickle", "pkgutil", "platform", "plistlib", "posixpath",
    "pprint", "quopri", "random", "reprlib", "sched", "secrets", "shlex", "shutil",
    "smtplib", "socketserver", "statistics", "string", "tabnanny", "tarfile", "tempfile",
    "textwrap", "threading", "tokenize", "traceback", "urllib.parse", "uuid", "wave",
    "weakref", "webbrowser", "zipfile", "zipimport",
)  # fmt: skip
#: What the user asks for; the first is the benchmark's own wording (on other code).
EDIT_INSTRUCTIONS = (
    "Rewrite this Python function with type hints and a docstring. Keep its logic.",
    "Add comments to this Python function that explain each step.",
    "Rename the variables in this Python function to clearer names. Keep its logic.",
    "Refactor this Python function to be easier to read. Keep its behaviour.",
    "Add a docstring to this Python function.",
    "Rewrite this Python function with type hints. Keep its logic.",
    "Add error handling to this Python function.",
    "Explain what this Python function does, then show it with comments.",
)
#: Lines of a function quoted at most (the benchmark quotes 10 to 16).
MAX_LINES = 16
MIN_LINES = 4


def stdlib_functions(modules: tuple[str, ...] = STDLIB_MODULES) -> list[str]:
    """Source of each function (and method) of ``modules`` with ``MIN_LINES`` lines or more,
    dedented and cut to ``MAX_LINES``; modules missing on this Python are skipped."""
    found: list[str] = []
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        source = Path(spec.origin).read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = lines[node.lineno - 1 : (node.end_lineno or node.lineno)]
            if len(body) < MIN_LINES:
                continue
            indent = len(body[0]) - len(body[0].lstrip())
            found.append("\n".join(line[indent:] for line in body[:MAX_LINES]).rstrip())
    return found


def edit_requests(count: int, seed: int) -> list[str]:
    """``count`` edit requests (an instruction and a quoted function), drawn by ``seed``."""
    if count <= 0:
        return []
    functions = stdlib_functions()
    if not functions:
        return []
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(functions), size=min(count, len(functions)), replace=False)
    return [
        f"{EDIT_INSTRUCTIONS[int(rng.integers(len(EDIT_INSTRUCTIONS)))]}\n\n"
        f"```python\n{functions[int(i)]}\n```"
        for i in picks
    ]
