"""Every kind of session a server meets, for ``python tools/soak.py --mix``.

Each kind is ``async def kind(url) -> bool``: one session against the server
at ``url`` (``ws://host:port``), True when it ended as that kind of client
expects. Between them they touch each dialect (native, Deepgram, Twilio,
OpenAI Realtime), a container stream decoded in its own thread, a follower,
a resumed session, bad input, a refusal and connections dropped without a
close: what the server holds for a session and must let go of afterwards.
WebRTC is left out (its client needs aiortc's own event loop work and UDP;
tests/e2e/test_webrtc.py covers its teardown).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import websockets

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "audio_fixtures"
LIMIT_S = 120.0  # a session that takes longer than this is a failure (the server stalled)


class Audio:
    """The few seconds of real recordings the kinds send, read once."""

    def __init__(self, seconds: float = 2.0) -> None:
        from asr_client import read_pcm
        from tests.audio_fixtures.make_fixtures import g711

        pcm16, _ = read_pcm(str(FIXTURES / "librivox_16k.wav"))
        self.pcm16 = pcm16[: int(seconds * 16000) * 2]
        pcm24, _ = read_pcm(str(FIXTURES / "cards_16k.wav"), rate=24000)
        self.pcm24 = pcm24[: int(seconds * 24000) * 2]
        self.mp3 = (FIXTURES / "librivox.mp3").read_bytes()[: int(seconds * 8000)]  # about 64 kbit/s
        call = np.frombuffer((FIXTURES / "call_8k_stereo.s16le").read_bytes(), "<i2").reshape(-1, 2)[: int(seconds * 8000)] / 32768
        self.caller, self.agent = g711(call[:, 1], "pcm_mulaw"), g711(call[:, 0], "pcm_mulaw")


async def _until(ws, *types: str) -> dict | None:
    """Read JSON messages until one of ``types`` (returned), or the connection closes (None)."""
    try:
        async for raw in ws:
            if isinstance(raw, str) and (message := json.loads(raw)).get("type") in types:
                return message
    except websockets.ConnectionClosed:
        pass
    return None


async def _read_to_end(ws) -> None:
    try:
        async for _ in ws:
            pass
    except websockets.ConnectionClosed:
        pass


def kinds(audio: Audio) -> list[Callable[[str], Awaitable[bool]]]:
    """The session kinds, each sending ``audio``."""

    async def native(url: str) -> bool:
        async with websockets.connect(f"{url}/v1/listen?encoding=pcm_s16le&sample_rate=16000") as ws:
            await ws.send(audio.pcm16)
            await ws.send('{"type": "close"}')
            return await _until(ws, "closed") is not None

    async def container(url: str) -> bool:
        async with websockets.connect(f"{url}/v1/listen?encoding=mp3") as ws:
            for at in range(0, len(audio.mp3), 4000):
                await ws.send(audio.mp3[at : at + 4000])
            await ws.send('{"type": "close"}')
            return await _until(ws, "closed") is not None

    async def deepgram(url: str) -> bool:
        query = "model=nova-2&encoding=linear16&sample_rate=16000&interim_results=true"
        async with websockets.connect(f"{url}/v1/listen?{query}", additional_headers={"Authorization": "Token soak"}) as ws:
            await ws.send(audio.pcm16)
            await ws.send('{"type": "CloseStream"}')
            await _read_to_end(ws)
            return ws.close_code == 1000

    async def twilio(url: str) -> bool:
        async with websockets.connect(f"{url}/v1/twilio") as ws:
            await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
            await ws.send(json.dumps({"event": "start", "start": {
                "streamSid": "MZsoak", "callSid": "CAsoak", "accountSid": "ACsoak", "tracks": ["inbound", "outbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}))
            for chunk, at in enumerate(range(0, len(audio.caller), 160)):
                for track, leg in (("inbound", audio.caller), ("outbound", audio.agent)):
                    payload = base64.b64encode(leg[at : at + 160]).decode()
                    await ws.send(json.dumps({"event": "media", "media": {"track": track, "chunk": str(chunk), "timestamp": str(chunk * 20), "payload": payload}}))
            await ws.send(json.dumps({"event": "stop"}))
            await _read_to_end(ws)
            return ws.close_code == 1000

    async def openai(url: str) -> bool:
        """Appends, commits and leaves without a word, as a page that is closed does."""
        async with websockets.connect(f"{url}/v1/realtime?intent=transcription") as ws:
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription",
                                      "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}}}))
            for at in range(0, len(audio.pcm24), 4800):
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio.pcm24[at : at + 4800]).decode()}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        return True

    async def followed(url: str) -> bool:
        async with websockets.connect(f"{url}/v1/listen?encoding=pcm_s16le&sample_rate=16000") as ws:
            session_id = json.loads(await ws.recv())["session_id"]
            async with websockets.connect(f"{url}/v1/sessions/{session_id}/events") as follower:
                await ws.send(audio.pcm16)
                await ws.send('{"type": "close"}')
                ended = await _until(ws, "closed")
                return ended is not None and await _until(follower, "closed") is not None

    async def resumed(url: str) -> bool:
        """Drops its connection after half the audio (no close frame), resumes, sends the rest."""
        ws = await websockets.connect(f"{url}/v1/listen?encoding=pcm_s16le&sample_rate=16000")
        session = json.loads(await ws.recv())
        half = len(audio.pcm16) // 4 * 2
        await ws.send(audio.pcm16[:half])
        ws.transport.abort()
        async with websockets.connect(f"{url}/v1/listen?resume={session['resume_token']}&last_seq={session['seq']}") as again:
            answer = await _until(again, "resumed", "error")
            if answer is None or answer["type"] != "resumed":
                return False
            await again.send(audio.pcm16[answer["audio_received_bytes"] :])
            await again.send('{"type": "close"}')
            return await _until(again, "closed") is not None

    async def bad_input(url: str) -> bool:
        """Garbage, an odd byte of audio, then a proper close: an error, and the session goes on."""
        async with websockets.connect(f"{url}/v1/listen?encoding=pcm_s16le&sample_rate=16000") as ws:
            await ws.send("{not json")
            await ws.send(audio.pcm16[:3])
            await ws.send('{"type": "close"}')
            return await _until(ws, "closed") is not None

    async def refused(url: str) -> bool:
        async with websockets.connect(f"{url}/v1/listen?encoding=nonsense") as ws:
            error = await _until(ws, "error")
            return error is not None and error["code"] == "invalid_option"

    async def abandoned(url: str) -> bool:
        """Sends half its audio and closes the connection, with no close message."""
        async with websockets.connect(f"{url}/v1/listen?encoding=pcm_s16le&sample_rate=16000") as ws:
            await ws.send(audio.pcm16[: len(audio.pcm16) // 4 * 2])
        return True

    return [native, container, deepgram, twilio, openai, followed, resumed, bad_input, refused, abandoned]


async def run_kind(kind: Callable[[str], Awaitable[bool]], url: str) -> bool:
    """One session of ``kind``; False on an exception or after ``LIMIT_S``."""
    try:
        async with asyncio.timeout(LIMIT_S):
            return await kind(url)
    except (OSError, TimeoutError, websockets.WebSocketException, json.JSONDecodeError, KeyError):
        return False
