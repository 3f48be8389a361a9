"""A loopback TCP proxy that loses what the server sends, cuts connections, and lets them go
dead without a word, as a network does."""

from __future__ import annotations

import asyncio
import threading


class CutProxy:
    """A loopback TCP proxy in front of the server that can lose what the server sends
    (``blackhole``) and then cut every connection through it (``cut``), or let the connections
through it go dead, open but carrying nothing either way, closes included (``freeze``; later
connections pass), as a network does.
    (Frames are compressed: what was lost is read from the server's replay log.)
    ``target_port`` may be set after the proxy started, before the first connection.
    ``prefix`` (say ``/asr``): serve the server under that path, as a reverse proxy's
    ``location /asr/`` does: it is taken off each request's path, and any other path is 404
    (the server answers one HTTP request per connection, so each connection's first line is
    all there is to rewrite)."""

    def __init__(self, target_port: int = 0, prefix: str = "") -> None:
        self.target_port = target_port
        self.prefix = prefix
        self.outside: list[str] = []  # request lines refused for a path outside the prefix
        self.port = 0
        self._links: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._blackhole = False
        self._frozen: set[asyncio.StreamWriter] = set()  # the client sides of dead connections
        self.connections = 0

    async def __aenter__(self) -> "CutProxy":
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        self._server.close()
        await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def blackhole(self) -> None:
        self._blackhole = True

    def freeze(self) -> None:
        self._frozen.update(client for client, _ in self._links)
        self._blackhole = False  # later connections pass

    def cut(self) -> None:
        for client, upstream in self._links:
            client.transport.abort()
            upstream.transport.abort()
        self._links.clear()
        self._blackhole = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = await self._first_line(reader, writer) if self.prefix else b""
        if first is None:
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        up_writer.write(first)
        self._links.append((writer, up_writer))
        for task in (self._copy(reader, up_writer, writer, lose=False), self._copy(up_reader, writer, writer, lose=True)):
            t = asyncio.ensure_future(task)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _first_line(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes | None:
        """The request line with the prefix taken off its path, or None (answered 404 here)."""
        line = await reader.readline()
        method, _, rest = line.decode("latin-1").partition(" ")
        path, _, version = rest.partition(" ")
        if path == self.prefix or path.startswith(self.prefix + "/") or path.startswith(self.prefix + "?"):
            inner = path[len(self.prefix):]
            return f"{method} {inner if inner.startswith('/') else '/' + inner} {version}".encode("latin-1")
        self.outside.append(line.decode("latin-1").strip())
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()
        return None

    async def _copy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: asyncio.StreamWriter, *, lose: bool) -> None:
        try:
            while data := await reader.read(65536):
                if (lose and self._blackhole) or client in self._frozen:
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if client not in self._frozen:
                writer.transport.abort()


class ProxyThread:
    """A :class:`CutProxy` in a thread of its own, for synchronous tests (the browser's)."""

    def __init__(self, prefix: str = "") -> None:
        self.proxy = CutProxy(prefix=prefix)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cut-proxy", daemon=True)

    def start(self) -> "ProxyThread":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.__aenter__(), self._loop).result(10)
        return self

    def call(self, fn, *args):  # run fn in the proxy's loop and wait for it
        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.__aexit__(None, None, None), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
