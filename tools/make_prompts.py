"""Writes the fixed benchmark prompt sets ``benchmarks/prompts/{code,edit,chat-edit}.json``.

    python tools/make_prompts.py

The prompts come from installed third-party packages that are not in the built-in pair's
training corpus (the Python standard library): click, jinja2 and packaging (BSD-3-Clause,
BSD-3-Clause, Apache-2.0/BSD-2-Clause). The output is committed; rerunning with other versions
of those packages gives other prompts, so the versions are recorded in the files.

- ``code``: a function's ``def`` line and docstring, cut where its body starts (the model
  writes the body).
- ``edit``: a whole short function, then the same signature under a new name and the body's
  first line (the answer repeats much of the prompt: the prompt-lookup drafter's workload).
- ``chat-edit``: the same functions (their first 14 lines) in a chat request to rewrite them
  with type hints and a docstring, for instruction models (``"chat": true``: the bench applies
  the chat template).

``chat.json`` (general chat requests) is written by hand.

``benchmarks/prompts`` links to ``edgespec/data/prompts`` so the sets ship in the wheel and
``edgespec bench --prompts code|edit`` finds them after ``pip install``.
"""

from __future__ import annotations

import ast
import json
from importlib import metadata, util
from pathlib import Path

PACKAGES = {"click": 12, "jinja2": 12, "packaging": 8}
EDIT_PER_PACKAGE = {"click": 5, "jinja2": 5, "packaging": 4}
OUT = Path(__file__).resolve().parent.parent / "benchmarks" / "prompts"
EDIT_REQUEST = "Rewrite this Python function with type hints and a docstring. Keep its logic.\n\n"
EDIT_LINES = 14


def _functions(package: str) -> list[tuple[str, ast.FunctionDef, list[str]]]:
    spec = util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.FunctionDef) and node.col_offset == 0:
                found.append((f"{package}/{path.relative_to(root).as_posix()}", node, lines))
    return sorted(found, key=lambda item: (item[0], item[1].lineno))


def _code_prompt(node: ast.FunctionDef, lines: list[str]) -> str | None:
    body = node.body
    if not (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
        return None
    if len(body) < 2 or (node.end_lineno or 0) - body[1].lineno < 2:
        return None
    start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
    head = lines[start : body[0].end_lineno]
    indent = lines[body[1].lineno - 1][: body[1].col_offset]
    text = "\n".join(head) + "\n" + indent
    return text if len(text) <= 900 else None


def _edit_prompt(node: ast.FunctionDef, lines: list[str]) -> str | None:
    if node.decorator_list or not 6 <= (node.end_lineno or 0) - node.lineno <= 20:
        return None
    source = lines[node.lineno - 1 : node.end_lineno]
    first_body = node.body[0].lineno - node.lineno
    renamed = [source[0].replace(f"def {node.name}(", f"def {node.name}_v2(", 1)]
    copy_head = renamed + source[1 : first_body + 1]
    return "\n".join(source) + "\n\n\n" + "\n".join(copy_head) + "\n"


def _chat_edit_prompt(edit_prompt: str) -> str:
    code = "\n".join(edit_prompt.splitlines()[:EDIT_LINES])
    return f"{EDIT_REQUEST}```python\n{code}\n```"


def main() -> None:
    code, edit = [], []
    for package, count in PACKAGES.items():
        version = metadata.version(package)
        functions = _functions(package)
        for name, node, lines in functions:
            if sum(p["source"].startswith(package) for p in code) < count:
                prompt = _code_prompt(node, lines)
                if prompt:
                    code.append(
                        {"source": f"{name}:{node.name} ({package} {version})", "prompt": prompt}
                    )
        for name, node, lines in functions:
            if sum(p["source"].startswith(package) for p in edit) < EDIT_PER_PACKAGE[package]:
                prompt = _edit_prompt(node, lines)
                if prompt:
                    edit.append(
                        {"source": f"{name}:{node.name} ({package} {version})", "prompt": prompt}
                    )
    chat_edit = [
        {"source": item["source"], "chat": True, "prompt": _chat_edit_prompt(item["prompt"])}
        for item in edit
    ]
    OUT.mkdir(exist_ok=True)
    for name, prompts in (("code", code), ("edit", edit), ("chat-edit", chat_edit)):
        (OUT / f"{name}.json").write_text(json.dumps(prompts, indent=1) + "\n")
        print(f"{name}: {len(prompts)} prompts")


if __name__ == "__main__":
    main()
