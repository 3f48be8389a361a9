"""Following a session's results from elsewhere: ``/v1/sessions`` and ``/v1/sessions/{id}/events``.

Every session keeps the messages it sent in a bounded log (the one a resume
replays), and apart, for ``/v1/sessions/{id}/transcript``, the messages its
whole transcript is built from (:class:`asr_server.transcript.TranscriptLog`).
A follower (a supervisor's dashboard, an agent-assist service) gets that log from ``from_seq`` on, then every new message live, the same
JSON the sender gets, until the session ends:

* as a WebSocket: text frames, then close 1000 at the session's end;
* as Server-Sent Events: ``id: <seq>`` and ``data: <json>`` per message.
  Each answer holds until there is something to send (at most
  :data:`SSE_WAIT_S`), then ends with ``retry:``; the browser's EventSource
  asks again at once with ``Last-Event-ID``, so nothing is missed. After the
  session's end the answer is 204, which ends an EventSource.

A follower that falls :data:`FOLLOWER_QUEUE` messages behind is cut off
(``follower_too_slow``); the stream and the other followers never wait for
one. Ended sessions stay readable for ``--ended-session-ttl`` seconds.
"""

from __future__ import annotations

import asyncio
import hmac
import http
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from ..access import Principal
from ..errors import AsrError, FollowerTooSlow, InvalidOption, SessionNotFound
from ..options import whole_number
from ..protocol.messages import MessageWriter
from ..resume import ReplayLog
from ..subtitles import CueOptions
from ..transcript import TranscriptLog, build_transcript, to_srt, to_vtt

if TYPE_CHECKING:
    from ..server import AsrServer
    from .connection import Connection

__all__ = ["Follower", "EndedSessions", "SESSIONS_PATH", "follow", "sse_events", "session_list", "parse_follow_path", "transcript_response"]

SESSIONS_PATH = "/v1/sessions"
FOLLOWER_QUEUE = 1024  # messages a follower may fall behind before it is cut off
SSE_WAIT_S = 8.0  # an SSE answer waits at most this long for news (under the handshake timeout)
SSE_RETRY_MS = 100
ENDED_BYTES = 64 << 20  # messages of ended sessions kept at most, in all


class Follower:
    """One follower's bounded queue; ``None`` marks the session's end."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=FOLLOWER_QUEUE)
        self.too_slow = False

    def push(self, text: str) -> None:
        if self.too_slow:
            return
        try:
            self.queue.put_nowait(text)
        except asyncio.QueueFull:
            self.too_slow = True  # its reader sees this and closes; the stream never waits
            self._end_now()

    def end(self) -> None:
        self._end_now()

    def _end_now(self) -> None:
        while True:
            try:
                self.queue.put_nowait(None)
                return
            except asyncio.QueueFull:
                self.queue.get_nowait()  # a full queue of a follower that is cut off anyway


@dataclass
class _Ended:
    log: ReplayLog
    transcript: TranscriptLog
    key: str | None
    info: dict[str, Any]
    ended_at: float
    resume_token: str | None = None
    closed_with: tuple[int, str] | None = None  # the close it ended with; None: it never got that far (expired, dropped)


class EndedSessions:
    """The logs of sessions that ended (the replay log and the transcript's), readable for
    ``ttl_s``: at most ``limit`` of them and ``max_bytes`` of messages in all (the oldest go first)."""

    def __init__(self, ttl_s: float, limit: int = 1000, max_bytes: int = ENDED_BYTES) -> None:
        self.ttl_s, self.limit, self.max_bytes = ttl_s, limit, max_bytes
        self._sessions: OrderedDict[str, _Ended] = OrderedDict()
        self._bytes = 0

    def keep(self, session_id: str, log: ReplayLog, transcript: TranscriptLog, key: str | None, info: dict[str, Any], now: float, *,
             resume_token: str | None = None, closed_with: tuple[int, str] | None = None) -> None:
        if self.ttl_s <= 0:
            return
        self._sessions[session_id] = _Ended(log, transcript, key, info, now, resume_token, closed_with)
        self._bytes += log.bytes + transcript.bytes
        self.expire(now)

    @property
    def bytes(self) -> int:
        return self._bytes

    def expire(self, now: float) -> None:
        while self._sessions and (len(self._sessions) > self.limit or self._bytes > self.max_bytes
                                  or now - next(iter(self._sessions.values())).ended_at > self.ttl_s):
            _, oldest = self._sessions.popitem(last=False)
            self._bytes -= oldest.log.bytes + oldest.transcript.bytes

    def get(self, session_id: str, now: float) -> _Ended | None:
        self.expire(now)
        return self._sessions.get(session_id)

    def concluded(self, resume_token: str, key: str | None, now: float) -> _Ended | None:
        """The kept session of ``resume_token`` and ``key`` that ended with its close (a client that
        missed its end resumes into it; see :meth:`AsrServer._resume`), if any."""
        self.expire(now)
        return next((e for e in self._sessions.values() if e.resume_token == resume_token and e.key == key and e.closed_with is not None), None)


def parse_follow_path(path: str, what: str = "events") -> str | None:
    """The session id of ``/v1/sessions/{id}/events`` (or ``.../{what}``; None: another path)."""
    parts = path.split("/")
    if len(parts) == 5 and parts[:3] == ["", "v1", "sessions"] and parts[4] == what and parts[3]:
        return parts[3]
    return None


def transcript_response(server: "AsrServer", principal: Principal, session_id: str, query: dict[str, list[str]],
                        resume_token: str | None = None) -> Response | Awaitable[Response]:
    """``/v1/sessions/{id}/transcript``: the transcript so far (or whole, once ended), as JSON, SRT or
    WebVTT; for a key's session, or for the holder of the session's own ``resume_token`` (the
    client that streamed it, whatever it was let in with). Built in a worker thread, one at a
    time, from a copy of the messages kept for it: hours of a session take a second or two, which
    the event loop (every stream's) does not wait for."""
    from .http import error_response

    try:
        _, _, kept = _find(server, principal, session_id, resume_token)
        fmt, cue_options = _transcript_query(query)
    except AsrError as error:
        return error_response(error)
    texts, truncated = kept.texts(), kept.truncated  # longer than the replay log; copied here, in the loop
    return _built(server, texts, truncated, fmt, cue_options)


async def _built(server: "AsrServer", texts: list[str], truncated: bool, fmt: str, cue_options: CueOptions) -> Response:
    """One build at a time: clients polling a long session's subtitles take at most one thread's
    share of the interpreter from the streams, however many they are."""
    async with server.transcript_builds:
        return await asyncio.to_thread(_transcript_body, texts, truncated, fmt, cue_options)


def _transcript_body(texts: list[str], truncated: bool, fmt: str, cue_options: CueOptions) -> Response:
    from .http import response

    transcript = {**build_transcript(texts), "truncated": truncated}
    if fmt == "srt":
        return response(http.HTTPStatus.OK, to_srt(transcript, cue_options).encode(), "application/x-subrip; charset=utf-8")
    if fmt == "vtt":
        return response(http.HTTPStatus.OK, to_vtt(transcript, cue_options).encode(), "text/vtt; charset=utf-8")
    return response(http.HTTPStatus.OK, json.dumps(transcript).encode(), "application/json")


def _transcript_query(query: dict[str, list[str]]) -> tuple[str, CueOptions]:
    """``format`` (json, srt, vtt) and, for subtitles, ``line_chars`` (10-200) and ``lines`` (1-4)
    a cue has at most; InvalidOption for anything else."""
    fmt = query.get("format", ["json"])[0]
    if fmt not in ("json", "srt", "vtt"):
        raise InvalidOption(f"format must be json, srt or vtt, not {fmt[:20]!r}")
    sizes = {}
    for name, low, high in (("line_chars", 10, 200), ("lines", 1, 4)):
        raw = query.get(name, [None])[0]
        if raw is None:
            continue
        value = whole_number(raw)
        if value is None or not low <= value <= high:
            raise InvalidOption(f"{name} must be a whole number from {low} to {high}, not {raw[:20]!r}")
        sizes[name] = value
    return fmt, CueOptions(**sizes)


def _from_seq(request_headers: Any, query: dict[str, list[str]]) -> int:
    """Where a follower takes up the log: ``Last-Event-ID`` (an EventSource asking again), else
    ``from_seq``; anything but a whole number is refused rather than read as 0 (all again)."""
    raw = (request_headers.get("Last-Event-ID") or query.get("from_seq", ["0"])[0]).strip()
    value = whole_number(raw)
    if value is None:
        raise InvalidOption(f"from_seq must be a whole number (the seq of the last message held), got {raw[:20]!r}")
    return value


def _find(server: "AsrServer", principal: Principal, session_id: str,
          resume_token: str | None = None) -> tuple["Connection | None", ReplayLog, TranscriptLog]:
    """The live session (None once ended), its log and its transcript's; SessionNotFound for neither,
    another key's, or (``resume_token`` given) one whose resume token is another."""
    conn = server.session_by_id(session_id)
    if conn is not None and _owned(conn.session.key, conn.session.resume_token, principal, resume_token):
        return conn, conn.log, conn.transcript
    ended = server.ended.get(session_id, time.monotonic())
    if ended is not None and _owned(ended.key, ended.resume_token, principal, resume_token):
        return None, ended.log, ended.transcript
    raise SessionNotFound(f"no session {session_id[:40]!r} to follow (unknown, ended too long ago, or another key's)")


def _owned(key: str | None, token: str | None, principal: Principal, resume_token: str | None) -> bool:
    """A session is the asker's when it came in with the asker's key or, when the asker shows a
    resume token, when that is the session's own."""
    if resume_token is not None:
        return token is not None and hmac.compare_digest(token.encode(), resume_token.encode())
    return key == principal.name


def session_list(server: "AsrServer", principal: Principal) -> list[dict[str, Any]]:
    """The live sessions a key may follow, for a dashboard."""
    return [conn.summary() for conn in server.live_connections() if conn.session.key == principal.name]


async def follow(server: "AsrServer", ws: ServerConnection, principal: Principal, session_id: str, query: dict[str, list[str]]) -> None:
    """A WebSocket follower: the log from ``from_seq``, then live, then close 1000 at the session's end."""
    try:
        conn, log, _ = _find(server, principal, session_id)
        backlog = log.after(min(_from_seq(ws.request.headers if ws.request else {}, query), log.last_seq))
    except AsrError as error:
        await server.refuse(ws, MessageWriter(uuid.uuid4().hex[:16]), error, session_id, event="follow_refused")
        return
    follower = Follower()
    if conn is not None and not conn.done.is_set():
        conn.followers.add(follower)  # no await since the backlog was read: nothing missed, nothing twice
    else:
        follower.end()
    server.metrics.followers.inc()
    ignoring = asyncio.ensure_future(_ignore_input(ws))
    try:
        for text in backlog:
            await ws.send(text)
        while (text := await follower.queue.get()) is not None:
            await ws.send(text)
        if follower.too_slow:
            await server.refuse(ws, MessageWriter(uuid.uuid4().hex[:16]), _too_slow(), session_id, event="follow_refused")
        else:
            await ws.close(1000, "session ended")
    except ConnectionClosed:
        pass
    finally:
        ignoring.cancel()
        server.metrics.followers.dec()
        if conn is not None:
            conn.followers.discard(follower)


async def _ignore_input(ws: ServerConnection) -> None:
    """Read what a follower sends, and drop it: a follower has nothing to say, and frames left unread
    were held (up to 16 of 2 MiB each per follower) until it went."""
    try:
        async for _ in ws:
            pass
    except ConnectionClosed:
        pass


async def sse_events(server: "AsrServer", principal: Principal, session_id: str, request: Request, query: dict[str, list[str]]) -> Response:
    """One Server-Sent Events answer: what is new after ``Last-Event-ID`` (or ``from_seq``), waiting for some."""
    from .http import error_response, response

    try:
        conn, log, _ = _find(server, principal, session_id)
        after = min(_from_seq(request.headers, query), log.last_seq)
        entries = log.entries_after(after)
        if not entries and conn is not None and not conn.done.is_set():
            follower = Follower()
            conn.followers.add(follower)
            try:
                await asyncio.wait_for(follower.queue.get(), SSE_WAIT_S)
            except TimeoutError:
                pass
            finally:
                conn.followers.discard(follower)
            entries = log.entries_after(after)
    except AsrError as error:
        return error_response(error)
    if not entries and (conn is None or conn.done.is_set()):
        return response(http.HTTPStatus.NO_CONTENT, b"", "text/event-stream")  # the session is over: EventSource stops
    body = f"retry: {SSE_RETRY_MS}\n\n" + "".join(f"id: {seq}\ndata: {text}\n\n" for seq, text in entries)
    return response(http.HTTPStatus.OK, body.encode(), "text/event-stream; charset=utf-8")


def _too_slow() -> AsrError:
    return FollowerTooSlow(f"this follower fell {FOLLOWER_QUEUE} messages behind the session and was cut off; follow again with from_seq")
