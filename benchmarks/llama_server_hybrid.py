"""Hybrid verification on llama.cpp's ``llama-server``: a local draft, the target on the server.

    python benchmarks/llama_server_hybrid.py --llama-bin DIR [--model qwen2.5-coder-1.5b]
        [--history 64,1500] [--prompts 2] [--clients 1,4,8] [--k 4] [--tokens 64]
        [--threads 2] [--parts history,clients] [--server-args '--no-repack']

DIR holds llama.cpp's programs (``bash tools/build_llama_server.sh`` builds them into
``~/.cache/edgespec/llama.cpp/bin``). ``--model`` is a catalog name: llama-server serves its
joined GGUF, edgespec drafts with the model's catalog draft (the 0.5B for the 1.5B) and
verifies every round on the server (``--remote-api openai``). The server runs with slots of
its own context each (no ``--kv-unified``) and ``--no-cache-idle-slots``, as docs/serving.md
deploys it.

Part "history": per prompt of the code and chat sets (``--prompts`` each), padded with this
repository's README to exactly each ``--history`` length in tokens, one hybrid generation of
``--tokens`` tokens (the model drafter, fixed ``--k``), then llama-server's own greedy
completion of the same token ids: the outputs must be equal. Printed per history: the
server's prompt tokens computed per round (``timings.prompt_n`` summed over the round's
prompts; median and max, after the first round, which computes the history in each slot), its
milliseconds per round, the first round's tokens and time, rounds, tokens
per round, and the hybrid's and the server's own decode rates.

Part "clients": N devices on one server (``-np`` = max N × (k + 1)). Each client replays the
drafts its prompt drew in a recorded single-client run (so this machine's cores serve only
the server), N clients at once, each on a prompt of its own; then the same N prompts as plain
greedy completions on the same server, N at once (llama-server's continuous batching), in
turn. Printed per N: aggregate and per-client tokens/s of both (prompt included), the
server's computed tokens and batched passes (``llama_decode`` calls) per generated token from
its own counters (``--metrics``), the slots each device's run used and the KV memory those
slots hold after it (``GET /slots``: the slots whose task changed, their tokens times the
bytes per token of llama-server's float16 KV cache from the GGUF's shape), and whether every
client's output equalled the server's own greedy output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from llama_cpp_peers import prompt_sets

from edgespec.api import Engine
from edgespec.config import SamplingConfig
from edgespec.models import catalog
from edgespec.models.bundles import draft_bundle
from edgespec.models.fetch import gguf_file
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.remote.openai import OpenAITarget
from edgespec.runtime.remote.pieces import TokenPieces
from edgespec.runtime.remote.prompt_batch import PromptBatchVerifier

import harness
from harness import post


@dataclass
class Recording:
    """The drafts of one generation's rounds, in order."""

    drafts: list[tuple[int, ...]] = field(default_factory=list)


class RecordingTarget(OpenAITarget):
    """An :class:`OpenAITarget` whose verifiers note each round's draft (the last prompt of a
    round is the history plus the whole draft)."""

    def __init__(self, url: str, *, max_k: int) -> None:
        super().__init__(url, timeout_s=3600, max_k=max_k)
        self.recording = Recording()

    def verifier(self, pieces: Callable[[], TokenPieces]) -> Any:
        verifier = super().verifier(pieces)
        assert isinstance(verifier, PromptBatchVerifier)  # llama-server verifies by prompts
        inner = verifier.round_request
        self.recording = Recording()

        def noted(prompts: Any, sampling: SamplingConfig, meter: Any, uncached: int) -> Any:
            self.recording.drafts.append(tuple(prompts[-1][len(prompts[0]) :]))
            return inner(prompts, sampling, meter, uncached)

        verifier.round_request = noted
        return verifier


def server_greedy(url: str, prompt: list[int], tokens: int) -> dict[str, Any]:
    """llama-server's own greedy completion of a token-id prompt (cache off: its own run)."""
    body = {
        "prompt": prompt,
        "n_predict": tokens,
        "temperature": 0.0,
        "return_tokens": True,
        "cache_prompt": False,
    }
    reply = post(url + "/completion", body)
    return {
        "tokens": [int(t) for t in reply["tokens"]],
        "tok_s": float(reply["timings"]["predicted_per_second"]),
    }


def parted(url: str, prompt: list[int], ours: list[int], theirs: list[int]) -> dict[str, Any]:
    """Where two outputs part, and the server's top log-probabilities there (from a prompt
    computed in one batch, cache off): a gap near 0 is a near-tie that the server's batch
    shapes can flip."""
    at = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b)
    body = {
        "prompt": prompt + ours[:at],
        "n_predict": 1,
        "temperature": 0.0,
        "n_probs": 2,
        "cache_prompt": False,
    }
    top = post(url + "/completion", body)["completion_probabilities"][0]["top_logprobs"]
    return {
        "at": at,
        "ours": ours[at],
        "theirs": theirs[at],
        "top": [(entry["id"], round(entry["logprob"], 4)) for entry in top],
    }


def padded(prompt: list[int], length: int, filler: list[int]) -> list[int]:
    """``prompt`` after the first tokens of ``filler``: ``length`` tokens in all."""
    return filler[: max(length - len(prompt), 0)] + prompt


def history_part(args: argparse.Namespace, url: str, engine: Engine, target: Any) -> None:
    filler = engine.encode(harness.readme_text(20))
    sets = prompt_sets(engine, ["code", "chat"], args.prompts, 0)
    for history in args.history:
        runs = []
        for set_name, prompts in sets.items():
            for prompt in prompts:
                ids = padded(prompt, history, filler)
                result = engine.generate(ids, max_new_tokens=args.tokens, k=args.k, drafter="model")
                own = server_greedy(url, ids, args.tokens)
                work = result.stats.remote["engine"]
                run = {
                    "history": len(ids),
                    "set": set_name,
                    "exact": list(result.tokens) == own["tokens"][: len(result.tokens)],
                    "rounds": result.stats.rounds,
                    "tokens_per_round": result.stats.new_tokens / max(result.stats.rounds, 1),
                    "first_round_tokens": work["round_tokens"][0],
                    "round_tokens_median": statistics.median(work["round_tokens"][1:]),
                    "round_tokens_max": max(work["round_tokens"][1:]),
                    "first_round_ms": work["round_ms"][0],
                    "round_ms_median": statistics.median(work["round_ms"][1:]),
                    "hybrid_tok_s": result.stats.new_tokens
                    / max(result.stats.decode_ms / 1e3, 1e-9),
                    "server_alone_tok_s": own["tok_s"],
                }
                if not run["exact"]:
                    run["parted"] = parted(url, ids, list(result.tokens), own["tokens"])
                print(json.dumps(run), flush=True)
                runs.append(run)
        print(
            f"history {history}: exact {sum(r['exact'] for r in runs)}/{len(runs)}; server "
            f"prompt tokens per round median {_median(runs, 'round_tokens_median')}, max "
            f"{max(r['round_tokens_max'] for r in runs)}; server ms per round "
            f"{_median(runs, 'round_ms_median'):.1f}; first round "
            f"{_median(runs, 'first_round_tokens'):.0f} tokens in "
            f"{_median(runs, 'first_round_ms'):.0f} ms; {_median(runs, 'tokens_per_round'):.2f}"
            " tokens per round; hybrid "
            f"{_median(runs, 'hybrid_tok_s'):.1f} tok/s, server alone "
            f"{_median(runs, 'server_alone_tok_s'):.1f} tok/s",
            flush=True,
        )


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(run[key] for run in runs))


def replay(
    target: OpenAITarget,
    pieces: TokenPieces,
    prompt: list[int],
    drafts: list[tuple[int, ...]],
    out: dict[str, Any],
) -> None:
    """One client: the recorded drafts verified round by round on the server."""
    verifier = target.verifier(lambda: pieces)
    assert isinstance(verifier, PromptBatchVerifier)
    started = time.perf_counter()
    verifier.begin(prompt, sampling=SamplingConfig(), rng=np.random.default_rng(0))
    tokens: list[int] = []
    for draft in drafts:
        last = tokens[-1] if tokens else prompt[-1]
        verdict = verifier.verify(last, Draft(tokens=draft))
        tokens.extend(verdict.tokens)
    work = verifier.work()
    out.update(
        tokens=tokens,
        seconds=time.perf_counter() - started,
        computed=sum(work.round_tokens),
        rounds=len(work.round_tokens),
    )


def plain(url: str, prompt: list[int], tokens: int, out: dict[str, Any]) -> None:
    """One user of the server alone: a greedy completion of ``tokens`` tokens."""
    started = time.perf_counter()
    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0.0, "return_tokens": True}
    reply = post(url + "/completion", body)
    out.update(
        tokens=[int(t) for t in reply["tokens"]],
        seconds=time.perf_counter() - started,
    )


COUNTERS = ("n_decode_total", "prompt_tokens_total", "tokens_predicted_total")


def server_counters(url: str) -> dict[str, float]:
    """llama-server's own counters (``--metrics``): its batched passes (``llama_decode``
    calls), the prompt tokens it computed and the tokens it generated."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=60) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.removeprefix("llamacpp:") in COUNTERS:
            found[name.removeprefix("llamacpp:")] = float(value)
    return found


def slot_tasks(url: str) -> dict[int, tuple[int, int]]:
    """llama-server's slots (``GET /slots``): per slot id, its last task's id (-1: none yet)
    and the tokens its cache holds (``n_prompt_tokens``)."""
    import urllib.request

    with urllib.request.urlopen(url + "/slots", timeout=60) as response:
        slots = json.loads(response.read())
    return {
        int(s["id"]): (int(s.get("id_task", -1)), int(s.get("n_prompt_tokens", 0))) for s in slots
    }


def kv_bytes_per_token(gguf: Path) -> float:
    """Bytes of llama-server's KV cache per token of one slot, from the GGUF's architecture as
    the importer reads it: layers x KV heads x head size x 2 (key and value) x 2 bytes (its
    default float16 cache, ``-ctk f16 -ctv f16``)."""
    from edgespec.export.gguf.reader import open_gguf

    arch = open_gguf(gguf).architecture
    return float(arch.num_layers * arch.num_kv_heads * arch.head_dim * 2 * 2)


@dataclass
class ServerWork:
    """What a run cost the server: its counters' growth, the slots that ran a task of the
    run and the tokens those slots' caches hold after it."""

    counts: dict[str, float]
    slots_used: int
    tokens_held: int


def counted(url: str, run: Any) -> tuple[float, ServerWork]:
    """Runs ``run()`` (it returns seconds); those seconds and the server's work."""
    before, tasks_before = server_counters(url), slot_tasks(url)
    seconds = run()
    after, tasks_after = server_counters(url), slot_tasks(url)
    used = [s for s, (task, _) in tasks_after.items() if task != tasks_before[s][0]]
    return seconds, ServerWork(
        {name: after[name] - before[name] for name in COUNTERS},
        len(used),
        sum(tasks_after[s][1] for s in used),
    )


def at_once(jobs: list[Any]) -> float:
    """Runs ``jobs`` in threads at once; the seconds until the last one ends."""
    threads = [threading.Thread(target=job) for job in jobs]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def clients_part(
    args: argparse.Namespace, url: str, engine: Engine, target: RecordingTarget, gguf: Path
) -> None:
    per_token = kv_bytes_per_token(gguf)
    print(json.dumps({"kv_kb_per_token_per_slot": per_token / 1e3}), flush=True)
    pieces = engine._token_pieces()
    sets = prompt_sets(engine, ["code", "chat"], (max(args.clients) + 1) // 2, 0)
    prompts = [p for pair in zip(sets["code"], sets["chat"], strict=False) for p in pair]
    prompts = prompts[: max(args.clients)]
    recorded = []
    for prompt in prompts:  # one client alone, drafting for real: the drafts to replay
        result = engine.generate(prompt, max_new_tokens=args.tokens, k=args.k, drafter="model")
        own = server_greedy(url, prompt, args.tokens)
        recorded.append((prompt, list(target.recording.drafts), own["tokens"]))
        if list(result.tokens) != own["tokens"][: len(result.tokens)]:
            print(
                json.dumps(
                    {"recorded_not_exact": parted(url, prompt, list(result.tokens), own["tokens"])}
                ),
                flush=True,
            )
    for n in args.clients:
        chosen = recorded[:n]
        hybrid_out: list[dict[str, Any]] = [{} for _ in chosen]
        wall, hybrid_work = counted(
            url,
            lambda chosen=chosen, hybrid_out=hybrid_out: at_once(
                [
                    partial(replay, target, pieces, prompt, drafts, out)
                    for (prompt, drafts, _), out in zip(chosen, hybrid_out, strict=True)
                ]
            ),
        )
        plain_out: list[dict[str, Any]] = [{} for _ in chosen]
        plain_wall, plain_work = counted(
            url,
            lambda chosen=chosen, plain_out=plain_out: at_once(
                [
                    partial(plain, url, prompt, args.tokens, out)
                    for (prompt, _, _), out in zip(chosen, plain_out, strict=True)
                ]
            ),
        )
        hybrid_counts, plain_counts = hybrid_work.counts, plain_work.counts
        made = sum(len(o["tokens"]) for o in hybrid_out)
        plain_made = sum(len(o["tokens"]) for o in plain_out)
        matched = [
            o["tokens"][: len(c[2])] == c[2][: len(o["tokens"])]
            for o, c in zip(hybrid_out, chosen, strict=True)
        ]
        # The server's own outputs with N users at once against its outputs alone: its
        # numerics depend on what shares a batch, so these can part too.
        alone_matched = [o["tokens"] == c[2] for o, c in zip(plain_out, chosen, strict=True)]
        # Where a device's output parted from the server's own alone, and the server's top two
        # log-probabilities there (a near-tie, or not).
        partings = [
            parted(url, c[0], o["tokens"], c[2])
            for o, c, same in zip(hybrid_out, chosen, matched, strict=True)
            if not same
        ]
        line = {
            "clients": n,
            "exact": f"{sum(matched)}/{n}",
            "alone_exact": f"{sum(alone_matched)}/{n}",
            "partings": partings,
            "hybrid_tok_s": made / wall,
            "hybrid_per_client_tok_s": statistics.mean(
                len(o["tokens"]) / o["seconds"] for o in hybrid_out
            ),
            "hybrid_server_tokens_per_token": _computed(hybrid_counts) / made,
            "hybrid_server_passes_per_token": hybrid_counts["n_decode_total"] / made,
            "hybrid_requests_per_token": sum(o["rounds"] for o in hybrid_out) / made,
            "alone_tok_s": plain_made / plain_wall,
            "alone_per_client_tok_s": statistics.mean(
                len(o["tokens"]) / o["seconds"] for o in plain_out
            ),
            "alone_server_tokens_per_token": _computed(plain_counts) / plain_made,
            "alone_server_passes_per_token": plain_counts["n_decode_total"] / plain_made,
            # Slots a device's run used and the KV its slots hold after it (each slot keeps
            # its own copy of the history), against the same user served alone.
            "hybrid_slots_per_device": hybrid_work.slots_used / n,
            "alone_slots_per_device": plain_work.slots_used / n,
            "hybrid_kv_mb_per_device": hybrid_work.tokens_held * per_token / 1e6 / n,
            "alone_kv_mb_per_device": plain_work.tokens_held * per_token / 1e6 / n,
        }
        print(json.dumps(line), flush=True)


def _computed(counts: dict[str, float]) -> float:
    return counts["prompt_tokens_total"] + counts["tokens_predicted_total"]


def main() -> None:
    parser = harness.argument_parser(
        __doc__, part="paragraph", prompts=2, tokens=64, threads=2, jsonl=False
    )
    parser.add_argument("--llama-bin", type=Path, required=True)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--history", default="64,1500")
    parser.add_argument("--clients", default="1,4,8")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--parts", default="history,clients")
    parser.add_argument(
        "--server-args", default="", help="more llama-server arguments, e.g. '--no-repack'"
    )
    args = parser.parse_args()
    args.history = harness.int_list(args.history)
    args.clients = harness.int_list(args.clients)
    parts = args.parts.split(",")
    model = catalog.find(args.model)
    gguf = gguf_file(model)
    draft = draft_bundle(model)
    assert draft is not None, f"{model.name} has no draft model"
    slots = (args.k + 1) * (max(args.clients) if "clients" in parts else 1)
    context = max(max(args.history) + args.tokens + args.k + 64, 512)
    served = ["-m", str(gguf), "-np", str(slots), "-c", str(context * slots)]
    served += ["-t", str(args.threads), "--no-cache-idle-slots", "--no-webui", "--metrics"]
    served += args.server_args.split()
    with harness.llama_server(args.llama_bin / "llama-server", served) as server:
        url = server.url
        target = RecordingTarget(url, max_k=args.k)
        engine = Engine.load(
            draft=draft.root, remote=target, threads=args.threads, measure_energy=False
        )
        info = target.info()
        print(
            f"llama-server: {slots} slots of {info.max_length} tokens; k up to {info.max_k}; "
            f"a round of one prompt {info.target_step_s * 1e3:.1f} ms, of w prompts T(w)/T(1) "
            + ", ".join(f"{c:.2f}" for c in info.verify_cost),
            flush=True,
        )
        if "history" in parts:
            history_part(args, url, engine, target)
        if "clients" in parts:
            clients_part(args, url, engine, target, gguf)


if __name__ == "__main__":
    main()
