"""The OpenAI-compatible engine verifier: echo parsing and alignment (no models), then against
a real engine, llama-cpp-python's server on loopback (marker ``engine``; needs the
``[engine-test]`` extra: ``pip install -e ".[engine-test]"``, then ``pytest -m engine``).

The engine serves a GGUF written from the same tiny Llama that is exported as the local ONNX
target, so three things must agree token for token: the hybrid output (local draft, engine
verifies), the engine's own greedy completion, and the local target's greedy output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError, OpenAIMismatchError, RemoteError
from edgespec.runtime.remote.echo import Echo, EchoEngine, EchoVerifier, align
from edgespec.runtime.remote.openai import OpenAITarget
from edgespec.runtime.remote.pieces import TokenPieces

PROMPTS = (
    "def foo(self):\n",
    "import os\n\nclass ",
    "for i in range(10):\n    ",
    "    return ",
    "if x is None:\n",
)
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def char_pieces() -> TokenPieces:
    from support.tiny_models import char_tokenizer

    tokenizer = char_tokenizer().backend_tokenizer
    return TokenPieces(tokenizer, bos_ids=(0,), eos_ids=(1,))


def _echo(tokens: list[str], own: list[float | None], top: list[dict[str, float] | None]) -> Echo:
    return Echo(
        tokens=tuple(tokens),
        token_logprobs=tuple(own),
        top_logprobs=tuple(top),
        finish_reason="length",
    )


def test_pieces_name_tokens_by_text_and_by_id(char_pieces: TokenPieces) -> None:
    a = char_pieces.tokenizer.token_to_id("a")
    assert char_pieces.candidates("a") == [a]
    assert char_pieces.candidates("token_id:7") == [7]
    assert char_pieces.candidates("no such token") == []
    assert char_pieces.matches("a", a) and char_pieces.matches(f"token_id:{a}", a)
    assert not char_pieces.matches("b", a)


def test_align_with_every_token_listed_by_id(char_pieces: TokenPieces) -> None:
    """vLLM's shape: the BOS entry too, names ``token_id:N``, then the next token."""
    sequence = [0, *char_pieces.tokenizer.encode("ab", add_special_tokens=False).ids]
    echo = _echo(
        [f"token_id:{t}" for t in sequence] + ["token_id:9"],
        [None, -1.0, -2.0, -0.5],
        [None, {"token_id:5": -1.0}, {"token_id:5": -0.1}, {"token_id:9": -0.5}],
    )
    alignment = align(sequence, echo, char_pieces)
    assert alignment.matched == 3
    assert alignment.entries == {0: 0, 1: 1, 2: 2}


def test_align_with_bos_hidden_and_text_names(char_pieces: TokenPieces) -> None:
    """llama-cpp-python's shape: no BOS entry, tokens named by their text."""
    sequence = [0, *char_pieces.tokenizer.encode("abc", add_special_tokens=False).ids]
    echo = _echo(["a", "b", "c", "d"], [None, -1.0, -1.0, -1.0], [None, {}, {}, {}])
    alignment = align(sequence, echo, char_pieces)
    assert alignment.matched == 4
    assert alignment.entries == {1: 0, 2: 1, 3: 2}


def test_align_stops_where_the_engine_tokenized_differently(char_pieces: TokenPieces) -> None:
    """The engine echoed "ab" as one token: positions up to the first differing one keep
    their entries (the top tokens there depend on the matching prefix only)."""
    sequence = [0, *char_pieces.tokenizer.encode("xabc", add_special_tokens=False).ids]
    echo = _echo(["x", "ab", "c"], [None, -1.0, -1.0], [None, {}, {}])
    alignment = align(sequence, echo, char_pieces)
    assert alignment.matched == 2
    assert alignment.entries == {1: 0, 2: 1}


def test_an_echo_without_log_probabilities_names_the_fix() -> None:
    with pytest.raises(RemoteError, match="logits_all"):
        Echo.from_json({"choices": [{"text": "hi", "logprobs": None}]})


def test_engine_verification_is_greedy_only(char_pieces: TokenPieces) -> None:
    verifier = EchoVerifier(EchoEngine(OpenAITarget("http://127.0.0.1:9", model="m")), char_pieces)
    with pytest.raises(ConfigError, match="greedy"):
        verifier.begin(
            [0, 5], sampling=SamplingConfig(temperature=0.7), rng=np.random.default_rng(0)
        )


def test_unknown_prompt_format_is_refused() -> None:
    with pytest.raises(ConfigError, match="prompt format"):
        OpenAITarget("http://127.0.0.1:9", prompt_format="tokens")


# --- against llama-cpp-python's server ------------------------------------------------------


def _engine_available() -> None:
    pytest.importorskip(
        "llama_cpp", reason='needs the [engine-test] extra (pip install ".[engine-test]")'
    )
    pytest.importorskip(
        "gguf", reason='needs the [engine-test] extra (pip install ".[engine-test]")'
    )


@pytest.fixture(scope="module")
def char_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A character-level Llama target (as a GGUF for the engine and as an ONNX bundle) and a
    Mistral draft, trained briefly on ASCII stdlib text."""
    _engine_available()
    from edgespec.cli import main

    from support.gguf_model import write_llama_gguf
    from support.tiny_models import ascii_only, build_model, char_tokenizer, corpus_texts

    root = tmp_path_factory.mktemp("char_pair")
    tokenizer = char_tokenizer()
    token_ids = [t for text in corpus_texts() for t in tokenizer(ascii_only(text))["input_ids"]]
    built: dict[str, Path] = {}
    for name, architecture in (("target", "llama"), ("draft", "mistral")):
        model = build_model(
            architecture, root / name, tokenizer, token_ids, steps=200, vocab_size=len(tokenizer)
        )
        bundle = root / f"{name}-bundle"
        args = ["export", str(model), "--out", str(bundle), "--quant", "fp32", "--quiet"]
        assert main(args) == 0
        built[name], built[f"{name}_model"] = bundle, model
    built["gguf"] = write_llama_gguf(built["target_model"], root / "target.gguf")
    return built


@pytest.fixture(scope="module")
def llama_server(char_pair: dict[str, Path]) -> Iterator[Any]:
    from support.servers import LlamaCppServer, free_port

    with LlamaCppServer(model=char_pair["gguf"], port=free_port()) as server:
        yield server


def engine_greedy(url: str, prompt: str, max_tokens: int) -> str:
    """The engine's own greedy completion (our BOS token starts the prompt, as our tokenizer
    adds it)."""
    body = {
        "prompt": "<s>" + prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "repeat_penalty": 1.0,
    }
    answer = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    return str(answer["choices"][0]["text"])


@pytest.mark.engine
@pytest.mark.integration
@pytest.mark.parametrize("draft_name", ["draft", "target"])
def test_engine_verified_output_is_the_engines_own_greedy_output(
    char_pair: dict[str, Path], llama_server: Any, draft_name: str
) -> None:
    from edgespec.api import Engine

    hybrid = Engine.load(draft=char_pair[draft_name], remote=OpenAITarget(llama_server.url + "/v1"))
    local = Engine.load(target=char_pair["target"], draft=char_pair[draft_name])
    tested = accepted = rounds = 0
    for prompt in PROMPTS:
        result = hybrid.generate(prompt, max_new_tokens=NEW_TOKENS, k=4)
        assert result.error is None, result.error
        assert result.text == engine_greedy(llama_server.url, prompt, NEW_TOKENS)
        assert result.tokens == local.generate(prompt, max_new_tokens=NEW_TOKENS, k=4).tokens
        assert result.stats.remote["round_trips"] == result.stats.rounds
        tested += result.stats.tested
        accepted += result.stats.accepted
        rounds += result.stats.rounds
    # Both ways out of a round happened: whole drafts accepted, and drafts cut short.
    assert accepted / rounds > 1.0
    if draft_name == "draft":
        assert accepted < tested


@pytest.mark.engine
@pytest.mark.integration
def test_generate_cli_verifies_on_the_engine(
    char_pair: dict[str, Path], llama_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgespec.cli import main

    prompt = PROMPTS[0]
    code = main(
        [
            "generate",
            prompt,
            "--draft",
            str(char_pair["draft"]),
            "--remote",
            llama_server.url,
            "--remote-api",
            "openai",
            "--max-new-tokens",
            "24",
            "--k",
            "4",
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.rstrip("\n") == engine_greedy(llama_server.url, prompt, 24)


@pytest.mark.engine
@pytest.mark.integration
def test_a_text_engine_stops_where_it_cannot_verify_exactly(
    exported: Callable[..., Path], tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    """The BPE tiny Llama: its greedy tokens are not always the tokenization of their text,
    which a text-prompt engine re-tokenizes. Every result is the engine's own greedy output
    or a prefix of it with an error that says so: never a token the engine would not emit."""
    _engine_available()
    from edgespec.api import Engine

    from support.gguf_model import write_llama_gguf
    from support.servers import LlamaCppServer, free_port

    gguf_path = write_llama_gguf(tiny_model("llama"), tmp_path / "bpe.gguf")
    with LlamaCppServer(model=gguf_path, port=free_port()) as server:
        hybrid = Engine.load(draft=exported("llama", "fp32"), remote=OpenAITarget(server.url))
        for prompt in PROMPTS:
            result = hybrid.generate(prompt, max_new_tokens=NEW_TOKENS, k=4)
            reference = engine_greedy(server.url, prompt, NEW_TOKENS)
            if result.error is None:
                assert result.text == reference
            else:
                assert "tokenized" in result.error or "named exactly" in result.error
                assert reference.startswith(result.text)


@pytest.mark.engine
@pytest.mark.integration
@pytest.mark.parametrize("fallback", ["fail", "local"])
def test_an_engine_that_dies_mid_generation_loses_nothing(
    char_pair: dict[str, Path], fallback: str
) -> None:
    from edgespec.api import Engine

    from support.servers import LlamaCppServer, free_port

    prompt = PROMPTS[1]
    local = Engine.load(target=char_pair["target"], draft=char_pair["draft"])
    expected = local.generate(prompt, max_new_tokens=NEW_TOKENS, k=2)
    with LlamaCppServer(model=char_pair["gguf"], port=free_port()) as server:
        remote = OpenAITarget(server.url, retries=1, backoff_s=0.01)
        hybrid = Engine.load(
            target=char_pair["target"] if fallback == "local" else None,
            draft=char_pair["draft"],
            remote=remote,
            fallback=fallback,
        )
        generation = hybrid.stream_deltas(prompt, max_new_tokens=NEW_TOKENS, k=2)
        first = next(iter(generation))
        server.kill()
        text = first.text + "".join(delta.text for delta in generation)
    result = generation.result
    assert result is not None and result.text == text
    if fallback == "local":
        assert result.error is None and result.tokens == expected.tokens
        assert result.stats.fell_back
    else:
        assert result.error is not None and "did not answer" in result.error
        assert 0 < len(result.tokens) < len(expected.tokens)
        assert result.tokens == expected.tokens[: len(result.tokens)]


def test_an_ambiguous_text_is_not_guessed(char_pieces: TokenPieces) -> None:
    """A text no token has cannot name the engine's token."""
    verifier = EchoVerifier(EchoEngine(OpenAITarget("http://127.0.0.1:9", model="m")), char_pieces)
    with pytest.raises(OpenAIMismatchError, match="cannot be named"):
        verifier._name("no such token", [0], None)
