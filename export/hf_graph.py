"""``edgespec export HF_DIR --graph inplace``: a Hugging Face Llama, Mistral, Phi-3,
Qwen2, Qwen3 or Gemma 3 checkpoint as the in-place KV graph the GGUF importer builds
(GroupQueryAttention over one buffer per layer, rollback by length).

The checkpoint's tensors are presented to the GGUF graph builder under llama.cpp's names;
Hugging Face's rotate-half rotary embedding is GroupQueryAttention's non-interleaved mode, so
no row of Q or K is permuted. ``--quant`` quantizes as llama.cpp does, with the ``gguf``
package's reference quantizers, so the graph runs the same MatMulNBits blocks as an imported
GGUF: int4 is Q4_1 (a scale and a minimum per block of 32) for the linear layers with the
embedding (and an untied LM head) in Q8_0, int8 is Q8_0 throughout. The checks are the
importer's (parity with a float64 numpy forward of the graph's own weights, batch
invariance) plus agreement with PyTorch itself: within float tolerance for fp32, top-1
agreement for the quantized graphs (the quantization's cost, gated by ``--min-top1``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.config import ExportConfig, resolve_quant
from edgespec.errors import ConfigError, VerificationError
from edgespec.events import ProgressEvent, ProgressObserver, ignore_progress
from edgespec.export.bundle import (
    file_records,
    memory_estimate,
    save_tokenizer,
    staging_directory,
    write_bundle_manifest,
)
from edgespec.export.gguf import check
from edgespec.export.gguf.graph import KVLayout
from edgespec.export.gguf.manifest_records import DATA_FILE, GRAPH_FILE, graph_spec, model_spec
from edgespec.export.gguf.pipeline import write_graph
from edgespec.export.half_attention import add_half_attention
from edgespec.export.hf_source import (
    BLOCK_TYPES,
    CheckpointSource,
    QuantizedTensor,
    checkpoint_source,
    unsupported_reason,
)
from edgespec.export.onnx_export import load_tokenizer, load_torch_model
from edgespec.export.source import resolve_source
from edgespec.graph.driver import check_session
from edgespec.manifest import (
    Bundle,
    QuantizationSpec,
    VerificationRecord,
    load_bundle,
)

#: PyTorch and the float32 graph on the same prompt: max |Δlogit| allowed.
TORCH_TOLERANCE = 1e-3
#: Top-1 agreement with a float64 forward of the graph's own weights below which the graph
#: is miswired (the GGUF importer's default gate).
WIRING_MIN_TOP1 = 0.8


def covers(config: ExportConfig) -> bool:
    """Whether ``--graph auto`` takes the in-place graph for this export (config.json only)."""
    if config.quant not in ("auto", *BLOCK_TYPES) or config.block_size != 32:
        return False
    source = resolve_source(
        config.model, revision=config.revision, trust_remote_code=config.trust_remote_code
    )
    positions = int(getattr(source.config, "max_position_embeddings", 0) or 0) or None
    capacity = min(config.max_length or 2048, positions or 2048)
    return unsupported_reason(source.config, capacity) is None


def export_inplace(config: ExportConfig, *, observe: ProgressObserver = ignore_progress) -> Bundle:
    """Loads the checkpoint, builds, checks and writes the in-place bundle."""
    if config.quant not in ("auto", *BLOCK_TYPES):
        raise ConfigError(
            f"--graph inplace writes {', '.join(BLOCK_TYPES)} graphs, not {config.quant}",
            fix="pass --quant int4, int8 or fp32, or --graph optimum for the others",
        )
    if config.block_size != 32:
        raise ConfigError(
            f"--graph inplace quantizes in llama.cpp's blocks of 32, not {config.block_size}",
            fix="leave --block-size out",
        )
    source = resolve_source(
        config.model, revision=config.revision, trust_remote_code=config.trust_remote_code
    )
    positions = int(getattr(source.config, "max_position_embeddings", 0) or 0)
    if config.max_length and positions and config.max_length > positions:
        raise ConfigError(
            f"--max-length {config.max_length} exceeds the model's {positions} positions",
            fix=f"pass --max-length {positions} or less",
        )
    with staging_directory(config.out, force=config.force) as staging:
        observe(ProgressEvent(stage="load", message="loading the PyTorch model and tokenizer"))
        torch_model = load_torch_model(
            source, revision=config.revision, trust_remote_code=config.trust_remote_code
        )
        tokenizer = load_tokenizer(
            source, revision=config.revision, trust_remote_code=config.trust_remote_code
        )
        positions = int(torch_model.config.max_position_embeddings)
        capacity = min(config.max_length or 2048, positions)
        parameters = sum(int(p.numel()) for p in torch_model.parameters())
        quant = resolve_quant(config.quant, parameters)
        started = time.perf_counter()
        checkpoint = checkpoint_source(torch_model, quant, capacity)
        builder, layout = write_graph(
            checkpoint,
            staging,
            capacity=capacity,
            accuracy=config.accuracy_level,
            attention=config.attention,
        )
        observe(
            ProgressEvent(
                stage="graph", message="built", done=True, elapsed_s=time.perf_counter() - started
            )
        )
        tokenizer_spec = save_tokenizer(tokenizer, torch_model.generation_config, staging)
        verification, min_width, torch_top1 = _verify(
            checkpoint, staging / GRAPH_FILE, torch_model, tokenizer, config, layout, observe
        )
        roles = {
            GRAPH_FILE: "graph",
            DATA_FILE: "graph_data",
            **{name: "tokenizer" for name in tokenizer_spec.files},
        }
        spec = add_half_attention(staging, graph_spec(checkpoint, layout, min_width), roles)
        weight_bytes = (staging / DATA_FILE).stat().st_size
        files = file_records(staging, roles)
        arch = checkpoint.architecture
        write_bundle_manifest(
            staging,
            config,
            source=source.spec,
            model=model_spec(
                arch,
                model_type=str(torch_model.config.model_type),
                architecture=type(torch_model).__name__,
                parameters=parameters,
                positions=positions,
                capacity=capacity,
            ),
            graph=spec,
            tokenizer=tokenizer_spec,
            quantization=_quantization(quant, builder, config.accuracy_level),
            verification=verification,
            memory=memory_estimate(
                spec,
                weight_bytes=weight_bytes,
                vocab_size=arch.vocab_size,
                file_bytes=weight_bytes + (staging / GRAPH_FILE).stat().st_size,
            ),
            files=files,
            packages=("edgespec", "onnx"),
            extra={
                "graph_builder": "inplace",
                "torch_top1_agreement": torch_top1,
                "rope_scaling": arch.rope_scaling.describe,
            },
        )
    return load_bundle(config.out)


def _quantization(quant: str, builder: Any, accuracy: int) -> QuantizationSpec:
    if quant == "fp32":
        return QuantizationSpec(scheme="none", weight_dtype="float32", bits=32)
    linear, table = BLOCK_TYPES[quant]
    assert linear is not None and table is not None
    return QuantizationSpec(
        scheme="matmul_nbits",
        weight_dtype="/".join(sorted({linear.lower(), table.lower()})),
        bits=min(w.bits for w in builder.quantized),
        block_size=32,
        accuracy_level=accuracy,
        symmetric=quant == "int8",
        op_types=("MatMulNBits", "Gather"),
        tool="edgespec in-place builder (gguf reference quantizers)",
    )


def _verify(
    checkpoint: CheckpointSource,
    graph_path: Path,
    torch_model: Any,
    tokenizer: Any,
    config: ExportConfig,
    layout: KVLayout,
    observe: ProgressObserver,
) -> tuple[VerificationRecord, int, float | None]:
    """The importer's checks (a float graph at width 1 first, else padded to 2) and agreement
    with PyTorch; returns the record, the narrowest pass and the top-1 agreement with PyTorch."""
    if not config.verify:
        return VerificationRecord(performed=False), 2, None
    import onnxruntime
    import torch

    quantized = any(isinstance(t, QuantizedTensor) for t in checkpoint.tensors.values())
    min_width = 2 if quantized else 1
    session = check_session(graph_path)
    driver = check.check_driver(session, checkpoint, graph_spec(checkpoint, layout, min_width))
    prompts = [tokenizer(text)["input_ids"][:48] for text in check.PARITY_TEXTS]
    observe(ProgressEvent(stage="verify", message="parity with the graph's weights (numpy)"))
    # A wiring check (a quantized graph's 8-bit activations stray a little); --min-top1 gates
    # the agreement with PyTorch below, which is the quantization's cost.
    parity = check.check_parity(driver, checkpoint, prompts, min_top1=WIRING_MIN_TOP1)
    observe(ProgressEvent(stage="verify", message="agreement with PyTorch"))
    agree = positions = 0
    torch_diff = 0.0
    for prompt in prompts:
        with torch.no_grad():
            theirs = torch_model(torch.tensor([prompt])).logits[0].float().numpy()
        ours = driver.forward(prompt, driver.new_cache())
        torch_diff = max(torch_diff, float(np.abs(ours - theirs).max()))
        agree += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
        positions += len(prompt)
    torch_top1 = agree / positions
    largest = float(np.abs(theirs).max())
    wrong = torch_diff > TORCH_TOLERANCE * max(1.0, largest) if not quantized else False
    if not parity.passed or wrong:
        raise VerificationError(
            f"the in-place graph does not reproduce the checkpoint (max |Δlogit| against "
            f"PyTorch {torch_diff:.3g}, top-1 against its own weights "
            f"{parity.top1_agreement:.1%}): the model uses a feature the builder does not know",
            fix="export with --graph optimum (the default)",
        )
    if torch_top1 < config.min_top1_agreement:
        raise VerificationError(
            f"the quantized graph agrees with PyTorch on the top-1 token at only "
            f"{torch_top1:.1%} of {positions} positions (need {config.min_top1_agreement:.0%})",
            fix="try --quant int8 or fp32",
        )
    observe(ProgressEvent(stage="verify", message="batch invariance, widths 2-9"))
    invariance, driver = check.batch_invariance(driver, checkpoint, prompts, observe=observe)
    if not invariance.passed and not config.allow_batch_variance:
        raise VerificationError(
            f"argmax differs at {invariance.argmax_mismatch_fraction:.1%} of positions between "
            "multi-token and one-token passes",
            fix="pass --allow-batch-variance to keep it anyway",
        )
    record = VerificationRecord(
        performed=True,
        providers=("CPUExecutionProvider",),
        onnxruntime_version=onnxruntime.__version__,
        parity=parity,
        batch_invariance=invariance,
    )
    return record, driver.graph.min_pass_width, torch_top1
