"""The ``edgespec`` command line: the parser, and one-line errors.

Every failure prints one line, ``edgespec: error: <problem>; <fix>``, to stderr and exits
non-zero: 2 for command-line usage errors (an unknown option, or an option value the command
cannot take: ``--k abc``, ``--top-p 2``; a command's ``check`` hook validates its values before
anything loads), 1 for the errors edgespec detects while working. Progress goes to
stderr; results go to stdout (``--json`` for machines). Each command group lives in its own
module: export, bundles (pair, inspect, info), decode (generate, bench), chat, budget (doctor),
serve, mobile.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import NoReturn

from edgespec._version import __version__
from edgespec.cli.budget import add_doctor_command
from edgespec.cli.bundles import add_bundle_commands
from edgespec.cli.cache import add_cache_command
from edgespec.cli.chat import add_chat_command
from edgespec.cli.decode import add_decode_commands
from edgespec.cli.distill import add_distill_command
from edgespec.cli.export import add_export_command
from edgespec.cli.mobile import add_mobile_command
from edgespec.cli.models import add_models_command
from edgespec.cli.serve import add_serve_command
from edgespec.errors import ConfigError, EdgespecError


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line, like every other edgespec error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"edgespec: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="edgespec",
        description="Speculative decoding on edge devices: export draft/target pairs to "
        "verified ONNX bundles and run them with ONNX Runtime.",
    )
    parser.add_argument("--version", action="version", version=f"edgespec {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    add_export_command(commands)
    add_distill_command(commands)
    add_bundle_commands(commands)
    add_decode_commands(commands)
    add_chat_command(commands)
    add_models_command(commands)
    add_cache_command(commands)
    add_doctor_command(commands)
    add_serve_command(commands)
    add_mobile_command(commands)
    return parser


#: The status a shell reports for a process ended by SIGPIPE (128 + 13).
SIGPIPE_STATUS = 141

#: Python names whose flag is not ``--`` + the name with dashes.
FLAG_NAMES = {
    "draft_min_probability": "--draft-min-prob",
    "min_top1_agreement": "--min-top1",
    "memory_mb": "--memory-budget-mb",
    "power_w": "--power-budget-w",
    "energy_per_token_j": "--energy-budget-j-per-token",
    "remote_api": "--remote-api",
}


def as_flags(message: str, args: argparse.Namespace, typed: Sequence[str]) -> str:
    """Errors raised below the CLI name Python parameters (``max_new_tokens is -5``, ``pass
    draft=...``); on the command line, name the flags the user typed instead. A plain word is
    rewritten only where it starts the message, so prose such as "the draft" stays; only flags
    in ``typed`` (the command line) are named, so positional arguments keep their words."""
    names = {name: f"--{name.replace('_', '-')}" for name in vars(args)} | FLAG_NAMES
    given = {word.split("=")[0] for word in typed if word.startswith("--")}
    for name, flag in names.items():
        if flag not in given:
            continue
        message = re.sub(rf"\b{name}=", f"{flag} ", message)
        if "_" in name:
            message = re.sub(rf"(?<![-\w]){name}\b", flag, message)
        elif message.startswith(f"{name} "):
            message = flag + message[len(name) :]
    return message


class _Notices(logging.Handler):
    """Prints edgespec's log records (a remote server being retried, ...) as stderr lines
    in the CLI's form, ``edgespec: warning: ...``; stderr is looked up at each record, so a
    replaced ``sys.stderr`` gets them."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"edgespec: {record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)


NOTICES = _Notices(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    logging.getLogger("edgespec").addHandler(NOTICES)  # once: a logger holds a handler once
    parser = build_parser()
    typed = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(typed)
    try:
        getattr(args, "check", lambda args: None)(args)
    except ConfigError as error:
        print(f"edgespec: error: {as_flags(str(error), args, typed)}", file=sys.stderr)
        return 2
    try:
        with signals_end_the_command():
            return int(args.handler(args))
    except EdgespecError as error:
        print(f"edgespec: error: {as_flags(str(error), args, typed)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "edgespec: interrupted; no half-made bundle is left behind (files already fetched "
            "stay in the cache for the next run)",
            file=sys.stderr,
        )
        return 130
    except BrokenPipeError:
        return closed_stdout()


#: Signals that end a command the way Ctrl-C does: cleanup handlers run (a half-written import
#: is removed) before the process exits with 128 + the signal's number.
ENDING_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


@contextlib.contextmanager
def signals_end_the_command() -> Iterator[None]:
    """While a command runs in the main thread, SIGTERM and SIGHUP raise ``SystemExit`` so
    that ``finally`` and ``except BaseException`` blocks run (the default action kills the
    process where it stands); the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def end(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {number: signal.signal(number, end) for number in ENDING_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def closed_stdout() -> int:
    """The reader of stdout went away (``edgespec generate ... | head``): stop quietly, as
    command-line tools do, with the status of a process ended by SIGPIPE. stdout is pointed at
    /dev/null so that the interpreter's final flush of the unwritten rest fails no more."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return SIGPIPE_STATUS
