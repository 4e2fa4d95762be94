"""IO binding vs the plain path: target-only decoding time per token, alternating runs.

    python benchmarks/session_paths.py BUNDLE [BUNDLE ...] [--context 64] [--tokens 128]

For each bundle: prefill ``--context`` tokens, then decode ``--tokens`` single tokens with
(a) ``OnnxModel.forward_bound`` (IO binding into preallocated ping-pong KV buffers) and
(b) ``OnnxModel.forward_reference`` (``session.run``; presents fed back as pasts), five
alternating rounds each; prints the median ms per token of both and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

from edgespec.manifest import load_bundle
from edgespec.runtime.model import OnnxModel


def _decode(session: OnnxModel, *, fast: bool, context: int, tokens: int) -> float:
    cache = session.new_bound_cache() if fast else session.new_reference_cache()
    forward = session.forward_bound if fast else session.forward_reference
    forward(list(range(1, context + 1)), cache)  # type: ignore[arg-type]
    token = 5
    started = time.perf_counter()
    for _ in range(tokens):
        logits = forward([token], cache)  # type: ignore[arg-type]
        token = int(logits[-1].argmax())
    return (time.perf_counter() - started) / tokens * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for path in args.bundles:
        session = OnnxModel(load_bundle(path))
        _decode(session, fast=True, context=args.context, tokens=8)  # warm-up
        fast, plain = [], []
        for _ in range(args.rounds):
            fast.append(_decode(session, fast=True, context=args.context, tokens=args.tokens))
            plain.append(_decode(session, fast=False, context=args.context, tokens=args.tokens))
        f, p = statistics.median(fast), statistics.median(plain)
        print(
            f"{path}: io-binding {f:.3f} ms/token, plain {p:.3f} ms/token, "
            f"plain/io-binding {p / f:.2f}"
        )


if __name__ == "__main__":
    main()
