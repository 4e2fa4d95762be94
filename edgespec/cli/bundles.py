"""``edgespec inspect`` and ``info`` (and ``pair``, from :mod:`edgespec.cli.pair`): bundles
and the installation."""

from __future__ import annotations

import argparse
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from edgespec._version import __version__
from edgespec.cli.pair import add_pair_command
from edgespec.graph.kernels import attends_on_kernel, gguf_kernel_path
from edgespec.manifest import Bundle, load_bundle

ORT_DISTRIBUTIONS = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-directml",
    "onnxruntime-qnn",
    "onnxruntime-openvino",
)


def add_bundle_commands(commands: Any) -> None:
    """Adds ``pair`` (:mod:`edgespec.cli.pair`), ``inspect`` and ``info``."""
    add_pair_command(commands)

    inspect = commands.add_parser(
        "inspect",
        help="validate a bundle and summarise its manifest",
        description="Load BUNDLE, check its schema version, files, sizes and checksums, load "
        "its graph once in ONNX Runtime (CPU), and print a summary (or the manifest with --json).",
    )
    inspect.add_argument("bundle", metavar="BUNDLE", type=Path, help="bundle directory")
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")
    inspect.set_defaults(handler=run_inspect)

    info = commands.add_parser(
        "info",
        help="show versions, the ONNX Runtime build and its execution providers",
        description="Print edgespec's version, the ONNX Runtime distributions installed (more "
        "than one overwrite each other: exit 1 then), the module's version and the execution "
        "providers it offers.",
    )
    info.add_argument("--json", action="store_true", help="print as JSON")
    info.set_defaults(handler=run_info)


def run_inspect(args: argparse.Namespace) -> int:
    from edgespec.runtime.model import check_graph_loads

    bundle = load_bundle(args.bundle)
    check_graph_loads(bundle)  # a checksum proves the bytes are the exported ones, not usable
    print(
        bundle.manifest.to_json() if args.json else bundle_summary(bundle),
        end="\n" * (not args.json),
    )
    return 0


def _rotary_note(extra: dict[str, Any]) -> str:
    """ ", rotary yarn x4" where the graph's rotary angles are scaled, else ""."""
    scaling = extra.get("rope_scaling", "none")
    return "" if scaling == "none" else f", rotary {scaling}"


def bundle_summary(bundle: Bundle) -> str:
    m = bundle.manifest
    q = m.quantization
    quant = {
        "matmul_nbits": f"{q.weight_dtype} MatMulNBits, block {q.block_size}, accuracy level "
        f"{q.accuracy_level}",
        "gguf_blocks": f"{q.weight_dtype}, the file's blocks",
    }.get(q.scheme, q.weight_dtype)
    # An output head of its own (its embedding then only looked up) is stored apart.
    apart = ", the output head's apart from the embedding's" if m.memory.gathered_bytes else ""
    lines = [
        f"bundle      {bundle.root}",
        f"files       {len(m.files)}, their sizes and sha256 checksums as the manifest records",
        f"model       {m.source.model} ({m.model.architecture}, {m.model.parameters:,} weights "
        f"stored{apart})",
        f"graph       {m.graph.file}: {m.model.num_layers} layers, {m.model.num_kv_heads} KV "
        f"heads x {m.model.head_dim}, KV {m.graph.kv_dtype}, vocab {m.model.vocab_size}, "
        f"context up to {m.context(m.model.max_length):,} tokens (--context; default "
        f"{m.context():,}){_rotary_note(m.extra)}",
        f"weights     {quant}: {m.memory.weight_bytes / 1e6:.2f} MB, KV "
        f"{m.memory.kv_bytes_per_token / 1024:.1f} KiB per token",
    ]
    lines.append(_passes_line(m))
    record = m.verification
    if not record.performed or record.parity is None or record.batch_invariance is None:
        lines.append("verified    no (exported with --no-verify)")
    else:
        parity, invariance = record.parity, record.batch_invariance
        lines.append(
            f"parity      against {_reference(m)}: max |Δlogit| "
            f"{parity.max_abs_logit_diff:.2e}, top-1 agreement "
            f"{parity.top1_agreement:.1%}, greedy {parity.greedy_match_tokens}/"
            f"{parity.greedy_tokens} tokens identical"
        )
        lines.append(
            f"batch inv.  {'passed' if invariance.passed else 'FAILED'}: argmax differs at "
            f"{invariance.argmax_mismatch_fraction:.1%} of {invariance.positions} positions "
            f"(widths {invariance.widths[0]}-{invariance.widths[-1]}), max |Δlogit| "
            f"{invariance.max_abs_logit_diff:.2e}"
        )
    lines.extend(_llama_cpp_line(m.extra.get("llama_cpp_agreement")))
    verdict = faithfulness(m)
    if verdict:
        lines.append(f"in short    {verdict}")
    return "\n".join(lines)


#: llama.cpp agreement this far below its agreement with itself still reads as faithful: the
#: positions that differ are near-ties that any change of rounding moves (docs/export.md).
NEAR_TIE_POINTS = 0.02


def _against_llama_cpp(agreement: dict[str, Any]) -> str:
    """The verdict where the import compared the graph with llama.cpp's own logits: faithful
    when its top token is llama.cpp's as often as llama.cpp's two paths agree, or where it
    is not, the lead of llama.cpp's token is less than llama.cpp's own paths move a logit."""
    ours, own = agreement["top1_agreement"], agreement.get("llama_cpp_self_agreement")
    lead, own_move = (
        agreement.get("disagreement_margin"),
        agreement.get("llama_cpp_self_max_abs_logit_diff"),
    )
    near_ties = lead is not None and own_move is not None and lead <= own_move
    if own is None or ours >= own - NEAR_TIE_POINTS or near_ties:
        sentence = (
            f"faithful: its top token is llama.cpp's own on {ours:.1%} of the checked positions"
        )
        if "max_abs_logit_diff" in agreement:
            sentence += f", its logits within {agreement['max_abs_logit_diff']:.2f} of llama.cpp's"
        if ours < 1.0 and near_ties:
            sentence += (
                f"; where they differ, near-ties (llama.cpp's token led by {lead:.3f}, less than "
                f"the {own_move:.2f} its own two paths differ by)"
            )
        return sentence
    return (
        f"differs from llama.cpp more than llama.cpp differs from itself ({ours:.1%} "
        f"against {own:.1%}): re-import with a newer edgespec, or report it"
    )


def _reference(m: Any) -> str:
    """What the exporter's parity check compared the graph with."""
    if m.source.kind == "gguf":
        return "a float64 computation of the file's weights"
    return "PyTorch on the checkpoint"


def faithfulness(m: Any) -> str:
    """One sentence: whether the bundle computes what its source means, and against what."""
    record = m.verification
    if not record.performed or record.parity is None:
        return "not checked: exported with --no-verify"
    parity = record.parity
    reference = _reference(m)
    agreement = m.extra.get("llama_cpp_agreement")
    exact = parity.greedy_match_tokens == parity.greedy_tokens and parity.top1_agreement >= 0.99
    if isinstance(agreement, dict) and agreement.get("checked"):
        return _against_llama_cpp(agreement)
    if exact:
        return f"faithful: its greedy tokens are those of {reference}"
    matched = round(parity.top1_agreement * parity.positions)
    figures = (
        f"{matched} of {parity.positions} checked positions, greedy "
        f"{parity.greedy_match_tokens}/{parity.greedy_tokens} tokens"
    )
    eight_bit = m.quantization.scheme == "gguf_blocks" or m.quantization.accuracy_level == 4
    if parity.passed and eight_bit:
        return (
            f"close to the file: its top token is that of {reference} at {figures}; it "
            "multiplies 8-bit activations as llama.cpp does, which tips near-ties; not "
            "compared with llama.cpp's own output (that needs llama-cpp-python when importing)"
        )
    if not parity.passed:
        return f"NOT faithful: top-1 agreement with {reference} below the required minimum"
    return f"its top token is that of {reference} at {figures}"


def _passes_line(m: Any) -> str:
    """How the runtime runs the graph's passes: as a target, padded and cut so that a step's
    bits equal a verify pass's; as a draft, one row per step."""
    graph = m.graph
    kernels = {
        "matmul_nbits": "ONNX Runtime's MatMulNBits (its one-row kernel rounds apart from its "
        "multi-row one)",
        "gguf_blocks": f"edgespec's GGUF kernels ({gguf_kernel_path()} here) and ONNX Runtime's",
    }.get(m.quantization.scheme, "ONNX Runtime's CPU kernels")
    if attends_on_kernel(m.quantization.op_types):
        kernels += f" (attention: edgespec's CacheAttention, {graph.kv_dtype} cache)"
    if graph.min_pass_width <= 1 and not graph.attention_boundaries:
        return f"passes      {kernels}; every pass as it comes, target or draft"
    cut = (
        f", cut at attention boundaries {list(graph.attention_boundaries)}"
        if graph.attention_boundaries
        else ""
    )
    return (
        f"passes      {kernels}; as a target, one-token steps padded to "
        f"{graph.min_pass_width} rows{cut}; as a draft, one row per step"
    )


def _llama_cpp_line(agreement: object) -> list[str]:
    """A GGUF import's agreement with llama.cpp, when the export measured it."""
    if not isinstance(agreement, dict) or not agreement.get("checked"):
        return []
    line = f"llama.cpp   top-1 agreement {agreement['top1_agreement']:.1%} with its logits"
    if "llama_cpp_self_agreement" in agreement:
        line += (
            f" (its own prompt and decoding paths agree at "
            f"{agreement['llama_cpp_self_agreement']:.1%})"
        )
    return [line]


def _default_model_state() -> str:
    """Which bundle commands use without --target, and whether it is ready."""
    from edgespec.models.bundles import TARGET_ENV
    from edgespec.models.catalog import default_model
    from edgespec.models.store import bundle_dir, draft_dir

    if os.environ.get(TARGET_ENV):
        return f"{os.environ[TARGET_ENV]} (from {TARGET_ENV})"

    def state(root: Path) -> str:
        ready = (root / "manifest.json").is_file()
        return f"{root} ({'ready' if ready else 'converted on first use'})"

    model = default_model()
    root, draft = bundle_dir(model), draft_dir(model)
    text = f"{model.title} at {state(root)}"
    if not (root / "manifest.json").is_file():
        text = text.replace("converted on first use", "fetched and converted on first use")
    return text + (f"; its draft at {state(draft)}" if draft is not None else "")


def run_info(args: argparse.Namespace) -> int:
    installed = {}
    for name in ORT_DISTRIBUTIONS:
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
    info["default_model"] = _default_model_state()
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
