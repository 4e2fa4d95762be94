"""The installed console script, ``python -m edgespec``, and the light commands."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.cli import main
from edgespec.cli.main import build_parser
from edgespec.config import ExportConfig, resolve_quant
from edgespec.errors import ConfigError

from fake_bundle import make_bundle


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Run outside the checkout, as a user of the installed package would (test_first_minutes
    # checks ``python -m edgespec`` inside the checkout).
    return subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=cwd,
    )


def test_console_script_and_module_agree(tmp_path: Path) -> None:
    script = shutil.which("edgespec")
    assert script is not None, "the edgespec console script is not installed"
    for command in ([script], [sys.executable, "-m", "edgespec"]):
        result = _run(
            *command, "export", str(tmp_path / "absent"), "--out", str(tmp_path / "o"), cwd=tmp_path
        )
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [
            f"edgespec: error: model path {tmp_path / 'absent'} does not exist; check the path, "
            "or pass a hub id"
        ]
        assert not (tmp_path / "o").exists()
    assert _run(script, "--version", cwd=tmp_path).stdout.startswith("edgespec ")


def test_export_help_states_the_default_quantization(tmp_path: Path) -> None:
    result = _run(sys.executable, "-m", "edgespec", "export", "--help", cwd=tmp_path)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "Default auto: int4 for models of 100M parameters or more, fp32 below that" in text
    assert "--quant {auto,int4,int8,int8-dynamic,fp16,fp32}" in text
    assert "(kernel on the GGUF kernels, else folded when --max-length exceeds 2048)" in text
    for option in ("--block-size", "--max-length", "--force", "--no-verify"):
        assert option in text


def test_every_command_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert len(commands) >= 11
    for command in commands:
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        assert exited.value.code == 0, command
        captured = capsys.readouterr()
        assert captured.out.startswith(f"usage: edgespec {command}") and not captured.err


def test_importing_edgespec_stays_light(tmp_path: Path) -> None:
    code = (
        "import sys, edgespec, edgespec.manifest, edgespec.engine.pairing, edgespec.runtime; "
        "print(sorted(m for m in ('torch', 'transformers', 'optimum', 'onnx', "
        "'onnxruntime') if m in sys.modules))"
    )
    assert _run(sys.executable, "-c", code, cwd=tmp_path).stdout.strip() == "[]"


def test_inspect_validates_and_summarises(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_bundle(tmp_path / "b")
    assert main(["inspect", str(root)]) == 0
    out = capsys.readouterr().out
    assert "2 layers, 2 KV heads x 16" in out and "exported with --no-verify" in out
    assert main(["inspect", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema_version"] == 1
    (root / "tokenizer.json").write_text("{}")
    assert main(["inspect", str(root)]) == 1
    assert "tokenizer.json is truncated" in capsys.readouterr().err


def test_info_reports_the_onnxruntime_build(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["info", "--json"])
    info = json.loads(capsys.readouterr().out)
    assert "CPUExecutionProvider" in info["available_providers"]
    assert code == (0 if len(info["onnxruntime_distributions"]) == 1 else 1)


def test_export_config_validation() -> None:
    with pytest.raises(ConfigError, match="unknown quantization 'int2'; use one of auto"):
        ExportConfig(model="m", out=Path("o"), quant="int2")
    with pytest.raises(ConfigError, match="accuracy level 7"):
        ExportConfig(model="m", out=Path("o"), accuracy_level=7)
    with pytest.raises(ConfigError, match="max length 8 is too short"):
        ExportConfig(model="m", out=Path("o"), max_length=8)
    with pytest.raises(ConfigError, match="outside"):
        ExportConfig(model="m", out=Path("o"), min_top1_agreement=1.5)
    with pytest.raises(TypeError):
        ExportConfig("m", Path("o"))  # type: ignore[misc]


def test_auto_quantization_threshold() -> None:
    assert resolve_quant("auto", 99_999_999) == "fp32"
    assert resolve_quant("auto", 100_000_000) == "int4"
    assert resolve_quant("int8", 10) == "int8"
