"""Async client for asr-server's ``/v1/listen`` WebSocket protocol."""

from __future__ import annotations

import asyncio
import json
import ssl as ssl_module
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Iterator
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.frames import CTRL_OPCODES, Frame
from websockets.protocol import State

__all__ = ["AsrStream", "connect", "fetch_transcript", "Keepalive", "Transcript", "Turn", "speaker_turns", "ServerError", "AudioFileError", "read_pcm", "stream_file", "stream_bytes", "Timed"]

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


def _with_query(url: str, **params: Any) -> str:
    """``url`` with ``params`` added to its query string."""
    parts = urlsplit(url)
    extra = urlencode({k: v for k, v in params.items() if v is not None})
    query = f"{parts.query}&{extra}" if parts.query else extra
    return urlunsplit(parts._replace(query=query))


class AudioFileError(Exception):
    """A file that cannot be read as audio (missing, unreadable, or not audio)."""


_WS_SCHEMES = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}


def websocket_url(url: str) -> str:
    """The server's address as a WebSocket URL: ``http(s)://`` (the address the server prints for its
    page) as ``ws(s)://``, and ``host:port`` without a scheme as ``ws://host:port``. Raises
    ValueError for any other scheme."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep:
        return f"ws://{url.strip()}"
    if scheme.lower() not in _WS_SCHEMES:
        raise ValueError(f"{url!r} is not a server address: use ws://host:port (or wss://, http://, https://)")
    return f"{_WS_SCHEMES[scheme.lower()]}://{rest}"


def listen_url(url: str, **options: Any) -> str:
    """``ws://host:port`` (or ``http://``, or ``host:port``) plus options -> the full ``/v1/listen`` URL."""
    base = websocket_url(url).rstrip("/")
    if not base.endswith("/v1/listen"):
        base += "/v1/listen"
    query = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in options.items() if v is not None}
    return f"{base}?{urlencode(query)}" if query else base


def transcript_url(url: str, session_id: str, **query: Any) -> str:
    """The server's ``/v1/sessions/{id}/transcript`` address, from the WebSocket address streams
    use (``ws`` -> ``http``, ``wss`` -> ``https``). A path before ``/v1/listen`` is kept, as
    :func:`listen_url` keeps it: a server behind a proxy at ``wss://host/asr`` is read there."""
    parts = urlsplit(websocket_url(url))
    scheme = "https" if parts.scheme == "wss" else "http"
    prefix = parts.path.rstrip("/").removesuffix("/v1/listen").rstrip("/")
    path = f"{prefix}/v1/sessions/{quote(session_id, safe='')}/transcript"
    return urlunsplit((scheme, parts.netloc, path, urlencode(query), ""))


def fetch_transcript(url: str, session_id: str, format: str = "json", api_key: str | None = None, timeout: float = 30.0,
                     resume_token: str | None = None, **query: Any) -> str:
    """A session's whole transcript from the server (``GET /v1/sessions/{id}/transcript``): JSON,
    or subtitles (``format="srt"`` or ``"vtt"``; ``line_chars``, ``lines``), revisions applied.
    ``url`` is the server's WebSocket address, as for :func:`connect`. With the key the session
    streamed with, or with the session's own ``resume_token`` (its ``session`` message's: a stream
    let in with a single-use token has no key). The server keeps an ended session for
    ``--ended-session-ttl`` (300 s by default). Raises :class:`ServerError` when it answers with
    an error (``session_not_found``, ``invalid_option``, ``unauthorized``), OSError when it cannot
    be reached."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(transcript_url(url, session_id, format=format, **query))
    if resume_token:
        request.add_header("Asr-Resume-Token", resume_token)
    elif api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.read().decode()
    except urllib.error.HTTPError as error:
        raise refused(error.code, error.read()) from None


# Errors after which the session goes on (docs/protocol.md, "Errors"); any other ends it.
CONTINUING_ERRORS = frozenset({"invalid_message", "unknown_message_type", "decode_failed", "audio_dropped"})

Opener = Callable[[str], Awaitable[ClientConnection]]
MAX_FRUITLESS_RESUMES = 5  # resumes in a row that got no audio further: give up (something cuts the connection each time)


class _Connection(ClientConnection):
    """A client connection that notes when it last heard from the server: any frame (a
    message, a ping, a pong), and apart a message (or the handshake's answer). The keepalive
    judges the server by them, not by its own pongs."""

    heard_at = 0.0
    said_at = 0.0

    def process_event(self, event: Any) -> None:
        super().process_event(event)
        self.heard_at = self.loop.time()
        if not isinstance(event, Frame) or event.opcode not in CTRL_OPCODES:
            self.said_at = self.heard_at


def heartbeat_s(session: dict[str, Any] | None) -> float:
    """The ``heartbeat_s`` the session asked for (0: none)."""
    return float((session or {}).get("config", {}).get("heartbeat_s") or 0)


@dataclass(frozen=True)
class Keepalive:
    """The client's keepalive. It pings after ``ping_interval`` s without a frame from the
    server, and gives the connection up (then resumes, if it can) after ``ping_interval +
    ping_timeout`` s without one, or the server's own ``keepalive_interval_s +
    keepalive_timeout_s`` if longer (the server pings that often, whether or not it is
    reading). A pong is not awaited as such: while the server holds back reading (a fast
    upload to a busy server), a pong waits behind the audio sent before the ping, but the
    server's pings and results still arrive."""

    ping_interval: float = 20.0
    ping_timeout: float = 20.0

    def limit(self, session: dict[str, Any] | None) -> float:
        """How long the server may be quiet. With heartbeats (the ``heartbeat_s`` option) only its
        messages count, and for ``2 * heartbeat_s + 5`` s (as the JS client judges): a pong can
        come from a proxy that answers pings itself while the server behind it is gone."""
        beat = heartbeat_s(session)
        if beat > 0:
            return 2 * beat + 5
        limits = (session or {}).get("limits", {})
        interval = float(limits.get("keepalive_interval_s") or 0)  # 0: the server does not ping
        server = interval + float(limits.get("keepalive_timeout_s") or 0) if interval else 0.0
        return max(self.ping_interval + self.ping_timeout, server)


class AsrStream:
    """One streaming session. Use :func:`connect` to open it.

    Send with :meth:`send_audio`, :meth:`finalize` and :meth:`close_stream`;
    iterate to receive every server message as a dict (the iteration ends
    when the server closes the connection). ``close_code`` is set then.

    When the connection drops (no ``closed``, no error that ends the session)
    and the server gave a ``resume_token``, the stream reconnects with backoff
    and resumes: iteration yields ``{"type": "reconnecting", ...}`` (made by
    the client), then the messages the server had sent after the last one
    received, then the server's ``resumed``; the audio and commands the server
    had not read are sent again from a buffer of ``resume_buffer_bytes``.
    Nothing is transcribed twice and ``seq`` has no gap.
    """

    def __init__(
        self, ws: ClientConnection, opener: Opener | None = None, url: str = "", *, resume_buffer_bytes: int = 8 << 20,
        keepalive: Keepalive | None = Keepalive(),
    ) -> None:
        self._ws = ws
        self._open = opener  # None: no resume
        self._url = url
        self.session: dict[str, Any] | None = None
        self.close_code: int | None = None
        self.last_seq = 0
        self.reconnects = 0
        self._ended = False  # the server closed the session (closed, or an error that ends it), or we did
        self._connected = True  # False from a drop until `resumed`: sends only go to the buffer
        self._dropped: int | None = None  # close code of a drop not yet resumed
        self._stuck = 0  # resumes in a row at the same audio position
        self._resumed_at = -1
        self._lock = asyncio.Lock()  # sends in order, also against a resume's resending
        # What was sent, for a resume: ("audio", byte offset, data) and ("text", index, text).
        self._sent: deque[tuple[str, int, Any]] = deque()
        self._buffered = 0
        self._buffer_limit = resume_buffer_bytes
        self._audio_bytes = 0
        self._texts = 0
        self._keepalive = keepalive
        self._watch = asyncio.get_running_loop().create_task(self._watch_server()) if keepalive and isinstance(ws, _Connection) else None

    @property
    def session_id(self) -> str | None:
        return self.session["session_id"] if self.session else None

    async def send_audio(self, data: bytes) -> None:
        async with self._lock:
            self._remember("audio", self._audio_bytes, data, len(data))
            self._audio_bytes += len(data)
            await self._send(data)

    async def finalize(self) -> None:
        """Make whatever is being said now final."""
        await self.send_text(json.dumps({"type": "finalize"}))

    async def close_stream(self) -> None:
        """No more audio: the server sends the remaining finals, ``closed``, and closes."""
        await self.send_text(json.dumps({"type": "close"}))

    async def send_text(self, text: str) -> None:
        """Send a text frame (a command; raw ones for protocol tests)."""
        async with self._lock:
            self._remember("text", self._texts, text, len(text))
            self._texts += 1
            await self._send(text)

    def _remember(self, kind: str, position: int, payload: Any, size: int) -> None:
        if self._open is None:
            return
        self._sent.append((kind, position, payload))
        self._buffered += size
        while self._buffered > self._buffer_limit and len(self._sent) > 1:
            _, _, old = self._sent.popleft()
            self._buffered -= len(old)

    async def _send(self, frame: bytes | str) -> None:
        """Caller holds the lock. While the connection is down the frame waits in the buffer."""
        if not self._connected:
            return
        try:
            await self._ws.send(frame)
        except ConnectionClosed:
            if self._resume_token() is None or self._ended:
                raise
            self._connected = False  # recv() sees the drop too, and resumes

    def _resume_token(self) -> str | None:
        return self.session.get("resume_token") if self._open is not None and self.session else None

    async def recv(self) -> dict[str, Any] | None:
        """The next message, or None once the server has closed the connection (or a resume failed)."""
        while True:
            if self._dropped is not None and not await self._reconnect():
                return None
            try:
                raw = await self._ws.recv()
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd else 1006
                # Only a connection lost without a close frame is resumed: a close frame is an end.
                if self._ended or self._resume_token() is None or exc.rcvd is not None or self._stuck >= MAX_FRUITLESS_RESUMES:
                    self.close_code = code
                    return None
                self._dropped, self._connected = code, False
                return {"type": "reconnecting", "close_code": code, "last_seq": self.last_seq}
            message = json.loads(raw)
            seq = message.get("seq")
            if isinstance(seq, int):
                if seq <= self.last_seq:
                    continue  # already had it
                self.last_seq = seq
            await self._see(message)
            return message

    async def _see(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "session":
            self.session = message
        elif kind == "closed" or (kind == "error" and message.get("code") not in CONTINUING_ERRORS):
            self._ended = True
        elif kind == "resumed":
            # Resumes that bring no audio further (the same frames cut the connection again) are counted.
            progress = int(message["audio_received_bytes"]) != self._resumed_at
            self._stuck = 0 if progress else self._stuck + 1
            self._resumed_at = int(message["audio_received_bytes"])
            await self._resend(message)

    async def _reconnect(self) -> bool:
        """Reconnect with backoff until the server's resume_ttl_s has passed; False if it could not."""
        assert self._open is not None and self.session is not None
        token = self._resume_token()
        ttl = float(self.session.get("limits", {}).get("resume_ttl_s", 30))
        deadline, delay = time.monotonic() + ttl, 0.05
        while time.monotonic() < deadline:
            try:
                self._ws = await self._open(_with_query(self._url, resume=token, last_seq=self.last_seq))
            except InvalidStatus as exc:
                error = refused(exc.response.status_code, exc.response.body)
                if not error.retryable:
                    self.close_code, self._ended = 1008, True
                    raise error from None
            except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake):
                pass  # not reachable yet: try again
            else:
                self.reconnects += 1
                self._dropped = None
                return True
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))  # backoff between attempts
            delay = min(2.0, delay * 2)
        self.close_code = self._dropped
        self._ended = True
        return False

    async def _resend(self, resumed: dict[str, Any]) -> None:
        """Send again what the server had not read: audio after ``audio_received_bytes``, commands
        after ``commands_received``, in the order they were first sent."""
        received, commands = int(resumed["audio_received_bytes"]), int(resumed["commands_received"])
        async with self._lock:
            self._connected = True
            oldest = next((pos for kind, pos, _ in self._sent if kind == "audio"), self._audio_bytes)
            if received < oldest:
                resumed["client_gap_bytes"] = oldest - received  # the buffer no longer held them
            for kind, position, payload in list(self._sent):
                if kind == "audio" and position + len(payload) > received:
                    await self._send(payload[max(0, received - position):])
                elif kind == "text" and position >= commands:
                    await self._send(payload)

    async def _watch_server(self) -> None:
        """The keepalive (:class:`Keepalive`): ping when the server has been quiet for
        ``ping_interval``; cut a connection it has been quiet on for the limit (``recv`` then
        resumes, as after any lost connection)."""
        assert self._keepalive is not None
        pinged_at = -1.0  # the heard_at we pinged after
        while not self._ended:
            ws = self._ws
            assert isinstance(ws, _Connection)
            silent = ws.loop.time() - ws.heard_at  # no frame at all: time to ping
            quiet = ws.loop.time() - (ws.said_at if heartbeat_s(self.session) else ws.heard_at)  # what decides
            limit = self._keepalive.limit(self.session)
            if ws.state is not State.OPEN:
                if self.close_code is not None:
                    return  # recv() ended the stream
                wait = self._keepalive.ping_interval  # lost: recv() resumes it
            elif quiet >= limit:
                ws.transport.abort()  # heard nothing for too long: the server or the path is gone
                await ws.wait_closed()
                continue
            elif silent >= self._keepalive.ping_interval and pinged_at != ws.heard_at:
                pinged_at = ws.heard_at
                if not ws.transport.get_write_buffer_size():  # else it would wait behind our audio
                    await asyncio.gather(ws.ping(), return_exceptions=True)  # its pong is heard, as is any frame
                continue
            else:
                wait = limit - quiet if pinged_at == ws.heard_at else min(limit - quiet, self._keepalive.ping_interval - silent)
            await asyncio.sleep(max(0.01, wait))  # a timer, not synchronisation

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            message = await self.recv()
            if message is None:
                return
            yield message

    async def aclose(self) -> None:
        self._ended = True
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        await self._ws.close()
        if self.close_code is None and self._ws.close_code is not None:
            self.close_code = self._ws.close_code


class connect:
    """``async with connect(url, encoding=..., ...) as stream`` opens a session.

    Options are the server's query options (``encoding``, ``sample_rate``,
    ``channels``, ``language``, ``interim_results``, ``interim_ms``,
    ``endpoint_ms``, ``max_utterance_s``, ``word_timestamps``).
    ``api_key`` is sent as ``Authorization: Bearer``; ``token`` (from the
    server's ``POST /v1/tokens``) goes in the URL: a string, or a function
    that fetches a fresh one (a token is good once, so only a function lets
    the stream resume). A handshake the server refuses (401, 403) raises
    :class:`ServerError` with its code. ``resume``: reconnect and resume
    after a dropped connection (see :class:`AsrStream`). ``headers``: more
    handshake headers (a W3C ``traceparent`` puts the stream in your trace).
    ``ping_interval``, ``ping_timeout``: the keepalive (:class:`Keepalive`; ``None``: none).
    ``ssl``: the TLS context for a ``wss://`` server (one that trusts a self-signed certificate, say);
    by default the system's trusted certificates (``SSL_CERT_FILE`` names others).
    """

    def __init__(
        self, url: str, *, open_timeout: float = 10.0, api_key: str | None = None,
        token: str | Callable[[], Awaitable[str]] | None = None, resume: bool = True, resume_buffer_bytes: int = 8 << 20,
        headers: dict[str, str] | None = None, ping_interval: float | None = 20.0, ping_timeout: float = 20.0,
        ssl: ssl_module.SSLContext | None = None, **options: Any,
    ) -> None:
        self.url = listen_url(url, **options)
        self.base_url = listen_url(url)
        self.open_timeout = open_timeout
        self.headers = {**(headers or {}), **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self.token = token
        self.resume = resume
        self.resume_buffer_bytes = resume_buffer_bytes
        self.keepalive = Keepalive(ping_interval, ping_timeout) if ping_interval is not None else None
        self.ssl = ssl
        self._stream: AsrStream | None = None

    async def _open(self, url: str) -> ClientConnection:
        token = self.token if isinstance(self.token, str) or self.token is None else await self.token()
        if token is not None:
            url = _with_query(url, token=token)
        # Not the library's keepalive: it judges its own pongs, which wait behind audio the server holds back.
        tls = {"ssl": self.ssl} if self.ssl is not None else {}  # websockets refuses a context for ws://
        return await ws_connect(
            url, open_timeout=self.open_timeout, max_size=None, additional_headers=self.headers, ping_interval=None, create_connection=_Connection,
            **tls,
        )

    async def __aenter__(self) -> AsrStream:
        try:
            ws = await self._open(self.url)
        except InvalidStatus as exc:
            raise refused(exc.response.status_code, exc.response.body) from None
        resumable = self.resume and (self.token is None or callable(self.token))
        self._stream = AsrStream(
            ws, self._open if resumable else None, self.base_url, resume_buffer_bytes=self.resume_buffer_bytes, keepalive=self.keepalive,
        )
        return self._stream

    async def __aexit__(self, *exc: object) -> None:
        if self._stream is not None:
            await self._stream.aclose()


@dataclass
class _Channel:
    text: str = ""  # finals joined by single spaces, then the live interim
    committed: int = 0  # length of the final-only part
    settled: int = 0  # length of the part no revision will change (a ``settled`` message)
    # The finalized utterances with text, in order: (utterance, where its text starts, start s, end s).
    spans: list[tuple[int, int, float | None, float | None]] = field(default_factory=list)


@dataclass(frozen=True)
class Turn:
    """One finalized utterance: who spoke (``channel``), when (stream seconds, its first and last
    words as the server heard them) and what, revisions applied."""

    channel: int
    utterance: int
    start: float | None
    end: float | None
    text: str


@dataclass
class Transcript:
    """The running transcript of each channel, built from interim/final messages.

    The rule (docs/protocol.md): replace everything from ``offset`` to the end
    with the message's text; a non-zero ``offset`` has a space before it. A
    ``revision`` replaces from ``offset`` to the end of the finals (a live
    interim stays after them until the next interim). A ``settled`` message
    marks the transcript up to its ``offset`` as final for good
    (:meth:`settled_text`). :meth:`turns` gives the finalized utterances of
    every channel in the order they were spoken (a call's turns).
    """

    channels: dict[int, _Channel] = field(default_factory=dict)

    def apply(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "settled":
            self.channels.setdefault(message["channel"], _Channel()).settled = message["offset"]
            return
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
            ch.spans = _revised_spans(ch.spans, message)
            return
        if kind == "final" and not text:
            ch.text = ch.text[: ch.committed]  # an empty final takes no room
            return
        ch.text = (ch.text[: offset - 1] + " " + text) if offset else text
        if kind == "final":
            ch.committed = len(ch.text)
            ch.spans = [s for s in ch.spans if s[1] < offset] + [(message["utterance"], offset, message.get("start"), message.get("end"))]

    def text(self, channel: int = 0) -> str:
        ch = self.channels.get(channel)
        return ch.text if ch else ""

    def final_text(self, channel: int = 0) -> str:
        ch = self.channels.get(channel)
        return ch.text[: ch.committed] if ch else ""

    def settled_text(self, channel: int = 0) -> str:
        """The start of :meth:`final_text` that the server said no revision will change (after
        ``closed``, all of it is: use :meth:`final_text` then)."""
        ch = self.channels.get(channel)
        return ch.text[: ch.settled] if ch else ""

    def turns(self, channel: int | None = None) -> list[Turn]:
        """The finalized utterances with text, revisions applied: of one channel, or of all of
        them in the order they were spoken (by start time; a call's turns). A channel's turns'
        texts joined by spaces are its :meth:`final_text`. From a server that sends no revision
        ``segments``, a revision's utterances become one turn."""
        chosen = [channel] if channel is not None else sorted(self.channels)
        turns = [turn for ch in chosen if ch in self.channels for turn in self._turns(ch)]
        if channel is None:
            turns.sort(key=lambda t: (t.start if t.start is not None else float("inf"), t.channel))
        return turns

    def _turns(self, channel: int) -> list[Turn]:
        ch = self.channels[channel]
        spans = ch.spans
        ends = [offset - 1 for _, offset, _, _ in spans[1:]] + [ch.committed]
        return [Turn(channel, utt, start, end, ch.text[offset:stop].strip())
                for (utt, offset, start, end), stop in zip(spans, ends)]


#: A pause this long (seconds) between a party's utterances starts a new turn (:func:`speaker_turns`),
#: as it starts a paragraph on the captioning page.
TURN_GAP_S = 2.0
#: ... and so does an utterance after a turn of this many characters.
TURN_CHARS = 600


def speaker_turns(turns: Sequence[Turn], gap_s: float = TURN_GAP_S, max_chars: int = TURN_CHARS) -> list[Turn]:
    """Utterances in spoken order (:meth:`Transcript.turns`) joined into turns for a reader: an
    utterance joins the one before it when the same channel spoke both, nobody else's came
    between, it starts less than ``gap_s`` after that one ends (unknown times count as no pause)
    and the turn so far holds fewer than ``max_chars`` characters. A joined turn keeps its first
    utterance's number and start, and its last one's end."""
    out: list[Turn] = []
    for turn in turns:
        last = out[-1] if out else None
        paused = last is not None and last.end is not None and turn.start is not None and turn.start - last.end >= gap_s
        if last is None or last.channel != turn.channel or paused or len(last.text) >= max_chars:
            out.append(turn)
        else:
            out[-1] = replace(last, end=last.end if turn.end is None else turn.end, text=f"{last.text} {turn.text}")
    return out


def _revised_spans(spans: list[tuple[int, int, float | None, float | None]], message: dict[str, Any]) -> list[tuple[int, int, float | None, float | None]]:
    """A channel's utterance spans after a revision: those before its offset as they were, then
    one per segment (or, without ``segments``, one for the revised range)."""
    offset = message["offset"]
    kept = [s for s in spans if s[1] < offset]
    if "segments" in message:
        return kept + [(p["utterance"], p["offset"], p.get("start"), p.get("end")) for p in message["segments"]]
    if not message["text"]:
        return kept
    replaced = [s for s in spans if s[1] >= offset]
    starts = [s[2] for s in replaced if s[2] is not None]
    ends = [s[3] for s in replaced if s[3] is not None]
    return kept + [(message["utterances"][0], offset, min(starts, default=None), max(ends, default=None))]


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
    schedule: Sequence[tuple[int, float]] | None = None,
    **options: Any,
) -> AsyncIterator[Timed]:
    """Send ``data`` in ``chunk_ms`` pieces (paced when ``realtime``), then close; yield messages.

    ``schedule``: (byte offset, seconds) points, offsets rising: the bytes from one offset to
    the next are sent as one piece once its seconds have passed, instead of ``chunk_ms``
    pieces at ``bytes_per_second`` (a container with a variable bit rate spends more bytes
    on speech than on pauses, and an average pace sends a sentence's last bytes late)."""
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
            try:
                for piece, due in _paced(data, size, bytes_per_second, schedule):
                    if realtime and (delay := start + due - time.monotonic()) > 0:
                        await asyncio.sleep(delay)
                    await stream.send_audio(piece)
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


def _paced(data: bytes, size: int, bytes_per_second: float, schedule: Sequence[tuple[int, float]] | None) -> Iterator[tuple[bytes, float]]:
    """``data`` in pieces, each with the seconds into the stream it is due at (see
    :func:`stream_bytes`): ``size`` bytes at a steady rate, or one scheduled stretch each."""
    if not schedule:
        sent = 0
        for piece in chunks(data, size):
            yield piece, sent / bytes_per_second
            sent += len(piece)
        return
    begin = 0
    for end, due in schedule:
        if end > begin:
            yield data[begin:end], due
            begin = end
    if begin < len(data):
        yield data[begin:], schedule[-1][1]
