"""``edgespec chat``: a conversation through the bundle's chat template.

Answers stream as they are committed (accepted draft tokens coloured, as in ``generate``).
Commands: ``/reset`` (forget the history), ``/stats`` (the last answer's tokens/s, alpha and
draft lengths), ``/help``, ``/exit``; any other ``/word`` is answered "unknown command", not
sent to the model. An answer runs to the model's end of turn, bounded by the context, unless
``--max-new-tokens`` bounds it (an answer cut there says so). Ctrl-C stops the current answer
and keeps the session; Ctrl-C at the prompt or Ctrl-D leaves. When stdin is not a terminal,
each line is one message and gets one answer (``--json``: one JSON object per answer, on one
line). The history is cut from the front, with a notice, when it would pass the context
limit. A message that cannot be answered (too long for the context even alone, a remote
target that went away, a budget refusal) gets a notice, and the session, its history and the
next messages go on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from edgespec.cli.engine_args import (
    add_decoding_arguments,
    add_engine_arguments,
    check_generation_options,
    generation_options,
    load_engine,
)

COMMANDS = (
    "/reset forgets the conversation, /stats shows the last answer's figures, /read FILE puts "
    "a file in your next message, /help lists the commands, /exit leaves"
)
#: A message whose first word looks like this is a command, never a prompt ("/usr/bin/env ..."
#: has a second slash and is sent as a message).
COMMAND_WORD = re.compile(r"/[A-Za-z][\w-]*")


def add_chat_command(commands: Any) -> None:
    chat = commands.add_parser(
        "chat",
        help="an interactive conversation through the bundle's chat template (streams)",
        description="Chat with the target through its chat template, with speculative "
        f"decoding. {COMMANDS}. Ctrl-C stops an answer; Ctrl-C again or Ctrl-D leaves. With "
        "stdin not a terminal, each line is one message.",
    )
    chat.add_argument(
        "name",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="a model of the catalog by name ('edgespec models'), the same as --model MODEL",
    )
    add_engine_arguments(chat)
    add_decoding_arguments(chat, max_new_tokens=None)
    chat.add_argument(
        "--system", default=None, metavar="TEXT", help="a system message opening the conversation"
    )
    chat.add_argument(
        "--no-color", action="store_true", help="do not colour text that came from accepted drafts"
    )
    chat.add_argument(
        "--json",
        action="store_true",
        help="print each answer as one JSON line: text, finish_reason, tokens (no streaming)",
    )
    chat.set_defaults(handler=run_chat, check=check_generation_options, chat=False)


@dataclass
class Conversation:
    """The messages so far (the system message first, if any) and the last answer's stats."""

    system: str | None
    messages: list[dict[str, str]] = field(default_factory=list)
    last_stats: Any = None
    #: The last answer was stopped with Ctrl-C (its figures were never taken).
    stopped: bool = False
    #: Files read with /read for the next message: (name, text).
    attached: list[tuple[str, str]] = field(default_factory=list)

    def turns(self, user: str) -> list[dict[str, str]]:
        opening = [{"role": "system", "content": self.system}] if self.system else []
        return [*opening, *self.messages, {"role": "user", "content": user}]

    def with_attached(self, message: str) -> str:
        """``message`` after the files read for it, each in a fenced block under its name."""
        parts = [f"{name}:\n```\n{text.rstrip()}\n```" for name, text in self.attached]
        return "\n\n".join([*parts, message])

    def reset(self) -> None:
        self.messages.clear()
        self.last_stats = None
        self.stopped = False
        self.attached.clear()


#: The least room an answer without --max-new-tokens keeps in the context: the oldest exchanges
#: are dropped to leave at least this much (or a quarter of a small context).
MIN_ANSWER_ROOM = 512


def answer_room(engine: Any, max_new_tokens: int | None) -> int:
    """The tokens the history must leave for an answer."""
    if max_new_tokens is not None:
        return max_new_tokens
    return min(MIN_ANSWER_ROOM, engine.max_length // 4)


def prompt_ids(engine: Any, conversation: Conversation, user: str, room: int) -> list[int]:
    """The templated conversation's token ids, dropping the oldest exchanges until it leaves
    ``room`` tokens for the answer (a notice says how many were dropped). A message that does
    not fit even alone raises :class:`ContextLimitError` before any exchange is dropped."""
    from edgespec.errors import ContextLimitError

    alone = engine.apply_chat_template(Conversation(system=conversation.system).turns(user))
    length = len(engine.tokenizer.encode(alone, add_special_tokens=False).ids)
    if length + room > engine.max_length:
        raise ContextLimitError(
            f"this message takes {length} tokens with the chat template, which leaves no room "
            f"for a {room}-token answer in the context of {engine.max_length} tokens",
            fix="shorten the message (or pass a smaller --max-new-tokens)",
        )
    dropped = 0
    while True:
        text = engine.apply_chat_template(conversation.turns(user))
        ids = list(engine.tokenizer.encode(text, add_special_tokens=False).ids)
        if len(ids) + room <= engine.max_length or not conversation.messages:
            break
        del conversation.messages[:2]  # one user message and its answer
        dropped += 1
    if dropped:
        notice = f"[the {dropped} oldest exchange(s) were dropped to fit the context]"
        print(notice, file=sys.stderr, flush=True)
    return ids


def answer(
    engine: Any, ids: list[int], options: dict[str, Any], out: TextIO, *, color: bool, as_json: bool
) -> Any:
    """Streams one answer (or prints it as one JSON line) and returns its Result."""
    generation = engine.stream_deltas(ids, **options)
    for delta in generation:
        if not as_json:
            out.write(f"\033[36m{delta.text}\033[0m" if color and delta.drafted else delta.text)
            out.flush()
    result = generation.result
    if as_json:
        reply = {"text": result.text, "finish_reason": result.finish_reason}
        reply["tokens"] = len(result.tokens)
        out.write(json.dumps(reply, ensure_ascii=False))
    out.write("\n")
    out.flush()
    return result


def turn(
    engine: Any,
    conversation: Conversation,
    message: str,
    options: dict[str, Any],
    *,
    color: bool,
    as_json: bool = False,
) -> None:
    """One exchange; Ctrl-C stops it (the message is then not kept) and the session goes on,
    as it does when this message cannot be answered (a notice says why)."""
    from edgespec.errors import BudgetError, ContextLimitError, RemoteError

    bound = options["max_new_tokens"]
    message = conversation.with_attached(message)
    conversation.attached.clear()
    try:
        ids = prompt_ids(engine, conversation, message, answer_room(engine, bound))
        # Without a bound, the answer may use the rest of the context (at least one token,
        # so that a message too long even alone is refused by the context check).
        chosen = {**options, "max_new_tokens": bound or max(engine.max_length - len(ids), 1)}
        result = answer(engine, ids, chosen, sys.stdout, color=color, as_json=as_json)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        sys.stdout.flush()
        print("[answer stopped; Ctrl-C again or Ctrl-D leaves]", file=sys.stderr, flush=True)
        conversation.stopped = True
        return
    except (ContextLimitError, RemoteError, BudgetError) as error:
        note(f"[this message was not answered: {error}; the conversation goes on]")
        return
    if result.error is not None:
        note(f"[the answer stopped: {result.error}; it was not kept, the conversation goes on]")
        return
    if result.finish_reason == "max_new_tokens":
        if bound is None:
            note("[answer cut at the end of the context; /reset starts a new conversation]")
        else:
            note(f"[answer cut at {bound} tokens; pass --max-new-tokens N for longer answers]")
    conversation.messages += [
        {"role": "user", "content": message},
        {"role": "assistant", "content": result.text},
    ]
    conversation.last_stats = result.stats
    conversation.stopped = False


def note(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def stats_line(stats: Any) -> str:
    """The last answer's figures in words: alpha is the share of the tested draft tokens the
    target accepted, then how many tokens the rounds drafted (most frequent first; a drafter
    that prices its own rounds drafts less than its k)."""
    if stats is None:
        return "[no answer yet]"
    alpha = "n/a" if stats.alpha is None else f"{stats.alpha:.0%} of draft tokens accepted"
    drafted: Counter[int] = Counter()
    for outcome, n in stats.round_outcomes.items():  # "drafted,accepted,draft steps"
        drafted[int(outcome.split(",")[0])] += n
    counts = sorted(drafted.items(), key=lambda item: (-item[1], -item[0]))
    rounds = ", ".join(f"{k} in {n} round{'s' * (n != 1)}" for k, n in counts) or "n/a"
    return (
        f"[{stats.new_tokens} tokens, {stats.tokens_per_s or 0:.1f} tokens/s, alpha {alpha}; "
        f"tokens drafted per round: {rounds}]"
    )


def command_note(word: str, conversation: Conversation, argument: str = "") -> str:
    """Runs the command ``word`` (other than /exit) with ``argument`` (the rest of the line)
    and returns the line that answers it."""
    if word == "/reset":
        conversation.reset()
        return "[conversation reset]"
    if word == "/stats":
        if conversation.stopped:
            return "[the last answer was stopped with Ctrl-C before its figures were taken]"
        return stats_line(conversation.last_stats)
    if word == "/read":
        return read_file(conversation, argument)
    if word == "/help":
        return f"[{COMMANDS}]"
    return f"[unknown command {word}; {COMMANDS}]"


def read_file(conversation: Conversation, argument: str) -> str:
    """``/read FILE``: the file's text goes into the next message (nothing is sent yet)."""
    if not argument:
        return "[/read needs a file: /read PATH]"
    path = Path(argument).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = "not UTF-8 text" if isinstance(error, UnicodeDecodeError) else error.strerror
        return f"[{path} was not read: {reason}; the conversation goes on]"
    conversation.attached.append((path.name, text))
    return f"[{path.name} ({len(text):,} characters) goes into your next message]"


def run_chat(args: argparse.Namespace) -> int:
    from edgespec.errors import ConfigError

    if args.name is not None:
        if args.model is not None and args.model != args.name:
            raise ConfigError(
                f"chat got the model {args.name!r} and --model {args.model}", fix="name one"
            )
        args.model = args.name
    options = generation_options(args)
    engine = load_engine(args)
    if not engine.chat_template:
        raise ConfigError(
            "this bundle's tokenizer has no chat template", fix="use edgespec generate instead"
        )
    interactive = sys.stdin.isatty()
    color = not args.json and not args.no_color and sys.stdout.isatty()
    color = color and "NO_COLOR" not in os.environ
    conversation = Conversation(system=args.system)
    if interactive:
        print(f"[{COMMANDS}]", file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except (EOFError, KeyboardInterrupt):
            if interactive:
                print(file=sys.stderr)
            return 0
        message = line.strip()
        if not message:
            continue
        word = message.split(maxsplit=1)[0]
        if word == "/exit":
            return 0
        if COMMAND_WORD.fullmatch(word):
            argument = message[len(word) :].strip()
            print(command_note(word, conversation, argument), file=sys.stderr, flush=True)
            continue
        turn(engine, conversation, message, options, color=color, as_json=args.json)
