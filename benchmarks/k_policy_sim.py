"""AutoK's speed on simulated acceptance, by how fast its α follows the rounds: what the
per-round k policy gives away against the best fixed k, without a model or a machine's noise.

    python benchmarks/k_policy_sim.py [--c 0.29]
        [--verify 1,1.01,1.21,1.34,1.43,1.53,1.65,1.78,1.92] [--alphas 0.65,0.72,0.8,0.85]
        [--bursty HI,LO,LENGTH] [--weights 0.2,0.1,0.05,0.02] [--tokens 4000] [--seeds 5]

A round drafts the policy's k; each drafted token is accepted with probability α, independently
(as sampled acceptance is, a draw per token), or, with ``--bursty HI,LO,LENGTH``, with α HI
or LO in runs of about LENGTH positions (as greedy agreement comes: a copied line, then a
divergent one). A round costs k draft steps of ``--c`` target steps and a verify pass of
``--verify``[k] (T(k + 1)/T(1); the defaults are Qwen2.5-Coder-1.5B's profile with its 0.5B
draft on a 2-core Xeon). Prints tokens per target step (the speedup over target-only decoding)
for AutoK at each α weight (``alpha_smoothing``) and for the best fixed k, averaged over
``--seeds`` runs of ``--tokens`` tokens.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np

from edgespec.events import StepRecord
from edgespec.runtime.k_policy import AutoK, CostProfile, FixedK, expected_speedup

import harness

TARGET_STEP_S = 0.055  # any value: costs are in target steps


class Acceptance:
    """Draws each drafted token's acceptance: i.i.d. at ``alpha``, or in runs (``bursty``)."""

    def __init__(self, alpha: float, bursty: tuple[float, float, float] | None, seed: int):
        self.rng = np.random.default_rng(seed)
        self.alpha, self.bursty, self.high = alpha, bursty, True

    def next(self) -> bool:
        if self.bursty is None:
            return bool(self.rng.random() < self.alpha)
        high, low, length = self.bursty
        if self.rng.random() < 1.0 / length:
            self.high = not self.high
        return bool(self.rng.random() < (high if self.high else low))


def speedup(
    policy: AutoK | FixedK, acceptance: Acceptance, c: float, verify: list[float], tokens: int
) -> float:
    """Tokens per target step of ``policy`` over rounds until ``tokens`` are made."""
    made, cost, rounds = 0, 0.0, 0
    while made < tokens:
        k = policy.next_k()
        accepted = 0
        while accepted < k and acceptance.next():
            accepted += 1
        if accepted == k:
            acceptance.next()  # the target's own token moves a run of agreement on too
        draft_s, verify_s = k * c * TARGET_STEP_S, verify[k] * TARGET_STEP_S
        policy.observe(
            StepRecord(
                round=rounds,
                k=k,
                drafted=k,
                n_accepted=accepted,
                committed=(),
                draft_s=draft_s,
                draft_steps=k,
                verify_s=verify_s,
            )
        )
        made, cost, rounds = made + accepted + 1, cost + draft_s + verify_s, rounds + 1
    return made / (cost / TARGET_STEP_S)


def main() -> None:
    parser = harness.argument_parser(__doc__, tokens=4000, jsonl=False)
    parser.add_argument("--c", type=float, default=0.29)
    parser.add_argument("--verify", default="1,1.01,1.21,1.34,1.43,1.53,1.65,1.78,1.92")
    parser.add_argument("--alphas", default="0.65,0.72,0.8,0.85")
    parser.add_argument("--bursty", default="", help="HI,LO,LENGTH: acceptance in runs")
    parser.add_argument("--weights", default="0.2,0.1,0.05,0.02")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    verify = [float(v) for v in args.verify.split(",")]
    profile = CostProfile(
        target_step_s=TARGET_STEP_S, draft_step_s=args.c * TARGET_STEP_S, verify_cost=tuple(verify)
    )
    bursty = tuple(float(v) for v in args.bursty.split(",")) if args.bursty else None
    for alpha in (float(a) for a in args.alphas.split(",")):
        mean_alpha = alpha if bursty is None else (bursty[0] + bursty[1]) / 2
        best_k = max(
            range(len(verify)), key=lambda k: expected_speedup(mean_alpha, args.c, verify, k)
        )

        def averaged(make: Callable[[], AutoK | FixedK], alpha: float = alpha) -> float:
            return statistics.mean(
                speedup(make(), Acceptance(alpha, bursty, seed), args.c, verify, args.tokens)
                for seed in range(args.seeds)
            )

        row = {
            f"auto, alpha weight {weight}": averaged(
                lambda weight=weight: AutoK(profile, alpha=0.83, alpha_smoothing=weight)
            )
            for weight in (float(w) for w in args.weights.split(","))
        }
        row[f"fixed k {best_k}"] = averaged(lambda k=best_k: FixedK(k))
        label = f"alpha {alpha}" if bursty is None else f"runs of {bursty}"
        print(
            label + ": " + ", ".join(f"{name} {value:.3f}x" for name, value in row.items()),
            flush=True,
        )
        if bursty is not None:
            break


if __name__ == "__main__":
    main()
