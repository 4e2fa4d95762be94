"""The ``edgespec serve`` command (the server itself is in ``edgespec.server``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from edgespec.cli.engine_args import add_context_argument
from edgespec.cli.models import add_model_argument, resolve_model
from edgespec.errors import MissingDependencyError, install_fix


def add_serve_command(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve a target for remote verification (protocol v1) and OpenAI-compatible "
        "completions",
        description="Hold the target and verify drafts sent by 'edgespec generate --remote'. "
        "Binds 127.0.0.1 unless told otherwise; any other address needs --api-key. Each "
        "request is logged on stderr; SIGTERM or Ctrl-C drains and stops it.",
    )
    serve.add_argument(
        "--target",
        type=Path,
        default=None,
        metavar="DIR",
        help="target bundle (default: $EDGESPEC_TARGET, else SmolLM2-135M-Instruct)",
    )
    add_model_argument(serve)
    serve.add_argument(
        "--draft",
        type=Path,
        default=None,
        metavar="DIR",
        help="draft bundle for the OpenAI-compatible routes (default: $EDGESPEC_DRAFT "
        "without --target, none with it: prompt lookup drafts)",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s; any other than loopback needs --api-key)",
    )
    serve.add_argument(
        "--port", type=int, default=8700, help="port to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--api-key",
        default=os.environ.get("EDGESPEC_API_KEY"),
        help="bearer token clients must send (default: $EDGESPEC_API_KEY)",
    )
    _add_session_limits(serve)
    serve.add_argument(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads per session (default: ONNX Runtime's choice)",
    )
    serve.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        help="do not log each request on stderr (client, method, path, status, milliseconds)",
    )
    serve.set_defaults(handler=run_serve)


def _add_session_limits(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--max-sessions",
        type=int,
        default=64,
        help="sessions kept before the least recently used is evicted (default: %(default)s)",
    )
    serve.add_argument(
        "--max-cache-mb",
        type=float,
        default=None,
        help="KV cache memory cap over all sessions; the least recently used are evicted "
        "beyond it (default: a quarter of the memory available at start; 0: no cap)",
    )
    serve.add_argument(
        "--idle-ttl",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="sessions idle this long expire (default: %(default)s)",
    )
    serve.add_argument(
        "--max-k",
        type=int,
        default=8,
        help="the draft length suggested to clients when the server is idle (default: %(default)s)",
    )
    serve.add_argument(
        "--max-scored-positions",
        type=int,
        default=1024,
        metavar="N",
        help="completions 'logprobs' score at most N prompt and completion tokens per request "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--max-score-seconds",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="model time one request's 'logprobs' scoring may take (default: %(default)s)",
    )
    add_context_argument(serve)
    serve.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM or Ctrl-C, requests in flight get this long to finish; the rest are "
        "cut and the server exits with status 0 (default: %(default)s)",
    )


def run_serve(args: argparse.Namespace) -> int:
    try:
        from edgespec.server.options import ServerOptions
        from edgespec.server.run import check_binding, check_port, default_cache_mb, serve
        from edgespec.server.scoring import ScoreLimits
        from edgespec.server.sessions import StoreLimits
    except ImportError as error:
        raise MissingDependencyError(
            f"edgespec serve needs the [server] extra ({error.name} is missing)",
            fix=install_fix("server"),
        ) from error
    cache_mb = default_cache_mb() if args.max_cache_mb is None else args.max_cache_mb
    limits = StoreLimits(
        max_sessions=args.max_sessions,
        max_cache_bytes=int(cache_mb * 1024 * 1024),
        idle_ttl_s=args.idle_ttl,
        max_k=args.max_k,
    )
    scoring = ScoreLimits(
        max_positions=args.max_scored_positions, max_seconds=args.max_score_seconds
    )
    check_binding(args.host, args.api_key)
    check_port(args.host, args.port)
    host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address in a URL
    budget = f"{cache_mb:g} MB" if cache_mb else "no cap"
    print(
        f"edgespec: serving on http://{host}:{args.port} (KV cache budget: {budget})",
        file=sys.stderr,
    )
    resolve_model(args)
    serve(
        target=args.target,
        draft=args.draft,
        host=args.host,
        port=args.port,
        options=ServerOptions(
            api_key=args.api_key,
            limits=limits,
            scoring=scoring,
            shutdown_grace_s=args.shutdown_grace,
        ),
        threads=args.threads,
        context=args.context,
        access_log=args.access_log,
    )
    print(f"edgespec: stopped serving on http://{host}:{args.port}", file=sys.stderr)
    return 0
