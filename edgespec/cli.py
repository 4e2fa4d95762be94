"""The ``edgespec`` command line: export, pair, generate, bench, serve, inspect and info.

The decoding commands (generate, bench, pair --profile) live in ``edgespec.cli_decode``.

Every failure prints one line, ``edgespec: error: <problem>; <fix>``, to stderr and exits
non-zero (1 for errors edgespec detects, 2 for command-line usage errors). Progress goes to
stderr; results go to stdout (``--json`` for machines).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn, TextIO

from edgespec._version import __version__
from edgespec.builtin import builtin_pair
from edgespec.cli_budget import add_doctor_command
from edgespec.cli_decode import add_decode_commands, profile_pair
from edgespec.cli_mobile import add_mobile_command
from edgespec.cli_serve import add_serve_command
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
    pair.add_argument(
        "draft", metavar="DRAFT", type=Path, nargs="?", help="draft bundle (default: built-in)"
    )
    pair.add_argument(
        "target", metavar="TARGET", type=Path, nargs="?", help="target bundle (default: built-in)"
    )
    pair.add_argument("--json", action="store_true", help="print the report as JSON")
    pair.add_argument(
        "--profile",
        action="store_true",
        help="also measure alpha by draft position and c on this device, and recommend k",
    )
    pair.set_defaults(handler=_run_pair)

    add_decode_commands(commands)
    add_doctor_command(commands)
    add_serve_command(commands)
    add_mobile_command(commands)

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
    if args.draft is None or args.target is None:
        if args.draft is not None:
            raise ConfigError("pair got a DRAFT but no TARGET", fix="give both, or neither")
        pair = builtin_pair()
        args.draft, args.target = pair.draft, pair.target
    report = check_pair(args.draft, args.target)
    profile = profile_pair(args.draft, args.target) if args.profile and report.compatible else None
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
