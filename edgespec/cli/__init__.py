"""The ``edgespec`` command line (``edgespec.cli.main``); one module per command group."""

from edgespec.cli.main import main

__all__ = ["main"]
