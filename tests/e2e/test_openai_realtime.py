"""End to end: the official ``openai`` SDK's realtime client (pinned in the test extras), pointed
at this server, opens a transcription session, streams 24 kHz pcm16 at real-time pace and gets
speech events, append-only deltas and one ``.completed`` per utterance whose text is that of our
own protocol's finals on the same audio."""

from __future__ import annotations

import asyncio
import base64
import time
from collections import defaultdict
from typing import Any

import pytest
from asr_client import read_pcm, stream_bytes
from openai import AsyncOpenAI

from asr_server.access import AccessOptions, parse_keys

from ..harness import FIXTURES, ServerThread
from ..wer import wer

pytestmark = pytest.mark.e2e

FIXTURE = "cards_16k.wav"
SESSION = {
    "type": "transcription",
    "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                        "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}},
}


async def transcribe_with_sdk(server: ServerThread, pcm: bytes, key: str = "any-key") -> list[Any]:
    client = AsyncOpenAI(api_key=key, base_url=f"{server.http}/v1")
    events: list[Any] = []
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        await connection.session.update(session=SESSION)

        async def send() -> None:
            start, chunk = time.monotonic(), 4800  # 100 ms at 24 kHz
            for i in range(0, len(pcm), chunk):
                await asyncio.sleep(max(0.0, start + i / 48000 - time.monotonic()))  # real-time pace, not synchronisation
                await connection.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + chunk]).decode())
            # The first commit ends what is still being said; the second, with nothing left, is answered at
            # once with input_audio_buffer_commit_empty, after every utterance has been started.
            await connection.input_audio_buffer.commit()
            await connection.input_audio_buffer.commit()

        sender = asyncio.create_task(send())
        try:
            async with asyncio.timeout(90):
                async for event in connection:
                    events.append(event)
                    started = sum(e.type == "input_audio_buffer.speech_started" for e in events)
                    done = sum(e.type == "conversation.item.input_audio_transcription.completed" for e in events)
                    if any(e.type == "error" and e.error.code == "input_audio_buffer_commit_empty" for e in events) and started == done:
                        break
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    return events


async def native_finals(server: ServerThread, pcm: bytes) -> list[str]:
    finals = []
    async for item in stream_bytes(server.url, pcm, bytes_per_second=48000, realtime=True, encoding="pcm_s16le", sample_rate=24000, channels=1,
                                   revisions=False):  # as the OpenAI dialect runs: finals are final
        if item.message["type"] == "final" and item.message["text"]:
            finals.append(item.message["text"])
    return finals


def test_openais_sdk_transcribes_with_deltas_and_completed_items(whisper_runner):
    pcm, _ = read_pcm(str(FIXTURES / FIXTURE), rate=24000)
    # The test server never refuses (see ServerThread): on a busy machine the first stream could
    # raise the load level, and a refused second stream had no finals to compare.
    server = ServerThread(whisper_runner).start()
    try:
        events = asyncio.run(transcribe_with_sdk(server, pcm))
        ours = asyncio.run(native_finals(server, pcm))
        metrics = server.server.metrics.render().decode()
    finally:
        server.stop()
    kinds = [e.type for e in events]
    errors = [e.error.code for e in events if e.type == "error"]
    # The second commit always finds nothing to commit; the first does too when the last utterance's
    # final went out before it came (a race with the endpoint in the fixture's last second of silence).
    assert kinds[0] == "session.created" and "session.updated" in kinds and errors in (["input_audio_buffer_commit_empty"] * 2, ["input_audio_buffer_commit_empty"])
    updated = next(e for e in events if e.type == "session.updated")
    assert updated.session.audio.input.format.rate == 24000 and updated.session.audio.input.turn_detection.silence_duration_ms == 500
    completed = [e for e in events if e.type == "conversation.item.input_audio_transcription.completed"]
    # Our own protocol's finals on the same audio, sent at real-time pace too: the same words (pause
    # decodes started at other moments may differ in a full stop).
    theirs = [c.transcript for c in completed if c.transcript]
    assert len(theirs) == len(ours) and wer(" ".join(ours), " ".join(theirs)) <= 0.05, (ours, theirs)
    assert all(c.usage.seconds > 0 for c in completed)
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed"):
        assert kinds.count(kind) >= len(completed), kind
    deltas: dict[str, str] = defaultdict(str)
    for e in events:
        if e.type == "conversation.item.input_audio_transcription.delta":
            assert e.delta
            deltas[e.item_id] += e.delta
    assert deltas, "no delta before the completed transcripts"
    by_item = {c.item_id: c.transcript for c in completed}
    # Deltas only add: where the final text goes on from what they spelled, the last delta completes it.
    # (Where the final decode wrote a stable word differently, `.completed` carries the final text.)
    consistent = [item for item, text in deltas.items() if by_item.get(item, "").startswith(text)]
    assert all(deltas[item] == by_item[item] for item in consistent)
    assert len(consistent) * 2 >= len(completed), (dict(deltas), by_item)
    assert 'asr_dialect_sessions_total{dialect="openai"} 1.0' in metrics


def test_openai_clients_are_checked_against_the_servers_keys(whisper_runner):
    server = ServerThread(whisper_runner, access=AccessOptions(keys=parse_keys("agents:oa-secret"))).start()
    pcm, _ = read_pcm(str(FIXTURES / FIXTURE), rate=24000)
    try:
        with pytest.raises(Exception) as refused:
            asyncio.run(transcribe_with_sdk(server, pcm[: 48000], key="wrong"))
        assert "401" in str(refused.value)
        events = asyncio.run(transcribe_with_sdk(server, pcm, key="oa-secret"))

        async def browser_style() -> tuple[str | None, dict]:
            # Browsers cannot set headers: OpenAI's browser clients send the key as a subprotocol.
            import json

            import websockets

            url = f"{server.url}/v1/realtime?intent=transcription"
            async with websockets.connect(url, subprotocols=["realtime", "openai-insecure-api-key.oa-secret"]) as ws:
                return ws.subprotocol, json.loads(await ws.recv())

        subprotocol, first = asyncio.run(browser_style())
    finally:
        server.stop()
    assert any(e.type == "conversation.item.input_audio_transcription.completed" and e.transcript for e in events)
    assert subprotocol == "realtime" and first["type"] == "session.created"


def test_a_client_secret_carries_its_session_and_lets_a_browser_in_once(whisper_runner):
    """OpenAI's browser flow: a backend asks ``client.realtime.client_secrets.create`` for a
    short-lived key with the session's settings (here 8 kHz mu-law, as a phone bridge sends); the
    page offers it as ``openai-insecure-api-key.SECRET`` and streams without a session.update:
    the settings are the session's own. A secret is good once; settings the server cannot serve
    are refused when the secret is asked for."""
    import json

    import openai
    import websockets

    from ..harness import MANIFEST

    session = {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcmu"},
                                                            "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                                                            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}}
    mulaw = (FIXTURES / "espeak_8k.mulaw").read_bytes()
    server = ServerThread(whisper_runner, access=AccessOptions(keys=parse_keys("agents:oa-secret"))).start()
    try:
        client = AsyncOpenAI(api_key="oa-secret", base_url=f"{server.http}/v1")
        secret = asyncio.run(client.realtime.client_secrets.create(expires_after={"anchor": "created_at", "seconds": 30}, session=session))
        with pytest.raises(openai.BadRequestError) as unservable:
            asyncio.run(client.realtime.client_secrets.create(session={"type": "transcription", "audio": {"input": {"format": {"type": "audio/opus"}}}}))
        # What a secret holds until it is used or expires is its session, not whatever else its request carried.
        asyncio.run(client.realtime.client_secrets.create(session={**session, "notes": "x" * 15000}))
        held = server.call(lambda: sorted(len(p.settings or "") for p, _ in server.server.access._tokens.values()))

        async def page(value: str) -> tuple[str | None, list[dict]]:
            url = f"{server.url}/v1/realtime?intent=transcription"
            async with websockets.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{value}"]) as ws:
                events = [json.loads(await ws.recv())]
                for i in range(0, len(mulaw), 1600):
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(mulaw[i : i + 1600]).decode()}))
                for _ in range(2):  # the second, with nothing left to commit, is answered at once (commit_empty)
                    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                async with asyncio.timeout(90):
                    while True:
                        events.append(json.loads(await ws.recv()))
                        started = sum(e["type"] == "input_audio_buffer.speech_started" for e in events)
                        done = sum(e["type"] == "conversation.item.input_audio_transcription.completed" for e in events)
                        if any(e["type"] == "error" and e["error"]["code"] == "input_audio_buffer_commit_empty" for e in events) and started == done:
                            return ws.subprotocol, events

        subprotocol, events = asyncio.run(page(secret.value))
        with pytest.raises(websockets.exceptions.InvalidStatus) as spent:
            asyncio.run(page(secret.value))
    finally:
        server.stop()
    assert secret.expires_at > time.time() and secret.session.audio.input.format.type == "audio/pcmu"
    assert unservable.value.status_code == 400 and "audio/opus" in str(unservable.value)
    assert len(held) == 2 and held[0] == held[1] < 1000, held
    assert subprotocol == "realtime" and events[0]["type"] == "session.created"
    assert events[0]["session"]["audio"]["input"]["format"]["type"] == "audio/pcmu"
    text = " ".join(e["transcript"] for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert wer(" ".join(MANIFEST["espeak_8k.mulaw"]["references"][0]), text) <= 0.3, text
    assert spent.value.response.status_code == 401
