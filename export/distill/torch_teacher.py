"""A GGUF target as a torch teacher: the file's weights dequantized into a transformers
model, so that a GPU makes the distillation data in batches (the ONNX teacher runs one
sequence at a time on the CPU). Llama-family and Qwen2 files; others use the ONNX teacher."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgespec.export.distill.config import TOP_K
from edgespec.export.distill.teacher import Teacher
from edgespec.export.gguf.reader import GGUFFile, float_tensor

#: Sequences per batched generate on a GPU (a small target's step is bound by kernel
#: launches, so wide batches are nearly free), and per forward pass for the top-k
#: log-probabilities (a 49k vocabulary's logits for 64 × 224 positions are 2.8 GB in float32).
GPU_BATCH = 512
LOGITS_BATCH = 64
TORCH_ARCHITECTURES = ("llama", "qwen2")


def unpermute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter reorders each head's Q/K rows so that rotary pairs are adjacent
    (its "normal" rope); transformers rotates halves. [heads * d, in] -> same shape, rows
    back in transformers' order."""
    rows, columns = weight.shape
    d = rows // heads
    return weight.reshape(heads, d // 2, 2, columns).swapaxes(1, 2).reshape(rows, columns)


def permute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """The converter's order from transformers' (the inverse of ``unpermute_rope_rows``)."""
    rows, columns = weight.shape
    d = rows // heads
    return weight.reshape(heads, 2, d // 2, columns).swapaxes(1, 2).reshape(rows, columns)


def torch_model_from_gguf(source: GGUFFile) -> Any:
    """A transformers causal LM (float32, CPU) holding the file's dequantized weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    arch = source.architecture
    kind = (
        (LlamaConfig, LlamaForCausalLM) if arch.arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    )
    config = kind[0](
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        rms_norm_eps=arch.rms_norm_eps,
        rope_theta=arch.rope_theta,
        max_position_embeddings=arch.context_length,
        tie_word_embeddings=arch.tied_embeddings or bool(arch.output_vocabulary),
    )
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict):  # transformers 5 keeps rope_theta here
        parameters["rope_theta"] = arch.rope_theta
    model = kind[1](config)
    names = {
        "attn_norm.weight": "input_layernorm.weight",
        "attn_q.weight": "self_attn.q_proj.weight",
        "attn_k.weight": "self_attn.k_proj.weight",
        "attn_v.weight": "self_attn.v_proj.weight",
        "attn_q.bias": "self_attn.q_proj.bias",
        "attn_k.bias": "self_attn.k_proj.bias",
        "attn_v.bias": "self_attn.v_proj.bias",
        "attn_output.weight": "self_attn.o_proj.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "ffn_gate.weight": "mlp.gate_proj.weight",
        "ffn_up.weight": "mlp.up_proj.weight",
        "ffn_down.weight": "mlp.down_proj.weight",
    }
    state: dict[str, Any] = {}
    for name, tensor in source.tensors.items():
        if name == "output.weight" and arch.output_vocabulary:
            continue  # a reduced draft head: the rows of its tied embedding
        value = float_tensor(tensor)
        if name.startswith("blk."):
            _, layer, rest = name.split(".", 2)
            if arch.rope_interleaved and rest in ("attn_q.weight", "attn_k.weight"):
                heads = arch.num_heads if rest == "attn_q.weight" else arch.num_kv_heads
                value = unpermute_rope_rows(value, heads)
            target = f"model.layers.{layer}.{names[rest]}"
        else:
            target = {
                "token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight",
            }[name]
        state[target] = torch.from_numpy(np.array(value, dtype=np.float32))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = arch.tied_embeddings or bool(arch.output_vocabulary)
    missing = [m for m in missing if not (tied and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"GGUF -> torch: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if tied:
        model.tie_weights()
    return model.eval()


class GgufTorchTeacher(Teacher):
    """A llama/qwen2 GGUF dequantized into torch on ``device``; batched continuations."""

    def __init__(self, source: GGUFFile, tokenizer_dir: Path, device: str) -> None:
        import torch

        from edgespec.export.gguf.tokenizer import build_tokenizer, save_tokenizer_files

        self.torch = torch
        tokenizer_dir.mkdir(parents=True, exist_ok=True)
        built = build_tokenizer(source)
        save_tokenizer_files(built, tokenizer_dir)
        self.tokenizer_dir = tokenizer_dir
        self.chat_template = built.chat_template
        self.eos_ids = tuple(built.eos_token_ids)
        self.model = torch_model_from_gguf(source).to(device)
        self.device = device
        self.vocab_size = source.architecture.vocab_size
        self.batch_size = GPU_BATCH if device.startswith("cuda") else 8
        self.description = f"GGUF {source.path.name} dequantized (torch, {device})"

    def continue_greedy(self, prompt: list[int], count: int) -> list[int]:
        return self.continue_many([prompt], count, 0.0, 0)[0]

    def continue_sampled(
        self, prompt: list[int], count: int, temperature: float, seed: int
    ) -> list[int]:
        return self.continue_many([prompt], count, temperature, seed)[0]

    def continue_many(
        self, prompts: list[list[int]], count: int, temperature: float, seed: int
    ) -> list[list[int]]:
        """Up to ``count`` tokens for each prompt (greedy at temperature 0), each cut after
        its first end-of-sequence token. Prompts are left-padded into one batch."""
        torch = self.torch
        ids, mask = self._padded(prompts, left=True)
        width = ids.shape[1]
        torch.manual_seed(seed)
        sampling: dict[str, Any] = (
            {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            if temperature > 0
            else {"do_sample": False}
        )
        with torch.no_grad():
            out = self.model.generate(
                ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=count,
                eos_token_id=list(self.eos_ids) or None,
                pad_token_id=self.eos_ids[0] if self.eos_ids else 0,
                **sampling,
            )
        produced = []
        for row in out[:, width:].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in self.eos_ids), len(row))
            produced.append([int(t) for t in row[:cut]])
        return produced

    def _padded(self, sequences: list[list[int]], *, left: bool) -> tuple[Any, Any]:
        """Token ids and attention mask [n, longest] (long), padded on the left (generation
        continues every row from its last column) or on the right."""
        torch = self.torch
        width = max(len(s) for s in sequences)
        ids = torch.zeros((len(sequences), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, sequence in enumerate(sequences):
            span = slice(width - len(sequence), width) if left else slice(0, len(sequence))
            ids[row, span] = torch.tensor(sequence)
            mask[row, span] = 1
        return ids, mask

    def logits(self, tokens: list[int]) -> np.ndarray:
        with self.torch.no_grad():
            out = self.model(input_ids=self.torch.tensor([tokens], device=self.device)).logits
        return np.asarray(out[0].float().cpu().numpy())

    def top_logprobs_many(self, sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Top-``TOP_K`` ids and log-probabilities at every position of right-padded
        sequences: ([n, width, TOP_K] int32, [n, width, TOP_K] float32)."""
        torch = self.torch
        ids, mask = self._padded(sequences, left=False)
        width = ids.shape[1]
        top_ids = np.zeros((len(sequences), width, TOP_K), np.int32)
        top_values = np.zeros((len(sequences), width, TOP_K), np.float32)
        for at in range(0, len(sequences), LOGITS_BATCH):
            rows = slice(at, at + LOGITS_BATCH)
            with torch.no_grad():
                logits = self.model(
                    input_ids=ids[rows].to(self.device), attention_mask=mask[rows].to(self.device)
                ).logits
                top = torch.log_softmax(logits.float(), dim=-1).topk(TOP_K, dim=-1)
            top_ids[rows] = top.indices.to(torch.int32).cpu().numpy()
            top_values[rows] = top.values.cpu().numpy()
        return top_ids, top_values
