"""``edgespec distill`` end to end on a tiny target: the pipeline, --max-minutes and resume,
the manifest's record, exact speculation with the distilled draft, and bad input. Not
quality: a few steps on a random-weight Gemma 3 GGUF."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.manifest import load_bundle

from support.gguf_model import write_gemma3_gguf

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
    from edgespec.engine.pairing import check_pair

    from support.gguf_model import write_llama_gguf

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

    from edgespec.export.distill.torch_teacher import GgufTorchTeacher
    from edgespec.export.gguf.check import reference_logits
    from edgespec.export.gguf.reader import open_gguf

    from support.gguf_model import write_llama_gguf

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


def test_built_in_edit_requests_quote_standard_library_functions() -> None:
    """Edit requests are drawn by the seed, each an instruction and one fenced function of at
    most MAX_LINES lines, never from the packages the benchmark sets quote."""
    from edgespec.export.distill.edit_prompts import EDIT_INSTRUCTIONS, MAX_LINES, edit_requests

    requests = edit_requests(40, seed=3)
    assert len(requests) == 40 and len(set(requests)) == 40
    assert requests == edit_requests(40, seed=3) and requests != edit_requests(40, seed=4)
    for request in requests:
        instruction, _, quoted = request.partition("\n\n```python\n")
        assert instruction in EDIT_INSTRUCTIONS and quoted.endswith("\n```")
        code = quoted[: -len("\n```")].splitlines()
        assert code[0].startswith(("def ", "async def ")) and len(code) <= MAX_LINES
    assert not any(name in r for r in requests for name in ("click", "jinja2", "packaging"))
    assert edit_requests(0, seed=3) == []


def test_a_clock_cut_run_still_ends_at_a_low_learning_rate() -> None:
    from edgespec.export.distill import DistillConfig
    from edgespec.export.distill.train import _lr

    config = DistillConfig(target="t", out=Path("d"), steps=10_000, lr=1e-3)
    # Step 500 of 10,000 with the time all spent: the schedule's end, not its start.
    assert _lr(500, 1.0, config) == pytest.approx(1e-4)
    assert _lr(500, 500 / 10_000, config) > 9e-4
    assert _lr(0, 0.0, config) < 1e-3  # warm-up


def test_a_draft_can_stop_at_its_gguf_and_be_imported_elsewhere(
    target: Path, tmp_path: Path
) -> None:
    """export_bundle False (a training machine without llama.cpp): the draft GGUF carries the
    distillation record, and importing it later puts the record in the manifest."""
    from edgespec.export.distill import DistillConfig, distill

    config = DistillConfig(
        target=str(target), out=tmp_path / "draft", samples=12, prompt_tokens=16,
        new_tokens=12, batch=4, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64,
        steps=3, export_bundle=False,
    )  # fmt: skip
    made = distill(config, log=lambda line: None)
    assert isinstance(made, Path) and made.suffix == ".gguf" and not config.out.exists()
    assert main(["export", str(made), "--out", str(tmp_path / "imported")]) == 0
    record = load_bundle(tmp_path / "imported").manifest.extra["distillation"]
    assert record["steps"] == 3 and record["gguf_draft"]["file"] == made.name


def test_a_reduced_output_vocabulary_scores_only_its_tokens_and_keeps_speculation_exact(
    target: Path, tmp_path: Path
) -> None:
    """--output-vocabulary N: the draft's head scores N tokens (the rest read UNSCORED_LOGIT,
    never proposed), the kept tokens' logits equal the full head's, and greedy speculation
    with it equals target-only decoding; sampling with it runs (q is 0 off the vocabulary)."""
    import numpy as np

    from edgespec.export.distill.gguf_draft import reduce_output_vocabulary
    from edgespec.export.gguf.check import reference_logits
    from edgespec.export.gguf.reader import open_gguf
    from edgespec.manifest import UNSCORED_LOGIT

    out = tmp_path / "draft"
    command = ["distill", str(target), "--out", str(out), *SMALL, "--steps", "3"]
    assert main([*command, "--output-vocabulary", "40"]) == 0
    bundle = load_bundle(out)
    assert bundle.manifest.extra["gguf"]["output_vocabulary"] == 40
    record = bundle.manifest.extra["distillation"]
    assert record["output_vocabulary"] == 40
    assert 0 <= record["evaluation"]["output_vocabulary_coverage"] <= 1

    reduced = open_gguf(tmp_path / ".draft.distill-work" / "draft.Q8_0.gguf")
    kept = np.array(reduced.architecture.output_vocabulary)
    assert len(kept) == 40 and (np.diff(kept) > 0).all()
    full_file = tmp_path / "full.gguf"
    reduce_output_vocabulary(reduced.path, full_file, kept)  # a byte-level copy of the head
    tokens = [3, 9, 27, 4, 11]
    logits = reference_logits(reduced, tokens)
    assert (np.delete(logits, kept, axis=1) == UNSCORED_LOGIT).all()
    assert np.array_equal(logits, reference_logits(open_gguf(full_file), tokens))

    target_bundle = tmp_path / ".draft.distill-work" / "target-bundle"
    engine = Engine.load(target=target_bundle, draft=out, measure_energy=False)
    prompt = "the quick brown fox jumps"
    plain = engine.generate(prompt, drafter="none", max_new_tokens=16)
    assert engine.generate(prompt, drafter="model", k=3, max_new_tokens=16).tokens == plain.tokens
    sampled = engine.generate(prompt, drafter="model", k=3, max_new_tokens=8, temperature=0.8)
    assert len(sampled.tokens) == 8
    # Its full-width prefill buffers go back to the system instead of staying in an arena.
    from edgespec.runtime.model import OnnxModel

    assert not OnnxModel(bundle).session.get_session_options().enable_cpu_mem_arena
    assert OnnxModel(load_bundle(target_bundle)).session.get_session_options().enable_cpu_mem_arena


def test_the_reduced_vocabulary_keeps_end_of_turn_then_what_the_target_writes_most() -> None:
    import numpy as np

    from edgespec.export.distill import DistillConfig
    from edgespec.export.distill.train import frequent_tokens

    config = DistillConfig(target="t", out=Path("d"), samples=20)
    # 20 windows (one held out... two: a tenth); prompts are tokens 50, continuations 7 x3, 9.
    tokens = np.full((20, 6), -1, np.int32)
    tokens[:, :2] = 50
    tokens[:, 2:5] = 7
    tokens[:, 5] = 9
    arrays = {
        "tokens": tokens,
        "prompt_length": np.full(20, 2, np.int32),
        "window": np.arange(20, dtype=np.int32),
        "repeat": np.zeros(20, np.int32),
    }
    assert frequent_tokens(config, arrays, 3, (2,), 100).tolist() == [2, 7, 9]
    # Then the prompts' tokens, then the lowest ids.
    assert frequent_tokens(config, arrays, 6, (2,), 100).tolist() == [0, 1, 2, 7, 9, 50]
