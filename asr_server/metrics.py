"""Prometheus metrics, in a registry per server (so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

__all__ = ["Metrics", "TEXT", "OPENMETRICS"]

TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = openmetrics.CONTENT_TYPE_LATEST  # carries exemplars (trace ids on the latency histograms)

_LATENCY_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.active_sessions = Gauge("asr_active_sessions", "Sessions currently streaming", registry=r)
        self.connections = Gauge("asr_connections", "TCP connections open (WebSockets, followers, HTTP requests)", registry=r)
        self.connections_refused = Counter(
            "asr_connections_refused_total", "Connections answered 503 and closed at once, by reason (connections: --max-connections; "
            "address: --max-opening-per-address)", ["reason"], registry=r)
        self.sessions_started = Counter("asr_sessions_started_total", "Sessions accepted", registry=r)
        self.sessions_ended = Counter(
            "asr_sessions_ended_total", "Sessions ended, by outcome", ["outcome"], registry=r
        )
        self.session_duration = Histogram(
            "asr_session_duration_seconds", "Whole-session wall time, handshake to close", buckets=_DURATION_BUCKETS, registry=r
        )
        self.audio_received = Counter("asr_audio_received_seconds_total", "Seconds of audio received", registry=r)
        self.audio_transcribed = Counter(
            "asr_audio_transcribed_seconds_total", "Seconds of audio in finalized utterances", registry=r
        )
        self.first_interim = Histogram(
            "asr_time_to_first_interim_seconds", "First audio received to first interim sent", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.final_latency = Histogram(
            "asr_final_latency_seconds", "Arrival of the end of speech to the final sent", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.decode_seconds = Histogram(
            "asr_decode_seconds", "Model time per decode", ["kind"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram(
            "asr_batch_size", "Decodes per model call", ["kind"], buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32), registry=r
        )
        self.queue_wait_seconds = Histogram(
            "asr_queue_wait_seconds", "Time a decode waited for the model", ["kind"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.finals_packed = Counter(
            "asr_finals_packed_total",
            "Final decodes that shared a 30 s encoder window with other finals (the rest of asr_batch_size_sum{kind=\"final\"} ran alone)",
            registry=r,
        )
        self.finals_greedy = Counter(
            "asr_finals_greedy_total",
            "Final decodes made greedy on a short window because of load: in a burst (more finals waiting than workers) "
            "or busy (the server loaded, a final late); the context pass refines them",
            ["why"], registry=r,
        )
        self.finals_careful = Counter(
            "asr_finals_careful_total",
            "Finals decoded again never cut back: their greedy decode (burst or busy) heard no words, "
            "or only words the guards drop, in 1 s or more of speech the VAD heard",
            registry=r,
        )
        self.decodes_skipped = Counter(
            "asr_decodes_skipped_total",
            "Waiting decodes dropped as stale: interims whose utterance paused or ended, pause decodes after speech resumed",
            ["kind"], registry=r,
        )
        self.degradation_level = Gauge(
            "asr_load_level", "Degradation step: 0 normal, 1 fewer interims, 2 interim model, 3-5 refusing batch/standard/all", registry=r
        )
        self.background_busy = Gauge(
            "asr_background_busy_ratio",
            "Share of the recent time (half-life 20 s) during which some worker ran interims or context passes "
            "(each moment counted as min(1, calls running / --busy-side-by-side))",
            registry=r,
        )
        self.spare_time = Gauge(
            "asr_spare_time", "1 while the server has time to spare for settle decodes (load level 0, background busy under the band)", registry=r
        )
        self.late_passes = Gauge(
            "asr_late_passes", "1 while context passes hold less decided audio because one has waited --context-late-s (0 when that is off)", registry=r
        )
        self.lean_passes = Gauge(
            "asr_lean_passes", "1 while context passes leave out the decided audio and quick finals are greedy: load level 1 and up, "
            "since a final was late or a pass waited --context-lean-wait-s, or while more than --context-lean-channels channels are open", registry=r
        )
        self.memory_budget = Gauge("asr_memory_budget_bytes", "Memory the server may use on its device", registry=r)
        self.memory_used = Gauge("asr_memory_used_bytes", "Memory in use (resident set on CPU)", registry=r)
        self.streams_shed = Counter("asr_streams_shed_total", "Batch streams closed because memory was critical", registry=r)
        self.queue_depth = Gauge("asr_decode_queue_depth", "Decode jobs waiting for the model", registry=r)
        self.guard_drops = Counter(
            "asr_guard_drops_total", "Finals from which a guard removed text, by guard", ["guard"], registry=r
        )
        self.revisions = Counter(
            "asr_revisions_total", "Revisions sent: a context pass or a settle decode changed finals the client held",
            ["pass"], registry=r
        )
        self.context_lag = Histogram(
            "asr_context_lag_seconds",
            "From a final to the context pass that decided it, changed or not: how far passes lag (by design a few s: "
            "a pass waits for about 5 s of new speech and decides a final with a later one in its window)",
            buckets=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 30, 45, 60, 120), registry=r,
        )
        self.finals_passed_over = Counter(
            "asr_finals_passed_over_total",
            "Finals no context pass heard, which keep their first-pass text: more waited than one window holds and a live "
            "stream's pass took the newest (its passes fell behind), or their pass was skipped or failed", registry=r,
        )
        self.answer_failures = Counter(
            "asr_answer_failures_total",
            "Decodes whose answer the server failed to handle (a bug, logged with its traceback as event=answer_failed), "
            "by decode: taken as a failed decode's (interims dropped, finals given up with decode_failed, passes skipped; "
            "ended: a final taken from an earlier answer was decoded instead; plan: planning a pass raised, tried again once "
            "another final came, and after 3 such faults the channel's passes were given up; audio: taking a piece of audio raised in the VAD, chunker or decoder, the piece was dropped "
            "with audio_dropped and the channel's open utterance ended there); the session went on",
            ["decode"], registry=r,
        )
        self.decode_failures = Counter(
            "asr_decode_failures_total",
            "Decodes given up after the model raised: interims are dropped, finals sent empty with decode_failed",
            ["kind"], registry=r,
        )
        self.worker_restarts = Counter(
            "asr_scheduler_worker_restarts_total", "Scheduler worker tasks that ended unexpectedly and were replaced", registry=r
        )
        self.errors = Counter("asr_errors_total", "Errors sent to clients, by code", ["code"], registry=r)
        self.webrtc_peers = Gauge("asr_webrtc_peers", "Open WebRTC peer connections", registry=r)
        self.model_ready = Gauge("asr_model_ready", "1 once the model is loaded and warmed up", registry=r)
        self.capacity_channels = Gauge("asr_capacity_channels", "Channels admitted at most now (from the measured cost of a final in a burst; 0: no limit)", registry=r)
        self.access_refusals = Counter(
            "asr_access_refusals_total", "Requests refused by access control before any WebSocket, by code", ["code"], registry=r
        )
        self.key_sessions = Counter("asr_key_sessions_total", "Streams started, by API key name", ["key"], registry=r)
        self.key_refusals = Counter("asr_key_refusals_total", "Streams of a key refused at connect, by key name and code", ["key", "code"], registry=r)
        self.tokens_minted = Counter("asr_tokens_minted_total", "Browser tokens minted, by API key name", ["key"], registry=r)
        self.dialect_sessions = Counter("asr_dialect_sessions_total", "Streams started, by the protocol the client speaks (native, deepgram)",
                                        ["dialect"], registry=r)
        self.webhook_deliveries = Counter(
            "asr_webhook_deliveries_total", "Webhook attempts, by outcome (delivered, retried, failed, dropped)", ["outcome"], registry=r
        )
        self.webhook_queue = Gauge("asr_webhook_queue", "Webhook deliveries waiting (retries included)", registry=r)
        self.followers = Gauge("asr_followers", "Followers of sessions' results (/v1/sessions/{id}/events) connected now", registry=r)
        self.sessions_held = Gauge("asr_sessions_held", "Sessions whose connection dropped, waiting for their client to resume", registry=r)
        self.resumes = Counter(
            "asr_resume_attempts_total", "Resume attempts, by outcome (resumed; ended: a session that ended while its client was away, replayed and closed; or the error code that refused it)", ["outcome"], registry=r
        )
        # Latency breakpoints: where the time between audio and result goes (docs/operations.md).
        self.audio_to_queue = Histogram(
            "asr_audio_to_queue_seconds", "Arrival of a decode's last audio to the decode's queue entry (VAD, chunker, decoder)",
            ["kind"], buckets=_STAGE_BUCKETS, registry=r,
        )
        self.batch_formation_seconds = Histogram(
            "asr_batch_formation_seconds", "A batch scheduled to its model call starting", ["kind"], buckets=_STAGE_BUCKETS, registry=r
        )
        self.result_send = Histogram("asr_result_send_seconds", "Writing one result to the client's connection", buckets=_STAGE_BUCKETS, registry=r)
        self.chunk_processing = Histogram(
            "asr_chunk_processing_seconds", "One audio chunk through the session's pipeline (its spread is the per-chunk jitter)",
            buckets=_STAGE_BUCKETS, registry=r,
        )
        self.speech_to_first_result = Histogram(
            "asr_speech_to_first_result_seconds", "Arrival of an utterance's first speech to its first interim or final",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.interim_freshness = Histogram(
            "asr_interim_freshness_seconds", "Age, when sent, of the newest audio an interim reflects", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.burst_final_seconds = Gauge("asr_burst_final_seconds", "Model seconds one final in a burst takes (measured, averaged)", registry=r)

    def render(self, openmetrics_format: bool = False) -> bytes:
        """The Prometheus text format, or OpenMetrics (with exemplars) when the scraper asks for it."""
        return openmetrics.generate_latest(self.registry) if openmetrics_format else generate_latest(self.registry)
