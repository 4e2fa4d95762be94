"""``edgespec export HF_DIR --graph inplace``: a Hugging Face Llama or Qwen2 checkpoint as the
in-place KV graph the GGUF importer builds (GroupQueryAttention over one buffer per layer,
rollback by length).

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
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edgespec._version import __version__
from edgespec.config import ExportConfig, resolve_quant
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
#: Top-1 agreement with a float64 forward of the graph's own weights below which the graph
#: is miswired (the GGUF importer's default gate).
WIRING_MIN_TOP1 = 0.8


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
class QuantizedTensor:
    """llama.cpp blocks of a weight [rows, columns], shaped as the GGUF reader's tensors."""

    data: np.ndarray  # uint8 [rows, bytes per row]
    tensor_type: Any
    shape: tuple[int, int]  # (columns, rows)

    @property
    def n_elements(self) -> int:
        return self.shape[0] * self.shape[1]


#: --quant → llama.cpp block type of the linear layers and of the embedding / LM head.
BLOCK_TYPES = {"int4": ("Q4_1", "Q8_0"), "int8": ("Q8_0", "Q8_0"), "fp32": (None, None)}


def _quantized(weight: np.ndarray, kind: str | None) -> FloatTensor | QuantizedTensor:
    if kind is None or weight.ndim != 2 or weight.shape[1] % 32:
        return FloatTensor(np.ascontiguousarray(weight))
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[kind]
    blocks = quants.quantize(np.ascontiguousarray(weight, dtype=np.float32), qtype)
    return QuantizedTensor(data=blocks, tensor_type=qtype, shape=(weight.shape[1], weight.shape[0]))


@dataclass(frozen=True)
class CheckpointSource:
    """A Hugging Face checkpoint under llama.cpp's tensor names, for the graph builder."""

    architecture: GGUFArchitecture
    tensors: dict[str, FloatTensor | QuantizedTensor]

    def tensor(self, name: str) -> FloatTensor | QuantizedTensor:
        return self.tensors[name]


def unsupported_reason(config: Any) -> str | None:
    """Why the builder cannot express this Hugging Face config (None: it can)."""
    if config.model_type not in INPLACE_MODEL_TYPES:
        covered = " and ".join(INPLACE_MODEL_TYPES)
        return f"a {config.model_type} model (it covers {covered})"
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None)
    if rope and rope.get("rope_type", rope.get("type", "default")) != "default":
        return f"{rope.get('rope_type', rope.get('type'))} rope scaling"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        return f"a {config.hidden_act} or biased MLP"
    if config.model_type == "llama" and getattr(config, "attention_bias", False):
        return "attention biases on a llama model"
    return None


def covers(config: ExportConfig) -> bool:
    """Whether ``--graph auto`` takes the in-place graph for this export (config.json only)."""
    if config.quant not in ("auto", *BLOCK_TYPES) or config.block_size != 32:
        return False
    source = resolve_source(
        config.model, revision=config.revision, trust_remote_code=config.trust_remote_code
    )
    return unsupported_reason(source.config) is None


def checkpoint_source(torch_model: Any, quant: str = "fp32") -> CheckpointSource:
    """Maps the model's state dict and config; refuses what the builder would get wrong."""
    config = torch_model.config
    reason = unsupported_reason(config)
    if reason is not None:
        raise UnsupportedModelError(
            f"the in-place graph cannot express {reason}", fix="export with --graph optimum"
        )
    arch = INPLACE_MODEL_TYPES[config.model_type]
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
    linear, table = BLOCK_TYPES[quant]
    edges = ("token_embd.weight", "output.weight")
    return CheckpointSource(
        architecture=architecture,
        tensors={
            name: _quantized(t, table if name in edges else linear) for name, t in tensors.items()
        },
    )


def export_inplace(config: ExportConfig, *, observe: ProgressObserver = ignore_progress) -> Bundle:
    """Loads the checkpoint, builds, checks and writes the in-place bundle."""
    import onnx

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
        checkpoint = checkpoint_source(torch_model, quant)
        model, builder = build_graph(
            checkpoint, capacity=capacity, accuracy_level=config.accuracy_level
        )
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
        verification, min_width, torch_top1 = _verify(
            checkpoint, staging / GRAPH_FILE, torch_model, tokenizer, config, capacity, observe
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
                parameters=parameters,
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
            quantization=_quantization(quant, builder, config.accuracy_level),
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
                "torch_top1_agreement": torch_top1,
                **system_prompt_extra(config.system_prompt),
                **config.extra,
            },
        )
        write_manifest(staging, manifest)
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
    capacity: int,
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
    runner = check.GraphRunner(graph_path, checkpoint, capacity=capacity, min_width=min_width)
    prompts = [tokenizer(text)["input_ids"][:48] for text in check.PARITY_TEXTS]
    observe(ProgressEvent(stage="verify", message="parity with the graph's weights (numpy)"))
    # A wiring check (a quantized graph's 8-bit activations stray a little); --min-top1 gates
    # the agreement with PyTorch below, which is the quantization's cost.
    parity = check.check_parity(runner, checkpoint, prompts, min_top1=WIRING_MIN_TOP1)
    observe(ProgressEvent(stage="verify", message="agreement with PyTorch"))
    agree = positions = 0
    torch_diff = 0.0
    for prompt in prompts:
        with torch.no_grad():
            theirs = torch_model(torch.tensor([prompt])).logits[0].float().numpy()
        ours = runner.forward(prompt, 0, runner.empty())
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
    sample = [t for prompt in prompts for t in prompt] + runner.greedy(prompts[0], 48)
    invariance = check.check_batch_invariance(runner, sample[: 16 + 9 * 8])
    if not invariance.passed and runner.min_width == 1:
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
    return record, runner.min_width, torch_top1
