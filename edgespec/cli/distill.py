"""``edgespec distill``: train a draft for a target on the target's own outputs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from edgespec.cli.export import EXPORT_EXTRA_MODULES, check_extra


def add_distill_command(commands: Any) -> None:
    distill = commands.add_parser(
        "distill",
        help="train a small draft for a target on the target's own outputs ([export] extra)",
        description="Distill a draft for TARGET (a Hugging Face directory, a GGUF file, or a "
        "GGUF bundle): the target continues prompts greedily, the draft learns the target's "
        "next-token distribution, acceptance by draft position is measured on held-out "
        "samples, and the draft is exported to a verified bundle whose manifest records the "
        "distillation. Every stage resumes from OUT's work directory.",
    )
    distill.add_argument("target", metavar="TARGET", help="the target model")
    distill.add_argument("--out", required=True, type=Path, metavar="DIR", help="draft bundle")
    distill.add_argument(
        "--corpus",
        nargs="+",
        type=Path,
        default=(),
        metavar="FILE",
        help="text or JSONL ('prompt' or 'text' fields) to take prompts from (default: the "
        "built-in chat, chat-edit and code prompts)",
    )
    numbers = (
        ("--samples", int, 256, "prompts the target continues (a tenth held out)"),
        ("--prompt-tokens", int, 64, "tokens per prompt window"),
        ("--new-tokens", int, 64, "tokens the target adds to each prompt"),
        ("--steps", int, 400, "training steps"),
        ("--batch", int, 8, "samples per step"),
        ("--hidden", int, 256, "the draft's hidden size"),
        ("--layers", int, 4, "the draft's layers"),
        ("--heads", int, 4, "the draft's attention heads"),
        ("--kv-heads", int, 2, "the draft's KV heads"),
        ("--intermediate", int, None, "the draft's MLP width (768; a head: the target's)"),
        ("--lr", float, 1e-3, "peak learning rate"),
        ("--seed", int, 0, "seed of the data order, the draft's initialisation and batches"),
    )
    for flag, kind, default, text in numbers:
        distill.add_argument(flag, type=kind, default=default, help=f"{text} (default {default})")
    distill.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop training after this long, keep the checkpoint and export what is trained",
    )
    distill.add_argument(
        "--system-prompt",
        default=None,
        metavar="TEXT",
        help="system message of the built-in chat prompts (default: the chat template's own)",
    )
    distill.add_argument(
        "--self-prompts",
        type=int,
        default=None,
        metavar="N",
        help="add N user requests the target writes itself to the built-in prompts (default "
        "0; with --head 1024)",
    )
    distill.add_argument(
        "--edit-prompts",
        type=int,
        default=None,
        metavar="N",
        help="add N edit requests (rewrite, comment, refactor a Python standard-library "
        "function) to the built-in prompts (default 32; with --head 600)",
    )
    distill.add_argument(
        "--output-vocabulary",
        type=int,
        default=0,
        metavar="N",
        help="the draft's head scores only the N tokens the target writes most (a cheaper "
        "draft step; the draft never proposes the others). GGUF targets (default 0: all)",
    )
    distill.add_argument(
        "--init",
        type=Path,
        default=None,
        metavar="DRAFT",
        help="start from this draft (a draft GGUF or Hugging Face directory) instead of random "
        "weights: train it further on new data (another --seed)",
    )
    distill.add_argument(
        "--device",
        default="cpu",
        help="torch device: cpu or cuda (on cuda a llama/qwen2 GGUF target teaches from torch, "
        "in batches)",
    )
    distill.add_argument("--force", action="store_true", help="replace --out if it exists")
    heads = distill.add_argument_group(
        "heads on the target (--head)",
        "Train a head instead of a draft model: one decoder layer that drafts from the "
        "target's own features (TARGET: a catalog model's name, or a GGUF file). The target "
        "answers the built-in mix and hands its features at every position; the head learns "
        "its next token and feature at chain depths 1..--depth; acceptance by draft position "
        "is measured on held-out requests. Every stage resumes from OUT's work directory.",
    )
    heads.add_argument("--head", action="store_true", help="train a head on the target")
    for flag, kind, default, text in (
        ("--data-minutes", float, 10.0, "minutes of the target's answers and features"),
        ("--text-minutes", float, 5.0, "minutes of its features over standard-library code"),
        ("--train-minutes", float, 10.0, "minutes of training"),
        ("--vocabulary", int, 8192, "tokens the head scores (the target's most written)"),
        ("--depth", int, 3, "chain depth trained as the head drafts"),
    ):
        heads.add_argument(flag, type=kind, default=default, help=f"{text} (default {default})")
    distill.set_defaults(handler=run_distill)


def run_distill(args: argparse.Namespace) -> int:
    if args.head:
        return run_distill_head(args)
    from edgespec.export.distill import DistillConfig

    config = DistillConfig(
        target=args.target,
        out=args.out,
        corpus=tuple(args.corpus),
        samples=args.samples,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        steps=args.steps,
        batch=args.batch,
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        intermediate=768 if args.intermediate is None else args.intermediate,
        lr=args.lr,
        seed=args.seed,
        device=args.device,
        max_minutes=args.max_minutes,
        force=args.force,
        system_prompt=args.system_prompt,
        self_prompts=args.self_prompts or 0,
        edit_prompts=32 if args.edit_prompts is None else args.edit_prompts,
        output_vocabulary=args.output_vocabulary,
        init=args.init,
    )
    from edgespec.export.gguf.locate import is_gguf_source

    # A GGUF target needs torch and transformers for the draft, not the ONNX exporter's extra.
    gguf_target = is_gguf_source(args.target) and not (Path(args.target) / "manifest.json").exists()
    check_extra("export", ("torch", "transformers") if gguf_target else EXPORT_EXTRA_MODULES)
    from edgespec.export.distill import distill, record_costs

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    bundle = distill(config, log=log)
    assert not isinstance(bundle, Path)  # the CLI always imports the draft
    target_bundle = _target_bundle(config)
    if target_bundle is not None:
        from edgespec.measure.profile import profile_pair

        log("distill: measuring c and the recommended k on this device ...")
        profile = profile_pair(bundle.root, target_bundle, save=False)
        drafting = profile["by_drafter"]["model"]  # the record is the draft model's own
        record_costs(
            bundle.root,
            {
                "c": profile["c"],
                "recommended_k": drafting["recommended_k"],
                "pair_profile_alpha": drafting["alpha"],
            },
        )
    record = bundle.manifest.extra["distillation"]
    alpha = record["evaluation"]["alpha"]
    print(
        f"draft       {bundle.root} ({record['draft']['parameters'] / 1e6:.1f}M parameters, "
        f"{record['steps']} steps)\nalpha       {'n/a' if alpha is None else f'{alpha:.2f}'} "
        "on held-out samples (greedy, k 8)"
    )
    if target_bundle is None:
        print("costs       measure with: edgespec pair --profile DRAFT TARGET_BUNDLE")
    return 0


def _target_bundle(config: Any) -> Path | None:
    """The target as a bundle, when there is one to time against (a GGUF is imported)."""
    target = Path(config.target)
    if (target / "manifest.json").is_file():
        return target
    imported = config.work_dir / "target-bundle"
    return imported if (imported / "manifest.json").is_file() else None


def run_distill_head(args: argparse.Namespace) -> int:
    """``edgespec distill --head TARGET --out DIR``."""
    check_extra("export", ("torch", "gguf"))
    from edgespec.export.head import HeadConfig, train_head

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    bundle_root, gguf = _head_target(args.target, args.out, log)
    config = HeadConfig(
        target=bundle_root,
        gguf=gguf,
        out=args.out,
        data_minutes=args.data_minutes,
        text_minutes=args.text_minutes,
        train_minutes=args.train_minutes,
        new_tokens=args.new_tokens,
        prompt_tokens=args.prompt_tokens,
        vocabulary=args.vocabulary,
        intermediate=args.intermediate or 0,
        depth=args.depth,
        batch=args.batch,
        lr=args.lr,
        seed=args.seed,
        device=args.device,
        edit_prompts=HeadConfig.edit_prompts if args.edit_prompts is None else args.edit_prompts,
        self_prompts=HeadConfig.self_prompts if args.self_prompts is None else args.self_prompts,
        force=args.force,
    )
    bundle = train_head(config, log=log)
    record = bundle.manifest.extra["head"]
    size = sum(f.size for f in bundle.manifest.files) / 1e6
    accepted = ", ".join(f"{a:.2f}" for a in record["acceptance_by_position"])
    print(
        f"head        {bundle.root} ({size:.1f} MB, {record['training']['steps']} steps, "
        f"{record['training']['train_minutes']:.1f} min)\n"
        f"acceptance  by draft position on held-out requests: {accepted}"
    )
    return 0


def _head_target(target: str, out: Path, log: Any) -> tuple[Path, Path]:
    """The target's bundle and GGUF file: a catalog model's (fetched and imported when
    absent), or a GGUF file's (imported once into OUT's work directory)."""
    from edgespec.errors import ConfigError
    from edgespec.models import catalog
    from edgespec.models.bundles import model_bundle
    from edgespec.models.fetch import gguf_file

    path = Path(target)
    if not path.is_file():
        try:
            model = catalog.find(target)
        except ConfigError as error:
            raise ConfigError(
                f"{target} is neither a GGUF file nor a catalog model",
                fix="pass a .gguf file or a name from 'edgespec models'",
            ) from error
        bundle = model_bundle(model)
        return bundle.root, gguf_file(model)
    from edgespec.config import ExportConfig
    from edgespec.export.gguf.pipeline import export_gguf

    imported = out.parent / f".{out.name}.work" / "target-bundle"
    if not (imported / "manifest.json").is_file():
        log(f"head: importing {path.name} (once) ...")
        export_gguf(ExportConfig(model=str(path), out=imported, force=True))
    return imported, path
