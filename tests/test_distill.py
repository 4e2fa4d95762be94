"""``edgespec distill`` end to end on a tiny target: the pipeline, --max-minutes and resume,
the manifest's record, exact speculation with the distilled draft, and bad input. Not
quality: a few steps on a random-weight Gemma 3 GGUF."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gguf_model import write_gemma3_gguf

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.manifest import load_bundle

pytestmark = pytest.mark.integration

SMALL = [
    *("--samples", "12", "--prompt-tokens", "16", "--new-tokens", "12", "--batch", "4"),
    *("--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1"),
    *("--intermediate", "64"),
]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gemma3_gguf(tmp_path_factory.mktemp("target") / "tiny.gguf", layers=2)


def test_distill_stops_on_time_resumes_and_records_itself(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "draft"
    # A deadline already passed: one step, a checkpoint, and a draft exported all the same.
    first = ["distill", str(target), "--out", str(out), *SMALL, "--steps", "30"]
    assert main([*first, "--max-minutes", "0.000001"]) == 0
    log = capsys.readouterr().err
    assert "distill: data 12/12" in log and "--max-minutes reached at step 1" in log
    record = load_bundle(out).manifest.extra["distillation"]
    assert record["steps"] == 1 and record["stopped_early"] is True

    assert main([*first, "--force"]) == 0
    log = capsys.readouterr().err
    assert "distill: resumed at step 1 of 30" in log
    assert "distill: data" not in log  # the data were kept
    bundle = load_bundle(out)
    record = bundle.manifest.extra["distillation"]
    assert record["steps"] == 30 and record["stopped_early"] is False
    assert len(record["data_sha256"]) == 64 and record["seed"] == 0
    assert len(record["losses_every_25_steps"]) == 3  # steps 1 (the stop), 25 and 30
    evaluation = record["evaluation"]
    assert len(evaluation["alpha_by_position"]) == 8 and 0 <= evaluation["alpha"] <= 1
    assert record["c"] > 0 and 0 <= record["recommended_k"] <= 8  # measured with the target
    assert bundle.manifest.verification.performed

    # The draft serves its target: greedy speculation equals target-only decoding.
    target_bundle = tmp_path / ".draft.distill-work" / "target-bundle"
    engine = Engine.load(target=target_bundle, draft=out, measure_energy=False)
    prompt = "the quick brown fox jumps"
    plain = engine.generate(prompt, drafter="none", max_new_tokens=16)
    assert engine.generate(prompt, drafter="model", k=3, max_new_tokens=16).tokens == plain.tokens


def _error_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("edgespec: error: ")
    return lines[-1]


def test_bad_input_is_one_line(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf" * 10)
    line = _error_line(capsys, "distill", str(junk), "--out", str(tmp_path / "a"), *SMALL)
    assert "is not a readable GGUF file" in line

    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    out = tmp_path / "b"
    line = _error_line(
        capsys, "distill", str(target), "--out", str(out), "--corpus", str(empty), *SMALL
    )
    assert "the corpus holds no text" in line and not out.exists()

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    line = _error_line(capsys, "distill", str(target), "--out", str(blocker / "draft"), *SMALL)
    assert "cannot write the work directory" in line

    line = _error_line(capsys, "distill", str(target), "--out", str(out), *SMALL, "--heads", "3")
    assert "do not divide" in line


def test_short_prompts_from_a_jsonl_corpus_train_with_finite_losses(
    target: Path, tmp_path: Path
) -> None:
    """Prompts shorter than --prompt-tokens leave padded positions, which must not reach the
    loss or its gradient (they once made it NaN)."""
    import json
    import math

    corpus = tmp_path / "corpus.jsonl"
    rows = [{"prompt": "the quick brown fox"}, {"text": "the lazy dog thinks"}, {"other": 1}]
    corpus.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    out = tmp_path / "draft"
    command = ["distill", str(target), "--out", str(out), "--corpus", str(corpus), *SMALL]
    assert main([*command, "--prompt-tokens", "32", "--steps", "26"]) == 0
    record = load_bundle(out).manifest.extra["distillation"]
    assert record["corpus"] == [str(corpus)]
    # Two prompts for 12 samples: each continued greedily once, then 10 sampled repeats.
    assert record["prompt_windows"] == 2 and record["sampled_samples"] == 10
    assert all(math.isfinite(loss) for loss in record["losses_every_25_steps"])


def test_a_draft_for_a_byte_level_bpe_target_pairs_with_it(tiny_model: Any, tmp_path: Path) -> None:
    """The draft keeps the target's special tokens exactly (a Llama tokenizer class would add
    its default "<unk>", and the pair check would refuse the draft)."""
    from gguf_model import write_llama_gguf

    from edgespec.engine.pairing import check_pair

    target = write_llama_gguf(tiny_model("llama"), tmp_path / "bpe.gguf", weight_type="Q8_0")
    out = tmp_path / "draft"
    assert main(["distill", str(target), "--out", str(out), *SMALL, "--steps", "2"]) == 0
    report = check_pair(out, tmp_path / ".draft.distill-work" / "target-bundle")
    assert report.compatible, report.reason


def test_held_out_prompts_are_never_trained_on() -> None:
    import numpy as np

    from edgespec.export.distill import DistillConfig
    from edgespec.export.distill.train import _split

    config = DistillConfig(target="t", out=Path("d"), samples=60)
    arrays = {"window": np.arange(60) % 20, "repeat": np.arange(60) // 20}
    train, held = _split(config, arrays)
    held_windows = set(arrays["window"][held])
    assert len(held_windows) == 2  # a tenth of 20 windows
    assert not held_windows & set(arrays["window"][train])
    assert (arrays["repeat"][held] == 0).all()  # scored on the target's greedy path
    assert len(train) + 3 * len(held) == 60


def test_a_gguf_target_in_torch_computes_the_files_logits(tiny_model: Any, tmp_path: Path) -> None:
    """The GPU teacher: the GGUF's weights dequantized into transformers (Q/K rows back in
    its rotary order) give the logits of the file's own float64 reference, and its batched,
    left-padded greedy continuations equal one-at-a-time ones."""
    import numpy as np
    from gguf_model import write_llama_gguf

    from edgespec.export.distill.torch_teacher import GgufTorchTeacher
    from edgespec.export.gguf.check import reference_logits
    from edgespec.export.gguf.reader import open_gguf

    source = open_gguf(
        write_llama_gguf(tiny_model("llama"), tmp_path / "t.gguf", weight_type="Q8_0")
    )
    teacher = GgufTorchTeacher(source, tmp_path / "tokenizer", "cpu")
    tokens = [5, 17, 42, 8, 99, 3, 61]
    got = teacher.logits(tokens)
    assert np.abs(got - reference_logits(source, tokens)).max() < 1e-3
    prompts = [tokens, tokens[:3], tokens[2:6]]
    batched = teacher.continue_many(prompts, 6, 0.0, 0)
    assert batched == [teacher.continue_greedy(p, 6) for p in prompts]
    ids, logprobs = teacher.top_logprobs_many(
        [p + b for p, b in zip(prompts, batched, strict=True)]
    )
    assert ids.shape[:2] == (3, 13) and np.isfinite(logprobs[0]).all()
    assert int(ids[1, 2, logprobs[1, 2].argmax()]) == batched[1][0]
