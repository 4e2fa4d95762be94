"""A Hugging Face model directory from a Llama-family GGUF, for tools that only read Hugging Face
checkpoints (ONNX Runtime GenAI's model builder, the Hugging Face export path).

    python tools/hf_dir_from_gguf.py MODEL.gguf OUT_DIR

transformers dequantizes the GGUF to float32 (``gguf_file=``; needs torch, transformers,
accelerate and gguf). ``save_pretrained`` refuses a model whose config carries the GGUF's
``quantization_config``, so the weights go into a fresh model built from the config without it.
transformers' conversion also makes the chat's ``<|im_start|>`` both a prepended BOS and the eos
token where the GGUF says no BOS and eos ``<|im_end|>``: the tokenizer files are corrected from
the GGUF's own metadata, so both engines see llama.cpp's token ids.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    import torch
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(args.gguf.parent), args.gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    for key in ("quantization_config",):
        if hasattr(config, key):
            delattr(config, key)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    fields = GGUFReader(str(args.gguf)).fields

    def value(key: str) -> object:
        field = fields.get(key)
        return None if field is None else field.contents()

    eos_id = value("tokenizer.ggml.eos_token_id")
    add_bos = bool(value("tokenizer.ggml.add_bos_token"))
    model.config.eos_token_id = eos_id
    model.generation_config.eos_token_id = eos_id
    model.save_pretrained(args.out)
    # transformers 5 writes the rope base inside "rope_parameters"; 4.x reads "rope_theta"
    # (and would silently fall back to 10,000): write both, so either version loads it right.
    config_file = args.out / "config.json"
    saved = json.loads(config_file.read_text())
    rope = saved.get("rope_parameters") or {}
    if "rope_theta" in rope and "rope_theta" not in saved:
        saved["rope_theta"] = rope["rope_theta"]
        config_file.write_text(json.dumps(saved, indent=2))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokens = value("tokenizer.ggml.tokens")
    tokenizer.eos_token = tokens[eos_id]
    tokenizer.save_pretrained(args.out)
    config_path = args.out / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["add_bos_token"] = add_bos
    # transformers 5 names its own backend class; 4.x (edgespec's export extra) needs this one.
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tokenizer_config, indent=2))
    if not add_bos:  # the fast tokenizer's post-processor prepends the BOS: drop it
        tokenizer_path = args.out / "tokenizer.json"
        spec = json.loads(tokenizer_path.read_text())
        spec["post_processor"] = None
        tokenizer_path.write_text(json.dumps(spec))
    check = AutoTokenizer.from_pretrained(args.out)
    ids = check("What is the capital of France?")["input_ids"]
    print(f"saved {args.out}: eos {check.eos_token!r} ({eos_id}), first ids {ids[:4]}")


if __name__ == "__main__":
    main()
