"""Async client for asr-server's ``/v1/listen`` WebSocket protocol."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator
from urllib.parse import urlencode

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

__all__ = ["AsrStream", "connect", "Transcript", "ServerError", "AudioFileError", "read_pcm", "stream_file", "stream_bytes", "Timed"]

MODEL_RATE = 16000


class ServerError(Exception):
    """The server refused the stream or ended it with an ``error`` message."""

    def __init__(self, message: dict[str, Any]) -> None:
        super().__init__(f"{message.get('code')}: {message.get('message')}")
        self.code: str = message.get("code", "")
        self.retryable: bool = bool(message.get("retryable"))
        self.retry_after: float | None = message.get("retry_after")
        self.message = message


def refused(status: int, body: bytes | None) -> ServerError:
    """The error of a handshake the server answered with plain HTTP (its JSON body, when it has one)."""
    try:
        message = json.loads(body or b"")
    except ValueError:
        message = None
    if not isinstance(message, dict) or "code" not in message:
        message = {"code": f"http_{status}", "message": f"the server answered HTTP {status}", "retryable": status >= 500}
    return ServerError(message)


class AudioFileError(Exception):
    """A file that cannot be read as audio (missing, unreadable, or not audio)."""


def listen_url(url: str, **options: Any) -> str:
    """``ws://host:port`` plus options -> the full ``/v1/listen`` URL."""
    base = url.rstrip("/")
    if not base.endswith("/v1/listen"):
        base += "/v1/listen"
    query = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in options.items() if v is not None}
    return f"{base}?{urlencode(query)}" if query else base


class AsrStream:
    """One streaming session. Use :func:`connect` to open it.

    Send with :meth:`send_audio`, :meth:`finalize` and :meth:`close_stream`;
    iterate to receive every server message as a dict (the iteration ends
    when the server closes the connection). ``close_code`` is set then.
    """

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self.session: dict[str, Any] | None = None
        self.close_code: int | None = None

    @property
    def session_id(self) -> str | None:
        return self.session["session_id"] if self.session else None

    async def send_audio(self, data: bytes) -> None:
        await self._ws.send(data)

    async def finalize(self) -> None:
        """Make whatever is being said now final."""
        await self._ws.send(json.dumps({"type": "finalize"}))

    async def close_stream(self) -> None:
        """No more audio: the server sends the remaining finals, ``closed``, and closes."""
        await self._ws.send(json.dumps({"type": "close"}))

    async def send_text(self, text: str) -> None:
        """Send a raw text frame (for protocol tests)."""
        await self._ws.send(text)

    async def recv(self) -> dict[str, Any] | None:
        """The next message, or None once the server has closed the connection."""
        try:
            raw = await self._ws.recv()
        except ConnectionClosed as exc:
            self.close_code = exc.rcvd.code if exc.rcvd else 1006
            return None
        message = json.loads(raw)
        if message.get("type") == "session":
            self.session = message
        return message

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            message = await self.recv()
            if message is None:
                return
            yield message

    async def aclose(self) -> None:
        await self._ws.close()
        if self.close_code is None and self._ws.close_code is not None:
            self.close_code = self._ws.close_code


class connect:
    """``async with connect(url, encoding=..., ...) as stream`` opens a session.

    Options are the server's query options (``encoding``, ``sample_rate``,
    ``channels``, ``language``, ``interim_results``, ``interim_ms``,
    ``endpoint_ms``, ``max_utterance_s``, ``word_timestamps``).
    ``api_key`` is sent as ``Authorization: Bearer``; ``token`` (from the
    server's ``POST /v1/tokens``) goes in the URL. A handshake the server
    refuses (401, 403) raises :class:`ServerError` with its code.
    """

    def __init__(self, url: str, *, open_timeout: float = 10.0, api_key: str | None = None, token: str | None = None, **options: Any) -> None:
        self.url = listen_url(url, token=token, **options)
        self.open_timeout = open_timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._stream: AsrStream | None = None

    async def __aenter__(self) -> AsrStream:
        try:
            ws = await ws_connect(self.url, open_timeout=self.open_timeout, max_size=None, additional_headers=self.headers)
        except InvalidStatus as exc:
            raise refused(exc.response.status_code, exc.response.body) from None
        self._stream = AsrStream(ws)
        return self._stream

    async def __aexit__(self, *exc: object) -> None:
        if self._stream is not None:
            await self._stream.aclose()


@dataclass
class _Channel:
    text: str = ""  # finals joined by single spaces, then the live interim
    committed: int = 0  # length of the final-only part


@dataclass
class Transcript:
    """The running transcript of each channel, built from interim/final messages.

    The rule (docs/protocol.md): replace everything from ``offset`` to the end
    with the message's text; a non-zero ``offset`` has a space before it. A
    ``revision`` replaces from ``offset`` to the end of the finals (a live
    interim stays after them until the next interim).
    """

    channels: dict[int, _Channel] = field(default_factory=dict)

    def apply(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind not in ("interim", "final", "revision"):
            return
        ch = self.channels.setdefault(message["channel"], _Channel())
        offset, text = message["offset"], message["text"]
        if kind == "revision":
            # The finals from offset to their end are now text; a live interim stays after them.
            live = ch.text[ch.committed :]
            ch.text = (ch.text[: offset - 1] + " " + text) if offset else text
            ch.committed = len(ch.text)
            ch.text += live
            return
        if kind == "final" and not text:
            ch.text = ch.text[: ch.committed]  # an empty final takes no room
            return
        ch.text = (ch.text[: offset - 1] + " " + text) if offset else text
        if kind == "final":
            ch.committed = len(ch.text)

    def text(self, channel: int = 0) -> str:
        ch = self.channels.get(channel)
        return ch.text if ch else ""

    def final_text(self, channel: int = 0) -> str:
        ch = self.channels.get(channel)
        return ch.text[: ch.committed] if ch else ""


@dataclass(frozen=True)
class Timed:
    """A message and when it arrived (seconds since streaming started)."""

    at: float
    message: dict[str, Any]


def read_pcm(path: str, rate: int = MODEL_RATE, channels: int | None = None) -> tuple[bytes, int]:
    """Decode any file PyAV reads to interleaved s16le at ``rate``.

    Keeps the file's channels (up to 8) unless ``channels`` is given (1 mixes
    down). Returns the bytes and the channel count. Raises
    :class:`AudioFileError` for a file that is missing or is not audio.
    """
    import av

    try:
        return _read_pcm(av, path, rate, channels)
    except FileNotFoundError:
        raise AudioFileError(f"no such file: {path}") from None
    except (av.FFmpegError, OSError, ValueError, IndexError, UnicodeError) as exc:
        raise AudioFileError(f"cannot read {path} as audio ({getattr(exc, 'strerror', None) or exc})") from None


def _read_pcm(av: Any, path: str, rate: int, channels: int | None) -> tuple[bytes, int]:
    layouts = {1: "mono", 2: "stereo", 3: "3.0", 4: "quad", 5: "5.0", 6: "5.1", 7: "6.1", 8: "7.1"}
    out = bytearray()
    with av.open(path) as container:
        if not container.streams.audio:
            raise ValueError("it has no audio track")
        stream = container.streams.audio[0]
        n = channels or min(8, stream.codec_context.channels or 1)
        resampler = av.AudioResampler(format="s16", layout=layouts[n], rate=rate)
        for frame in container.decode(stream):
            frame.pts = None
            for f in resampler.resample(frame):
                out += bytes(f.planes[0])[: f.samples * 2 * n]
        for f in resampler.resample(None):
            out += bytes(f.planes[0])[: f.samples * 2 * n]
    return bytes(out), n


def chunks(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def stream_file(
    url: str,
    path: str,
    *,
    realtime: bool = True,
    chunk_ms: int = 100,
    channels: int | None = None,
    **options: Any,
) -> AsyncIterator[Timed]:
    """Stream an audio file as PCM and yield every message with its arrival time.

    ``realtime`` paces the audio at the speed it would be spoken; otherwise it
    is sent as fast as the server accepts it.
    """
    pcm, n = read_pcm(path, MODEL_RATE, channels)
    async for item in stream_bytes(url, pcm, bytes_per_second=MODEL_RATE * 2 * n, realtime=realtime, chunk_ms=chunk_ms,
                                   encoding="pcm_s16le", sample_rate=MODEL_RATE, channels=n, **options):
        yield item


async def stream_bytes(
    url: str,
    data: bytes,
    *,
    bytes_per_second: float,
    realtime: bool = True,
    chunk_ms: int = 100,
    **options: Any,
) -> AsyncIterator[Timed]:
    """Send ``data`` in ``chunk_ms`` pieces (paced when ``realtime``), then close; yield messages."""
    size = max(1, int(bytes_per_second * chunk_ms / 1000))
    if options.get("encoding", "pcm_s16le") == "pcm_s16le":
        size -= size % (2 * int(options.get("channels", 1)))
    async with connect(url, **options) as stream:
        start = time.monotonic()
        queue: asyncio.Queue[Timed | None] = asyncio.Queue()

        async def receive() -> None:
            async for message in stream:
                await queue.put(Timed(time.monotonic() - start, message))
            await queue.put(None)

        async def send() -> None:
            sent = 0
            try:
                for piece in chunks(data, size):
                    if realtime:
                        delay = start + sent / bytes_per_second - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    await stream.send_audio(piece)
                    sent += len(piece)
                await stream.close_stream()
            except ConnectionClosed:
                pass  # the server ended the stream (its reason arrives as a message)

        receiver = asyncio.create_task(receive())
        sender = asyncio.create_task(send())
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            sender.cancel()
            receiver.cancel()
            await asyncio.gather(sender, receiver, return_exceptions=True)
