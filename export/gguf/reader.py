"""Reading a GGUF file (llama.cpp's model format) with the ``gguf`` package: the architecture
facts an ONNX graph needs, the tokenizer metadata, and the tensors, each checked and named in
one-line errors. No torch, no transformers."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgespec.errors import ModelSourceError, UnsupportedModelError
from edgespec.export.gguf.fused import split_phi3
from edgespec.export.gguf.header import needed_bytes
from edgespec.export.gguf.rope import NO_SCALING, RopeScaling, read_rope_scaling

#: Architectures whose GGUF tensors this importer maps (the Llama block: RMSNorm, rotary
#: attention with grouped KV heads, SwiGLU MLP; Qwen2 adds Q/K/V biases; Gemma 3 adds the
#: embedding scale, Q/K norms, norms after attention and MLP, GELU, and sliding-window
#: layers; Phi-3 fuses Q/K/V and gate/up, split back into Llama's by row ranges, and its
#: sliding window is ignored, as llama.cpp ignores it). llama.cpp writes Llama, SmolLM2 and
#: Mistral checkpoints as "llama"; SmolLM3 is Llama's block with no rotary embedding in every
#: fourth layer.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "smollm3")
#: Rotary embedding types by architecture: llama.cpp's "normal" rope rotates adjacent pairs
#: (its converter permuted HF's Q/K rows for that); Qwen's and Gemma's "neox" rope rotates
#: halves.
INTERLEAVED_ROPE = {
    "llama": True,
    "qwen2": False,
    "qwen3": False,
    "gemma2": False,
    "gemma3": False,
    "phi3": False,
    "smollm3": True,
}
#: SmolLM3 leaves out the rotary embedding in layers 3, 7, 11, ... (llama.cpp's
#: ``n_no_rope_layer_step``).
SMOLLM3_NO_ROPE_EVERY = 4
#: Gemma 3 as llama.cpp runs it: five sliding-window layers, then one global layer; the
#: sliding-window layers' rope base (the file's ``rope.freq_base`` is the global layers').
GEMMA3_SWA_PATTERN = 6
#: Gemma 2 alternates: even layers slide (a 4,096-position window), odd ones see everything;
#: its scores and final logits are soft-capped (cap * tanh(x / cap)), 50 and 30 by default.
GEMMA2_SWA_PATTERN = 2
GEMMA2_SOFTCAPS = (50.0, 30.0)
GEMMA2_WINDOW = 4096
GEMMA2_27B_LAYERS = 46
#: edgespec's metadata key for a draft's reduced output vocabulary (int32 token ids).
OUTPUT_VOCABULARY_KEY = "edgespec.output_vocabulary"
GEMMA3_LOCAL_ROPE_THETA = 10000.0
#: The tokenizer's arrays: the gguf reader keeps a numpy view of each entry, which grows with
#: the vocabulary and its merges (docs/benchmarks/export.md, "Importing a GGUF: memory and
#: bundle size"), read once to build the tokenizer.
TOKENIZER_ARRAYS = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.scores",
)


@dataclass(frozen=True, kw_only=True)
class GGUFArchitecture:
    """The numbers the graph is built from (llama.cpp's metadata keys, prefixed by ``arch``)."""

    arch: str
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rope_interleaved: bool
    rms_norm_eps: float
    tied_embeddings: bool
    #: Qwen2 has biases on Q, K and V.
    qkv_bias: bool
    #: Gemma 3: the embedding times sqrt(hidden); RMSNorm on each head of Q and K; RMSNorm
    #: after attention and after the MLP (before their residual adds); GELU (tanh) gating.
    gemma: bool = False
    #: RMSNorm over each head of Q and K before the rotary embedding (Qwen3, Gemma 3).
    qk_norm: bool = False
    #: Layers that attend to the last ``sliding_window`` positions only (their rope base is
    #: ``local_rope_theta``); 0 when every layer is global.
    sliding_window: int = 0
    local_rope_theta: float = 0.0
    #: A draft's reduced output vocabulary: the token ids (ascending) its ``output.weight``
    #: rows score; the graph scatters them into a full-vocabulary ``logits`` whose other
    #: entries are ``UNSCORED_LOGIT`` (the draft never proposes them). Empty: every token.
    output_vocabulary: tuple[int, ...] = ()
    #: The rotary frequencies' scaling and factors (global layers; sliding-window ones run
    #: unscaled, as llama.cpp runs Gemma 3's).
    rope_scaling: RopeScaling = NO_SCALING
    #: Every this many layers one attends without rotary embedding (its last); 0: none.
    no_rope_every: int = 0
    #: The dimensions of each head the rotary embedding turns, the first ones (Phi-4-mini: 96
    #: of 128); 0: all of them.
    rotary_dim: int = 0
    #: Sliding-window layers: all but the last of every ``swa_pattern`` (Gemma 3: 6, Gemma 2:
    #: 2); Gemma 2's caps of the attention scores and of the logits (0: none).
    swa_pattern: int = GEMMA3_SWA_PATTERN
    attention_softcap: float = 0.0
    final_softcap: float = 0.0

    @property
    def rotated_dims(self) -> int:
        return self.rotary_dim or self.head_dim

    def rotates(self, layer: int) -> bool:
        """Whether ``layer`` rotates Q and K (all but SmolLM3's every fourth)."""
        return not self.no_rope_every or (layer + 1) % self.no_rope_every != 0

    @property
    def embedding_scale(self) -> float:
        return float(np.sqrt(self.hidden_size)) if self.gemma else 1.0

    def is_sliding(self, layer: int) -> bool:
        pattern = self.swa_pattern
        return self.sliding_window > 0 and layer % pattern < pattern - 1


@dataclass(frozen=True, kw_only=True)
class GGUFFile:
    """An opened GGUF: its architecture, metadata fields and tensors by name."""

    path: Path
    architecture: GGUFArchitecture
    fields: dict[str, Any]
    tensors: dict[str, Any]
    file_type: str
    #: The reader's map of the file (numpy.memmap), whose pages the tensors' data are.
    mapped: Any = None

    def release_pages(self) -> None:
        """Takes the file's pages out of this process's resident memory (they stay in the page
        cache and are mapped again when read): between an import's stages, so that one
        stage's reads of the file are not counted against the next."""
        import mmap

        pages = getattr(self.mapped, "_mmap", None)
        if pages is not None and hasattr(mmap, "MADV_DONTNEED"):
            pages.madvise(mmap.MADV_DONTNEED)

    def for_context(self, capacity: int) -> GGUFFile:
        """The file with its rotary scaling settled for a graph of ``capacity`` positions
        (Phi-3's long or short factors), for the graph and its checks alike."""
        scaling = self.architecture.rope_scaling.for_context(capacity)
        return replace(self, architecture=replace(self.architecture, rope_scaling=scaling))

    def release_tokenizer_fields(self) -> None:
        """Drops the tokenizer's arrays (``TOKENIZER_ARRAYS``) from ``fields`` once the
        tokenizer is built, so that they do not last the whole import."""
        for key in TOKENIZER_ARRAYS:
            self.fields.pop(key, None)

    def tensor(self, name: str) -> Any:
        if name not in self.tensors:
            raise UnsupportedModelError(
                f"{self.path.name} has no tensor {name!r}",
                fix="export a GGUF written by llama.cpp's converter for a supported architecture",
            )
        return self.tensors[name]


class WeightSource(Protocol):
    """What the graph builder and the checks read: a GGUF file, or a Hugging Face checkpoint
    under llama.cpp's tensor names (:mod:`edgespec.export.hf_graph`)."""

    @property
    def architecture(self) -> GGUFArchitecture: ...

    def tensor(self, name: str) -> Any: ...

    def release_pages(self) -> None:
        """Takes a mapped file's pages out of resident memory (nothing for weights in memory)."""


def field_value(fields: dict[str, Any], key: str, default: Any = None) -> Any:
    """A metadata value as Python data (strings decoded, arrays as lists)."""
    field = fields.get(key)
    if field is None:
        return default
    return field.contents()


def open_gguf(path: Path) -> GGUFFile:
    """Opens and checks ``path``; a damaged file or an unsupported model is one clear error."""
    from gguf import GGUFReader

    if not path.is_file():
        raise ModelSourceError(f"GGUF file {path} does not exist", fix="check the path")
    needed, held = needed_bytes(path), path.stat().st_size
    if needed is not None and held < needed:
        raise ModelSourceError(
            f"{path.name} is truncated: its header's tensors need {needed:,} bytes and the "
            f"file holds {held:,} ({held / needed:.0%})",
            fix="download the file again (a download that stopped leaves a short file)",
        )
    try:
        reader = GGUFReader(str(path))
    except Exception as error:  # gguf raises ValueError, struct.error, IndexError...
        raise ModelSourceError(
            f"{path.name} is not a readable GGUF file ({type(error).__name__}: {str(error)[:120]})",
            fix="download the file again (it may be truncated or not a GGUF)",
        ) from error
    fields = dict(reader.fields)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    architecture = _architecture(path, fields, tensors)
    if architecture.arch == "phi3":
        tensors = split_phi3(
            tensors,
            layers=architecture.num_layers,
            q_rows=architecture.num_heads * architecture.head_dim,
            kv_rows=architecture.num_kv_heads * architecture.head_dim,
            ffn=architecture.intermediate_size,
            file=path.name,
        )
    # Before anything is converted: an unreadable type would otherwise fail midway through
    # the graph with the gguf package's own exception.
    unreadable = sorted({t.tensor_type.name for t in tensors.values()} - set(readable_types()))
    if unreadable:
        raise UnsupportedModelError(
            f"{path.name} holds {', '.join(unreadable)} tensors, a type the GGUF importer does "
            f"not read; it reads {', '.join(readable_types())}",
            fix="re-quantize the file to a type it reads with llama.cpp's llama-quantize "
            "(Q4_K_M keeps its grid)",
        )
    file_type = field_value(fields, "general.file_type", None)
    return GGUFFile(
        path=path,
        architecture=architecture,
        fields=fields,
        tensors=tensors,
        file_type=str(file_type),
        mapped=reader.data,
    )


def _architecture(path: Path, fields: dict[str, Any], tensors: dict[str, Any]) -> GGUFArchitecture:
    arch = field_value(fields, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path.name} is a {arch!r} model; the GGUF importer covers "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}",
            fix="export the Hugging Face checkpoint with edgespec export MODEL_DIR instead",
        )

    def number(key: str, default: Any = None) -> Any:
        value = field_value(fields, f"{arch}.{key}", default)
        if value is None:
            raise UnsupportedModelError(
                f"{path.name} lacks the metadata key {arch}.{key}",
                fix="re-convert the model with a current llama.cpp converter",
            )
        return value

    heads = int(number("attention.head_count"))
    hidden = int(number("embedding_length"))
    head_dim = int(number("attention.key_length", hidden // heads))
    rotated = int(field_value(fields, f"{arch}.rope.dimension_count", head_dim))
    gemma2, softcaps = arch == "gemma2", GEMMA2_SOFTCAPS
    # Gemma 2's sliding layers share the global base unless the file names one; Gemma 3's
    # default to 10,000.
    local_base = number("rope.freq_base", 10000.0) if gemma2 else GEMMA3_LOCAL_ROPE_THETA
    if gemma2 and int(number("block_count")) == GEMMA2_27B_LAYERS:
        raise UnsupportedModelError(
            f"{path.name} is Gemma 2 27B, whose queries scale by its width per head rather "
            "than by the head size; the importer runs Gemma 2 2B and 9B",
            fix="use Gemma 2 2B or 9B, or a Gemma 3 model",
        )
    tokens = field_value(fields, "tokenizer.ggml.tokens")
    if tokens is None:
        raise UnsupportedModelError(
            f"{path.name} has no tokenizer metadata (tokenizer.ggml.tokens)",
            fix="use a GGUF that embeds its tokenizer, as llama.cpp's converter writes it",
        )
    return GGUFArchitecture(
        arch=arch,
        name=str(field_value(fields, "general.name", path.stem)),
        num_layers=int(number("block_count")),
        hidden_size=hidden,
        intermediate_size=int(number("feed_forward_length")),
        num_heads=heads,
        num_kv_heads=int(number("attention.head_count_kv", heads)),
        head_dim=head_dim,
        vocab_size=len(tokens),
        context_length=int(number("context_length")),
        rope_theta=float(number("rope.freq_base", 10000.0)),
        rope_interleaved=INTERLEAVED_ROPE[arch],
        rms_norm_eps=float(number("attention.layer_norm_rms_epsilon")),
        # llama.cpp's Gemma 2 scores with the embedding whatever else the file holds.
        tied_embeddings="output.weight" not in tensors or arch == "gemma2",
        qkv_bias="blk.0.attn_q.bias" in tensors,
        gemma=arch in ("gemma2", "gemma3"),
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        sliding_window=_window(arch, number),
        local_rope_theta=float(number("rope.freq_base_swa", local_base)),
        swa_pattern=GEMMA2_SWA_PATTERN if gemma2 else GEMMA3_SWA_PATTERN,
        attention_softcap=float(number("attn_logit_softcapping", softcaps[0])) if gemma2 else 0.0,
        final_softcap=float(number("final_logit_softcapping", softcaps[1])) if gemma2 else 0.0,
        output_vocabulary=tuple(int(t) for t in (field_value(fields, OUTPUT_VOCABULARY_KEY) or ())),
        no_rope_every=SMOLLM3_NO_ROPE_EVERY if arch == "smollm3" else 0,
        rotary_dim=rotated if rotated != head_dim else 0,
        rope_scaling=read_rope_scaling(
            path,
            arch,
            fields,
            tensors,
            head_dim=head_dim,
            rotated=rotated,
            context_length=int(number("context_length")),
        ),
    )


def _window(arch: str, number: Any) -> int:
    """The sliding window: Gemma 3's from the file, Gemma 2's (4,096 without the key)."""
    if arch == "gemma3":
        return int(number("attention.sliding_window", 0))
    return int(number("attention.sliding_window", GEMMA2_WINDOW)) if arch == "gemma2" else 0


def tensor_rows(tensor: Any) -> tuple[int, int]:
    """(rows, columns) of a 2-D weight as llama.cpp lays it out: ``ne[1]`` rows (the output
    features) of ``ne[0]`` columns (the input features)."""
    columns, rows = (int(n) for n in tensor.shape[:2])
    return rows, columns


def float_tensor(tensor: Any) -> np.ndarray:
    """A weight as float32 in its logical shape (rows, columns) or (n,): F32 and F16 as stored,
    quantized types dequantized with the ``gguf`` package's reference code."""
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return _dequantized(np.asarray(tensor.data), tensor.tensor_type).reshape(shape)


def float_rows(tensor: Any, rows: slice | Sequence[int]) -> np.ndarray:
    """Some rows of a 2-D weight as float32 [len(rows), columns]: only their blocks are read
    and dequantized (a row of a GGUF tensor is whole blocks)."""
    columns = tensor_rows(tensor)[1]
    data = np.asarray(tensor.data)
    picked = data[rows] if isinstance(rows, slice) else data[np.asarray(rows, np.int64)]
    return _dequantized(picked, tensor.tensor_type).reshape(-1, columns)


@functools.cache
def readable_types() -> tuple[str, ...]:
    """The tensor types the importer reads: those the ``gguf`` package dequantizes (every
    other conversion starts from them). The package lists no such set, so each type is
    tried on one block of zeros."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    readable = []
    for kind in GGMLQuantizationType:
        try:
            _dequantized(np.zeros((1, GGML_QUANT_SIZES[kind][1]), np.uint8), kind)
        except NotImplementedError:
            continue
        readable.append(kind.name)
    return tuple(readable)


def _dequantized(data: np.ndarray, kind: Any) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    if kind == GGMLQuantizationType.F32:
        return np.asarray(data, dtype=np.float32)
    if kind == GGMLQuantizationType.F16:
        return np.asarray(data, dtype=np.float16).astype(np.float32)
    return quants.dequantize(data, kind).astype(np.float32)
