"""``python -m edgespec`` runs the CLI."""

import importlib.util
import sys
from pathlib import Path


def unmapped_checkout() -> Path | None:
    """The source checkout this package was imported from when it is not installed there:
    ``runtime/`` and ``export/`` sit beside the package and only an install maps them into it
    (pyproject's package-dir), so ``python -m edgespec`` in the checkout's root would import
    a package without them. None when ``edgespec.runtime`` can be found."""
    checkout = Path(__file__).resolve().parent.parent
    if importlib.util.find_spec("edgespec.runtime") is not None:
        return None
    return checkout if (checkout / "runtime" / "decoder.py").is_file() else None


if __name__ == "__main__":
    checkout = unmapped_checkout()
    if checkout is not None:
        sys.exit(
            f"edgespec: error: {checkout} is a source checkout without an editable install, so "
            "its runtime/ and export/ are not part of the package here; fix: pip install -e "
            f"{checkout} (or run edgespec from another folder)"
        )
    from edgespec.cli import main

    sys.exit(main())
