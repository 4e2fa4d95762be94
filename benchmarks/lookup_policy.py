"""How far can prompt lookup go on a target? Greedy output replayed against lookup policies.

    python benchmarks/lookup_policy.py BUNDLE [--prompts 9] [--tokens 128] [--threads 2]
        [--max-k 8] [--measure-k 4,8]

With greedy decoding a lookup round's outcome is fixed by the target's own output: the
proposal is a function of the context, and the target accepts the longest prefix that equals
its continuation. So one target-only generation per prompt (the edit-style chat prompts of
``gguf_vs_llama_cpp.py``) plus the measured cost of a verify pass over w positions, T(w)/T(1),
give each policy's speedup without running it. The script prints one JSON line per policy
(fixed k, larger n-gram sizes, and ``cold_k``: proposals of at most cold_k tokens unless
the previous one was accepted whole), then, for ``--measure-k``, the speedup of edgespec's
ngram drafter really measured (target-only and lookup alternating prompt by prompt), so the
replay's error is on the same page.

``--branches B`` also replays verifying up to B candidate continuations at once (every
distinct continuation of the tail's earlier occurrences, longest n-gram and latest first,
merged into a prefix tree): the accepted length is the best candidate's, and the pass is
charged as a causal pass over the tree's positions. ONNX Runtime's GroupQueryAttention takes
no tree mask, so this is an upper bound on what such verification could gain.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gguf_vs_llama_cpp import chat_prompts

from edgespec.api import Engine
from edgespec.runtime.drafters.ngram import PromptLookupDrafter

import harness

#: (k, largest n-gram, cold_k): the drafter's settings for one replay
Policy = tuple[int, int, int | None]


def verify_cost(
    engine: Engine, prompt: Sequence[int], widths: int, repeats: int = 24
) -> list[float]:
    """T(w)/T(1) for w = 1..widths (index w), median of ``repeats`` passes after ``prompt``."""
    medians = harness.verify_curve(engine.target, prompt, range(1, widths + 1), repeats)
    return [0.0, *(medians[w] / medians[1] for w in range(1, widths + 1))]


def accepted_length(proposal: Sequence[int], out: list[int], position: int) -> int:
    """How many of ``proposal``'s tokens equal the target's output from ``position`` on."""
    accepted = 0
    while (
        accepted < len(proposal)
        and position + accepted < len(out)
        and proposal[accepted] == out[position + accepted]
    ):
        accepted += 1
    return accepted


def replay(
    outputs: list[tuple[list[int], list[int]]], cost: list[float], policy: Policy
) -> dict[str, float]:
    """Speedup over target-only (one T(1) per token) and tokens per round of ``policy``."""
    k, max_ngram, cold_k = policy
    spent = tokens = rounds = 0.0
    for prompt, out in outputs:
        drafter = PromptLookupDrafter(max_ngram=max_ngram, cold_k=cold_k)
        drafter.begin(prompt, sampling=None, rng=None)  # type: ignore[arg-type]
        position = 0
        while position < len(out):
            proposal = drafter.propose(min(k, len(cost) - 2)).tokens
            accepted = accepted_length(proposal, out, position)
            if position + accepted >= len(out):
                tokens += accepted
                spent += cost[len(proposal) + 1]
                break
            drafter.commit(accepted, out[position + accepted])
            position += accepted + 1
            tokens += accepted + 1
            rounds += 1
            spent += cost[len(proposal) + 1]
    return {"speedup": tokens / spent, "tokens_per_round": tokens / max(rounds, 1)}


def candidates(context: list[int], k: int, branches: int, max_ngram: int = 3) -> list[list[int]]:
    """Up to ``branches`` distinct continuations of k tokens after earlier occurrences of the
    context's tail: longest n-gram first, then the latest occurrence first."""
    found: list[list[int]] = []
    length = len(context)
    for n in range(max_ngram, 0, -1):
        tail = context[length - n :]
        for start in range(length - 2 * n, -1, -1):  # non-overlapping, as the drafter's
            if context[start : start + n] == tail:
                continuation = context[start + n : start + n + k]
                if continuation and continuation not in found:
                    found.append(continuation)
                    if len(found) == branches:
                        return found
    return found


def replay_tree(
    outputs: list[tuple[list[int], list[int]]], cost: list[float], k: int, branches: int
) -> dict[str, float]:
    """Speedup and tokens per round when one pass verifies a tree of candidates."""
    spent = tokens = rounds = 0.0
    for prompt, out in outputs:
        context, position = list(prompt), 0
        while position < len(out):
            found = candidates(context, k, branches)
            nodes = {tuple(c[:i]) for c in found for i in range(1, len(c) + 1)}
            best = max((accepted_length(c, out, position) for c in found), default=0)
            accepted = min(best, len(out) - position - 1)  # the last token is the target's
            context += out[position : position + accepted + 1]
            position += accepted + 1
            tokens += accepted + 1
            rounds += 1
            spent += cost[len(nodes) + 1]  # the tree's positions and the last token's
    return {"speedup": tokens / spent, "tokens_per_round": tokens / rounds}


def main() -> None:
    parser = harness.argument_parser(__doc__, prompts=9, tokens=128, threads=2)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--measure-k", default="4,8,auto", help="k values for the real runs")
    parser.add_argument("--branches", default="", help="e.g. 1,2,4: replay tree verification")
    args = parser.parse_args()
    lines = harness.JsonLines(args.jsonl)
    engine = Engine.load(target=args.bundle, threads=args.threads, measure_energy=False)
    prompts = chat_prompts(engine, args.prompts)
    engine.generate(prompts[0], drafter="none", max_new_tokens=8)  # warm-up
    outputs = []
    for prompt in prompts:
        result = engine.generate(prompt, drafter="none", max_new_tokens=args.tokens)
        outputs.append((list(prompt), list(result.tokens)))
    branches = [int(b) for b in args.branches.split(",") if b]
    widest = max([args.max_k + 1, *(1 + b * args.max_k for b in branches)])
    cost = verify_cost(engine, prompts[0], widest)
    lines.write({"verify_cost": [round(c, 3) for c in cost[1:]]})
    top = args.max_k
    policies: dict[str, Policy] = {f"k {k}": (k, 3, None) for k in range(2, top + 1, 2)}
    for n in (4, 6):
        policies[f"k {top}, n-grams up to {n}"] = (top, n, None)
    for cold in (1, 2, 3, 4):
        policies[f"k {top}, cold_k {cold}"] = (top, 3, cold)
    for name, policy in policies.items():
        lines.write({"policy": name, **replay(outputs, cost, policy)})
    for k in sorted({4, top}):
        for count in branches:
            figures = replay_tree(outputs, cost, k, count)
            name = f"tree of up to {count} candidates, k {k}"
            lines.write({"policy": name, **figures})
    ks = [k for k in args.measure_k.split(",") if k]

    def run(name: str, item: tuple[list[int], list[int]]) -> Any:
        drafter = "none" if name == "none" else "ngram"
        k = 0 if name == "none" else name
        return engine.generate(item[0], drafter=drafter, k=k, max_new_tokens=args.tokens)

    rates = harness.Rates()
    check = harness.OutputCheck(reference="expected")
    for turn in harness.alternate(["none", *ks], outputs, run):
        results = turn.results
        same = check.add({"expected": turn.item[1], **{n: r.tokens for n, r in results.items()}})
        for name, result in results.items():
            if not same[name]:
                raise SystemExit(f"k {name}: output differs from target-only on a prompt")
            rates.add(name, result.stats.new_tokens, result.stats.decode_ms / 1e3)
    rate = rates.rates()
    for k in ks:
        line = {"measured": f"ngram drafter, k {k}", "speedup": rate[k] / rate["none"]}
        lines.write(line)


if __name__ == "__main__":
    main()
