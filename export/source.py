"""Resolves ``MODEL`` (hub id or local directory) and checks it is something we can export.

All the cheap checks run before any weights are loaded, so bad input fails in seconds.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.errors import ModelSourceError, UnsupportedModelError
from edgespec.manifest import SourceSpec

EXPORT_TASK = "text-generation-with-past"


@dataclass(frozen=True, kw_only=True)
class ResolvedSource:
    """A model source that passed the cheap checks; ``location`` is what transformers loads."""

    location: str
    spec: SourceSpec
    config: Any


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~", ".\\")) or model in (".", "..")


def resolve_source(model: str, *, revision: str, trust_remote_code: bool) -> ResolvedSource:
    """Returns the model's config and provenance, or raises a one-line, actionable error."""
    from transformers import AutoConfig

    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelSourceError(
                f"{model} is a file, not a model directory",
                fix="pass the directory that holds config.json and the weights",
            )
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ModelSourceError(
                f"{model} has no config.json, so it is not a Hugging Face model directory",
                fix="pass a directory saved with save_pretrained() or a hub id",
            )
        location = str(path)
        kind = "local"
    elif _looks_like_path(model):
        raise ModelSourceError(
            f"model path {model} does not exist", fix="check the path, or pass a hub id"
        )
    else:
        location = model
        kind = "hub"
    try:
        config = AutoConfig.from_pretrained(
            location, revision=revision, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, KeyError) as error:
        first_line = (
            str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        )
        if kind == "hub":
            raise ModelSourceError(
                f"cannot load {model!r} from the Hugging Face hub ({first_line})",
                fix="check the id and your network (or HF_HUB_OFFLINE), or pass a local directory",
            ) from error
        raise UnsupportedModelError(
            f"cannot read the config in {model} ({first_line})",
            fix="the model type may need a newer transformers, or --trust-remote-code",
        ) from error
    check_exportable(config, model)
    spec = SourceSpec(
        model=model if kind == "hub" else path.resolve().name,
        kind=kind,
        revision=getattr(config, "_commit_hash", None) or (revision if kind == "hub" else None),
        config_sha256=_config_fingerprint(config),
    )
    return ResolvedSource(location=location, spec=spec, config=config)


def check_exportable(config: Any, model: str) -> None:
    """Raises unless optimum can export ``config``'s model type as a causal LM with KV I/O."""
    import optimum.exporters.onnx.model_configs  # noqa: F401  (registers the ONNX configs)
    from optimum.exporters.tasks import TasksManager

    model_type = str(getattr(config, "model_type", "") or "")
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{model} is an encoder-decoder model ({model_type}); edgespec exports decoder-only "
            "causal LMs",
            fix="pass a causal LM such as Llama, Qwen2, Mistral, Phi-3, Gemma or GPT-2",
        )
    try:
        tasks = _supported_tasks(TasksManager, model_type)
    except KeyError:
        raise UnsupportedModelError(
            f"architecture {model_type!r} of {model} cannot be exported by optimum's ONNX exporter",
            fix="use a supported causal LM architecture (llama, qwen2, mistral, phi3, gemma, "
            "gpt2, ...)",
        ) from None
    if EXPORT_TASK not in tasks:
        raise UnsupportedModelError(
            f"{model} ({model_type}) is not a causal language model: optimum offers "
            f"{', '.join(sorted(tasks))}, not {EXPORT_TASK}",
            fix="speculative decoding needs a decoder-only causal LM",
        )


def _supported_tasks(manager: Any, model_type: str) -> Any:
    """optimum's tasks for ``model_type``: registered under the config's own name for some
    (``gemma3_text``, ``gpt_neox``, ``qwen3_moe``) and with dashes for others."""
    for name in dict.fromkeys((model_type, model_type.replace("_", "-"))):
        try:
            return manager.get_supported_tasks_for_model_type(
                name, "onnx", library_name="transformers"
            )
        except KeyError:
            continue
    raise KeyError(model_type)


def _config_fingerprint(config: Any) -> str:
    payload = json.dumps(config.to_diff_dict(), sort_keys=True, default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()
