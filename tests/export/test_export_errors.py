"""Bad input to ``edgespec export``: one-line error, non-zero exit, and nothing written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from edgespec.cli import main

pytestmark = pytest.mark.integration


def _export_fails(
    args: list[str], workdir: Path, capsys: pytest.CaptureFixture[str], *, expect: str
) -> str:
    before = sorted(p.name for p in workdir.iterdir())
    code = main(["export", *args])
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if line.startswith("edgespec: error:")]
    assert code != 0
    assert len(error_lines) == 1, err
    assert expect in error_lines[0], error_lines[0]
    assert sorted(p.name for p in workdir.iterdir()) == before, "export left files behind"
    return error_lines[0]


def _save_config_only(config: object, directory: Path) -> Path:
    directory.mkdir()
    config.save_pretrained(directory)  # type: ignore[attr-defined]
    return directory


def test_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _export_fails(
        [str(tmp_path / "nope"), "--out", str(tmp_path / "out")],
        tmp_path,
        capsys,
        expect="does not exist",
    )
    assert "nope" in line


def test_relative_missing_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _export_fails(
        ["./missing-model", "--out", "out"],
        tmp_path,
        capsys,
        expect="model path ./missing-model does not exist",
    )


def test_file_instead_of_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    _export_fails(
        [str(tmp_path / "weights.bin"), "--out", str(tmp_path / "out")],
        tmp_path,
        capsys,
        expect="is a file, not a model directory",
    )


def test_directory_without_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    _export_fails(
        [str(tmp_path / "empty"), "--out", str(tmp_path / "out")],
        tmp_path,
        capsys,
        expect="has no config.json",
    )


def test_hub_id_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _export_fails(
        ["someone/no-such-model", "--out", str(tmp_path / "out")],
        tmp_path,
        capsys,
        expect="cannot load 'someone/no-such-model' from the Hugging Face hub",
    )


def _bert() -> object:
    from transformers import BertConfig

    return BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )


def _t5() -> object:
    from transformers import T5Config

    return T5Config(d_model=32, num_layers=1, num_heads=2)


def _mamba() -> object:
    from transformers import MambaConfig

    return MambaConfig(hidden_size=32, num_hidden_layers=1)


@pytest.mark.parametrize(
    ("make_config", "expect"),
    [
        (_bert, "is not a causal language model"),
        (_t5, "is an encoder-decoder model"),
        (_mamba, "architecture 'mamba'"),
    ],
    ids=["bert-encoder", "t5-encoder-decoder", "mamba-unsupported"],
)
def test_models_the_exporter_refuses(
    make_config: Callable[[], object],
    expect: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = _save_config_only(make_config(), tmp_path / "model")
    _export_fails([str(model), "--out", str(tmp_path / "out")], tmp_path, capsys, expect=expect)


@pytest.mark.parametrize(
    ("option", "expect"),
    [
        (["--block-size", "48"], "block size 48 is not a power of two"),
        (["--max-length", "100000"], "exceeds the model's 256 positions"),
    ],
    ids=["bad-block-size", "max-length-too-long"],
)
def test_bad_options(
    option: list[str],
    expect: str,
    tiny_model: Callable[[str], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _export_fails(
        [str(tiny_model("llama")), "--out", str(tmp_path / "out"), *option],
        tmp_path,
        capsys,
        expect=expect,
    )


def test_an_unknown_quantization_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["export", "model", "--out", str(tmp_path / "out"), "--quant", "int3"])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("edgespec: error: argument --quant: invalid choice: 'int3'")
    assert "'auto'" in line and "(see 'edgespec export --help')" in line
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_force_and_is_left_untouched(
    tiny_model: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    _export_fails(
        [str(tiny_model("llama")), "--out", str(out)],
        tmp_path,
        capsys,
        expect="already exists; pass --force",
    )
    assert (out / "mine.txt").read_text() == "keep me"


def test_failed_verification_leaves_nothing(
    tiny_model: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An int4 graph cannot agree with PyTorch at every position of a tiny model."""
    _export_fails(
        [
            str(tiny_model("llama")),
            "--out",
            str(tmp_path / "deep" / "out"),
            "--quant",
            "int4",
            "--min-top1",
            "1.0",
        ],
        tmp_path,
        capsys,
        expect="agrees with PyTorch on the top-1 token at only",
    )


def test_failed_verification_with_force_keeps_the_old_bundle(
    tiny_model: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "previous.txt").write_text("previous bundle")
    _export_fails(
        [
            str(tiny_model("llama")),
            "--out",
            str(out),
            "--force",
            "--quant",
            "int4",
            "--min-top1",
            "1.0",
        ],
        tmp_path,
        capsys,
        expect="top-1 token",
    )
    assert (out / "previous.txt").read_text() == "previous bundle"


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["export", "model-without-out"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("edgespec: error:") and "--out" in err[0]


def test_interrupted_export_leaves_nothing(
    tiny_model: Callable[[str], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C in the middle of quantization: staging directory and created parents are gone."""
    import edgespec.export.pipeline as pipeline
    import edgespec.export.recipes as recipes

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "quantize_graph", interrupted)
    monkeypatch.setattr(recipes, "quantize_graph", interrupted)  # int4 compares recipes
    code = main(
        [
            "export",
            str(tiny_model("llama")),
            "--out",
            str(tmp_path / "a" / "b"),
            "--quant",
            "int4",
            "--graph",
            "optimum",
            "--quiet",
        ]
    )
    assert code == 130
    assert "interrupted; no half-made bundle is left behind" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("model_type", ["gemma3_text", "gpt_neox", "qwen3_moe", "llama", "phi3"])
def test_model_types_optimum_registers_under_either_spelling_are_accepted(
    model_type: str,
) -> None:
    from types import SimpleNamespace

    from edgespec.export.source import check_exportable

    check_exportable(SimpleNamespace(model_type=model_type), model_type)  # raises if refused


def test_a_llama_cpp_that_dies_costs_a_gguf_import_its_agreement_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A llama-cpp-python build this CPU cannot run (its AMX kernels where the machine refuses
    tile instructions) dies of SIGILL inside llama.cpp. The agreement check runs it in a child
    process, so the import goes on and records why agreement is missing, in one line that
    names the fix; a stand-in llama_cpp that kills itself the same way shows it."""
    import numpy as np

    from edgespec.export.gguf.agreement import llama_cpp_agreement

    fake = tmp_path / "fake" / "llama_cpp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import os\nimport signal\n\n\nclass Llama:\n"
        "    def __init__(self, **_):\n        os.kill(os.getpid(), signal.SIGILL)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))  # the spawned child's path too
    record = llama_cpp_agreement(tmp_path / "model.gguf", [[1, 2, 3]], [np.zeros((3, 8))])
    assert record["checked"] is False
    reason = record["reason"]
    assert "died of SIGILL" in reason and "CMAKE_ARGS" in reason and "\n" not in reason


def test_llama_cpps_check_loads_the_file_without_its_repacked_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agreement check's llama.cpp leaves out its repacked copy of the weights (another
    0.6 GB for the 1.5B, 3 GB for a 7B beside the mapped file), so the import stays within
    its memory bound."""
    low = pytest.importorskip("llama_cpp.llama_cpp")
    from edgespec.export.gguf.agreement import _without_weight_repacking

    if "use_extra_bufts" not in {name for name, _ in low.llama_model_default_params()._fields_}:
        pytest.skip("this llama-cpp-python has no use_extra_bufts")
    monkeypatch.setattr(low, "llama_model_default_params", low.llama_model_default_params)
    assert low.llama_model_default_params().use_extra_bufts
    _without_weight_repacking()
    assert not low.llama_model_default_params().use_extra_bufts
