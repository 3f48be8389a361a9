"""End to end: Deepgram's own Python SDK (deepgram-sdk, pinned in the test extras), pointed at
this server, streams a fixture at real-time pace and gets Deepgram's messages: interim and
final Results with word confidences from the model, SpeechStarted, UtteranceEnd, a Finalize
honoured, Metadata at the close. Our own protocol keeps working at the same path."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from deepgram import AsyncDeepgramClient
from deepgram.core.api_error import ApiError
from deepgram.environment import DeepgramClientEnvironment
from deepgram.listen.v1.types import ListenV1Metadata, ListenV1Results, ListenV1SpeechStarted, ListenV1UtteranceEnd

from asr_server.access import AccessOptions, parse_keys

from ..harness import FIXTURES, MANIFEST, ServerThread, replay
from ..wer import wer

pytestmark = pytest.mark.e2e

FIXTURE = "cards_16k.wav"


def deepgram_client(server: ServerThread, key: str | None, access_token: str | None = None) -> AsyncDeepgramClient:
    environment = DeepgramClientEnvironment(base=server.http, production=server.url, agent=server.url, agent_rest=server.http)
    if access_token is not None:
        return AsyncDeepgramClient(access_token=access_token, environment=environment)
    return AsyncDeepgramClient(api_key=key, environment=environment)


async def stream_with_sdk(
    server: ServerThread, key: str = "any-key", finalize_after_s: float | None = None, access_token: str | None = None,
) -> list[Any]:
    """The fixture's PCM at real-time pace through the SDK; every message it parsed."""
    from asr_client import read_pcm

    pcm, _ = read_pcm(str(FIXTURES / FIXTURE))
    got: list[Any] = []
    async with deepgram_client(server, key, access_token).listen.v1.connect(
        model="nova-3", encoding="linear16", sample_rate=16000, channels=1, interim_results="true",
        utterance_end_ms=1000, vad_events="true", punctuate="true", endpointing=500,
    ) as socket:
        async def receive() -> None:
            async for message in socket:
                got.append(message)

        receiver = asyncio.create_task(receive())
        start, chunk = time.monotonic(), 3200  # 100 ms
        finalized = False
        for i in range(0, len(pcm), chunk):
            await asyncio.sleep(max(0.0, start + i / 32000 - time.monotonic()))  # real-time pace, not synchronisation
            await socket.send_media(pcm[i : i + chunk])
            if finalize_after_s is not None and not finalized and i / 32000 >= finalize_after_s:
                await socket.send_finalize()
                finalized = True
        await socket.send_close_stream()
        await asyncio.wait_for(receiver, 60)
    return got


def test_deepgrams_sdk_streams_and_gets_interim_and_final_results(whisper_runner):
    spans = MANIFEST[FIXTURE]["spans"][0]
    server = ServerThread(whisper_runner).start()
    try:
        # Finalize in the middle of the second sentence: what was said so far is final at once.
        middle = (spans[1][0] + spans[1][1]) / 2
        got = asyncio.run(stream_with_sdk(server, finalize_after_s=middle))
        native = asyncio.run(replay(server.url, FIXTURE))
        metrics = server.server.metrics.render().decode()
    finally:
        server.stop()
    results = [m for m in got if isinstance(m, ListenV1Results)]
    interims = [r for r in results if not r.is_final]
    finals = [r for r in results if r.is_final]
    assert interims and finals
    assert any(isinstance(m, ListenV1SpeechStarted) for m in got)
    assert any(isinstance(m, ListenV1UtteranceEnd) for m in got)
    assert isinstance(got[-1], ListenV1Metadata) and got[-1].duration >= spans[-1][1] and got[-1].channels == 1
    assert any(r.from_finalize for r in finals)
    assert any(r.speech_final for r in finals)
    for r in finals:
        alternative = r.channel.alternatives[0]
        assert alternative.words and r.channel_index == [0, 1] and r.duration > 0
        assert all(0 < w.confidence <= 1 and w.start <= w.end and w.punctuated_word for w in alternative.words)
        assert 0 < alternative.confidence <= 1
    confidences = {round(w.confidence, 4) for r in finals for w in r.channel.alternatives[0].words}
    assert len(confidences) > 1  # the model's word probabilities, not a constant
    text = " ".join(r.channel.alternatives[0].transcript for r in finals)
    reference = " ".join(MANIFEST[FIXTURE]["references"][0])
    assert wer(reference, text) <= wer(reference, native.final_text()) + 0.1, text
    assert 'asr_dialect_sessions_total{dialect="deepgram"} 1.0' in metrics
    assert 'asr_dialect_sessions_total{dialect="native"} 1.0' in metrics


def test_deepgram_clients_are_checked_against_the_servers_keys(whisper_runner):
    server = ServerThread(whisper_runner, access=AccessOptions(keys=parse_keys("agents:dg-secret"))).start()
    try:
        async def refused() -> int:
            with pytest.raises(ApiError) as error:
                async with deepgram_client(server, "wrong").listen.v1.connect(model="nova-3", encoding="linear16", sample_rate=16000):
                    pass
            return error.value.status_code

        assert asyncio.run(refused()) == 401
        got = asyncio.run(stream_with_sdk(server, key="dg-secret"))
    finally:
        server.stop()
    assert any(isinstance(m, ListenV1Results) and m.is_final for m in got)


async def stream_with_subprotocols(server: ServerThread, subprotocols: list[str]) -> tuple[str | None, list[dict]]:
    """What a browser page written for Deepgram does: ``new WebSocket(url, ["token", KEY])``, no
    query, the recording's bytes as they are (a container), then CloseStream. (The answered
    subprotocol, every message.)"""
    import json

    from websockets.asyncio.client import connect

    data = (FIXTURES / FIXTURE).read_bytes()
    async with connect(server.url + "/v1/listen", subprotocols=subprotocols) as ws:  # type: ignore[arg-type]
        for i in range(0, len(data), 32000):
            await ws.send(data[i : i + 32000])
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = [json.loads(m) async for m in ws]
    return ws.subprotocol, messages


def test_deepgram_temporary_tokens_and_a_browsers_subprotocol_credentials(whisper_runner):
    """Deepgram's browser flow: a backend asks POST /v1/auth/grant (the SDK's
    ``auth.v1.tokens.grant``, a JSON body) for a short-lived token; the SDK streams with it as
    ``access_token`` (``Authorization: bearer``); a page puts a key or token in the WebSocket's
    subprotocols, and Chromium needs one answered. A token is good once."""
    from websockets.exceptions import InvalidStatus

    server = ServerThread(whisper_runner, access=AccessOptions(keys=parse_keys("agents:dg-secret"))).start()
    try:
        async def grant(key: str, **asked: float) -> Any:
            return await deepgram_client(server, key).auth.v1.tokens.grant(**asked)

        granted = asyncio.run(grant("dg-secret", ttl_seconds=20))
        assert granted.expires_in == 20 and granted.access_token and "dg-secret" not in granted.access_token
        assert asyncio.run(grant("dg-secret")).expires_in == 60  # the SDK's body without a life: the server's
        with pytest.raises(ApiError) as refused:
            asyncio.run(grant("wrong"))
        assert refused.value.status_code == 401
        got = asyncio.run(stream_with_sdk(server, access_token=granted.access_token))

        async def used_up() -> int:
            with pytest.raises(ApiError) as error:
                async with deepgram_client(server, None, granted.access_token).listen.v1.connect(model="nova-3", encoding="linear16", sample_rate=16000):
                    pass
            return error.value.status_code

        assert asyncio.run(used_up()) == 401
        by_key = asyncio.run(stream_with_subprotocols(server, ["token", "dg-secret"]))
        by_token = asyncio.run(stream_with_subprotocols(server, ["bearer", asyncio.run(grant("dg-secret")).access_token]))
        with pytest.raises(InvalidStatus) as wrong:
            asyncio.run(stream_with_subprotocols(server, ["token", "wrong"]))
        metrics = server.server.metrics.render().decode()
    finally:
        server.stop()
    assert wrong.value.response.status_code == 401
    assert any(isinstance(m, ListenV1Results) and m.is_final for m in got)
    reference = " ".join(MANIFEST[FIXTURE]["references"][0])
    for (subprotocol, messages), scheme in ((by_key, "token"), (by_token, "bearer")):
        assert subprotocol == scheme  # the scheme answered, never the secret
        finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
        assert messages[-1]["type"] == "Metadata" and finals  # Deepgram's messages, not ours
        assert wer(reference, " ".join(m["channel"]["alternatives"][0]["transcript"] for m in finals)) <= 0.5
    assert 'asr_dialect_sessions_total{dialect="deepgram"} 3.0' in metrics
