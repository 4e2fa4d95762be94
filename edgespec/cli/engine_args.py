"""Arguments shared by the decoding commands: which pair (or remote target) to load, and the
options of a generation; and the engine and options they build."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from edgespec.cli.budget import add_budget_arguments, budget_options
from edgespec.cli.models import add_model_argument
from edgespec.engine.options import (
    DEFAULT_DRAFT_WINDOW,
    DRAFTER_NAMES,
    FALLBACKS,
    MAX_K,
    REMOTE_APIS,
    REMOTE_WHEN,
)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        type=Path,
        default=None,
        metavar="DIR",
        help="target bundle directory (default: $EDGESPEC_TARGET, else SmolLM2-135M-Instruct, "
        "fetched and converted on first use)",
    )
    add_model_argument(parser)
    parser.add_argument(
        "--draft",
        type=Path,
        default=None,
        metavar="DIR",
        help="draft bundle directory (needed by --drafter model)",
    )
    parser.add_argument(
        "--head",
        type=Path,
        default=None,
        metavar="DIR",
        help="a head on the target (a bundle made by 'edgespec distill --head'); a catalog "
        "model's shipped head is used without it",
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
    add_context_argument(parser)
    parser.add_argument(
        "--draft-window",
        type=int,
        default=None,
        metavar="N",
        help="the draft model attends over the first 128 positions and the last N only, so "
        "that its steps do not slow down as the history grows (the target still checks every "
        "token: the output is unchanged); 0: its whole history (default: "
        f"{DEFAULT_DRAFT_WINDOW})",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads per session (default: ONNX Runtime's choice)",
    )
    parser.add_argument(
        "--no-spin",
        dest="spinning",
        action="store_false",
        help="let the verifying model's threads sleep between kernels instead of spinning: "
        "less CPU time on a machine shared with other work, slower decoding",
    )
    add_budget_arguments(parser)
    add_remote_arguments(parser)


def add_context_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--context",
        type=int,
        default=None,
        metavar="N",
        help="tokens of context (prompt, history and answer) the KV caches are allocated for, "
        "up to the model's trained length (default: 4096, or the model's own if shorter)",
    )


def add_remote_arguments(parser: argparse.ArgumentParser) -> None:
    """Where verification runs when it is not local, and how a remote target is used."""
    parser.add_argument(
        "--remote",
        default=None,
        metavar="URL",
        help="verify on this 'edgespec serve' or OpenAI-compatible serving engine (the draft "
        "runs here; --target is then only loaded for --fallback local)",
    )
    parser.add_argument(
        "--remote-api",
        default="auto",
        choices=REMOTE_APIS,
        help="what --remote speaks: auto (default: asked of the URL), edgespec (verification "
        "protocol v1) or openai (a serving engine, detected from its answers: llama.cpp's "
        "llama-server, greedy or sampled with --top-k; vLLM and llama-cpp-python's server, "
        "greedy)",
    )
    parser.add_argument(
        "--remote-model",
        default=None,
        metavar="NAME",
        help="a serving engine's model name (default: the first it lists)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("EDGESPEC_API_KEY"),
        help="bearer token for --remote (default: $EDGESPEC_API_KEY)",
    )
    parser.add_argument(
        "--remote-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long each --remote request is retried (with jittered backoff) before the "
        "server counts as gone: a server restarted within it loses no generation "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--fallback",
        default="fail",
        choices=FALLBACKS,
        help="when the server stays unreachable: fail (default: stop, keep the verified "
        "text), local (continue with --target: lossless), draft (continue unverified: lossy)",
    )
    parser.add_argument(
        "--remote-when",
        default="always",
        choices=REMOTE_WHEN,
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


def add_decoding_arguments(
    parser: argparse.ArgumentParser, *, max_new_tokens: int | None = 128
) -> None:
    """The decoding options of generate and chat; ``max_new_tokens`` None: an answer runs to
    the end of the model's turn, bounded by the context (chat)."""
    parser.add_argument(
        "--drafter",
        default=None,
        choices=DRAFTER_NAMES,
        help="combined (the default where there is a head or a draft: prompt lookup where "
        "the text repeats, the head or draft model elsewhere), head (the target's head), "
        "model (the draft model), ngram (prompt lookup alone), none (plain target decoding)",
    )
    parser.add_argument(
        "--k",
        default=None,
        help=f"tokens drafted per round: 0 (no drafting) to {MAX_K}, or auto (adapts each "
        "round; default: what 'pair --profile' measured here, else the bundles' "
        "recommended k, else 4 with a draft model and auto without)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=max_new_tokens,
        metavar="N",
        help=f"tokens to generate at most (default {max_new_tokens})"
        if max_new_tokens is not None
        else "tokens an answer may have at most (default: to the end of the model's turn, "
        "bounded by the context)",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="1.0 = off (default)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the generation's sampling (default 0)"
    )
    parser.add_argument(
        "--sampling-mode",
        default=None,
        choices=("rejection", "match"),
        help="match (the default: the same seed gives target-only sampling's text, with or "
        "without speculation) or rejection (Leviathan et al.'s rejection sampling)",
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


def load_engine(args: argparse.Namespace) -> Any:
    """The engine the engine arguments ask for; its warnings go to stderr."""
    from edgespec.api import Engine
    from edgespec.errors import ConfigError
    from edgespec.measure.delay_proxy import DelayProxy

    if (args.rtt_ms or args.remote_when != "always") and not args.remote:
        raise ConfigError("--rtt-ms and --remote-when need --remote", fix="pass --remote URL")
    url = args.remote
    if url and args.rtt_ms:
        # The latency goes on the wire: a TCP proxy in this process delays both directions.
        url = DelayProxy(url, rtt_s=args.rtt_ms / 1e3).start().url
    engine = Engine.load(
        target=args.target,
        draft=args.draft,
        head=args.head,
        drafter=getattr(args, "drafter", None),
        model=args.model,
        target_providers=_providers(args.target_providers),
        draft_providers=_providers(args.draft_providers),
        threads=args.threads,
        spinning=args.spinning,
        context=args.context,
        draft_window=args.draft_window,
        **budget_options(args),
        remote=url,
        remote_api=args.remote_api,
        remote_model=args.remote_model,
        api_key=args.api_key,
        remote_timeout_s=args.remote_timeout,
        fallback=args.fallback,
        remote_when=args.remote_when,
    )
    for line in engine.warnings:
        print(f"edgespec: warning: {line}", file=sys.stderr)
    return engine


def read_prompt(prompt: str | None, file: Path | None) -> str:
    """The prompt of ``generate``: PROMPT, standard input ('-' as PROMPT or FILE) or FILE's
    text; one of them, and a file that can be read as UTF-8 text."""
    from edgespec.errors import ConfigError

    if prompt is not None and file is not None:
        raise ConfigError("pass PROMPT or --file, not both", fix="drop one of them")
    if prompt is None and file is None:
        raise ConfigError(
            "no prompt: pass PROMPT, '-' to read standard input, or --file FILE",
            fix="e.g. edgespec generate 'def fib(n):', or edgespec generate -f prompt.txt",
        )
    if prompt is not None and prompt != "-":
        return prompt
    if prompt == "-" or str(file) == "-":
        return sys.stdin.read()
    assert file is not None
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise ConfigError(f"prompt file {file} does not exist", fix="check the path") from error
    except IsADirectoryError as error:
        raise ConfigError(f"{file} is a directory, not a prompt file", fix="pass a file") from error
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{file} is not UTF-8 text (byte {error.start})", fix="pass a text file"
        ) from error


def check_generation_options(args: argparse.Namespace) -> None:
    """The ``check`` hook of generate and chat: bad option values, and an empty or blank
    prompt, are usage errors, reported before any model is fetched or loaded."""
    from edgespec.engine.options import GenerationOptions
    from edgespec.errors import ConfigError

    if hasattr(args, "file"):  # generate: PROMPT, '-' or --file
        args.prompt = read_prompt(args.prompt, args.file)
    prompt = getattr(args, "prompt", None)
    if prompt is not None and not prompt.strip():
        chat = getattr(args, "chat", False)
        example = "--chat 'What is a closure?'" if chat else "'def fib(n):'"
        what = "the message to answer" if chat else "the text to continue"
        raise ConfigError(
            "the prompt is empty or only whitespace",
            fix=f"pass {what}, e.g. edgespec generate {example}",
        )
    options = generation_options(args)
    if options["max_new_tokens"] is None:  # chat: to the end of the turn, checked per answer
        options["max_new_tokens"] = 1
    GenerationOptions(**options)


def generation_options(args: argparse.Namespace) -> dict[str, Any]:
    """The generation options of ``generate`` (``Engine.generate`` keyword arguments)."""
    return {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "k": args.k,
        "drafter": args.drafter,
        "sampling_mode": args.sampling_mode,
        "stop": tuple(args.stop),
        "chat": args.chat,
        "draft_min_probability": args.draft_min_prob,
    }
