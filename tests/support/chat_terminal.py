"""``edgespec chat`` on a pseudo-terminal, as a user's shell runs it: the chat tests' and the
default model's tests' driver."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import sys
from collections.abc import Iterator
from pathlib import Path


class Terminal:
    """Reads a pseudo-terminal's output; ``until`` returns once ``needle`` appears after what
    earlier calls consumed (bounded: at most ``limit`` waits of a second each)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.seen = b""
        self.consumed = 0

    def until(self, needle: bytes, limit: int = 120) -> None:
        for _ in range(limit):
            found = self.seen.find(needle, self.consumed)
            if found >= 0:
                self.consumed = found + len(needle)
                return
            ready, _, _ = select.select([self.fd], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                self.seen += chunk
        raise AssertionError(f"{needle!r} never came; got {self.seen[-300:]!r}")


@contextlib.contextmanager
def chat_on_terminal(
    args: list[str], *, cwd: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[int, Terminal]]:
    """``edgespec chat ARGS`` in a child on a pseudo-terminal: (its pid, its terminal); the
    child is killed and reaped on the way out."""

    pid, fd = pty.fork()
    if pid == 0:  # the child: the chat on a terminal
        # A job started in the background inherits SIGINT ignored, and Python keeps an ignored
        # SIGINT ignored: give the chat the terminal's default, as a user's shell does.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.chdir(cwd)
        argv = [sys.executable, "-m", "edgespec", "chat", *args]
        os.execve(sys.executable, argv, os.environ if env is None else env)
    try:
        yield pid, Terminal(fd)
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


def interrupt_the_answer_then_exit(pid: int, terminal: Terminal, streamed: int = 0) -> None:
    """Once more than ``streamed`` bytes of the answer came: Ctrl-C keeps the session, and
    /exit leaves with status 0."""
    while len(terminal.seen) <= terminal.consumed + streamed:  # the answer is streaming
        terminal.seen += os.read(terminal.fd, 1)
    os.kill(pid, signal.SIGINT)
    terminal.until(b"[answer stopped; Ctrl-C again or Ctrl-D leaves]")
    terminal.until(b"> ")
    os.write(terminal.fd, b"/exit\n")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
