"""llama.cpp built with CUDA on the prompts of ``cuda_pair.py``: its server's plain decoding and
its n-gram speculation, and ``llama-bench``'s decode, prefill and verify curve, all layers on
the GPU. Standard library only (it runs where edgespec is not installed; ``harness`` too).

    python benchmarks/llama_cpp_cuda.py --llama-bin BUILD/bin --model TARGET.gguf
        [--draft DRAFT.gguf] [--tokens 64] [--json OUT]

Each prompt runs on each server in turn, twice; the table keeps each configuration's best
decode tok/s (llama.cpp's own timings). Chat prompts go through the model's template
(``/apply-template``). Greedy. With ``--draft``, llama.cpp's draft-model speculation too.
"""

from __future__ import annotations

import json
import subprocess
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from cuda_pair import PROMPTS

import harness
from harness import post

CONFIGS = {
    "llama.cpp": [],
    "llama.cpp ngram-mod": ["--spec-type", "ngram-mod"],
    "llama.cpp ngram-simple": ["--spec-type", "ngram-simple"],
}


def bench(binary: Path, model: Path, extra: list[str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(binary), "-m", str(model), "-ngl", "99", "-o", "json", *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return [
        {k: row.get(k) for k in ("n_prompt", "n_gen", "avg_ts", "avg_ns", "gpu_info")}
        for row in rows
    ]


def main() -> None:
    parser = harness.argument_parser(__doc__, tokens=64, json_out=True, jsonl=False)
    parser.add_argument("--llama-bin", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--draft", type=Path)
    args = parser.parse_args()
    configs = dict(CONFIGS)
    if args.draft:
        configs["llama.cpp -md"] = ["--spec-type", "draft-simple", "-md", str(args.draft)]
        configs["llama.cpp -md"] += ["-ngld", "99"]
    common = ["-m", str(args.model), "-ngl", "99", "-c", "4096", "-np", "1", "--no-warmup"]
    report: dict[str, Any] = {"decode": {}, "bench": {}}
    with ExitStack() as stack:
        urls = {
            name: stack.enter_context(
                harness.llama_server(args.llama_bin / "llama-server", [*common, *extra])
            ).url
            for name, extra in configs.items()
        }
        first = next(iter(urls.values()))
        texts = {}
        for label, prompt, chat in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            texts[label] = (
                post(first + "/apply-template", {"messages": messages})["prompt"]
                if chat
                else prompt
            )
        for url in urls.values():
            harness.llama_completion(url, texts["code"], 8)

        def complete(name: str, text: str) -> dict[str, Any]:
            return harness.llama_completion(urls[name], text, args.tokens)

        for label, text in texts.items():
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
            for turn in harness.alternate(list(urls), [text], complete, rounds=2):
                for name, found in turn.results.items():
                    runs[name].append(found)
            plain = runs["llama.cpp"][0]["tokens"]
            report["decode"][label] = {
                name: {
                    "tok_s": round(max(r["tok_s"] for r in found), 1),
                    "same_tokens_as_plain": found[0]["tokens"] == plain,
                    "drafted": found[0]["drafted"],
                    "accepted": found[0]["accepted"],
                }
                for name, found in runs.items()
            }
            print(label, json.dumps(report["decode"][label]), flush=True)
    bench_bin = args.llama_bin / "llama-bench"
    report["bench"]["decode_prefill"] = bench(bench_bin, args.model, ["-p", "512", "-n", "128"])
    report["bench"]["verify_curve"] = bench(
        bench_bin, args.model, ["-p", "1,2,3,5,8", "-n", "0", "-r", "10"]
    )
    print(json.dumps(report["bench"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
