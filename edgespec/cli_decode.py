"""The decoding commands of the CLI: ``generate``, ``bench`` and ``pair --profile``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from edgespec.cli_budget import add_budget_arguments, budget_options, energy_line
from edgespec.errors import ConfigError

PROFILE_PROMPTS = 12  # code prompts pair --profile drafts on (64 tokens each, k = 8)


def add_decode_commands(commands: Any) -> None:
    """Adds ``generate`` and ``bench`` to the CLI's subcommands."""
    generate = commands.add_parser(
        "generate",
        help="generate text with speculative decoding (streams as tokens are committed)",
        description="Generate a continuation of PROMPT. Greedy output equals the target's own "
        "greedy output; sampled output has the target's distribution (rejection) or equals "
        "target-only sampling with the same seed (match).",
    )
    generate.add_argument("prompt", metavar="PROMPT", help="the prompt text")
    _add_engine_arguments(generate)
    _add_decoding_arguments(generate)
    generate.add_argument(
        "--chat", action="store_true", help="wrap PROMPT in the tokenizer's chat template"
    )
    generate.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: text, tokens, stats (no streaming)",
    )
    generate.add_argument(
        "--no-color", action="store_true", help="do not colour text that came from accepted drafts"
    )
    generate.set_defaults(handler=run_generate)

    bench = commands.add_parser(
        "bench",
        help="target-only vs speculative decoding, measured in one process",
        description="Alternate target-only and speculative runs over a prompt set after a "
        "warm-up (greedy, then sampling at --temperature) and report tokens/s, speedup, alpha, "
        "mean_accepted, c, the verify cost curve T(k)/T(1), the theoretical speedup and the "
        "efficiency.",
    )
    _add_engine_arguments(bench)
    bench.add_argument(
        "--prompts",
        default="code",
        metavar="SET|FILE",
        help="a built-in set: code (32 held-out code-completion prompts, default) or edit "
        "(answers repeat the prompt: for --drafter ngram); or a file with one prompt per "
        "line (\\n for newlines), or a JSON list",
    )
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument(
        "--k",
        default=None,
        help="draft length, or auto (default: the pair's recommended k, else 4)",
    )
    bench.add_argument("--drafter", default="model", choices=("model", "ngram"))
    bench.add_argument(
        "--temperature",
        type=float,
        default=0.7,
        help="temperature of the sampling comparison (default 0.7)",
    )
    bench.add_argument("--repeats", type=int, default=1, help="passes over the prompt set")
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    bench.set_defaults(handler=run_bench)


def _add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        type=Path,
        default=None,
        metavar="DIR",
        help="target bundle directory (default: the built-in pair, draft included)",
    )
    parser.add_argument(
        "--draft",
        type=Path,
        default=None,
        metavar="DIR",
        help="draft bundle directory (needed by --drafter model)",
    )
    parser.add_argument(
        "--target-providers",
        default=None,
        metavar="LIST",
        help="comma-separated ONNX Runtime providers for the target (default: the best available)",
    )
    parser.add_argument(
        "--draft-providers",
        default=None,
        metavar="LIST",
        help="comma-separated providers for the draft",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads per session (default: ONNX Runtime's choice)",
    )
    add_budget_arguments(parser)
    parser.add_argument(
        "--remote",
        default=None,
        metavar="URL",
        help="verify on this 'edgespec serve' (the draft runs here; --target is then only "
        "loaded for --fallback local), or on an OpenAI-compatible engine with --remote-api "
        "openai",
    )
    parser.add_argument(
        "--remote-api",
        default="edgespec",
        choices=("edgespec", "openai"),
        help="what --remote speaks: edgespec (verification protocol v1, default) or openai "
        "(an OpenAI-compatible engine such as vLLM or llama-cpp-python's server: greedy "
        "drafts verified from prompt log-probabilities)",
    )
    parser.add_argument(
        "--remote-model",
        default=None,
        metavar="NAME",
        help="the engine's model name for --remote-api openai (default: the first it lists)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("EDGESPEC_API_KEY"),
        help="bearer token for --remote (default: $EDGESPEC_API_KEY)",
    )
    parser.add_argument(
        "--fallback",
        default="fail",
        choices=("fail", "local", "draft"),
        help="when the server stays unreachable: fail (default: stop, keep the verified "
        "text), local (continue with --target: lossless), draft (continue unverified: lossy)",
    )
    parser.add_argument(
        "--remote-when",
        default="always",
        choices=("always", "budget"),
        help="always (default): every round is verified on --remote; budget: verify with the "
        "local target and move rounds to --remote while the budget policy says so (battery "
        "under --min-battery-pct)",
    )
    parser.add_argument(
        "--rtt-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="add this round-trip time to every --remote exchange: a TCP proxy in this "
        "process delays each direction by half (for benchmarks on loopback)",
    )


def _add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--drafter",
        default=None,
        choices=("model", "ngram", "none"),
        help="model (default with --draft), ngram (prompt lookup, default "
        "without), none (plain target decoding)",
    )
    parser.add_argument(
        "--k",
        default=None,
        help="tokens drafted per round, or auto (default: the pair's recommended k, else 4)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sampling-mode",
        default=None,
        choices=("rejection", "match"),
        help="rejection (model drafter default) or match (reproducible: "
        "same seed, same text with or without speculation)",
    )
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop when this text appears (repeatable)",
    )
    parser.add_argument(
        "--draft-min-prob",
        type=float,
        default=0.0,
        metavar="P",
        help="end a draft early when the draft's probability of its next token is below P "
        "(default 0: always draft k)",
    )


def _providers(value: str | None) -> list[str] | None:
    return [name.strip() for name in value.split(",") if name.strip()] if value else None


def _k(value: str | None) -> int | str | None:
    if value is None or value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"--k {value!r} is not a number or 'auto'", fix="e.g. --k 4") from None


def _load_engine(args: argparse.Namespace) -> Any:
    from edgespec.api import Engine
    from edgespec.delay_proxy import DelayProxy
    from edgespec.runtime.verifiers.engine import EngineTarget
    from edgespec.runtime.verifiers.remote import RemoteTarget

    if (args.rtt_ms or args.remote_when != "always") and not args.remote:
        raise ConfigError("--rtt-ms and --remote-when need --remote", fix="pass --remote URL")
    if args.remote_model and args.remote_api != "openai":
        raise ConfigError("--remote-model needs --remote-api openai", fix="add it")
    remote: RemoteTarget | EngineTarget | None = None
    url = args.remote
    if url and args.rtt_ms:
        # The latency goes on the wire: a TCP proxy in this process delays both directions.
        url = DelayProxy(url, rtt_s=args.rtt_ms / 1e3).start().url
    if url and args.remote_api == "openai":
        remote = EngineTarget(url, model=args.remote_model, api_key=args.api_key)
    elif url:
        remote = RemoteTarget(url, api_key=args.api_key)
    engine = Engine.load(
        target=args.target,
        draft=args.draft,
        target_providers=_providers(args.target_providers),
        draft_providers=_providers(args.draft_providers),
        threads=args.threads,
        **budget_options(args),
        remote=remote,
        fallback=args.fallback,
        remote_when=args.remote_when,
    )
    for line in engine.warnings:
        print(f"edgespec: warning: {line}", file=sys.stderr)
    return engine


def run_generate(args: argparse.Namespace) -> int:
    engine = _load_engine(args)
    generation = engine.stream_deltas(
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        k=_k(args.k),
        drafter=args.drafter,
        sampling_mode=args.sampling_mode,
        stop=args.stop,
        chat=args.chat,
        draft_min_probability=args.draft_min_prob,
    )
    color = not args.no_color and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    for delta in generation:
        if args.json:
            continue
        text = f"\033[36m{delta.text}\033[0m" if color and delta.drafted else delta.text
        sys.stdout.write(text)
        sys.stdout.flush()
    result = generation.result
    if args.json:
        print(result.to_json())
    elif result.error is not None:
        sys.stdout.write("\n")
        print(f"edgespec: error: {result.error}", file=sys.stderr)
    else:
        stats = result.stats
        sys.stdout.write("\n")
        rate = stats["acceptance_rate"]
        print(
            f"[{stats['new_tokens']} tokens, {stats['tokens_per_s'] or 0:.1f} tokens/s, "
            f"{stats['rounds']} rounds, acceptance "
            f"{'n/a' if rate is None else f'{rate:.0%}'}, {result.finish_reason}]",
            file=sys.stderr,
        )
        print(f"[{energy_line(stats)}]", file=sys.stderr)
        if result.stats.get("lossy"):
            print("edgespec: warning: fell back to unverified draft output", file=sys.stderr)
    return 1 if result.error is not None else 0


def run_bench(args: argparse.Namespace) -> int:
    from edgespec.bench import BenchSettings, load_prompts, run_bench

    engine = _load_engine(args)
    settings = BenchSettings(
        max_new_tokens=args.max_new_tokens,
        k=_k(args.k),
        drafter=args.drafter,
        temperature=args.temperature,
        repeats=args.repeats,
    )
    results = run_bench(
        engine,
        load_prompts(args.prompts),
        settings,
        progress=lambda m: print(f"  bench: {m}", file=sys.stderr, flush=True),
    )
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    greedy, sampled = results["greedy"], results["sampling"]
    print(
        f"greedy   target {greedy['target_tokens_per_s']:.1f} tok/s, speculative "
        f"{greedy['speculative_tokens_per_s']:.1f} tok/s, speedup {greedy['speedup']:.2f}x, "
        f"alpha {greedy['alpha'] or 0:.2f}, mean_accepted {greedy['mean_accepted'] or 0:.2f}, "
        f"identical output {greedy['identical_output']}"
    )
    if sampled is None:
        print("sampling not measured: an OpenAI-compatible engine verifies greedy drafts only")
    else:
        print(
            f"sampling target {sampled['target_tokens_per_s']:.1f} tok/s, speculative "
            f"{sampled['speculative_tokens_per_s']:.1f} tok/s, speedup "
            f"{sampled['speedup']:.2f}x, alpha {sampled['alpha'] or 0:.2f}"
        )
    energy = results["energy"]
    per_token = "energy_j" if energy["measured_by"] == "energy_j" else "cpu_s"
    unit = "J" if per_token == "energy_j" else "CPU-s"
    print(
        f"per token target {energy[f'target_{per_token}_per_token']:.4g} {unit}, speculative "
        f"{energy[f'speculative_{per_token}_per_token']:.4g} {unit}: speculation is "
        f"{'cheaper' if energy['cheaper_per_token'] else 'NOT cheaper'} per token"
        f"{'' if per_token == 'energy_j' else ' (no energy source: CPU time as the proxy)'}"
    )
    if results["speedup_vs_best_target_only"] is not None:
        print(
            f"vs the fastest target-only build ({results['best_target_only']}): "
            f"{results['speedup_vs_best_target_only']:.2f}x"
        )
    if "speculative_round_trips_per_token" in greedy:
        print(
            f"remote   round trips/token: per-token {greedy['target_round_trips_per_token']:.2f}, "
            f"hybrid {greedy['speculative_round_trips_per_token']:.2f}; bytes/token: per-token "
            f"{greedy['target_bytes_per_token']:.0f}, hybrid "
            f"{greedy['speculative_bytes_per_token']:.0f}"
            + (
                f"; RTT share of hybrid rounds {greedy['speculative_rtt_share']:.0%}"
                if greedy["speculative_rtt_share"] is not None
                else ""
            )
        )
    curve = ", ".join(f"{v:.2f}" for v in results["verify_cost"])
    print(f"c {results['c']:.3f}; verify cost T(w)/T(1), w = 1..9: {curve}")
    if results["theoretical_speedup"]:
        print(
            f"theoretical speedup {results['theoretical_speedup']:.2f}x, efficiency "
            f"{results['efficiency']:.2f}; loop overhead {greedy['overhead_ms_per_round']:.3f} "
            f"ms/round (loop efficiency {greedy['loop_efficiency']:.2f})"
        )
    return 0


def profile_pair(draft: Path, target: Path) -> dict[str, Any]:
    """Greedy speculation at k = 8 over the bench prompts: alpha by position, c, best k."""
    from edgespec.api import Engine
    from edgespec.bench import load_prompts
    from edgespec.runtime.policy import expected_speedup

    engine = Engine.load(target=target, draft=draft)
    results = [
        engine.generate(p, k=8, max_new_tokens=64) for p in load_prompts("code")[:PROFILE_PROMPTS]
    ]
    tested = sum(r.stats["tested"] for r in results)
    alpha = sum(r.stats["accepted"] for r in results) / tested if tested else 0.0
    offered = [0] * 8
    kept = [0] * 8
    for result in results:
        for record_position, rate in enumerate(result.stats["acceptance_by_position"]):
            offered[record_position] += 1
            kept[record_position] += rate
    # reached[i]: share of rounds whose draft position i was accepted (0 = first token);
    # alpha at position i is that share given position i - 1 was accepted.
    reached = [kept[i] / offered[i] for i in range(8) if offered[i]]
    by_position = [
        reached[i] / reached[i - 1] if i and reached[i - 1] else reached[i]
        for i in range(len(reached))
    ]
    profile = engine.cost_profile()
    verify_cost = list(profile.verify_cost)
    speedups = [expected_speedup(alpha, profile.c, verify_cost, k) for k in range(9)]
    best = max(range(9), key=lambda k: speedups[k])
    return {
        "alpha": alpha,
        "alpha_by_position": by_position,
        "accepted_through_position": reached,
        "c": profile.c,
        "verify_cost": verify_cost,
        "recommended_k": best,
        "expected_speedup": speedups[best],
    }
