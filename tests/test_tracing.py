"""Tracing's switches and sampling, without a server."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from asr_server.tracing import Tracing, tracing_from_environment

SAMPLED = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
NOT_SAMPLED = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}


def in_memory(ratio: float, draws: list[float]) -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider.get_tracer("test"), ratio, rng=lambda: draws.pop(0)), exporter


def test_nothing_is_traced_without_an_exporter_configured_or_with_a_zero_ratio():
    assert not tracing_from_environment(1.0, {}).enabled
    assert not tracing_from_environment(0.0, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}).enabled
    assert not tracing_from_environment(1.0, {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}).enabled
    assert Tracing().stream("s", SAMPLED, {}) is None  # no tracer: nothing, whatever the client asks
    console = tracing_from_environment(0.5, {"OTEL_TRACES_EXPORTER": "console"})
    assert console.enabled and console.ratio == 0.5
    console.shutdown()
    otlp = tracing_from_environment(0.5, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert otlp.enabled
    otlp.shutdown()


def test_streams_are_sampled_whole_by_ratio_and_a_sampled_client_trace_is_always_followed():
    tracing, exporter = in_memory(0.25, [0.1, 0.9, 0.9])
    kept = tracing.stream("a", {}, {})  # 0.1 < 0.25: traced
    assert kept is not None
    assert tracing.stream("b", {}, {}) is None  # 0.9: not traced, nothing started
    assert tracing.stream("c", SAMPLED, {}) is not None  # the client's trace is sampled: traced whatever the draw
    assert tracing.stream("d", NOT_SAMPLED, {}) is None  # 0.9 again, and the client's is not sampled
    kept.end("completed")
    (span,) = exporter.get_finished_spans()
    assert span.name == "asr.stream" and span.attributes["stream.id"] == "a" and span.attributes["stream.outcome"] == "completed"
    assert len(kept.trace_id) == 32
