"""The ``edgespec mobile`` command (the conversion itself is in ``edgespec.export.mobile``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from edgespec.errors import MissingDependencyError, install_fix


def add_mobile_command(commands: Any) -> None:
    mobile = commands.add_parser(
        "mobile",
        help="convert a (draft) bundle to ONNX Runtime's .ort format for phones",
        description="Write BUNDLE-mobile/: the graph as .ort (ONNX Runtime Mobile) with its "
        "reduced-operator config, and a report of execution-provider coverage and expected "
        "memory. The runtime loads the result like any bundle.",
    )
    mobile.add_argument("bundle", type=Path, metavar="BUNDLE", help="bundle directory")
    mobile.add_argument("--out", type=Path, default=None, help="default: BUNDLE-mobile")
    mobile.add_argument(
        "--optimization-style",
        choices=("Fixed", "Runtime"),
        default="Fixed",
        help="ORT graph optimizations baked in for the CPU EP (Fixed) or replayed at load "
        "for the EP found on the device (Runtime)",
    )
    mobile.set_defaults(handler=_run_mobile)


def _run_mobile(args: argparse.Namespace) -> int:
    try:
        from edgespec.export.mobile import REPORT_FILE, make_mobile_bundle
    except ImportError as error:
        raise MissingDependencyError(
            f"edgespec mobile needs the [export] extra ({error.name} is not installed)",
            fix=install_fix("export"),
        ) from error
    out = make_mobile_bundle(args.bundle, out=args.out, optimization_style=args.optimization_style)
    report = json.loads((out / REPORT_FILE).read_text())
    print(f"wrote {out}")
    for coverage in report["coverage"]:
        print(
            f"  {coverage['provider']:<28} {coverage['nodes']:>5}/{coverage['total']:<5} "
            f"{coverage['verdict']}"
        )
    memory = report["memory_mb"]
    print(f"  expected memory: {memory['expected_total']} MB (.ort {memory['ort_file']} MB)")
    return 0
