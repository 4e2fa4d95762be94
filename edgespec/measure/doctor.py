"""``edgespec doctor``: what this device offers and what the pair would cost on it.

Providers ONNX Runtime lists, and which of them really create a session (it falls back to CPU
silently); cores; memory; energy and power sources (the one used, and why each other is
unavailable); for the default or given pair, the memory estimate from its manifests, a
recommended quantization (int4 when the estimate takes over half of ``MemAvailable`` or the
budget) and the k generation uses by default, with where it comes from.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from edgespec.engine.loading import check_context
from edgespec.errors import EdgespecError
from edgespec.graph.kernels import gguf_kernel_path, register_gguf_kernels
from edgespec.manifest import load_bundle
from edgespec.models.bundles import default_pair
from edgespec.telemetry.discover import discover
from edgespec.telemetry.estimate import MIB, estimate_pair
from edgespec.telemetry.memory import MemoryProbe, base_rss_bytes
from edgespec.telemetry.sources import battery_state
from edgespec.telemetry.sysfs import Tree

#: TensorRT builds engines for minutes on first use; doctor does not try it.
NOT_TRIED = ("TensorrtExecutionProvider",)


def _providers(graph: Path | None) -> list[dict[str, Any]]:
    import onnxruntime

    found = []
    for name in onnxruntime.get_available_providers():
        entry: dict[str, Any] = {"name": name, "creates_session": None, "note": ""}
        if graph is None:
            entry["note"] = "not tried: no bundle to load"
        elif name in NOT_TRIED:
            entry["note"] = "not tried: builds engines for minutes on first use"
        else:
            options = onnxruntime.SessionOptions()
            options.log_severity_level = 4
            register_gguf_kernels(options, required=False)
            try:
                session = onnxruntime.InferenceSession(str(graph), options, providers=[name])
                entry["creates_session"] = session.get_providers()[0] == name
                if not entry["creates_session"]:
                    entry["note"] = f"fell back to {session.get_providers()[0]}"
            except Exception as error:  # each provider fails in its own way
                entry["creates_session"] = False
                entry["note"] = str(error).splitlines()[0][:200]
        found.append(entry)
    return found


def _k_report(target: Path, draft: Path) -> dict[str, Any]:
    """The k that generation uses by default and where it comes from: the one source of k
    (``edgespec pair --profile`` measures alpha and the costs on this device and says whether
    another k would do better here)."""
    from edgespec.api import Engine

    engine = Engine.load(target=target, draft=draft, measure_energy=False)
    return {
        "k": engine.default_k,
        "source": engine.default_k_source,
        "measure_with": "edgespec pair --profile (alpha and costs on this device), or --k auto",
    }


def _pair(
    target: Path | None,
    draft: Path | None,
    *,
    available: int | None,
    budget_mb: float | None,
    context: int | None,
    measure: bool,
) -> dict[str, Any]:
    if target is None:
        pair = default_pair(verify_checksums=False)
        target = pair.target.root
        draft = draft or (pair.draft.root if pair.draft else None)
    target_bundle = load_bundle(target, verify_checksums=False)
    draft_bundle = load_bundle(draft, verify_checksums=False) if draft else None
    base = base_rss_bytes(MemoryProbe())
    check_context(context, target_bundle, draft_bundle)
    estimate = estimate_pair(target_bundle, draft_bundle, base_bytes=base, context=context)
    limit = budget_mb * MIB if budget_mb is not None else available
    bits = target_bundle.manifest.quantization.bits
    tight = limit is not None and estimate.total_bytes > limit / 2
    q = target_bundle.manifest.quantization
    quant = {
        "current": f"{q.weight_dtype} ({q.scheme})" if q.scheme != q.weight_dtype else q.scheme,
        "recommended": "int4" if tight and bits > 4 else "keep",
        "reason": (
            f"the estimate ({estimate.total_mb:.0f} MB) takes over half of "
            f"{'the budget' if budget_mb is not None else 'MemAvailable'}"
            if tight
            else "the estimate fits with room to spare"
        ),
    }
    result: dict[str, Any] = {
        "target": str(target),
        "draft": str(draft) if draft else None,
        "estimate": estimate.as_dict(),
        "fits": None if limit is None else estimate.total_bytes <= limit,
        "quantization": quant,
        "k": None,
    }
    if measure and draft is not None:
        result["k"] = _k_report(target, draft)
    graph = (draft_bundle or target_bundle).graph_path
    result["_graph"] = str(graph)
    return result


def diagnose(
    *,
    target: Path | None = None,
    draft: Path | None = None,
    memory_budget_mb: float | None = None,
    context: int | None = None,
    measure: bool = True,
    tree: Tree | None = None,
) -> dict[str, Any]:
    import psutil

    tree = tree or Tree()
    memory = MemoryProbe(tree).snapshot()
    battery = battery_state(tree)
    report: dict[str, Any] = {
        "device": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "logical_cores": os.cpu_count(),
            "physical_cores": psutil.cpu_count(logical=False),
        },
        "memory": memory.as_dict(),
        "battery": {"percent": battery.percent, "plugged": battery.plugged},
        "energy": discover(tree).as_dict(),
    }
    try:
        pair = _pair(
            target,
            draft,
            available=memory.mem_available_bytes,
            budget_mb=memory_budget_mb,
            context=context,
            measure=measure,
        )
        graph: Path | None = Path(pair.pop("_graph"))
        report["pair"] = pair
    except EdgespecError as error:
        report["pair"] = {"error": str(error)}
        graph = None
    report["providers"] = _providers(graph)
    report["gguf_kernels"] = gguf_kernel_path()
    return report


def _battery_words(battery: dict[str, Any]) -> str:
    if battery["percent"] is None and battery["plugged"] is None:
        return "none found (no battery under /sys/class/power_supply)"
    percent = "charge unknown" if battery["percent"] is None else f"{battery['percent']:.0f}%"
    plugged = {True: "plugged in", False: "on battery", None: "power source unknown"}
    return f"{percent}, {plugged[battery['plugged']]}"


def format_report(report: dict[str, Any]) -> str:
    device, memory = report["device"], report["memory"]
    lines = [
        f"device     {device['platform']} ({device['machine']}), {device['logical_cores']} "
        f"logical / {device['physical_cores']} physical cores",
        f"memory     {memory['mem_total_mb']} MB total, {memory['mem_available_mb']} MB "
        f"available, this process {memory['rss_mb']} MB"
        + (f", NvMap {memory['nvmap_used_mb']} MB" if memory["nvmap_used_mb"] else ""),
        f"battery    {_battery_words(report['battery'])}",
    ]
    for provider in report["providers"]:
        works = {True: "creates a session", False: "FAILS", None: ""}[provider["creates_session"]]
        shown = ", ".join(part for part in (works, provider["note"]) if part)
        lines.append(f"provider   {provider['name']}: {shown}")
    gguf = report["gguf_kernels"]
    lines.append(
        "kernels    GGUF kernels: "
        + (
            f"{gguf} path (GGUF imports run their quantized weights on them)"
            if gguf != "unavailable"
            else "not built in this install (GGUF imports run on ONNX Runtime's MatMulNBits)"
        )
    )
    energy = report["energy"]
    for found in energy["found"]:
        used = " [used]" if found["name"] == energy["used"] else ""
        lines.append(f"energy     {found['name']}: {found['scope']} ({found['detail']}){used}")
    for missing in energy["unavailable"]:
        lines.append(f"energy     {missing['name']}: unavailable: {missing['reason']}")
    if not energy["found"]:
        lines.append("energy     none: cpu_s_per_token is the energy proxy on this device")
    pair = report["pair"]
    if "error" in pair:
        lines.append(f"pair       {pair['error']}")
        return "\n".join(lines)
    estimate = pair["estimate"]
    lines.append(
        f"pair       {pair['target']} + {pair['draft']}: estimate {estimate['total_mb']} MB at "
        f"{estimate['context']} tokens (fits: {pair['fits']})"
    )
    quant = pair["quantization"]
    advice = "keep it" if quant["recommended"] == "keep" else f"use {quant['recommended']}"
    lines.append(f"quant      {quant['current']}: {advice} ({quant['reason']})")
    if pair["k"]:
        k = pair["k"]
        lines.append(f"k          {k['k']}, from {k['source']}; measure: {k['measure_with']}")
    return "\n".join(lines)
