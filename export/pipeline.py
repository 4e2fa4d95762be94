"""``export_bundle``: Hugging Face causal LM → verified, quantized ONNX bundle on disk."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

from edgespec._version import __version__
from edgespec.config import ExportConfig, resolve_quant
from edgespec.errors import ConfigError, VerificationError
from edgespec.events import ProgressEvent, ProgressObserver, ignore_progress
from edgespec.export.bundle import (
    file_records,
    kv_shape,
    memory_estimate,
    read_graph_spec,
    save_tokenizer,
    staging_directory,
)
from edgespec.export.onnx_export import GRAPH_FILE, export_graph, load_tokenizer, load_torch_model
from edgespec.export.quantize import EXTERNAL_DATA_FILE, QuantRequest, describe, quantize_graph
from edgespec.export.source import resolve_source
from edgespec.export.verify import (
    CALIBRATION_TEXT,
    GREEDY_TOKENS,
    PARITY_PROMPTS,
    GraphRunner,
    check_batch_invariance,
    check_parity,
)
from edgespec.manifest import (
    SCHEMA_VERSION,
    Bundle,
    Manifest,
    ModelSpec,
    VerificationRecord,
    load_bundle,
    write_manifest,
)

#: Default context limit written to the manifest when --max-length is not given.
DEFAULT_MAX_LENGTH = 4096
_TOOLCHAIN = ("torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime")
_DYNAMIC_INT8_WARNING = (
    "int8-dynamic computes one activation scale over all positions of a pass, so a k+1 "
    "position verify pass can disagree with k+1 single steps on near-ties and speculative "
    "greedy output may differ from the target's own; prefer int4 or int8 (MatMulNBits)"
)


@contextmanager
def _stage(name: str, message: str, observe: ProgressObserver) -> Iterator[None]:
    """Reports the start of a stage and, if it succeeds, its end with the elapsed time."""
    started = time.perf_counter()
    observe(ProgressEvent(stage=name, message=message))
    yield
    observe(
        ProgressEvent(
            stage=name, message=message, done=True, elapsed_s=time.perf_counter() - started
        )
    )


def export_bundle(config: ExportConfig, *, observe: ProgressObserver = ignore_progress) -> Bundle:
    """Exports ``config.model`` to ``config.out`` and returns the validated bundle.

    Nothing is left at ``config.out`` (or beside it) unless every step, verification included,
    succeeds.
    """
    # The cheap checks run silently first, so bad input gets its one-line error and nothing else.
    source = resolve_source(
        config.model, revision=config.revision, trust_remote_code=config.trust_remote_code
    )
    max_positions = int(getattr(source.config, "max_position_embeddings", 0) or 0)
    max_length = _max_length(config.max_length, max_positions)
    with staging_directory(config.out, force=config.force) as staging:
        with _stage("load", "loading the PyTorch model and tokenizer", observe):
            torch_model = load_torch_model(
                source, revision=config.revision, trust_remote_code=config.trust_remote_code
            )
            tokenizer = load_tokenizer(
                source, revision=config.revision, trust_remote_code=config.trust_remote_code
            )
            parameters = sum(int(p.numel()) for p in torch_model.parameters())
            quant = resolve_quant(config.quant, parameters)
        if quant == "int8-dynamic":
            observe(ProgressEvent(stage="quantize", message=_DYNAMIC_INT8_WARNING, warning=True))
        request = QuantRequest(
            quant=quant, block_size=config.block_size, accuracy_level=config.accuracy_level
        )
        with _stage("export", "exporting to ONNX (optimum, text-generation-with-past)", observe):
            fp32_dir = staging / ".fp32"
            fp32_graph = export_graph(torch_model, fp32_dir)
        graph_path = staging / GRAPH_FILE
        if quant == "fp32":
            for name in (GRAPH_FILE, EXTERNAL_DATA_FILE):
                if (fp32_dir / name).exists():
                    shutil.move(str(fp32_dir / name), str(staging / name))
        else:
            with _stage("quantize", f"quantizing to {quant}", observe):
                quantize_graph(fp32_graph, graph_path, request)
        shutil.rmtree(fp32_dir)
        graph_spec, weight_bytes = read_graph_spec(graph_path)
        kv_heads, head_dim = kv_shape(graph_spec)
        tokenizer_spec = save_tokenizer(tokenizer, torch_model.generation_config, staging)
        torch_model.config.save_pretrained(str(staging))
        if config.verify:
            with _stage("verify", "verifying against PyTorch", observe):
                runner = GraphRunner(graph_path, graph_spec, kv_heads=kv_heads, head_dim=head_dim)
                verification = _verify(
                    runner,
                    torch_model,
                    tokenizer,
                    quant=quant,
                    max_length=max_length,
                    config=config,
                    observe=observe,
                )
        else:
            verification = VerificationRecord(performed=False)
        with _stage("write", "writing the bundle", observe):
            roles = {name: "tokenizer" for name in tokenizer_spec.files}
            roles["config.json"] = "config"
            roles[GRAPH_FILE] = "graph"
            if (staging / EXTERNAL_DATA_FILE).exists():
                roles[EXTERNAL_DATA_FILE] = "graph_data"
            files = file_records(staging, roles)
            logits_shape = next(t.shape for t in graph_spec.outputs if t.name == graph_spec.logits)
            vocab_size = (
                logits_shape[-1]
                if isinstance(logits_shape[-1], int)
                else int(source.config.vocab_size)
            )
            manifest = Manifest(
                schema_version=SCHEMA_VERSION,
                edgespec_version=__version__,
                created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                source=source.spec,
                model=ModelSpec(
                    model_type=str(source.config.model_type),
                    architecture=type(torch_model).__name__,
                    parameters=parameters,
                    num_layers=len(graph_spec.past_key),
                    num_attention_heads=int(source.config.num_attention_heads),
                    num_kv_heads=kv_heads,
                    head_dim=head_dim,
                    hidden_size=int(source.config.hidden_size),
                    vocab_size=vocab_size,
                    max_position_embeddings=max_positions,
                    max_length=max_length,
                ),
                graph=graph_spec,
                tokenizer=tokenizer_spec,
                quantization=describe(request),
                verification=verification,
                memory=memory_estimate(
                    graph_spec,
                    weight_bytes=weight_bytes,
                    vocab_size=vocab_size,
                    file_bytes=sum(f.size for f in files if f.role in ("graph", "graph_data")),
                ),
                files=files,
                toolchain=_toolchain(),
            )
            write_manifest(staging, manifest)
    return load_bundle(config.out)


def _max_length(requested: int | None, max_positions: int) -> int:
    if requested is None:
        return min(max_positions, DEFAULT_MAX_LENGTH) if max_positions else DEFAULT_MAX_LENGTH
    if max_positions and requested > max_positions:
        raise ConfigError(
            f"--max-length {requested} exceeds the model's {max_positions} positions",
            fix=f"pass --max-length {max_positions} or less",
        )
    return requested


def _verify(
    runner: GraphRunner,
    torch_model: Any,
    tokenizer: Any,
    *,
    quant: str,
    max_length: int,
    config: ExportConfig,
    observe: ProgressObserver,
) -> VerificationRecord:
    import onnxruntime

    greedy_tokens = min(GREEDY_TOKENS, max_length // 2)
    prompts = [
        tokenizer(text)["input_ids"][: max_length - greedy_tokens] for text in PARITY_PROMPTS
    ]
    exact_dtype = {"fp32": "float32", "fp16": "float16"}.get(quant)
    parity = check_parity(
        runner,
        torch_model,
        prompts,
        exact_dtype=exact_dtype,
        min_top1_agreement=config.min_top1_agreement,
        greedy_tokens=greedy_tokens,
        observe=observe,
    )
    if not parity.passed:
        raise VerificationError(_describe_parity_failure(parity, quant))
    calibration = tokenizer(CALIBRATION_TEXT)["input_ids"][:max_length]
    invariance = check_batch_invariance(runner, calibration, observe=observe)
    if not invariance.passed:
        problem = (
            f"the {quant} graph is not batch invariant: "
            f"{invariance.argmax_mismatch_fraction:.1%} of {invariance.positions} positions "
            f"pick a different argmax in a multi-token pass than one position at a time "
            f"(max |Δlogit| {invariance.max_abs_logit_diff:.3g}), so speculative greedy output "
            "would not equal the target's greedy output"
        )
        if not config.allow_batch_variance:
            raise VerificationError(
                problem,
                fix="try --accuracy-level 1 or another --quant (fp32, int4), or pass "
                "--allow-batch-variance to keep it (recorded in the manifest)",
            )
        observe(ProgressEvent(stage="verify", message=problem, warning=True))
    return VerificationRecord(
        performed=True,
        providers=runner.providers,
        onnxruntime_version=onnxruntime.__version__,
        parity=parity,
        batch_invariance=invariance,
    )


def _describe_parity_failure(parity: Any, quant: str) -> str:
    if "top1_agreement" in parity.required:
        return (
            f"the {quant} graph agrees with PyTorch on the top-1 token at only "
            f"{parity.top1_agreement:.1%} of {parity.positions} positions (need "
            f"{parity.min_top1_agreement:.0%}); try a smaller --block-size, int8, or fp32"
        )
    return (
        f"the {quant} graph differs from PyTorch: max |Δlogit| {parity.max_abs_logit_diff:.3g} "
        f"(tolerance {parity.logit_tolerance:.3g}); greedy continuations identical for "
        f"{parity.greedy_match_tokens} of {parity.greedy_tokens} tokens, parting where PyTorch's "
        f"top-1 margin was {', '.join(f'{m:.3g}' for m in parity.greedy_divergence_margins)}; "
        "report this with the model id, or pass --no-verify to keep the graph anyway"
    )


def _toolchain() -> dict[str, str]:
    versions = {"edgespec": __version__}
    for name in _TOOLCHAIN:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions
