"""A TCP proxy that adds a round-trip time on the wire: benchmarks and tests on loopback see
the latency of a real network between the device and its verification server.

Every chunk read from one side is written to the other half a round trip after it arrived,
in order, each direction on its own: a request and its answer together pay ``rtt_s``, and
bytes already in flight do not wait for one another (propagation delay, not a bandwidth
limit). The client and the server are unchanged: the client is pointed at :attr:`url`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType
from urllib.parse import urlsplit

from edgespec.errors import ConfigError

#: Bytes read per chunk.
CHUNK = 65536


class DelayProxy:
    """Listens on ``host`` (an ephemeral port) and forwards to the host and port of
    ``upstream`` (a URL), delaying each direction by ``rtt_s / 2``. ``url`` is ``upstream``
    with the proxy's address. Runs its event loop in a daemon thread; a context manager."""

    def __init__(self, upstream: str, *, rtt_s: float, host: str = "127.0.0.1") -> None:
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"cannot proxy {upstream!r}", fix="give an http:// or https:// URL with a host"
            )
        if rtt_s < 0:
            raise ConfigError(f"round-trip time {rtt_s} s is negative", fix="use 0 or more")
        self.rtt_s = rtt_s
        self.host = host
        self.port = 0
        self._upstream = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        self._scheme, self._path = parts.scheme, parts.path.rstrip("/")
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"{self._scheme}://{self.host}:{self.port}{self._path}"

    def start(self) -> DelayProxy:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(timeout=10) or self._server is None:
            raise RuntimeError("the delay proxy did not start")
        return self

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connect, self.host, 0)
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()  # upstream down: the client sees a dropped connection, as it would
            self._tasks.discard(task)
            return
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
            )
        finally:
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copies ``reader`` to ``writer``, each chunk due ``rtt_s / 2`` after it was read."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            try:
                while True:
                    due, data = await queue.get()
                    if not data:
                        break
                    await asyncio.sleep(max(due - loop.time(), 0.0))
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        delivery = asyncio.create_task(deliver())
        try:
            while data := await reader.read(CHUNK):
                queue.put_nowait((loop.time() + self.rtt_s / 2, data))
        except (ConnectionError, OSError):
            pass
        finally:
            queue.put_nowait((0.0, b""))
            await delivery

    def close(self) -> None:
        """Stops listening, drops open connections and ends the thread."""
        if self._thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
