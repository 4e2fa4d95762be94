"""A quickly trained draft/target pair for runtime benchmarks (minutes on a 2-core CPU).

    python tools/quick_pair.py OUT_DIR [--target-steps 400] [--draft-steps 400]

Trains the ``llama-14m`` target of ``tests/support/tiny_models.py`` on Python standard-library
source (next-token loss), then distils the ``llama-2m`` draft from it (KL divergence to the target's
distribution), and saves both as Hugging Face model directories ``OUT_DIR/target`` and
``OUT_DIR/draft`` sharing one tokenizer, ready for ``edgespec export``. A stand-in until the
built-in pair exists; its acceptance rate is whatever this short training gives.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as functional

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.tiny_models import ARCHITECTURES, corpus_texts, train_tokenizer

WINDOW, BATCH = 64, 8


def _batches(data: torch.Tensor, steps: int, seed: int):  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - WINDOW - 1, (BATCH,), generator=generator)
        yield torch.stack([data[s : s + WINDOW] for s in starts.tolist()])


def main() -> None:
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--target-steps", type=int, default=300)
    parser.add_argument("--draft-steps", type=int, default=300)
    args = parser.parse_args()
    torch.manual_seed(0)
    texts = corpus_texts()
    tokenizer = train_tokenizer(texts)
    data = torch.tensor([t for text in texts for t in tokenizer(text)["input_ids"]])

    target = AutoModelForCausalLM.from_config(ARCHITECTURES["llama-14m"]())
    optimizer = torch.optim.AdamW(target.parameters(), lr=2e-3)
    started = time.time()
    for step, inputs in enumerate(_batches(data, args.target_steps, seed=1)):
        loss = target(input_ids=inputs, labels=inputs).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"target step {step} loss {loss.item():.3f} ({time.time() - started:.0f} s)")
    target.eval()

    draft = AutoModelForCausalLM.from_config(ARCHITECTURES["llama-2m"]())
    optimizer = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    for step, inputs in enumerate(_batches(data, args.draft_steps, seed=2)):
        with torch.no_grad():
            teacher = functional.log_softmax(target(input_ids=inputs).logits, dim=-1)
        student = functional.log_softmax(draft(input_ids=inputs).logits, dim=-1)
        loss = functional.kl_div(student, teacher, log_target=True, reduction="batchmean")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"draft step {step} KL {loss.item():.3f} ({time.time() - started:.0f} s)")
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(args.out / name)
        tokenizer.save_pretrained(args.out / name)
    print(args.out)


if __name__ == "__main__":
    main()
