"""The ``edgespec`` command line: the parser, and one-line errors.

Every failure prints one line, ``edgespec: error: <problem>; <fix>``, to stderr and exits
non-zero (1 for errors edgespec detects, 2 for command-line usage errors). Progress goes to
stderr; results go to stdout (``--json`` for machines). Each command group lives in its own
module: export, bundles (pair, inspect, info), decode (generate, bench), chat, budget (doctor),
serve, mobile.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from edgespec._version import __version__
from edgespec.cli.budget import add_doctor_command
from edgespec.cli.bundles import add_bundle_commands
from edgespec.cli.chat import add_chat_command
from edgespec.cli.decode import add_decode_commands
from edgespec.cli.distill import add_distill_command
from edgespec.cli.export import add_export_command
from edgespec.cli.mobile import add_mobile_command
from edgespec.cli.models import add_models_command
from edgespec.cli.serve import add_serve_command
from edgespec.errors import EdgespecError


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
    add_doctor_command(commands)
    add_serve_command(commands)
    add_mobile_command(commands)
    return parser


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    typed = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(typed)
    try:
        return int(args.handler(args))
    except EdgespecError as error:
        print(f"edgespec: error: {as_flags(str(error), args, typed)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("edgespec: interrupted; nothing was written", file=sys.stderr)
        return 130
