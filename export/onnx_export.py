"""PyTorch model → fp32 ONNX graph with explicit KV-cache inputs and outputs (optimum).

The fallback form for Hugging Face architectures the in-place graph builder does not cover
(``--graph optimum``, and ``auto`` for those): optimum's graphs concatenate past and new KV
inside the graph, so every step copies the cache (the runtime's "concat" paths run them);
Llama, Mistral, Phi-3, Qwen2, Qwen3 and Gemma 3 checkpoints go to :mod:`edgespec.export.hf_graph`
instead, into the in-place graph the GGUF importer builds.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgespec.errors import ExportError, ModelSourceError
from edgespec.export.source import EXPORT_TASK, ResolvedSource

GRAPH_FILE = "model.onnx"


@contextlib.contextmanager
def quiet_tools() -> Iterator[None]:
    """Silences the tracer and library chatter that would bury our progress lines."""
    from transformers.utils import logging as hf_logging

    loggers = [logging.getLogger(name) for name in ("optimum", "onnxruntime", "root")]
    levels = [logger.level for logger in loggers]
    hf_level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(hf_level)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def load_torch_model(source: ResolvedSource, *, revision: str, trust_remote_code: bool) -> Any:
    """Loads the causal LM in fp32 on the CPU, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with quiet_tools():
            model = AutoModelForCausalLM.from_pretrained(
                source.location,
                revision=revision,
                dtype=torch.float32,
                trust_remote_code=trust_remote_code,
                attn_implementation="eager",
            )
    except (OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0]
        raise ModelSourceError(
            f"cannot load the weights of {source.spec.model} ({first_line})",
            fix="check that the directory holds the weights (model.safetensors or "
            "pytorch_model.bin) or that the hub id is right",
        ) from error
    return model.eval()


def load_tokenizer(source: ResolvedSource, *, revision: str, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    try:
        with quiet_tools():
            tokenizer = AutoTokenizer.from_pretrained(
                source.location, revision=revision, trust_remote_code=trust_remote_code
            )
    except (OSError, ValueError, TypeError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise ModelSourceError(
            f"cannot load the tokenizer of {source.spec.model} ({first_line})",
            fix="the model directory must include its tokenizer files",
        ) from error
    if not getattr(tokenizer, "is_fast", False):
        raise ModelSourceError(
            f"{source.spec.model} has only a slow (Python) tokenizer",
            fix="the runtime needs tokenizer.json; install sentencepiece/protobuf so "
            "transformers can convert it, or save a fast tokenizer with the model",
        )
    return tokenizer


def export_graph(model: Any, out_dir: Path) -> Path:
    """Exports ``model`` with optimum's ``text-generation-with-past`` task into ``out_dir``.

    The graph takes ``input_ids`` [batch, seq], ``attention_mask`` [batch, past+seq],
    ``position_ids`` [batch, seq] and ``past_key_values.{i}.key/value``
    [batch, kv_heads, past, head_dim], and returns ``logits`` [batch, seq, vocab] and
    ``present.{i}.key/value`` [batch, kv_heads, past+seq, head_dim].
    """
    from optimum.exporters.onnx import onnx_export_from_model

    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with quiet_tools():
            onnx_export_from_model(
                model, out_dir, task=EXPORT_TASK, do_validation=False, device="cpu"
            )
    except Exception as error:  # optimum raises many types; all mean "this export failed"
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise ExportError(
            f"optimum could not export {type(model).__name__} to ONNX ({first_line})",
            fix="check that optimum-onnx supports this architecture and transformers version",
        ) from error
    graph = out_dir / GRAPH_FILE
    if not graph.is_file():
        raise ExportError(
            f"optimum wrote no {GRAPH_FILE} in {out_dir}",
            fix="report this with the model id and the optimum-onnx version",
        )
    return graph
