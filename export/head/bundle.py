"""A head as a file and as a bundle.

The file (``head.gguf``, what the package ships): the trained layer and input projection as
Q8_0 blocks, its norms in float32, and in its metadata the kept token ids, its shape and its
record (the target it was made for, its training, its acceptance). It holds none of the
target's weights: the bundle is built on the device from the file and the target's own GGUF
(its kept rows and final norm), by the importer's builder, without torch.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.config import ExportConfig
from edgespec.errors import ModelSourceError
from edgespec.export.bundle import (
    file_records,
    memory_estimate,
    staging_directory,
    write_bundle_manifest,
)
from edgespec.export.gguf.manifest_records import DATA_FILE, GRAPH_FILE, graph_spec, model_spec
from edgespec.export.gguf.reader import GGUFFile
from edgespec.export.head.graph import FEATURE_INPUT, HEAD_QUANT, head_source, write_head_graph
from edgespec.export.head.net import HeadShape
from edgespec.export.hf_source import FloatTensor, QuantizedTensor
from edgespec.manifest import (
    Bundle,
    QuantizationSpec,
    SourceSpec,
    TensorSpec,
    TokenizerSpec,
    load_bundle,
    sha256_of_file,
)
from edgespec.verification import ParityResult, VerificationRecord

#: ``Manifest.extra`` key of a head bundle's record, and the head file's metadata keys.
HEAD_KEY = "head"
RECORD_KEY = "edgespec.head.record"
KEPT_KEY = "edgespec.head.kept"
#: The file that maps a head's output rows to the target's token ids.
VOCABULARY_FILE = "vocabulary.json"
HEAD_FILE = "head.gguf"


def write_head_gguf(
    tensors: dict[str, np.ndarray], kept: np.ndarray, record: dict[str, Any], path: Path
) -> Path:
    """The trained head's file (atomically): matrices as Q8_0 blocks, vectors as float32."""
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    scratch = path.with_name(path.name + ".partial")
    writer = GGUFWriter(str(scratch), "edgespec-head")
    writer.add_string(RECORD_KEY, json.dumps(record))
    writer.add_array(KEPT_KEY, [int(t) for t in kept])
    quant = GGMLQuantizationType[HEAD_QUANT]
    for name, value in tensors.items():
        if value.ndim == 2:
            writer.add_tensor(name, quants.quantize(value, quant), raw_dtype=quant)
        else:
            writer.add_tensor(name, value.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    scratch.replace(path)
    return path


def read_head_gguf(path: Path) -> tuple[dict[str, Any], np.ndarray, dict[str, Any]]:
    """A head file's tensors (as the graph builder reads them), kept ids and record."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        record = json.loads(reader.fields[RECORD_KEY].contents())
        kept = np.asarray(reader.fields[KEPT_KEY].contents(), np.int64)
    except Exception as error:  # gguf raises ValueError, KeyError, struct.error...
        raise ModelSourceError(
            f"{path} is not a head file ({type(error).__name__}: {str(error)[:100]})",
            fix="pass a head written by 'edgespec distill --head'",
        ) from error
    tensors: dict[str, Any] = {}
    for tensor in reader.tensors:
        data = np.asarray(tensor.data)
        if tensor.tensor_type.name == "F32":
            tensors[tensor.name] = FloatTensor(np.array(data, np.float32).reshape(-1))
        else:
            columns, rows = (int(n) for n in tensor.shape[:2])
            tensors[tensor.name] = QuantizedTensor(
                data=np.array(data).reshape(rows, -1),
                tensor_type=tensor.tensor_type,
                shape=(columns, rows),
            )
    return tensors, kept, record


def check_head_target(record: dict[str, Any], target: GGUFFile, target_sha256: str) -> None:
    """Refuses a head made for another target (another file, or another importer revision)."""
    made_for = record["target"]
    if made_for["source_sha256"] != target_sha256:
        raise ModelSourceError(
            f"this head was made for {made_for['bundle']} (sha256 "
            f"{made_for['source_sha256'][:12]}), not for {target.path.name} (sha256 "
            f"{target_sha256[:12]})",
            fix="train a head for this target with 'edgespec distill --head TARGET'",
        )


def head_bundle(
    head_file: Path,
    target: GGUFFile,
    *,
    target_sha256: str,
    out: Path,
    capacity: int,
    force: bool = False,
) -> Bundle:
    """The head's bundle at ``out``, built from its file and the target's GGUF."""
    from edgespec.graph.kernels import gguf_kernel_library, kernel_types

    tensors, kept, record = read_head_gguf(head_file)
    check_head_target(record, target, target_sha256)
    shape = HeadShape(**record["shape"])
    source = head_source(target, tensors, kept, shape)
    arch = source.architecture
    kinds = kernel_types("auto") if gguf_kernel_library() is not None else frozenset()
    with staging_directory(out, force=force) as staging:
        builder, layout = write_head_graph(source, staging, capacity=capacity, kernel_types=kinds)
        vocabulary = staging / VOCABULARY_FILE
        vocabulary.write_text(json.dumps({"kept": [int(t) for t in kept]}) + "\n")
        (staging / HEAD_FILE).write_bytes(head_file.read_bytes())
        spec = graph_spec(source, layout, 1)
        feature_spec = TensorSpec(
            name=FEATURE_INPUT, dtype="float32", shape=(1, "sequence", arch.hidden_size)
        )
        spec = replace(
            spec,
            inputs=(*spec.inputs[:1], feature_spec, *spec.inputs[1:]),
            feature_input=FEATURE_INPUT,
            attention_boundaries=(),
        )
        roles = {
            GRAPH_FILE: "graph",
            DATA_FILE: "graph_data",
            VOCABULARY_FILE: "tokenizer",
            HEAD_FILE: "report",
        }
        weight_bytes = (staging / DATA_FILE).stat().st_size
        write_bundle_manifest(
            staging,
            ExportConfig(model=str(head_file), out=out, force=True),
            source=SourceSpec(
                model=head_file.name, kind="head", revision=None, config_sha256=target_sha256
            ),
            model=model_spec(
                arch,
                model_type="edgespec-head",
                architecture="head:eagle",
                parameters=sum(int(t.n_elements) for t in tensors.values()),
                positions=target.architecture.context_length,
                capacity=capacity,
            ),
            graph=spec,
            tokenizer=TokenizerSpec(
                file=VOCABULARY_FILE,
                files=(VOCABULARY_FILE,),
                sha256=sha256_of_file(vocabulary),
                vocab_type="head",
                vocab_size=int(record["target"]["vocab_size"]),
                bos_token_id=None,
                eos_token_ids=(),
                pad_token_id=None,
                add_bos_token=False,
                special_tokens={},
                has_chat_template=False,
            ),
            quantization=QuantizationSpec(
                scheme="gguf_blocks" if builder.kernel_ops else "matmul_nbits",
                weight_dtype=HEAD_QUANT.lower(),
                bits=8,
                block_size=32,
                accuracy_level=4,
                symmetric=True,
                op_types=("MatMulNBits", "Gather", *sorted(builder.kernel_ops)),
                tool="edgespec head",
            ),
            verification=VerificationRecord(performed=False),
            memory=memory_estimate(
                spec,
                weight_bytes=weight_bytes,
                vocab_size=arch.vocab_size,
                file_bytes=weight_bytes + (staging / GRAPH_FILE).stat().st_size,
            ),
            files=file_records(staging, roles),
            packages=("edgespec", "onnx"),
            extra={HEAD_KEY: record, "output_columns": len(kept)},
        )
    return load_bundle(out)


#: The ONNX head's top token must equal the torch head's at this share of checked positions
#: (its layer runs in Q8_0 with 8-bit activations, the torch head in float32; a miswired
#: graph agrees at about 1 / N).
MIN_TOP1 = 0.75


def torch_parity(
    bundle: Bundle, net: Any, tokens: np.ndarray, features: np.ndarray
) -> ParityResult:
    """The ONNX head's depth-1 drafts against the torch head's over one sequence (tokens [L]
    as the head's table rows, the target's features [L, H])."""
    import torch

    from edgespec.graph.driver import GraphDriver, check_session
    from edgespec.graph.paths import GraphSizes

    model, spec = bundle.manifest.model, bundle.manifest.graph
    sizes = GraphSizes(
        kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        vocab_size=model.vocab_size,
        capacity=bundle.manifest.context(len(tokens)),
        hidden_size=model.hidden_size,
    )
    driver = GraphDriver(check_session(bundle.graph_path), spec, sizes, bound=False)
    ids, inputs = tokens[1:].astype(np.int64), features[:-1].astype(np.float32)
    logits, _ = driver.forward_features(ids.tolist(), driver.new_cache(), feature_input=inputs)
    with torch.no_grad():
        expected = net.unrolled(
            torch.from_numpy(tokens.astype(np.int64))[None],
            torch.from_numpy(features.astype(np.float32))[None],
            1,
            drafted=False,
        )[0][0]
        expected_logits = net.logits(expected).numpy()
    columns = net.shape.vocabulary
    top1 = float(np.mean(logits[:, :columns].argmax(-1) == expected_logits.argmax(-1)))
    return ParityResult(
        prompts=1,
        positions=len(ids),
        max_abs_logit_diff=float(np.max(np.abs(logits[:, :columns] - expected_logits))),
        logit_tolerance=None,
        top1_agreement=top1,
        min_top1_agreement=MIN_TOP1,
        greedy_tokens=0,
        greedy_match_tokens=0,
        greedy_divergence_margins=(),
        required=("top1_agreement",),
        passed=top1 >= MIN_TOP1,
    )
