"""edgespec against ONNX Runtime GenAI on the same float32 weights, alternating in one process.

    python benchmarks/vs_ort_genai.py BUNDLE GENAI_DIR [--contexts 64,1024,3000] [--tokens 48]
        [--prompts 9] [--spec-tokens 128] [--k 4] [--threads 2] [--draft DRAFT_BUNDLE]

BUNDLE is an edgespec bundle, GENAI_DIR the folder ONNX Runtime GenAI's model builder wrote for
the same weights. For SmolLM2-135M-Instruct from its GGUF (both dequantize the file's Q4_1
blocks to float32, so both graphs hold the same numbers)::

    edgespec export SmolLM2-135M-Instruct.Q4_1.gguf --quant fp32 --max-length 4096 --out es-fp32
    python tools/hf_dir_from_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf smollm2-hf
    python -m onnxruntime_genai.models.builder -i smollm2-hf -o genai-fp32 -p fp32 -e cpu

Two measurements, one JSON line each, then a summary line:

1. Target-only greedy decoding of ``--tokens`` tokens after a context of each length (the start
   of this repository's README, repeated), the two engines alternating over two rounds.
2. Prompt lookup on edit-style chat prompts (rewrite a given function): edgespec's n-gram
   drafter at ``--k`` against ONNX Runtime GenAI's n-gram speculative decoding
   (``"speculative": {"ngram_size": 3, "max_draft_tokens": k}``), each beside its own
   target-only decoding, with whether the speculative output equals it; with ``--draft``,
   also edgespec with that draft and its recorded drafter (a shipped draft: prompt lookup
   and the draft combined), which ONNX Runtime GenAI's n-gram decoding has no counterpart to.

Rates are decode steps per second after the prefill: edgespec's ``new_tokens / decode_ms``
(one pass per token, the first from the last prompt token) and ONNX Runtime GenAI's tokens
after its first over the time since the first. Both read the same token ids (edgespec's
tokenizer); both sessions use ``--threads`` intra-op threads; every run starts after a quarter
of a second of quiet (the other engine's threads spin for a moment after its run).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gguf_vs_llama_cpp import chat_prompts

from edgespec.api import Engine

import harness
from harness import settled


def genai_model(folder: Path, threads: int, capacity: int, speculative: dict[str, int] | None):
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    overlay: dict[str, Any] = {
        "model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}},
        "search": {"max_length": capacity, "past_present_share_buffer": True},
    }
    if speculative:
        overlay["speculative"] = speculative
    config.overlay(json.dumps(overlay))
    return og.Model(config)


def genai_decode(
    model: Any, prompt: list[int], tokens: int, capacity: int
) -> tuple[list[int], float]:
    """Greedy tokens after ``prompt`` and decode steps per second after the first token."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=capacity)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    generator.generate_next_token()
    first = time.perf_counter()
    produced = 1
    while produced < tokens and not generator.is_done():
        generator.generate_next_token()
        produced = generator.token_count() - len(prompt)
    elapsed = time.perf_counter() - first
    sequence = list(generator.get_sequence(0))[len(prompt) :]
    return sequence[:tokens], (len(sequence) - 1) / elapsed


def edgespec_rate(result: Any) -> float:
    return result.stats.new_tokens / (result.stats.decode_ms / 1e3)


def context_scaling(engine: Engine, genai: Any, args: Any) -> dict[str, Any]:
    ids = engine.encode(harness.readme_text(20))

    def run(name: str, context: int) -> float:
        prompt = ids[:context]
        if name == "ort_genai":
            return genai_decode(genai, prompt, args.tokens, engine.max_length)[1]
        plain = engine.generate(prompt, drafter="none", max_new_tokens=args.tokens, stop=())
        return edgespec_rate(plain)

    rates = harness.Samples()
    names = ["ort_genai", "edgespec"]
    for turn in harness.alternate(names, args.contexts, run, rounds=2, settle_s=harness.SETTLE_S):
        for name, rate in turn.results.items():
            rates.add((name, turn.item), rate)
            line = {"round": turn.round, "context": turn.item, "engine": name, "tok_s": rate}
            args.lines.write(line)
    mean = {name: {c: rates.mean((name, c)) for c in args.contexts} for name in names}
    first, last = args.contexts[0], args.contexts[-1]
    return {
        "target_only_ratio": {c: mean["edgespec"][c] / mean["ort_genai"][c] for c in args.contexts},
        "growth": {name: mean[name][first] / mean[name][last] for name in mean},
    }


def prompt_lookup(engine: Engine, plain: Any, ngram: Any, args: Any) -> dict:
    prompts = chat_prompts(engine, args.prompts)
    names = ["edgespec", "edgespec+ngram", "ort_genai", "ort_genai+ngram"]
    totals = {name: [0, 0.0] for name in names + (["edgespec+draft"] if args.draft else [])}
    same = {"edgespec": 0, "ort_genai": 0, **({"edgespec+draft": 0} if args.draft else {})}
    capacity = engine.max_length
    for index, prompt in enumerate(prompts):
        base, base_rate = settled(genai_decode, plain, prompt, args.spec_tokens, capacity)
        fast, fast_rate = settled(genai_decode, ngram, prompt, args.spec_tokens, capacity)
        ours = settled(engine.generate, prompt, drafter="none", max_new_tokens=args.spec_tokens)
        ours_fast = settled(
            engine.generate, prompt, drafter="ngram", k=args.k, max_new_tokens=args.spec_tokens
        )
        same["ort_genai"] += fast == base
        same["edgespec"] += ours_fast.tokens == ours.tokens
        runs = {
            "ort_genai": (len(base), base_rate),
            "ort_genai+ngram": (len(fast), fast_rate),
            "edgespec": (ours.stats.new_tokens, edgespec_rate(ours)),
            "edgespec+ngram": (ours_fast.stats.new_tokens, edgespec_rate(ours_fast)),
        }
        if args.draft:  # the draft's recorded drafter and k (a shipped draft: combined)
            drafted = settled(engine.generate, prompt, max_new_tokens=args.spec_tokens)
            same["edgespec+draft"] += drafted.tokens == ours.tokens
            runs["edgespec+draft"] = (drafted.stats.new_tokens, edgespec_rate(drafted))
        for name, (count, rate) in runs.items():
            totals[name][0] += count
            totals[name][1] += count / rate
            args.lines.write({"prompt": index, "engine": name, "tokens": count, "tok_s": rate})
    rates = {name: count / seconds for name, (count, seconds) in totals.items()}
    return {
        "tok_s": rates,
        "speculative_ratio": rates["edgespec+ngram"] / rates["ort_genai+ngram"],
        **(
            {"draft_vs_ort_genai_ngram": rates["edgespec+draft"] / rates["ort_genai+ngram"]}
            if args.draft
            else {}
        ),
        "speedup": {
            "edgespec": rates["edgespec+ngram"] / rates["edgespec"],
            "ort_genai": rates["ort_genai+ngram"] / rates["ort_genai"],
        },
        "identical_prompts": same,
        "prompts": len(prompts),
    }


def main() -> None:
    parser = harness.argument_parser(
        __doc__, contexts="64,1024,3000", tokens=48, prompts=9, threads=2
    )
    parser.add_argument("bundle", type=Path)
    parser.add_argument("genai_dir", type=Path)
    parser.add_argument("--spec-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--skip-contexts", action="store_true")
    parser.add_argument("--skip-lookup", action="store_true")
    parser.add_argument(
        "--draft", type=Path, default=None, help="also edgespec with this draft (its drafter)"
    )
    args = parser.parse_args()
    args.contexts = harness.int_list(args.contexts)
    args.lines = harness.JsonLines(args.jsonl)
    engine = Engine.load(
        target=args.bundle, draft=args.draft, threads=args.threads, measure_energy=False
    )
    plain = genai_model(args.genai_dir, args.threads, engine.max_length, None)
    warm = engine.encode("Hello")
    genai_decode(plain, warm, 4, engine.max_length)
    engine.generate(warm, drafter="none", max_new_tokens=4)
    summary: dict[str, Any] = {"summary": True}
    if not args.skip_contexts:
        summary["contexts"] = context_scaling(engine, plain, args)
    if not args.skip_lookup:
        speculative = {"ngram_size": 3, "max_draft_tokens": args.k}
        ngram = genai_model(args.genai_dir, args.threads, engine.max_length, speculative)
        summary["prompt_lookup"] = prompt_lookup(engine, plain, ngram, args)
    summary["settings"] = {
        k: v
        for k, v in vars(args).items()
        if k not in ("bundle", "genai_dir", "draft", "jsonl", "lines")
    }
    args.lines.write(summary)


if __name__ == "__main__":
    main()
