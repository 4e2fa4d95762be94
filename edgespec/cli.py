"""The ``edgespec`` command line: export, pair, generate, bench, inspect and info.

Every failure prints one line, ``edgespec: error: <problem>; <fix>``, to stderr and exits
non-zero (1 for errors edgespec detects, 2 for command-line usage errors). Progress goes to
stderr; results go to stdout (``--json`` for machines).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn, TextIO

from edgespec._version import __version__
from edgespec.config import AUTO_INT4_MIN_PARAMETERS, QUANT_CHOICES, ExportConfig
from edgespec.errors import ConfigError, EdgespecError, MissingDependencyError
from edgespec.events import ProgressEvent
from edgespec.manifest import Bundle, load_bundle
from edgespec.pairing import check_pair

_EXPORT_EXTRA_MODULES = {"torch", "transformers", "optimum", "onnx", "onnx_ir"}
_ORT_DISTRIBUTIONS = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-directml",
    "onnxruntime-qnn",
    "onnxruntime-openvino",
)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line, like every other edgespec error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"edgespec: error: {message} (see '{self.prog} --help')\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="edgespec",
        description="Speculative decoding on edge devices: export draft/target pairs to "
        "verified ONNX bundles and run them with ONNX Runtime.",
    )
    parser.add_argument("--version", action="version", version=f"edgespec {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    export = commands.add_parser(
        "export",
        help="export a Hugging Face causal LM to a verified ONNX bundle",
        description="Export a causal LM (hub id or local directory) with optimum's "
        "text-generation-with-past task, quantize it with ONNX Runtime, check it against "
        "PyTorch and for batch invariance, and write a bundle with manifest.json. Needs the "
        "[export] extra.",
    )
    export.add_argument("model", metavar="MODEL", help="hub id or local model directory")
    export.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="DIR",
        help="bundle directory to write (must not exist unless --force)",
    )
    export.add_argument(
        "--quant",
        default="auto",
        metavar="{" + ",".join(QUANT_CHOICES[1:]) + "}",
        help="weight format. int4/int8: weight-only MatMulNBits (block-wise); fp16; fp32; "
        "int8-dynamic: MatMulInteger, offered with a warning because it is not batch "
        f"invariant. Default auto: int4 for models of {AUTO_INT4_MIN_PARAMETERS // 1_000_000}M "
        "parameters or more, fp32 below that (small models are cheap in fp32, match PyTorch "
        "exactly and verify k+1 positions at the lowest relative cost)",
    )
    export.add_argument(
        "--block-size",
        type=int,
        default=32,
        help="MatMulNBits quantization block size (power of two >= 16; default 32)",
    )
    export.add_argument(
        "--accuracy-level",
        type=int,
        default=4,
        help="MatMulNBits compute accuracy: 4 = int8 activations (fastest on "
        "CPU, default), 1 = fp32 activations, 0 = unset",
    )
    export.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="context limit recorded for the runtime (default: the model's "
        "max positions, at most 4096)",
    )
    export.add_argument("--revision", default="main", help="hub revision (default main)")
    export.add_argument(
        "--force",
        action="store_true",
        help="replace DIR if it exists (only after the new bundle is complete)",
    )
    export.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="skip the PyTorch parity and batch-invariance checks",
    )
    export.add_argument(
        "--allow-batch-variance",
        action="store_true",
        help="keep a graph that fails the batch-invariance check (recorded in "
        "the manifest; greedy speculative output may then differ from the "
        "target's)",
    )
    export.add_argument(
        "--min-top1",
        dest="min_top1_agreement",
        type=float,
        default=0.8,
        help="quantized graphs: minimum fraction of prompt positions whose "
        "top-1 token matches PyTorch (default 0.8; a miswired graph scores near "
        "chance)",
    )
    export.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow model code from the hub (only for sources you trust)",
    )
    export.add_argument("--quiet", action="store_true", help="no progress lines")
    export.add_argument("--json", action="store_true", help="print the manifest as JSON")
    export.set_defaults(handler=_run_export)

    pair = commands.add_parser(
        "pair",
        help="check that a draft bundle can serve a target bundle",
        description="Check that DRAFT can propose tokens for TARGET: identical tokenizers, or "
        "compatible ones (same vocabulary type, sizes within 128, identical special tokens "
        "and token strings). Exit code 0 if compatible, 1 if not.",
    )
    pair.add_argument("draft", metavar="DRAFT", type=Path, help="draft bundle directory")
    pair.add_argument("target", metavar="TARGET", type=Path, help="target bundle directory")
    pair.add_argument("--json", action="store_true", help="print the report as JSON")
    pair.add_argument(
        "--profile",
        action="store_true",
        help="also measure alpha by draft position and c on this device, and recommend k",
    )
    pair.set_defaults(handler=_run_pair)

    generate = commands.add_parser(
        "generate",
        help="generate text with speculative decoding (streams as tokens are committed)",
        description="Generate a continuation of PROMPT. Greedy output equals the target's own "
        "greedy output; sampled output has the target's distribution (rejection) or equals "
        "target-only sampling with the same seed (match).",
    )
    generate.add_argument("prompt", metavar="PROMPT", help="the prompt text")
    _add_engine_arguments(generate)
    _add_decoding_arguments(generate)
    generate.add_argument(
        "--chat", action="store_true", help="wrap PROMPT in the tokenizer's chat template"
    )
    generate.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: text, tokens, stats (no streaming)",
    )
    generate.add_argument(
        "--no-color", action="store_true", help="do not colour text that came from accepted drafts"
    )
    generate.set_defaults(handler=_run_generate)

    bench = commands.add_parser(
        "bench",
        help="target-only vs speculative decoding, measured in one process",
        description="Alternate target-only and speculative runs over a prompt set after a "
        "warm-up (greedy, then sampling at --temperature) and report tokens/s, speedup, alpha, "
        "mean_accepted, c, the verify cost curve T(k)/T(1), the theoretical speedup and the "
        "efficiency.",
    )
    _add_engine_arguments(bench)
    bench.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help="text file with one prompt per line (\\n for newlines), or a JSON "
        "list of strings (default: a small built-in code set)",
    )
    bench.add_argument("--max-new-tokens", type=int, default=64)
    bench.add_argument("--k", default="4", help="draft length, or auto (default 4)")
    bench.add_argument("--drafter", default="model", choices=("model", "ngram"))
    bench.add_argument(
        "--temperature",
        type=float,
        default=0.7,
        help="temperature of the sampling comparison (default 0.7)",
    )
    bench.add_argument("--repeats", type=int, default=1, help="passes over the prompt set")
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    bench.set_defaults(handler=_run_bench)

    inspect = commands.add_parser(
        "inspect",
        help="validate a bundle and summarise its manifest",
        description="Load BUNDLE, check its schema version, files, sizes and checksums, and "
        "print a summary (or the manifest with --json).",
    )
    inspect.add_argument("bundle", metavar="BUNDLE", type=Path, help="bundle directory")
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")
    inspect.set_defaults(handler=_run_inspect)

    info = commands.add_parser(
        "info", help="show versions, the ONNX Runtime build and its execution providers"
    )
    info.add_argument("--json", action="store_true", help="print as JSON")
    info.set_defaults(handler=_run_info)
    return parser


def _add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target", type=Path, required=True, metavar="DIR", help="target bundle directory"
    )
    parser.add_argument(
        "--draft",
        type=Path,
        default=None,
        metavar="DIR",
        help="draft bundle directory (needed by --drafter model)",
    )
    parser.add_argument(
        "--target-providers",
        default=None,
        metavar="LIST",
        help="comma-separated ONNX Runtime providers for the target (default: the best available)",
    )
    parser.add_argument(
        "--draft-providers",
        default=None,
        metavar="LIST",
        help="comma-separated providers for the draft",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads per session (default: ONNX Runtime's choice)",
    )


def _add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--drafter",
        default=None,
        choices=("model", "ngram", "none"),
        help="model (default with --draft), ngram (prompt lookup, default "
        "without), none (plain target decoding)",
    )
    parser.add_argument("--k", default="4", help="tokens drafted per round, or auto (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sampling-mode",
        default=None,
        choices=("rejection", "match"),
        help="rejection (model drafter default) or match (reproducible: "
        "same seed, same text with or without speculation)",
    )
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop when this text appears (repeatable)",
    )
    parser.add_argument(
        "--draft-min-prob",
        type=float,
        default=0.0,
        metavar="P",
        help="end a draft early when the draft's probability of its next token is below P "
        "(default 0: always draft k)",
    )


def _providers(value: str | None) -> list[str] | None:
    return [name.strip() for name in value.split(",") if name.strip()] if value else None


def _k(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"--k {value!r} is not a number or 'auto'", fix="e.g. --k 4") from None


def _load_engine(args: argparse.Namespace) -> Any:
    from edgespec.api import Engine

    engine = Engine.load(
        target=args.target,
        draft=args.draft,
        target_providers=_providers(args.target_providers),
        draft_providers=_providers(args.draft_providers),
        threads=args.threads,
    )
    for line in engine.warnings:
        print(f"edgespec: warning: {line}", file=sys.stderr)
    return engine


def _run_generate(args: argparse.Namespace) -> int:
    engine = _load_engine(args)
    generation = engine.stream_deltas(
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        k=_k(args.k),
        drafter=args.drafter,
        sampling_mode=args.sampling_mode,
        stop=args.stop,
        chat=args.chat,
        draft_min_probability=args.draft_min_prob,
    )
    color = not args.no_color and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    for delta in generation:
        if args.json:
            continue
        text = f"\033[36m{delta.text}\033[0m" if color and delta.drafted else delta.text
        sys.stdout.write(text)
        sys.stdout.flush()
    result = generation.result
    if args.json:
        print(result.to_json())
    else:
        stats = result.stats
        sys.stdout.write("\n")
        rate = stats["acceptance_rate"]
        print(
            f"[{stats['new_tokens']} tokens, {stats['tokens_per_s'] or 0:.1f} tokens/s, "
            f"{stats['rounds']} rounds, acceptance "
            f"{'n/a' if rate is None else f'{rate:.0%}'}, {result.finish_reason}]",
            file=sys.stderr,
        )
    return 0


def _read_prompts(path: Path | None) -> list[str]:
    from edgespec.bench import DEFAULT_PROMPTS

    if path is None:
        return list(DEFAULT_PROMPTS)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(
            f"cannot read prompts file {path} ({error})", fix="check the path"
        ) from error
    if text.lstrip().startswith("["):
        prompts = json.loads(text)
    else:
        prompts = [line.replace("\\n", "\n") for line in text.splitlines() if line.strip()]
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ConfigError(f"{path} holds no prompts", fix="one prompt per line, or a JSON list")
    return prompts


def _run_bench(args: argparse.Namespace) -> int:
    from edgespec.bench import BenchSettings, run_bench

    engine = _load_engine(args)
    settings = BenchSettings(
        max_new_tokens=args.max_new_tokens,
        k=_k(args.k),
        drafter=args.drafter,
        temperature=args.temperature,
        repeats=args.repeats,
    )
    results = run_bench(
        engine,
        _read_prompts(args.prompts),
        settings,
        progress=lambda m: print(f"  bench: {m}", file=sys.stderr, flush=True),
    )
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    greedy, sampled = results["greedy"], results["sampling"]
    print(
        f"greedy   target {greedy['target_tokens_per_s']:.1f} tok/s, speculative "
        f"{greedy['speculative_tokens_per_s']:.1f} tok/s, speedup {greedy['speedup']:.2f}x, "
        f"alpha {greedy['alpha'] or 0:.2f}, mean_accepted {greedy['mean_accepted'] or 0:.2f}, "
        f"identical output {greedy['identical_output']}"
    )
    print(
        f"sampling target {sampled['target_tokens_per_s']:.1f} tok/s, speculative "
        f"{sampled['speculative_tokens_per_s']:.1f} tok/s, speedup {sampled['speedup']:.2f}x, "
        f"alpha {sampled['alpha'] or 0:.2f}"
    )
    curve = ", ".join(f"{v:.2f}" for v in results["verify_cost"])
    print(f"c {results['c']:.3f}; verify cost T(w)/T(1), w = 1..9: {curve}")
    if results["theoretical_speedup"]:
        print(
            f"theoretical speedup {results['theoretical_speedup']:.2f}x, efficiency "
            f"{results['efficiency']:.2f}; loop overhead {greedy['overhead_ms_per_round']:.3f} "
            f"ms/round (loop efficiency {greedy['loop_efficiency']:.2f})"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except EdgespecError as error:
        print(f"edgespec: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("edgespec: interrupted; nothing was written", file=sys.stderr)
        return 130


def _progress_printer(*, quiet: bool, stream: TextIO) -> Any:
    def show(event: ProgressEvent) -> None:
        if event.warning:
            print(f"edgespec: warning: {event.message}", file=stream, flush=True)
        elif quiet:
            return
        elif event.done:
            print(
                f"  {event.stage}: done in {event.elapsed_s or 0.0:.1f} s", file=stream, flush=True
            )
        elif event.total:
            print(
                f"  {event.stage}: {event.message} [{event.step}/{event.total}]",
                file=stream,
                flush=True,
            )
        else:
            print(f"{event.stage}: {event.message} ...", file=stream, flush=True)

    return show


def _run_export(args: argparse.Namespace) -> int:
    config = ExportConfig(
        model=args.model,
        out=args.out,
        quant=args.quant,
        block_size=args.block_size,
        accuracy_level=args.accuracy_level,
        max_length=args.max_length,
        revision=args.revision,
        force=args.force,
        verify=args.verify,
        allow_batch_variance=args.allow_batch_variance,
        min_top1_agreement=args.min_top1_agreement,
        trust_remote_code=args.trust_remote_code,
    )
    try:
        from edgespec.export import export_bundle
    except ImportError as error:
        if error.name and error.name.split(".")[0] in _EXPORT_EXTRA_MODULES:
            raise MissingDependencyError(
                f"edgespec export needs the [export] extra ({error.name} is not installed)",
                fix="pip install 'edgespec[export]'",
            ) from error
        raise
    bundle = export_bundle(config, observe=_progress_printer(quiet=args.quiet, stream=sys.stderr))
    if args.json:
        print(bundle.manifest.to_json(), end="")
    else:
        print(_summary(bundle))
    return 0


def _run_pair(args: argparse.Namespace) -> int:
    report = check_pair(args.draft, args.target)
    profile = _profile_pair(args) if args.profile and report.compatible else None
    if args.json:
        print(json.dumps({**report.to_dict(), "profile": profile}, indent=2))
    else:
        verdict = "compatible" if report.compatible else "NOT compatible"
        print(f"{verdict}: {report.reason}")
        if not report.compatible:
            print(
                "  the draft must use the target's tokenizer (or one with the same "
                "vocabulary); export a draft trained with it"
            )
        if profile is not None:
            by_position = ", ".join(f"{a:.2f}" for a in profile["alpha_by_position"])
            print(
                f"alpha {profile['alpha']:.2f} (by draft position: {by_position}); c "
                f"{profile['c']:.3f}; recommended k {profile['recommended_k']}, expected "
                f"speedup {profile['expected_speedup']:.2f}x"
            )
    return 0 if report.compatible else 1


def _profile_pair(args: argparse.Namespace) -> dict[str, Any]:
    """Greedy speculation at k = 8 over the bench prompts: alpha by position, c, best k."""
    from edgespec.api import Engine
    from edgespec.bench import DEFAULT_PROMPTS
    from edgespec.runtime.policy import expected_speedup

    engine = Engine.load(target=args.target, draft=args.draft)
    results = [engine.generate(p, k=8, max_new_tokens=64) for p in DEFAULT_PROMPTS]
    tested = sum(r.stats["tested"] for r in results)
    alpha = sum(r.stats["accepted"] for r in results) / tested if tested else 0.0
    offered = [0] * 8
    kept = [0] * 8
    for result in results:
        for record_position, rate in enumerate(result.stats["acceptance_by_position"]):
            offered[record_position] += 1
            kept[record_position] += rate
    by_position = [kept[i] / offered[i] for i in range(8) if offered[i]]
    profile = engine.cost_profile()
    verify_cost = list(profile.verify_cost)
    speedups = [expected_speedup(alpha, profile.c, verify_cost, k) for k in range(9)]
    best = max(range(9), key=lambda k: speedups[k])
    return {
        "alpha": alpha,
        "alpha_by_position": by_position,
        "c": profile.c,
        "verify_cost": verify_cost,
        "recommended_k": best,
        "expected_speedup": speedups[best],
    }


def _run_inspect(args: argparse.Namespace) -> int:
    bundle = load_bundle(args.bundle)
    print(bundle.manifest.to_json() if args.json else _summary(bundle), end="\n" * (not args.json))
    return 0


def _summary(bundle: Bundle) -> str:
    m = bundle.manifest
    q = m.quantization
    quant = (
        q.weight_dtype
        if q.scheme != "matmul_nbits"
        else (
            f"{q.weight_dtype} MatMulNBits, block {q.block_size}, accuracy level {q.accuracy_level}"
        )
    )
    lines = [
        f"bundle      {bundle.root}",
        f"model       {m.source.model} ({m.model.architecture}, {m.model.parameters:,} parameters)",
        f"graph       {m.graph.file}: {m.model.num_layers} layers, {m.model.num_kv_heads} KV "
        f"heads x {m.model.head_dim}, KV {m.graph.kv_dtype}, vocab {m.model.vocab_size}, "
        f"max length {m.model.max_length}",
        f"weights     {quant}: {m.memory.weight_bytes / 1e6:.2f} MB, KV "
        f"{m.memory.kv_bytes_per_token / 1024:.1f} KiB per token",
    ]
    record = m.verification
    if not record.performed or record.parity is None or record.batch_invariance is None:
        lines.append("verified    no (exported with --no-verify)")
    else:
        parity, invariance = record.parity, record.batch_invariance
        lines.append(
            f"parity      max |Δlogit| {parity.max_abs_logit_diff:.2e}, top-1 agreement "
            f"{parity.top1_agreement:.1%}, greedy {parity.greedy_match_tokens}/"
            f"{parity.greedy_tokens} tokens identical"
        )
        lines.append(
            f"batch inv.  {'passed' if invariance.passed else 'FAILED'}: argmax differs at "
            f"{invariance.argmax_mismatch_fraction:.1%} of {invariance.positions} positions "
            f"(widths {invariance.widths[0]}-{invariance.widths[-1]}), max |Δlogit| "
            f"{invariance.max_abs_logit_diff:.2e}"
        )
    return "\n".join(lines)


def _run_info(args: argparse.Namespace) -> int:
    installed = {}
    for name in _ORT_DISTRIBUTIONS:
        try:
            installed[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    info: dict[str, Any] = {"edgespec": __version__, "onnxruntime_distributions": installed}
    try:
        import onnxruntime

        info["onnxruntime_module"] = onnxruntime.__version__
        info["available_providers"] = list(onnxruntime.get_available_providers())
    except ImportError as error:
        info["onnxruntime_module"] = None
        info["problem"] = f"onnxruntime cannot be imported ({error})"
    if len(installed) > 1:
        info["problem"] = (
            f"{' and '.join(installed)} are all installed and overwrite each other's "
            "'onnxruntime' module; uninstall all of them and reinstall only the one you want"
        )
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for key, value in info.items():
            print(f"{key:27} {json.dumps(value) if not isinstance(value, str) else value}")
    return 0 if "problem" not in info else 1
