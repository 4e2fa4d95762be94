"""The ``edgespec`` command line: the parser, and one-line errors.

Every failure prints one line, ``edgespec: error: <problem>; <fix>``, to stderr and exits
non-zero (1 for errors edgespec detects, 2 for command-line usage errors). Progress goes to
stderr; results go to stdout (``--json`` for machines). Each command group lives in its own
module: export, bundles (pair, inspect, info), decode (generate, bench), budget (doctor),
serve, mobile.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from edgespec._version import __version__
from edgespec.cli.budget import add_doctor_command
from edgespec.cli.bundles import add_bundle_commands
from edgespec.cli.decode import add_decode_commands
from edgespec.cli.export import add_export_command
from edgespec.cli.mobile import add_mobile_command
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
    add_bundle_commands(commands)
    add_decode_commands(commands)
    add_doctor_command(commands)
    add_serve_command(commands)
    add_mobile_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except EdgespecError as error:
        print(f"edgespec: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("edgespec: interrupted", file=sys.stderr)
        return 130
