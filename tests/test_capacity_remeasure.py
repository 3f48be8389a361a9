"""A server that measured its capacity on a busy host measures again once idle (the server's part of
:class:`~asr_server.scheduler.capacity.CapacityModel`'s re-measure)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Callable

from websockets.asyncio.client import connect

from asr_server.scheduler.capacity import CapacityModel, CapacityOptions
from asr_server.server import AsrServer

from .fakes import FakeRunner


def test_an_idle_server_measures_again_and_admits_what_the_lower_cost_allows():
    measures: list[int] = []

    def measure(stop: Callable[[], bool]) -> tuple[float, float]:
        measures.append(1)
        assert not stop()
        return 0.25, 0.66  # the host is quiet now

    async def main() -> tuple[int, int, int]:
        server = AsrServer("127.0.0.1", 0, tick_s=0)  # no ticker: this test ticks
        await server.start()
        capacity = CapacityModel(2, 0.75, CapacityOptions(remeasure_s=60.0), pass_s=0.9)  # measured while the host was busy
        server.set_runner(FakeRunner(), capacity=capacity, measure=measure)
        try:
            before = server.max_channels
            capacity.remeasure_due(asyncio.get_running_loop().time() - 61.0, idle=True)  # start-up was 61 s ago
            await server.tick()
            assert server._measuring is not None
            await server._measuring
            after = server.max_channels
            await server.tick()  # that measure lowered the cost: the next one comes only 60 s after it
            return before, after, len(measures)
        finally:
            await server.stop(grace_s=0)

    before, after, count = asyncio.run(main())
    assert (before, after, count) == (2, 9, 1)


def test_a_session_that_starts_during_the_re_measure_stops_it_and_the_cost_stands():
    """The measure's model calls would hold the new session's first decodes (they share the
    model and the cores): the server's stop predicate turns true when a session starts, the
    measure gives NaN, and the cost and the admission stay as they were."""
    measuring, connected = threading.Event(), threading.Event()

    def measure(stop: Callable[[], bool]) -> tuple[float, float]:
        seen = [stop()]  # before the session: no
        measuring.set()
        assert connected.wait(30)  # the test connects a session meanwhile
        seen.append(stop())
        said.extend(seen)
        return (math.nan, math.nan) if stop() else (0.25, 0.66)

    said: list[bool] = []

    async def main() -> tuple[int, int, float]:
        server = AsrServer("127.0.0.1", 0, tick_s=0)
        await server.start()
        capacity = CapacityModel(2, 0.75, CapacityOptions(remeasure_s=60.0), pass_s=0.9)
        server.set_runner(FakeRunner(), capacity=capacity, measure=measure)
        try:
            before = server.max_channels
            capacity.remeasure_due(asyncio.get_running_loop().time() - 61.0, idle=True)
            await server.tick()
            assert server._measuring is not None
            assert await asyncio.to_thread(measuring.wait, 30)
            async with connect(f"ws://127.0.0.1:{server.port}/v1/listen?encoding=pcm_s16le&sample_rate=16000") as ws:
                ready = json.loads(await ws.recv())
                assert ready["type"] == "session"
                connected.set()
                await server._measuring
                await ws.send(json.dumps({"type": "close"}))
                async for _ in ws:
                    pass
            return before, server.max_channels, capacity.final_s
        finally:
            connected.set()
            await server.stop(grace_s=0)

    before, after, final_s = asyncio.run(main())
    assert said == [False, True]
    assert (before, after, final_s) == (2, 2, 0.75)


def test_stopping_the_server_stops_a_re_measure_before_its_next_model_call():
    """A re-measure (three rounds of burst finals and a pass: seconds on a slow host) under way
    when the server is asked to stop gives way, as it does to a session: ``stop()`` returns after
    the model call in progress, not after the whole measure, and the cost measured before stands."""
    measuring = threading.Event()
    said: list[bool] = []

    def measure(stop: Callable[[], bool]) -> tuple[float, float]:
        said.append(stop())  # the server is idle and running: no
        measuring.set()
        # The model call in progress; the server's stop predicate is what the next one asks.
        said.append(server._measure_stop.wait(30))
        return (math.nan, math.nan) if stop() else (0.25, 0.66)

    async def main() -> float:
        capacity.remeasure_due(asyncio.get_running_loop().time() - 61.0, idle=True)
        await server.start()
        server.set_runner(FakeRunner(), capacity=capacity, measure=measure)
        try:
            await server.tick()
            assert server._measuring is not None
            assert await asyncio.to_thread(measuring.wait, 30)
        finally:
            await server.stop(grace_s=0)
        assert server._measuring is None
        final_s = capacity.final_s
        capacity.remeasured(asyncio.get_running_loop().time() - 61.0, math.nan, 0.0)  # due again, as far as the model knows
        await server.tick()  # ... but a stopped server starts no other measure
        assert server._measuring is None
        return final_s

    server = AsrServer("127.0.0.1", 0, tick_s=0)
    capacity = CapacityModel(2, 0.75, CapacityOptions(remeasure_s=60.0), pass_s=0.9)
    final_s = asyncio.run(main())
    assert said == [False, True]
    assert final_s == 0.75
