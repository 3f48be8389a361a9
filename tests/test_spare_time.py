"""Spare time for settle decodes (and late and lean passes) reaches the sessions: the server's tick reads how busy the workers
for interims and passes were, the governor decides, and every session (those streaming and those
that start later) is told (a fake model, a real server on loopback; the busy share is set by hand)."""

from __future__ import annotations

import asyncio
import contextlib
import json

from websockets.asyncio.client import connect

from asr_server.scheduler.core import QueueState
from asr_server.scheduler.governor import GovernorOptions
from asr_server.server import AsrServer

from .fakes import FakeRunner

URL = "ws://127.0.0.1:{port}/v1/listen?encoding=pcm_s16le&sample_rate=16000"


def _told(conn, setting: str = "spare_time") -> list[bool]:
    """What each of the connection's channel decoders was told (``spare_time``, ``late_context``, ``lean_context``)."""
    return [getattr(d, setting) for d in conn.session._decoders]


@contextlib.asynccontextmanager
async def _one_session(state: list[QueueState], governor: GovernorOptions = GovernorOptions()):
    """A server on a fake model whose queue state is ``state[0]`` (set by the test), no ticker (the
    test ticks), and one streaming session: yields the server and that session's connection."""
    server = AsrServer("127.0.0.1", 0, tick_s=0, governor=governor)
    await server.start()
    server.set_runner(FakeRunner())
    server.scheduler.state = lambda now: state[0]
    try:
        async with connect(URL.format(port=server.port)) as ws:
            assert json.loads(await ws.recv())["type"] == "session"
            [conn] = server._connections
            yield server, conn
    finally:
        await server.stop(grace_s=0)


def _gauge(server: AsrServer, name: str) -> float:
    return server.metrics.registry.get_sample_value(name)


def test_a_busy_server_takes_spare_time_from_its_sessions_and_gives_it_back_when_calm():
    async def main() -> list:
        state = [QueueState(0, 0, 0.0, 0.0, 0.9)]
        seen: list = []
        async with _one_session(state) as (server, conn):
            await server.tick()  # the workers were busy 90% of the time: no time to spare
            seen += [_told(conn), _gauge(server, "asr_spare_time"), _gauge(server, "asr_background_busy_ratio")]
            async with connect(URL.format(port=server.port)) as second:
                assert json.loads(await second.recv())["type"] == "session"
                [late] = server._connections - {conn}
                await second.send(json.dumps({"type": "close"}))
                while json.loads(await second.recv())["type"] != "closed":
                    pass
                seen.append(_told(late))  # it started without spare time too
            state[0] = QueueState(0, 0, 0.0, 0.0, 0.7)  # within the band: it holds
            await server.tick()
            seen.append(_told(conn))
            state[0] = QueueState(0, 0, 0.0, 0.0, 0.1)
            await server.tick()
            seen += [_told(conn), _gauge(server, "asr_spare_time")]
        return seen

    assert asyncio.run(main()) == [[False], 0.0, 0.9, [False], [False], [True], 1.0]


def test_late_passes_reach_the_sessions_while_a_pass_has_waited_and_only_when_asked_for():
    """The same path for late passes (GovernorOptions.late_context_s): the tick reads how long the
    oldest waiting pass has waited, and every session's decoders are told; off by default."""

    async def main(options: GovernorOptions) -> list:
        state = [QueueState(0, 0, 0.0, 0.0, 0.1, 5.0)]
        seen: list = []
        async with _one_session(state, options) as (server, conn):
            await server.tick()  # a pass has waited 5 s
            seen += [_told(conn, "late_context"), _gauge(server, "asr_late_passes")]
            state[0] = QueueState(0, 0, 0.0, 0.0, 0.1, 1.0)
            await server.tick()
            seen += [_told(conn, "late_context"), _gauge(server, "asr_late_passes")]
        return seen

    assert asyncio.run(main(GovernorOptions(late_context_s=3.0))) == [[True], 1.0, [False], 0.0]
    assert asyncio.run(main(GovernorOptions())) == [[False], 0.0, [False], 0.0]


def test_passes_go_lean_in_every_session_once_a_pass_has_waited_on_a_loaded_server():
    """The lean state (GovernorOptions.lean_context_wait_s) takes the same path: the tick reads the
    oldest pass's wait, every session's decoders are told, and gauge asr_lean_passes shows it (the
    governor's load before the tick is fed to it directly, at times already past)."""

    async def main() -> list:
        state = [QueueState(0, 0, 0.0, 0.0, 0.1, 0.0)]
        seen: list = []
        async with _one_session(state) as (server, conn):
            await server.tick()
            seen += [_told(conn, "lean_context"), _gauge(server, "asr_lean_passes")]
            now = asyncio.get_running_loop().time()
            for i in range(20):  # interims lagging for 5 s: the level rises; passes not yet waiting 10 s
                server.governor.observe(now - 5.0 + 0.25 * i, 0.0, oldest_interim_wait=2.0, oldest_context_wait=5.0)
            assert server.governor.level > 0 and not server.governor.lean_context()
            state[0] = QueueState(0, 3, 0.0, 2.0, 1.0, 12.0)
            await server.tick()
            seen += [_told(conn, "lean_context"), _gauge(server, "asr_lean_passes"), int(server.governor.level) > 0]
        return seen

    assert asyncio.run(main()) == [[False], 0.0, [True], 1.0, True]


def test_passes_go_lean_by_count_while_more_channels_are_open_than_the_operator_set():
    """``--context-lean-channels``: the tick passes the channels open to the governor; with more
    open than the setting, every session's decoders are told to make their passes lean, at level
    0, and once a stream has closed, whole again."""

    async def main() -> list:
        state = [QueueState(0, 0, 0.0, 0.0, 0.1, 0.0)]
        seen: list = []
        async with _one_session(state, GovernorOptions(lean_channels=1)) as (server, conn):
            await server.tick()
            seen += [_told(conn, "lean_context"), _gauge(server, "asr_lean_passes")]
            async with connect(URL.format(port=server.port)) as second:
                assert json.loads(await second.recv())["type"] == "session"
                [other] = server._connections - {conn}
                await server.tick()
                seen += [_told(conn, "lean_context"), _told(other, "lean_context"), _gauge(server, "asr_lean_passes"), int(server.governor.level)]
                await second.send(json.dumps({"type": "close"}))
                while json.loads(await second.recv())["type"] != "closed":
                    pass
            while len(server._connections) > 1:
                await asyncio.sleep(0)
            await server.tick()
            seen += [_told(conn, "lean_context"), _gauge(server, "asr_lean_passes")]
        return seen

    assert asyncio.run(main()) == [[False], 0.0, [True], [True], 1.0, 0, [False], 0.0]
