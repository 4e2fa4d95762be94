"""``python -m edgespec`` runs the CLI."""

import sys

from edgespec.cli import main

sys.exit(main())
