"""IO binding vs the plain path: target-only decoding time per token, alternating runs.

    python benchmarks/session_paths.py BUNDLE [BUNDLE ...] [--context 64] [--tokens 128]

For each bundle: prefill ``--context`` tokens, then decode ``--tokens`` single tokens with
(a) an ``OnnxModel`` with IO binding (for optimum's graphs: into preallocated ping-pong KV
buffers) and (b) one on the plain path (``session.run``; presents fed back as pasts), five
alternating rounds each; prints the median ms per token of both and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

from edgespec.manifest import load_bundle
from edgespec.runtime.model import ModelOptions, OnnxModel


def _decode(model: OnnxModel, *, context: int, tokens: int) -> float:
    cache = model.new_cache()
    model.forward(list(range(1, context + 1)), cache)
    token = 5
    started = time.perf_counter()
    for _ in range(tokens):
        logits = model.forward([token], cache)
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
        bundle = load_bundle(path)
        bound, unbound = (
            OnnxModel(bundle, options=ModelOptions(io_binding=binding)) for binding in (True, False)
        )
        for model in (bound, unbound):
            _decode(model, context=args.context, tokens=8)  # warm-up
        fast, plain = [], []
        for _ in range(args.rounds):
            fast.append(_decode(bound, context=args.context, tokens=args.tokens))
            plain.append(_decode(unbound, context=args.context, tokens=args.tokens))
        f, p = statistics.median(fast), statistics.median(plain)
        print(
            f"{path}: io-binding {f:.3f} ms/token, plain {p:.3f} ms/token, "
            f"plain/io-binding {p / f:.2f}"
        )


if __name__ == "__main__":
    main()
