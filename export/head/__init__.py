"""Heads on the target: a one-layer drafter trained on the target's own features (EAGLE's
drafter over the target's hidden states), exported as a bundle the runtime's ``head`` drafter
runs beside its target.

Stages, each resumed from the work directory: the target's answers to the built-in mix and
its features at every position (:mod:`.data`), the reduced vocabulary (the tokens the target
writes most), training with a chain unrolled as the runtime drafts (:mod:`.train`), the
acceptance by draft position on held-out requests, and the bundle (:mod:`.graph`): the graph,
``vocabulary.json`` (the target token id of each output row) and a manifest whose
``extra["head"]`` names the target it was made for, its shape and its training record.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.errors import ConfigError, ModelSourceError, VerificationError
from edgespec.export.head.bundle import (
    HEAD_FILE,
    HEAD_KEY,
    VOCABULARY_FILE,
    head_bundle,
    torch_parity,
    write_head_gguf,
)
from edgespec.export.head.data import (
    FeatureTeacher,
    collect,
    collect_text,
    data_record,
    held_out_samples,
    kept_vocabulary,
    read_samples,
    save_json,
    stdlib_texts,
)
from edgespec.export.head.net import HeadShape, gguf_tensors
from edgespec.export.head.requests import (
    HELD_OUT,
    benchmark_prompts,
    chat_prompt,
    requests,
    self_written_requests,
)
from edgespec.export.head.train import (
    Log,
    TrainSettings,
    acceptance_by_depth,
    reduced_ids,
    train,
)
from edgespec.manifest import Bundle, load_bundle

__all__ = ["HEAD_KEY", "VOCABULARY_FILE", "HeadConfig", "head_bundle", "train_head"]


@dataclass(frozen=True, kw_only=True)
class HeadConfig:
    """``edgespec distill --head`` options."""

    target: Path  # the target's bundle (a GGUF import of this edgespec)
    gguf: Path  # the GGUF file the bundle was imported from
    out: Path
    work: Path | None = None
    data_minutes: float = 10.0
    #: Minutes of prefill passes over the standard library's source (no answers: many more
    #: positions a second), after the answers; 0: none.
    text_minutes: float = 5.0
    train_minutes: float = 10.0
    new_tokens: int = 128
    prompt_tokens: int = 256
    vocabulary: int = 8192
    intermediate: int = 0  # 0: the target's MLP width
    depth: int = 3
    batch: int = 8
    lr: float = 1e-3
    seed: int = 0
    device: str = "cpu"
    edit_prompts: int = 600
    #: User requests the target writes itself (sampled after its user-turn opening), beside
    #: the built-in mix: chat like its users'.
    self_prompts: int = 1024
    max_length: int = 2048
    force: bool = False
    #: Bounds besides the minutes (tests and reproducible runs): samples made, steps trained.
    max_samples: int | None = None
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if self.text_minutes < 0:
            raise ConfigError(f"--text-minutes is {self.text_minutes}", fix="use 0 or more")
        for name in ("data_minutes", "train_minutes"):
            if getattr(self, name) <= 0:
                raise ConfigError(
                    f"--{name.replace('_', '-')} is {getattr(self, name)}",
                    fix="use a positive number of minutes",
                )
        if self.vocabulary < 16:
            raise ConfigError(f"--vocabulary is {self.vocabulary}", fix="use 16 or more")
        if self.depth < 1:
            raise ConfigError(f"--depth is {self.depth}", fix="use 1 or more")

    @property
    def work_dir(self) -> Path:
        return self.work or self.out.parent / f".{self.out.name}.work"


def train_head(config: HeadConfig, *, log: Log) -> Bundle:
    """Every stage, resumed from ``config.work_dir``; returns the head's bundle."""
    from tokenizers import Tokenizer

    from edgespec.export.gguf.reader import open_gguf

    if config.out.exists() and not config.force:
        raise ConfigError(f"{config.out} already exists", fix="pass --force to replace it")
    target = load_bundle(config.target)
    if target.manifest.graph.features is None:
        raise ModelSourceError(
            f"{config.target} returns no features (imported by an older edgespec)",
            fix="import the model again with this version (edgespec export, or 'edgespec "
            "cache prune --stale' for a catalog model)",
        )
    source = open_gguf(config.gguf)
    file_sha = _sha256(config.gguf)
    if file_sha != target.manifest.source.config_sha256:
        raise ModelSourceError(
            f"{config.gguf.name} is not the file {config.target} was imported from",
            fix="pass the GGUF file the target bundle was made from",
        )
    work = config.work_dir
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(target.root / "tokenizer.json"))

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    template = _chat_template(target)
    built_in = requests(config.edit_prompts, config.seed)
    held_requests = built_in[:HELD_OUT]
    teacher = FeatureTeacher(target)
    written_path = work / "self-requests.json"
    if not written_path.is_file():
        log(f"head: {config.self_prompts} requests the target writes itself (once)")
        save_json(
            written_path,
            self_written_requests(
                teacher,
                template,
                encode,
                tokenizer.decode,
                config.self_prompts,
                seed=config.seed,
                excluded=benchmark_prompts() | frozenset(held_requests),
                log=log,
            ),
        )
    written = json.loads(written_path.read_text(encoding="utf-8"))
    train_requests = built_in[HELD_OUT:] + written
    order = np.random.default_rng(config.seed + 1).permutation(len(train_requests))
    train_texts = [chat_prompt(template, train_requests[i]) for i in order]
    held_texts = [chat_prompt(template, r) for r in held_requests]
    log(f"head: held-out answers ({len(held_texts)} requests, once)")
    held = held_out_samples(
        teacher,
        encode,
        held_texts,
        work / "held-out.npz",
        new_tokens=config.new_tokens,
        prompt_tokens=config.prompt_tokens,
    )
    data_dir = work / "data"
    data_done = work / "data.done"
    if not data_done.is_file():
        log(f"head: the target's answers and features, for {config.data_minutes:g} min")
        collect(
            teacher,
            encode,
            train_texts,
            data_dir,
            new_tokens=config.new_tokens,
            prompt_tokens=config.prompt_tokens,
            deadline=time.monotonic() + config.data_minutes * 60,
            max_samples=config.max_samples,
            seed=config.seed,
            log=log,
        )
        data_done.write_text("done\n")
    text_dir, text_done = work / "text", work / "text.done"
    if config.text_minutes > 0 and not text_done.is_file():
        log(
            f"head: the target's features over standard-library source, {config.text_minutes:g} min"
        )
        collect_text(
            teacher,
            encode,
            stdlib_texts(config.seed),
            text_dir,
            window=config.prompt_tokens,
            deadline=time.monotonic() + config.text_minutes * 60,
            log=log,
            max_samples=config.max_samples,
        )
        text_done.write_text("done\n")
    del teacher
    answers = read_samples(data_dir)
    samples = answers + read_samples(text_dir)
    eos = frozenset(target.manifest.tokenizer.eos_token_ids)
    kept_path = work / "kept.npy"
    if not kept_path.is_file():
        np.save(kept_path, kept_vocabulary(answers, config.vocabulary, eos))
    kept = np.load(kept_path)
    arch = source.architecture
    shape = HeadShape(
        hidden=arch.hidden_size,
        heads=arch.num_heads,
        kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        intermediate=config.intermediate or arch.intermediate_size,
        vocabulary=len(kept),
        rope_theta=arch.rope_theta,
        rms_norm_eps=arch.rms_norm_eps,
    )
    table, output, norm = _frozen_rows(source, kept)
    log(
        f"head: training on {data_record(samples)['positions']:,} positions for "
        f"{config.train_minutes:g} min ({len(kept):,} kept tokens)"
    )
    settings = TrainSettings(
        depth=config.depth,
        batch=config.batch,
        lr=config.lr,
        seed=config.seed,
        device=config.device,
        minutes=config.train_minutes,
        max_steps=config.max_steps or TrainSettings.max_steps,
    )
    net, record = train(
        samples,
        shape=shape,
        table=table,
        output=output,
        norm=norm,
        kept=kept,
        settings=settings,
        checkpoint=work / "checkpoint.pt",
        log=log,
    )
    net = net.to("cpu").eval()
    acceptance = acceptance_by_depth(net, held, kept, depth=6)
    log(f"head: held-out acceptance by draft position {acceptance}")
    head_record: dict[str, Any] = {
        "target": {
            "bundle": target.root.name,
            "source_sha256": target.manifest.source.config_sha256,
            "graph_revision": _graph_revision(),
            "hidden_size": arch.hidden_size,
            "vocab_size": target.manifest.model.vocab_size,
        },
        "shape": shape.record(),
        "form": "eagle-1 (the last layer's features), one decoder layer, chain drafts",
        "training": {
            **record,
            "data": data_record(samples),
            "data_minutes": config.data_minutes,
            "requests": {
                "built_in": len(built_in) - len(held),
                "self_written": len(written),
                "edit_prompts": config.edit_prompts,
            },
            "held_out_requests": len(held),
            "seed": config.seed,
        },
        "acceptance_by_position": acceptance,
        "acceptance_measured": "torch, float weights, greedy chains on held-out answers",
    }
    head_file = write_head_gguf(gguf_tensors(net), kept, head_record, work / HEAD_FILE)
    bundle = head_bundle(
        head_file,
        source,
        target_sha256=file_sha,
        out=config.out,
        capacity=min(config.max_length, target.manifest.model.max_length),
        force=config.force,
    )
    parity = torch_parity(bundle, net, reduced_ids(held[0].tokens, kept), held[0].features)
    head_record["onnx_top1_agreement"] = parity.top1_agreement
    save_json(work / "record.json", head_record)
    if not parity.passed:
        raise VerificationError(
            f"the ONNX head's top token equals the torch head's at {parity.top1_agreement:.1%} "
            f"of positions (below {parity.min_top1_agreement:.0%}): its graph is miswired",
            fix="report it; the trained weights are kept in the work directory",
        )
    log(f"head: the ONNX head's drafts equal the torch head's at {parity.top1_agreement:.1%}")
    return bundle


def _frozen_rows(source: Any, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The head's table [N + pad, H] (the target's embedding rows of the kept tokens, then
    zero rows), its scoring rows (the output layer's, None when tied) and the target's final
    norm weight [H], float32."""
    from edgespec.export.gguf.reader import float_rows, float_tensor
    from edgespec.export.head.graph import table_padding

    def rows(name: str) -> np.ndarray:
        kept_rows = float_rows(source.tensors[name], kept.tolist())
        padding = np.zeros((table_padding(len(kept)), kept_rows.shape[1]), np.float32)
        return np.concatenate([kept_rows, padding]).astype(np.float32)

    output = rows("output.weight") if "output.weight" in source.tensors else None
    norm = float_tensor(source.tensors["output_norm.weight"]).astype(np.float32)
    return rows("token_embd.weight"), output, norm


def _chat_template(bundle: Bundle) -> str | None:
    config_path = bundle.root / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    template = config.get("chat_template")
    jinja = bundle.root / "chat_template.jinja"
    if not template and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    return template if isinstance(template, str) else None


def _graph_revision() -> int:
    from edgespec.export.gguf.graph import GRAPH_REVISION

    return GRAPH_REVISION


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
