"""A draft with a head over its most used tokens (edgespec.export.draft_head): the head's
rows are the file's own, the kept tokens score as with the full head, and speculation with
it stays exact; a draft steps unpadded while its target keeps its padding."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.export import draft_head
from edgespec.graph.kernels import attends_on_kernel
from edgespec.manifest import load_bundle

pytestmark = pytest.mark.integration

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\n\nfor name in os.listdir('.'):\n    print(name)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
] * 4


def test_kept_tokens_are_the_most_counted_then_by_id_with_end_of_turn_first() -> None:
    counts = np.array([5, 0, 9, 9, 1, 0, 3])
    assert draft_head.kept_tokens(counts, 3, always=()).tolist() == [0, 2, 3]
    assert draft_head.kept_tokens(counts, 3, always=(5,)).tolist() == [2, 3, 5]
    assert draft_head.kept_tokens(counts, 3, always=(5,)).dtype == np.int64
    assert draft_head.corpus_coverage(np.array([2, 3]), [2, 3, 3, 4]) == 0.75


def test_the_standard_library_corpus_is_read_in_order_up_to_its_limit() -> None:
    texts = list(draft_head.corpus_texts(limit=50_000))
    assert texts and sum(map(len, texts)) >= 50_000
    assert sum(map(len, texts[:-1])) < 50_000
    assert texts == list(draft_head.corpus_texts(limit=50_000))


@pytest.fixture(scope="module")
def files(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    from support.gguf_model import write_llama_gguf

    root = tmp_path_factory.mktemp("draft_head")
    full = write_llama_gguf(tiny_model("llama"), root / "full.gguf", weight_type="Q8_0")
    reduced, record = draft_head.reduced_head_gguf(full, root / "reduced.gguf", 48, CORPUS)
    bundles = {}
    for name, path in (("full", full), ("reduced", reduced)):
        out = root / f"{name}-bundle"
        assert main(["export", str(path), "--out", str(out), "--quiet", "--max-length", "256"]) == 0
        bundles[f"{name}-bundle"] = out
    return {"full": full, "reduced": reduced, "record": record, **bundles}


def test_the_reduced_head_is_the_files_own_rows_and_scores_as_the_full_head(files: dict) -> None:
    from gguf import GGUFReader

    from edgespec.export.gguf.check import reference_logits
    from edgespec.export.gguf.reader import open_gguf
    from edgespec.manifest import UNSCORED_LOGIT

    reduced = open_gguf(files["reduced"])
    kept = np.array(reduced.architecture.output_vocabulary)
    assert len(kept) == 48 and (np.diff(kept) > 0).all()
    assert files["record"]["output_vocabulary"] == 48
    assert "given texts" in files["record"]["output_vocabulary_made_by"]
    heads = {
        name: next(t for t in GGUFReader(str(files[name])).tensors if t.name == "output.weight")
        for name in ("full", "reduced")
    }
    assert np.array_equal(np.asarray(heads["reduced"].data), np.asarray(heads["full"].data)[kept])
    tokens = [3, 9, 27, 4, 11]
    logits = reference_logits(reduced, tokens)
    assert (np.delete(logits, kept, axis=1) == UNSCORED_LOGIT).all()
    full_logits = reference_logits(open_gguf(files["full"]), tokens)
    # float64 references: numpy's BLAS may sum a 48-row head and the full one in other orders
    np.testing.assert_allclose(logits[:, kept], full_logits[:, kept], rtol=0, atol=1e-9)
    assert load_bundle(files["reduced-bundle"]).manifest.extra["gguf"]["output_vocabulary"] == 48


def test_speculation_with_the_reduced_head_equals_target_only(files: dict) -> None:
    engine = Engine.load(target=files["full-bundle"], draft=files["reduced-bundle"])
    # The draft steps one row at a time; the target keeps its graph's padding, which its
    # attention on edgespec's kernel does not need (ONNX Runtime's plain attention does).
    assert engine.draft is not None and engine.target is not None
    assert engine.draft.driver.graph.min_pass_width == 1
    on_kernel = attends_on_kernel(load_bundle(files["full-bundle"]).manifest.quantization.op_types)
    assert engine.target.driver.graph.min_pass_width == (1 if on_kernel else 2)
    for prompt in ("def add(a, b):\n    return", "import os\nimport sys\n\n"):
        plain = engine.generate(prompt, drafter="none", max_new_tokens=24)
        result = engine.generate(prompt, drafter="model", k=4, max_new_tokens=24)
        assert result.tokens == plain.tokens and result.stats.drafted > 0


def test_a_sampled_draft_forms_its_row_over_the_scored_ids_as_over_the_full_row(
    files: dict,
) -> None:
    from edgespec.config import SamplingConfig
    from edgespec.runtime.drafters.model import ModelDrafter
    from edgespec.runtime.sampling import probabilities

    engine = Engine.load(target=files["full-bundle"], draft=files["reduced-bundle"])
    assert engine.draft is not None
    sampling = SamplingConfig(temperature=0.8, top_k=20, seed=3)
    drafter = ModelDrafter(engine.draft, vocab_size=engine.vocab_size)
    prompt = engine.encode("def add(a, b):\n    return")
    drafter.begin(prompt, sampling=sampling, rng=np.random.default_rng(5))
    cache = engine.draft.new_cache()
    engine.draft.start(prompt, cache)
    draft = drafter.propose(4)
    assert drafter._scored_ids is not None and len(drafter._scored_ids) == 48
    assert draft.q_draft is not None and len(draft.tokens) == 4
    feed = [prompt[-1]]
    for token, q in zip(draft.tokens, draft.q_draft, strict=True):
        full = probabilities(engine.draft.forward(feed, cache, last_only=True)[-1], sampling)
        np.testing.assert_allclose(q, full, rtol=1e-6, atol=1e-12)
        assert q[token] > 0 and set(np.flatnonzero(q)) <= set(drafter._scored_ids.tolist())
        feed = [token]
    # A sampled speculative generation through the reduced head ends as it should.
    result = engine.generate(prompt, drafter="model", k=3, temperature=0.8, max_new_tokens=16)
    assert result.stats.new_tokens == 16 and result.stats.drafted > 0


def test_the_catalog_names_the_draft_head() -> None:
    from edgespec.models import catalog

    pair = catalog.find("qwen2.5-coder-1.5b")
    assert pair.draft_head_tokens > 0
    assert pair.draft_label == (
        f"qwen2.5-coder-0.5b ({pair.draft_head_tokens:,}-token 4-bit head, 4-bit layers)"
    )
    assert catalog.find("qwen2.5-coder-0.5b").draft_label == "prompt lookup"


def test_a_catalog_draft_takes_4_bit_layers_and_head_and_stays_exact(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    """The catalog's draft form: the reduced head's copy also re-quantizes the layers' Q5_0
    blocks and the head's rows as Q4_0 (the embedding, looked up a row at a time, keeps its
    own); speculation with it over the Q5_0 target equals target-only decoding, with the draft
    on either form of attention a GGUF import takes on the kernels."""
    from gguf import GGUFReader

    from edgespec.models import catalog

    from support.gguf_model import write_llama_gguf

    full = write_llama_gguf(tiny_model("llama"), tmp_path / "full.gguf", weight_type="Q5_0")
    reduced, record = draft_head.reduced_head_gguf(
        full,
        tmp_path / "reduced.gguf",
        48,
        CORPUS,
        requantize=catalog.DRAFT_REQUANTIZE,
        head_type=catalog.DRAFT_HEAD_TYPE,
    )
    assert record["requantized"] == catalog.DRAFT_REQUANTIZE and record["head_type"] == "Q4_0"
    before = {t.name: t.tensor_type.name for t in GGUFReader(str(full)).tensors}
    after = {t.name: t.tensor_type.name for t in GGUFReader(str(reduced)).tensors}
    assert after["token_embd.weight"] == before["token_embd.weight"]
    layers = [name for name, kind in before.items() if kind == "Q5_0" and name.startswith("blk.")]
    assert layers and {after[name] for name in layers} == {"Q4_0"}
    assert before["output.weight"] != "Q4_0" and after["output.weight"] == "Q4_0"
    bundles = {}
    for name, path, attention in (
        ("target", full, "auto"),
        ("draft", reduced, "auto"),
        ("plain-draft", reduced, "plain"),
    ):
        out = tmp_path / name
        argv = ["export", str(path), "--out", str(out), "--quiet", "--max-length", "256"]
        assert main([*argv, "--attention", attention]) == 0
        bundles[name] = out
    assert load_bundle(bundles["draft"]).manifest.graph.kv_positions_per_token == 1
    for draft in ("draft", "plain-draft"):
        engine = Engine.load(target=bundles["target"], draft=bundles[draft])
        for prompt in ("def add(a, b):\n    return", "class Point:\n    def"):
            plain = engine.generate(prompt, drafter="none", max_new_tokens=24)
            result = engine.generate(prompt, drafter="model", k=4, max_new_tokens=24)
            assert result.tokens == plain.tokens and result.stats.accepted > 0
