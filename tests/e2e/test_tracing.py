"""End to end: traced streams on the embedded model give the documented span tree, a model
call serving several streams is linked to each, and the OpenMetrics scrape carries exemplars
whose trace ids are those of exported spans. With tracing off nothing is traced."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import urllib.request
from collections import defaultdict

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from asr_server.events import DecodeJob
from asr_server.inference.types import DecodeKind, DecodeRequest
from asr_server.tracing import Tracing

from ..harness import ServerThread, replay

pytestmark = pytest.mark.e2e

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"


class HoldsFirstCall:
    """The real model, except that its first call waits until finals of two streams that could share a call are queued.

    Each stream has at most one final in the scheduler at a time (the next one's prompt is
    this one's text), so whether two streams share a model call is otherwise up to timing: on
    a busy machine they can take turns for the whole run. The test makes the first call a
    job of its own, held until both streams have queued a final with one batch key (the
    streams send the same audio, so their first finals match), and the next call takes both.
    """

    def __init__(self, runner) -> None:
        self.runner = runner
        self.languages = runner.languages
        self.server: ServerThread | None = None
        self.entered = threading.Event()
        self.held = False  # both streams had a job waiting when the first call went on

    def batch_key(self, request):
        return self.runner.batch_key(request)

    def window_frames(self, request):
        return self.runner.window_frames(request)

    def transcribe_batch(self, requests, retry_later=False):
        if not self.entered.is_set():
            self.entered.set()
            for _ in range(6000):  # polls, bounded (60 s): the sessions queue their jobs meanwhile
                if self._could_share():
                    self.held = True
                    break
                time.sleep(0.01)
        return self.runner.transcribe_batch(requests, retry_later=retry_later)

    def _could_share(self) -> bool:
        assert self.server is not None and self.server.server is not None
        finals, _interims, _contexts = self.server.server.scheduler.core.queues
        owners = defaultdict(set)
        for ticket in list(finals.waiting()):
            owners[self.runner.batch_key(ticket.item.request)].add(ticket.item.owner)
        return any(len(o) >= 2 for o in owners.values())

    def occupy(self) -> None:
        """Start the first call, on a job of no stream, and return once it is held."""
        assert self.server is not None and self.server.server is not None
        scheduler = self.server.server.scheduler
        request = DecodeRequest(np.zeros(16000, np.float32), DecodeKind.FINAL)
        self.server.call(lambda: asyncio.ensure_future(scheduler.decode("occupier", DecodeJob(0, 0, request, False, 16000))))
        assert self.entered.wait(30)


def traced_server(runner, ratio: float) -> tuple[ServerThread, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server = ServerThread(runner, tracing=Tracing(provider.get_tracer("test"), ratio)).start()
    if isinstance(runner, HoldsFirstCall):
        runner.server = server
        runner.occupy()
    return server, exporter


def scrape(server: ServerThread, openmetrics: bool) -> str:
    request = urllib.request.Request(f"{server.http}/metrics")
    if openmetrics:
        request.add_header("Accept", "application/openmetrics-text; version=1.0.0")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.read().decode()


def test_two_traced_streams_give_the_span_tree_links_and_exemplars(whisper_runner):
    held = HoldsFirstCall(whisper_runner)
    server, exporter = traced_server(held, ratio=1.0)
    try:
        async def both():
            return await asyncio.gather(
                replay(server.url, "cards_16k.wav", headers={"traceparent": TRACEPARENT}),
                replay(server.url, "cards_16k.wav"),
            )

        asyncio.run(both())
        for _ in range(1000):  # polls, bounded: a session ends a moment after its `closed`
            if not server.server._connections:
                break
            time.sleep(0.01)
    finally:
        server.stop()  # every stream span ended and exported
    assert held.held, "the two streams never had jobs waiting at once"
    spans = exporter.get_finished_spans()
    streams = [s for s in spans if s.name == "asr.stream"]
    assert len(streams) == 2
    by_parent = defaultdict(list)
    for span in spans:
        if span.parent is not None:
            by_parent[span.parent.span_id].append(span)
    ids = {s.context.span_id: s for s in spans}
    client_stream = next(s for s in streams if format(s.context.trace_id, "032x") == CLIENT_TRACE)
    assert format(client_stream.parent.span_id, "016x") == "00f067aa0ba902b7"  # the client's traceparent is the parent
    for stream in streams:
        assert stream.attributes["stream.outcome"] == "completed" and stream.attributes["stream.id"]
        children = by_parent[stream.context.span_id]
        chunks = [c for c in children if c.name == "asr.chunk"]
        decodes = [c for c in children if c.name == "asr.decode"]
        assert chunks and [c.attributes["chunk.sequence_number"] for c in chunks] == list(range(1, len(chunks) + 1))
        assert all(c.attributes["chunk.duration_ms"] > 0 for c in chunks)
        assert {d.attributes["decode.kind"] for d in decodes} >= {"final", "interim"}
        done = [d for d in decodes if d.attributes["decode.outcome"] == "done"]
        assert done
        for decode in done:
            stages = {c.name: c for c in by_parent[decode.context.span_id]}
            assert set(stages) == {"asr.queue", "asr.batch_formation", "asr.model", "asr.send"}, (decode.attributes, set(stages))
            assert stages["asr.queue"].end_time <= stages["asr.model"].start_time + 1_000_000  # stages in order (1 ms of clock rounding)
            assert stages["asr.model"].attributes["batch.size"] >= 1 and stages["asr.model"].attributes["model.variant"]
            assert decode.start_time <= stages["asr.model"].start_time <= stages["asr.model"].end_time <= decode.end_time + 1_000_000
    # A model call that served both streams is linked to a decode of each.
    batches = [s for s in spans if s.name == "asr.batch"]
    assert batches and all(b.links for b in batches)
    shared = [b for b in batches if len({link.context.trace_id for link in b.links}) == 2]
    assert shared, "no model call served both streams"
    for link in shared[0].links:
        assert ids[link.context.span_id].name == "asr.decode"


def test_the_openmetrics_scrape_carries_exemplars_of_exported_traces_and_nothing_is_traced_when_off(whisper_runner):
    server, exporter = traced_server(whisper_runner, ratio=1.0)
    try:
        r = asyncio.run(replay(server.url, "cards_16k.wav"))
        for _ in range(1000):  # polls, bounded: a session ends a moment after its `closed`
            if not server.server._connections:
                break
            time.sleep(0.01)
        openmetrics, plain = scrape(server, True), scrape(server, False)
    finally:
        server.stop()
    # The session's duration covers the whole stream, not just its handshake.
    duration = float(re.search(r"^asr_session_duration_seconds_sum (\S+)$", plain, re.M).group(1))
    assert duration >= r.messages[-1].at - r.messages[0].at > 0
    traces = {format(s.context.trace_id, "032x") for s in exporter.get_finished_spans()}
    exemplars = set(re.findall(r'asr_final_latency_seconds_bucket\{[^}]*\} \S+ # \{trace_id="([0-9a-f]{32})"\}', openmetrics))
    assert exemplars and exemplars <= traces
    assert "# {" not in plain  # the classic text format has no exemplars

    server, exporter = traced_server(whisper_runner, ratio=0.0)
    try:
        asyncio.run(replay(server.url, "cards_16k.wav"))
        openmetrics = scrape(server, True)
    finally:
        server.stop()
    assert exporter.get_finished_spans() == ()
    assert 'trace_id="' not in openmetrics
