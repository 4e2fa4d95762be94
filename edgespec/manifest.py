"""The bundle manifest: schema, serialisation, loading and validation.

A bundle is one exported model directory. ``manifest.json`` describes everything the runtime
needs about its graph, so nothing is ever inferred from file names. The exporter writes it
with :func:`write_manifest`; the runtime reads it with :func:`load_bundle`, which checks the
schema version, every listed file, its size (a short file is reported as truncated) and its
sha256.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgespec.errors import (
    UPGRADE_FIX,
    BundleError,
    ChecksumError,
    MissingFileError,
    SchemaVersionError,
)
from edgespec.records import decode_record
from edgespec.verification import VerificationRecord

SCHEMA_VERSION = 1
#: The logit a graph gives a token outside a draft's reduced output vocabulary: softmax gives
#: it exactly 0, and a runtime can tell the scored ids from it.
UNSCORED_LOGIT = -1e9
MANIFEST_NAME = "manifest.json"
_HASH_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class FileRecord:
    """One file of the bundle. ``role`` is graph, graph_data, tokenizer, config or report."""

    path: str
    role: str
    size: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """A graph input or output; symbolic dimensions are kept as their names."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]


@dataclass(frozen=True, kw_only=True)
class GraphSpec:
    """Exact I/O of the ONNX graph.

    KV tensors have layout ``kv_layout`` = (batch, kv_heads, sequence, head_dim);
    ``past_key[i]`` feeds layer i and ``present_key[i]`` is its output for the next step.
    """

    file: str
    opset: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    logits: str
    past_key: tuple[str, ...]
    past_value: tuple[str, ...]
    present_key: tuple[str, ...]
    present_value: tuple[str, ...]
    kv_dtype: str
    logits_dtype: str
    kv_layout: str = "batch,kv_heads,sequence,head_dim"
    #: "concat": past [1, kv_heads, length, head_dim] in, present with the new positions
    #: appended out (optimum's graphs); "shared": past and present are one buffer of
    #: ``kv_capacity`` positions (None: as many as the session's context, which the runtime
    #: allocates) that a pass writes in place (GroupQueryAttention), fed with
    #: ``seqlens_k`` = length + n - 1 and ``total_sequence_length`` = length + n.
    kv_sharing: str = "concat"
    kv_capacity: int | None = None
    #: Positions a shared-buffer pass writes per token: 1 in every graph this edgespec writes.
    #: An older edgespec's folded attention wrote more; such a bundle is refused at load with
    #: the line that says to import it again.
    kv_positions_per_token: int = 1
    seqlens_k: str | None = None
    total_sequence_length: str | None = None
    #: An in-place graph's int64 input [R]: the pass-local rows whose logits it computes
    #: (``logits`` is then [1, R, vocab]); None for graphs that return every row's logits.
    logits_rows: str | None = None
    #: Passes of fewer positions are padded to this width: a graph whose one-position kernels
    #: round differently from its multi-position ones is batch invariant once every pass is
    #: at least two positions wide.
    min_pass_width: int = 1
    #: Total lengths (past + pass width) at which the graph's attention rounds differently
    #: (probed on the exporting machine, see :mod:`edgespec.export.gguf.regimes`): the
    #: runtime cuts passes so that each position is computed in its single step's regime.
    attention_boundaries: tuple[int, ...] = ()
    #: A copy of the graph whose attention and KV buffers are float16 (its weights are the
    #: graph's own data file), which CUDA sessions run: ONNX Runtime's CUDA attention takes
    #: no float32 (see :mod:`edgespec.export.half_attention`). None: no such copy.
    half_attention_file: str | None = None
    #: An in-place graph's float32 output [1, S, hidden]: every position's hidden state after
    #: the last layer, before the final norm (what a head on the target drafts from); None for
    #: graphs that return none. It costs nothing to ask for: the LM head reads the same value.
    features: str | None = None
    #: A head's float32 input [1, S, hidden]: for each token of the pass, the target's feature
    #: at the position before it (or the head's own prediction of it, while it drafts); None
    #: for every graph but a head's.
    feature_input: str | None = None


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Architecture facts the runtime needs (KV shapes, vocabulary, context)."""

    model_type: str
    architecture: str
    parameters: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    #: The most positions a session may run at (an in-place graph's rotary tables' length,
    #: the model's trained context unless the export asked for less).
    max_length: int


@dataclass(frozen=True, kw_only=True)
class SourceSpec:
    """Where the weights came from. ``kind`` is hub or local; local paths keep only their name."""

    model: str
    kind: str
    revision: str | None
    config_sha256: str


@dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """The tokenizer shipped in the bundle (``tokenizer.json`` for the ``tokenizers`` library)."""

    file: str
    files: tuple[str, ...]
    sha256: str
    vocab_type: str
    vocab_size: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    add_bos_token: bool
    special_tokens: dict[str, str]
    has_chat_template: bool


@dataclass(frozen=True, kw_only=True)
class QuantizationSpec:
    """How the weights were stored. ``scheme`` is none, fp16, matmul_nbits or dynamic_int8;
    ``op_types`` lists the ONNX ops whose weights were quantized (Gather = the embedding table).
    """

    scheme: str
    weight_dtype: str
    bits: int
    block_size: int | None = None
    accuracy_level: int | None = None
    symmetric: bool | None = None
    op_types: tuple[str, ...] = ()
    tool: str = ""


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Bytes the graph needs: weights, KV per token (all layers, K and V), logits per position."""

    weight_bytes: int
    kv_bytes_per_token: int
    logits_bytes_per_position: int
    file_bytes: int
    #: Of ``weight_bytes``, the embedding table's when only lookups read it (the model has an
    #: output head of its own): its pages stay out of memory but for the rows looked up. 0
    #: when the tied head reads it whole, or when the exporter did not record it.
    gathered_bytes: int = 0
    #: A session's resident size once a pass has read every weight, measured by the exporter
    #: in a fresh process (ONNX Runtime's packed copies included); 0 when not measured.
    resident_bytes: int = 0

    def kv_bytes(self, tokens: int) -> int:
        return self.kv_bytes_per_token * tokens


#: The context a session runs at when none is asked for (a model's own if that is shorter),
#: as llama.cpp's server defaults to 4,096: its KV cache is sized for it at load.
DEFAULT_CONTEXT = 4096


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """The whole ``manifest.json``."""

    schema_version: int
    edgespec_version: str
    created_at: str
    source: SourceSpec
    model: ModelSpec
    graph: GraphSpec
    tokenizer: TokenizerSpec
    quantization: QuantizationSpec
    verification: VerificationRecord
    memory: MemoryEstimate
    files: tuple[FileRecord, ...]
    toolchain: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        return decode_record(cls, data, "manifest")

    def context(self, requested: int | None = None) -> int:
        """The context a session of this bundle runs at: ``requested`` (None:
        :data:`DEFAULT_CONTEXT`) within the model's ``max_length`` and, for an in-place graph
        of an older import, its buffers' fixed length (``graph.kv_capacity``)."""
        limit = min(self.model.max_length, self.graph.kv_capacity or self.model.max_length)
        return min(requested or DEFAULT_CONTEXT, limit)

    @property
    def system_prompt(self) -> str | None:
        """The system message a conversation gets when it has none (``export
        --system-prompt``), if the exporter recorded one."""
        value = self.extra.get(SYSTEM_PROMPT_KEY)
        return value if isinstance(value, str) and value else None


#: ``Manifest.extra`` key of the default system message.
SYSTEM_PROMPT_KEY = "system_prompt"


def system_prompt_extra(system_prompt: str | None) -> dict[str, Any]:
    """The ``extra`` entry that records a default system message (none when not given)."""
    return {SYSTEM_PROMPT_KEY: system_prompt} if system_prompt else {}


@dataclass(frozen=True, kw_only=True)
class Bundle:
    """A validated bundle directory and its manifest."""

    root: Path
    manifest: Manifest

    @property
    def graph_path(self) -> Path:
        return self.root / self.manifest.graph.file

    @property
    def tokenizer_path(self) -> Path:
        return self.root / self.manifest.tokenizer.file


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def file_record(root: Path, relative: str, role: str) -> FileRecord:
    path = root / relative
    return FileRecord(
        path=relative, role=role, size=path.stat().st_size, sha256=sha256_of_file(path)
    )


def write_manifest(root: Path, manifest: Manifest) -> Path:
    path = root / MANIFEST_NAME
    path.write_text(manifest.to_json(), encoding="utf-8")
    return path


#: The first bytes of every GGUF file.
GGUF_MAGIC = b"GGUF"


def starts_with_gguf_magic(path: Path) -> bool:
    """Whether the file at ``path`` is a GGUF file by its first bytes (not by its name)."""
    try:
        with path.open("rb") as file:
            return file.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def load_bundle(root: str | Path, *, verify_checksums: bool = True) -> Bundle:
    """Reads and validates a bundle; raises a :class:`BundleError` naming the file and the fix."""
    root = Path(root)
    if root.is_file():
        if starts_with_gguf_magic(root):
            raise BundleError(
                f"{root} is a GGUF file, not a bundle directory",
                fix=f"convert it once with 'edgespec export {root} --out DIR', then pass DIR",
            )
        holds = (root.parent / "manifest.json").is_file()
        hint = f": {root.parent} holds one" if holds else ""
        raise BundleError(
            f"{root} is neither a bundle directory nor a GGUF file",
            fix=f"pass a GGUF file or the directory that holds manifest.json{hint}",
        )
    if not root.is_dir():
        raise BundleError(
            f"bundle directory {root} does not exist",
            fix="pass the directory written by 'edgespec export'",
        )
    manifest_path = root / MANIFEST_NAME
    if not manifest_path.is_file():
        raise MissingFileError(
            f"{manifest_path} is missing: {root} is not an edgespec bundle",
            fix="export the model with 'edgespec export MODEL --out DIR'",
        )
    try:
        data = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BundleError(
            f"{manifest_path} is not valid JSON ({error})", fix="re-export the bundle"
        ) from error
    if not isinstance(data, dict):
        raise BundleError(
            f"{manifest_path} does not hold a JSON object", fix="re-export the bundle"
        )
    _check_schema_version(data.get("schema_version"), manifest_path)
    manifest = Manifest.from_dict(data)
    if manifest.graph.kv_positions_per_token != 1:
        raise BundleError(
            f"{root} holds a graph with folded attention (an older edgespec's --attention "
            "folded), which this edgespec no longer runs",
            fix="import its model again with 'edgespec export SOURCE --out DIR' (a cached "
            "catalog model: 'edgespec cache prune --stale' removes it)",
        )
    _check_files(root, manifest, verify_checksums=verify_checksums)
    return Bundle(root=root, manifest=manifest)


def _check_schema_version(version: object, manifest_path: Path) -> None:
    if version == SCHEMA_VERSION:
        return
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{manifest_path} has schema version {version}, newer than the {SCHEMA_VERSION} "
            "this edgespec reads",
            fix=UPGRADE_FIX,
        )
    raise SchemaVersionError(
        f"{manifest_path} has unknown schema version {version!r} (this edgespec reads "
        f"{SCHEMA_VERSION})",
        fix="re-export the model with this edgespec",
    )


def _check_files(root: Path, manifest: Manifest, *, verify_checksums: bool) -> None:
    listed = {record.path for record in manifest.files}
    for required in (manifest.graph.file, manifest.tokenizer.file):
        if required not in listed:
            raise BundleError(
                f"{root / MANIFEST_NAME} does not list {required} among its files",
                fix="re-export the bundle",
            )
    for record in manifest.files:
        path = root / record.path
        if not path.is_file():
            raise MissingFileError(
                f"{path} is missing from the bundle",
                fix="copy the whole bundle directory again or re-export it",
            )
        size = path.stat().st_size
        if size < record.size:
            raise ChecksumError(
                f"{path} is truncated ({size} of {record.size} bytes)",
                fix="copy the bundle again (an interrupted transfer?) or re-export it",
            )
        if size != record.size:
            raise ChecksumError(
                f"{path} has {size} bytes, the manifest says {record.size}",
                fix="copy the bundle again or re-export it",
            )
        if verify_checksums and sha256_of_file(path) != record.sha256:
            raise ChecksumError(
                f"{path} does not match its sha256 in the manifest (corrupted or modified)",
                fix="copy the bundle again or re-export it",
            )
