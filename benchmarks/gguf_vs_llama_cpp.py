"""edgespec against llama.cpp on the same GGUF file, same prompts, same threads, alternating in
one process.

    python benchmarks/gguf_vs_llama_cpp.py BUNDLE GGUF [--prompts 9] [--tokens 128] [--threads 2]
        [--draft DRAFT_BUNDLE]
    python benchmarks/gguf_vs_llama_cpp.py BUNDLE GGUF --contexts 64,1024,3000 [--tokens 32]
        [--rounds 2]
    python benchmarks/gguf_vs_llama_cpp.py BUNDLE GGUF --agreement [--also FP32_BUNDLE]
        [--agreement-tokens 700]

BUNDLE is ``edgespec export GGUF --out BUNDLE``. For each edit-style chat prompt (rewrite a
given function: answers repeat the prompt, where prompt lookup pays), in turn: llama.cpp
greedy decoding (llama-cpp-python, ``eval`` one token at a time), edgespec target-only greedy
decoding, edgespec with prompt lookup (``--k``), and with ``--draft`` edgespec with that
draft and its recorded drafter and k (a shipped draft: the combined drafter). Decode time
only (prefill excluded), the same token ids for every engine, each run started after a
quarter of a second of quiet (``harness.SETTLE_S``). Prints one JSON line per
measurement, then a summary line with tok/s totals, the ratios, and whether edgespec's
speculative output equalled its own target-only output on every prompt.

With ``--agreement``, teacher-forced top-1 agreement with llama.cpp's logits over 1,400
positions (``agreement_texts.json``: the start of this project's README and runtime guide,
700 tokens each; ``--agreement-tokens 1800`` takes 1,800 of each, nearly all of their 8,000
characters, for a count with less sampling noise),
for the bundle and any ``--also`` bundles of the same file (a ``--quant fp32`` import shows
what exact float arithmetic on the same weights reaches: llama.cpp rounds its activations
to 8 bits, so no engine agrees with it everywhere). llama.cpp's logits are taken both ways
it computes them, the whole text in one ``eval`` and one token per ``eval``, and the first
line says how often those two agree with each other (``--f32-cache``: with llama.cpp's KV
cache in float32 instead of its default float16).

With ``--contexts``, target-only greedy decoding of ``--tokens`` tokens after a context of each
length (the start of this repository's README, repeated), both engines alternating, over
``--rounds`` rounds, then each context's median rates and their ratio: how the step grows with
the context (the bundle needs ``--max-length`` above the longest).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from edgespec.api import Engine
from edgespec.measure.bench import load_prompts

import harness

REQUEST = "Rewrite this Python function with type hints and a docstring. Keep its logic.\n\n"


def chat_prompts(engine: Engine, count: int) -> list[list[int]]:
    """Edit requests through the chat template; for a model without one (a base model such
    as Gemma 3 270M), the ``edit`` prompts themselves as plain text (their answers repeat the
    prompt too)."""
    prompts = []
    for source in load_prompts("edit")[:count]:
        if engine.chat_template is None:
            prompts.append(engine.encode(source))
            continue
        code = "\n".join(source.splitlines()[:14])
        prompts.append(engine.encode(f"{REQUEST}```python\n{code}\n```", chat=True))
    return prompts


def llama_cpp_decode(
    llm: Any, prompt: list[int], tokens: int, eos: set[int]
) -> tuple[list[int], float]:
    """Greedy tokens after ``prompt`` (llama-cpp-python's own loop, temperature 0, no repeat
    penalty) and the seconds from the first token to the last: prefill excluded, as in
    edgespec's ``decode_ms``, which likewise starts after the prefill."""
    produced: list[int] = []
    started = 0.0
    for token in llm.generate(prompt, temp=0.0, repeat_penalty=1.0, reset=True):
        if not produced:
            started = time.perf_counter()
        produced.append(int(token))
        if token in eos or len(produced) >= tokens:
            break
    return produced, time.perf_counter() - started


def context_scaling(
    engine: Engine, llm: Any, contexts: list[int], tokens: int, rounds: int, lines: Any
) -> None:
    ids = engine.encode(harness.readme_text(20))
    eos: set[int] = set()  # decode the full count whatever comes

    def run(name: str, context: int) -> float:
        prompt = ids[:context]
        if name == "llama.cpp":
            return (tokens - 1) / llama_cpp_decode(llm, prompt, tokens, eos)[1]
        plain = engine.generate(prompt, drafter="none", max_new_tokens=tokens)
        return plain.stats.new_tokens / (plain.stats.decode_ms / 1e3)

    rates = harness.Samples()
    engines = ["llama.cpp", "edgespec"]
    turns = harness.alternate(engines, contexts, run, rounds=rounds, settle_s=harness.SETTLE_S)
    for turn in turns:
        for name, rate in turn.results.items():
            rates.add((turn.item, name), rate)
            lines.write({"round": turn.round, "context": turn.item, "engine": name, "tok_s": rate})
    for context in contexts:
        ours, theirs = (rates.median((context, n)) for n in ("edgespec", "llama.cpp"))
        summary = {
            "context": context,
            "median_tok_s": {"edgespec": round(ours, 1), "llama.cpp": round(theirs, 1)},
            "edgespec_vs_llama_cpp": round(ours / theirs, 3),
        }
        lines.write(summary)


def agreement(
    llm: Any, bundles: list[Path], threads: int, tokens_per_text: int, lines: Any
) -> None:
    """Top-1 agreement of each bundle with llama.cpp's logits from both of its paths: one
    ``eval`` of the whole text (its batched prompt path, the reference the export's check
    uses) and one ``eval`` per token (its decoding path). First line: the two paths against
    each other, since llama.cpp's batched and one-token kernels round differently."""
    import numpy as np
    from tokenizers import Tokenizer

    from edgespec.manifest import load_bundle
    from edgespec.runtime.model import ModelOptions, OnnxModel

    texts = agreement_texts(3000 if tokens_per_text <= 700 else 1 << 20)
    tokenizer = Tokenizer.from_file(str(bundles[0] / "tokenizer.json"))
    sequences = [tokenizer.encode(text).ids[:tokens_per_text] for text in texts]
    batched, one_by_one = [], []
    for ids in sequences:
        llm.reset()
        llm.eval(ids)
        batched.append(np.array(llm.scores[: len(ids)], copy=True))  # the buffer is reused
        llm.reset()
        rows = []
        for token in ids:
            llm.eval([token])
            rows.append(np.array(llm.scores[llm.n_tokens - 1], copy=True))
        one_by_one.append(np.stack(rows))

    def agreeing(ours: list[Any], theirs: list[Any], first: int | None = None) -> int:
        pairs = zip(ours, theirs, strict=True)
        return sum(int((a[:first].argmax(-1) == b[:first].argmax(-1)).sum()) for a, b in pairs)

    def top1(ours: list[Any], theirs: list[Any]) -> float:
        return agreeing(ours, theirs) / sum(len(ids) for ids in sequences)

    positions = sum(len(ids) for ids in sequences)
    gap = max(float(np.abs(a - b).max()) for a, b in zip(batched, one_by_one, strict=True))
    line: dict[str, Any] = {
        "llama.cpp batched vs one token at a time": top1(batched, one_by_one),
        "agreeing_positions": agreeing(batched, one_by_one),
        "agreeing_of_the_first_700_of_each": agreeing(batched, one_by_one, 700),
        "max_abs_logit_diff": gap,
        "positions": positions,
    }
    lines.write(line)
    for bundle in bundles:
        model = OnnxModel(load_bundle(bundle), options=ModelOptions(intra_op_threads=threads))
        ours = []
        for ids in sequences:
            cache = model.new_cache()
            # forward's logits live in a reused output buffer: copy each chunk's at once
            chunks = [
                np.array(model.forward(ids[s : s + 64], cache)) for s in range(0, len(ids), 64)
            ]
            ours.append(np.concatenate(chunks))
        line = {
            "bundle": str(bundle),
            "top1_agreement": top1(ours, batched),
            "top1_agreement_one_token_path": top1(ours, one_by_one),
            "agreeing_positions": [agreeing(ours, batched), agreeing(ours, one_by_one)],
            "agreeing_of_the_first_700_of_each": [
                agreeing(ours, batched, 700),
                agreeing(ours, one_by_one, 700),
            ],
            "positions": positions,
        }
        lines.write(line)


#: Two fixed texts for top-1 agreement, the start of this project's README and runtime guide
#: (a copy, so that editing the docs does not move the measured figures)
AGREEMENT_TEXTS = Path(__file__).resolve().parent / "agreement_texts.json"


def agreement_texts(characters: int) -> list[str]:
    """The agreement texts, each cut to its first ``characters`` characters."""
    texts = json.loads(AGREEMENT_TEXTS.read_text(encoding="utf-8"))
    return [text[:characters] for text in texts]


def main() -> None:
    parser = harness.argument_parser(__doc__, prompts=9, tokens=128, threads=2, rounds=2)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--draft", type=Path, default=None, help="a draft bundle for the target")
    parser.add_argument("--contexts", default=None, help="e.g. 64,1024,3000")
    parser.add_argument("--agreement", action="store_true", help="top-1 agreement with llama.cpp")
    parser.add_argument("--also", type=Path, nargs="*", default=[], help="more bundles to compare")
    parser.add_argument(
        "--agreement-tokens", type=int, default=700, help="tokens of each agreement text"
    )
    parser.add_argument(
        "--f32-cache", action="store_true", help="llama.cpp with a float32 KV cache (else f16)"
    )
    args = parser.parse_args()
    lines = harness.JsonLines(args.jsonl)
    from llama_cpp import Llama

    engine = Engine.load(
        target=args.bundle, draft=args.draft, threads=args.threads, measure_energy=False
    )
    n_ctx = engine.max_length
    llm = Llama(
        model_path=str(args.gguf),
        n_ctx=n_ctx,
        n_threads=args.threads,
        logits_all=args.agreement,  # every position's logits, not only the last
        type_k=0 if args.f32_cache else None,  # GGML_TYPE_F32; None: llama.cpp's f16
        type_v=0 if args.f32_cache else None,
        verbose=False,
    )
    if args.agreement:
        agreement(llm, [args.bundle, *args.also], args.threads, args.agreement_tokens, lines)
        return
    if args.contexts:
        contexts = harness.int_list(args.contexts)
        context_scaling(engine, llm, contexts, args.tokens, args.rounds, lines)
        return
    prompts = chat_prompts(engine, args.prompts)
    eos = set(engine.eos_ids)
    engine.generate(prompts[0], drafter="none", max_new_tokens=8)  # warm-up, both engines
    llama_cpp_decode(llm, prompts[0], 8, eos)
    names = ["llama.cpp", "edgespec", "edgespec+ngram"] + (["edgespec+draft"] if args.draft else [])

    def run(name: str, prompt: list[int]) -> dict[str, Any]:
        if name == "llama.cpp":
            theirs, seconds = llama_cpp_decode(llm, prompt, args.tokens, eos)
            return {"tokens": theirs, "count": len(theirs) - 1, "seconds": seconds, "alpha": None}
        options: dict[str, Any] = {"drafter": "none"}
        if name == "edgespec+ngram":
            options = {"drafter": "ngram", "k": args.k}
        elif name == "edgespec+draft":  # the draft's recorded drafter and k (the defaults)
            options = {}
        result = engine.generate(prompt, max_new_tokens=args.tokens, **options)
        stats = result.stats
        alpha = stats.alpha if options.get("drafter") != "none" else None
        return {"tokens": list(result.tokens), "count": stats.new_tokens, "alpha": alpha,
                "seconds": stats.decode_ms / 1e3}  # fmt: skip

    rates = harness.Rates()
    check = harness.OutputCheck(reference="edgespec")
    for turn in harness.alternate(names, prompts, run, settle_s=harness.SETTLE_S):
        runs = turn.results
        for name, found in runs.items():
            rates.add(name, found["count"], found["seconds"])
            line = {"prompt": turn.index, "engine": name, "tokens": found["count"]}
            line["tok_s"] = found["count"] / found["seconds"]
            lines.write(line if found["alpha"] is None else {**line, "alpha": found["alpha"]})
        equal = check.add({name: found["tokens"] for name, found in runs.items()})
        same = {
            "edgespec_equals_llama_cpp": equal["llama.cpp"],
            "speculative_equals_target_only": equal["edgespec+ngram"],
        }
        if args.draft:
            same["draft_equals_target_only"] = equal["edgespec+draft"]
        lines.write({"prompt": turn.index, **same})
    tok_s = rates.rates()
    summary = {
        "summary": True,
        "tok_s": tok_s,
        "edgespec_vs_llama_cpp": tok_s["edgespec"] / tok_s["llama.cpp"],
        "edgespec_ngram_vs_llama_cpp": tok_s["edgespec+ngram"] / tok_s["llama.cpp"],
        "speculative_output_identical": check.all_equal("edgespec+ngram"),
        "speculative_identical_prompts": check.identical["edgespec+ngram"],
        **(
            {
                "edgespec_draft_vs_llama_cpp": tok_s["edgespec+draft"] / tok_s["llama.cpp"],
                "draft_identical_prompts": check.identical["edgespec+draft"],
            }
            if args.draft
            else {}
        ),
        "settings": {
            "prompts": len(prompts),
            "tokens": args.tokens,
            "threads": args.threads,
            "k": args.k,
        },
    }
    lines.write(summary)


if __name__ == "__main__":
    main()
