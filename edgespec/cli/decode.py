"""The decoding commands: ``generate`` and ``bench``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from edgespec.cli.budget import energy_line
from edgespec.cli.engine_args import (
    add_decoding_arguments,
    add_engine_arguments,
    check_generation_options,
    generation_options,
    load_engine,
)
from edgespec.engine.options import DRAFTER_NAMES, MAX_K, parse_k


def add_decode_commands(commands: Any) -> None:
    """Adds ``generate`` and ``bench`` to the CLI's subcommands."""
    generate = commands.add_parser(
        "generate",
        help="generate text with speculative decoding (streams as tokens are committed)",
        description="Generate a continuation of PROMPT. Greedy output equals the target's own "
        "greedy output; sampled output has the target's distribution (rejection) or equals "
        "target-only sampling with the same seed (match).",
    )
    generate.add_argument(
        "prompt",
        metavar="PROMPT",
        nargs="?",
        default=None,
        help="the prompt text ('-': read it from standard input)",
    )
    generate.add_argument(
        "-f",
        "--file",
        type=Path,
        default=None,
        metavar="FILE",
        help="read the prompt from FILE (any size; '-': standard input) instead of PROMPT",
    )
    add_engine_arguments(generate)
    add_decoding_arguments(generate)
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
    generate.set_defaults(handler=run_generate, check=check_generation_options)

    bench = commands.add_parser(
        "bench",
        help="target-only vs speculative decoding, measured in one process",
        description="Alternate target-only and speculative runs over a prompt set after a "
        "warm-up (greedy, then sampling at --temperature) and report tokens/s, speedup, alpha, "
        "mean_accepted, c, the verify cost curve T(k)/T(1), the theoretical speedup and the "
        "efficiency.",
    )
    add_engine_arguments(bench)
    bench.add_argument(
        "--prompts",
        default="code",
        metavar="SET|FILE",
        help="a built-in set: code (32 held-out code-completion prompts, default), edit "
        "(answers repeat the prompt: for --drafter ngram), chat (12 chat requests) or "
        "chat-edit (14 requests to rewrite a function); or a file with one prompt per "
        "line (\\n for newlines), or a JSON list",
    )
    bench.add_argument(
        "--count",
        type=int,
        default=None,
        metavar="N",
        help="the set's first N prompts only (default: all of them)",
    )
    bench.add_argument(
        "--chat",
        action="store_true",
        help="send each prompt through the chat template as a user message (the chat sets "
        "always are)",
    )
    bench.add_argument(
        "--max-new-tokens", type=int, default=128, help="tokens per prompt (default 128)"
    )
    bench.add_argument(
        "--k",
        default=None,
        help=f"draft length: 0 to {MAX_K}, or auto (default: what 'pair --profile' measured "
        "here, else the bundles' recommended k, else 4 with a draft model and auto without)",
    )
    bench.add_argument(
        "--drafter",
        default=None,
        choices=DRAFTER_NAMES,
        help="the speculative runs' drafter (default: model with a draft, else ngram; none "
        "measures target-only twice)",
    )
    bench.add_argument(
        "--temperature",
        type=float,
        default=0.7,
        help="temperature of the sampling comparison (default 0.7)",
    )
    bench.add_argument(
        "--repeats", type=int, default=1, help="passes over the prompt set (default 1)"
    )
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    bench.set_defaults(handler=run_bench, check=lambda args: parse_k(args.k))


def run_generate(args: argparse.Namespace) -> int:
    from edgespec.engine.options import GenerationOptions

    options = GenerationOptions(**generation_options(args))
    engine = load_engine(args)
    generation = engine.stream_deltas(args.prompt, options)
    color = not args.no_color and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    written = False
    try:
        for delta in generation:
            if args.json:
                continue
            text = f"\033[36m{delta.text}\033[0m" if color and delta.drafted else delta.text
            sys.stdout.write(text)
            sys.stdout.flush()
            written = True
    except KeyboardInterrupt:
        # The streamed text stays; the notice goes on its own line.
        if written:
            sys.stdout.write("\n")
            sys.stdout.flush()
        print("edgespec: interrupted; the text above is what was generated", file=sys.stderr)
        return 130
    result = generation.result
    if args.json:
        print(result.to_json())
    elif result.error is not None:
        sys.stdout.write("\n")
        print(f"edgespec: error: {result.error}", file=sys.stderr)
    else:
        stats = result.stats
        sys.stdout.write("\n")
        alpha = stats.alpha
        print(
            f"[{stats.new_tokens} tokens, {stats.tokens_per_s or 0:.1f} tokens/s, "
            f"{stats.rounds} rounds, alpha {'n/a' if alpha is None else f'{alpha:.0%}'}, "
            f"{result.finish_reason}]",
            file=sys.stderr,
        )
        print(f"[{energy_line(stats)}]", file=sys.stderr)
        # A server already down at load was named in the load's warnings.
        if stats.fell_back is not None and stats.fell_back != engine.remote_down:
            how = (
                "the draft went on alone: this output is unverified"
                if stats.lossy
                else "verified on this device instead (lossless)"
            )
            print(f"edgespec: warning: {stats.fell_back}; {how}", file=sys.stderr)
    return 1 if result.error is not None else 0


def run_bench(args: argparse.Namespace) -> int:
    from edgespec.errors import ConfigError
    from edgespec.measure.bench import BenchSettings, load_prompt_set, run_bench

    prompt_set = load_prompt_set(args.prompts)
    if args.count is not None and args.count < 1:
        raise ConfigError(f"--count {args.count} runs no prompt", fix="pass --count 1 or more")
    engine = load_engine(args)
    settings = BenchSettings(
        chat=args.chat or prompt_set.chat,
        max_new_tokens=args.max_new_tokens,
        k=args.k,
        drafter=args.drafter,
        temperature=args.temperature,
        repeats=args.repeats,
    )
    results = run_bench(
        engine,
        prompt_set.prompts[: args.count],
        settings,
        progress=lambda m: print(f"  bench: {m}", file=sys.stderr, flush=True),
    )
    print(json.dumps(results, indent=2) if args.json else "\n".join(bench_lines(results)))
    return 0


def bench_lines(results: dict[str, Any]) -> list[str]:
    """The bench report in words: speed, sampling, energy, remote traffic, costs."""
    greedy, sampled = results["greedy"], results["sampling"]
    lines = [
        f"greedy   target {greedy['target_tokens_per_s']:.1f} tok/s, speculative "
        f"{greedy['speculative_tokens_per_s']:.1f} tok/s, speedup {greedy['speedup']:.2f}x, "
        f"alpha {greedy['alpha'] or 0:.2f}, mean_accepted {greedy['mean_accepted'] or 0:.2f}, "
        f"identical output {greedy['identical_output']}"
    ]
    if sampled is None:
        lines.append(
            "sampling not measured: an OpenAI-compatible engine verifies greedy drafts only"
        )
    else:
        lines.append(
            f"sampling target {sampled['target_tokens_per_s']:.1f} tok/s, speculative "
            f"{sampled['speculative_tokens_per_s']:.1f} tok/s, speedup "
            f"{sampled['speedup']:.2f}x, alpha {sampled['alpha'] or 0:.2f}"
        )
    energy = results["energy"]
    per_token = "energy_j" if energy["measured_by"] == "energy_j" else "cpu_s"
    unit = "J" if per_token == "energy_j" else "CPU-s"
    lines.append(
        f"per token target {energy[f'target_{per_token}_per_token']:.4g} {unit}, speculative "
        f"{energy[f'speculative_{per_token}_per_token']:.4g} {unit}: speculation is "
        f"{'cheaper' if energy['cheaper_per_token'] else 'NOT cheaper'} per token"
        f"{'' if per_token == 'energy_j' else ' (no energy source: CPU time as the proxy)'}"
    )
    if results["speedup_vs_best_target_only"] is not None:
        lines.append(
            f"vs the fastest target-only build ({results['best_target_only']}): "
            f"{results['speedup_vs_best_target_only']:.2f}x"
        )
    if "speculative_round_trips_per_token" in greedy:
        lines.append(
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
    lines.append(
        f"c {results['c']:.3f} (a draft step's cost over a target step's); verify cost "
        f"T(w)/T(1), a pass of w tokens over one step, w = 1..9: {curve}"
    )
    if results["theoretical_speedup"]:
        lines.append(
            f"theoretical speedup {results['theoretical_speedup']:.2f}x (from alpha, c and the "
            f"curve), efficiency {results['efficiency']:.2f} (measured over theoretical); loop "
            f"overhead {greedy['overhead_ms_per_round']:.3f} ms/round (loop efficiency "
            f"{greedy['loop_efficiency']:.2f}: the models' share of the loop's time)"
        )
    return lines
