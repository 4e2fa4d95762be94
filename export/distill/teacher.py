"""The target as a teacher: greedy and sampled continuations and next-token logits, from a
Hugging Face directory in torch or a GGUF import run by ONNX Runtime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgespec.config import ExportConfig
from edgespec.errors import ModelSourceError
from edgespec.export.distill.config import TOP_K, DistillConfig, Log
from edgespec.graph.driver import GraphDriver, check_session
from edgespec.graph.paths import GraphSizes
from edgespec.manifest import Bundle, load_bundle


class Teacher:
    """The target as a teacher: greedy continuations and next-token logits."""

    vocab_size: int
    tokenizer_dir: Path  # tokenizer.json (and tokenizer_config.json) of the target
    chat_template: str | None
    description: str
    #: Sequences the data stage hands over at once (``continue_many``, ``top_logprobs_many``).
    batch_size: int = 1
    #: End-of-turn ids a continuation stops at; empty when the teacher runs to ``count``.
    eos_ids: tuple[int, ...] = ()

    def continue_greedy(self, prompt: list[int], count: int) -> list[int]:
        raise NotImplementedError

    def logits(self, tokens: list[int]) -> np.ndarray:
        """[len(tokens), vocab] float32."""
        raise NotImplementedError

    def continue_sampled(
        self, prompt: list[int], count: int, temperature: float, seed: int
    ) -> list[int]:
        """``count`` tokens sampled at ``temperature`` (one full pass per token: simple, and
        the data stage is a small part of a distillation)."""
        rng = np.random.default_rng(seed)
        tokens = list(prompt)
        for _ in range(count):
            tokens.append(_sample(self.logits(tokens)[-1], temperature, rng))
        return tokens[len(prompt) :]

    def continue_many(
        self, prompts: list[list[int]], count: int, temperature: float, seed: int
    ) -> list[list[int]]:
        """``count`` tokens for each prompt, greedy at temperature 0 (one at a time here;
        batched where the teacher can)."""
        if temperature <= 0:
            return [self.continue_greedy(p, count) for p in prompts]
        return [
            self.continue_sampled(p, count, temperature, seed * 1_000_003 + i)
            for i, p in enumerate(prompts)
        ]

    def top_logprobs_many(self, sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Top-``TOP_K`` ids and log-probabilities at every position of right-padded
        sequences: ([n, width, TOP_K] int32, [n, width, TOP_K] float32, -inf where padded)."""
        width = max(len(s) for s in sequences)
        ids = np.zeros((len(sequences), width, TOP_K), np.int32)
        values = np.full((len(sequences), width, TOP_K), -np.inf, np.float32)
        for row, sequence in enumerate(sequences):
            logits = self.logits(sequence)  # [len(sequence), vocab]
            top = np.argpartition(-logits, TOP_K - 1, axis=-1)[:, :TOP_K]
            chosen = np.take_along_axis(logits, top, axis=-1)
            ids[row, : len(sequence)] = top
            values[row, : len(sequence)] = chosen - _logsumexp(logits)[:, None]
        return ids, values


def _logsumexp(logits: np.ndarray) -> np.ndarray:
    peak = logits.max(-1)
    return np.asarray(peak + np.log(np.exp(logits - peak[:, None]).sum(-1)))


def _sample(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    scaled = logits.astype(np.float64) / temperature
    probabilities = np.exp(scaled - scaled.max())
    return int(rng.choice(len(probabilities), p=probabilities / probabilities.sum()))


class TorchTeacher(Teacher):
    def __init__(self, directory: Path, device: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        self.model.to(device).eval()  # type: ignore[arg-type]
        self.device = device
        self.vocab_size = int(self.model.config.vocab_size)
        self.tokenizer_dir = directory
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.chat_template = config.get("chat_template")
        self.description = f"Hugging Face model {directory.name} (torch)"

    def continue_greedy(self, prompt: list[int], count: int) -> list[int]:
        ids = self.torch.tensor([prompt], device=self.device)
        with self.torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=self.torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=count,
                pad_token_id=self.model.config.eos_token_id or 0,
            )
        return [int(t) for t in out[0, len(prompt) :]]

    def logits(self, tokens: list[int]) -> np.ndarray:
        with self.torch.no_grad():
            out = self.model(input_ids=self.torch.tensor([tokens], device=self.device)).logits
        return np.asarray(out[0].float().cpu().numpy())


class OnnxTeacher(Teacher):
    """A GGUF bundle (in-place KV graph) run with ONNX Runtime, as its export checks run it."""

    def __init__(self, bundle: Bundle) -> None:
        if bundle.manifest.graph.kv_sharing != "shared":
            raise ModelSourceError(
                f"{bundle.root} is not a GGUF import; a bundle teacher must be one",
                fix="pass the Hugging Face directory or the GGUF file the bundle came from",
            )
        model, graph = bundle.manifest.model, bundle.manifest.graph
        sizes = GraphSizes(
            kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            vocab_size=model.vocab_size,
            capacity=bundle.manifest.context(),
            hidden_size=model.hidden_size,
        )
        self.driver = GraphDriver(
            check_session(bundle.graph_path), graph, sizes, bound=False, label=str(bundle.root)
        )
        self.vocab_size = bundle.manifest.model.vocab_size
        self.tokenizer_dir = bundle.root
        self.max_length = sizes.capacity
        config_path = bundle.root / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.chat_template = config.get("chat_template")
        self.description = f"bundle {bundle.root.name} (ONNX Runtime)"

    def continue_greedy(self, prompt: list[int], count: int) -> list[int]:
        return self.driver.greedy(prompt, count)

    def continue_sampled(
        self, prompt: list[int], count: int, temperature: float, seed: int
    ) -> list[int]:
        rng = np.random.default_rng(seed)
        cache = self.driver.new_cache()
        logits = self.driver.forward(prompt, cache)
        produced: list[int] = []
        while True:
            produced.append(_sample(logits[-1], temperature, rng))
            if len(produced) == count:
                return produced
            logits = self.driver.forward(produced[-1:], cache)

    def logits(self, tokens: list[int]) -> np.ndarray:
        return self.driver.forward(tokens, self.driver.new_cache())


def load_teacher(config: DistillConfig, log: Log) -> Teacher:
    """A Hugging Face directory, a GGUF import bundle, or a GGUF file (imported into the work
    directory once)."""
    from edgespec.export.gguf.locate import is_gguf_source
    from edgespec.export.gguf.pipeline import export_gguf

    target = Path(config.target)
    if is_gguf_source(config.target) and config.device != "cpu":
        teacher = _torch_gguf_teacher(config, log)
        if teacher is not None:
            return teacher
    if is_gguf_source(config.target) and not (target / "manifest.json").is_file():
        imported = config.work_dir / "target-bundle"
        if not (imported / "manifest.json").is_file():
            log(f"distill: importing {target.name} (once) ...")
            export_gguf(ExportConfig(model=config.target, out=imported, force=True))
        return OnnxTeacher(load_bundle(imported))
    if (target / "manifest.json").is_file():
        return OnnxTeacher(load_bundle(target))
    if (target / "config.json").is_file():
        return TorchTeacher(target, config.device)
    raise ModelSourceError(
        f"{config.target} is not a Hugging Face model directory, a GGUF file or a bundle",
        fix="pass the target's directory (with config.json), its .gguf file, or its bundle",
    )


def _torch_gguf_teacher(config: DistillConfig, log: Log) -> Teacher | None:
    """On a GPU a llama/qwen2 GGUF runs as a dequantized torch model (batched); on the CPU
    and for other architectures the imported ONNX graph (exactly the target) teaches."""
    from edgespec.export.distill.torch_teacher import TORCH_ARCHITECTURES, GgufTorchTeacher
    from edgespec.export.gguf.locate import gguf_path
    from edgespec.export.gguf.reader import open_gguf

    with gguf_path(config.target) as path:
        source = open_gguf(path)
        if source.architecture.arch not in TORCH_ARCHITECTURES:
            return None
        log(f"distill: dequantizing {path.name} into torch on {config.device} ...")
        return GgufTorchTeacher(source, config.work_dir / "teacher-tokenizer", config.device)
