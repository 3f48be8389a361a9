"""A WebRTC test client (aiortc): plays a fixture as a live microphone track.

It does what a browser does: opens ``/v1/listen?encoding=webrtc``, waits for
``session``, sends its offer, applies the answer, then sends audio over RTP
in real time (48 kHz, 20 ms frames) while results come back on the socket.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
import websockets
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

RATE = 48000
FRAME = 960  # 20 ms


class ArrayTrack(MediaStreamTrack):
    """Mono float audio at 48 kHz sent as stereo s16 frames in real time.

    After the audio: silence for ``tail_s`` seconds (like a live microphone),
    then the track ends (``end_after_audio``) or keeps sending silence.
    """

    kind = "audio"

    def __init__(self, audio: np.ndarray, *, tail_s: float = 1.5, end_after_audio: bool = False) -> None:
        """``audio``: mono ``(n,)`` or stereo ``(2, n)`` float at 48 kHz (mono is sent on both channels)."""
        super().__init__()
        stereo = audio if audio.ndim == 2 else np.stack([audio, audio])
        pcm = np.clip(stereo.T * 32767, -32768, 32767).astype(np.int16)  # (n, 2)
        self._pcm = np.concatenate([pcm, np.zeros((int(tail_s * RATE), 2), np.int16)])
        self._end = end_after_audio
        self._pos = 0
        self._start: float | None = None
        self.sent_s = 0.0

    @property
    def started_at(self) -> float | None:
        return self._start

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        if self._pos >= len(self._pcm) and self._end:
            self.stop()
            raise MediaStreamError
        wait = self._start + self._pos / RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        block = self._pcm[self._pos:self._pos + FRAME]
        if len(block) < FRAME:
            block = np.zeros((FRAME, 2), np.int16)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(block).reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = RATE
        frame.pts = self._pos
        frame.time_base = fractions.Fraction(1, RATE)
        self._pos += FRAME
        self.sent_s = self._pos / RATE
        return frame


def to_48k(audio16k: np.ndarray) -> np.ndarray:
    """16 kHz mono ``(n,)`` or planar ``(channels, n)`` to 48 kHz, same shape."""
    if audio16k.ndim == 2:
        return np.stack([to_48k(row) for row in audio16k])
    frame = av.AudioFrame.from_ndarray(audio16k.astype(np.float32).reshape(1, -1), format="flt", layout="mono")
    frame.sample_rate = 16000
    swr = av.AudioResampler(format="flt", layout="mono", rate=RATE)
    parts = [f.to_ndarray().reshape(-1) for f in swr.resample(frame)] + [f.to_ndarray().reshape(-1) for f in swr.resample(None)]
    return np.concatenate(parts)


@dataclass
class RtcRun:
    messages: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each message
    close_code: int | None = None
    answer_at: float = 0.0
    audio_started_at: float | None = None  # monotonic time the track sent its first frame

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == kind]

    def final_text(self, channel: int = 0) -> str:
        return " ".join(m["text"] for m in self.of_type("final") if m["channel"] == channel and m["text"])


async def offer_sdp(pc: RTCPeerConnection) -> str:
    await pc.setLocalDescription(await pc.createOffer())
    return pc.localDescription.sdp


async def run_rtc(url: str, track: MediaStreamTrack | None, *, query: str = "encoding=webrtc",
                  how_to_end: str = "close", after_s: float | None = None, timeout_s: float = 120.0) -> RtcRun:
    """Stream ``track``; end by ``how_to_end`` once ``after_s`` seconds were sent (default: the whole track).

    ``close``: send {"type": "close"} and read to the end; ``pc_close``: close the peer
    connection and keep reading; ``track_end``: stop the sender (RTCP BYE, as when a
    transceiver is stopped) and keep reading; ``ws_close``: drop the WebSocket.
    """
    run = RtcRun()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        async with websockets.connect(f"{url}/v1/listen?{query}", max_size=None) as ws:
            run.messages.append(json.loads(await ws.recv()))
            run.arrivals.append(time.monotonic())
            sender = None
            if track is not None:
                sender = pc.addTrack(track)
            else:
                pc.addTransceiver("audio", direction="sendonly")
            await ws.send(json.dumps({"type": "webrtc_offer", "sdp": await offer_sdp(pc)}))

            async def reader() -> None:
                try:
                    async for raw in ws:
                        message = json.loads(raw)
                        run.messages.append(message)
                        run.arrivals.append(time.monotonic())
                        if message["type"] == "webrtc_answer":
                            await pc.setRemoteDescription(RTCSessionDescription(sdp=message["sdp"], type="answer"))
                            run.answer_at = time.monotonic()
                except websockets.ConnectionClosed:
                    pass
                run.close_code = ws.close_code

            reading = asyncio.ensure_future(reader())
            length = getattr(track, "_pcm", np.zeros((0, 2))).shape[0] / RATE
            until = after_s if after_s is not None else length
            deadline = time.monotonic() + timeout_s
            while not reading.done() and getattr(track, "sent_s", 0.0) < until and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if not reading.done():
                if how_to_end == "close":
                    await ws.send(json.dumps({"type": "close"}))
                elif how_to_end == "pc_close":
                    await pc.close()
                elif how_to_end == "track_end" and sender is not None:
                    await sender.stop()
                elif how_to_end == "ws_close":
                    await ws.close()
            await asyncio.wait_for(reading, timeout_s)
    finally:
        await pc.close()
    run.audio_started_at = getattr(track, "started_at", None)
    return run
