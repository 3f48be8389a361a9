"""The WebSocket shell: HTTP routes, and one :class:`Connection` per stream.

It reads frames, feeds the session core, and carries out what the core
returns (send a message, run a decode, close). Decisions live in the core;
this file only moves bytes, arms timers and keeps metrics.
"""

from __future__ import annotations

import asyncio
import bisect
import http
import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from ..audio.decode import MODEL_RATE, ContainerDecoder, PcmDecoder
from ..errors import (
    AsrError,
    AudioOverrun,
    InvalidMessage,
    FrameTooLarge,
    IdleTimeout,
    OverloadError,
    DecodeFailed,
    InternalError,
    MemoryPressure,
    NotReady,
    ResultsNotRead,
    ShuttingDown,
    wire_info,
)
from ..events import Final, Interim, SubmitJob, WithdrawJob
from ..inference.types import Runner
from ..metrics import Metrics
from ..options import Limits, RtcOptions, StreamOptions, parse_stream_options
from ..protocol.messages import CloseStream, Finalize, KeepAlive, MessageWriter, WebRtcOffer, parse_client_message
from ..scheduler import Scheduler
from ..scheduler.engine import JobFailed
from ..scheduler.budget import MemoryBudget, audio_bytes, process_rss, stream_bytes
from ..scheduler.governor import GovernorOptions, InterimLoad, LoadGovernor
from ..scheduler.policy import WEIGHTS, BatchLimits, Priority
from ..session import Close, Send, Session, SessionOutput
from .static import load_static
from .webrtc import RtcIngest, restrict_host_addresses

__all__ = ["AsrServer"]

log = logging.getLogger("asr_server.session")
server_log = logging.getLogger("asr_server.server")

LISTEN_PATH = "/v1/listen"


class AsrServer:
    """Owns the model runner, the scheduler, metrics and the listening socket.

    ``await start()`` listens at once; call :meth:`set_runner` when the model
    is loaded and warmed up (``/healthz`` answers 503 until then).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8765,
        limits: Limits = Limits(),
        model_name: str = "",
        *,
        budget: MemoryBudget | None = None,
        governor: GovernorOptions = GovernorOptions(),
        batch: BatchLimits = BatchLimits(),
        memory_probe: Callable[[], int] = process_rss,
        tick_s: float = 0.25,
        workers: int = 1,
        rtc: RtcOptions = RtcOptions(),
        ssl: Any = None,
    ) -> None:
        """``budget``: memory admission (None: none); ``memory_probe``: bytes in use now, for
        the governor's memory-critical step (compared with ``budget.total``); ``rtc``:
        ICE servers and host addresses for ``encoding=webrtc`` sessions; ``ssl``: an
        :class:`ssl.SSLContext` to serve https/wss (browsers give the microphone only to
        secure pages, or to localhost)."""
        self.host = host
        self.port = port
        self.limits = limits
        self.model_name = model_name
        self.budget = budget
        self.batch_limits = batch
        self.governor = LoadGovernor(governor)
        self.memory_probe = memory_probe
        self.tick_s = tick_s
        self.workers = workers
        self.rtc = rtc
        self.ssl = ssl
        if rtc.host_addresses:
            restrict_host_addresses(rtc.host_addresses)
        self.metrics = Metrics()
        self.scheduler: Scheduler | None = None
        self.runner: Runner | None = None
        self.interim_runner: Runner | None = None
        self._server: Server | None = None
        self._connections: set[Connection] = set()
        self.peers: set[RtcIngest] = set()  # open WebRTC peer connections
        self.static = load_static()
        self._stopping = False
        self._ticker: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self.scheduler is not None and not self._stopping

    @property
    def active_channels(self) -> int:
        return sum(c.options.channels for c in self._connections)

    @property
    def reserved_bytes(self) -> int:
        return sum(c.reserved_bytes for c in self._connections)

    def stream_bytes(self, options: StreamOptions) -> int:
        buffered = 0
        if options.is_container:
            buffered = self.limits.max_container_buffer_bytes
        elif options.is_webrtc:
            buffered = audio_bytes(self.limits.max_live_backlog_s, options.channels)
        return stream_bytes(options.channels, options.max_utterance_s, self.limits.max_pending_finals, buffered)

    async def start(self) -> None:
        self._server = await serve(
            self._handle,
            self.host,
            self.port,
            process_request=self._route,
            # Frames up to twice the limit are read so that we can answer with our own
            # frame_too_large error; anything larger is cut off by websockets (close 1009).
            max_size=2 * self.limits.max_frame_bytes,
            max_queue=16,
            ping_interval=20,
            ping_timeout=20,
            ssl=self.ssl,
        )
        sock = next(iter(self._server.sockets))
        self.port = sock.getsockname()[1]
        server_log.info("listening on %s://%s:%d%s", "wss" if self.ssl else "ws", self.host, self.port, LISTEN_PATH)

    def set_runner(self, runner: Runner, interim_runner: Runner | None = None, budget: MemoryBudget | None = None) -> None:
        """The model is loaded and warm: start serving (``budget`` may come with it, measured)."""
        self.runner = runner
        self.interim_runner = interim_runner
        if budget is not None:
            self.budget = budget
        self.scheduler = Scheduler(runner, self.metrics, self.batch_limits, interim_runner, workers=self.workers)
        self.scheduler.start()
        self._ticker = asyncio.get_running_loop().create_task(self._tick_forever(), name="asr-governor")
        self.metrics.model_ready.set(1)
        if self.budget is not None:
            self.metrics.memory_budget.set(self.budget.total)

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                await self.tick()
            except Exception:
                server_log.exception("governor tick failed")

    async def tick(self) -> None:
        """Feed the governor; announce a new level; shed a batch stream if memory is critical."""
        assert self.scheduler is not None
        loop = asyncio.get_running_loop()
        before = self.governor.level
        state = self.scheduler.state(loop.time())
        used = self.memory_probe() if self.budget is not None else 0
        level = self.governor.observe(loop.time(), state.oldest_final_wait, used, self.budget.total if self.budget else 0, state.oldest_interim_wait)
        self.metrics.memory_used.set(used)
        self.metrics.degradation_level.set(int(level))
        if level != before:
            server_log.info("load level %d -> %d (%s) oldest_final_wait=%.2fs oldest_interim_wait=%.2fs finals=%d interims=%d",
                            before, level, level.name.lower(), state.oldest_final_wait, state.oldest_interim_wait, state.finals, state.interims)
            await self.announce_level()
        # One stream at a time: the next is shed only once the last has finished and freed its memory.
        if self.governor.memory_critical and not any(c.shedding for c in self._connections):
            victims = [c for c in self._connections if c.options.priority == Priority.BATCH.value]
            if victims:
                victim = min(victims, key=lambda c: c.started_at)
                server_log.warning("memory critical (%d of %d bytes): closing batch session %s", used, self.budget.total if self.budget else 0, victim.sid)
                self.metrics.streams_shed.inc()
                await victim.shed()

    async def announce_level(self) -> None:
        """Apply the governor's level to every session's interims; each is told if its own change."""
        self.metrics.degradation_level.set(int(self.governor.level))
        for conn in list(self._connections):
            await conn.set_load(self.interim_load())

    def interim_load(self) -> InterimLoad:
        """What the current level does to interims."""
        return self.governor.interim_load(self.interim_runner is not None)

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop accepting, tell every client, finish what they are owed, close."""
        self._stopping = True
        if self._server is not None:
            self._server.close(close_connections=False)
        conns = list(self._connections)
        for conn in conns:
            await conn.shut_down()
        if conns:
            await asyncio.wait([asyncio.ensure_future(c.done.wait()) for c in conns], timeout=grace_s)
        if self._server is not None:
            self._server.close(close_connections=True)
            await self._server.wait_closed()
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        if self.scheduler is not None:
            await self.scheduler.stop()

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.wait_closed()

    # -- HTTP ------------------------------------------------------------------------

    def _route(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == LISTEN_PATH:
            return None  # go on with the WebSocket handshake
        if path == "/healthz":
            body = {
                "status": "ok" if self.ready else ("stopping" if self._stopping else "starting"),
                "model": self.model_name,
                "active_channels": self.active_channels,
                "max_channels": self.limits.max_channels,
                "load_level": int(self.governor.level),
                "accepting": [p.value for p in Priority if self.governor.admits(p)] if self.ready else [],
                "memory": {**self.budget.to_wire(), "reserved_mib": self.reserved_bytes >> 20} if self.budget else None,
            }
            status = http.HTTPStatus.OK if self.ready else http.HTTPStatus.SERVICE_UNAVAILABLE
            return _response(status, json.dumps(body).encode(), "application/json")
        if path == "/metrics":
            return _response(http.HTTPStatus.OK, self.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
        page = self.static.get(path)
        if page is not None:
            return _response(http.HTTPStatus.OK, page.body, page.content_type, cache="no-cache")
        return _response(http.HTTPStatus.NOT_FOUND, b'{"error": "not found"}', "application/json")

    # -- WebSocket -------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        session_id = uuid.uuid4().hex[:16]
        started = time.monotonic()
        writer_for_refusal = MessageWriter(session_id)
        try:
            options = self._options_for(ws)
            self._admit(options)
        except AsrError as error:
            await self._refuse(ws, writer_for_refusal, error, session_id)
            return
        # No await between the capacity check and this add: admission is atomic.
        webrtc = self.rtc.to_wire() if options.is_webrtc else None
        conn = Connection(self, ws, Session(session_id, options, self.limits, self.model_name, webrtc=webrtc))
        self._connections.add(conn)
        self.metrics.sessions_started.inc()
        self.metrics.active_sessions.inc()
        try:
            await conn.run()
        finally:
            self._connections.discard(conn)
            self.metrics.active_sessions.dec()
            self.metrics.sessions_ended.labels(conn.outcome).inc()
            self.metrics.session_duration.observe(time.monotonic() - started)
            log.info(
                "session=%s event=end outcome=%s received_s=%.2f transcribed_s=%.2f wall_s=%.2f",
                session_id, conn.outcome, conn.session.audio_received_s, conn.session.audio_transcribed_s, time.monotonic() - started,
            )

    def _options_for(self, ws: ServerConnection) -> StreamOptions:
        if self._stopping:
            raise ShuttingDown("the server is shutting down; connect to another instance", retry_after=5.0)
        if self.runner is None:
            raise NotReady("the model is still loading; retry shortly", retry_after=2.0)
        query = parse_qs(urlsplit(ws.request.path if ws.request else "").query, keep_blank_values=True)
        return parse_stream_options(query, self.runner.languages)

    def _admit(self, options: StreamOptions) -> None:
        """Refuse, before any audio, a stream past the channel or memory capacity, or at a refusing load level."""
        limit = self.limits.max_channels
        if limit and self.active_channels + options.channels > limit:
            raise OverloadError(
                f"the server is at capacity ({self.active_channels} of {limit} channels busy); retry later or elsewhere",
                retry_after=5.0,
            )
        if self.budget is not None and not self.budget.fits(self.reserved_bytes, self.stream_bytes(options)):
            raise OverloadError(
                f"the server's memory budget is spoken for ({self.reserved_bytes >> 20} of {self.budget.for_streams >> 20} MiB); retry later or elsewhere",
                retry_after=5.0,
            )
        if not self.governor.admits(Priority(options.priority)):
            raise OverloadError(
                f"the server is overloaded (load level {int(self.governor.level)}) and not taking new {options.priority} streams; retry later",
                retry_after=10.0,
            )

    async def _refuse(self, ws: ServerConnection, writer: MessageWriter, error: AsrError, session_id: str) -> None:
        self.metrics.errors.labels(error.code).inc()
        self.metrics.sessions_ended.labels("refused").inc()
        log.info("session=%s event=refused code=%s message=%s", session_id, error.code, error.message)
        try:
            await ws.send(json.dumps(writer.error(error)))
            await ws.close(wire_info(error).close_code or 1008, error.code)
        except ConnectionClosed:
            pass


def _response(status: http.HTTPStatus, body: bytes, content_type: str, cache: str = "no-store") -> Response:
    headers = Headers([
        ("Content-Type", content_type), ("Content-Length", str(len(body))), ("Cache-Control", cache),
        ("X-Content-Type-Options", "nosniff"),
    ])
    return Response(status.value, status.phrase, headers, body)


class Connection:
    """The shell around one :class:`Session`."""

    def __init__(self, server: AsrServer, ws: ServerConnection, session: Session) -> None:
        self.server = server
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
        raw = not (self.options.is_container or self.options.is_webrtc)
        self._pcm = PcmDecoder(self.options.encoding, self.options.sample_rate or 16000, self.options.channels) if raw else None
        self._container: ContainerDecoder | None = None
        self._rtc: RtcIngest | None = None
        # WebRTC audio that arrived while the session was backpressured (it cannot be slowed).
        self._backlog: deque[np.ndarray] = deque()
        self._backlog_samples = 0  # kept with the deque: checked on every live frame
        self._container_task: asyncio.Task[None] | None = None
        self._ending = False
        self.started_at = time.monotonic()
        self.reserved_bytes = server.stream_bytes(self.options)
        self.shedding = False
        self._weight = WEIGHTS[Priority(self.options.priority)]

    @property
    def sid(self) -> str:
        return self.session.session_id

    async def run(self) -> None:
        log.info("session=%s event=start options=%s", self.sid, json.dumps(self.options.to_wire(), separators=(",", ":")))
        try:
            await self._apply(self.session.start())
            if self.server.governor.level:
                await self.set_load(self.server.interim_load())  # admitted under load: start degraded
            if self.options.is_container:
                self._container = ContainerDecoder(self.options.encoding, self.options.channels, self.limits.max_container_buffer_bytes)
                self._container_task = self._spawn(self._pump_container())
            reader = asyncio.ensure_future(self._read())
            finished = asyncio.ensure_future(self.done.wait())
            await asyncio.wait([reader, finished], return_when=asyncio.FIRST_COMPLETED)
            finished.cancel()
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                raise reader.exception()  # type: ignore[misc]
            reader.cancel()
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("session=%s event=crash", self.sid)
            self.outcome = "server_error"
            await self._apply_safely(self.session.fail(InternalError("internal error; the session was closed")))
        finally:
            await self._cleanup()

    async def set_load(self, load: InterimLoad) -> None:
        try:
            await self._apply(self.session.set_load(load))
        except (ConnectionClosed, TimeoutError):
            self.done.set()

    async def shed(self) -> None:
        """Memory critical: finish this stream (finals flushed), close 1013."""
        self.shedding = True
        try:
            await self._fail(MemoryPressure("the server is short of memory and closed this batch stream after its last final; retry later", retry_after=30.0))
        except ConnectionClosed:
            self.done.set()

    async def shut_down(self) -> None:
        """Server stopping: tell the client, finalize what is held, close 1001."""
        try:
            await self._fail(ShuttingDown("the server is shutting down; reconnect to another instance", retry_after=5.0))
        except ConnectionClosed:
            self.done.set()

    # -- reading ---------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while True:
                while self.session.backpressured and not self.done.is_set():
                    self._progress.clear()
                    await self._progress.wait()
                try:
                    frame = await asyncio.wait_for(self.ws.recv(), timeout=self.limits.idle_timeout_s)
                except TimeoutError:
                    if self._ending:
                        continue  # waiting for our own decodes, not for the client
                    if self._rtc_audio_recent():
                        continue  # the audio flows over WebRTC, not over this socket
                    await self._fail(IdleTimeout(f"no audio or message for {self.limits.idle_timeout_s:g} s"))
                    continue
                if self._ending:
                    continue  # after close / a fatal error, input is ignored until we close
                if isinstance(frame, bytes):
                    await self._on_audio(frame)
                else:
                    await self._on_text(frame)
        except ConnectionClosed:
            if not self.done.is_set():
                log.info("session=%s event=disconnect", self.sid)
            self.done.set()

    async def _on_audio(self, data: bytes) -> None:
        if self.options.is_webrtc:
            await self._fail(InvalidMessage("this session's audio travels over WebRTC (encoding=webrtc): binary frames are ignored"))
            return
        if len(data) > self.limits.max_frame_bytes:
            await self._fail(FrameTooLarge(f"binary frame of {len(data)} bytes exceeds the limit of {self.limits.max_frame_bytes}"))
            return
        if self._first_audio_at is None:
            self._first_audio_at = time.monotonic()
        if self._container is not None:
            self._container.feed(data)
            while not self._container.has_room() and not self.done.is_set():
                await asyncio.sleep(0.01)  # rare: the decoder thread is behind by max_container_buffer_bytes
            return
        assert self._pcm is not None
        try:
            planar = self._pcm.feed(data)
        except AsrError as error:
            await self._fail(error)
            return
        await self._audio(planar)

    async def _audio(self, planar: np.ndarray) -> None:
        async with self._lock:
            outputs = self.session.receive_audio(planar)
            self._arrivals.append((self.session.received_samples, time.monotonic()))
            if len(self._arrivals) > 8192:
                del self._arrivals[:4096]
            self.metrics.audio_received.inc(planar.shape[1] / 16000)
            await self._carry_out(outputs)

    async def _on_text(self, text: str) -> None:
        try:
            command = parse_client_message(text)
        except AsrError as error:
            await self._fail(error)
            return
        match command:
            case Finalize():
                log.info("session=%s event=finalize", self.sid)
                await self._apply(self.session.finalize())
            case CloseStream():
                log.info("session=%s event=close_requested", self.sid)
                self._ending = True
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
        if self._rtc is not None:
            await self._fail(InvalidMessage("this session already has its WebRTC connection; open a new session for another"))
            return
        log.info("session=%s event=webrtc_offer", self.sid)
        self._rtc = RtcIngest(
            self.server.rtc, self.options.channels, self._on_rtc_audio, self._on_rtc_end,
            connect_timeout_s=self.limits.webrtc_connect_timeout_s, label=self.sid,
        )
        self.server.peers.add(self._rtc)
        self.metrics.webrtc_peers.set(len(self.server.peers))
        try:
            answer = await self._rtc.answer(sdp)
        except AsrError as error:
            await self._fail(error)
            return
        await self._apply(self.session.webrtc_answer(answer))

    def _rtc_audio_recent(self) -> bool:
        last = self._rtc.last_audio_at if self._rtc is not None else None
        return last is not None and time.monotonic() - last < self.limits.idle_timeout_s

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
        self._backlog.append(planar)
        self._backlog_samples += planar.shape[1]
        if self._backlog_samples > self.limits.max_live_backlog_s * MODEL_RATE:
            self._backlog.clear()
            self._backlog_samples = 0
            await self._fail(AudioOverrun(
                f"the server fell more than {self.limits.max_live_backlog_s:g} s behind this live stream; what it had was finalized",
                retry_after=10.0,
            ))
            return
        await self._feed_backlog(until_backpressured=True)

    async def _feed_backlog(self, *, until_backpressured: bool) -> None:
        while self._backlog and not (until_backpressured and self.session.backpressured):
            planar = self._backlog.popleft()
            self._backlog_samples -= planar.shape[1]
            await self._audio(planar)

    async def _on_rtc_end(self, reason: str, error: AsrError | None) -> None:
        """The track ended or the peer connection closed or failed: finish the session."""
        if self._ending or self.done.is_set():
            return
        if error is not None:
            await self._fail(error)
            return
        log.info("session=%s event=webrtc_ended reason=%s", self.sid, reason)
        self._ending = True
        try:
            await self._end_of_input()
        except ConnectionClosed:
            self.done.set()

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
        await self._apply(self.session.end_of_stream())

    async def _pump_container(self) -> None:
        """Run the container decoder in a thread; feed its audio in order."""
        assert self._container is not None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[np.ndarray | AsrError | None] = asyncio.Queue(maxsize=8)
        decoder = self._container

        def work() -> None:
            def put(item: np.ndarray | AsrError | None) -> bool:
                future = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
                while True:
                    try:
                        future.result(timeout=0.5)
                        return True
                    except TimeoutError:
                        if self.done.is_set():
                            future.cancel()
                            return False

            try:
                for planar in decoder.frames():
                    if not put(planar):
                        return
            except AsrError as error:
                put(error)
                return
            except Exception:
                log.exception("session=%s event=container_decoder_crash", self.sid)
                put(InternalError("audio decoding failed"))
                return
            put(None)

        # A thread of its own (not the shared executor): it lives as long as the stream.
        finished: asyncio.Future[None] = loop.create_future()

        def mark_finished() -> None:
            if not finished.done():
                finished.set_result(None)

        def run_thread() -> None:
            try:
                work()
            finally:
                loop.call_soon_threadsafe(mark_finished)

        threading.Thread(target=run_thread, name=f"decode-{self.sid}", daemon=True).start()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, AsrError):
                    await self._fail(item)
                    break
                while self.session.backpressured and not self.done.is_set():
                    self._progress.clear()
                    await self._progress.wait()
                await self._audio(item)
        finally:
            decoder.close()
            await asyncio.shield(finished)

    # -- carrying out the core's outputs ---------------------------------------------

    async def _fail(self, error: AsrError) -> None:
        self.metrics.errors.labels(error.code).inc()
        log.info("session=%s event=error code=%s message=%s", self.sid, error.code, error.message)
        if wire_info(error).close_code is not None:
            self._ending = True
            self.outcome = "server_error" if error.code in ("internal_error", "inference_failed") else "client_error"
            if error.code == "shutting_down":
                self.outcome = "shutdown"
            if self._container is not None:
                self._container.close()
        await self._apply(self.session.fail(error))

    async def _apply(self, outputs: list[SessionOutput]) -> None:
        async with self._lock:
            await self._carry_out(outputs)

    async def _apply_safely(self, outputs: list[SessionOutput]) -> None:
        try:
            await self._apply(outputs)
        except ConnectionClosed:
            self.done.set()

    async def _carry_out(self, outputs: list[SessionOutput]) -> None:
        """Caller holds the lock."""
        for output in outputs:
            match output:
                case Send():
                    self._observe(output)
                    await self._send(json.dumps(output.message, separators=(",", ":")))
                case SubmitJob():
                    self._spawn(self._decode(output))
                case WithdrawJob():
                    # If it was still waiting, its _decode task now gets the skip.
                    if self.server.scheduler is not None:
                        self.server.scheduler.withdraw(output.job)
                case Close():
                    if output.code == 1000 and self.outcome == "disconnected":
                        self.outcome = "completed"
                    await self.ws.close(output.code, output.reason)
                    self.done.set()

    async def _send(self, text: str) -> None:
        """Write one message; a client that leaves results unread past ``send_timeout_s`` is cut off."""
        try:
            await asyncio.wait_for(self.ws.send(text), timeout=self.limits.send_timeout_s)
        except TimeoutError:
            self._ending = True
            self.outcome = "client_error"
            self.metrics.errors.labels(ResultsNotRead.code).inc()
            log.info("session=%s event=error code=results_not_read message=no result read for %g s", self.sid, self.limits.send_timeout_s)
            self.done.set()
            self.ws.transport.abort()  # nothing more can be written to this client
            raise ConnectionClosed(None, None) from None

    async def _decode(self, submit: SubmitJob) -> None:
        scheduler = self.server.scheduler
        assert scheduler is not None
        try:
            try:
                job, hypothesis = await scheduler.decode(self.sid, submit.job, self._weight, self.session.refresh_job)
            except JobFailed as failure:
                self.metrics.errors.labels(DecodeFailed.code).inc()
                log.warning("session=%s event=decode_failed channel=%d utterance=%d", self.sid, failure.job.channel, failure.job.utterance)
                await self._apply(self.session.job_failed(failure.job))
            else:
                if hypothesis is None:
                    await self._apply(self.session.job_skipped(job))
                else:
                    await self._apply(self.session.job_done(job, hypothesis))
        except asyncio.CancelledError:
            raise
        except ConnectionClosed:
            self.done.set()
        except Exception:
            log.exception("session=%s event=crash", self.sid)
            await self._fail(InternalError("internal error; the session was closed"))
        self._progress.set()

    def _observe(self, send: Send) -> None:
        event = send.event
        now = time.monotonic()
        if isinstance(event, Interim) and not self._first_interim_seen and self._first_audio_at is not None:
            self._first_interim_seen = True
            self.metrics.first_interim.observe(now - self._first_audio_at)
        elif isinstance(event, Final):
            self.metrics.audio_transcribed.inc(max(0.0, event.end - event.start))
            arrived = self._arrival_of(int(event.speech_end * 16000))
            if arrived is not None and event.text:
                self.metrics.final_latency.observe(max(0.0, now - arrived))
            for guard in event.dropped:
                self.metrics.guard_drops.labels(guard).inc()
            log.info(
                "session=%s event=final channel=%d utterance=%d reason=%s chars=%d dropped=%s",
                self.sid, event.channel, event.utterance, event.reason.value, len(event.text), ",".join(event.dropped) or "-",
            )

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
        if self._rtc is not None:
            await self._rtc.close()
            self.server.peers.discard(self._rtc)
            self.metrics.webrtc_peers.set(len(self.server.peers))

    async def _cleanup(self) -> None:
        self.done.set()
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
