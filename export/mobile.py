"""Mobile bundles: a draft (or any) bundle converted to ONNX Runtime's ``.ort`` format.

``edgespec mobile BUNDLE`` writes ``BUNDLE-mobile/`` (or ``--out``): the graph converted by
``onnxruntime.tools.convert_onnx_models_to_ort`` (the ORT flatbuffer format that ONNX Runtime
Mobile loads, with its reduced-operator configuration ``required_operators.config`` for a
minimal ORT build), the same tokenizer and config files, a manifest whose ``graph.file``
names the ``.ort`` file (its I/O is unchanged, so the runtime loads it as any bundle), and
``mobile_report.json`` / ``MOBILE.md``: what ONNX Runtime's mobile usability checker says of
NNAPI (and CoreML), what is known of XNNPACK and QNN, and the expected memory.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.errors import BundleError, ConfigError, MissingDependencyError, install_fix
from edgespec.export.bundle import even_modes
from edgespec.manifest import (
    Bundle,
    FileRecord,
    Manifest,
    file_record,
    load_bundle,
    write_manifest,
)

ORT_FILE = "model.ort"
OPS_CONFIG_FILE = "required_operators.config"
REPORT_FILE = "mobile_report.json"
REPORT_TEXT_FILE = "MOBILE.md"
OPTIMIZATION_STYLES = ("Fixed", "Runtime")
#: ops ORT's XNNPACK EP has kernels for that matter in a decoder (fp32, constant weights)
XNNPACK_CANDIDATE_OPS = frozenset({"MatMul", "Gemm", "Softmax"})
_MB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class EpCoverage:
    """How much of the graph an execution provider could take (``nodes`` of ``total``)."""

    provider: str
    nodes: int
    total: int
    partitions: int | None
    verdict: str
    source: str
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class MobileReport:
    onnxruntime_version: str
    optimization_style: str
    ort_bytes: int
    onnx_bytes: int
    op_types: tuple[str, ...]
    coverage: tuple[EpCoverage, ...]
    memory_mb: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _ort() -> Any:
    try:
        import onnx  # noqa: F401  (the conversion tools need it)
        import onnxruntime
    except ImportError as error:
        raise MissingDependencyError(
            f"edgespec mobile needs onnx and onnxruntime ({error.name} is missing)",
            fix=install_fix("export"),
        ) from error
    return onnxruntime


def _convert(graph: Path, out: Path, style: str) -> tuple[Path, Path]:
    """Runs ORT's converter in a subprocess (it prints a lot and may exit)."""
    with tempfile.TemporaryDirectory() as work:
        command = [
            sys.executable, "-m", "onnxruntime.tools.convert_onnx_models_to_ort", str(graph),
            "--output_dir", work, "--optimization_style", style,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        converted = sorted(Path(work).rglob("*.ort"))
        configs = sorted(Path(work).rglob("*.config"))
        if done.returncode != 0 or len(converted) != 1 or not configs:
            raise BundleError(
                f"ONNX Runtime could not convert {graph} to .ort:\n{done.stdout[-2000:]}"
                f"{done.stderr[-2000:]}",
                fix="check that the graph loads with onnxruntime (edgespec inspect)",
            )
        shutil.move(str(converted[0]), out / ORT_FILE)
        shutil.move(str(configs[0]), out / OPS_CONFIG_FILE)
    return out / ORT_FILE, out / OPS_CONFIG_FILE


@dataclass(frozen=True, kw_only=True)
class _GraphCoverage:
    """The graph's op types and how much of it each execution provider could take."""

    op_types: tuple[str, ...]  # sorted "domain:OpType", with ai.onnx for the default domain
    coverage: tuple[EpCoverage, ...]  # CPU, NNAPI and CoreML (each twice), XNNPACK, QNN


def _coverage(graph: Path, quant: str) -> _GraphCoverage:
    from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo

    model = ModelProtoWithShapeInfo(graph).model_with_shape_info
    nodes = list(model.graph.node)
    initializers = {i.name for i in model.graph.initializer}
    return _GraphCoverage(
        op_types=tuple(sorted({f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in nodes})),
        coverage=(
            _cpu_coverage(len(nodes)),
            *_checker_coverage(model),
            _xnnpack_coverage(nodes, initializers),
            _qnn_coverage(len(nodes), quant),
        ),
    )


def _cpu_coverage(total: int) -> EpCoverage:
    return EpCoverage(
        provider="CPU",
        nodes=total,
        total=total,
        partitions=1,
        verdict="YES",
        source="every op has a CPU kernel (the reference EP)",
        note=f"a minimal ORT build needs only the ops in {OPS_CONFIG_FILE}",
    )


def _checker_coverage(model: Any) -> list[EpCoverage]:
    """NNAPI and CoreML as ONNX Runtime's mobile usability checker sees them, run twice each:
    with ``fixed_shapes`` on and off."""
    from onnxruntime.tools.mobile_helpers import usability_checker as checker

    def check_coreml(model: Any, fixed_shapes: bool) -> Any:
        return checker.check_coreml_partitions(
            model, fixed_shapes, "coreml_supported_mlprogram_ops.md"
        )

    found = []
    for provider, check in (("NNAPI", checker.check_nnapi_partitions), ("CoreML", check_coreml)):
        for fixed_shapes in (True, False):
            info = check(model, fixed_shapes)
            found.append(
                EpCoverage(
                    provider=provider if fixed_shapes else f"{provider} (shapes made fixed)",
                    nodes=info.num_supported_nodes,
                    total=info.num_nodes,
                    partitions=info.num_partitions,
                    verdict=info.suitability().name,
                    source="onnxruntime.tools.mobile_helpers.usability_checker",
                    note="unsupported ops: " + ", ".join(sorted(info.unsupported_ops))
                    if info.unsupported_ops
                    else "",
                )
            )
    return found


def _xnnpack_coverage(nodes: list[Any], initializers: set[str]) -> EpCoverage:
    """An estimate: this onnxruntime build has no XNNPACK EP to ask."""
    candidates = sum(
        1
        for n in nodes
        if n.op_type in XNNPACK_CANDIDATE_OPS
        and not n.domain
        and (n.op_type == "Softmax" or any(i in initializers for i in n.input[1:2]))
    )
    return EpCoverage(
        provider="XNNPACK",
        nodes=candidates,
        total=len(nodes),
        partitions=None,
        verdict="NOT MEASURED",
        source="op-type heuristic (this onnxruntime build has no XNNPACK EP)",
        note="fp32 MatMul/Gemm with constant weights and Softmax; quantized "
        "com.microsoft ops (MatMulNBits) and the rest stay on the CPU EP",
    )


def _qnn_coverage(total: int, quant: str) -> EpCoverage:
    return EpCoverage(
        provider="QNN",
        nodes=0,
        total=total,
        partitions=None,
        verdict="NOT MEASURED",
        source="not assessed here (no QNN SDK)",
        note=f"QNN's HTP backend runs QDQ-quantized graphs; this bundle is {quant}, so "
        "it would need QDQ quantization first",
    )


def _memory_mb(bundle: Bundle, ort_bytes: int) -> dict[str, float]:
    memory = bundle.manifest.memory
    max_length = bundle.manifest.model.max_length
    kv = memory.kv_bytes(max_length)
    return {
        "weights": round(memory.weight_bytes / _MB, 2),
        "ort_file": round(ort_bytes / _MB, 2),
        "kv_per_1k_tokens": round(memory.kv_bytes(1024) / _MB, 2),
        f"kv_at_{max_length}_tokens": round(kv / _MB, 2),
        "logits_per_position": round(memory.logits_bytes_per_position / _MB, 3),
        "expected_total": round((ort_bytes + kv + 9 * memory.logits_bytes_per_position) / _MB, 2),
    }


def _report_text(bundle: Bundle, report: MobileReport) -> str:
    lines = [
        f"# Mobile bundle of {bundle.manifest.source.model}",
        "",
        f"Converted with onnxruntime {report.onnxruntime_version} "
        f"({report.optimization_style} optimizations): {ORT_FILE} "
        f"{report.ort_bytes / _MB:.2f} MB (from {report.onnx_bytes / _MB:.2f} MB of ONNX).",
        "",
        "| provider | nodes | partitions | verdict | source |",
        "|---|---|---|---|---|",
    ]
    for c in report.coverage:
        share = f"{c.nodes}/{c.total} ({c.nodes / max(c.total, 1):.0%})"
        lines.append(
            f"| {c.provider} | {share} | {c.partitions if c.partitions is not None else '-'} "
            f"| {c.verdict} | {c.source} |"
        )
    lines += ["", *(f"- {c.provider}: {c.note}" for c in report.coverage if c.note), ""]
    lines += ["Expected memory (MB):", ""]
    lines += [f"- {name}: {value}" for name, value in report.memory_mb.items()]
    return "\n".join(lines) + "\n"


def make_mobile_bundle(
    bundle_dir: Path, *, out: Path | None = None, optimization_style: str = "Fixed"
) -> Path:
    """Writes the mobile bundle and returns its directory (see the module docstring)."""
    if optimization_style not in OPTIMIZATION_STYLES:
        raise ConfigError(
            f"unknown optimization style {optimization_style!r}",
            fix=f"use one of {', '.join(OPTIMIZATION_STYLES)}",
        )
    onnxruntime = _ort()
    bundle = load_bundle(bundle_dir)
    out = out or bundle.root.with_name(bundle.root.name + "-mobile")
    if out.exists():
        raise ConfigError(f"{out} already exists", fix="remove it or pass another --out")
    staging = out.with_name(out.name + ".partial-mobile")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        ort_path, _ = _convert(bundle.graph_path, staging, optimization_style)
        kept = _copy_non_graph_files(bundle, staging)
        report = _write_report(
            bundle,
            staging,
            ort_path=ort_path,
            onnxruntime_version=onnxruntime.__version__,
            optimization_style=optimization_style,
        )
        write_manifest(staging, _mobile_manifest(bundle, staging, kept=kept, report=report))
        load_bundle(staging)  # what was written must validate
        even_modes(staging)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _copy_non_graph_files(bundle: Bundle, staging: Path) -> list[FileRecord]:
    """Copies the tokenizer and config files as they are; returns their source records."""
    kept = [f for f in bundle.manifest.files if f.role not in ("graph", "graph_data")]
    for record in kept:
        (staging / record.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(bundle.root / record.path, staging / record.path)
    return kept


def _write_report(
    bundle: Bundle,
    staging: Path,
    *,
    ort_path: Path,
    onnxruntime_version: str,
    optimization_style: str,
) -> MobileReport:
    """Writes ``mobile_report.json`` and ``MOBILE.md`` into ``staging``; returns the report."""
    graph = _coverage(bundle.graph_path, bundle.manifest.quantization.scheme)
    onnx_bytes = sum(f.size for f in bundle.manifest.files if f.role in ("graph", "graph_data"))
    report = MobileReport(
        onnxruntime_version=onnxruntime_version,
        optimization_style=optimization_style,
        ort_bytes=ort_path.stat().st_size,
        onnx_bytes=onnx_bytes,
        op_types=graph.op_types,
        coverage=graph.coverage,
        memory_mb=_memory_mb(bundle, ort_path.stat().st_size),
    )
    (staging / REPORT_FILE).write_text(json.dumps(report.to_json(), indent=2) + "\n")
    (staging / REPORT_TEXT_FILE).write_text(_report_text(bundle, report))
    return report


def _mobile_manifest(
    bundle: Bundle, staging: Path, *, kept: list[FileRecord], report: MobileReport
) -> Manifest:
    """The source manifest with the ``.ort`` graph, its file records and the mobile record."""
    files: list[FileRecord] = [file_record(staging, r.path, r.role) for r in kept]
    files.append(file_record(staging, ORT_FILE, "graph"))
    for name in (OPS_CONFIG_FILE, REPORT_FILE, REPORT_TEXT_FILE):
        files.append(file_record(staging, name, "report"))
    manifest = bundle.manifest
    return dataclasses.replace(
        manifest,
        graph=dataclasses.replace(manifest.graph, file=ORT_FILE),
        memory=dataclasses.replace(manifest.memory, file_bytes=report.ort_bytes),
        files=tuple(sorted(files, key=lambda f: f.path)),
        toolchain={
            **manifest.toolchain,
            "onnxruntime_mobile_convert": report.onnxruntime_version,
        },
        extra={
            **manifest.extra,
            "mobile": {
                "graph_format": "ort",
                "optimization_style": report.optimization_style,
                "source_graph_sha256": next(
                    f.sha256 for f in bundle.manifest.files if f.role == "graph"
                ),
                "report": REPORT_FILE,
            },
        },
    )
