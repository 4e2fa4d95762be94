"""Reads facts off the exported graph and tokenizer into manifest records, and writes the
bundle directory atomically: every exporter ends with :func:`write_bundle_manifest` inside
:func:`staging_directory`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from edgespec._version import __version__
from edgespec.config import ExportConfig
from edgespec.errors import ExportError, OutputExistsError
from edgespec.manifest import (
    SCHEMA_VERSION,
    FileRecord,
    GraphSpec,
    Manifest,
    MemoryEstimate,
    ModelSpec,
    QuantizationSpec,
    SourceSpec,
    TensorSpec,
    TokenizerSpec,
    VerificationRecord,
    file_record,
    system_prompt_extra,
    write_manifest,
)

TOKENIZER_FILE = "tokenizer.json"
_PAST_KEY = "past_key_values.{}.key"
_PAST_VALUE = "past_key_values.{}.value"
_PRESENT_KEY = "present.{}.key"
_PRESENT_VALUE = "present.{}.value"


def _tensor_specs(values: Any) -> tuple[TensorSpec, ...]:
    import onnx

    specs = []
    for value in values:
        tensor_type = value.type.tensor_type
        shape = tuple(
            dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or "?")
            for dim in tensor_type.shape.dim
        )
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name
        specs.append(TensorSpec(name=value.name, dtype=dtype, shape=shape))
    return tuple(specs)


def read_graph_spec(graph_path: Path) -> tuple[GraphSpec, int]:
    """Returns the graph's I/O record and its weight bytes (all initializers)."""
    import onnx

    model = onnx.load(str(graph_path), load_external_data=False)
    inputs = _tensor_specs(model.graph.input)
    outputs = _tensor_specs(model.graph.output)
    input_names = {spec.name for spec in inputs}
    output_names = {spec.name for spec in outputs}
    layers = 0
    while _PAST_KEY.format(layers) in input_names:
        layers += 1
    expected = [
        "input_ids",
        "logits",
        *(name.format(i) for i in range(layers) for name in (_PAST_KEY, _PAST_VALUE)),
        *(name.format(i) for i in range(layers) for name in (_PRESENT_KEY, _PRESENT_VALUE)),
    ]
    missing = [name for name in expected if name not in input_names | output_names]
    if layers == 0 or missing:
        raise ExportError(
            f"the exported graph lacks KV-cache I/O ({', '.join(missing) or 'no past inputs'})",
            fix="the model must export with optimum's text-generation-with-past task",
        )
    by_name = {spec.name: spec for spec in inputs + outputs}
    opset = next(
        (entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0
    )
    spec = GraphSpec(
        file=graph_path.name,
        opset=int(opset),
        inputs=inputs,
        outputs=outputs,
        input_ids="input_ids",
        attention_mask="attention_mask" if "attention_mask" in input_names else None,
        position_ids="position_ids" if "position_ids" in input_names else None,
        logits="logits",
        past_key=tuple(_PAST_KEY.format(i) for i in range(layers)),
        past_value=tuple(_PAST_VALUE.format(i) for i in range(layers)),
        present_key=tuple(_PRESENT_KEY.format(i) for i in range(layers)),
        present_value=tuple(_PRESENT_VALUE.format(i) for i in range(layers)),
        kv_dtype=by_name[_PAST_KEY.format(0)].dtype,
        logits_dtype=by_name["logits"].dtype,
    )
    weight_bytes = sum(_initializer_bytes(tensor) for tensor in model.graph.initializer)
    return spec, weight_bytes


def _initializer_bytes(tensor: Any) -> int:
    import onnx

    count = 1
    for dim in tensor.dims:
        count *= dim
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def kv_shape(spec: GraphSpec) -> tuple[int, int]:
    """(kv_heads, head_dim) from the static dims of the first past key input."""
    shape = next(t.shape for t in spec.inputs if t.name == spec.past_key[0])
    heads, head_dim = shape[1], shape[3]
    if not isinstance(heads, int) or not isinstance(head_dim, int):
        raise ExportError(
            f"KV input {spec.past_key[0]} has symbolic heads/head_dim {shape}",
            fix="report this with the model id; edgespec needs static KV head shapes",
        )
    return heads, head_dim


def logits_width(spec: GraphSpec, config: Any) -> int:
    """The vocabulary: the logits' last dimension when static, else the model config's
    ``vocab_size``."""
    logits_shape = next(t.shape for t in spec.outputs if t.name == spec.logits)
    last = logits_shape[-1]
    return last if isinstance(last, int) else int(config.vocab_size)


def memory_estimate(
    spec: GraphSpec, *, weight_bytes: int, vocab_size: int, file_bytes: int
) -> MemoryEstimate:
    import numpy as np

    heads, head_dim = kv_shape(spec)
    kv_item = np.dtype(spec.kv_dtype).itemsize
    return MemoryEstimate(
        weight_bytes=weight_bytes,
        kv_bytes_per_token=2 * len(spec.past_key) * heads * head_dim * kv_item,
        logits_bytes_per_position=vocab_size * np.dtype(spec.logits_dtype).itemsize,
        file_bytes=file_bytes,
    )


def tokenizer_sha256(tokenizer_json: Path) -> str:
    """Hash of the tokenizer's canonical JSON (key order and whitespace do not matter)."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def save_tokenizer(tokenizer: Any, generation_config: Any, root: Path) -> TokenizerSpec:
    """Saves the tokenizer files into ``root`` and describes them."""
    saved = tokenizer.save_pretrained(str(root))
    files = tuple(sorted({Path(name).name for name in saved if (root / Path(name).name).is_file()}))
    tokenizer_json = root / TOKENIZER_FILE
    if TOKENIZER_FILE not in files:
        raise ExportError(
            "the tokenizer was saved without tokenizer.json",
            fix="the runtime needs a fast tokenizer; save one with the model",
        )
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    # transformers writes it indented; compact, it is far smaller (docs/benchmarks/export.md,
    # "Export").
    tokenizer_json.write_text(
        json.dumps(data, ensure_ascii=False, separators=(",", ":")), encoding="utf-8"
    )
    eos_ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    generation_eos = getattr(generation_config, "eos_token_id", None)
    if isinstance(generation_eos, int):
        eos_ids.add(generation_eos)
    elif generation_eos:
        eos_ids.update(int(token) for token in generation_eos)
    bos = tokenizer.bos_token_id
    probe_ids = tokenizer("a")["input_ids"]
    special = {
        name: str(value)
        for name, value in tokenizer.special_tokens_map.items()
        if isinstance(value, str)
    }
    return TokenizerSpec(
        file=TOKENIZER_FILE,
        files=files,
        sha256=tokenizer_sha256(tokenizer_json),
        vocab_type=str(data.get("model", {}).get("type", "unknown")),
        vocab_size=len(tokenizer),
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=tuple(sorted(eos_ids)),
        pad_token_id=None if tokenizer.pad_token_id is None else int(tokenizer.pad_token_id),
        add_bos_token=bos is not None and probe_ids[:1] == [bos],
        special_tokens=special,
        has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
    )


def file_records(root: Path, roles: dict[str, str]) -> tuple[FileRecord, ...]:
    return tuple(file_record(root, name, role) for name, role in sorted(roles.items()))


def toolchain(packages: Sequence[str]) -> dict[str, str]:
    """The versions of those of ``packages`` that are installed ("edgespec": this one)."""
    versions = {}
    for name in packages:
        try:
            versions[name] = __version__ if name == "edgespec" else metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def write_bundle_manifest(
    staging: Path,
    config: ExportConfig,
    *,
    source: SourceSpec,
    model: ModelSpec,
    graph: GraphSpec,
    tokenizer: TokenizerSpec,
    quantization: QuantizationSpec,
    verification: VerificationRecord,
    memory: MemoryEstimate,
    files: tuple[FileRecord, ...],
    packages: Sequence[str],
    extra: dict[str, Any],
) -> None:
    """Writes the manifest of the bundle staged in ``staging``, the last step of every export:
    the exporter's records, the versions of its ``packages``, and ``extra`` followed by the
    export's system prompt and ``config.extra``."""
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        edgespec_version=__version__,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        source=source,
        model=model,
        graph=graph,
        tokenizer=tokenizer,
        quantization=quantization,
        verification=verification,
        memory=memory,
        files=files,
        toolchain=toolchain(packages),
        extra={**extra, **system_prompt_extra(config.system_prompt), **config.extra},
    )
    write_manifest(staging, manifest)


def check_output_free(out: Path, *, force: bool) -> None:
    if out.exists() and not force:
        raise OutputExistsError(
            f"output directory {out} already exists", fix="pass --force to replace it"
        )
    if out.exists() and not out.is_dir():
        raise OutputExistsError(
            f"output path {out} exists and is not a directory", fix="choose another --out"
        )


#: A staging directory's name: ``.NAME.partial-PID-HEX``, PID the process that writes it.
PARTIAL_NAME = re.compile(r"\.(?P<name>.+)\.partial-(?P<pid>\d+)-[0-9a-f]{8}")


def sweep_stale_partials(out: Path) -> list[Path]:
    """Removes the staging directories of ``out`` whose writing process is gone (killed by a
    signal no handler saw, or a machine that went down); returns them. Directories of live
    processes, and of older edgespec versions (no process id in the name), are kept."""
    removed = []
    for candidate in out.parent.glob(f".{out.name}.partial-*"):
        named = PARTIAL_NAME.fullmatch(candidate.name)
        if named is None or named.group("name") != out.name or owner_alive(int(named.group("pid"))):
            continue
        shutil.rmtree(candidate, ignore_errors=True)
        removed.append(candidate)
    return removed


def owner_alive(pid: int) -> bool:
    """Whether the process ``pid`` (a staging directory's writer) still runs."""
    if os.name != "posix":  # Windows' os.kill(pid, 0) is not a probe: keep everything
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


@contextlib.contextmanager
def staging_directory(out: Path, *, force: bool) -> Iterator[Path]:
    """Yields an empty directory beside ``out``; on success it replaces ``out`` in one rename.

    The bundle's files get one mode, a new file's under the umask (see :func:`even_modes`).
    Any exception (or Ctrl-C) removes the staging directory and any parent directories this
    call created, so a failed export leaves nothing behind.
    """
    out = out.absolute()
    check_output_free(out, force=force)
    created_parents = [parent for parent in reversed(out.parents) if not parent.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_partials(out)
    staging = out.parent / f".{out.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
        even_modes(staging)
        check_output_free(out, force=force)
        if out.exists():
            retired = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(out, retired)
            os.replace(staging, out)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for parent in reversed(created_parents):
            with contextlib.suppress(OSError):
                parent.rmdir()
        raise


def even_modes(root: Path) -> None:
    """Gives every file under ``root`` the mode a newly created file gets under the current
    umask (0644 under umask 022). Writers differ (onnx writes external data 0600), and a bundle
    whose graph data only its owner may read fails to load for everyone else who shares a cache
    or gets a copy. The mode is read off a probe file rather than by setting the umask, which
    would change it for the whole process."""
    probe = root / f".mode-probe-{uuid.uuid4().hex[:8]}"
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        mode = stat.S_IMODE(probe.stat().st_mode)
    finally:
        probe.unlink()
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(mode)
