"""The export tier's fixtures: tiny GGUF files and their bundles, built once per session and
shared by the GGUF modules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from edgespec.cli import main

from support.gguf_bundles import FORMATS, ON_MATMUL_NBITS


@pytest.fixture(scope="session")
def gguf_files(
    tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    from support.gguf_model import write_llama_gguf

    root = tmp_path_factory.mktemp("gguf")
    model = tiny_model("llama")
    files = {
        kind: write_llama_gguf(model, root / f"{kind}.gguf", weight_type=kind) for kind in FORMATS
    }
    files["F32"] = write_llama_gguf(model, root / "F32.gguf")
    files["qwen2-Q4_1"] = write_llama_gguf(
        tiny_model("qwen2"), root / "qwen2.gguf", weight_type="Q4_1"
    )
    files["qwen3-Q8_0"] = write_llama_gguf(
        tiny_model("qwen3"), root / "qwen3.gguf", weight_type="Q8_0"
    )
    files["groups3-Q4_1"] = write_llama_gguf(
        tiny_model("llama-groups-of-3"), root / "groups3.gguf", weight_type="Q4_1"
    )
    return files


@pytest.fixture(scope="session")
def gguf_bundles(
    gguf_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf_bundles")
    bundles = {}
    for kind, path in gguf_files.items():
        out = root / kind
        argv = ["export", str(path), "--out", str(out), "--quiet", "--max-length", "256"]
        argv += ["--kernels", "mlas"] if kind in ON_MATMUL_NBITS else []
        assert main(argv) == 0
        bundles[kind] = out
    out = root / "plain-Q4_1"  # 3 query heads per KV head, ONNX Runtime's attention
    argv = ["export", str(gguf_files["groups3-Q4_1"]), "--out", str(out), "--quiet"]
    assert main([*argv, "--max-length", "256", "--attention", "plain"]) == 0
    bundles["plain-Q4_1"] = out
    out = root / "Q4_1-as-fp32"
    argv = ["export", str(gguf_files["Q4_1"]), "--out", str(out), "--quant", "fp32", "--quiet"]
    assert main([*argv, "--max-length", "256"]) == 0
    bundles["Q4_1-as-fp32"] = out
    return bundles
