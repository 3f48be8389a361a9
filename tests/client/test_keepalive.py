"""The Python client's keepalive against small servers on loopback that misbehave on purpose:
one that holds back reading for many keepalive periods while it pings (a fast upload to a busy
server) is kept; one that answers nothing is given up and resumed; one that does not ping
itself is kept alive by the client's own pings; on a stream with heartbeats, pings and pongs
without messages (a proxy answering for a server that is gone) are given up, and heartbeats
keep a connection whose pongs never come."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, Awaitable, Callable

from asr_client import connect
from websockets.asyncio.server import ServerConnection, serve

CHUNK = os.urandom(32000)  # one second of 16 kHz PCM that compression cannot shrink


def session(keepalive_interval_s: float, keepalive_timeout_s: float, heartbeat_s: float = 0) -> str:
    limits = {"keepalive_interval_s": keepalive_interval_s, "keepalive_timeout_s": keepalive_timeout_s, "resume_ttl_s": 5}
    config = {"heartbeat_s": heartbeat_s}
    return json.dumps({"type": "session", "session_id": "s1", "resume_token": "t" * 32, "config": config, "limits": limits})


async def talk(handler: Callable[[ServerConnection], Awaitable[None]], server_ping: float | None, upload: int,
               **client: Any) -> list[dict[str, Any]]:
    """Run ``handler`` as the server; the client sends ``upload`` bytes of audio as fast as it
    can, then ``close``, while it reads. Every message until the first ``reconnecting`` or the end."""
    messages: list[dict[str, Any]] = []
    async with serve(handler, "127.0.0.1", 0, ping_interval=server_ping, ping_timeout=None, close_timeout=1) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", encoding="pcm_s16le", sample_rate=16000, **client) as stream:
            async def send() -> None:
                for _ in range(upload // len(CHUNK)):
                    await stream.send_audio(CHUNK)
                await stream.close_stream()

            sender = asyncio.create_task(send())
            try:
                async with asyncio.timeout(60):  # bounds the test, never reached when it passes
                    async for message in stream:
                        messages.append(message)
                        if message["type"] == "reconnecting":
                            break
            finally:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
    return messages


async def read_until_close(ws: ServerConnection) -> None:
    """Read the audio up to the client's ``close`` command, then send ``closed`` with its byte count."""
    received = 0
    async for frame in ws:
        if isinstance(frame, str):
            break
        received += len(frame)
    await ws.send(json.dumps({"type": "closed", "audio_bytes": received}))
    await ws.close()


def kinds(messages: list[dict[str, Any]]) -> list[str]:
    return [m["type"] for m in messages]


def test_a_server_that_pings_while_it_holds_back_reading_is_not_given_up():
    # A busy server reads a fast upload at its own pace (here 0.75 MB/s): the client's pong
    # waits behind the megabytes of audio the sockets' buffers hold, for seconds, while the
    # client would give up after 2 s of silence. The server pings every 0.1 s all the while.
    # The library's own keepalive, judging its pongs, failed such uploads with 1011 (and
    # resumed them): the server would then never see the ``close``.
    async def handler(ws: ServerConnection) -> None:
        await ws.send(session(0.1, 0.1))
        received = 0
        async for frame in ws:
            if isinstance(frame, str):
                break
            received += len(frame)
            await asyncio.sleep(len(frame) / 750_000)  # the pace of a busy server, not synchronisation
        await ws.send(json.dumps({"type": "closed", "audio_bytes": received}))
        await ws.close()

    messages = asyncio.run(talk(handler, 0.1, upload=6 << 20, ping_interval=1.0, ping_timeout=1.0))
    assert kinds(messages) == ["session", "closed"]
    assert messages[1]["audio_bytes"] == (6 << 20) // len(CHUNK) * len(CHUNK)


def test_a_server_that_answers_nothing_is_given_up_and_resumed():
    async def handler(ws: ServerConnection) -> None:
        await ws.send(session(0, 0))  # no server keepalive: the client's own pings go unanswered
        ws.transport.pause_reading()
        await ws.wait_closed()  # the client cuts the connection

    messages = asyncio.run(talk(handler, None, upload=0, ping_interval=0.3, ping_timeout=0.3))
    assert kinds(messages) == ["session", "reconnecting"]
    assert messages[1]["close_code"] == 1006 and messages[1]["last_seq"] == 0


def test_a_server_without_a_keepalive_that_sends_nothing_is_kept_by_the_clients_pings():
    async def handler(ws: ServerConnection) -> None:
        await ws.send(session(0, 0))
        await asyncio.sleep(4.0)  # sends nothing for more than twice the client's limit (reading: pongs go out)
        await read_until_close(ws)

    messages = asyncio.run(talk(handler, None, upload=64000, ping_interval=0.5, ping_timeout=1.0))
    assert kinds(messages) == ["session", "closed"]
    assert messages[1]["audio_bytes"] == 64000


def test_with_heartbeats_pings_and_pongs_without_a_message_are_given_up():
    # Frames keep coming (the server's pings, its pongs) but no message, on a stream that asked
    # for heartbeats: as behind a proxy that answers pings for a server that is gone.
    async def handler(ws: ServerConnection) -> None:
        await ws.send(session(0.1, 0.1, heartbeat_s=0.2))  # given up 2 * 0.2 + 5 s after the last message
        await ws.wait_closed()

    messages = asyncio.run(talk(handler, 0.1, upload=0, ping_interval=0.3, ping_timeout=0.3))
    assert kinds(messages) == ["session", "reconnecting"]


def test_heartbeats_keep_a_connection_whose_pongs_never_come():
    async def handler(ws: ServerConnection) -> None:
        await ws.send(session(0, 0, heartbeat_s=0.2))
        ws.transport.pause_reading()  # the client's pings go unanswered ...
        for _ in range(15):
            await ws.send(json.dumps({"type": "heartbeat"}))  # ... but a heartbeat comes every 0.2 s
            await asyncio.sleep(0.2)  # the server's cadence, not synchronisation
        ws.transport.resume_reading()
        await read_until_close(ws)

    messages = asyncio.run(talk(handler, None, upload=64000, ping_interval=0.3, ping_timeout=0.3))
    assert kinds(messages) == ["session", *["heartbeat"] * 15, "closed"]
