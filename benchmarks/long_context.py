"""Decode speed and peak memory at long contexts: edgespec against llama.cpp's server on the
same GGUF file, prompt and threads, each engine in a fresh process per context, alternating.

    python benchmarks/long_context.py --llama-bin DIR [--model qwen2.5-coder-1.5b]
        [--contexts 4096,8192,16384] [--fill 0.75] [--tokens 64] [--threads 2]
        [--pair-contexts 8192] [--jsonl FILE]

For each context N, the prompt is ``--fill`` x N tokens of the Python standard library's own
source (real code that repeats little, so prompt lookup finds no copies of a README), then a
code request from the project's hidden code prompts. llama-server runs with ``-c N -np 1`` and
its defaults otherwise (flash attention where it uses it, a float16 cache); edgespec loads the
catalog model's bundle with ``--context N`` (its float16 cache allocated for N), target-only.
Both decode ``--tokens`` greedy tokens from the same token ids. Peak memory is the process's
high-water mark (``VmHWM``): llama-server's after its answer, edgespec's child's after its
own. At each of ``--pair-contexts`` the pair (the catalog's draft, the combined drafter)
runs too, in a child of its own, and its output is checked against target-only.

Prints one JSON line per run, then a table per context: decode tok/s, prefill s, peak MB
of each engine and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import harness

CODE_REQUEST = "\n\n# Now, a new function:\n"


def stdlib_code() -> str:
    """Source files of the standard library, in a fixed order, joined."""
    root = Path(sysconfig.get_paths()["stdlib"])
    names = ["argparse.py", "inspect.py", "typing.py", "dataclasses.py", "pathlib.py"]
    names += ["subprocess.py", "tarfile.py", "zipfile/__init__.py", "ast.py", "difflib.py"]
    return "\n\n".join((root / name).read_text() for name in names if (root / name).is_file())


def peak_mb(pid: int) -> float:
    """A process's resident high-water mark (``VmHWM``), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def prompt_ids(model: str, context: int, fill: float) -> list[int]:
    from tokenizers import Tokenizer

    from edgespec.manifest import load_bundle
    from edgespec.measure.bench import load_prompts
    from edgespec.models import catalog
    from edgespec.models.bundles import model_bundle

    bundle = load_bundle(model_bundle(catalog.find(model)).root, verify_checksums=False)
    tokenizer = Tokenizer.from_file(str(bundle.tokenizer_path))
    request = tokenizer.encode(CODE_REQUEST + load_prompts("code")[1]).ids
    history = tokenizer.encode(stdlib_code()).ids
    depth = int(context * fill) - len(request)
    if depth > len(history):
        raise SystemExit(f"the library's text holds {len(history)} tokens, short of {depth}")
    return history[:depth] + request


def child(args: argparse.Namespace) -> None:
    """One edgespec process: loads at ``--context``, decodes the prompt, prints one JSON line."""
    from edgespec.api import Engine
    from edgespec.models import catalog
    from edgespec.models.bundles import model_bundle

    ids = json.loads(Path(args.child).read_text())
    if args.pair:
        engine = Engine.load(
            model=args.model, context=args.context, threads=args.threads, measure_energy=False
        )
        drafter = "combined"
    else:
        target = model_bundle(catalog.find(args.model)).root
        engine = Engine.load(
            target=target, context=args.context, threads=args.threads, measure_energy=False
        )
        drafter = "none"
    engine.generate(ids[:32], max_new_tokens=4, drafter=drafter)  # warm-up
    result = engine.generate(ids, max_new_tokens=args.tokens, drafter=drafter)
    stats = result.stats
    print(
        json.dumps(
            {
                "tokens": list(result.tokens),
                "tok_s": stats.new_tokens / (stats.decode_ms / 1e3),
                "prefill_s": stats.prefill_ms / 1e3,
                "peak_mb": peak_mb(os.getpid()),
                "alpha": stats.alpha,
            }
        ),
        flush=True,
    )


def run_edgespec(args: argparse.Namespace, ids_file: Path, context: int, pair: bool) -> Any:
    command = [sys.executable, __file__, "--child", str(ids_file), "--model", args.model]
    command += ["--context", str(context), "--threads", str(args.threads)]
    command += ["--tokens", str(args.tokens)] + (["--pair"] if pair else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the edgespec child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_llama(args: argparse.Namespace, gguf: Path, ids: list[int], context: int) -> Any:
    server = args.llama_bin / "llama-server"
    flags = ["-m", str(gguf), "-c", str(context), "-np", "1", "-t", str(args.threads)]
    flags += ["-tb", str(args.threads), "--no-warmup"]
    with harness.llama_server(server, flags, start_timeout_s=600) as running:
        harness.llama_completion(running.url, ids[:32], 4)  # warm-up
        body = {
            "prompt": ids,
            "n_predict": args.tokens,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": False,
            "return_tokens": True,
        }
        reply = harness.post(running.url + "/completion", body, timeout=7200)
        timings = reply["timings"]
        return {
            "tokens": [int(t) for t in reply.get("tokens", [])],
            "tok_s": float(timings["predicted_per_second"]),
            "prefill_s": float(timings["prompt_ms"]) / 1e3,
            "peak_mb": peak_mb(running.process.pid),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=harness.description(__doc__))
    parser.add_argument("--llama-bin", type=Path, default=None)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--contexts", default="4096,8192,16384")
    parser.add_argument("--fill", type=float, default=0.75)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pair-contexts", default="8192")
    parser.add_argument("--jsonl", type=Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--context", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--pair", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.llama_bin is None:
        raise SystemExit("pass --llama-bin DIR (tools/build_llama_server.sh builds it)")
    from edgespec.models import catalog
    from edgespec.models.fetch import gguf_file

    gguf = gguf_file(catalog.find(args.model))
    lines = harness.JsonLines(args.jsonl)
    table = []
    for index, context in enumerate(harness.int_list(args.contexts)):
        ids = prompt_ids(args.model, context, args.fill)
        ids_file = Path(f"/tmp/long_context_{context}.json")
        ids_file.write_text(json.dumps(ids))
        order = ["llama.cpp", "edgespec"] if index % 2 == 0 else ["edgespec", "llama.cpp"]
        found: dict[str, Any] = {}
        for engine in order:
            found[engine] = (
                run_llama(args, gguf, ids, context)
                if engine == "llama.cpp"
                else run_edgespec(args, ids_file, context, pair=False)
            )
        if context in harness.int_list(args.pair_contexts):
            found["edgespec pair"] = run_edgespec(args, ids_file, context, pair=True)
            same = found["edgespec pair"]["tokens"] == found["edgespec"]["tokens"]
            found["edgespec pair"]["equals_target_only"] = same
        for engine, run in found.items():
            line = {k: v for k, v in run.items() if k != "tokens"}
            lines.write({"context": context, "prompt_tokens": len(ids), "engine": engine, **line})
        table.append((context, len(ids), found))
    print("\ncontext  prompt  engine          decode tok/s  prefill s  peak MB")
    for context, prompt, found in table:
        for engine, run in found.items():
            print(
                f"{context:7d}  {prompt:6d}  {engine:14s}  {run['tok_s']:12.2f}  "
                f"{run['prefill_s']:9.1f}  {run['peak_mb']:7.0f}"
            )
        ours, theirs = found["edgespec"], found["llama.cpp"]
        print(
            f"{'':16s}edgespec / llama.cpp: decode {ours['tok_s'] / theirs['tok_s']:.2f}x, "
            f"peak memory {ours['peak_mb'] / theirs['peak_mb']:.2f}x"
        )
        if "edgespec pair" in found:
            pair = found["edgespec pair"]
            print(
                f"{'':16s}pair / target-only: {pair['tok_s'] / ours['tok_s']:.2f}x "
                f"(output identical: {pair['equals_target_only']})"
            )


if __name__ == "__main__":
    main()
