"""Tracing with OpenTelemetry (the optional extra ``otel``): one trace per sampled stream.

A sampled stream gets a span for its whole life (``asr.stream``: handshake to
end, with its outcome), a child span per audio chunk (``asr.chunk``) and per
decode job (``asr.decode``: queue entry to result sent), and under each
decode the stages: ``asr.queue`` (waiting for the model), ``asr.batch_formation``
(scheduled to the model call), ``asr.model`` (the call) and ``asr.send``
(writing the result). A model call is one ``asr.batch`` span linked to the
decode span of every stream it served.

Streams are sampled whole, ``ratio`` of them (and every stream whose client
sent a sampled W3C ``traceparent``, which becomes the stream span's parent).
:class:`Tracing` with no tracer (the extra absent, or no exporter configured)
answers None everywhere: the callers' only cost is that check.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

__all__ = ["Tracing", "StreamTrace", "DecodeTrace", "tracing_from_environment", "epoch_ns"]

Span = Any  # an opentelemetry.trace.Span, when the extra is installed


def epoch_ns(monotonic_s: float) -> int:
    """A ``time.monotonic()`` instant (the event loop's clock) as the epoch nanoseconds spans carry."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class Tracing:
    """The server's tracer and sampling ratio; ``Tracing()`` traces nothing."""

    def __init__(self, tracer: Any = None, ratio: float = 0.0, rng: Callable[[], float] = random.random, provider: Any = None) -> None:
        """``provider``: the SDK's TracerProvider to flush at :meth:`shutdown` (None: the caller's own)."""
        self._tracer = tracer
        self._provider = provider
        self.ratio = ratio
        self._rng = rng
        if tracer is not None:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

            self._trace = trace
            self._propagator = TraceContextTextMapPropagator()

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def shutdown(self) -> None:
        """Export what is still buffered (blocking: call it off the event loop)."""
        if self._provider is not None:
            self._provider.shutdown()

    def stream(self, session_id: str, headers: Mapping[str, str], attributes: Mapping[str, Any]) -> StreamTrace | None:
        """A sampled stream's trace (None: this stream is not traced)."""
        if self._tracer is None:
            return None
        carrier = {k.lower(): v for k, v in headers.items() if k.lower() in ("traceparent", "tracestate")}
        parent = self._propagator.extract(carrier) if carrier else None
        parent_sampled = parent is not None and self._trace.get_current_span(parent).get_span_context().trace_flags.sampled
        if not parent_sampled and not self._rng() < self.ratio:
            return None
        span = self._tracer.start_span(
            "asr.stream", context=parent, kind=self._trace.SpanKind.SERVER, attributes={"stream.id": session_id, **attributes},
        )
        return StreamTrace(self, span)

    def batch(self, traced: Iterable[tuple[DecodeTrace, float, float]], kind: str, size: int, variant: str,
              scheduled_at: float, model_start: float, model_end: float) -> None:
        """One model call, and in each traced decode it served: its queue wait, the batch's
        formation and the call. ``traced``: (decode trace, queued_at, scheduled_at) per entry."""
        traced = list(traced)
        if self._tracer is None or not traced:
            return
        trace = self._trace
        links = [trace.Link(d.span.get_span_context()) for d, _, _ in traced]
        attributes = {"decode.kind": kind, "batch.size": size, "model.variant": variant}
        batch = self._tracer.start_span("asr.batch", context=trace.set_span_in_context(trace.INVALID_SPAN), links=links,
                                        attributes=attributes, start_time=epoch_ns(model_start))
        batch.end(end_time=epoch_ns(model_end))
        for decode, queued_at, _ in traced:
            decode.stage("asr.queue", queued_at, scheduled_at)
            decode.stage("asr.batch_formation", scheduled_at, model_start)
            decode.stage("asr.model", model_start, model_end, attributes, links=[trace.Link(batch.get_span_context())])


class StreamTrace:
    """The spans of one sampled stream."""

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self._tracing = tracing
        self.span = span
        self.trace_id = format(span.get_span_context().trace_id, "032x")
        self._context = tracing._trace.set_span_in_context(span)

    def child(self, name: str, attributes: Mapping[str, Any], start_s: float | None = None) -> Span:
        start = epoch_ns(start_s) if start_s is not None else None
        return self._tracing._tracer.start_span(name, context=self._context, attributes=dict(attributes), start_time=start)

    @contextmanager
    def chunk(self, sequence: int, duration_ms: float, arrived_s: float) -> Iterator[None]:
        """Around one audio chunk's way through the session's pipeline."""
        span = self.child("asr.chunk", {"chunk.sequence_number": sequence, "chunk.duration_ms": round(duration_ms, 3)}, arrived_s)
        try:
            yield
        finally:
            span.end()

    def decode(self, kind: str, channel: int, utterance: int, queued_s: float) -> DecodeTrace:
        span = self.child("asr.decode", {"decode.kind": kind, "channel": channel, "utterance": utterance}, queued_s)
        return DecodeTrace(self, span)

    def end(self, outcome: str) -> None:
        self.span.set_attribute("stream.outcome", outcome)
        self.span.end()


@dataclass
class DecodeTrace:
    """One decode job's span; the scheduler adds its stages, the transport ends it once the result is sent."""

    stream: StreamTrace
    span: Span

    def stage(self, name: str, start_s: float, end_s: float, attributes: Mapping[str, Any] | None = None, links: list[Any] | None = None) -> None:
        tracing = self.stream._tracing
        context = tracing._trace.set_span_in_context(self.span)
        span = tracing._tracer.start_span(name, context=context, attributes=dict(attributes or {}), links=links or (), start_time=epoch_ns(start_s))
        span.end(end_time=epoch_ns(max(start_s, end_s)))

    @contextmanager
    def sending(self) -> Iterator[None]:
        context = self.stream._tracing._trace.set_span_in_context(self.span)
        span = self.stream._tracing._tracer.start_span("asr.send", context=context)
        try:
            yield
        finally:
            span.end()

    def end(self, outcome: str) -> None:
        self.span.set_attribute("decode.outcome", outcome)
        self.span.end()


def tracing_from_environment(ratio: float, environ: Mapping[str, str] = os.environ) -> Tracing:
    """A tracer exporting over OTLP as the standard ``OTEL_*`` variables say, or ``Tracing()``
    (no tracing) when the ``otel`` extra is not installed, no exporter is configured, or ``ratio`` is 0.

    Configured means ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
    is set, or ``OTEL_TRACES_EXPORTER`` names ``otlp`` or ``console``."""
    exporter_name = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    configured = bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) or exporter_name in ("otlp", "console")
    if ratio <= 0 or not configured or exporter_name == "none":
        return Tracing()
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        return Tracing()
    if exporter_name == "console":
        exporter: Any = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            return Tracing()
        exporter = OTLPSpanExporter()  # endpoint, headers and timeout from OTEL_EXPORTER_OTLP_*
    provider = TracerProvider(resource=Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", "asr-server")}))
    provider.add_span_processor(BatchSpanProcessor(exporter))  # spans leave in the background, off the event loop
    return Tracing(provider.get_tracer("asr_server"), ratio, provider=provider)
