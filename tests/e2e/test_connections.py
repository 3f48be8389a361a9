"""Connections a client opens and holds: answered 503 past the gate's limits, while streams go on.

Before the gate a client that opened a few thousand connections and said
nothing used up the server's file descriptors: nobody else could connect,
and asyncio logged a traceback for each failed accept, hundreds a second.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from asr_client import connect, read_pcm

from asr_server.transport.gate import GateOptions

from ..harness import FIXTURES, MANIFEST, ServerThread
from ..wer import wer

pytestmark = pytest.mark.e2e


async def answer(port: int, request: bytes = b"") -> tuple[int, dict, bytes]:
    """Connect, send ``request`` (maybe nothing) and read what the server says until it closes:
    (HTTP status, JSON body or {}, the raw head)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if request:
            writer.write(request)
        raw = await asyncio.wait_for(reader.read(), 30)  # bounded: only a broken server keeps it open
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split()[1]) if head else 0
    return status, json.loads(body) if body.startswith(b"{") else {}, head


async def idle(port: int, count: int) -> list[asyncio.StreamWriter]:
    """``count`` connections that say nothing (held until closed, or the server's 10 s handshake timeout)."""
    writers = []
    for _ in range(count):
        writers.append((await asyncio.open_connection("127.0.0.1", port))[1])
    return writers


def refused_count(server: ServerThread, reason: str) -> float:
    text = urllib.request.urlopen(f"{server.http}/metrics", timeout=30).read().decode()
    line = next((ln for ln in text.splitlines() if ln.startswith(f'asr_connections_refused_total{{reason="{reason}"}}')), None)
    return float(line.split()[-1]) if line else 0.0


def test_a_client_holding_silent_connections_is_refused_and_a_stream_goes_on(whisper_runner):
    server = ServerThread(whisper_runner, gate=GateOptions(max_connections=0, max_opening_per_address=8)).start()
    port = server.server.port
    pcm, _ = read_pcm(str(FIXTURES / "cards_16k.wav"))

    async def main():
        async with connect(server.url) as stream:  # in before the flood; its request is read, so it holds no place
            silent = await idle(port, 8)
            try:
                extra = await asyncio.gather(*(answer(port) for _ in range(20)))
                await stream.send_audio(pcm)
                await stream.close_stream()
                messages = [m async for m in stream]
            finally:
                for w in silent:
                    w.close()
            for _ in range(1500):  # polls, bounded (30 s): until the server has seen them close
                if not server.server.gate.opening:
                    break
                await asyncio.sleep(0.02)
            healthy = await answer(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        return extra, messages, stream.close_code, healthy

    try:
        extra, messages, close_code, healthy = asyncio.run(main())
        for status, body, head in extra:
            assert status == 503 and body["code"] == "overloaded" and body["retryable"] is True, (status, body)
            assert "--max-opening-per-address" in body["message"] and b"Retry-After: 1" in head
        text = " ".join(m["text"] for m in messages if m["type"] == "final")
        reference = " ".join(MANIFEST["cards_16k.wav"]["references"][0])
        assert close_code == 1000 and messages[-1]["type"] == "closed" and wer(reference, text) < 0.3, text
        assert healthy[0] == 200  # the silent ones gone, the address is served again
        assert refused_count(server, "address") == 20 and refused_count(server, "connections") == 0
    finally:
        server.stop()


def test_past_the_servers_connection_limit_a_connection_is_answered_overloaded_until_one_closes(whisper_runner):
    server = ServerThread(whisper_runner, gate=GateOptions(max_connections=3, max_opening_per_address=0)).start()
    port = server.server.port
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"

    async def main():
        silent = await idle(port, 3)
        refused = await answer(port, health)
        silent[0].close()
        for _ in range(1500):  # polls, bounded (30 s): until the server has seen it close
            if server.server.gate.open < 3:
                break
            await asyncio.sleep(0.02)
        served = await answer(port, health)
        for w in silent[1:]:
            w.close()
        return refused, served

    try:
        refused, served = asyncio.run(main())
        assert refused[0] == 503 and refused[1]["code"] == "overloaded" and "--max-connections" in refused[1]["message"]
        assert served[0] == 200 and served[1]["status"] == "ok"
        assert refused_count(server, "connections") == 1
    finally:
        server.stop()


def test_a_follower_reading_events_holds_no_place_among_those_still_opening(whisper_runner):
    """An SSE answer may wait 8 s for news: once its request is read the connection is open, not opening."""
    server = ServerThread(whisper_runner, gate=GateOptions(max_connections=0, max_opening_per_address=1)).start()
    port = server.server.port

    async def main():
        async with connect(server.url) as stream:
            session = await stream.recv()
            follow = f"GET /v1/sessions/{session['session_id']}/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n"
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(follow.encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            try:
                first = await idle(port, 1)  # the one place for a connection still opening
                second = await answer(port)  # no place left
                first[0].close()
            finally:
                writer.close()
            await stream.close_stream()
            _ = [m async for m in stream]
        return head, second

    try:
        head, second = asyncio.run(main())
        assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
        assert second[0] == 503 and "--max-opening-per-address" in second[1]["message"]
    finally:
        server.stop()


def test_bytes_sent_behind_a_request_whose_answer_waits_are_not_read_without_bound(whisper_runner):
    """An SSE answer may wait 8 s for news; what the client sent behind its request was held in memory
    until the answer was out (90 MiB, found by a throwaway fuzz script). Now the server stops reading
    it, so the client's writes block once the socket buffers are full."""
    import socket

    server = ServerThread(whisper_runner).start()
    port = server.server.port
    junk = b"x" * (64 << 20)

    def flood(sock: socket.socket) -> int:
        sent = 0
        try:
            while sent < len(junk):
                sent += sock.send(junk[sent:sent + (1 << 20)])
        except OSError:
            pass  # blocked (the server does not read), or the answer is out and the connection closed
        return sent

    async def main():
        async with connect(server.url) as stream:
            session = await stream.recv()
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            try:
                sock.sendall(f"GET /v1/sessions/{session['session_id']}/events HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                head = b""
                while b"\r\n\r\n" not in head:
                    head += sock.recv(4096)
                sock.settimeout(5.0)
                flooding = asyncio.ensure_future(asyncio.to_thread(flood, sock))
                while not flooding.done():  # the session stays alive (it would end at its idle timeout)
                    await stream.send_audio(bytes(3200))
                    await asyncio.sleep(0.1)
                sent = flooding.result()
            finally:
                sock.close()
            await stream.close_stream()
            _ = [m async for m in stream]
        return head, sent

    try:
        head, sent = asyncio.run(main())
        assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
        assert sent < len(junk) // 2, sent  # socket buffers only (a few MiB), not what the client had to send
    finally:
        server.stop()


def test_what_a_websocket_follower_sends_is_read_and_dropped_and_its_pings_are_answered(whisper_runner):
    """A follower has nothing to say, and the server never read from it: after 16 frames (of up to
    2 MiB each, held in memory) it stopped reading the connection, so the follower's pings went
    unanswered (its keepalive would cut it off) and its close waited for the close timeout."""
    import websockets

    server = ServerThread(whisper_runner).start()
    pcm, _ = read_pcm(str(FIXTURES / "cards_16k.wav"))

    async def main():
        async with connect(server.url) as stream:
            session = await stream.recv()
            async with websockets.connect(f"{server.url}/v1/sessions/{session['session_id']}/events", ping_interval=None) as follower:
                assert json.loads(await follower.recv())["type"] == "session"
                frame = bytes((2 << 20) - 1024)  # just under the server's 2 MiB frame limit
                for _ in range(20):
                    await follower.send(frame)
                pong = await follower.ping()
                await asyncio.wait_for(pong, 120)  # bounded: before, it never came
                await stream.send_audio(pcm)
                await stream.close_stream()
                own = [m async for m in stream]
                followed = [json.loads(m) async for m in follower]
        return own, followed, follower.close_code

    try:
        own, followed, code = asyncio.run(main())
        assert [m["seq"] for m in followed] == [m["seq"] for m in own] and code == 1000  # everything, as the client got it
    finally:
        server.stop()
