"""The shell around one stream's :class:`~asr_server.session.Session`: read, feed, send.

:class:`Connection` reads WebSocket frames, feeds the session core, and
carries out what the core returns (send a message, run a decode, close).
Decisions live in the core; this module only moves bytes, arms timers and
keeps metrics.

Flow control: while the session owes too many finals (backpressure), or an
upload sent faster than real time has its context passes far behind
(:meth:`Session.held_for_passes`), the connection stops reading, so a fast
client is slowed by TCP. Its pongs then
wait behind its audio, so the library's keepalive is off and
:meth:`Connection._keepalive` judges a ping only over a window in which the
connection read all the while: a client that is slowed never times out,
and one that stops reading our messages is cut off with
``results_not_read``.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import json
import logging
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from ..audio.decode import MODEL_RATE, ContainerDecoder, PcmDecoder
from ..errors import (
    AsrError,
    AudioDropped,
    AudioOverrun,
    DecodeFailed,
    FrameTooLarge,
    IdleTimeout,
    InternalError,
    InvalidMessage,
    MemoryPressure,
    ResultsNotRead,
    ResumeFailed,
    ShuttingDown,
    wire_info,
)
from ..events import AnswerFailed, ContextDecided, Final, Interim, Revision, SpeechStart, SubmitJob, WithdrawJob
from ..options import Limits, StreamOptions
from ..protocol.messages import CloseStream, Finalize, KeepAlive, NativeDialect, WebRtcOffer, parse_client_message
from ..protocol.openai_realtime import Reconfigure
from ..resume import ReplayLog
from ..scheduler.engine import JobFailed
from ..scheduler.governor import LoadSettings
from ..scheduler.policy import WEIGHTS, Priority
from ..session import Close, Send, Session, SessionOutput, SessionState
from ..tracing import StreamTrace
from ..transcript import TranscriptLog
from .fanout import Follower
from .ingest import ContainerPump, LiveBacklog
from .webrtc import RtcIngest

if TYPE_CHECKING:
    from ..events import DecodeJob
    from ..inference.types import Hypothesis
    from ..server import AsrServer


class Dialect(Protocol):
    """A wire protocol spoken on a session: ours, or a vendor's translated to and from ours."""

    name: str

    def incoming(self, text: str) -> list[Any]:
        """What a client text frame means here: our command text, audio bytes, an event
        to send back as it is (a dict), or new stream options (Reconfigure)."""

    def incoming_binary(self, data: bytes) -> list[Any]:
        """What a client binary frame means here: audio, or an error where the protocol carries
        its audio in text frames."""

    def outgoing(self, message: dict[str, Any]) -> list[dict[str, Any]]: ...

__all__ = ["Connection", "replay_ended"]

log = logging.getLogger("asr_server.session")

_ARRIVALS_KEPT = 8192  # (samples, time) pairs kept for latency metrics
_FINALS_SHOWN_MAX = 256  # finals awaiting their context pass, kept for asr_context_lag_seconds
IDLE_PING_S = 5.0  # an idle resumable client that does not answer a ping this soon is taken as gone


class Connection:
    """Call :meth:`run` once; it returns when the stream has ended and everything is cleaned up."""

    def __init__(self, server: "AsrServer", ws: ServerConnection, session: Session, trace: StreamTrace | None = None,
                 dialect: Dialect | None = None) -> None:
        """``trace``: the stream's spans, when it is sampled for tracing; ``dialect``: the wire
        protocol the client speaks (ours by default; :mod:`asr_server.protocol.deepgram`)."""
        self.server = server
        self.trace = trace
        self.dialect: Dialect = dialect or NativeDialect()
        self.ws = ws
        self.session = session
        self.options = session.options
        self.limits: Limits = server.limits
        self.metrics = server.metrics
        self.done = asyncio.Event()
        self.outcome = "disconnected"
        self._lock = asyncio.Lock()  # one session call and its sends at a time: keeps seq order
        self._progress = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        # (samples received so far, monotonic time) per audio chunk, for latency metrics; bounded.
        self._arrivals: list[tuple[int, float]] = []
        self._first_audio_at: float | None = None
        self._first_interim_seen = False
        self._chunks = self._answer_failures = 0  # audio chunks taken (trace spans); answers failed (AnswerFailed)
        self._speech_arrivals: dict[tuple[int, int], float] = {}  # utterances with no result yet: their speech's arrival
        self._finals_shown: dict[tuple[int, int], float] = {}  # finals no context pass has decided yet: when sent (bounded)
        self._pcm = _pcm_decoder(self.options)
        self._container: ContainerDecoder | None = None
        self._container_task: asyncio.Task[None] | None = None
        self._rtc: RtcIngest | None = None
        self._backlog = LiveBacklog(self.limits.max_live_backlog_s)  # WebRTC audio held under backpressure
        self._ending = self._closing = False  # input is over; _closing: by the client's wish (a drop is held)
        self._context_deadline: asyncio.TimerHandle | None = None
        # Reading stalls on our side (backpressure, a full decoder buffer): a keepalive
        # ping is only judged over a window with none (see _keepalive).
        self._stalled, self._stalls = False, 0
        self.started_at = self._sent_at = time.monotonic()  # _sent_at: the last message written (for heartbeats)
        self.reserved_bytes = server.stream_bytes(self.options)
        self.shedding = False
        self._weight = WEIGHTS[Priority(self.options.priority)]
        # Every message sent, bounded: for a resume, and for the session's followers (transport.fanout).
        self.log = ReplayLog(self.limits.max_replay_bytes)
        # What the whole transcript is built from, kept longer than the replay log (no interims).
        self.transcript = TranscriptLog(self.limits.max_transcript_bytes)
        self.followers: set[Follower] = set()
        # Bytes of binary frames read (a resume goes on from there), text frames, resumes, webhook events.
        self.bytes_received = self.commands_received = self.resumes = self.webhook_events = 0
        # _held: the connection dropped, the session waits for its client; _dropped: the last
        # connection ended without a close frame (a lost network).
        self._held = self._dropped = False
        self.closed_with: tuple[int, str] | None = None  # the close the session ended with (code, reason)
        self._reattached = asyncio.Event()

    @property
    def sid(self) -> str:
        return self.session.session_id

    def summary(self) -> dict[str, Any]:
        """What ``GET /v1/sessions`` lists of this session."""
        call = getattr(self.dialect, "call", None)
        return {
            "session_id": self.sid, "dialect": self.dialect.name, "encoding": self.options.encoding, "channels": self.options.channels,
            "started": round(time.time() - (time.monotonic() - self.started_at), 3), "key": self.session.key,
            "last_seq": self.log.last_seq, "ended": self.done.is_set(), **({"call": call.to_wire()} if call is not None else {}),
        }

    async def run(self) -> None:
        key = f" key={self.session.key}" if self.session.key is not None else ""
        log.info("session=%s event=start%s options=%s", self.sid, key, json.dumps(self.options.to_wire(), separators=(",", ":")))
        try:
            await self._apply(self.session.start)
            # Admitted under load: start degraded (the client is told if its interims change); and
            # settle decodes only if the server has time to spare.
            await self.set_load(self.server.load_settings())
            if self.options.is_container:
                self._container = ContainerDecoder(self.options.encoding, self.options.channels, self.limits.max_container_buffer_bytes)
                self._container_task = self._spawn(self._pump_container())
            self._watch(self.ws)
            await self._serve()
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("session=%s event=crash", self.sid)
            self.outcome = "server_error"
            await self._apply_safely(lambda: self.session.fail(InternalError("internal error; the session was closed")))
        finally:
            await self._cleanup()

    async def set_load(self, load: LoadSettings) -> None:
        try:
            await self._apply(lambda: self.session.set_load(load))
        except (ConnectionClosed, TimeoutError):
            self.done.set()

    async def shed(self) -> None:
        """Memory critical: finish this stream (finals flushed), close 1013."""
        self.shedding = True
        await self._fail_safely(MemoryPressure("the server is short of memory and closed this batch stream after its last final; retry later", retry_after=30.0))

    async def shut_down(self) -> None:
        """Server stopping: tell the client, finalize what is held, close 1001."""
        await self._fail_safely(ShuttingDown("the server is shutting down; reconnect to another instance", retry_after=5.0))

    # -- resuming --------------------------------------------------------------------

    def _may_hold(self) -> bool:
        """Whether a dropped connection leaves the session waiting for its client: while it streams,
        and while it finishes after the client's close (its last finals and revisions to come)."""
        return self.session.resume_token is not None and self._resumable_now() and not self.server.stopping

    @property
    def finishing(self) -> bool:
        """Whether the client closed the stream and the session is finishing what it owes it."""
        return self._closing

    def _resumable_now(self) -> bool:
        return not self.done.is_set() and (self._closing or not self._ending)

    async def _serve(self) -> None:
        """Read the client's frames; when its connection drops, hold the session for a resume."""
        while True:
            ws = self.ws
            await self._read_until_done(ws)
            if self.done.is_set():
                return
            if self.ws is not ws:
                continue  # a resume took the session over while we were reading
            if not (self._dropped and self._may_hold()):
                self.done.set()
                return
            if not await self._hold(ws):
                return

    async def _hold(self, ws: ServerConnection) -> bool:
        """Wait up to ``resume_ttl_s`` for :meth:`attach`; False (the session is over) if none came.

        A session its client closed is held until it has finished, however long that takes: its
        last finals and the close's passes are what the client is owed, and a resume may still
        come for them (after the end, from the ended sessions)."""
        if self.ws is not ws:
            return True
        assert self.session.resume_token is not None
        deadline = self.server.clock() + self.limits.resume_ttl_s
        self._held = True
        self.server.resumes.hold(self.session.resume_token, math.inf if self._closing else deadline)
        self.metrics.sessions_held.inc()
        log.info("session=%s event=held ttl_s=%g received_bytes=%d last_seq=%d closing=%s", self.sid, self.limits.resume_ttl_s,
                 self.bytes_received, self.log.last_seq, self._closing)
        try:
            while self.ws is ws and not self.done.is_set():
                self._reattached.clear()
                # A fatal error while held ends the close (and _closing); it ends the session too.
                remaining = None if self._closing else deadline - self.server.clock()
                if remaining is not None and remaining <= 0:
                    break
                await _first_of(self._reattached, self.done, timeout=remaining)
        finally:
            self.metrics.sessions_held.dec()
        if self.done.is_set():
            return False
        if self.ws is ws:
            log.info("session=%s event=expired", self.sid)
            self.outcome = "expired"
            self.done.set()
            return False
        return True

    async def attach(self, ws: ServerConnection, last_seq: int) -> bool:
        """A client resumed with this session's token: replay what it missed after ``last_seq``,
        send ``resumed``, and go on reading from ``ws`` (True). ResumeFailed if that cannot be done.
        False if the session ended while the resume waited: the replay ends with its close."""
        if self.closed_with is None and not self._resumable_now():
            raise ResumeFailed("the session has ended; start a new session")
        self.log.after(last_seq)  # refuse before touching the old connection
        if not self._held:
            # Its client is back before we saw the drop: the old connection is dead to it (and
            # a close being sent on it, which would wait out its close timeout, ends now).
            log.info("session=%s event=taken_over", self.sid)
            self.ws.transport.abort()
        async with self._lock:  # no message goes out between the replay and `resumed`
            messages = self.log.after(last_seq)
            if self.closed_with is not None:
                # It ended (its last decodes after the client's close) before the resume got here.
                log.info("session=%s event=resumed_ended last_seq=%d replayed=%d", self.sid, last_seq, len(messages))
                await replay_ended(ws, messages, self.closed_with, self.limits.send_timeout_s)
                return False
            self.ws, self._held = ws, False
            self.resumes += 1
            for text in messages:
                await self._send(text)
            received_s = self._received_seconds()
            await self._carry_out(self.session.resumed(received_s, self.bytes_received, self.commands_received, len(messages)))
        log.info("session=%s event=resumed last_seq=%d replayed=%d received_bytes=%d", self.sid, last_seq, len(messages), self.bytes_received)
        self._reattached.set()
        self._progress.set()
        self._watch(ws)
        return True

    def _received_seconds(self) -> float:
        """Seconds of the client's audio the server holds (exact, to the sample, for raw encodings)."""
        if self._pcm is not None and self.options.sample_rate:
            frame = PcmDecoder.WIDTH[self.options.encoding] * self.options.channels
            return (self.bytes_received // frame) / self.options.sample_rate
        return self.session.audio_received_s

    # -- reading ---------------------------------------------------------------------

    async def _read_until_done(self, ws: ServerConnection) -> None:
        reader = asyncio.ensure_future(self._read(ws))
        finished = asyncio.ensure_future(self.done.wait())
        await asyncio.wait([reader, finished], return_when=asyncio.FIRST_COMPLETED)
        finished.cancel()
        if reader.done() and not reader.cancelled() and reader.exception() is not None:
            raise reader.exception()  # type: ignore[misc]
        reader.cancel()

    async def _read(self, ws: ServerConnection) -> None:
        """Until ``ws`` closes (the caller decides whether that ends the session)."""
        try:
            while True:
                await self._wait_while(self._held_back)
                received = self.session.audio_received_s  # for _idle: did a container's audio grow meanwhile
                try:
                    frame = await asyncio.wait_for(ws.recv(), timeout=self.limits.idle_timeout_s)
                except TimeoutError:
                    await self._idle(received)
                    continue
                if self.ws is not ws:
                    # A resume took the session over (attach): the client sends again everything
                    # after what we had read then, so what this connection still held is not read.
                    return
                if self._ending:
                    continue  # after close / a fatal error, input is ignored until we close
                if isinstance(frame, bytes):
                    for action in self.dialect.incoming_binary(frame):
                        await self._on_action(action)
                else:
                    self.commands_received += 1
                    for action in self.dialect.incoming(frame):
                        await self._on_action(action)
        except ConnectionClosed as closed:
            # A close frame either way is a deliberate end (the client's, or ours or the library's
            # for a protocol error), not a lost network: only a connection gone without one is held.
            self._dropped = closed.rcvd is None and closed.sent is None
            if not self.done.is_set() and self.ws is ws:
                log.info("session=%s event=disconnect code=%s", self.sid, closed.rcvd.code if closed.rcvd else (closed.sent.code if closed.sent else 1006))

    def _held_back(self) -> bool:
        """Whether to read no further: finals owed (backpressure), or an upload sent faster than
        real time whose context passes are behind (:meth:`Session.held_for_passes`)."""
        if self.session.backpressured:
            return True
        started = self._first_audio_at
        return started is not None and self.session.held_for_passes(time.monotonic() - started)

    async def _wait_while(self, stalled: Any) -> None:
        """Wait (not reading) while ``stalled()``; each such wait is a stall for the keepalive."""
        if not stalled() or self.done.is_set():
            return
        self._stalled = True
        self._stalls += 1
        try:
            while stalled() and not self.done.is_set():
                self._progress.clear()
                await self._progress.wait()
        finally:
            self._stalled = False

    async def _idle(self, received: float) -> None:
        """No frame for ``idle_timeout_s``; ``received``: the session's audio (s) when the wait began."""
        if self._ending:
            return  # waiting for our own decodes, not for the client
        if self._container is not None and (self.session.audio_received_s != received or self._held_back()):
            return  # still decoding what the client sent (a file sent at once, on a slow or busy server)
        if self._rtc_audio_recent():
            return  # the audio flows over WebRTC, not over this socket
        if self._may_hold() and not await self._answers_ping(self.ws):
            # Silence from a connection that no longer answers: its network went away (no FIN
            # reached us). Hold the session for the client to resume instead of ending it.
            log.info("session=%s event=no_pong", self.sid)
            self.ws.transport.abort()
            return
        await self._fail(IdleTimeout(f"no audio or message for {self.limits.idle_timeout_s:g} s"))

    async def _answers_ping(self, ws: ServerConnection) -> bool:
        try:
            pong = await ws.ping()
            await asyncio.wait_for(asyncio.shield(pong), min(IDLE_PING_S, self.limits.keepalive_timeout_s or IDLE_PING_S))
            return True
        except (TimeoutError, ConnectionClosed):
            return False

    def _watch(self, ws: ServerConnection) -> None:
        """Keepalive pings, and heartbeat messages if the client asked for them, on ``ws``."""
        if self.limits.keepalive_interval_s > 0:
            self._spawn(self._keepalive(ws))
        if self.options.heartbeat_s > 0:
            self._spawn(self._heartbeats(ws))

    async def _heartbeats(self, ws: ServerConnection) -> None:
        """A ``heartbeat`` message whenever nothing was sent for ``heartbeat_s``, for as long as
        ``ws`` is the session's connection (none while the session is held for a resume)."""
        interval = self.options.heartbeat_s
        while not self.done.is_set() and self.ws is ws and not self._held:
            due = self._sent_at + interval - time.monotonic()
            if due > 0:
                await asyncio.sleep(due)  # a timer, not synchronisation
                continue
            try:
                await self._apply(self.session.heartbeat)
            except ConnectionClosed:
                return
            if self._sent_at + interval <= time.monotonic():
                return  # nothing went out (the session ended, or its connection dropped)

    async def _keepalive(self, ws: ServerConnection) -> None:
        """Ping every ``keepalive_interval_s``; a pong missing for ``keepalive_timeout_s`` over a
        window in which we read all the while and no audio came means the client stopped reading:
        ``results_not_read``. (Audio still coming means the pong is queued behind it: a fast upload
        on a busy server read its backlog for more than 2 s and was cut off so. A client that sends
        and never reads is cut off when a result cannot be sent for ``send_timeout_s``.)"""
        interval, timeout = self.limits.keepalive_interval_s, self.limits.keepalive_timeout_s
        while not self.done.is_set() and self.ws is ws:
            await asyncio.sleep(interval)  # a timer, not synchronisation
            stalls, received = self._stalls, self.bytes_received
            try:
                pong = await ws.ping()
                await asyncio.wait_for(asyncio.shield(pong), timeout)
            except TimeoutError:
                if self._stalled or self._stalls != stalls or self._ending:
                    continue  # we were not reading: the pong may be queued behind audio
                if self.bytes_received != received:
                    continue  # its audio kept coming: the pong is queued behind what it sent before it
                if self.ws is not ws:
                    return  # resumed meanwhile on another connection
                await self._not_reading(f"no pong for {timeout:g} s while the server was reading")
                return
            except ConnectionClosed:
                return

    async def _on_audio(self, data: bytes) -> None:
        if self.options.is_webrtc:
            await self._fail(InvalidMessage("this session's audio travels over WebRTC (encoding=webrtc): binary frames are ignored"))
            return
        if len(data) > self.limits.max_frame_bytes:
            await self._fail(FrameTooLarge(f"binary frame of {len(data)} bytes exceeds the limit of {self.limits.max_frame_bytes}"))
            return
        self.bytes_received += len(data)
        if self._first_audio_at is None:
            self._first_audio_at = time.monotonic()
        if self._container is not None:
            self._container.feed(data)
            if not self._container.has_room():  # rare: the decoder thread is behind by max_container_buffer_bytes
                self._stalled = True
                self._stalls += 1
                while not self._container.has_room() and not self.done.is_set():
                    await asyncio.sleep(0.01)
                self._stalled = False
            return
        assert self._pcm is not None
        try:
            planar = self._pcm.feed(data)
        except AsrError as error:
            await self._fail(error)
            return
        await self._audio(planar)

    async def _audio(self, planar: np.ndarray) -> None:
        arrived = time.monotonic()
        self._chunks += 1
        async with self._lock:
            if self.trace is None:
                await self._take_audio(planar, arrived)
            else:
                with self.trace.chunk(self._chunks, planar.shape[1] * 1000 / MODEL_RATE, arrived):
                    await self._take_audio(planar, arrived)

    async def _take_audio(self, planar: np.ndarray, arrived: float) -> None:
        """Caller holds the lock."""
        started = time.monotonic()
        outputs = self.session.receive_audio(planar)
        self._arrivals.append((self.session.received_samples, arrived))
        if len(self._arrivals) > _ARRIVALS_KEPT:
            del self._arrivals[: _ARRIVALS_KEPT // 2]
        self.metrics.audio_received.inc(planar.shape[1] / MODEL_RATE)
        await self._carry_out(outputs)
        self.metrics.chunk_processing.observe(time.monotonic() - started)

    async def _on_action(self, action: Any) -> None:
        """One thing a dialect made of a client's text frame."""
        if isinstance(action, bytes):
            await self._on_audio(action)
        elif isinstance(action, str):
            await self._on_text(action)
        elif isinstance(action, Reconfigure):
            await self._reconfigure(action)
        elif isinstance(action, AsrError):
            await self._fail(action)
        else:
            async with self._lock:
                await self._send(json.dumps(action, separators=(",", ":")))

    async def _reconfigure(self, change: Reconfigure) -> None:
        """New stream options (a vendor's session update, a call's start), taken only while no
        audio has arrived, and with no more channels than were admitted."""
        options = change.options
        if self.bytes_received or options.channels > self.options.channels:
            log.info("session=%s event=reconfigure_ignored (audio already received)", self.sid)
            return
        old = self.session
        self.session = Session(old.session_id, options, old.limits, old.model_name, self.server.vad, context=self.server.context, key=old.key,
                               extra=change.info, first_seq=old.seq)
        # Its `session` message only when asked (a call's start); else the first one stands.
        await self._apply(lambda: self.session.start(announce=change.announce))
        self.options = options
        self._pcm = _pcm_decoder(options)
        log.info("session=%s event=reconfigured options=%s", self.sid, json.dumps(options.to_wire(), separators=(",", ":")))

    async def _on_text(self, text: str) -> None:
        try:
            command = parse_client_message(text)
        except AsrError as error:
            await self._fail(error)
            return
        match command:
            case Finalize():
                log.info("session=%s event=finalize", self.sid)
                await self._apply(self.session.finalize)
            case CloseStream():
                log.info("session=%s event=close_requested", self.sid)
                self._client_closed()
                await self._end_of_input()
            case KeepAlive():
                pass
            case WebRtcOffer(sdp=sdp):
                await self._on_offer(sdp)

    # -- WebRTC ----------------------------------------------------------------------

    async def _on_offer(self, sdp: str) -> None:
        if not self.options.is_webrtc:
            await self._fail(InvalidMessage("webrtc_offer is only accepted on a session opened with encoding=webrtc"))
            return
        if self._rtc is not None and not self.resumes:
            await self._fail(InvalidMessage("this session already has its WebRTC connection; open a new session for another"))
            return
        await self._close_rtc()  # a resumed session negotiates a new peer connection in place of the old
        log.info("session=%s event=webrtc_offer", self.sid)
        ingest: RtcIngest | None = None

        # Only the current peer connection speaks for the session: a replaced one's late audio
        # or end (its close, its ICE failing on the old network) is ignored.
        async def on_audio(planar: np.ndarray) -> None:
            if self._rtc is ingest:
                await self._on_rtc_audio(planar)

        async def on_end(reason: str, error: AsrError | None) -> None:
            if self._rtc is ingest:
                await self._on_rtc_end(reason, error)

        ingest = self._rtc = RtcIngest(
            self.server.rtc, self.options.channels, on_audio, on_end, connect_timeout_s=self.limits.webrtc_connect_timeout_s, label=self.sid,
        )
        self.server.peers.add(self._rtc)
        self.metrics.webrtc_peers.set(len(self.server.peers))
        try:
            answer = await self._rtc.answer(sdp)
        except AsrError as error:
            await self._fail(error)
            return
        await self._apply(lambda: self.session.webrtc_answer(answer))

    def _rtc_audio_recent(self) -> bool:
        """Whether a WebRTC session is still in progress: audio came recently, or the peer is still connecting."""
        if self._rtc is None:
            return False
        last = self._rtc.last_audio_at
        if last is None:
            # Offer answered, no audio yet: the connect timeout (webrtc_failed) decides, not the idle one.
            return True
        return time.monotonic() - last < self.limits.idle_timeout_s

    async def _on_rtc_audio(self, planar: np.ndarray) -> None:
        """Live audio: fed at once, or held (bounded) while the session is backpressured."""
        if self._ending or self.done.is_set():
            return
        try:
            await self._take_live_audio(planar)
        except ConnectionClosed:
            self.done.set()

    async def _take_live_audio(self, planar: np.ndarray) -> None:
        if self._first_audio_at is None:
            self._first_audio_at = time.monotonic()
        if not self._backlog and not self.session.backpressured:
            await self._audio(planar)
            return
        if not self._backlog.push(planar):
            await self._fail(AudioOverrun(
                f"the server fell more than {self.limits.max_live_backlog_s:g} s behind this live stream; what it had was finalized",
                retry_after=10.0,
            ))
            return
        await self._feed_backlog(until_backpressured=True)

    async def _feed_backlog(self, *, until_backpressured: bool) -> None:
        while self._backlog and not (until_backpressured and self.session.backpressured):
            await self._audio(self._backlog.pop())

    async def _on_rtc_end(self, reason: str, error: AsrError | None) -> None:
        """The track ended or the peer connection closed or failed: finish the session."""
        if self._ending or self.done.is_set():
            return
        if self._held:
            # Its network went away with the WebSocket: the client negotiates anew when it resumes.
            log.info("session=%s event=webrtc_ended_while_held reason=%s", self.sid, reason)
            await self._close_rtc()
            self._rtc = None
            return
        if error is not None:
            await self._fail_safely(error)
            return
        log.info("session=%s event=webrtc_ended reason=%s", self.sid, reason)
        self._client_closed()
        try:
            await self._end_of_input()
        except ConnectionClosed:
            self.done.set()

    def _client_closed(self) -> None:
        """The client ended its stream (``close``, a WebRTC hang-up): no audio follows, and the
        passes it is still owed go ahead of other sessions' passes."""
        self._ending = self._closing = True
        if self.server.scheduler is not None:
            self.server.scheduler.hurry(self.sid)

    async def _end_of_input(self) -> None:
        if self.options.is_webrtc:
            await self._feed_backlog(until_backpressured=False)
            await self._close_rtc()
        elif self._container is not None:
            self._container.end()
            if self._container_task is not None:
                await asyncio.shield(self._container_task)
        elif self._pcm is not None:
            tail = self._pcm.flush()
            if tail.shape[1]:
                await self._audio(tail)
        await self._apply(self.session.end_of_stream)

    async def _pump_container(self) -> None:
        """Decoded audio into the session, then the decoder's error if it raised one. A task of its
        own: a connection that dropped under it (and cannot be held) ends the session, as in
        :meth:`_decode`, instead of leaving asyncio an exception nobody retrieves."""
        assert self._container is not None
        try:
            error = await ContainerPump(self._container, self.sid).run(self._container_audio, self.done)
            if error is not None:
                await self._fail(error)
        except ConnectionClosed:
            self.done.set()
        except Exception:
            log.exception("session=%s event=crash", self.sid)
            await self._fail_safely(InternalError("internal error; the session was closed"))

    async def _container_audio(self, planar: np.ndarray) -> None:
        await self._wait_while(self._held_back)
        await self._audio(planar)

    # -- carrying out the core's outputs ---------------------------------------------

    async def _fail(self, error: AsrError) -> None:
        if self.session.state is SessionState.CLOSED:
            return  # already over (a shut-down reaching a stream that just completed): its outcome stands
        self.metrics.errors.labels(error.code).inc()
        log.info("session=%s event=error code=%s message=%s", self.sid, error.code, error.message)
        if wire_info(error).close_code is not None:
            self._ending, self._closing = True, False
            self.outcome = "server_error" if error.code in ("internal_error", "inference_failed") else "client_error"
            if error.code == "shutting_down":
                self.outcome = "shutdown"
            if self._container is not None:
                self._container.close()
        await self._apply(lambda: self.session.fail(error))

    async def _fail_safely(self, error: AsrError) -> None:
        try:
            await self._fail(error)
        except ConnectionClosed:
            self.done.set()

    async def _apply(self, produce: Callable[[], list[SessionOutput]]) -> None:
        """Carry out what a call into the session returns; the call is made holding the lock, so
        that messages go out (and into the replay log) in the order of their seq. (Made before
        the lock, a message could wait behind a resume that replays the log and sends `resumed`
        with the next seq: out of order, a client drops it as one it already had.)"""
        async with self._lock:
            await self._carry_out(produce())
        if self.session.draining and self._context_deadline is None and not self.done.is_set():
            # The context pass refines the last finals before `closed`, within a bound.
            self._context_deadline = asyncio.get_running_loop().call_later(
                self.limits.context_close_s, lambda: self._spawn(self._apply_safely(self.session.close_context)))

    async def _apply_safely(self, produce: Callable[[], list[SessionOutput]]) -> None:
        try:
            await self._apply(produce)
        except ConnectionClosed:
            self.done.set()

    async def _carry_out(self, outputs: list[SessionOutput]) -> None:
        """Caller holds the lock."""
        for output in outputs:
            match output:
                case Send():
                    self._observe(output)
                    text = json.dumps(output.message, separators=(",", ":"))
                    self.log.add(output.message["seq"], text)
                    self.transcript.add(output.message, text)
                    for follower in list(self.followers):
                        follower.push(text)
                    if output.message["type"] in ("revision", "settled") or (output.message["type"] == "final" and output.message["text"]):
                        self.server.notify_transcript_change(self, output.message)
                    if isinstance(self.dialect, NativeDialect):
                        await self._send(text)
                    else:
                        for message in self.dialect.outgoing(output.message):
                            await self._send(json.dumps(message, separators=(",", ":")))
                case SubmitJob():
                    self._spawn(self._decode(output))
                case ContextDecided():
                    self._observe_context(output)
                case AnswerFailed():
                    self._answer_failed(output)
                case WithdrawJob():
                    # If it was still waiting, its _decode task now gets the skip; if it runs, the
                    # core may go on without its answer.
                    if self.server.scheduler is not None and not self.server.scheduler.withdraw(output.job):
                        await self._carry_out(self.session.job_running(output.job))
                case Close():
                    if output.code == 1000 and self.outcome == "disconnected":
                        self.outcome = "completed"
                    # Kept with the ended session: a client whose connection dropped before this
                    # reached it resumes, and gets what it missed and this close (AsrServer._resume).
                    self.closed_with = (output.code, output.reason)
                    await self.ws.close(output.code, output.reason)
                    self.done.set()

    async def _send(self, text: str) -> None:
        """Write one message; a client that leaves results unread past ``send_timeout_s`` is cut off.

        On a resumable session a message that cannot go out stays in the replay log: the reader
        sees the drop too and holds the session."""
        if self._held:
            return
        started = time.monotonic()
        try:
            await asyncio.wait_for(self.ws.send(text), timeout=self.limits.send_timeout_s)
            self._sent_at = time.monotonic()
            self.metrics.result_send.observe(self._sent_at - started)
        except TimeoutError:
            await self._not_reading(f"no result read for {self.limits.send_timeout_s:g} s")
            if not self._may_hold():
                raise ConnectionClosed(None, None) from None
        except ConnectionClosed:
            if not self._may_hold():
                raise

    async def _not_reading(self, why: str) -> None:
        """The client does not read what we send: nothing more can reach it, so cut it off
        (a resumable session is held: the client may be on a dead network path, and come back)."""
        self.metrics.errors.labels(ResultsNotRead.code).inc()
        log.info("session=%s event=error code=results_not_read message=%s", self.sid, why)
        if not self._may_hold():
            self._ending = True
            self.outcome = "client_error"
            self.done.set()
        self.ws.transport.abort()

    async def _decode(self, submit: SubmitJob) -> None:
        scheduler = self.server.scheduler
        assert scheduler is not None
        queued = time.monotonic()
        kind = submit.job.request.kind.value
        arrived = self._arrival_of(submit.job.audio_end)
        if arrived is not None:
            self.metrics.audio_to_queue.labels(kind).observe(max(0.0, queued - arrived))
        trace = self.trace.decode(kind, submit.job.channel, submit.job.utterance, queued) if self.trace is not None else None
        outcome = "cancelled"
        hypothesis: Hypothesis | None = None
        try:
            try:
                job, hypothesis = await scheduler.decode(self.sid, submit.job, self._weight, self.session.refresh_job, trace=trace)
            except JobFailed as failure:
                outcome = "failed"
                self.metrics.errors.labels(DecodeFailed.code).inc()
                log.warning("session=%s event=decode_failed channel=%d utterance=%d", self.sid, failure.job.channel, failure.job.utterance)
                await self._apply(functools.partial(self.session.job_failed, failure.job))
            else:
                outcome = "skipped" if hypothesis is None else "done"
                outputs = functools.partial(self.session.job_skipped, job) if hypothesis is None else functools.partial(self.session.job_done, job, hypothesis)
                if trace is None:
                    await self._apply(outputs)
                else:
                    with trace.sending():
                        await self._apply(outputs)
        except asyncio.CancelledError:
            raise
        except ConnectionClosed:
            self.done.set()
        except Exception:
            log.exception("session=%s event=crash", self.sid)
            await self._fail_safely(InternalError("internal error; the session was closed"))
        finally:
            if trace is not None:
                trace.end(outcome)
            if log.isEnabledFor(logging.DEBUG):
                self._log_decode(submit.job, outcome, time.monotonic() - queued, hypothesis)
        self._progress.set()

    def _log_decode(self, job: DecodeJob, outcome: str, took_s: float, hypothesis: Hypothesis | None) -> None:
        """A decode's answer, on the session's debug log (the runner's own debug lines name no session)."""
        request = job.request
        cut_back = hypothesis is not None and hypothesis.cut_back  # the scheduler may have made it a burst final
        how = "".join(flag for flag, on in (("+speculative", job.speculative), ("+cut_back", cut_back), ("+short", request.short_window), ("+settle", request.settle)) if on)
        log.debug(
            "session=%s event=decoded kind=%s%s channel=%d utterance=%d audio_s=%.2f audio_end_s=%.2f took_s=%.2f outcome=%s text=%r",
            self.sid, request.kind.value, how, job.channel, job.utterance, request.duration, job.audio_end / MODEL_RATE, took_s, outcome,
            hypothesis.text if hypothesis is not None else None,
        )

    def _observe(self, send: Send) -> None:
        event = send.event
        now = time.monotonic()
        if isinstance(event, SpeechStart | Interim | Final):
            self._observe_timing(event, now)
        if isinstance(event, Interim) and not self._first_interim_seen and self._first_audio_at is not None:
            self._first_interim_seen = True
            self.metrics.first_interim.observe(now - self._first_audio_at)
        elif isinstance(event, Revision):
            self.metrics.revisions.labels(event.pass_name).inc()
            log.info("session=%s event=revision pass=%s channel=%d utterances=%d-%d chars=%d", self.sid, event.pass_name, event.channel, event.first, event.last, len(event.text))
        elif isinstance(event, Final):
            self.metrics.audio_transcribed.inc(max(0.0, event.end - event.start))
            arrived = self._arrival_of(int(event.speech_end * MODEL_RATE))
            if arrived is not None and event.text:
                self.metrics.final_latency.observe(max(0.0, now - arrived), exemplar=self._exemplar())
            if event.text and self.options.revisions:
                self._finals_shown[(event.channel, event.utterance)] = now
                if len(self._finals_shown) > _FINALS_SHOWN_MAX:  # passes given up at the close, or records trimmed unseen
                    del self._finals_shown[next(iter(self._finals_shown))]
            for guard in event.dropped:
                self.metrics.guard_drops.labels(guard).inc()
            log.info(
                "session=%s event=final channel=%d utterance=%d reason=%s chars=%d dropped=%s",
                self.sid, event.channel, event.utterance, event.reason.value, len(event.text), ",".join(event.dropped) or "-",
            )

    def _answer_failed(self, event: AnswerFailed) -> None:
        """A bug the decoder contained (the answer was taken as a failed decode's): counted, and logged
        with its traceback the first time in the session (one that hits every decode would fill the
        log with the same one)."""
        self.metrics.answer_failures.labels(event.decode).inc()
        if event.decode in ("final", "audio"):  # the session sent decode_failed or audio_dropped for it
            self.metrics.errors.labels(DecodeFailed.code if event.decode == "final" else AudioDropped.code).inc()
        self._answer_failures += 1
        first = self._answer_failures == 1
        log.error(
            "session=%s event=answer_failed decode=%s channel=%d utterance=%d failures=%d error=%r%s", self.sid, event.decode, event.channel, event.utterance,
            self._answer_failures, event.error, "" if first else " (traceback logged at the first)", exc_info=event.error if first else None,
        )

    def _observe_context(self, event: ContextDecided) -> None:
        """How long each final the pass decided had shown its first-pass text (how far passes lag),
        and how many it passed over unheard."""
        now = time.monotonic()
        for utterance in event.utterances:
            shown = self._finals_shown.pop((event.channel, utterance), None)
            if shown is not None:
                self.metrics.context_lag.observe(max(0.0, now - shown), exemplar=self._exemplar())
        for utterance in event.passed_over:
            if self._finals_shown.pop((event.channel, utterance), None) is not None:
                self.metrics.finals_passed_over.inc()

    def _observe_timing(self, event: SpeechStart | Interim | Final, now: float) -> None:
        """Time from an utterance's first speech to its first result, and how fresh an interim is."""
        key = (event.channel, event.utterance)
        if isinstance(event, SpeechStart):
            arrived = self._arrival_of(int(event.at * MODEL_RATE))
            if arrived is not None and len(self._speech_arrivals) < 64:  # bounded: a result pops each
                self._speech_arrivals[key] = arrived
            return
        if isinstance(event, Interim):
            newest = self._arrival_of(int(event.end * MODEL_RATE))
            if newest is not None:
                self.metrics.interim_freshness.observe(max(0.0, now - newest), exemplar=self._exemplar())
        started = self._speech_arrivals.pop(key, None)
        if started is not None and (isinstance(event, Interim) or event.text):
            self.metrics.speech_to_first_result.observe(max(0.0, now - started), exemplar=self._exemplar())

    def _exemplar(self) -> dict[str, str] | None:
        """The stream's trace id on a latency observation, when it is traced."""
        return {"trace_id": self.trace.trace_id} if self.trace is not None else None

    def _arrival_of(self, sample: int) -> float | None:
        """When the audio up to ``sample`` had arrived (None if long forgotten)."""
        i = bisect.bisect_left(self._arrivals, sample, key=lambda a: a[0])
        return self._arrivals[i][1] if i < len(self._arrivals) else None

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _close_rtc(self) -> None:
        rtc = self._rtc
        if rtc is not None:
            await rtc.close()
            self.server.peers.discard(rtc)
            self.metrics.webrtc_peers.set(len(self.server.peers))

    async def _cleanup(self) -> None:
        self.done.set()
        for follower in list(self.followers):
            follower.end()
        self.server.keep_ended(self)
        if self._context_deadline is not None:
            self._context_deadline.cancel()
        self._progress.set()
        await self._close_rtc()
        if self._container is not None:
            self._container.close()
        if self.server.scheduler is not None:
            self.server.scheduler.cancel_owner(self.sid)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.ws.state.name != "CLOSED":
            try:
                await asyncio.wait_for(self.ws.close(1000 if self.outcome == "completed" else 1011), timeout=2)
            except (ConnectionClosed, TimeoutError):
                pass


async def replay_ended(ws: ServerConnection, messages: list[str], closed_with: tuple[int, str], send_timeout_s: float) -> None:
    """A resume of a session that ended while its client was away (the connection dropped after
    the client's ``close``, before ``closed`` reached it): the ``messages`` it missed, then the
    close the session ended with; no ``resumed``, as there is nothing to go on with."""
    try:
        for text in messages:
            await asyncio.wait_for(ws.send(text), timeout=send_timeout_s)
        await ws.close(*closed_with)
    except (ConnectionClosed, TimeoutError):
        ws.transport.abort()


def _pcm_decoder(options: StreamOptions) -> PcmDecoder | None:
    """The decoder of a raw encoding's frames (containers and WebRTC have their own)."""
    raw = not (options.is_container or options.is_webrtc)
    return PcmDecoder(options.encoding, options.sample_rate or 16000, options.channels) if raw else None


async def _first_of(*events: asyncio.Event, timeout: float | None) -> None:
    """Until one of ``events`` is set, or ``timeout`` seconds (None: no limit)."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
