"""Remote chat equals local chat: a device that drafts for a remote target formats chats with
the target's template and system prompt, which the server tells it, whichever API it speaks."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.protocol.server_info import ChatFormat, ServerInfo

from support.servers import FAKE_PROFILE, ThreadServer
from support.toy_pair import TOY_PAIR

#: The target's own system message. The draft has none, as the default model's shipped draft
#: once had none: formatting with the draft's settings gives another prompt.
SYSTEM_PROMPT = "You are a terse assistant."
NEW_TOKENS = ["--max-new-tokens", "16", "--k", "3", "--json"]


@pytest.fixture(scope="module")
def target_with_system_prompt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chat") / "target"
    shutil.copytree(TOY_PAIR / "target", root)
    manifest_path = root / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["extra"]["system_prompt"] = SYSTEM_PROMPT
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return root


@pytest.fixture(scope="module")
def server_url(target_with_system_prompt: Path) -> Iterator[str]:
    from edgespec.server.app import create_app

    engine = Engine.load(target=target_with_system_prompt, draft=TOY_PAIR / "draft")
    with ThreadServer(create_app(engine, profile=FAKE_PROFILE)) as server:
        yield server.url


def _generate(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["generate", *argv, *NEW_TOKENS]) == 0
    captured = capsys.readouterr()
    assert "does not say how its target formats chats" not in captured.err
    result: dict[str, object] = json.loads(captured.out)
    assert result["stats"]["prompt_tokens"] > 0  # type: ignore[index]
    return result


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "plain"])
def test_local_remote_and_openai_remote_give_the_same_tokens(
    capsys: pytest.CaptureFixture[str],
    target_with_system_prompt: Path,
    server_url: str,
    chat: bool,
) -> None:
    prompt = ["--chat", "What is the capital of France?"] if chat else ["def add(a, b):"]
    draft = ["--draft", str(TOY_PAIR / "draft")]
    local = _generate(capsys, *prompt, "--target", str(target_with_system_prompt), *draft)
    remote = _generate(capsys, *prompt, *draft, "--remote", server_url)
    openai = _generate(capsys, *prompt, *draft, "--remote", server_url, "--remote-api", "openai")
    assert remote["stats"]["prompt_tokens"] == local["stats"]["prompt_tokens"]  # type: ignore[index]
    assert openai["stats"]["prompt_tokens"] == local["stats"]["prompt_tokens"]  # type: ignore[index]
    assert remote["tokens"] == local["tokens"]
    assert openai["tokens"] == local["tokens"]


def test_the_draft_alone_would_format_another_prompt(target_with_system_prompt: Path) -> None:
    """The check above can fail: the draft's own formatting gives a different prompt."""
    local = Engine.load(target=target_with_system_prompt, draft=TOY_PAIR / "draft")
    draft_only = Engine.load(target=TOY_PAIR / "draft")
    question = "What is the capital of France?"
    assert local.encode(question, chat=True) != draft_only.encode(question, chat=True)
    assert SYSTEM_PROMPT in local.apply_chat_template([{"role": "user", "content": question}])


def test_the_server_describes_its_chat_format(server_url: str) -> None:
    import httpx

    info = ServerInfo.from_json(httpx.get(server_url + "/v1/verify/info", timeout=10).json())
    assert info.chat is not None and info.chat.system_prompt == SYSTEM_PROMPT
    assert ServerInfo.from_json(info.to_json()) == info
    assert info.chat == ChatFormat.from_json(info.chat.to_json())


def test_an_engine_without_a_chat_format_is_named_once_when_a_chat_is_formatted(
    server_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from edgespec.runtime.remote.openai import OpenAITarget

    monkeypatch.setattr(OpenAITarget, "chat_format", lambda self: None)
    engine = Engine.load(
        draft=TOY_PAIR / "draft", remote=server_url, remote_api="openai", measure_energy=False
    )
    assert engine.chat_source == "draft"
    caplog.clear()  # loading said that this is 'edgespec serve' spoken to as a serving engine
    engine.encode("plain text")
    assert not caplog.records  # nothing to say before a chat is formatted
    for _ in range(2):
        engine.encode("What is the capital of France?", chat=True)
    notes = [r.message for r in caplog.records if "formats chats" in r.message]
    assert len(notes) == 1 and "chat prompts use the draft's template" in notes[0]
