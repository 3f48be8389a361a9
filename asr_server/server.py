"""The server's lifecycle: the listening socket, the model's scheduler, the load governor.

:class:`AsrServer` listens at once (``/healthz`` answers 503 until the model
is ready), takes the runner with :meth:`AsrServer.set_runner` once the model
is loaded and warm, admits or refuses each stream
(:mod:`asr_server.scheduler.admission`), and hands admitted streams to a
:class:`~asr_server.transport.connection.Connection`. :meth:`AsrServer.stop`
tells every client, finishes what they are owed, and restores what it changed
in the process (the WebRTC host-address restriction).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from .access import ANONYMOUS, Access, AccessOptions, Principal, is_loopback, turn_credentials
from .audio.vad import VadOptions
from .errors import AsrError, InvalidOption, NotReady, ShuttingDown, wire_info
from .inference.types import Runner
from .metrics import Metrics
from .options import FRAMES_READ_AHEAD, Limits, RtcOptions, StreamOptions, parse_stream_options
from .protocol.deepgram import DeepgramDialect, DeepgramOptions, is_deepgram, parse_deepgram_options
from .protocol.messages import MessageWriter, NativeDialect
from .protocol.openai_realtime import OpenAiDialect, default_realtime_options
from .protocol.twilio import TWILIO_PATH, TwilioDialect, twilio_options
from .scheduler import Scheduler
from .scheduler.admission import Capacity, refusal
from .scheduler.capacity import CapacityModel
from .scheduler.budget import MemoryBudget, audio_bytes, process_rss, stream_bytes
from .scheduler.governor import GovernorOptions, LoadSettings, LoadGovernor
from .scheduler.policy import BatchLimits, Priority
from .decoding.context import ContextOptions
from .decoding.incremental import context_kept_s
from .resume import ResumeTable, new_token, parse_resume_request
from .session import Session
from .tracing import Tracing
from .webhooks import WebhookOptions, WebhookSender
from .transport.connection import Connection, Dialect, replay_ended
from .transport.fanout import EndedSessions, follow, parse_follow_path
from .transport.gate import LOG_EVERY_S, ConnectionGate, GateOptions, Refusal, Ticket
from .transport.http import LISTEN_PATH, REALTIME_PATH, OneRequestConnection, route, select_subprotocol
from .transport.static import load_static
from .transport.webrtc import RtcIngest, restrict_host_addresses

# Times a burst final and a context pass (model seconds), asking the predicate before each model
# call whether to stop (then NaN): see AsrServer.set_runner.
Measure = Callable[[Callable[[], bool]], tuple[float, float]]

__all__ = ["AsrServer", "LISTEN_PATH"]

log = logging.getLogger("asr_server.session")
server_log = logging.getLogger("asr_server.server")


class AsrServer:
    """Owns the model runner, the scheduler, metrics and the listening socket.

    ``await start()`` listens at once; call :meth:`set_runner` when the model
    is loaded and warmed up (``/healthz`` answers 503 until then).
    """

    def __init__(
        self,
        host: str = "127.0.0.1", port: int = 8765, limits: Limits = Limits(), model_name: str = "",
        *,
        budget: MemoryBudget | None = None, governor: GovernorOptions = GovernorOptions(), batch: BatchLimits = BatchLimits(),
        memory_probe: Callable[[], int] = process_rss, tick_s: float = 0.25, workers: int = 1,
        rtc: RtcOptions = RtcOptions(), ssl: Any = None, vad: VadOptions = VadOptions(),
        context: ContextOptions = ContextOptions(),
        access: AccessOptions = AccessOptions(),
        tracing: Tracing | None = None,
        webhooks: WebhookOptions = WebhookOptions(),
        gate: GateOptions = GateOptions(),
    ) -> None:
        """``budget``: memory admission (None: none); ``memory_probe``: bytes in use now, for
        the governor's memory-critical step (compared with ``budget.total``); ``rtc``:
        ICE servers and host addresses for ``encoding=webrtc`` sessions; ``ssl``: an
        :class:`ssl.SSLContext` to serve https/wss (browsers give the microphone only to
        secure pages, or to localhost); ``vad``: how every stream finds speech; ``context``: the
        context pass of streams with ``revisions`` on; ``access``: API keys, browser origins,
        tokens and TURN credentials (:mod:`asr_server.access`); ``tracing``: spans of sampled
        streams (:mod:`asr_server.tracing`; default none); ``webhooks``: where finals and
        transcripts are POSTed (:mod:`asr_server.webhooks`; default nowhere); ``gate``: how many connections
        are held at once (:mod:`asr_server.transport.gate`)."""
        self.host, self.port, self.limits, self.model_name = host, port, limits, model_name
        self.budget, self.batch_limits, self.governor = budget, batch, LoadGovernor(governor)
        self.memory_probe, self.tick_s, self.workers = memory_probe, tick_s, workers
        self.rtc, self.ssl, self.vad, self.context = rtc, ssl, vad, context
        self.access, self.tracing = Access(access), tracing or Tracing()
        self.clock = time.monotonic  # tokens' lifetimes, quotas' minutes, the rate of refusals' log lines
        self.metrics, self.gate = Metrics(), ConnectionGate(gate)
        self.metrics.connections.set_function(lambda: self.gate.open)
        self.webhooks, self.transcript_builds = WebhookSender(webhooks, self.metrics), asyncio.Semaphore(1)  # /transcript: one build at a time
        self.scheduler: Scheduler | None = None  # these four come with the model (set_runner)
        self.capacity: CapacityModel | None = None
        self.runner: Runner | None = None
        self.interim_runner: Runner | None = None
        self._server: Server | None = None
        self._connections: set[Connection] = set()
        self._handshakes: set[asyncio.Task[None]] = set()  # TLS handshakes of accepted connections under way
        self.resumes: ResumeTable[Connection] = ResumeTable()  # resume tokens of live sessions
        self.ended = EndedSessions(limits.ended_session_ttl_s)  # logs of ended sessions, for late followers
        self.peers: set[RtcIngest] = set()  # open WebRTC peer connections
        self.static = load_static()
        self.stopping = False
        self._ticker: asyncio.Task[None] | None = None
        # Times a burst final and a pass again, (final_s, pass_s), for the capacity model (set_runner).
        self.measure: Measure | None = None
        self._measuring: asyncio.Task[None] | None = None
        self._measure_stop = threading.Event()  # set when a session starts or the server stops: the re-measure gives way
        self._restore_host_addresses: Callable[[], None] | None = None

    @property
    def ready(self) -> bool:
        return self.scheduler is not None and not self.stopping

    @property
    def max_channels(self) -> int:
        """Channels admitted at most now (0: no limit): measured capacity when there is a model of it."""
        return self.capacity.channels() if self.capacity is not None else self.limits.max_channels

    @property
    def active_channels(self) -> int:
        return sum(c.options.channels for c in self._connections)

    @property
    def finishing_channels(self) -> int:
        """Channels of streams whose client closed them, still finishing (see :mod:`.scheduler.admission`)."""
        return sum(c.options.channels for c in self._connections if c.finishing)

    def _finishing_of(self, key: str | None) -> int:
        """:attr:`finishing_channels` of one API key's streams."""
        return sum(c.options.channels for c in self._connections if c.finishing and c.session.key == key) if key is not None else 0

    @property
    def reserved_bytes(self) -> int:
        return sum(c.reserved_bytes for c in self._connections)

    def stream_bytes(self, options: StreamOptions) -> int:
        buffered = 0
        if options.is_container:
            buffered = self.limits.max_container_buffer_bytes
        elif options.is_webrtc:
            buffered = audio_bytes(self.limits.max_live_backlog_s, options.channels)
        # The context pass keeps a window of finalized audio (and its prompt's) per channel.
        context_s = context_kept_s(self.context) if options.revisions else 0.0
        buffered += self.limits.max_replay_bytes  # messages kept for a resume and for followers
        buffered += self.limits.max_transcript_bytes  # ... and those the whole transcript is built from
        buffered += self.limits.read_ahead_bytes  # frames read but not yet taken, while the session holds back
        return stream_bytes(options.channels, options.max_utterance_s, self.limits.max_pending_finals, buffered, context_s)

    async def start(self) -> None:
        if self.rtc.host_addresses:
            self._restore_host_addresses = restrict_host_addresses(self.rtc.host_addresses)
        self._server = await serve(
            self._handle,
            self.host,
            self.port,
            process_request=lambda connection, request: route(self, connection, request),
            create_connection=lambda *args, **kwargs: OneRequestConnection(
                *args, admit=self._let_in, tls=self.ssl, handshakes=self._handshakes, **kwargs),
            select_subprotocol=select_subprotocol,
            # Frames up to twice the limit are read so that we can answer with our own
            # frame_too_large error; anything larger is cut off by websockets (close 1009).
            max_size=2 * self.limits.max_frame_bytes,
            max_queue=FRAMES_READ_AHEAD,  # counted in each stream's memory (Limits.read_ahead_bytes)
            # Our own keepalive (Connection._keepalive): the library's would cut off a client
            # whose pongs wait behind audio while we hold back reading (backpressure).
            ping_interval=None,
            # TLS is served by each connection (OneRequestConnection), after the gate has counted it.
        )
        self.webhooks.start()
        sock = next(iter(self._server.sockets))
        self.port = sock.getsockname()[1]
        server_log.info("listening on %s://%s:%d%s", "wss" if self.ssl else "ws", self.host, self.port, LISTEN_PATH)

    def _let_in(self, transport: asyncio.Transport) -> Ticket | Refusal:
        """A connection just accepted: its ticket from the gate, or why it is refused (counted and
        logged here; the connection answers it)."""
        peer = transport.get_extra_info("peername")
        entry = self.gate.enter(peer[0] if isinstance(peer, tuple) else "", self.clock())
        if isinstance(entry, Refusal):
            self.metrics.connections_refused.labels(entry.reason).inc()
            if entry.log:
                server_log.warning("refusing connections (%d since the last such line, at most one every %g s): %s",
                                   entry.unlogged, LOG_EVERY_S, entry.message)
        return entry

    def set_runner(
        self, runner: Runner, interim_runner: Runner | None = None, budget: MemoryBudget | None = None, capacity: CapacityModel | None = None,
        measure: Measure | None = None,
    ) -> None:
        """The model is loaded and warm: start serving (``budget`` may come with it, measured;
        ``capacity``: admit as many channels as it says instead of ``limits.max_channels``;
        ``measure``: times a burst final and a pass again, for ``capacity``, while the server is idle,
        and gives NaN for them once the predicate it is given says a session started)."""
        self.measure = measure
        self.runner = runner
        self.interim_runner = interim_runner
        if budget is not None:
            self.budget = budget
        self.capacity = capacity
        self.scheduler = Scheduler(runner, self.metrics, self.batch_limits, interim_runner, workers=self.workers, tracing=self.tracing)
        self.scheduler.capacity = capacity
        self.scheduler.start()
        if self.tick_s > 0:  # 0: the governor is driven by explicit tick() calls only
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
        before, settings = self.governor.level, self.load_settings()
        state = self.scheduler.state(loop.time())
        used = self.memory_probe() if self.budget is not None else 0
        level = self.governor.observe(loop.time(), state.oldest_final_wait, used, self.budget.total if self.budget else 0, state.oldest_interim_wait,
                                      state.background_busy, state.oldest_context_wait, self.active_channels)
        self.metrics.memory_used.set(used)
        self.metrics.degradation_level.set(int(level))
        self.metrics.background_busy.set(state.background_busy)
        self.metrics.spare_time.set(int(self.governor.spare_time()))
        self.metrics.late_passes.set(int(self.governor.late_context()))
        self.metrics.lean_passes.set(int(self.governor.lean_context()))
        self.metrics.capacity_channels.set(self.max_channels)
        if self.capacity is not None:
            self.metrics.burst_final_seconds.set(self.capacity.final_s)
        self._maybe_remeasure(loop.time())
        if level != before:
            server_log.info("load level %d -> %d (%s) oldest_final_wait=%.2fs oldest_interim_wait=%.2fs finals=%d interims=%d",
                            before, level, level.name.lower(), state.oldest_final_wait, state.oldest_interim_wait, state.finals, state.interims)
        after = self.load_settings()
        if after.settle != settings.settle:
            server_log.info("spare time for settle decodes %s (background busy %.2f)", "on" if after.settle else "off", state.background_busy)
        if after != settings:
            await self.announce_level()
        await self._shed_if_memory_critical(used)

    def _maybe_remeasure(self, now: float) -> None:
        """Time a burst final again if the capacity model asks for it (see :class:`CapacityModel`)."""
        if self.capacity is None or self.measure is None or self._measuring is not None or self.scheduler is None or self.stopping:
            return
        if self.capacity.remeasure_due(now, idle=not self._connections and self.scheduler.core.live == 0):
            self._measure_stop.clear()  # here, with the idle check: a session may start before the task does
            self._measuring = asyncio.get_running_loop().create_task(self._remeasure(self.capacity, self.measure), name="asr-capacity")

    async def _remeasure(self, capacity: CapacityModel, measure: Measure) -> None:
        """Time a burst final and a pass on the idle server. A session that starts meanwhile stops it
        before its next model call (its decodes would wait for the measure's, and a measure taken
        beside them says nothing); it is asked for again after the interval. So does :meth:`stop`:
        on a slow or busy host the rest of a measure can take ten seconds or more, which a process
        manager's grace period may not give."""
        before = capacity.channels()
        try:
            final_s, pass_s = await asyncio.to_thread(measure, self._measure_stop.is_set)
            capacity.remeasured(asyncio.get_running_loop().time(), final_s, pass_s)
            if math.isnan(final_s) or math.isnan(pass_s):
                server_log.info("capacity re-measure stopped: %s", "the server is stopping" if self.stopping else "a session started")
            else:
                server_log.info("capacity measured again (burst final %.3f s, pass %.3f s): %d -> %d channels", final_s, pass_s, before, capacity.channels())
        except Exception:
            server_log.exception("measuring capacity again failed")
            capacity.remeasured(asyncio.get_running_loop().time(), float("nan"), 0.0)  # try again after the interval
        finally:
            self._measuring = None

    async def _shed_if_memory_critical(self, used: int) -> None:
        # One stream at a time: the next is shed only once the last has finished and freed its memory.
        if not self.governor.memory_critical or any(c.shedding for c in self._connections):
            return
        victims = [c for c in self._connections if c.options.priority == Priority.BATCH.value]
        if victims:
            victim = min(victims, key=lambda c: c.started_at)
            server_log.warning("memory critical (%d of %d bytes): closing batch session %s", used, self.budget.total if self.budget else 0, victim.sid)
            self.metrics.streams_shed.inc()
            await victim.shed()

    async def announce_level(self) -> None:
        """Apply the governor's level to every session's interims and passes; each is told if its interims change."""
        self.metrics.degradation_level.set(int(self.governor.level))
        for conn in list(self._connections):
            await conn.set_load(self.load_settings())

    async def reset_load(self) -> None:
        """The governor back to level 0, announced to every session that was degraded."""
        self.governor.reset()
        await self.announce_level()

    def load_settings(self) -> LoadSettings:
        """What the current level does to interims and context passes."""
        return self.governor.load_settings(self.interim_runner is not None)

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop accepting, tell every client, finish what they are owed, close."""
        self.stopping = True
        self._measure_stop.set()  # a re-measure under way ends before its next model call
        if self._server is not None:
            self._server.close(close_connections=False)
        for handshake in list(self._handshakes):  # TLS handshakes under way: no session yet, nothing owed
            handshake.cancel()
        await asyncio.gather(*self._handshakes, return_exceptions=True)
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
        if self._measuring is not None:
            await asyncio.gather(self._measuring, return_exceptions=True)  # a model call cannot be cut short
        if self.scheduler is not None:
            await self.scheduler.stop()
        if self._restore_host_addresses is not None:
            self._restore_host_addresses()
            self._restore_host_addresses = None
        if self.tracing.enabled:
            await asyncio.to_thread(self.tracing.shutdown)
        await self.webhooks.stop()

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.wait_closed()

    # -- streams ---------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        principal: Principal = getattr(ws, "principal", ANONYMOUS)
        url = urlsplit(ws.request.path if ws.request else "")
        query = parse_qs(url.query, keep_blank_values=True)
        query.pop("token", None)  # access control's, checked at the handshake (transport.http)
        path = url.path
        if "resume" in query and path == LISTEN_PATH:
            await self._resume(ws, principal, query)
        elif (followed := parse_follow_path(path)) is not None:
            await follow(self, ws, principal, followed, query)
        elif path == LISTEN_PATH:
            authorization = ws.request.headers.get("Authorization") if ws.request else None
            deepgram = is_deepgram(query, authorization, ws.subprotocol)
            await self._stream(ws, principal, query, "deepgram" if deepgram else "native")
        else:
            await self._stream(ws, principal, query, {REALTIME_PATH: "openai", TWILIO_PATH: "twilio"}[path])

    async def _stream(self, ws: ServerConnection, principal: Principal, query: dict[str, list[str]], kind: str) -> None:
        """``kind``: the protocol the client speaks (``native``, ``deepgram``, ``openai``, ``twilio``)."""
        session_id = uuid.uuid4().hex[:16]
        started = time.monotonic()
        dialect: Dialect = NativeDialect()
        try:
            options, dialect = self._options_for(query, kind, principal.settings)
            self._admit(options)
            self.access.start(principal, options.channels, self.clock(), self._finishing_of(principal.name))
        except AsrError as error:
            if principal.name is not None:
                self.metrics.key_refusals.labels(principal.name, error.code).inc()
            if isinstance(dialect, NativeDialect) and kind != "native":  # its options were refused: still answer in its dialect
                dialect = self._plain_dialect(kind)
            await self.refuse(ws, MessageWriter(session_id), error, session_id, dialect=dialect)
            return
        # No await between the capacity check and this add: admission is atomic.
        try:
            conn = self._connection(ws, principal, options, dialect, session_id)
        except BaseException:
            self.access.end(principal, options.channels)  # the key's quota is not held by a stream that never ran
            raise
        token = conn.session.resume_token
        if token is not None:
            self.resumes.add(token, conn, principal.name)
        self.metrics.dialect_sessions.labels(dialect.name).inc()
        if principal.name is not None:
            self.metrics.key_sessions.labels(principal.name).inc()
        self._connections.add(conn)
        self._measure_stop.set()
        self.metrics.sessions_started.inc()
        self.metrics.active_sessions.inc()
        try:
            await conn.run()
        finally:
            if token is not None:
                self.resumes.forget(token)
            self._connections.discard(conn)
            self.access.end(principal, options.channels)
            self.metrics.active_sessions.dec()
            self.metrics.sessions_ended.labels(conn.outcome).inc()
            self.metrics.session_duration.observe(time.monotonic() - started)
            if conn.trace is not None:
                conn.trace.end(conn.outcome)
            log.info(
                "session=%s event=end outcome=%s received_s=%.2f transcribed_s=%.2f wall_s=%.2f",
                session_id, conn.outcome, conn.session.audio_received_s, conn.session.audio_transcribed_s, time.monotonic() - started,
            )

    async def _resume(self, ws: ServerConnection, principal: Principal, query: dict[str, list[str]]) -> None:
        """``?resume=TOKEN&last_seq=N``: attach ``ws`` to the held session, then serve until it closes
        (the session's own handler, still running, reads from it)."""
        try:
            if self.stopping:
                raise ShuttingDown("the server is shutting down; connect to another instance", retry_after=5.0)
            request = parse_resume_request(query)
            ended = self.ended.concluded(request.token, principal.name, time.monotonic())
            if ended is not None and ended.closed_with is not None:  # it ended while its client was away
                messages = ended.log.after(request.last_seq)
                self.metrics.resumes.labels("ended").inc()
                log.info("session=%s event=resumed_ended last_seq=%d replayed=%d", ended.info["session_id"], request.last_seq, len(messages))
                await replay_ended(ws, messages, ended.closed_with, self.limits.send_timeout_s)
                return
            conn = self.resumes.claim(request.token, principal.name, self.clock())
        except AsrError as error:
            self.metrics.resumes.labels(error.code).inc()
            await self.refuse(ws, MessageWriter(uuid.uuid4().hex[:16]), error, "-", event="resume_refused")
            return
        try:
            going_on = await conn.attach(ws, request.last_seq)
        except AsrError as error:
            self.resumes.release(request.token)
            self.metrics.resumes.labels(error.code).inc()
            await self.refuse(ws, MessageWriter(conn.sid), error, conn.sid, event="resume_refused")
            return
        self.resumes.attached(request.token)
        self.metrics.resumes.labels("resumed" if going_on else "ended").inc()
        await ws.wait_closed()

    def _connection(self, ws: ServerConnection, principal: Principal, options: StreamOptions, dialect: Dialect, session_id: str) -> Connection:
        """An admitted stream's session and its connection (resumable in our own protocol only)."""
        webrtc = self._rtc_wire(principal) if options.is_webrtc else None
        limits = replace(self.limits, max_channels=self.max_channels)  # as admission counts it now
        token = new_token() if self.limits.resumable and isinstance(dialect, NativeDialect) else None
        session = Session(session_id, options, limits, self.model_name, self.vad, webrtc=webrtc, context=self.context,
                          key=principal.name, resume_token=token)
        trace = self.tracing.stream(session_id, ws.request.headers if ws.request else {}, {
            "stream.encoding": options.encoding, "stream.channels": options.channels, "key": principal.name or "", "stream.dialect": dialect.name})
        return Connection(self, ws, session, trace, dialect)

    # -- followers -------------------------------------------------------------------

    def session_by_id(self, session_id: str) -> Connection | None:
        return next((c for c in self._connections if c.sid == session_id), None)

    def live_connections(self) -> list[Connection]:
        return sorted(self._connections, key=lambda c: c.started_at)

    def keep_ended(self, conn: Connection) -> None:
        """A session ended: its log stays readable for ``ended_session_ttl_s``; its transcript goes to the webhooks."""
        summary = conn.summary()
        self.ended.keep(conn.sid, conn.log, conn.transcript, conn.session.key, summary, time.monotonic(),
                        resume_token=conn.session.resume_token, closed_with=conn.closed_with)
        urls = self._webhook_urls(conn) if "transcript" in self.webhooks.options.events else []
        if urls:
            transcript = conn.transcript.transcript()
            conn.webhook_events += 1
            for url in urls:
                self.webhooks.send(url, {"event": "transcript", "session_id": conn.sid, "number": conn.webhook_events, "session": summary,
                                         "transcript": transcript})

    def notify_transcript_change(self, conn: Connection, message: dict[str, Any]) -> None:
        """A non-empty final, a revision or a settled message was sent: to the webhooks, as an event
        of its type, when they take that event."""
        urls = self._webhook_urls(conn) if message["type"] in self.webhooks.options.events else []
        if urls:
            conn.webhook_events += 1
        for url in urls:
            self.webhooks.send(url, {"event": message["type"], "session_id": conn.sid, "number": conn.webhook_events, "message": message})

    def _webhook_urls(self, conn: Connection) -> list[str]:
        """The server's webhook, and the session's own callback (a call's) when it is an allowed one."""
        options = self.webhooks.options
        if not options.enabled:
            return []
        urls = [options.url] if options.url else []
        call = getattr(conn.dialect, "call", None)
        callback = call.custom_parameters.get("callback") if call is not None else None
        if callback and options.callback_allowed(callback):
            urls.append(callback)
        return urls

    # -- access ----------------------------------------------------------------------

    def own_origins(self, host_header: str | None) -> tuple[str, ...]:
        """Origins of the server's own page. On loopback only loopback names count, whatever
        the Host header says: a page whose name merely resolves to 127.0.0.1 (DNS rebinding)
        is not ours."""
        names = [f"localhost:{self.port}", f"127.0.0.1:{self.port}", f"[::1]:{self.port}"]
        if not is_loopback(self.host) and host_header:
            names.append(host_header.strip())
        return tuple(f"{scheme}://{name}" for name in names for scheme in ("http", "https"))

    def refused_access(self, error: AsrError, path: str) -> None:
        """A request turned away by access control, before any WebSocket (counted and logged)."""
        self.metrics.errors.labels(error.code).inc()
        self.metrics.access_refusals.labels(error.code).inc()
        log.info("event=refused path=%s code=%s message=%s", path, error.code, error.message)

    def _rtc_wire(self, principal: Principal) -> dict[str, Any]:
        """ICE servers for a WebRTC session; TURN servers with credentials of its own when there is a secret."""
        secret = self.access.options.turn_secret
        if secret is None:
            return self.rtc.to_wire()
        username, credential = turn_credentials(secret, principal.name or "anonymous", time.time())
        servers = [
            replace(s, username=username, credential=credential) if any(u.startswith("turn") for u in s.urls) else s
            for s in self.rtc.ice_servers
        ]
        return {"ice_servers": [s.to_wire() for s in servers]}

    def _plain_dialect(self, kind: str) -> Dialect:
        """A dialect of ``kind`` with default options: to refuse a stream in its own terms."""
        if kind == "openai":
            return OpenAiDialect(default_realtime_options(), self.model_name, ())
        if kind == "deepgram":
            return DeepgramDialect(DeepgramOptions(), self.model_name)
        return TwilioDialect(twilio_options(), ()) if kind == "twilio" else NativeDialect()

    def _options_for(self, query: dict[str, list[str]], dialect: str, settings: str | None = None) -> tuple[StreamOptions, Dialect]:
        """The stream's options and the dialect to speak (``native``, ``deepgram`` or ``openai``).
        ``settings``: those its token was minted with (an OpenAI client secret's session)."""
        if self.stopping:
            raise ShuttingDown("the server is shutting down; connect to another instance", retry_after=5.0)
        if self.runner is None:
            raise NotReady("the model is still loading; retry shortly", retry_after=2.0)
        if dialect == "twilio":  # its options come with the call's start event
            return twilio_options(), TwilioDialect(twilio_options(), tuple(self.runner.languages), query)
        if dialect == "openai":
            if query.get("intent", ["transcription"])[0] != "transcription":
                raise InvalidOption("only transcription sessions are served here: connect with ?intent=transcription")
            realtime = OpenAiDialect(default_realtime_options(), self.model_name, tuple(self.runner.languages))
            return (default_realtime_options() if settings is None else realtime.configure(json.loads(settings))), realtime
        if dialect == "deepgram":
            options, deepgram_options = parse_deepgram_options(query, self.runner.languages)
            return options, DeepgramDialect(deepgram_options, self.model_name)
        return parse_stream_options(query, self.runner.languages), NativeDialect()

    def _admit(self, options: StreamOptions) -> None:
        """Refuse, before any audio, a stream past the channel or memory capacity, or at a refusing load level."""
        capacity = Capacity(self.active_channels, self.max_channels, self.reserved_bytes, self.budget, self.finishing_channels)
        error = refusal(capacity, options.channels, self.stream_bytes(options), Priority(options.priority), self.governor)
        if error is not None:
            raise error

    async def refuse(self, ws: ServerConnection, writer: MessageWriter, error: AsrError, session_id: str, *, event: str = "refused",
                     dialect: Dialect | None = None) -> None:
        """Send ``error`` and close. ``event``: ``refused`` (a stream, counted as a session that
        ended so), ``resume_refused`` or ``follow_refused``; ``dialect``: the error in the
        client's protocol (ours by default)."""
        self.metrics.errors.labels(error.code).inc()
        if event == "refused":
            self.metrics.sessions_ended.labels("refused").inc()
        log.info("session=%s event=%s code=%s message=%s", session_id, event, error.code, error.message)
        try:
            for message in (dialect or NativeDialect()).outgoing(writer.error(error)):
                await ws.send(json.dumps(message))
            await ws.close(wire_info(error).close_code or 1008, error.code)
        except ConnectionClosed:
            pass
