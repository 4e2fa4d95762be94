"""IO binding vs the plain path: target-only decoding time per token, alternating runs.

    python benchmarks/session_paths.py BUNDLE [BUNDLE ...] [--context 64] [--tokens 128]

For each bundle: prefill ``--context`` tokens, then decode ``--tokens`` single tokens with
(a) an ``OnnxModel`` with IO binding (for optimum's graphs: into preallocated ping-pong KV
buffers) and (b) one on the plain path (``session.run``; presents fed back as pasts), five
alternating rounds each; prints the median ms per token of both and their ratio.
"""

from __future__ import annotations

import time

from edgespec.manifest import load_bundle
from edgespec.runtime.model import ModelOptions, OnnxModel

import harness


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
    parser = harness.argument_parser(
        __doc__, part="all", bundles="+", context=64, tokens=128, rounds=5
    )
    args = parser.parse_args()
    lines = harness.JsonLines(args.jsonl)
    for path in args.bundles:
        bundle = load_bundle(path)
        models = {
            name: OnnxModel(bundle, options=ModelOptions(io_binding=binding))
            for name, binding in (("io-binding", True), ("plain", False))
        }
        for model in models.values():
            _decode(model, context=args.context, tokens=8)  # warm-up

        def decode(name: str, _: None, models: dict[str, OnnxModel] = models) -> float:
            return _decode(models[name], context=args.context, tokens=args.tokens)

        times = harness.Samples()
        for turn in harness.alternate(list(models), [None], decode, rounds=args.rounds):
            for name, ms in turn.results.items():
                times.add(name, ms)
        f, p = times.median("io-binding"), times.median("plain")
        lines.write({"bundle": str(path), "io_binding_ms": f, "plain_ms": p}, echo=False)
        print(
            f"{path}: io-binding {f:.3f} ms/token, plain {p:.3f} ms/token, "
            f"plain/io-binding {p / f:.2f}"
        )


if __name__ == "__main__":
    main()
