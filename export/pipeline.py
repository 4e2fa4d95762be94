"""``export_bundle``: Hugging Face causal LM → verified, quantized ONNX bundle on disk."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.config import ExportConfig, resolve_quant
from edgespec.errors import ConfigError, VerificationError
from edgespec.events import ProgressEvent, ProgressObserver, ignore_progress
from edgespec.export.bundle import (
    file_records,
    kv_shape,
    logits_width,
    memory_estimate,
    read_graph_spec,
    save_tokenizer,
    staging_directory,
    write_bundle_manifest,
)
from edgespec.export.invariance import check_batch_invariance
from edgespec.export.onnx_export import GRAPH_FILE, export_graph, load_tokenizer, load_torch_model
from edgespec.export.quantize import (
    EXTERNAL_DATA_FILE,
    RECIPES,
    QuantRequest,
    describe,
    quantize_graph,
)
from edgespec.export.recipes import choose_recipe, parity_prompts
from edgespec.export.source import ResolvedSource, resolve_source
from edgespec.export.verify import (
    CALIBRATION_TEXT,
    calibration_streams,
    check_parity,
    optimum_driver,
)
from edgespec.graph.driver import GraphDriver
from edgespec.manifest import (
    Bundle,
    FileRecord,
    GraphSpec,
    ModelSpec,
    TokenizerSpec,
    VerificationRecord,
    load_bundle,
)

#: Default context limit written to the manifest when --max-length is not given.
DEFAULT_MAX_LENGTH = 4096
#: The packages whose versions the manifest records.
TOOLCHAIN = ("edgespec", "torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime")
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


@dataclass(frozen=True, kw_only=True)
class _LoadedModel:
    """The PyTorch model and tokenizer, with the quantization their size resolves to."""

    torch_model: Any
    tokenizer: Any
    parameters: int  # total parameter count: --quant auto picks the scheme from it
    quant: str  # the resolved scheme, never "auto"


@dataclass(frozen=True, kw_only=True)
class _StagedGraph:
    """The final (quantized) graph in the staging directory and what its I/O records."""

    path: Path
    spec: GraphSpec
    weight_bytes: int  # all initializers, external data included
    kv_heads: int  # past key/value inputs are [batch, kv_heads, past, head_dim]
    head_dim: int


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
        loaded = _load_model(source, config, observe=observe)
        request = QuantRequest(
            quant=loaded.quant, block_size=config.block_size, accuracy_level=config.accuracy_level
        )
        graph, request, recipes = _stage_graph(
            loaded, staging, request=request, max_length=max_length, observe=observe
        )
        tokenizer_spec = save_tokenizer(
            loaded.tokenizer, loaded.torch_model.generation_config, staging
        )
        loaded.torch_model.config.save_pretrained(str(staging))
        vocab_size = logits_width(graph.spec, source.config)
        verification = _verification(
            graph,
            loaded,
            vocab_size=vocab_size,
            max_length=max_length,
            config=config,
            observe=observe,
        )
        with _stage("write", "writing the bundle", observe):
            files = _file_records(staging, tokenizer_spec)
            write_bundle_manifest(
                staging,
                config,
                source=source.spec,
                model=_model_spec(
                    source,
                    loaded,
                    graph,
                    vocab_size=vocab_size,
                    max_positions=max_positions,
                    max_length=max_length,
                ),
                graph=graph.spec,
                tokenizer=tokenizer_spec,
                quantization=describe(request),
                verification=verification,
                memory=memory_estimate(
                    graph.spec,
                    weight_bytes=graph.weight_bytes,
                    vocab_size=vocab_size,
                    file_bytes=sum(f.size for f in files if f.role in ("graph", "graph_data")),
                ),
                files=files,
                packages=TOOLCHAIN,
                extra={"int4_recipes": recipes} if recipes else {},
            )
    return load_bundle(config.out)


def _load_model(
    source: ResolvedSource, config: ExportConfig, *, observe: ProgressObserver
) -> _LoadedModel:
    """Loads the PyTorch model and tokenizer, and resolves ``--quant`` against the model size."""
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
    return _LoadedModel(
        torch_model=torch_model, tokenizer=tokenizer, parameters=parameters, quant=quant
    )


def _stage_graph(
    loaded: _LoadedModel,
    staging: Path,
    *,
    request: QuantRequest,
    max_length: int,
    observe: ProgressObserver,
) -> tuple[_StagedGraph, QuantRequest, list[dict[str, Any]]]:
    """Exports the fp32 graph beside the bundle, then moves or quantizes it into ``staging``
    (int4: with the recipe that agrees best with PyTorch, and every recipe's record)."""
    with _stage("export", "exporting to ONNX (optimum, text-generation-with-past)", observe):
        fp32_dir = staging / ".fp32"
        fp32_graph = export_graph(loaded.torch_model, fp32_dir)
    graph_path = staging / GRAPH_FILE
    recipes: list[dict[str, Any]] = []
    if request.quant == "fp32":
        for name in (GRAPH_FILE, EXTERNAL_DATA_FILE):
            if (fp32_dir / name).exists():
                shutil.move(str(fp32_dir / name), str(staging / name))
    elif request.quant == "int4":
        with _stage("quantize", "quantizing to int4 (comparing recipes)", observe):
            request, recipes = choose_recipe(
                fp32_graph,
                staging,
                request,
                torch_model=loaded.torch_model,
                tokenizer=loaded.tokenizer,
                max_length=max_length,
                observe=observe,
            )
    else:
        with _stage("quantize", f"quantizing to {request.quant}", observe):
            quantize_graph(fp32_graph, graph_path, request)
    shutil.rmtree(fp32_dir)
    graph_spec, weight_bytes = read_graph_spec(graph_path)
    kv_heads, head_dim = kv_shape(graph_spec)
    staged = _StagedGraph(
        path=graph_path,
        spec=graph_spec,
        weight_bytes=weight_bytes,
        kv_heads=kv_heads,
        head_dim=head_dim,
    )
    return staged, request, recipes


def _verification(
    graph: _StagedGraph,
    loaded: _LoadedModel,
    *,
    vocab_size: int,
    max_length: int,
    config: ExportConfig,
    observe: ProgressObserver,
) -> VerificationRecord:
    """Runs the checks against PyTorch unless ``--no-verify``, which is recorded as such."""
    if not config.verify:
        return VerificationRecord(performed=False)
    with _stage("verify", "verifying against PyTorch", observe):
        driver = optimum_driver(graph.path, graph.spec, vocab_size=vocab_size, capacity=max_length)
        return _verify(
            driver,
            loaded.torch_model,
            loaded.tokenizer,
            quant=loaded.quant,
            max_length=max_length,
            config=config,
            observe=observe,
        )


def _file_records(staging: Path, tokenizer_spec: TokenizerSpec) -> tuple[FileRecord, ...]:
    """Size and hash of every bundle file, each with its role in the manifest."""
    roles = {name: "tokenizer" for name in tokenizer_spec.files}
    roles["config.json"] = "config"
    roles[GRAPH_FILE] = "graph"
    if (staging / EXTERNAL_DATA_FILE).exists():
        roles[EXTERNAL_DATA_FILE] = "graph_data"
    return file_records(staging, roles)


def _model_spec(
    source: ResolvedSource,
    loaded: _LoadedModel,
    graph: _StagedGraph,
    *,
    vocab_size: int,
    max_positions: int,
    max_length: int,
) -> ModelSpec:
    return ModelSpec(
        model_type=str(source.config.model_type),
        architecture=type(loaded.torch_model).__name__,
        parameters=loaded.parameters,
        num_layers=len(graph.spec.past_key),
        num_attention_heads=int(source.config.num_attention_heads),
        num_kv_heads=graph.kv_heads,
        head_dim=graph.head_dim,
        hidden_size=int(source.config.hidden_size),
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        max_length=max_length,
    )


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
    driver: GraphDriver,
    torch_model: Any,
    tokenizer: Any,
    *,
    quant: str,
    max_length: int,
    config: ExportConfig,
    observe: ProgressObserver,
) -> VerificationRecord:
    import onnxruntime

    prompts, greedy_tokens = parity_prompts(tokenizer, max_length)
    exact_dtype = {"fp32": "float32", "fp16": "float16"}.get(quant)
    parity = check_parity(
        driver,
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
    streams, prefill = calibration_streams(driver, calibration)
    invariance = check_batch_invariance(driver, streams, prefill=prefill, observe=observe)
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
        providers=tuple(driver.session.get_providers()),
        onnxruntime_version=onnxruntime.__version__,
        parity=parity,
        batch_invariance=invariance,
    )


def _describe_parity_failure(parity: Any, quant: str) -> str:
    if "top1_agreement" in parity.required:
        return (
            f"the {quant} graph agrees with PyTorch on the top-1 token at only "
            f"{parity.top1_agreement:.1%} of {parity.positions} positions (need "
            f"{parity.min_top1_agreement:.0%}"
            + (f"; the best of the recipes {', '.join(RECIPES)})" if quant == "int4" else ")")
            + "; try a smaller --block-size, int8, or fp32"
        )
    return (
        f"the {quant} graph differs from PyTorch: max |Δlogit| {parity.max_abs_logit_diff:.3g} "
        f"(tolerance {parity.logit_tolerance:.3g}); greedy continuations identical for "
        f"{parity.greedy_match_tokens} of {parity.greedy_tokens} tokens, parting where PyTorch's "
        f"top-1 margin was {', '.join(f'{m:.3g}' for m in parity.greedy_divergence_margins)}; "
        "report this with the model id, or pass --no-verify to keep the graph anyway"
    )
