"""Admission by memory budget and load level, degradation announcements, shedding, unread results."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request

import pytest
from asr_client import connect, read_pcm

from asr_server.options import Limits, StreamOptions
from asr_server.decoding.incremental import context_kept_s
from asr_server.decoding.context import ContextOptions
from asr_server.scheduler.budget import MemoryBudget, stream_bytes
from asr_server.scheduler.governor import Level

from ..harness import FIXTURES, MANIFEST, ServerThread
from ..wer import wer

pytestmark = pytest.mark.e2e

MIB = 1 << 20


def health(server) -> dict:
    with urllib.request.urlopen(server.http + "/healthz", timeout=5) as resp:
        return json.loads(resp.read())


async def refused(url: str, **options) -> tuple[list[dict], int | None]:
    async with connect(url, **options) as stream:
        messages = [m async for m in stream]
    return messages, stream.close_code


def one_stream_budget(limits: Limits) -> MemoryBudget:
    """A budget with room for exactly one mono PCM stream."""
    # the messages kept for a resume, followers and the transcript, and frames read ahead of the session
    replay = limits.max_replay_bytes + limits.max_transcript_bytes + limits.read_ahead_bytes
    per = stream_bytes(1, StreamOptions().max_utterance_s, limits.max_pending_finals, replay, context_kept_s(ContextOptions()))
    return MemoryBudget(total=per + 300 * MIB, weights=100 * MIB, baseline=100 * MIB, batch_working=100 * MIB)


def test_a_stream_past_the_memory_budget_is_refused_before_audio(whisper_runner):
    limits = Limits()
    server = ServerThread(whisper_runner, limits, budget=one_stream_budget(limits)).start()
    try:
        pcm, _ = read_pcm(str(FIXTURES / "cards_16k.wav"))

        async def main():
            async with connect(server.url) as first:
                assert (await first.recv())["type"] == "session"
                no, code = await refused(server.url)
                await first.send_audio(pcm)
                await first.close_stream()
                got = [m async for m in first]
            return no, code, got, first.close_code

        no, code, got, first_code = asyncio.run(main())
        assert [m["type"] for m in no] == ["error"] and code == 1013
        assert no[0]["code"] == "overloaded" and no[0]["retryable"] and no[0]["retry_after"] > 0 and "memory" in no[0]["message"]
        assert first_code == 1000 and "clubs" in " ".join(m["text"] for m in got if m["type"] == "final").lower()
        deadline = time.monotonic() + 10  # the reservation is given back once the server has closed the stream
        while (memory := health(server)["memory"])["reserved_mib"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert memory["for_streams_mib"] >= 0 and memory["reserved_mib"] == 0
    finally:
        server.stop()


def test_degradation_is_announced_and_new_streams_refused_class_by_class(whisper_runner):
    server = ServerThread(whisper_runner, tick_s=0).start()  # no ticker: only this test sets the level
    gov = server.server.governor

    async def set_level(level):
        gov.level = level
        await server.server.announce_level()

    try:
        pcm, _ = read_pcm(str(FIXTURES / "librivox_16k.wav"))
        half = len(pcm) // 2 // 2 * 2

        async def main():
            async with connect(server.url, interim_ms=500) as stream:
                assert (await stream.recv())["type"] == "session"
                await stream.send_audio(pcm[:half])
                server.run(set_level, Level.FEWER_INTERIMS)
                await stream.send_audio(pcm[half:])
                await stream.close_stream()
                msgs = [m async for m in stream]
            server.run(set_level, Level.REFUSE_BATCH)
            batch, batch_code = await refused(server.url, priority="batch")
            async with connect(server.url, priority="standard") as std:
                first = await std.recv()
                assert first["type"] == "session"
                late_load = await std.recv()  # admitted under load: told at once
                await std.close_stream()
                [m async for m in std]
            server.run(set_level, Level.REFUSE_STANDARD)
            standard, _ = await refused(server.url, priority="standard")
            server.run(set_level, Level.REFUSE_ALL)
            interactive, _ = await refused(server.url)
            accepting = health(server)["accepting"]
            server.run(set_level, Level.NORMAL)
            async with connect(server.url) as again:
                assert (await again.recv())["type"] == "session"
                await again.close_stream()
                [m async for m in again]
            return msgs, batch, batch_code, late_load, standard, interactive, accepting

        msgs, batch, batch_code, late_load, standard, interactive, accepting = asyncio.run(main())
        loads = [m for m in msgs if m["type"] == "load"]
        assert loads and loads[0]["level"] == 1 and loads[0]["interim_ms"] == 1000 and not loads[0]["interim_model"]
        assert loads[0]["interim_short_window"] and "shorter window" in loads[0]["message"]
        finals = " ".join(m["text"] for m in msgs if m["type"] == "final")
        assert wer(" ".join(MANIFEST["librivox_16k.wav"]["references"][0]), finals) < 0.2  # every sentence still finalized
        assert msgs[-1]["type"] == "closed" and [m["seq"] for m in msgs] == list(range(2, len(msgs) + 2))  # seq 1: session
        assert batch[0]["code"] == "overloaded" and batch_code == 1013 and "batch" in batch[0]["message"]
        assert late_load["type"] == "load" and late_load["level"] == 3 and late_load["interim_ms"] == 2000
        assert standard[0]["code"] == "overloaded" and interactive[0]["code"] == "overloaded"
        assert accepting == []
        assert health(server)["load_level"] == 0
    finally:
        server.stop()


def test_memory_critical_closes_the_longest_batch_stream_after_its_finals(whisper_runner):
    used = [0]
    budget = MemoryBudget(total=64 << 30, weights=0, baseline=0, batch_working=0)
    server = ServerThread(whisper_runner, budget=budget, memory_probe=lambda: used[0], tick_s=0.05).start()
    try:
        pcm, _ = read_pcm(str(FIXTURES / "cards_16k.wav"))

        async def main():
            async with contextlib.AsyncExitStack() as stack:
                streams = []
                for priority in ("batch", "batch", "interactive"):  # one after the other: "old" is the longest-running
                    stream = await stack.enter_async_context(connect(server.url, priority=priority))
                    assert (await stream.recv())["type"] == "session"
                    streams.append(stream)
                old, young, keep = streams
                for s in (young, keep):
                    await s.send_audio(pcm)
                await old.send_audio(pcm[: len(pcm) // 2 // 2 * 2])
                old_msgs = []
                while not any(m["type"] == "interim" for m in old_msgs):  # the server holds speech of "old"
                    old_msgs.append(await old.recv())
                used[0] = 63 << 30  # over 95 % of the budget
                old_msgs += [m async for m in old]
                used[0] = 0
                for s in (young, keep):
                    await s.close_stream()
                young_msgs = [m async for m in young]
                keep_msgs = [m async for m in keep]
            return old_msgs, old.close_code, young_msgs, keep_msgs

        old_msgs, old_code, young_msgs, keep_msgs = asyncio.run(main())
        err = next(m for m in old_msgs if m["type"] == "error")
        assert err["code"] == "memory_pressure" and err["retryable"] and old_code == 1013
        assert any(m["type"] == "final" and m["text"] for m in old_msgs)  # what it held was finalized
        for msgs in (young_msgs, keep_msgs):
            assert msgs[-1]["type"] == "closed" and "clubs" in " ".join(m["text"] for m in msgs if m["type"] == "final").lower()
    finally:
        server.stop()


def test_a_client_that_does_not_read_results_is_cut_off():
    from asr_server.session import Session
    from asr_server.server import AsrServer
    from asr_server.transport.connection import Connection
    from websockets.exceptions import ConnectionClosed

    class StuckSocket:
        """A connection whose peer never reads: every send waits forever."""

        def __init__(self):
            self.aborted = False
            self.transport = self

        def abort(self):
            self.aborted = True

        async def send(self, _text):
            await asyncio.Event().wait()

    async def main():
        server = AsrServer(limits=Limits(send_timeout_s=0.05))
        ws = StuckSocket()
        conn = Connection(server, ws, Session("s", StreamOptions()))  # type: ignore[arg-type]
        with pytest.raises(ConnectionClosed):
            await conn._send('{"type": "interim"}')
        return conn, ws, server

    conn, ws, server = asyncio.run(main())
    assert ws.aborted and conn.done.is_set() and conn.outcome == "client_error"
    assert b'asr_errors_total{code="results_not_read"} 1.0' in server.metrics.render()
