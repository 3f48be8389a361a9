"""End to end: a connection that drops after the client's ``close``, before ``closed`` reached
it, resumes into the session's last results: while the session still finishes (it is held, or
taken over), and after it finished (the messages the client missed, then the close)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
import websockets
from asr_client import connect

from asr_server.access import AccessOptions, parse_keys
from asr_server.options import Limits

from ..harness import FIXTURES, ServerThread
from .proxy import CutProxy
from .test_resume import OPTIONS, drain, wait_for

pytestmark = pytest.mark.e2e

# The first 15 s of the reading: two sentences, and the close comes in the middle of the third,
# so its final (and the passes at the close) come after the close.
AUDIO_S = 15.0
QUERY = "encoding=pcm_s16le&sample_rate=16000&channels=1"


def audio() -> bytes:
    return (FIXTURES / "librivox_16k.s16le").read_bytes()[: int(AUDIO_S * 32000)]


async def open_and_send(url: str, server: ServerThread, messages: list[dict[str, Any]], headers: dict[str, str] | None = None,
                        before_close: Any = None) -> tuple[Any, str, Any, asyncio.Task[None]]:
    """A session on ``url`` with all its audio read by the server, whose next call into the session
    now waits (its lock is held; or ``before_close(conn)`` instead), and the client's ``close`` read:
    the connection, its resume token, the server's Connection, and a task putting the connection's
    messages in ``messages`` until it drops."""
    ws = await websockets.connect(f"{url}/v1/listen?{QUERY}", ping_interval=None, additional_headers=headers)
    session = json.loads(await ws.recv())
    messages.append(session)

    reader = asyncio.create_task(read_into(ws, messages))
    conn = await send_and_close(server, ws.send, lambda: ws.send(json.dumps({"type": "close"})), before_close)
    return ws, session["resume_token"], conn, reader


async def read_into(ws: Any, messages: list[dict[str, Any]]) -> None:
    """Put the connection's messages in ``messages`` until it drops."""
    try:
        while True:
            messages.append(json.loads(await ws.recv()))
    except websockets.ConnectionClosed:
        return


async def send_and_close(server: ServerThread, send_audio: Any, send_close: Any, before_close: Any = None) -> Any:
    """Send the audio; once the server has read it all, hold the session's lock (its next call
    waits; or call ``before_close(conn)`` instead) and send ``close``; the server's Connection once
    it has read the close."""
    data = audio()
    for i in range(0, len(data), 3200):
        await send_audio(data[i : i + 3200])
    (conn,) = server.call(lambda: list(server.server._connections))
    await wait_for(lambda: server.call(lambda: conn.bytes_received) == len(data), "the server to read all the audio")
    if before_close is None:
        server.run(conn._lock.acquire)
    else:
        before_close(conn)
    await send_close()
    await wait_for(lambda: server.call(lambda: conn._ending), "the server to read the close")
    return conn


def sent(server: ServerThread, session_id: str) -> list[dict[str, Any]]:
    """Every message the (ended) session sent, from the log the server keeps."""
    ended = server.call(lambda: server.server.ended.get(session_id, time.monotonic()))
    return [json.loads(text) for text in ended.log.after(0)]


def test_a_drop_after_close_is_held_and_a_resume_after_the_end_gets_the_rest_and_the_close(whisper_runner):
    keys = AccessOptions(keys=parse_keys("alice:key-a\nbob:key-b"))
    as_alice, as_bob = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    server = ServerThread(whisper_runner, access=keys).start()
    try:
        async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int | None, str, dict[str, list[dict[str, Any]]]]:
            before: list[dict[str, Any]] = []
            async with CutProxy(server.server.port) as proxy:
                ws, token, conn, reader = await open_and_send(proxy.url, server, before, as_alice)
                proxy.cut()  # nothing of the close's results has gone out yet
                await reader
                server.call(conn._lock.release)
                await wait_for(lambda: server.call(lambda: conn._held), "the session to be held")
                await wait_for(lambda: not server.server._connections, "the session to finish while its client is away")
                await ws.close()
            last_seq = before[-1]["seq"]
            refused = {}
            # Refused as for a live session: another key's resume, and one past the last message sent.
            async with websockets.connect(f"{server.url}/v1/listen?resume={token}&last_seq={last_seq}", additional_headers=as_bob) as ws:
                refused["bob"] = await drain(ws)
            async with websockets.connect(f"{server.url}/v1/listen?resume={token}&last_seq=999", additional_headers=as_alice) as ws:
                refused["past"] = await drain(ws)
            async with websockets.connect(f"{server.url}/v1/listen?resume={token}&last_seq={last_seq}", additional_headers=as_alice) as second:
                rest = await drain(second)
                return before, rest, second.close_code, conn.sid, refused

        before, rest, close_code, sid, refused = asyncio.run(main())
        everything = sent(server, sid)
        metrics = server.call(lambda: server.server.metrics.render().decode())  # in its loop: after the session's end is counted
    finally:
        server.stop()
    assert before + rest == everything  # every message once, in order: none lost with the connection
    assert [m["seq"] for m in everything] == list(range(1, len(everything) + 1))
    assert [m for m in rest if m["type"] == "final" and m["text"]]  # the last sentence's final came while it was away
    assert rest[-1]["type"] == "closed" and rest[-1]["audio_received_s"] == AUDIO_S and close_code == 1000
    assert "resumed" not in [m["type"] for m in rest]  # nothing to go on with
    assert [m["code"] for m in refused["bob"]] == [m["code"] for m in refused["past"]] == ["resume_failed"]
    assert 'asr_sessions_ended_total{outcome="completed"} 1.0' in metrics
    assert 'asr_resume_attempts_total{outcome="ended"} 1.0' in metrics


def test_a_client_back_while_the_session_finishes_after_its_close_takes_it_over(whisper_runner):
    server = ServerThread(whisper_runner).start()
    try:
        async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int | None, str]:
            before: list[dict[str, Any]] = []
            ws, token, conn, reader = await open_and_send(server.url, server, before)
            old = server.call(lambda: conn.ws)
            # Its client is back on a new connection before the server saw the old one drop.
            last_seq = before[-1]["seq"]
            async with websockets.connect(f"{server.url}/v1/listen?resume={token}&last_seq={last_seq}") as second:
                await wait_for(lambda: server.call(lambda: old.transport.is_closing()), "the resume to take the session over")
                server.call(conn._lock.release)
                rest = await drain(second)
                await reader
                await ws.close()
            # A session is counted as ended (and its log kept) a moment after its close.
            await wait_for(lambda: not server.server._connections, "the session to end")
            return [m for m in before if m["seq"] <= last_seq], rest, second.close_code, conn.sid

        before, rest, close_code, sid = asyncio.run(main())
        everything = sent(server, sid)
        metrics = server.call(lambda: server.server.metrics.render().decode())  # in its loop: after the session's end is counted
    finally:
        server.stop()
    assert before + rest == everything
    assert [m["seq"] for m in everything] == list(range(1, len(everything) + 1))
    kinds = [m["type"] for m in rest]
    assert kinds.count("resumed") == 1 and kinds.index("resumed") < kinds.index("closed") == len(kinds) - 1
    after = rest[kinds.index("resumed") + 1 :]
    assert [m for m in after if m["type"] == "final" and m["text"]]  # the session went on, and finished, on the new connection
    assert rest[-1]["audio_received_s"] == AUDIO_S and close_code == 1000
    assert 'asr_resume_attempts_total{outcome="resumed"} 1.0' in metrics
    assert 'asr_sessions_ended_total{outcome="completed"} 1.0' in metrics


def test_the_python_client_resumes_a_connection_lost_after_its_close_and_gets_every_message(whisper_runner):
    server = ServerThread(whisper_runner).start()
    try:
        async def main() -> tuple[list[dict[str, Any]], str]:
            async with CutProxy(server.server.port) as proxy:
                async with connect(proxy.url, **OPTIONS) as stream:
                    conn = await send_and_close(server, stream.send_audio, stream.close_stream)
                    proxy.cut()
                    server.call(conn._lock.release)
                    messages = [m async for m in stream]
            await wait_for(lambda: not server.server._connections, "the session to end")
            return messages, conn.sid

        messages, sid = asyncio.run(main())
        everything = sent(server, sid)
    finally:
        server.stop()
    assert [m["type"] for m in messages].count("reconnecting") == 1
    assert [m for m in messages if m["type"] != "reconnecting"] == everything  # every message once, in order
    assert everything[-1]["type"] == "closed" and everything[-1]["audio_received_s"] == AUDIO_S



class GatedRunner:
    """The real model, whose calls wait while the gate is shut (a slow machine, a long queue)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.gate = threading.Event()
        self.gate.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def transcribe_batch(self, requests: Any, retry_later: bool = False) -> Any:
        assert self.gate.wait(120)
        return self.runner.transcribe_batch(requests, retry_later=retry_later)


def test_a_session_finishing_after_its_close_is_held_past_the_resume_ttl_until_it_ends(whisper_runner):
    # A close's last results can take longer than the hold (a slow machine, a long queue): the
    # session is its client's until it has finished, and a resume after the ttl takes it over.
    ttl_s = 1.0
    runner = GatedRunner(whisper_runner)
    server = ServerThread(runner, Limits(resume_ttl_s=ttl_s)).start()
    try:
        async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int | None, str, bool]:
            before: list[dict[str, Any]] = []
            async with CutProxy(server.server.port) as proxy:
                # From the close on the model answers nothing, until the resume.
                ws, token, conn, reader = await open_and_send(proxy.url, server, before, before_close=lambda _conn: runner.gate.clear())
                proxy.cut()
                await reader
                await wait_for(lambda: server.call(lambda: conn._held), "the session to be held")
                held_at = server.call(server.server.clock)
                await wait_for(lambda: server.call(server.server.clock) > held_at + ttl_s + 0.5, "the resume ttl to pass")
                still_there = server.call(lambda: conn in server.server._connections)
                last_seq = before[-1]["seq"]
                async with websockets.connect(f"{server.url}/v1/listen?resume={token}&last_seq={last_seq}") as second:
                    rest = [json.loads(await second.recv())]
                    while rest[-1]["type"] != "resumed":  # what it missed, then `resumed`: it still finishes
                        rest.append(json.loads(await second.recv()))
                    runner.gate.set()
                    rest += await drain(second)
                await ws.close()
            await wait_for(lambda: not server.server._connections, "the session to end")
            return before, rest, second.close_code, conn.sid, still_there

        before, rest, close_code, sid, still_there = asyncio.run(main())
        everything = sent(server, sid)
        metrics = server.call(lambda: server.server.metrics.render().decode())
    finally:
        runner.gate.set()
        server.stop()
    assert still_there  # not expired with its close's results still to come
    assert before + rest == everything
    kinds = [m["type"] for m in rest]
    assert kinds.count("resumed") == 1 and kinds.index("resumed") < kinds.index("closed") == len(kinds) - 1
    after = rest[kinds.index("resumed") + 1 :]
    assert [m for m in after if m["type"] == "final" and m["text"]]  # the last sentence's final, after the ttl
    assert rest[-1]["audio_received_s"] == AUDIO_S and close_code == 1000
    assert 'asr_sessions_ended_total{outcome="completed"} 1.0' in metrics


def test_a_resume_cuts_short_the_close_of_a_connection_gone_silent(whisper_runner):
    # The connection goes dead without a word (nothing from the server arrives, no FIN) just as
    # the client closes: the server's close waits for an answer that never comes. A resume then
    # ends that wait, and gets the rest and the close.
    server = ServerThread(whisper_runner).start()
    try:
        async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int | None, str]:
            before: list[dict[str, Any]] = []
            async with CutProxy(server.server.port) as proxy:

                def go_silent(conn: Any) -> None:
                    server.call(lambda: setattr(conn.ws, "close_timeout", 3600))  # its close would wait "forever"
                    proxy.blackhole()  # from here nothing the server sends arrives

                ws, token, conn, reader = await open_and_send(proxy.url, server, before, before_close=go_silent)
                await wait_for(lambda: server.call(lambda: conn.closed_with is not None), "the server to close the dead connection")
                last_seq = before[-1]["seq"]
                async with websockets.connect(f"{server.url}/v1/listen?resume={token}&last_seq={last_seq}") as second:
                    rest = await asyncio.wait_for(drain(second), 60)
                await ws.close()
                await reader
            await wait_for(lambda: not server.server._connections, "the session to end")
            return before, rest, second.close_code, conn.sid

        before, rest, close_code, sid = asyncio.run(main())
        everything = sent(server, sid)
    finally:
        server.stop()
    assert before + rest == everything  # every message once, in order
    assert "resumed" not in [m["type"] for m in rest] and rest[-1]["type"] == "closed" and close_code == 1000
    assert [m for m in rest if m["type"] == "final" and m["text"]]
