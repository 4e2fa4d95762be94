"""Would a tree with one extra candidate at the first draft position pay beside the head's
chain? Counted in the head's real rounds, priced by the target's measured passes.

    python benchmarks/first_position_tree.py [--model NAME] --head DIR [--sets code edit chat]
        [--prompts 8] [--tokens 96] [--threads 2] [--k K]

The tree adds one row to every verify pass: the head's second choice B at the first position
(it costs no draft step: the first position's scores are already there). It pays back only in
a round whose first drafted token the target rejects, and only when B is the target's own
token there: that round then commits two tokens (B, and the target's token after it) instead
of one. So this script runs the head's chain as the engine runs it (greedy, k from the policy
unless ``--k``), records each round's first-position runner-up and the target's token that
replaced a rejected first draft, and prices the extra row of each round by the target's own
pass times (``runtime.costs.measure_costs``: T(w + 1) - T(w) at the round's width w).

Per set it prints the chain's measured tokens a round and seconds a round, the tree's gain (the
share of rounds where B would have been kept), the tree's extra seconds a round, and the
tree's rate over the chain's. The tree itself is not run: the gain is counted, the cost
measured; rounds after a hit would shift by one token, which the count does not follow.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from heads import head_argument_parser

from edgespec.api import Engine
from edgespec.measure.bench import load_prompt_set
from edgespec.runtime.costs import measure_costs
from edgespec.runtime.drafters.head import HeadDrafter

import harness


class RunnerUpLog:
    """Wraps a :class:`HeadDrafter`'s proposal and commit to record, per round that drafted,
    its width, whether the first draft was rejected and whether the head's runner-up at the
    first position was the target's token then."""

    def __init__(self) -> None:
        self.reset()
        self._runner_up: int | None = None
        self._first_call = False
        self._drafted = 0

    def reset(self) -> None:
        self.widths: list[int] = []
        self.rejected_first = 0
        self.runner_up_kept = 0

    def install(self) -> None:
        propose, draw, commit = HeadDrafter.propose, HeadDrafter._draw_kept, HeadDrafter.commit
        log = self

        def logged_propose(drafter: HeadDrafter, k: int) -> Any:
            log._first_call, log._runner_up = True, None
            draft = propose(drafter, k)
            log._drafted = len(draft.tokens)
            return draft

        def logged_draw(drafter: HeadDrafter, scores: np.ndarray, position: int) -> Any:
            if log._first_call:
                log._first_call = False
                second = int(np.argsort(scores)[-2])  # [N] kept-token scores
                log._runner_up = int(drafter.kept[second])
            return draw(drafter, scores, position)

        def logged_commit(drafter: HeadDrafter, n_accepted: int, next_token: int, **kw: Any) -> Any:
            if log._drafted:
                log.widths.append(log._drafted + 1)
                if n_accepted == 0:
                    log.rejected_first += 1
                    log.runner_up_kept += int(log._runner_up == int(next_token))
            log._drafted = 0
            return commit(drafter, n_accepted, next_token, **kw)

        HeadDrafter.propose = logged_propose  # type: ignore[method-assign]
        HeadDrafter._draw_kept = logged_draw  # type: ignore[method-assign]
        HeadDrafter.commit = logged_commit  # type: ignore[method-assign]


def main() -> None:
    parser = head_argument_parser(__doc__, prompts=8)
    parser.add_argument("--k", type=int, default=None, help="draft length (default: the policy)")
    args = parser.parse_args()
    engine = Engine.load(
        model=args.model, head=args.head, drafter="head", threads=args.threads, measure_energy=False
    )
    assert engine.pair.head is not None and engine.target is not None, "no head: pass --head DIR"
    costs = measure_costs(engine.target, engine.pair.head, max_width=10)
    step_s = costs.target_step_s
    pass_s = [step_s * v for v in costs.verify_cost]  # T(w) for w = 1..10
    lines = harness.JsonLines(args.jsonl)
    lines.write({"target_step_ms": round(step_s * 1e3, 3), "verify_cost": costs.verify_cost})
    table = []
    log = RunnerUpLog()
    log.install()
    for name in args.sets:
        prompts = load_prompt_set(name)
        items = prompts.prompts[: args.prompts or None]
        engine.generate(items[0], drafter="none", max_new_tokens=8, chat=prompts.chat)
        log.reset()
        tokens = rounds = 0
        decode_s = 0.0
        identical = 0
        for prompt in items:
            plain = engine.generate(
                prompt, drafter="none", max_new_tokens=args.tokens, chat=prompts.chat
            )
            result = engine.generate(
                prompt, drafter="head", k=args.k, max_new_tokens=args.tokens, chat=prompts.chat
            )
            identical += int(result.tokens == plain.tokens)
            tokens, rounds = tokens + result.stats.new_tokens, rounds + result.stats.rounds
            decode_s += result.stats.decode_ms / 1e3
        extra_s = sum(pass_s[min(w, len(pass_s) - 1)] - pass_s[w - 1] for w in log.widths)
        chain_rate = tokens / decode_s
        tree_rate = (tokens + log.runner_up_kept) / (decode_s + extra_s)
        line = {
            "set": name,
            "prompts": len(items),
            "rounds": rounds,
            "drafting_rounds": len(log.widths),
            "chain_tokens_per_round": round(tokens / rounds, 3),
            "first_rejected": log.rejected_first,
            "runner_up_kept": log.runner_up_kept,
            "tree_gain_per_round": round(log.runner_up_kept / max(rounds, 1), 3),
            "chain_ms_per_round": round(decode_s / rounds * 1e3, 3),
            "tree_extra_ms_per_round": round(extra_s / rounds * 1e3, 3),
            "tree_over_chain": round(tree_rate / chain_rate, 3),
            "identical": f"{identical}/{len(items)}",
            "k": args.k or "auto",
        }
        lines.write(line)
        table.append(line)
    print(
        "\n| set | rounds drafting | first draft rejected | runner-up kept | chain tokens a round "
        "| tree gain a round | chain ms a round | tree's extra ms a round | tree / chain |"
        "\n|---|---|---|---|---|---|---|---|---|"
    )
    for row in table:
        print(
            f"| {row['set']} | {row['drafting_rounds']} of {row['rounds']} | "
            f"{row['first_rejected']} | {row['runner_up_kept']} | "
            f"{row['chain_tokens_per_round']} | "
            f"{row['tree_gain_per_round']} | {row['chain_ms_per_round']} | "
            f"{row['tree_extra_ms_per_round']} | {row['tree_over_chain']:.3f}x |"
        )


if __name__ == "__main__":
    main()
