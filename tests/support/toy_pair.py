"""Where the toy pair lies: a 19M target and a 2.6M draft that commands and ``Engine.load()``
use when no bundle is named (``tests/conftest.py`` points ``EDGESPEC_TARGET`` and
``EDGESPEC_DRAFT`` at it)."""

from pathlib import Path

TOY_PAIR = Path(__file__).resolve().parent.parent / "fixtures" / "toy_pair"
