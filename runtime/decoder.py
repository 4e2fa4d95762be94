"""The speculative loop: propose → verify → commit → observe.

It knows drafters, verifiers and k policies only through their protocols, and observers only
through :class:`DecodeObserver`; it prints nothing, times nothing and knows no budgets.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.runtime.round import DecodeObserver, Drafter, KPolicy, StepRecord, Verifier


def decode(
    prompt: Sequence[int],
    *,
    drafter: Drafter,
    verifier: Verifier,
    k_policy: KPolicy,
    sampling: SamplingConfig,
    rng: np.random.Generator,
    max_new_tokens: int,
    eos_ids: frozenset[int],
    observers: Sequence[DecodeObserver] = (),
) -> Generator[tuple[int, ...], None, None]:
    """Yields the tokens committed by each round until eos or ``max_new_tokens``.

    The target prefills ``prompt[:-1]``; the last prompt token is verified with the first draft.
    """
    for observer in observers:
        observer.on_start(len(prompt))
    features = verifier.begin(prompt, sampling=sampling, rng=rng)
    drafter.begin(prompt, sampling=sampling, rng=rng, features=features)
    for observer in observers:
        observer.on_prefilled()
    last, produced, round_index = prompt[-1], 0, 0
    while produced < max_new_tokens:
        for observer in observers:
            observer.on_round_start()
        # A round commits up to k + 1 tokens; never draft past the token budget.
        k = min(k_policy.next_k(), max_new_tokens - produced - 1)
        draft = drafter.propose(k)
        verdict = verifier.verify(last, draft)
        drafter.commit(verdict.n_accepted, verdict.tokens[-1], features=verdict.features)
        committed = verdict.tokens[: max_new_tokens - produced]
        eos_at = next((i for i, token in enumerate(committed) if token in eos_ids), None)
        if eos_at is not None:
            committed = committed[: eos_at + 1]
        produced += len(committed)
        last = verdict.tokens[-1]
        record = StepRecord(
            round=round_index,
            k=k,
            drafted=len(draft.tokens),
            n_accepted=verdict.n_accepted,
            committed=committed,
            draft_s=draft.elapsed_s,
            draft_steps=draft.steps,
            verify_s=verdict.elapsed_s,
        )
        round_index += 1
        k_policy.observe(record)
        for observer in observers:
            observer.on_step(record)
        yield committed
        if eos_at is not None:
            for observer in observers:
                observer.on_finish("eos")
            return
    for observer in observers:
        observer.on_finish("max_new_tokens")
