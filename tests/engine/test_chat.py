"""``edgespec chat``: piped messages, commands, the history cut, and Ctrl-C on a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgespec.api import Engine

from support.chat_terminal import chat_on_terminal, interrupt_the_answer_then_exit


def _chat(stdin: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgespec", "chat", "--no-color", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        cwd=cwd,
    )


def test_piped_messages_get_one_answer_each_and_commands_work(tmp_path: Path) -> None:
    result = _chat(
        "/stats\n/frobnicate now\ndef add(a, b):\n/stats\n/help\n/reset\n/exit\nnever read\n",
        "--max-new-tokens",
        "8",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    notes = result.stderr.strip().splitlines()
    commands = "/reset forgets the conversation, /stats shows the last answer's figures"
    assert notes[0] == "[no answer yet]"
    # An unknown command is answered, not sent to the model (stdout has one answer).
    assert notes[1].startswith(f"[unknown command /frobnicate; {commands}")
    assert notes[2] == "[answer cut at 8 tokens; pass --max-new-tokens N for longer answers]"
    assert notes[3].startswith("[8 tokens, ") and "% of draft tokens accepted" in notes[3]
    assert "tokens drafted per round: " in notes[3] and "×" not in notes[3]
    assert notes[4].startswith(f"[{commands}") and "/exit leaves" in notes[4]
    assert notes[5] == "[conversation reset]"
    engine = Engine.load()
    text = engine.apply_chat_template([{"role": "user", "content": "def add(a, b):"}])
    ids = list(engine.tokenizer.encode(text, add_special_tokens=False).ids)
    expected = engine.generate(ids, max_new_tokens=8)
    assert expected.finish_reason == "max_new_tokens"
    assert result.stdout == expected.text + "\n"


def test_stats_say_what_alpha_and_k_are() -> None:
    from edgespec.cli.chat import stats_line

    outcomes = {"0,0,0": 1, "2,1,2": 1, "6,6,6": 30, "6,2,1": 28}  # drafted,accepted,steps
    stats = SimpleNamespace(new_tokens=128, tokens_per_s=181.04, alpha=0.8, round_outcomes=outcomes)
    assert stats_line(stats) == (
        "[128 tokens, 181.0 tokens/s, alpha 80% of draft tokens accepted; tokens drafted per "
        "round: 6 in 58 rounds, 2 in 1 round, 0 in 1 round]"
    )


def test_the_history_is_cut_from_the_front_with_a_notice(tmp_path: Path) -> None:
    long_message = "def f(x):\n    return x + 1\n" * 60  # several hundred tokens
    result = _chat(
        f"{long_message.replace(chr(10), ' ')}\n{long_message.replace(chr(10), ' ')}\n",
        "--max-new-tokens",
        "300",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "[the 1 oldest exchange(s) were dropped to fit the context]" in result.stderr


def test_a_message_too_long_is_refused_and_the_conversation_goes_on(tmp_path: Path) -> None:
    """One message longer than the context even alone gets a notice; the exchange before it
    stays in the history and the message after it is answered. --json: one object a line."""
    too_long = "x " * 3000
    result = _chat(
        f"def add(a, b):\n{too_long}\n/stats\nhello\n",
        "--json",
        "--max-new-tokens",
        "8",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(answers) == 2 and all(a["tokens"] == 8 for a in answers)
    assert "[this message was not answered: this message takes" in result.stderr
    assert "the conversation goes on]" in result.stderr
    assert "dropped" not in result.stderr  # nothing of the history was given up for it
    assert "[8 tokens, " in result.stderr  # /stats: the first answer's, the refused one made none


def test_chat_answers_run_to_the_end_of_the_turn_by_default() -> None:
    from edgespec.cli.main import build_parser

    assert build_parser().parse_args(["chat"]).max_new_tokens is None
    assert build_parser().parse_args(["generate", "x"]).max_new_tokens == 128


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_ctrl_c_stops_an_answer_and_keeps_the_session(tmp_path: Path) -> None:
    args = ["--max-new-tokens", "900", "--no-color", "--drafter", "none"]
    with chat_on_terminal(args, cwd=tmp_path) as (pid, terminal):
        terminal.until(b"> ")
        os.write(terminal.fd, b"class Point:\n")
        terminal.until(b"class Point:\r\n")  # the terminal's echo of the message
        interrupt_the_answer_then_exit(pid, terminal)


def test_read_puts_a_file_in_the_next_message(tmp_path: Path) -> None:
    (tmp_path / "add.py").write_text("def add(a, b):\n    return a + b\n")
    result = _chat(
        "/read add.py\n/read missing.py\nWhat does it do?\n",
        "--max-new-tokens",
        "8",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    notes = result.stderr.strip().splitlines()
    assert notes[0] == "[add.py (32 characters) goes into your next message]"
    assert notes[1].startswith("[missing.py was not read: No such file or directory")
    engine = Engine.load()
    content = "add.py:\n```\ndef add(a, b):\n    return a + b\n```\n\nWhat does it do?"
    text = engine.apply_chat_template([{"role": "user", "content": content}])
    ids = list(engine.tokenizer.encode(text, add_special_tokens=False).ids)
    assert result.stdout == engine.generate(ids, max_new_tokens=8).text + "\n"


def test_stats_after_a_stopped_answer_say_it_was_stopped() -> None:
    from edgespec.cli.chat import Conversation, command_note

    conversation = Conversation(system=None, stopped=True)
    assert command_note("/stats", conversation) == (
        "[the last answer was stopped with Ctrl-C before its figures were taken]"
    )
