"""A server that measured its capacity on a busy host measures again once idle (the server's part of
:class:`~asr_server.scheduler.capacity.CapacityModel`'s re-measure)."""

from __future__ import annotations

import asyncio

from asr_server.scheduler.capacity import CapacityModel, CapacityOptions
from asr_server.server import AsrServer

from .fakes import FakeRunner


def test_an_idle_server_measures_again_and_admits_what_the_lower_cost_allows():
    measures: list[int] = []

    def measure() -> tuple[float, float]:
        measures.append(1)
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
