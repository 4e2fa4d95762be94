"""Two revisions of edgespec side by side: the same greedy outputs, and the decode speed of each
against llama.cpp's server on the same GGUF files, alternating in one run.

    python benchmarks/compare_revisions.py --before REV [--after REV] --llama-bin DIR
        [--models smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b,gemma3-270m]
        [--prompts 3] [--tokens 64] [--rounds 2] [--threads 2]

A refactor must leave behaviour alone; this script checks it. Each revision (a git revision,
or the working tree when ``--after`` is left out) is installed once with its compiled kernels
into a folder of its own (``pip install --target``, cached under
``~/.cache/edgespec/revisions/``), and each runs in a worker process of its own, started outside
the checkout so that it imports that installed copy and nothing else. Both revisions read the
same cached bundles (``edgespec models``; an importer change would re-import on first use).

For every catalog model and prompt (code prompts, then chat prompts through the model's
template), in turn: llama.cpp's ``llama-server`` decoding the model's GGUF, then each
revision's target-only decoding and its default pair (the drafter and k it picks by itself),
each after a quarter second of quiet. Greedy. Decode rates exclude the prompt (llama.cpp's
``predicted_per_second``, edgespec's ``decode_ms``). Prints one JSON line per run, then per
model the median tok/s of each configuration, its ratio to llama.cpp, and whether every
output of the after revision equals the before revision's, token for token, and whether
every pair's output equals its own target-only output.

DIR holds llama.cpp's programs (``tools/build_llama_server.sh`` builds them into
``~/.cache/edgespec/llama.cpp/bin``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
MODELS = "smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b,gemma3-270m"
#: Seconds of quiet before each run (both engines' threads spin for a while after a run).
SETTLE_S = 0.25
#: The edgespec configurations each revision runs: name -> drafter (None: its default).
CONFIGS = {"target-only": "none", "default pair": None}


# ---- the worker: one revision, one model, requests on stdin, one JSON line per reply -------


def worker(model: str, threads: int) -> None:
    """Serves ``{"text", "chat", "drafter", "tokens"}`` requests with the installed revision's
    public API (``Engine.load`` / ``encode`` / ``generate``), which every revision keeps."""
    from edgespec.api import Engine

    engine = Engine.load(model=model, threads=threads, measure_energy=False)
    chat_ok = engine.chat_template is not None
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        prompt = engine.encode(request["text"], chat=request["chat"] and chat_ok)
        options: dict[str, Any] = {"max_new_tokens": request["tokens"], "temperature": 0.0}
        if request["drafter"] is not None:
            options["drafter"] = request["drafter"]
        result = engine.generate(prompt, **options)
        stats = result.stats
        reply = {
            "prompt": prompt,
            "tokens": [int(t) for t in result.tokens],
            "tok_s": stats.new_tokens / max(stats.decode_ms / 1e3, 1e-9),
            "alpha": stats.alpha,
        }
        print(json.dumps(reply), flush=True)


class Worker:
    """A worker process of one installed revision, started in a temporary folder outside the
    checkout, with only that revision's folder on its path."""

    def __init__(self, stack: ExitStack, site: Path, model: str, threads: int) -> None:
        env = dict(os.environ, PYTHONPATH=str(site))
        for variable in ("EDGESPEC_TARGET", "EDGESPEC_DRAFT"):
            env.pop(variable, None)
        script = Path(__file__).resolve()
        command = [sys.executable, str(script), "--worker", model, "--threads", str(threads)]
        self.process = subprocess.Popen(
            command,
            cwd=tempfile.gettempdir(),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        stack.callback(self.process.wait)
        stack.callback(self._close)
        self._read()  # {"ready": true} once the pair is loaded (a first use imports it)

    def _close(self) -> None:
        stdin: IO[str] | None = self.process.stdin
        if stdin is not None and not stdin.closed:
            stdin.close()

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            sys.exit(f"a worker exited with status {self.process.wait()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def run(self, text: str, *, chat: bool, drafter: str | None, tokens: int) -> dict[str, Any]:
        assert self.process.stdin is not None
        request = {"text": text, "chat": chat, "drafter": drafter, "tokens": tokens}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._read()


# ---- installing a revision ------------------------------------------------------------------


def install(revision: str | None) -> tuple[str, Path]:
    """(label, site folder) of ``revision`` (None: the working tree) installed with its kernels.
    A commit's install is cached by its hash; the working tree's by a hash of its diff."""
    cache = Path.home() / ".cache" / "edgespec" / "revisions"
    git = ["git", "-C", str(REPO)]
    if revision is None:
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
        diff = subprocess.run([*git, "diff", "HEAD"], capture_output=True)
        untracked = subprocess.run(
            [*git, "ls-files", "--others", "--exclude-standard"], capture_output=True
        )
        digest = hashlib.sha256(head.stdout.encode() + diff.stdout + untracked.stdout)
        label, key, source = "working tree", f"tree-{digest.hexdigest()[:12]}", REPO
    else:
        sha = subprocess.run(
            [*git, "rev-parse", "--verify", f"{revision}^{{commit}}"],
            capture_output=True,
            text=True,
        )
        if sha.returncode != 0:
            sys.exit(f"--before/--after {revision!r} is not a commit here; give a commit or tag")
        label, key, source = revision, sha.stdout.strip()[:12], None
    site = cache / key
    if (site / ".complete").is_file():
        return label, site
    print(f"installing {label} into {site} (builds its kernels: about a minute)", file=sys.stderr)
    site.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as unpacked:
        if source is None:
            archive = subprocess.run([*git, "archive", key], capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", unpacked], input=archive, check=True)
            source = Path(unpacked)
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
        pip += ["--no-build-isolation", "--upgrade", "--target", str(site), str(source)]
        subprocess.run(pip, check=True, cwd=tempfile.gettempdir())
    (site / ".complete").write_text("")
    return label, site


# ---- llama.cpp's server ---------------------------------------------------------------------


def llama_server(stack: ExitStack, binary: Path, gguf: Path, threads: int) -> str:
    from llama_cpp_peers import start_server

    args = ["-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-c", "4096", "-np", "1"]
    return start_server(stack, binary, [*args, "--no-warmup"], "llama.cpp")


def llama_cpp_run(url: str, prompt: list[int], tokens: int) -> dict[str, Any]:
    from llama_cpp_peers import llama_cpp_run as run

    return run(url, prompt, tokens, 0.0)


def gguf_file(model: str) -> Path:
    from edgespec.models.catalog import find
    from edgespec.models.fetch import gguf_file

    return gguf_file(find(model))


# ---- the comparison -------------------------------------------------------------------------


def prompts(count: int) -> list[tuple[str, bool]]:
    from edgespec.measure.bench import load_prompts

    code = [(text, False) for text in load_prompts("code")[:count]]
    return code + [(text, True) for text in load_prompts("chat")[:count]]


def compare_model(args: argparse.Namespace, model: str, sites: dict[str, Path]) -> dict[str, Any]:
    texts = prompts(args.prompts)
    runs: dict[str, list[dict[str, Any]]] = {}
    with ExitStack() as stack:
        url = llama_server(stack, args.llama_bin / "llama-server", gguf_file(model), args.threads)
        workers = {label: Worker(stack, site, model, args.threads) for label, site in sites.items()}
        first_text, first_chat = texts[0]
        for worker_ in workers.values():  # every configuration once before timing
            for drafter in CONFIGS.values():
                worker_.run(first_text, chat=first_chat, drafter=drafter, tokens=8)
        for round_index in range(args.rounds):
            for index, (text, chat) in enumerate(texts):
                prompt: list[int] | None = None
                measured: dict[str, dict[str, Any]] = {}
                for config, drafter in CONFIGS.items():
                    for label, worker_ in workers.items():
                        time.sleep(SETTLE_S)
                        run = worker_.run(text, chat=chat, drafter=drafter, tokens=args.tokens)
                        measured[f"{label}: {config}"] = run
                        prompt = run["prompt"]
                assert prompt is not None
                time.sleep(SETTLE_S)
                measured["llama.cpp"] = llama_cpp_run(url, prompt, args.tokens)
                for name, run in measured.items():
                    runs.setdefault(name, []).append(run)
                    line = {k: v for k, v in run.items() if k not in ("tokens", "prompt")}
                    line |= {"model": model, "run": name, "round": round_index, "prompt": index}
                    print(json.dumps(line), flush=True)
    return summarize(model, list(sites), runs)


def summarize(
    model: str, labels: list[str], runs: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    llama = statistics.median(r["tok_s"] for r in runs["llama.cpp"])
    rates = {name: statistics.median(r["tok_s"] for r in rs) for name, rs in runs.items()}
    before, after = labels
    same = {
        config: all(
            a["tokens"] == b["tokens"]
            for a, b in zip(runs[f"{before}: {config}"], runs[f"{after}: {config}"], strict=True)
        )
        for config in CONFIGS
    }
    lossless = {
        label: all(
            p["tokens"] == t["tokens"]
            for p, t in zip(
                runs[f"{label}: default pair"], runs[f"{label}: target-only"], strict=True
            )
        )
        for label in labels
    }
    return {
        "model": model,
        "tok_s": {name: round(rate, 2) for name, rate in rates.items()},
        "vs_llama_cpp": {name: round(rate / llama, 3) for name, rate in rates.items()},
        "after_equals_before": same,
        "pair_equals_target_only": lossless,
        "runs_each": len(runs["llama.cpp"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--before", help="the git revision to compare against (a commit or tag)")
    parser.add_argument("--after", help="the revision to check (default: the working tree)")
    parser.add_argument("--llama-bin", type=Path, help="folder holding llama-server")
    parser.add_argument("--models", default=MODELS, help=f"catalog names (default: {MODELS})")
    parser.add_argument("--prompts", type=int, default=3, help="code and chat prompts each")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.threads)
        return
    if not args.before or args.llama_bin is None:
        parser.error("--before REV and --llama-bin DIR are required")
    if not (args.llama_bin / "llama-server").is_file():
        sys.exit(f"no llama-server in {args.llama_bin}: build it with tools/build_llama_server.sh")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    before = install(args.before)
    after = install(args.after)
    if before[0] == after[0]:
        sys.exit("--before and --after name the same revision; give two")
    sites = dict([before, after])
    summaries = [compare_model(args, model, sites) for model in args.models.split(",")]
    for summary in summaries:
        print(json.dumps({"summary": summary}), flush=True)
    print(f"\n{'model':<20} {'configuration':<42} {'tok/s':>7} {'x llama.cpp':>11}")
    for summary in summaries:
        for name, rate in summary["tok_s"].items():
            ratio = summary["vs_llama_cpp"][name]
            print(f"{summary['model']:<20} {name:<42} {rate:>7.2f} {ratio:>10.2f}x")
        print(
            f"{'':<20} after == before: {summary['after_equals_before']}; "
            f"pair == target-only: {summary['pair_equals_target_only']}"
        )


if __name__ == "__main__":
    main()
