"""A Hugging Face Llama, Mistral, Phi-3, Qwen2, Qwen3 or Gemma 3 checkpoint as a
:class:`~edgespec.export.gguf.reader.WeightSource`: its tensors under llama.cpp's names,
float32 or quantized with the ``gguf`` package's reference quantizers (int4: Q4_1 linear
layers with a Q8_0 embedding and untied LM head; int8: Q8_0), for the in-place graph builder
and its checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgespec.errors import UnsupportedModelError
from edgespec.export.gguf.reader import GGUFArchitecture
from edgespec.export.gguf.rope import NO_SCALING, RopeScaling, base_frequencies

#: Hugging Face rope types the in-place graph runs: fixed frequencies (transformers' own),
#: not "dynamic" or "longrope", whose frequencies move with the sequence's length.
HF_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
#: Hugging Face model types whose blocks the builder covers, as llama.cpp names them
#: (llama.cpp's converter writes Mistral as a Llama too).
INPLACE_MODEL_TYPES = {
    "llama": "llama",
    "mistral": "llama",
    "phi3": "phi3",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
}
#: Model types whose ``sliding_window`` (when set) applies to every layer.
WINDOWED_MODEL_TYPES = ("mistral", "phi3")
LAYER_NAMES = {
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
#: Gemma 3's four norms per layer: after attention and around the MLP (llama.cpp's names).
GEMMA_LAYER_NAMES = {
    **{k: v for k, v in LAYER_NAMES.items() if k != "post_attention_layernorm"},
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
#: Gemma 3 in the importer: five sliding-window layers, then one global layer.
GEMMA_PATTERN = ("sliding_attention",) * 5 + ("full_attention",)
#: Per-head RMSNorm weights of Q and K (Qwen3), where the checkpoint has them.
QK_NORM_NAMES = {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}


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

    def release_pages(self) -> None:
        """Nothing to release: the weights are in memory, not mapped from a file."""


def _rope_type(part: dict[str, Any]) -> str:
    return str(part.get("rope_type", part.get("type", "default")))


def hf_rope_scaling(config: Any, *, head_dim: int, theta: float) -> RopeScaling:
    """The checkpoint's rope scaling (its global layers') as per-pair frequency factors and a
    cos/sin magnitude, from transformers' own frequencies: exactly what its model rotates by,
    whichever of :data:`HF_ROPE_TYPES` it is."""
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    per_type = isinstance(rope.get("full_attention"), dict)
    part = rope["full_attention"] if per_type else rope
    kind = _rope_type(part)
    if kind == "default":
        return NO_SCALING
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # transformers 5 takes the layer type of a per-type config (typed loosely: 4 has no such
    # argument).
    layer = {"layer_type": "full_attention"} if per_type else {}
    initial: Any = ROPE_INIT_FUNCTIONS[kind]
    inverse, magnitude = initial(config, "cpu", **layer)
    factors = base_frequencies(head_dim, theta) / inverse.double().numpy()
    factor = part.get("factor")
    return RopeScaling(
        frequency_factors=tuple(float(f) for f in factors),
        magnitude=float(magnitude),
        label=f"{kind} x{factor:g}" if factor else kind,
    )


def unsupported_reason(config: Any, capacity: int | None = None) -> str | None:
    """Why the builder cannot express this Hugging Face config in a graph of ``capacity``
    positions (None: it can)."""
    if config.model_type not in INPLACE_MODEL_TYPES:
        *others, last = INPLACE_MODEL_TYPES
        covered = f"{', '.join(others)} and {last}"
        return f"a {config.model_type} model (it covers {covered})"
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None)
    # transformers 5 keeps Gemma 3's per layer type: {"full_attention": {...}, ...}; its
    # sliding-window layers run unscaled.
    per_type = {k: p for k, p in (rope or {}).items() if isinstance(p, dict)}
    for layer_type, part in list(per_type.items()) or [("", rope or {})]:
        kind = _rope_type(part)
        if kind not in HF_ROPE_TYPES or (kind != "default" and layer_type == "sliding_attention"):
            return f"{kind} rope scaling"
    if config.model_type == "gemma3_text":
        return _gemma_unsupported(config)
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    if float(getattr(config, "partial_rotary_factor", 1.0) or 1.0) != 1.0:
        return "a rotary embedding over part of each head"
    windowed = config.model_type in WINDOWED_MODEL_TYPES
    window = getattr(config, "sliding_window", None) if windowed else None
    if window is not None and (capacity is None or window < capacity):
        # A window at least as long as the graph's positions never drops one: full attention.
        return (
            f"sliding-window attention (a window of {window} positions, shorter than the "
            f"graph's {capacity or 'context'})"
        )
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        return f"a {config.hidden_act} or biased MLP"
    if config.model_type != "qwen2" and getattr(config, "attention_bias", False):
        return f"attention biases on a {config.model_type} model"
    return None


def _unfused_phi3(state: dict[str, np.ndarray], config: Any) -> dict[str, np.ndarray]:
    """Phi-3's fused projections as Llama's: ``qkv_proj`` [q; k; v] rows and
    ``gate_up_proj`` [gate; up] rows (its MLP multiplies up by SiLU of the first half)."""
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    out = dict(state)
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        qkv = out.pop(f"{prefix}.self_attn.qkv_proj.weight")
        q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
        out[f"{prefix}.self_attn.q_proj.weight"] = qkv[:q_rows]
        out[f"{prefix}.self_attn.k_proj.weight"] = qkv[q_rows : q_rows + kv_rows]
        out[f"{prefix}.self_attn.v_proj.weight"] = qkv[q_rows + kv_rows :]
        gate, up = np.split(out.pop(f"{prefix}.mlp.gate_up_proj.weight"), 2)
        out[f"{prefix}.mlp.gate_proj.weight"], out[f"{prefix}.mlp.up_proj.weight"] = gate, up
    return out


def _gemma_unsupported(config: Any) -> str | None:
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    types = tuple(getattr(config, "layer_types", None) or ())
    if getattr(config, "query_pre_attn_scalar", head_dim) != head_dim:
        return "a query scale other than 1/sqrt(head_dim)"
    if getattr(config, "final_logit_softcapping", None) or getattr(
        config, "attn_logit_softcapping", None
    ):
        return "logit soft-capping"
    if getattr(config, "hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        return f"a {config.hidden_activation} MLP"
    if getattr(config, "use_bidirectional_attention", False):
        return "bidirectional attention"
    if getattr(config, "attention_bias", False):
        return "attention biases on a gemma3_text model"
    if types != tuple(GEMMA_PATTERN[i % 6] for i in range(len(types))):
        return "a layer pattern other than five sliding-window layers to one global"
    return None


def _gemma_rope_bases(config: Any) -> tuple[float, float]:
    """(global, local) rope bases, from transformers 4's keys or 5's per-type parameters."""
    parameters = getattr(config, "rope_parameters", None) or {}
    full = parameters.get("full_attention", parameters) if isinstance(parameters, dict) else {}
    local = parameters.get("sliding_attention", {}) if isinstance(parameters, dict) else {}
    global_base = getattr(config, "rope_theta", None) or full.get("rope_theta", 1e6)
    local_base = getattr(config, "rope_local_base_freq", None) or local.get("rope_theta", 1e4)
    return float(global_base), float(local_base)


def checkpoint_source(
    torch_model: Any, quant: str = "fp32", capacity: int | None = None
) -> CheckpointSource:
    """Maps the model's state dict and config; refuses what the builder would get wrong in a
    graph of ``capacity`` positions."""
    config = torch_model.config
    reason = unsupported_reason(config, capacity)
    if reason is not None:
        raise UnsupportedModelError(
            f"the in-place graph cannot express {reason}", fix="export with --graph optimum"
        )
    arch = INPLACE_MODEL_TYPES[config.model_type]
    state = {name: t.detach().float().numpy() for name, t in torch_model.state_dict().items()}
    if config.model_type == "phi3":
        state = _unfused_phi3(state, config)
    gemma = config.model_type == "gemma3_text"
    tensors = {"token_embd.weight": state["model.embed_tokens.weight"]}
    for layer in range(config.num_hidden_layers):
        for hf_name, gguf_name in (GEMMA_LAYER_NAMES if gemma else LAYER_NAMES).items():
            prefix = f"model.layers.{layer}.{hf_name}"
            tensors[f"blk.{layer}.{gguf_name}.weight"] = state[f"{prefix}.weight"]
            if f"{prefix}.bias" in state:
                tensors[f"blk.{layer}.{gguf_name}.bias"] = state[f"{prefix}.bias"]
        for hf_name, gguf_name in QK_NORM_NAMES.items():
            prefix = f"model.layers.{layer}.{hf_name}"
            if f"{prefix}.weight" in state:
                tensors[f"blk.{layer}.{gguf_name}.weight"] = state[f"{prefix}.weight"]
    tensors["output_norm.weight"] = state["model.norm.weight"]
    if gemma:  # Gemma's RMSNorm scales by (1 + w); llama.cpp's converter stores 1 + w
        tensors = {n: t + 1.0 if n.endswith("norm.weight") else t for n, t in tensors.items()}
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if not tied:
        tensors["output.weight"] = state["lm_head.weight"]
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    rope = getattr(config, "rope_parameters", None) or {}
    bases = (
        _gemma_rope_bases(config)
        if gemma
        else (float(getattr(config, "rope_theta", None) or rope.get("rope_theta", 10000.0)), 0.0)
    )
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
        rope_theta=bases[0],
        rope_interleaved=False,  # Hugging Face rotates halves
        rms_norm_eps=float(config.rms_norm_eps),
        tied_embeddings=tied,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        gemma=gemma,
        sliding_window=int(config.sliding_window) if gemma else 0,
        local_rope_theta=bases[1] if gemma else 0.0,
        rope_scaling=hf_rope_scaling(config, head_dim=head_dim, theta=bases[0]),
    )
    linear, table = BLOCK_TYPES[quant]
    edges = ("token_embd.weight", "output.weight")
    return CheckpointSource(
        architecture=architecture,
        tensors={
            name: _quantized(t, table if name in edges else linear) for name, t in tensors.items()
        },
    )
