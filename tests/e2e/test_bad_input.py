"""Bad input: each gets its error code, and the other sessions on the server carry on."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request

import pytest
from asr_client import connect, read_pcm

from asr_server.access import AccessOptions, ApiKey
from asr_server.options import Limits

from ..harness import FIXTURES, MANIFEST, ServerThread, assert_each_sentence_finalized, replay, wav_bytes
from ..wer import wer
from .test_resume_at_close import open_and_send

pytestmark = pytest.mark.e2e


async def session(url: str, actions, **options):
    """Open a session, run ``actions(stream)``, collect every message and the close code."""
    async with connect(url, **options) as stream:
        messages = []
        sender = asyncio.create_task(actions(stream))
        async for m in stream:
            messages.append(m)
        await asyncio.gather(sender, return_exceptions=True)
        return messages, stream.close_code


async def nothing(stream):
    return None


async def until(condition, bound_s: float = 60.0) -> None:
    """Wait for ``condition()`` to hold, polling; the bound only keeps a broken server from hanging the suite."""
    for _ in range(int(bound_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


def error_of(messages):
    errors = [m for m in messages if m["type"] == "error"]
    assert errors, messages
    return errors[0]


@pytest.fixture(scope="module")
def strict_server(whisper_runner):
    """A server with small limits, to reach them quickly."""
    server = ServerThread(whisper_runner, Limits(max_frame_bytes=64 * 1024, idle_timeout_s=1.0)).start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "options, code",
    [
        ({"sample_rate": 1234}, "invalid_option"),
        ({"sample_rate": "abc"}, "invalid_option"),
        ({"encoding": "aiff"}, "invalid_option"),
        ({"interim_ms": 5}, "invalid_option"),
        ({"speed": "fast"}, "invalid_option"),
        ({"language": "de"}, "unsupported_language"),
    ],
)
def test_bad_options_are_refused_before_audio(live_server, options, code):
    messages, close = asyncio.run(session(live_server.url, nothing, **options))
    assert [m["type"] for m in messages] == ["error"]
    err = messages[0]
    assert err["code"] == code and err["seq"] == 1 and err["retryable"] is False and err["message"]
    assert close == 1008


def test_bad_input_does_not_harm_a_concurrent_session(live_server, strict_server):
    garbage = os.urandom(40000)
    ogg = (FIXTURES / "librivox.ogg").read_bytes()
    pcm, _ = read_pcm(str(FIXTURES / "cards_16k.wav"))

    async def send_garbage(stream):
        await stream.send_audio(garbage)
        await stream.close_stream()

    async def send_truncated(stream):
        await stream.send_audio(ogg[: len(ogg) // 3])
        await stream.close_stream()

    async def malformed_then_audio(stream):
        await stream.send_text("this is not json")
        await stream.send_text('{"type": "dance"}')
        await stream.send_text('{"no_type": 1}')
        await stream.send_audio(pcm)
        await stream.close_stream()

    def send_wav(data):
        async def send(stream):
            await stream.send_audio(data)
            await stream.close_stream()

        return send

    async def oversized(stream):
        await stream.send_audio(b"\x00" * (100 * 1024))

    async def far_oversized(stream):
        await stream.send_audio(b"\x00" * (300 * 1024))

    async def main():
        good = asyncio.create_task(replay(live_server.url, "librivox_16k.s16le", realtime=True))
        await until(lambda: live_server.server.active_channels >= 1)  # the good stream is in
        results = await asyncio.gather(
            session(live_server.url, send_garbage, encoding="ogg"),
            session(live_server.url, send_truncated, encoding="ogg"),
            session(live_server.url, malformed_then_audio),
            session(strict_server.url, oversized),
            session(strict_server.url, far_oversized),
            session(strict_server.url, nothing),  # idle
            # WAV headers the server reads itself: a rate no one records at, and a mono file
            # where the client asked for two channels.
            session(live_server.url, send_wav(wav_bytes(rate=1_000_000, data=bytes(3200))), encoding="wav"),
            session(live_server.url, send_wav(wav_bytes()), encoding="wav", channels=2),
            # FLAC the server frames itself: its STREAMINFO claims 1 Hz.
            session(live_server.url, send_wav(_flac_at_1_hz()), encoding="flac"),
        )
        return await good, results

    good, (garb, trunc, malformed, big, huge, idle, wav_rate, wav_channels, flac_rate) = asyncio.run(main())

    # Garbage in a container: invalid_audio, close 1007.
    assert error_of(garb[0])["code"] == "invalid_audio" and garb[1] == 1007
    # A truncated file: what arrived is transcribed, then a normal close.
    assert "dashwood" in " ".join(m["text"] for m in trunc[0] if m["type"] == "final").lower()
    assert trunc[0][-1]["type"] == "closed" and trunc[1] == 1000
    # Malformed JSON and unknown types are reported, and the session goes on.
    codes = [m["code"] for m in malformed[0] if m["type"] == "error"]
    assert codes == ["invalid_message", "unknown_message_type", "invalid_message"]
    assert malformed[1] == 1000 and malformed[0][-1]["type"] == "closed"
    assert "clubs" in " ".join(m["text"] for m in malformed[0] if m["type"] == "final").lower()
    # Oversized frames: our own error when we could read it, websockets' 1009 beyond that.
    assert error_of(big[0])["code"] == "frame_too_large" and big[1] == 1009
    assert huge[1] == 1009
    # A WAV header that claims 1 MHz, or one channel where two were asked for: 1007, each its code.
    assert error_of(wav_rate[0])["code"] == "invalid_audio" and wav_rate[1] == 1007
    assert error_of(wav_channels[0])["code"] == "audio_format_mismatch" and wav_channels[1] == 1007
    assert error_of(flac_rate[0])["code"] == "invalid_audio" and flac_rate[1] == 1007
    # A client that sends nothing.
    assert error_of(idle[0])["code"] == "idle_timeout" and idle[1] == 1008
    # ... and the concurrent good session was untouched.
    msgs = [m.message for m in good.messages]
    assert msgs[-1]["type"] == "closed"
    assert [m["seq"] for m in msgs] == list(range(1, len(msgs) + 1))
    assert not [m for m in msgs if m["type"] == "error"]
    assert wer(" ".join(MANIFEST["librivox_16k.s16le"]["references"][0]), good.final_text()) < 0.2


def _flac_at_1_hz() -> bytes:
    """The FLAC fixture with its STREAMINFO's sample rate (20 bits at byte 10 of the block, which
    starts at byte 8 of the file) set to 1 Hz."""
    data = bytearray((FIXTURES / "librivox.flac").read_bytes())
    packed = int.from_bytes(data[18:21], "big")
    data[18:21] = ((packed & 0xF) | (1 << 4)).to_bytes(3, "big")
    return bytes(data)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_not_ready_until_the_model_is_loaded(whisper_runner):
    server = ServerThread(None).start()
    try:
        status, body = get(server.http + "/healthz")
        assert status == 503 and json.loads(body)["status"] == "starting" and json.loads(body)["api_keys"] is False
        messages, close = asyncio.run(session(server.url, nothing))
        err = error_of(messages)
        assert err["code"] == "not_ready" and err["retryable"] is True and err["retry_after"] > 0
        assert close == 1013
        server.set_runner(whisper_runner)
        assert get(server.http + "/healthz")[0] == 200
        assert get(server.http + "/nowhere")[0] == 404
    finally:
        server.stop()


def test_disconnect_leaves_nothing_running_and_metrics_tell(whisper_runner):
    # Sessions not held for a resume (resume_ttl_s=0): the drop ends them at once.
    # With resume on, expiry frees the same (tests/e2e/test_resume.py).
    server = ServerThread(whisper_runner, Limits(resume_ttl_s=0)).start()
    try:
        pcm, _ = read_pcm(str(FIXTURES / "librivox_16k.wav"))

        async def drop_mid_sentence():
            async with connect(server.url) as stream:
                await stream.send_audio(pcm[: 16000 * 2 * 4])
                while (await stream.recv())["type"] != "interim":
                    pass  # the server is decoding this stream now
                stream._ws.transport.abort()  # vanish without a close frame

        asyncio.run(drop_mid_sentence())
        asyncio.run(replay(server.url, "cards_16k.wav"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (server.server._connections or server.server.scheduler.depth):
            time.sleep(0.1)
        assert not server.server._connections
        assert server.server.scheduler.depth == 0
        status, body = get(server.http + "/metrics")
        text = body.decode()
        assert status == 200
        assert "asr_active_sessions 0.0" in text
        assert 'asr_sessions_ended_total{outcome="disconnected"} 1.0' in text
        assert 'asr_sessions_ended_total{outcome="completed"} 1.0' in text
        for name in ("asr_final_latency_seconds_count", "asr_time_to_first_interim_seconds_count",
                     "asr_decode_seconds_count", "asr_audio_received_seconds_total", "asr_session_duration_seconds_count"):
            line = next(l for l in text.splitlines() if l.startswith(name))
            assert float(line.split()[-1]) > 0, line
    finally:
        server.stop()


def test_fast_sender_is_slowed_not_dropped(whisper_runner):
    server = ServerThread(whisper_runner, Limits(max_pending_finals=1)).start()
    try:
        r = asyncio.run(replay(server.url, "librivox_16k.s16le", realtime=False, chunk_ms=1000))
        finals = [m.message for m in r.of_type("final") if m.message["text"]]
        assert_each_sentence_finalized(finals, MANIFEST["librivox_16k.s16le"]["spans"][0])
        assert r.of_type("closed")
    finally:
        server.stop()


def test_shutdown_finalizes_what_clients_are_owed(whisper_runner):
    server = ServerThread(whisper_runner).start()
    pcm, _ = read_pcm(str(FIXTURES / "librivox_16k.wav"))

    async def stream_until_closed(speaking: asyncio.Event):
        async with connect(server.url) as stream:
            await stream.send_audio(pcm[: 16000 * 2 * 3])  # mid first sentence
            messages = []
            async for m in stream:
                messages.append(m)
                if m["type"] == "interim":
                    speaking.set()
            return messages, stream.close_code

    async def main():
        speaking = asyncio.Event()
        task = asyncio.create_task(stream_until_closed(speaking))
        await speaking.wait()  # the server holds an open utterance now
        await asyncio.to_thread(server.stop)
        return await task

    messages, code = asyncio.run(main())
    assert code == 1001
    err = error_of(messages)
    assert err["code"] == "shutting_down" and err["retryable"] is True
    final = next(m for m in messages if m["type"] == "final")
    assert "dashwood" in final["text"].lower() and final["seq"] > err["seq"]


def test_streams_past_capacity_are_refused_at_connect(whisper_runner):
    server = ServerThread(whisper_runner, Limits(max_channels=2)).start()
    try:
        pcm, _ = read_pcm(str(FIXTURES / "cards_16k.wav"))

        async def main():
            async with connect(server.url) as first:  # 1 of 2 channels
                assert (await first.recv())["type"] == "session"
                refused, code = await session(server.url, nothing, channels=2)  # would make 3
                async with connect(server.url) as second:  # 2 of 2: fits
                    assert (await second.recv())["type"] == "session"
                    await first.send_audio(pcm)
                    await first.close_stream()
                    first_msgs = [m async for m in first]
                return refused, code, first_msgs, first.close_code

        refused, code, first_msgs, first_code = asyncio.run(main())
        err = error_of(refused)
        assert [m["type"] for m in refused] == ["error"] and code == 1013
        assert err["code"] == "overloaded" and err["retryable"] is True and err["retry_after"] > 0
        # The admitted stream was not harmed.
        assert first_code == 1000 and first_msgs[-1]["type"] == "closed"
        assert "clubs" in " ".join(m["text"] for m in first_msgs if m["type"] == "final").lower()
        # Capacity is given back when streams end (the server notices a disconnect shortly after).
        deadline = time.monotonic() + 10
        while (health := json.loads(get(server.http + "/healthz")[1]))["active_channels"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert health["active_channels"] == 0 and health["max_channels"] == 2
        messages, _ = asyncio.run(session(server.url, lambda s: s.close_stream()))
        assert messages[0]["type"] == "session"
    finally:
        server.stop()


@pytest.mark.parametrize("limit", ["server", "key"])
def test_a_stream_finishing_after_its_close_leaves_its_place_to_the_next_caller(whisper_runner, limit):
    """At the channel limit (the server's, or an API key's quota), the next caller is taken while
    the last one's close is still being finished (its last final and passes), and a caller past
    the limit is still refused."""
    if limit == "server":
        server, key, past_code_wanted = ServerThread(whisper_runner, Limits(max_channels=1)), None, "overloaded"
    else:
        key, past_code_wanted = "key-carol", "quota_exceeded"
        server = ServerThread(whisper_runner, access=AccessOptions(keys=(ApiKey("carol", key, max_channels=1),)))
    server.start()
    try:
        pcm, _ = read_pcm(str(FIXTURES / "cards_16k.wav"))
        headers = {"Authorization": f"Bearer {key}"} if key else None

        async def main():
            ws, _, first_conn, reader = await open_and_send(server.url, server, first_msgs := [], headers)  # its close is held back
            assert server.call(lambda: (server.server.active_channels, server.server.finishing_channels)) == (1, 1)
            assert server.call(lambda: first_conn.sid in server.server.scheduler.core._hurried)  # its passes go first now
            async with connect(server.url, api_key=key) as second:
                taken = await second.recv()
                health = json.loads((await asyncio.to_thread(get, server.http + "/healthz"))[1])
                past, past_code = await session(server.url, nothing, api_key=key)  # one speaking: the limit
                server.call(first_conn._lock.release)
                await reader
                await second.send_audio(pcm)
                await second.close_stream()
                second_msgs = [m async for m in second]
            await ws.close()
            return first_msgs, taken, health, past, past_code, second_msgs

        first_msgs, taken, health, past, past_code, second_msgs = asyncio.run(main())
    finally:
        server.stop()
    assert taken["type"] == "session", taken
    assert (health["active_channels"], health["finishing_channels"]) == (2, 1)
    assert error_of(past)["code"] == past_code_wanted and past_code == 1013
    # The first caller got everything it was owed, the second its whole transcript.
    assert first_msgs[-1]["type"] == "closed" and "dashwood" in " ".join(m["text"] for m in first_msgs if m["type"] == "final").lower()
    assert second_msgs[-1]["type"] == "closed" and "clubs" in " ".join(m["text"] for m in second_msgs if m["type"] == "final").lower()


def test_pipelined_http_requests_get_an_answer_and_no_internal_error(live_server, caplog):
    """websockets parsed a second pipelined request as WebSocket frames and failed the connection
    before answering the first (no answer, a traceback in the log)."""
    import logging
    import socket

    request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    with caplog.at_level(logging.INFO), socket.create_connection(("127.0.0.1", live_server.server.port), timeout=30) as sock:
        sock.sendall(request + request + b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head
    assert json.loads(body)["status"] == "ok"
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]
    with urllib.request.urlopen(f"{live_server.http}/healthz", timeout=30) as again:  # and the server goes on
        assert again.status == 200


def test_admission_follows_the_measured_cost_of_a_final_in_a_burst(whisper_runner):
    from asr_server.scheduler.capacity import CapacityModel, CapacityOptions
    from asr_server.scheduler.policy import BatchLimits

    cost = whisper_runner.measure_burst_final(repeats=1)
    assert 0 < cost < 30
    # A burst budget of 2.5 burst finals on one worker: two channels' finals fit at once, three do not.
    capacity = CapacityModel(1, cost, CapacityOptions(burst_s=2.5 * cost))
    server = ServerThread(whisper_runner, capacity=capacity, batch=BatchLimits(burst_backlog=1)).start()  # every final in a burst
    try:
        pcm, _ = read_pcm(str(FIXTURES / "cards_16k.wav"))

        async def main():
            async with connect(server.url) as first:
                assert (await first.recv())["type"] == "session"
                refused, code = await session(server.url, nothing, channels=2)
                await first.send_audio(pcm)
                await first.close_stream()
                return refused, code, [m async for m in first]

        refused, code, first_msgs = asyncio.run(main())
        assert code == 1013 and error_of(refused)["code"] == "overloaded"
        assert first_msgs[-1]["type"] == "closed"
        health = json.loads(get(server.http + "/healthz")[1])
        # Each final the admitted stream got taught the model what a final in a burst costs.
        assert health["capacity"]["observed_finals"] >= 1 and health["max_channels"] == capacity.channels()
    finally:
        server.stop()


def _exchange(port: int, request: bytes) -> tuple[bytes, bytes]:
    """One raw request; (head, body) of the answer, read until the server closes."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


@pytest.mark.parametrize("request_head, extra, said", [
    # fetch() or requests.post(json=...) to a route that reads no body
    (b"POST /v1/listen HTTP/1.1", b"Content-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"ttl_s\": 30}", "query string"),
    (b"GET /v1/sessions HTTP/1.1", b"Content-Length: 2\r\n\r\n{}", "query string"),
    # a token request's body is read only when small and announced by its length
    (b"POST /v1/tokens HTTP/1.1", b"Transfer-Encoding: chunked\r\n\r\nd\r\n{\"ttl_s\": 30}\r\n0\r\n\r\n", "Content-Length"),
    (b"POST /v1/tokens HTTP/1.1", b"Content-Length: 20000\r\n\r\n" + b" " * 20000, "at most 16384 bytes"),
])
def test_a_request_with_a_body_gets_a_clear_refusal_not_an_empty_reply(live_server, caplog, request_head, extra, said):
    """websockets closed a request that had a body without answering ('Empty reply from server')."""
    import logging

    with caplog.at_level(logging.INFO):
        head, body = _exchange(live_server.server.port, request_head + b"\r\nHost: localhost\r\n" + extra)
    error = json.loads(body)
    assert head.startswith(b"HTTP/1.1 400") and error["code"] == "bad_request" and said in error["message"], (head, body)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    for small in (b"Content-Length: 0\r\n\r\n", b"Content-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"ttl_s\": 30}"):
        answer = _exchange(live_server.server.port, b"POST /v1/tokens HTTP/1.1\r\nHost: localhost\r\n" + small)
        assert json.loads(answer[1])["code"] == "tokens_disabled"  # read and judged (this server has no keys)


@pytest.mark.parametrize("request_bytes", [
    b"GET /healthz HTTP/2.0\r\nHost: localhost\r\n\r\n",  # another version
    b"GET /healthz\r\n\r\n",  # HTTP/0.9's line
    b"HELLO\r\n\r\n",
    b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: localhost\r\n\r\n",  # a path not percent-encoded
    b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nno colon here\r\n\r\n",
])
def test_a_request_that_is_not_http_1_1_gets_an_answer_not_a_silent_close(live_server, caplog, request_bytes):
    """websockets' parser closed these without a word; the client is now told why."""
    import logging

    with caplog.at_level(logging.INFO):
        head, body = _exchange(live_server.server.port, request_bytes)
    error = json.loads(body)
    assert head.startswith(b"HTTP/1.1 400") and error["code"] == "bad_request" and "HTTP/1.1" in error["message"], (head, body)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert _exchange(live_server.server.port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")[0].startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("header", [b"Authorization: Bearer a", b"Origin: http://localhost", b"Host: localhost"])
def test_a_header_that_must_come_once_sent_twice_is_refused_not_an_internal_error(live_server, caplog, header):
    """websockets' Headers.get raised on a repeated header: HTTP 500 and a traceback in the log."""
    import logging

    request = b"GET /v1/sessions HTTP/1.1\r\nHost: localhost\r\n" + header + b"\r\n" + header + b"\r\n\r\n"
    with caplog.at_level(logging.INFO):
        head, body = _exchange(live_server.server.port, request)
    error = json.loads(body)
    name = header.split(b":")[0].decode()
    assert head.startswith(b"HTTP/1.1 400") and error["code"] == "bad_request" and name in error["message"], (head, body)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # A list-valued header may come twice: read as one comma-separated line.
    head, _ = _exchange(live_server.server.port, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n"
                        b"Accept: application/openmetrics-text\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"application/openmetrics-text" in head


DEEP_JSON = '{"type": ' + "[" * 5000  # json.loads raises RecursionError, not ValueError, on this


@pytest.fixture(scope="module")
def keyed_server(whisper_runner):
    server = ServerThread(whisper_runner, access=AccessOptions(keys=(ApiKey("dana", "dana-key"),))).start()
    yield server
    server.stop()


KEEPALIVE = {"type": "keepalive"}


@pytest.mark.parametrize("path, auth, harmless, finish", [
    ("/v1/listen", "Bearer dana-key", KEEPALIVE, {"type": "close"}),
    ("/v1/listen?model=nova-3", "Token dana-key", KEEPALIVE, {"type": "CloseStream"}),  # Deepgram's dialect
    ("/v1/twilio", "Bearer dana-key", {"event": "connected", "protocol": "Call", "version": "1.0.0"}, {"event": "stop", "stop": {}}),
    ("/v1/realtime?intent=transcription", "Bearer dana-key", KEEPALIVE, None),  # OpenAI's: the client hangs up
])
def test_json_nested_too_deeply_is_a_bad_message_not_a_crash(keyed_server, caplog, path, auth, harmless, finish):
    """Each vendor dialect read a text frame with json.loads and caught ValueError only: a few
    thousand '[' raised RecursionError, the session crashed (internal_error, close 1011) and the
    server logged a traceback. The frame is now bad input like any other; the stream goes on."""
    import logging

    import websockets

    async def run():
        async with websockets.connect(keyed_server.url + path, additional_headers={"Authorization": auth}) as ws:
            await ws.send(DEEP_JSON)
            await ws.send(json.dumps(harmless))
            got = []
            if finish is None:
                while not any(m.get("type") == "error" for m in got):
                    got.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
                await ws.close()
            else:
                await ws.send(json.dumps(finish))
                async for text in ws:
                    got.append(json.loads(text))
            return got, ws.close_code

    with caplog.at_level(logging.INFO):
        got, code = asyncio.run(run())
    assert code == 1000, (code, got)
    said = json.dumps(got)
    assert "internal_error" not in said
    if path != "/v1/twilio":  # nothing goes back to Twilio; its errors are logged and followed
        assert "invalid_message" in said, got
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("path, auth", [
    ("/v1/tokens", "Bearer dana-key"), ("/v1/auth/grant", "Token dana-key"), ("/v1/realtime/client_secrets", "Bearer dana-key"),
])
def test_a_token_request_whose_json_is_nested_too_deeply_is_a_bad_request(keyed_server, caplog, path, auth):
    """The same RecursionError in a token request's body was an HTTP 500 and a traceback."""
    import logging

    body = DEEP_JSON.encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    with caplog.at_level(logging.INFO):
        head, answer = _exchange(keyed_server.server.port, request)
    assert head.startswith(b"HTTP/1.1 400") and json.loads(answer)["code"] == "bad_request", (head, answer)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


SUPERSCRIPT_TWO = "%C2%B2"  # '²': str.isdigit() takes it, int() does not


def test_numbers_that_are_not_plain_digits_are_bad_options_not_crashes(live_server, caplog):
    """Several places checked a client's number with str.isdigit() and then called int(): '²'
    passes the first and fails the second, and so do more than 4300 digits. Each was an
    exception where an error code belonged: a Deepgram handshake closed 1011, a follower's
    WebSocket 1011, its SSE and transcript requests HTTP 500, a resume 1011, each with a traceback."""
    import logging

    import websockets

    many = "9" * 5000

    async def messages_and_code(url, **kwargs):
        async with websockets.connect(url, **kwargs) as ws:
            got = []
            try:
                async for m in ws:
                    got.append(json.loads(m))
            except websockets.ConnectionClosed:
                pass
            return got, ws.close_code

    def http_status(url):
        try:
            with urllib.request.urlopen(url, timeout=60) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    async def run():
        results = []
        for query in (f"endpointing={SUPERSCRIPT_TWO}", f"endpointing={many}"):
            results.append(await messages_and_code(f"{live_server.url}/v1/listen?model=nova-3&{query}",
                                                additional_headers={"Authorization": "Token any"}))
        async with websockets.connect(f"{live_server.url}/v1/listen") as stream:  # a session to follow
            session_id = json.loads(await stream.recv())["session_id"]
            follow = f"{live_server.url}/v1/sessions/{session_id}/events"
            results.append(await messages_and_code(f"{follow}?from_seq={many[:30]}"))
            http = f"{live_server.http}/v1/sessions/{session_id}"
            statuses = [await asyncio.to_thread(http_status, f"{http}/events?from_seq={many[:30]}"),
                        await asyncio.to_thread(http_status, f"{http}/transcript?format=srt&line_chars={SUPERSCRIPT_TWO}"),
                        await asyncio.to_thread(http_status, f"{http}/transcript?format=srt&lines={many}")]
            await stream.send(json.dumps({"type": "close"}))
            assert [json.loads(m) async for m in stream][-1]["type"] == "closed"
        results.append(await messages_and_code(f"{live_server.url}/v1/listen?resume=anything&last_seq={SUPERSCRIPT_TWO}"))
        return results, statuses

    with caplog.at_level(logging.INFO):
        results, statuses = asyncio.run(run())
    for got, code in results:
        assert code == 1008 and "invalid_option" in json.dumps(got), (code, got)
    for status, body in statuses:
        assert status == 400 and body["code"] == "invalid_option", (status, body)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_token_lifetime_past_a_floats_range_is_a_bad_option(keyed_server, caplog):
    """{"ttl_s": 10**400} (JSON's integers have no bound) made float() raise OverflowError: HTTP 500."""
    import logging

    body = b'{"ttl_s": 1' + b"0" * 400 + b"}"
    request = (b"POST /v1/tokens HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer dana-key\r\nContent-Type: application/json\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    with caplog.at_level(logging.INFO):
        head, answer = _exchange(keyed_server.server.port, request)
    assert head.startswith(b"HTTP/1.1 400") and json.loads(answer)["code"] == "invalid_option", (head, answer)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_container_that_fails_to_decode_after_the_connection_dropped_ends_its_session_quietly():
    """Found by a hostile client: bad flac bytes, then the connection cut without a close. The
    decoder's error came after the drop, the error message could not be sent, and asyncio logged
    "Task exception was never retrieved" with a traceback at ERROR level (8 times in 40 rounds of the sweep)."""
    from websockets.exceptions import ConnectionClosed

    from asr_server.audio.decode import ContainerDecoder
    from asr_server.server import AsrServer
    from asr_server.session import Session
    from asr_server.options import StreamOptions
    from asr_server.transport.connection import Connection

    class DroppedSocket:
        """A connection whose peer went away: every send fails."""

        def __init__(self):
            self.transport = self

        def abort(self):
            pass

        async def send(self, _text):
            raise ConnectionClosed(None, None)

        async def close(self, *_args):
            pass

    async def main():
        conn = Connection(AsrServer(), DroppedSocket(), Session("s", StreamOptions(encoding="flac")))  # type: ignore[arg-type]
        conn.session.start()
        conn._container = ContainerDecoder("flac", 1)
        conn._container.feed(b"this is not a flac stream" * 40)
        conn._container.end()
        await conn._pump_container()  # raised ConnectionClosed before
        return conn

    conn = asyncio.run(main())
    assert conn.done.is_set() and conn.outcome == "client_error"  # the decoder's error, not the drop, decides the outcome
