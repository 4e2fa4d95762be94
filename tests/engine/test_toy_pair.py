"""The toy pair the tests use by default (tests/fixtures/toy_pair, via $EDGESPEC_TARGET and
$EDGESPEC_DRAFT set in conftest): its build record, exact speculation, and the prompt sets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from edgespec.errors import ConfigError
from edgespec.manifest import load_bundle
from edgespec.measure.bench import PROMPT_SETS_DIR, load_prompt_set, load_prompts
from edgespec.runtime.model import OnnxModel

from support.toy_pair import TOY_PAIR


def test_toy_pair_has_its_build_record() -> None:
    target, draft = load_bundle(TOY_PAIR / "target"), load_bundle(TOY_PAIR / "draft")
    assert target.manifest.tokenizer.sha256 == draft.manifest.tokenizer.sha256
    total = sum(f.stat().st_size for d in (target.root, draft.root) for f in d.iterdir())
    assert total <= 40 * 1000 * 1000
    for bundle in (target, draft):
        build = bundle.manifest.extra["builtin_pair"]
        training = build["training"]
        assert training["settings"]["seed"] == 0
        assert len(training["corpus"]["sha256"]) == 64
        assert training["corpus"]["validation_files"] > 0
        assert training["validation"]["target_loss"] > 0
        selection = build["selection"]
        chosen = selection["table"][selection["chosen_target"]]
        assert chosen["identical_output"] is True
        assert 0 < chosen["alpha_k4"] <= 1
    # The shipped target passed the batch invariance check that exact verification needs.
    assert target.manifest.verification.batch_invariant is True
    assert 15e6 <= training["parameters"]["target"] <= 30e6
    assert 1e6 <= training["parameters"]["draft"] <= 3e6


def test_prompt_sets_are_held_out_third_party_code() -> None:
    code, edit = load_prompts("code"), load_prompts("edit")
    assert len(code) >= 30 and len(edit) >= 10
    sources = [item["source"] for item in json.loads((PROMPT_SETS_DIR / "code.json").read_text())]
    # Not the standard library the pair was trained on.
    assert all(s.split("/")[0] in {"click", "jinja2", "packaging"} for s in sources)
    # An edit prompt holds a whole function and starts its copy: the answer repeats the prompt.
    assert all("_v2(" in prompt for prompt in edit)
    # The chat sets are user messages for the chat template; chat-edit rewrites the functions.
    chat, chat_edit = load_prompt_set("chat"), load_prompt_set("chat-edit")
    assert chat.chat and chat_edit.chat and not load_prompt_set("edit").chat
    assert len(chat.prompts) >= 10 and len(chat_edit.prompts) == len(edit)
    assert all("```python" in prompt for prompt in chat_edit.prompts)


def test_load_prompts_rejects_unreadable_and_empty(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="one of the sets code, edit"):
        load_prompts(str(tmp_path / "absent.txt"))
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(ConfigError, match="holds no prompts"):
        load_prompts(str(tmp_path / "empty.json"))


def test_generate_with_no_model_arguments(tmp_path: Path) -> None:
    """No --target: the bundles $EDGESPEC_TARGET and $EDGESPEC_DRAFT name, from outside the
    checkout."""
    script = shutil.which("edgespec")
    assert script is not None
    result = subprocess.run(
        [script, "generate", "def fibonacci(n):", "--max-new-tokens", "24", "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert len(output["tokens"]) == 24 and output["text"]
    assert output["stats"]["rounds"] < 24  # drafts were accepted


def test_toy_speculation_equals_target_greedy() -> None:
    from edgespec.api import Engine

    engine = Engine.load()
    assert engine.default_k == engine.build_record["selection"]["recommended_k"]
    for prompt in load_prompts("code")[:4] + load_prompts("edit")[:2]:
        plain = engine.generate(prompt, drafter="none", max_new_tokens=48)
        for drafter, k in (("model", None), ("ngram", None), ("combined", 6)):
            speculative = engine.generate(prompt, drafter=drafter, k=k, max_new_tokens=48)
            assert speculative.tokens == plain.tokens


def session_threading(model: Any) -> tuple[int, str]:
    options = model.session.get_session_options()
    return options.intra_op_num_threads, options.get_session_config_entry(
        "session.intra_op.allow_spinning"
    )


def test_verifying_session_spins_and_a_local_draft_takes_one_thread() -> None:
    from edgespec.api import Engine

    engine = Engine.load(threads=2, measure_energy=False)
    assert session_threading(engine.pair.target) == (2, "1")
    assert session_threading(engine.pair.draft) == (1, "0")
    polite = Engine.load(threads=2, spinning=False, measure_energy=False)
    assert session_threading(polite.pair.target) == (2, "0")
    assert session_threading(polite.pair.draft) == (2, "0")
    # Verifying remotely, the draft is the only local session: it spins with every thread.
    from edgespec.engine.loading import THREADED_DRAFT_BYTES, LoadRequest, session_options

    _, alone = session_options(LoadRequest(threads=2), local_target=False, context=64)
    assert (alone.intra_op_threads, alone.spinning) == (2, True)
    # A large draft beside a local target takes the target's threads, without spinning.
    large = THREADED_DRAFT_BYTES + 1
    target, beside = session_options(
        LoadRequest(threads=2), local_target=True, context=64, draft_weight_bytes=large
    )
    assert (beside.intra_op_threads, beside.spinning, beside.exact_passes) == (2, False, False)
    # ... and the target's threads stop spinning when its pass ends, leaving the cores to it.
    assert (target.spinning, target.stop_spinning_after_run) == (True, True)
    assert not session_options(LoadRequest(threads=2), local_target=True, context=64)[
        0
    ].stop_spinning_after_run
    stopping = OnnxModel(engine.pair.target.bundle, options=target)
    config = stopping.session.get_session_options().get_session_config_entry
    assert config("session.force_spinning_stop") == "1"
    # Spinning or not, a pass computes the same thing.
    prompt = load_prompts("code")[0]
    fast = engine.generate(prompt, max_new_tokens=24)
    assert polite.generate(prompt, max_new_tokens=24).tokens == fast.tokens


def test_pair_defaults_to_the_configured_pair(capsys: pytest.CaptureFixture[str]) -> None:
    from edgespec.cli import main

    assert main(["pair", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["compatible"] is True
    assert main(["pair", str(TOY_PAIR / "draft")]) == 1
    assert "pair got a DRAFT but no TARGET" in capsys.readouterr().err


def test_build_script_holds_out_whole_files(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from train_pair import TrainSettings, split_corpus

    corpus = split_corpus(tmp_path, TrainSettings())
    train, validation = set(corpus["train_files"]), set(corpus["validation_files"])
    assert train and validation and not train & validation
    assert not any(name.startswith(("test/", "idlelib/")) for name in train | validation)
    # The record is written once and reused, so a resumed build sees the same split.
    assert split_corpus(tmp_path, TrainSettings()) == corpus
