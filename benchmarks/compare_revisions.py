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
model the median tok/s of each configuration, its ratio to llama.cpp's, and how many of its
outputs equal the before revision's target-only output, token for token: the after revision's
target-only output and both revisions' pairs must equal it every time (the change kept the
outputs, and every pair stayed lossless).

DIR holds llama.cpp's programs (``tools/build_llama_server.sh`` builds them into
``~/.cache/edgespec/llama.cpp/bin``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

import harness

REPO = Path(__file__).resolve().parent.parent
MODELS = "smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b,gemma3-270m"
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
        if request.get("encode_only"):
            print(json.dumps({"prompt": prompt}), flush=True)
            continue
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

    def encode(self, text: str, *, chat: bool) -> list[int]:
        assert self.process.stdin is not None
        self.process.stdin.write(
            json.dumps({"text": text, "chat": chat, "encode_only": True}) + "\n"
        )
        self.process.stdin.flush()
        return list(self._read()["prompt"])

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


# ---- the comparison -------------------------------------------------------------------------


def prompts(count: int) -> list[tuple[str, bool]]:
    from edgespec.measure.bench import load_prompts

    code = [(text, False) for text in load_prompts("code")[:count]]
    return code + [(text, True) for text in load_prompts("chat")[:count]]


def gguf_file(model: str) -> Path:
    from edgespec.models.catalog import find
    from edgespec.models.fetch import gguf_file as fetched

    return fetched(find(model))


def compare_model(args: argparse.Namespace, model: str, sites: dict[str, Path]) -> dict[str, Any]:
    """Every configuration on every prompt, taking turns; the medians and the outputs' check."""
    labels = list(sites)
    configs = [f"{label}: {config}" for config in CONFIGS for label in labels] + ["llama.cpp"]
    reference = f"{labels[0]}: target-only"
    check = harness.OutputCheck(reference)
    rates = harness.Samples()
    server_args = ["-m", str(gguf_file(model)), "-t", str(args.threads), "-tb", str(args.threads)]
    server_args += ["-c", "4096", "-np", "1", "--no-warmup"]
    with ExitStack() as stack:
        server = stack.enter_context(
            harness.llama_server(args.llama_bin / "llama-server", server_args)
        )
        workers = {label: Worker(stack, site, model, args.threads) for label, site in sites.items()}
        items = [
            (text, chat, workers[labels[0]].encode(text, chat=chat))
            for text, chat in prompts(args.prompts)
        ]
        for worker_ in workers.values():  # every configuration once before timing
            for drafter in CONFIGS.values():
                worker_.run(items[0][0], chat=items[0][1], drafter=drafter, tokens=8)

        def run(config: str, item: tuple[str, bool, list[int]]) -> dict[str, Any]:
            text, chat, ids = item
            if config == "llama.cpp":
                return harness.llama_completion(server.url, ids, args.tokens)
            label, name = config.split(": ")
            return workers[label].run(text, chat=chat, drafter=CONFIGS[name], tokens=args.tokens)

        for turn in harness.alternate(
            configs, items, run, rounds=args.rounds, settle_s=harness.SETTLE_S, rotate=True
        ):
            check.add({c: r["tokens"] for c, r in turn.results.items() if c != "llama.cpp"})
            for config, result in turn.results.items():
                rates.add(config, result["tok_s"])
                line = {k: v for k, v in result.items() if k not in ("tokens", "prompt")}
                line |= {"model": model, "run": config, "round": turn.round, "prompt": turn.index}
                args.lines.write(line)
    llama = rates.median("llama.cpp")
    return {
        "model": model,
        "tok_s": {config: round(rates.median(config), 2) for config in configs},
        "vs_llama_cpp": {config: round(rates.median(config) / llama, 3) for config in configs},
        # Target-only and pair outputs of both revisions against the before revision's
        # target-only output: the refactor kept outputs, and each pair stayed lossless.
        "equal_to_before_target_only": {c: check.fraction(c) for c in configs if c != "llama.cpp"},
        "all_equal": check.all_equal(),
    }


def main() -> None:
    parser = harness.argument_parser(__doc__, prompts=3, tokens=64, rounds=2, threads=2)
    parser.add_argument("--worker", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--before", help="the git revision to compare against (a commit or tag)")
    parser.add_argument("--after", help="the revision to check (default: the working tree)")
    parser.add_argument("--llama-bin", type=Path, help="folder holding llama-server")
    parser.add_argument("--models", default=MODELS, help=f"catalog names (default: {MODELS})")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.threads)
        return
    if not args.before or args.llama_bin is None:
        parser.error("--before REV and --llama-bin DIR are required")
    if not (args.llama_bin / "llama-server").is_file():
        sys.exit(f"no llama-server in {args.llama_bin}: build it with tools/build_llama_server.sh")
    args.lines = harness.JsonLines(args.jsonl)
    before = install(args.before)
    after = install(args.after)
    if before[0] == after[0]:
        sys.exit("--before and --after name the same revision; give two")
    sites = dict([before, after])
    summaries = [compare_model(args, model, sites) for model in args.models.split(",")]
    for summary in summaries:
        args.lines.write({"summary": summary})
    print(f"\n{'model':<20} {'configuration':<36} {'tok/s':>7} {'x llama.cpp':>11}  same tokens")
    for summary in summaries:
        for name, rate in summary["tok_s"].items():
            ratio = summary["vs_llama_cpp"][name]
            same = summary["equal_to_before_target_only"].get(name, "")
            print(f"{summary['model']:<20} {name:<36} {rate:>7.2f} {ratio:>10.2f}x  {same}")
    verdict = all(summary["all_equal"] for summary in summaries)
    print(f"\nevery output equal to the before revision's target-only output: {verdict}")


if __name__ == "__main__":
    main()
