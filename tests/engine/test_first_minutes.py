"""A new user's first ten minutes: each rough edge found by trying the CLI as one would."""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.engine.generation import Delta
from edgespec.errors import BundleError, ConfigError
from edgespec.manifest import file_record, load_bundle, write_manifest

from support.toy_pair import TOY_PAIR

CHECKOUT = Path(__file__).resolve().parents[2]


def _edgespec(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgespec", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=cwd,
    )


def _error_line(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 1) -> str:
    assert main(list(argv)) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgespec: error: ")
    return lines[0]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_export_without_the_extra_says_how_to_install_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_find_spec = importlib.util.find_spec

    def without_transformers(name: str, *args: object) -> object:
        return None if name == "transformers" else real_find_spec(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", without_transformers)
    line = _error_line(capsys, "export", str(tmp_path), "--out", str(tmp_path / "out"))
    assert "needs the [export] extra (transformers not installed)" in line
    assert "pip install '.[export]' in the edgespec checkout" in line
    assert not (tmp_path / "out").exists()


def test_python_dash_m_in_an_uninstalled_checkout_says_to_install_it() -> None:
    """Without an install (no site-packages here), ``python -m edgespec`` in the checkout's
    root imports the source package, whose runtime/ and export/ only an install maps in: one
    line names the fix instead of an import error deep in a command."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-S", "-m", "edgespec", "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=CHECKOUT,
        env=env,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"edgespec: error: {CHECKOUT} is a source checkout without")
    assert f"pip install -e {CHECKOUT}" in lines[0]


def test_python_dash_m_runs_the_installed_package() -> None:
    result = _edgespec("inspect", str(TOY_PAIR / "target"), cwd=TOY_PAIR)
    assert result.returncode == 0, result.stderr
    assert "parity" in result.stdout


def test_fallback_local_when_the_server_is_down_from_the_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    prompt, options = "def add(a, b):", ["--max-new-tokens", "12", "--json"]
    assert main(["generate", prompt, *options]) == 0
    local = json.loads(capsys.readouterr().out)
    # The client waits for the server until --remote-timeout (30 s by default: a server that
    # starts meanwhile loses nothing), then falls back; 2 s keeps the test short.
    remote = ["--remote", url, "--remote-timeout", "2", "--fallback", "local"]
    assert main(["generate", prompt, *options, *remote]) == 0
    captured = capsys.readouterr()
    hybrid = json.loads(captured.out)
    assert hybrid["tokens"] == local["tokens"]
    assert hybrid["stats"]["fell_back"] and not hybrid["stats"]["lossy"]
    assert "--fallback local: verifying locally (lossless)" in captured.err


class NotFoundPages(http.server.BaseHTTPRequestHandler):
    """Some other web server: every path is an HTML 404 page."""

    def do_GET(self) -> None:
        body = b"<!DOCTYPE html>\n<html>\n<head><title>404 Not Found</title></head>\n" + (
            b"<body><h1>Not Found</h1><p>The requested URL was not found.</p></body>\n</html>\n"
        )
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads the CLI's stderr, not the server's."""


@contextlib.contextmanager
def other_web_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFoundPages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_a_url_that_is_not_an_edgespec_server_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with other_web_server() as url:
        # Asked (--remote-api auto): no edgespec info route, so a serving engine, which it is
        # not either; the line names both ways.
        line = _error_line(capsys, "generate", "x", "--remote", url)
        assert f"{url} is not an OpenAI-compatible server (HTTP 404 from {url}/v1/models)" in line
        assert "--remote-api edgespec for 'edgespec serve'" in line
        line = _error_line(capsys, "generate", "x", "--remote", url, "--remote-api", "edgespec")
        assert line.startswith(
            f"edgespec: error: {url} is not an edgespec server (HTTP 404 from "
            f"{url}/v1/verify/info); pass the address 'edgespec serve' prints"
        )
        assert "--remote-api openai" in line and "html" not in line.lower()
        remote = ("--remote", url, "--remote-api", "openai")
        line = _error_line(capsys, "generate", "x", *remote)
        assert f"{url} is not an OpenAI-compatible server (HTTP 404 from {url}/v1/models)" in line


def test_a_server_that_is_down_fails_at_once_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Nothing has answered at the URL: a refused connection is a wrong address (or a server
    not started), reported at once, not retried until the deadline."""
    url = f"http://127.0.0.1:{_closed_port()}"
    assert main(["generate", "x", "--remote", url]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        f"edgespec: error: the verification server {url} did not answer GET /v1/verify/info "
        "after 1 attempt(s)"
    )
    assert "Connection refused" in lines[0] and "--fallback local/draft" in lines[0]


def test_a_closed_stdout_ends_quietly() -> None:
    """``edgespec generate --json ... | head -c 10`` once head has gone: no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        result = subprocess.run(
            [sys.executable, "-m", "edgespec", "generate", "def f():", "--json"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=300,
            cwd=TOY_PAIR,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 141, result.stderr  # as a process ended by SIGPIPE
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


def test_ctrl_c_keeps_the_streamed_text_and_ends_the_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: Engine, prompt: object, options: object) -> Iterator[Delta]:
        yield Delta(text="partial", drafted=False)
        raise KeyboardInterrupt

    monkeypatch.setattr(Engine, "stream_deltas", interrupted)
    assert main(["generate", "def f():", "--no-color"]) == 130
    captured = capsys.readouterr()
    assert captured.out == "partial\n"
    assert captured.err == "edgespec: interrupted; the text above is what was generated\n"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--k", "100"], "--k 100 is out of range; k is 0 (no drafting) to 8, or 'auto'"),
        (["--k", "-1"], "--k -1 is out of range; k is 0 (no drafting) to 8, or 'auto'"),
        (["--max-new-tokens", "-5"], "--max-new-tokens is -5; ask for at least 1 token"),
        (["--top-p", "2"], "--top-p 2.0 is outside (0, 1]"),
        (["--temperature", "nan"], "--temperature nan is not a finite number"),
        (["--draft-min-prob", "2"], "--draft-min-prob 2.0 is outside [0, 1)"),
        (["--k", "abc"], "--k 'abc' is not a number; k is 0 (no drafting) to 8, or 'auto'"),
    ],
)
def test_bad_flags_are_named_as_typed_and_are_usage_errors(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    # Exit 2, as the README says of usage errors, and before the model loads.
    for command in ("generate", "chat"):
        args = (command, "x") if command == "generate" else (command,)
        assert message in _error_line(capsys, *args, *flags, code=2)


def test_a_url_that_is_no_url_is_named_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    line = _error_line(capsys, "generate", "x", "--remote", "notaurl")
    assert "'notaurl' is not an http:// or https:// URL" in line


def test_usage_errors_of_export_and_bench_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = ("--out", str(tmp_path / "out"))
    line = _error_line(capsys, "export", str(tmp_path), *out, "--block-size", "20", code=2)
    assert "block size 20 is not a power of two" in line
    assert "--k 9 is out of range" in _error_line(capsys, "bench", "--k", "9", code=2)
    with pytest.raises(SystemExit) as exited:
        main(["export", str(tmp_path), *out, "--quant", "int2"])
    assert exited.value.code == 2
    assert "invalid choice: 'int2'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_k_rule_is_stated_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command, rule in (
        ("generate", "0 (no drafting) to 8, or auto"),
        ("bench", "0 to 8, or auto"),
    ):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert rule in " ".join(capsys.readouterr().out.split())


def test_a_file_given_as_a_bundle_is_called_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    readme = CHECKOUT / "README.md"
    line = _error_line(capsys, "generate", "x", "--target", str(readme))
    assert f"{readme} is neither a bundle directory nor a GGUF file" in line
    assert "perhaps" not in line and "holds one" not in line  # the checkout is no bundle


def test_a_damaged_gguf_file_given_as_the_target_is_one_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF file is imported by its path; one that is not readable ends in one error line
    that names it and the fix."""
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    assert main(["generate", "x", "--target", str(gguf)]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1
    assert "model.Q4_1.gguf is not a readable GGUF file" in errors[0]
    assert "download the file again" in errors[0]


def test_a_graph_onnx_runtime_cannot_load_is_a_bundle_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bundle_dir = tmp_path / "target"
    shutil.copytree(TOY_PAIR / "target", bundle_dir)
    manifest = load_bundle(bundle_dir).manifest
    graph = bundle_dir / manifest.graph.file
    graph.write_bytes(b"not an onnx graph" * 64)
    # The checksum is rewritten to match: the bytes are "right", the graph is not.
    files = tuple(
        file_record(bundle_dir, r.path, r.role) if r.path == manifest.graph.file else r
        for r in manifest.files
    )
    write_manifest(bundle_dir, dataclasses.replace(manifest, files=files))
    line = _error_line(capsys, "inspect", str(bundle_dir))
    assert f"ONNX Runtime cannot load {graph}" in line and "re-export the bundle" in line
    with pytest.raises(BundleError, match="ONNX Runtime cannot load"):
        Engine.load(target=bundle_dir, draft=TOY_PAIR / "draft")


def test_doctor_fails_on_a_missing_target_and_words_its_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["doctor", "--target", str(tmp_path / "nonexistent"), "--no-measure"]) == 1
    report = capsys.readouterr().out
    assert "does not exist" in report
    assert "None%" not in report and "plugged=None" not in report
    assert main(["doctor", "--no-measure"]) == 0
    report = capsys.readouterr().out
    assert "quant      int4 (matmul_nbits): keep it (the estimate fits" in report
    assert "battery    " in report and "→ keep" not in report


def test_options_have_help_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    expected = {
        "generate": ("--max-new-tokens N", "default 128", "--seed", "--power-budget-w W"),
        "doctor": ("--target DIR", "default: the default model", "--draft DIR"),
        "bench": ("--drafter", "--repeats", "default 1"),
        "info": ("ONNX Runtime distributions installed",),
    }
    for command, needles in expected.items():
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for needle in needles:
            assert needle in text, (command, needle)


def test_api_errors_name_parameters_and_the_cli_names_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine = Engine.load()
    with pytest.raises(ConfigError, match="max_new_tokens is -5"):
        engine.generate("x", max_new_tokens=-5)
    assert "--max-new-tokens is -5" in _error_line(
        capsys, "generate", "x", "--max-new-tokens", "-5", code=2
    )


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"])
def test_a_blank_prompt_is_a_usage_error_before_any_model_loads(
    prompt: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A target that cannot load: the refusal must come first (no fetch, no import).
    monkeypatch.setenv("EDGESPEC_TARGET", "/nonexistent/bundle")
    assert main(["generate", prompt]) == 2
    assert main(["generate", "--model", "gemma3-270m", prompt]) == 2
    assert "the prompt is empty or only whitespace" in capsys.readouterr().err
