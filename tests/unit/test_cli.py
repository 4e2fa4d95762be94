"""The installed console script, ``python -m edgespec``, and the light commands."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgespec.cli import main
from edgespec.cli.main import build_parser
from edgespec.config import ExportConfig, resolve_quant
from edgespec.errors import ConfigError
from edgespec.manifest import load_bundle

from support.fake_bundle import make_bundle


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
    assert "'auto' (kernel on the GGUF kernels, else plain)" in text
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
    assert "sha256 checksums as the manifest records" in out and "counts again" not in out
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


def _with_check(manifest: Any, *, top1: float, greedy: int, llama: dict | None = None) -> Any:
    from dataclasses import replace

    from edgespec.verification import ParityResult, VerificationRecord

    parity = ParityResult(
        prompts=3,
        positions=48,
        max_abs_logit_diff=15.2,
        logit_tolerance=None,
        top1_agreement=top1,
        min_top1_agreement=0.8,
        greedy_tokens=36,
        greedy_match_tokens=greedy,
        greedy_divergence_margins=(),
        required=("top1",),
        passed=top1 >= 0.8,
    )
    extra = {**manifest.extra, "llama_cpp_agreement": llama or {"checked": False}}
    return replace(
        manifest,
        source=replace(manifest.source, kind="gguf"),
        quantization=replace(manifest.quantization, scheme="gguf_blocks"),
        verification=VerificationRecord(performed=True, providers=(), parity=parity),
        extra=extra,
    )


def test_inspect_says_in_one_sentence_whether_a_bundle_is_faithful(tmp_path: Path) -> None:
    from edgespec.cli.bundles import faithfulness

    manifest = load_bundle(make_bundle(tmp_path / "b")).manifest
    assert faithfulness(manifest) == "not checked: exported with --no-verify"
    exact = faithfulness(_with_check(manifest, top1=1.0, greedy=36))
    assert exact.startswith("faithful: its greedy tokens are those of a float64 computation")
    # The 1.5B's import: near-ties tipped by 8-bit activations; llama.cpp not compared.
    tipped = faithfulness(_with_check(manifest, top1=0.9375, greedy=24))
    assert tipped.startswith("close to the file: its top token is that of a float64")
    assert "at 45 of 48 checked positions, greedy 24/36 tokens" in tipped
    assert "not compared with llama.cpp's own output" in tipped
    # The 1.5B's import: one position of 48 differs from llama.cpp, whose own two paths agree
    # everywhere, but by a lead far below how much those paths move a logit.
    llama = {
        "checked": True,
        "top1_agreement": 47 / 48,
        "max_abs_logit_diff": 0.6848,
        "llama_cpp_self_agreement": 1.0,
        "disagreement_margin": 0.016,
        "llama_cpp_self_max_abs_logit_diff": 0.869,
    }
    assert faithfulness(_with_check(manifest, top1=0.9375, greedy=24, llama=llama)) == (
        "faithful: its top token is llama.cpp's own on 97.9% of the checked positions, its "
        "logits within 0.68 of llama.cpp's; where they differ, near-ties (llama.cpp's token led "
        "by 0.016, less than the 0.87 its own two paths differ by)"
    )
    astray = {
        "checked": True,
        "top1_agreement": 0.80,
        "llama_cpp_self_agreement": 0.958,
        "disagreement_margin": 2.5,
        "llama_cpp_self_max_abs_logit_diff": 0.9,
    }
    assert faithfulness(_with_check(manifest, top1=0.9, greedy=30, llama=astray)).startswith(
        "differs from llama.cpp more than llama.cpp differs from itself"
    )
    assert faithfulness(_with_check(manifest, top1=0.5, greedy=3)).startswith("NOT faithful")
