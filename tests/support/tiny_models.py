"""Tiny causal LMs built locally from transformers configs, with a tokenizer trained on the fly.

No downloads: the tokenizer is a byte-level BPE trained with ``tokenizers`` on source files of
the Python standard library, and each model is briefly trained on the same text so that its
predictions are peaked like a real model's (a purely random model has near-flat logits, on
which any quantization flips the argmax and the int4 checks would say nothing).
"""

from __future__ import annotations

import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

VOCAB_SIZE = 384
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
CORPUS_MODULES = ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py")
CHAT_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def corpus_texts() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / name).read_text(encoding="utf-8") for name in CORPUS_MODULES]


def train_tokenizer(texts: list[str], *, vocab_size: int = VOCAB_SIZE) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` with <s>=0, </s>=1, <pad>=2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest are
    shifted past 255 so that every byte is a visible character."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = 0
    table = {}
    for byte in range(256):
        if byte in kept:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


#: The characters of :func:`char_tokenizer`: tab, newline and printable ASCII.
ASCII_CHARACTERS = "\t\n" + "".join(chr(c) for c in range(32, 127))


def char_tokenizer() -> Any:
    """A byte-level BPE with no merges over :data:`ASCII_CHARACTERS` (<s>=0, </s>=1, <pad>=2).

    Every sequence of its tokens is its own tokenization of their text, which an engine that
    takes text prompts and re-tokenizes them needs for exact verification."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = _bytes_to_unicode()
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    for character in ASCII_CHARACTERS:
        vocab[alphabet[ord(character)]] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def ascii_only(text: str) -> str:
    return "".join(c for c in text if c in ASCII_CHARACTERS)


def _common(**extra: Any) -> dict[str, Any]:
    return dict(
        vocab_size=VOCAB_SIZE,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        max_position_embeddings=256,
        **extra,
    )


def _grouped_query(config_class: Any, **extra: Any) -> Any:
    """64 wide, 2 layers, 4 attention heads sharing 2 KV heads."""
    return config_class(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **_common(),
        **extra,
    )


def _llama() -> Any:
    from transformers import LlamaConfig

    return _grouped_query(LlamaConfig)


def _llama_groups_of_three() -> Any:
    """As SmolLM2's attention: 3 query heads per KV head, heads 32 wide (whole quantization
    blocks)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=192,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        **_common(),
    )


def _qwen2() -> Any:
    from transformers import Qwen2Config

    return _grouped_query(Qwen2Config)


def _qwen3() -> Any:
    """Qwen3's blocks: per-head RMSNorm of Q and K, no Q/K/V biases, an explicit head_dim."""
    from transformers import Qwen3Config

    config = _grouped_query(Qwen3Config)
    config.head_dim = config.hidden_size // config.num_attention_heads
    return config


def _gemma3() -> Any:
    """Gemma 3's text blocks: six layers (five with an 8-position sliding window, one global),
    scaled embedding, (1 + w) norms around attention and MLP, per-head Q/K norms, GELU."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=8,
        **_common(),
    )


def _gpt2() -> Any:
    from transformers import GPT2Config

    common = _common()
    common["n_positions"] = common.pop("max_position_embeddings")
    return GPT2Config(n_embd=64, n_layer=2, n_head=4, **common)


def _phi3() -> Any:
    from transformers import Phi3Config

    return _grouped_query(Phi3Config, original_max_position_embeddings=256)


def _phi3_partial_rotary() -> Any:
    """Phi-4-mini's rotary over part of each head: heads 32 wide (128 wide, 4 heads), the
    first 16 dimensions turning (ONNX Runtime's attention rotates multiples of 16)."""
    config = _phi3()
    config.hidden_size, config.intermediate_size = 128, 256
    config.partial_rotary_factor = 0.5
    return config


def _mistral(*, extra_rows: int = 0) -> Any:
    """A one-layer Mistral draft; ``extra_rows`` unused embedding rows widen its vocabulary."""
    from transformers import MistralConfig

    common = _common()
    common["vocab_size"] = VOCAB_SIZE + extra_rows
    return MistralConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        **common,
    )


def _mistral_wide() -> Any:
    """The tiny Mistral with 16 more embedding rows than the tokenizer needs."""
    return _mistral(extra_rows=16)


def _llama_four_layers() -> Any:
    """The tiny Llama with 4 layers (SmolLM3's block leaves the fourth's rotary out)."""
    config = _llama()
    config.num_hidden_layers = 4
    return config


ARCHITECTURES: dict[str, Callable[[], Any]] = {
    "llama": _llama,
    "llama-groups-of-3": _llama_groups_of_three,
    "llama-4-layers": _llama_four_layers,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "gemma3": _gemma3,
    "gpt2": _gpt2,
    "phi3": _phi3,
    "phi3-partial-rotary": _phi3_partial_rotary,
    "mistral": _mistral,
    "mistral-wide": _mistral_wide,
}


def train_briefly(model: Any, token_ids: list[int], *, steps: int, seed: int) -> None:
    """A few AdamW steps of next-token prediction on windows of ``token_ids``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    data = torch.tensor(token_ids, dtype=torch.long)
    window, batch = 64, 16
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - window - 1, (batch,), generator=generator)
        inputs = torch.stack([data[s : s + window] for s in starts.tolist()])
        loss = model(input_ids=inputs, labels=inputs).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def build_model(
    architecture: str,
    out_dir: Path,
    tokenizer: Any,
    token_ids: list[int],
    *,
    steps: int = 60,
    seed: int = 0,
    vocab_size: int | None = None,
) -> Path:
    """Saves a tiny ``architecture`` model (weights, config, tokenizer) to ``out_dir``;
    ``vocab_size`` replaces the configs' :data:`VOCAB_SIZE` (for another tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = ARCHITECTURES[architecture]()
    if vocab_size is not None:
        config.vocab_size = vocab_size
    model = AutoModelForCausalLM.from_config(config)
    if steps:
        train_briefly(model, token_ids, steps=steps, seed=seed)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _benchmark_llama(*, hidden: int, layers: int, heads: int, vocab: int, positions: int) -> Any:
    """A Llama for benchmarks; MLP 4x the width (2048 at width 768, as in Llama 110M)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2048 if hidden == 768 else 4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        vocab_size=vocab,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        max_position_embeddings=positions,
    )


def _llama_110m() -> Any:
    """About 134M parameters: 768 wide, 12 layers, 32000-entry embedding."""
    return _benchmark_llama(hidden=768, layers=12, heads=12, vocab=32000, positions=2048)


def _llama_14m() -> Any:
    """A 14.3M-parameter target: 384 wide, 6 layers, 8192-entry embedding."""
    return _benchmark_llama(hidden=384, layers=6, heads=6, vocab=8192, positions=1024)


def _llama_2m() -> Any:
    """A 2M-parameter draft for ``llama-14m``: 128 wide, 2 layers."""
    return _benchmark_llama(hidden=128, layers=2, heads=4, vocab=8192, positions=1024)


ARCHITECTURES["llama-110m"] = _llama_110m
ARCHITECTURES["llama-14m"] = _llama_14m
ARCHITECTURES["llama-2m"] = _llama_2m


def main(argv: list[str] | None = None) -> None:
    """``python tests/tiny_models.py OUT [--arch llama] [--steps 60]``: a local model to export."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", default="llama", choices=sorted(ARCHITECTURES))
    parser.add_argument(
        "--steps",
        type=int,
        default=60,
        help="training steps on the stdlib corpus (0 = random weights)",
    )
    args = parser.parse_args(argv)
    texts = corpus_texts()
    tokenizer = train_tokenizer(texts)
    token_ids = [token for text in texts for token in tokenizer(text)["input_ids"]]
    build_model(args.arch, args.out, tokenizer, token_ids, steps=args.steps)
    print(args.out)


if __name__ == "__main__":
    main()


def truncated_draft(target_dir: Path, out_dir: Path, *, layers: int = 1) -> Path:
    """A draft made of the target's embedding, first ``layers`` layers, final norm and head.

    In a random-weight model the residual stream is dominated by the embedding, so such a
    draft agrees with its target often: a stand-in for a trained pair in benchmarks.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(target_dir)
    config = target.config.__class__.from_dict(
        {**target.config.to_dict(), "num_hidden_layers": layers}
    )
    draft = AutoModelForCausalLM.from_config(config)
    state = {k: v for k, v in target.state_dict().items() if k in draft.state_dict()}
    draft.load_state_dict(state)
    draft.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(target_dir).save_pretrained(out_dir)
    return out_dir
