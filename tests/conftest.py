"""Session-scoped tiny models and bundles, built once and shared by the integration tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support.toy_pair import TOY_PAIR

# Tests never touch a model hub: a hub id must fail fast instead of waiting on the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

# Commands and Engine.load() without a target use the toy pair (19M target, 2.6M draft: fast,
# and its draft exercises the model drafter); the default model's own tests unset these.
os.environ["EDGESPEC_TARGET"] = str(TOY_PAIR / "target")
os.environ["EDGESPEC_DRAFT"] = str(TOY_PAIR / "draft")

torch_available = True
try:
    import optimum.exporters.onnx  # noqa: F401
    import torch  # noqa: F401
except ImportError:
    torch_available = False


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if torch_available:
        return
    skip = pytest.mark.skip(reason="needs the [export] extra (torch, optimum-onnx)")
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_corpus() -> tuple[Any, list[int]]:
    from support.tiny_models import corpus_texts, train_tokenizer

    texts = corpus_texts()
    tokenizer = train_tokenizer(texts)
    token_ids = [token for text in texts for token in tokenizer(text)["input_ids"]]
    return tokenizer, token_ids


@pytest.fixture(scope="session")
def tiny_model(
    tmp_path_factory: pytest.TempPathFactory, tiny_corpus: tuple[Any, list[int]]
) -> Callable[[str], Path]:
    """``tiny_model("llama")`` → a saved model directory (built once per session)."""
    from support.tiny_models import build_model

    built: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("models")

    def get(architecture: str) -> Path:
        if architecture not in built:
            tokenizer, token_ids = tiny_corpus
            built[architecture] = build_model(
                architecture, root / architecture, tokenizer, token_ids
            )
        return built[architecture]

    return get


@pytest.fixture(scope="session")
def exported(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Callable[[str], Path]
) -> Callable[..., Path]:
    """``exported("llama", "int4")`` → a bundle exported through the CLI (once per session)."""
    from edgespec.cli import main

    bundles: dict[tuple[str, str, tuple[str, ...]], Path] = {}
    root = tmp_path_factory.mktemp("bundles")

    def get(architecture: str, quant: str, *extra: str) -> Path:
        key = (architecture, quant, extra)
        if key not in bundles:
            out = root / f"{architecture}-{quant}-{len(bundles)}"
            code = main(
                [
                    "export",
                    str(tiny_model(architecture)),
                    "--out",
                    str(out),
                    "--quant",
                    quant,
                    "--quiet",
                    # The optimum graph unless a test asks for another (--graph inplace).
                    *(() if "--graph" in extra else ("--graph", "optimum")),
                    *extra,
                ]
            )
            assert code == 0, f"export of {architecture} at {quant} failed"
            bundles[key] = out
        return bundles[key]

    return get


@pytest.fixture(scope="session")
def pair(exported: Callable[..., Path]) -> tuple[Path, Path]:
    """The tiny fp32 Llama target with its Mistral draft: the pair the server tests share."""
    return exported("llama", "fp32"), exported("mistral", "fp32")


@pytest.fixture(scope="module")
def local(pair: tuple[Path, Path]) -> Any:
    """A local engine on :func:`pair` (one per test module)."""
    from edgespec.api import Engine

    return Engine.load(target=pair[0], draft=pair[1])


@pytest.fixture(scope="session")
def llama_cpp() -> Any:
    """The ``llama_cpp`` module (llama-cpp-python), the reference the GGUF tests compare with."""
    return pytest.importorskip("llama_cpp", reason="needs llama-cpp-python (the engine-test extra)")
