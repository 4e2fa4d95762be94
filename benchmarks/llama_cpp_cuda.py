"""llama.cpp built with CUDA on the prompts of ``cuda_pair.py``: its server's plain decoding and
its n-gram speculation, and ``llama-bench``'s decode, prefill and verify curve, all layers on
the GPU. Standard library only (it runs where edgespec is not installed).

    python benchmarks/llama_cpp_cuda.py --llama-bin BUILD/bin --model TARGET.gguf
        [--draft DRAFT.gguf] [--tokens 64] [--json OUT]

Each prompt runs on each server in turn, twice; the table keeps each configuration's best
decode tok/s (llama.cpp's own timings). Chat prompts go through the model's template
(``/apply-template``). Greedy. With ``--draft``, llama.cpp's draft-model speculation too.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_pair import PROMPTS

CONFIGS = {
    "llama.cpp": [],
    "llama.cpp ngram-mod": ["--spec-type", "ngram-mod"],
    "llama.cpp ngram-simple": ["--spec-type", "ngram-simple"],
}


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        reply: dict[str, Any] = json.loads(response.read())
        return reply


def start(binary: Path, args: list[str], processes: list[subprocess.Popen[bytes]]) -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    log = open(f"/tmp/llama-server-{port}.log", "w")  # noqa: SIM115 (kept for the server's life)
    processes.append(
        subprocess.Popen(
            [str(binary), *args, "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return url
        except OSError:
            time.sleep(0.5)
    sys.exit(f"llama-server did not answer within 300 s (log /tmp/llama-server-{port}.log)")


def complete(url: str, prompt: str, tokens: int) -> dict[str, Any]:
    body = {
        "prompt": prompt,
        "n_predict": tokens,
        "temperature": 0.0,
        "top_k": 1,
        "seed": 0,
        "cache_prompt": False,
        "return_tokens": True,
    }
    reply = post(url + "/completion", body)
    timings = reply["timings"]
    return {
        "tokens": reply.get("tokens", []),
        "tok_s": float(timings["predicted_per_second"]),
        "drafted": timings.get("draft_n"),
        "accepted": timings.get("draft_n_accepted"),
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bin", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--draft", type=Path)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    configs = dict(CONFIGS)
    if args.draft:
        configs["llama.cpp -md"] = ["--spec-type", "draft-simple", "-md", str(args.draft)]
        configs["llama.cpp -md"] += ["-ngld", "99"]
    common = ["-m", str(args.model), "-ngl", "99", "-c", "4096", "-np", "1", "--no-warmup"]
    processes: list[subprocess.Popen[bytes]] = []
    report: dict[str, Any] = {"decode": {}, "bench": {}}
    try:
        urls = {
            name: start(args.llama_bin / "llama-server", [*common, *extra], processes)
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
            complete(url, texts["code"], 8)
        for label, text in texts.items():
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
            for _ in range(2):
                for name, url in urls.items():
                    runs[name].append(complete(url, text, args.tokens))
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
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait()
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
