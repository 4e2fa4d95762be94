"""``edgespec export HF_DIR --graph inplace``: a Hugging Face Llama or Qwen2 checkpoint as the
in-place KV graph the GGUF importer builds (GroupQueryAttention over one buffer per layer,
rollback by length), in float32.

The checkpoint's tensors are presented to the GGUF graph builder under llama.cpp's names,
unquantized; Hugging Face's rotate-half rotary embedding is GroupQueryAttention's
non-interleaved mode, so no row of Q or K is permuted. The checks are the importer's (parity
with a float64 numpy forward of the same weights, batch invariance) plus parity with
PyTorch itself, which catches an architecture feature the builder does not know.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edgespec._version import __version__
from edgespec.config import ExportConfig
from edgespec.errors import ConfigError, UnsupportedModelError, VerificationError
from edgespec.events import ProgressEvent, ProgressObserver, ignore_progress
from edgespec.export.bundle import file_records, memory_estimate, save_tokenizer, staging_directory
from edgespec.export.gguf import check
from edgespec.export.gguf.graph import build_graph
from edgespec.export.gguf.pipeline import DATA_FILE, GRAPH_FILE, graph_spec
from edgespec.export.gguf.reader import GGUFArchitecture
from edgespec.export.onnx_export import load_tokenizer, load_torch_model
from edgespec.export.source import resolve_source
from edgespec.manifest import (
    SCHEMA_VERSION,
    Bundle,
    Manifest,
    ModelSpec,
    QuantizationSpec,
    VerificationRecord,
    load_bundle,
    system_prompt_extra,
    write_manifest,
)

#: Hugging Face model types whose blocks the builder covers, as llama.cpp names them.
INPLACE_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2"}
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
#: PyTorch and the float32 graph on the same prompt: max |Δlogit| allowed.
TORCH_TOLERANCE = 1e-3


@dataclass(frozen=True)
class FloatTensor:
    """A float32 weight shaped as the GGUF reader's tensors are: ``shape`` lists the
    dimensions innermost first (columns, then rows)."""

    data: np.ndarray

    @property
    def tensor_type(self) -> Any:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType.F32

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.data.shape))

    @property
    def n_elements(self) -> int:
        return int(self.data.size)


@dataclass(frozen=True)
class CheckpointSource:
    """A Hugging Face checkpoint under llama.cpp's tensor names, for the graph builder."""

    architecture: GGUFArchitecture
    tensors: dict[str, FloatTensor]

    def tensor(self, name: str) -> FloatTensor:
        return self.tensors[name]


def checkpoint_source(torch_model: Any) -> CheckpointSource:
    """Maps the model's state dict and config; refuses what the builder would get wrong."""
    config = torch_model.config
    arch = INPLACE_MODEL_TYPES.get(config.model_type)
    if arch is None:
        raise UnsupportedModelError(
            f"--graph inplace covers {', '.join(INPLACE_MODEL_TYPES)}, not {config.model_type}",
            fix="export with --graph optimum (the default)",
        )
    if getattr(config, "rope_scaling", None) or (
        getattr(config, "sliding_window", None) and (getattr(config, "use_sliding_window", False))
    ):
        raise UnsupportedModelError(
            f"{config.model_type} with rope scaling or sliding-window attention is not covered "
            "by --graph inplace",
            fix="export with --graph optimum (the default)",
        )
    state = {name: t.detach().float().numpy() for name, t in torch_model.state_dict().items()}
    tensors = {"token_embd.weight": state["model.embed_tokens.weight"]}
    for layer in range(config.num_hidden_layers):
        for hf_name, gguf_name in _LAYER_NAMES.items():
            prefix = f"model.layers.{layer}.{hf_name}"
            tensors[f"blk.{layer}.{gguf_name}.weight"] = state[f"{prefix}.weight"]
            if f"{prefix}.bias" in state:
                tensors[f"blk.{layer}.{gguf_name}.bias"] = state[f"{prefix}.bias"]
    tensors["output_norm.weight"] = state["model.norm.weight"]
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if not tied:
        tensors["output.weight"] = state["lm_head.weight"]
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    rope = getattr(config, "rope_parameters", None) or {}
    architecture = GGUFArchitecture(
        arch=arch,
        name=str(getattr(config, "_name_or_path", arch)),
        num_layers=int(config.num_hidden_layers),
        hidden_size=int(config.hidden_size),
        intermediate_size=int(config.intermediate_size),
        num_heads=heads,
        num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        vocab_size=int(state["model.embed_tokens.weight"].shape[0]),
        context_length=int(config.max_position_embeddings),
        rope_theta=float(getattr(config, "rope_theta", None) or rope.get("rope_theta", 10000.0)),
        rope_interleaved=False,  # Hugging Face rotates halves
        rms_norm_eps=float(config.rms_norm_eps),
        tied_embeddings=tied,
        qkv_bias="blk.0.attn_q.bias" in tensors,
    )
    return CheckpointSource(
        architecture=architecture,
        tensors={name: FloatTensor(np.ascontiguousarray(t)) for name, t in tensors.items()},
    )


def export_inplace(config: ExportConfig, *, observe: ProgressObserver = ignore_progress) -> Bundle:
    """Loads the checkpoint, builds, checks and writes the in-place float32 bundle."""
    import onnx

    if config.quant not in ("auto", "fp32"):
        raise ConfigError(
            f"--graph inplace writes float32 graphs, not {config.quant}",
            fix="pass --quant fp32, or --graph optimum for quantized graphs",
        )
    source = resolve_source(
        config.model, revision=config.revision, trust_remote_code=config.trust_remote_code
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
        checkpoint = checkpoint_source(torch_model)
        started = time.perf_counter()
        model, _ = build_graph(checkpoint, capacity=capacity, accuracy_level=config.accuracy_level)
        onnx.save(
            model,
            str(staging / GRAPH_FILE),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=DATA_FILE,
            size_threshold=1024,
        )
        observe(
            ProgressEvent(
                stage="graph", message="built", done=True, elapsed_s=time.perf_counter() - started
            )
        )
        tokenizer_spec = save_tokenizer(tokenizer, torch_model.generation_config, staging)
        verification, min_width = _verify(
            checkpoint, staging / GRAPH_FILE, torch_model, tokenizer, config, capacity
        )
        spec = graph_spec(checkpoint, capacity, min_width)
        weight_bytes = (staging / DATA_FILE).stat().st_size
        files = file_records(
            staging,
            {
                GRAPH_FILE: "graph",
                DATA_FILE: "graph_data",
                **{name: "tokenizer" for name in tokenizer_spec.files},
            },
        )
        arch = checkpoint.architecture
        manifest = Manifest(
            schema_version=SCHEMA_VERSION,
            edgespec_version=__version__,
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            source=source.spec,
            model=ModelSpec(
                model_type=str(torch_model.config.model_type),
                architecture=type(torch_model).__name__,
                parameters=sum(int(p.numel()) for p in torch_model.parameters()),
                num_layers=arch.num_layers,
                num_attention_heads=arch.num_heads,
                num_kv_heads=arch.num_kv_heads,
                head_dim=arch.head_dim,
                hidden_size=arch.hidden_size,
                vocab_size=arch.vocab_size,
                max_position_embeddings=positions,
                max_length=capacity,
            ),
            graph=spec,
            tokenizer=tokenizer_spec,
            quantization=QuantizationSpec(scheme="none", weight_dtype="float32", bits=32),
            verification=verification,
            memory=memory_estimate(
                spec,
                weight_bytes=weight_bytes,
                vocab_size=arch.vocab_size,
                file_bytes=weight_bytes + (staging / GRAPH_FILE).stat().st_size,
            ),
            files=files,
            toolchain={"edgespec": __version__, "onnx": onnx.__version__},
            extra={
                "graph_builder": "inplace",
                **system_prompt_extra(config.system_prompt),
                **config.extra,
            },
        )
        write_manifest(staging, manifest)
    return load_bundle(config.out)


def _verify(
    checkpoint: CheckpointSource,
    graph_path: Path,
    torch_model: Any,
    tokenizer: Any,
    config: ExportConfig,
    capacity: int,
) -> tuple[VerificationRecord, int]:
    """The importer's checks (width 1 first, else padded to 2) and parity with PyTorch."""
    if not config.verify:
        return VerificationRecord(performed=False), 2
    import onnxruntime
    import torch

    runner = check.GraphRunner(graph_path, checkpoint, capacity=capacity, min_width=1)
    prompts = [tokenizer(text)["input_ids"][:48] for text in check.PARITY_TEXTS]
    parity = check.check_parity(runner, checkpoint, prompts, min_top1=config.min_top1_agreement)
    with torch.no_grad():
        theirs = torch_model(torch.tensor([prompts[0]])).logits[0].float().numpy()
    ours = runner.forward(prompts[0], 0, runner.empty())
    torch_diff = float(np.abs(ours - theirs).max())
    if not parity.passed or torch_diff > TORCH_TOLERANCE * max(1.0, float(np.abs(theirs).max())):
        raise VerificationError(
            f"the in-place graph does not reproduce the checkpoint (max |Δlogit| against "
            f"PyTorch {torch_diff:.3g}, top-1 against its own weights "
            f"{parity.top1_agreement:.1%}): the model uses a feature the builder does not know",
            fix="export with --graph optimum (the default)",
        )
    sample = [t for prompt in prompts for t in prompt] + runner.greedy(prompts[0], 48)
    invariance = check.check_batch_invariance(runner, sample[: 16 + 9 * 8])
    if not invariance.passed:
        runner.min_width = 2
        invariance = check.check_batch_invariance(runner, sample[: 16 + 9 * 8])
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
    return record, runner.min_width
