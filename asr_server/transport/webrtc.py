"""The WebRTC shell: one aiortc peer connection per ``encoding=webrtc`` session.

Signalling travels on the session's own WebSocket (``webrtc_offer`` in,
``webrtc_answer`` out), which also carries every result, so a session has one
identity, one ``seq`` and one place where it ends. This file only answers the
offer, reads the audio track and reports how the connection ends; the
:class:`~asr_server.transport.websocket.Connection` that owns it feeds the
audio to the same session core as WebSocket audio.

Nothing here waits without a bound: gathering, connecting and closing each
have their own timeout, because on a host whose only path is loopback ICE can
hang without ever reporting ``failed``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aioice.ice
import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.sdp import SessionDescription

from ..audio.decode import FrameConverter
from ..errors import AsrError, InvalidOffer, WebRtcFailed
from ..options import RtcOptions

__all__ = ["RtcIngest", "restrict_host_addresses", "check_offer", "GATHER_TIMEOUT_S", "MAX_REMOTE_CANDIDATES"]

log = logging.getLogger("asr_server.webrtc")

MAX_REMOTE_CANDIDATES = 64  # ICE candidates an offer may give (each gets connectivity checks)
UNPARSABLE = "the SDP offer could not be parsed, or offers no codec the server can decode (Opus, PCMU, PCMA)"
# Host candidates gather in milliseconds; STUN/TURN candidates need a round trip.
GATHER_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0

AudioSink = Callable[[np.ndarray], Awaitable[None]]
EndSink = Callable[[str, AsrError | None], Awaitable[None]]



# Restrictions in force, newest last (several servers may run in one process, as in tests).
_restrictions: list[list[str]] = []
_aioice_own: Callable[[bool, bool], list[str]] | None = None


def restrict_host_addresses(addresses: Iterable[str]) -> Callable[[], None]:
    """Offer only ``addresses`` as ICE host candidates; returns the function that undoes it.

    aioice has no per-connection setting for this, so it is process-wide
    while it lasts: the server applies it in ``start()`` and undoes it in
    ``stop()``; with several in force the newest applies, and aioice's own
    function is back once the last is undone, in any order. aioice never
    offers 127.0.0.1 by itself; naming it here is how a browser on the same
    machine with no other interface (or a test) can connect.
    """
    global _aioice_own
    chosen = list(addresses)
    if not chosen:
        return lambda: None
    if not _restrictions:
        _aioice_own = aioice.ice.get_host_addresses  # type: ignore[attr-defined]
        aioice.ice.get_host_addresses = _restricted  # type: ignore[attr-defined]
    _restrictions.append(chosen)

    def restore() -> None:
        if any(r is chosen for r in _restrictions):
            _restrictions[:] = [r for r in _restrictions if r is not chosen]
            if not _restrictions and _aioice_own is not None:
                aioice.ice.get_host_addresses = _aioice_own  # type: ignore[attr-defined]

    return restore


def _restricted(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    chosen = _restrictions[-1]
    return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]


def check_offer(offer_sdp: str) -> None:
    """Refuse, before aiortc sees it, an offer that cannot connect or would make the server a tool:
    unparsable; a media section with a DTLS role but no certificate fingerprint (aiortc answered it,
    then failed in its own task when it started DTLS, an assertion logged as an unretrieved task
    error, and the client waited for the connect timeout); more than ``MAX_REMOTE_CANDIDATES`` ICE
    candidates (the server sends connectivity checks to each: 1000 of them in one 60 KB offer made
    it send about 3000 UDP packets to 1000 addresses of the client's choosing). Raises :class:`InvalidOffer`."""
    try:
        media = SessionDescription.parse(offer_sdp).media
    except Exception:
        raise InvalidOffer(UNPARSABLE) from None
    if any(m.dtls is not None and not m.dtls.fingerprints for m in media):
        raise InvalidOffer("the offer has no DTLS certificate fingerprint (a=fingerprint), which WebRTC media needs")
    candidates = sum(len(m.ice_candidates) for m in media)
    if candidates > MAX_REMOTE_CANDIDATES:
        raise InvalidOffer(f"the offer has {candidates} ICE candidates; the server takes at most {MAX_REMOTE_CANDIDATES} (a browser gathers a handful)")


class RtcIngest:
    """Answer one offer, read its audio track, report the end once.

    ``on_audio`` gets 16 kHz planar float audio in arrival order. ``on_end``
    is called at most once: ``("track_ended", None)`` when the track ends or
    the peer closes the connection, ``("failed", WebRtcFailed)`` when the
    connection does not come up within ``connect_timeout_s`` or fails later.
    Nothing is reported after :meth:`close`.
    """

    def __init__(
        self,
        options: RtcOptions,
        channels: int,
        on_audio: AudioSink,
        on_end: EndSink,
        *,
        connect_timeout_s: float = 15.0,
        label: str = "",
    ) -> None:
        self.options = options
        self.channels = channels
        self.connect_timeout_s = connect_timeout_s
        self.label = label
        self._on_audio = on_audio
        self._on_end = on_end
        self.pc: RTCPeerConnection | None = None
        self.track: MediaStreamTrack | None = None
        self.frames = 0
        self.last_audio_at: float | None = None  # monotonic time of the last frame
        self._connected = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ended = False
        self._closed = False

    @property
    def state(self) -> str:
        return self.pc.connectionState if self.pc is not None else "new"

    async def answer(self, offer_sdp: str) -> str:
        """The answer's SDP, with every host (and STUN/TURN) candidate in it; raises :class:`InvalidOffer`."""
        try:
            check_offer(offer_sdp)
        except InvalidOffer as exc:
            log.info("session=%s event=bad_offer error=%r", self.label, exc.message)
            raise
        config = RTCConfiguration(iceServers=[
            RTCIceServer(urls=list(s.urls), username=s.username, credential=s.credential) for s in self.options.ice_servers
        ])
        pc = self.pc = RTCPeerConnection(config)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_state)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except Exception as exc:
            log.info("session=%s event=bad_offer error=%r", self.label, exc)
            raise InvalidOffer(UNPARSABLE) from None
        audio = [t for t in pc.getTransceivers() if t.kind == "audio"]
        if not audio:
            raise InvalidOffer("the offer has no audio track")
        for t in pc.getTransceivers():
            if t.kind != "audio" or t is not audio[0]:
                t.direction = "inactive"  # only one audio track is transcribed; nothing else is received
        try:
            answer = await pc.createAnswer()
            await asyncio.wait_for(pc.setLocalDescription(answer), GATHER_TIMEOUT_S)
        except TimeoutError:
            raise WebRtcFailed(f"gathering ICE candidates took longer than {GATHER_TIMEOUT_S:g} s (is a STUN/TURN server unreachable?)") from None
        except Exception as exc:
            log.info("session=%s event=bad_offer error=%r", self.label, exc)
            raise InvalidOffer("the server could not answer this offer (no common audio codec or transport)") from None
        self._spawn(self._watch_connect())
        return pc.localDescription.sdp

    async def close(self) -> None:
        """Stop reading, close the peer connection; idempotent, bounded in time."""
        if self._closed:
            return
        self._closed = True
        current = asyncio.current_task()
        others = [t for t in self._tasks if t is not current]
        for task in others:
            task.cancel()
        if others:
            await asyncio.gather(*others, return_exceptions=True)
        if self.track is not None:
            self.track.stop()
        if self.pc is not None:
            try:
                await asyncio.wait_for(self.pc.close(), CLOSE_TIMEOUT_S)
            except TimeoutError:
                log.warning("session=%s event=webrtc_close_timeout", self.label)
        self.pc = None
        self.track = None

    # -- aiortc callbacks --------------------------------------------------------------

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio" or self.track is not None:
            return
        self.track = track
        self._spawn(self._pump(track))

    def _on_state(self) -> None:
        state = self.state
        log.info("session=%s event=webrtc_state state=%s", self.label, state)
        if state == "connected":
            self._connected.set()
        elif state == "failed":
            self._spawn(self._end("failed", WebRtcFailed("the WebRTC connection failed (ICE or DTLS)")))
        elif state == "closed":
            self._spawn(self._end("track_ended", None))

    # -- tasks -----------------------------------------------------------------------

    async def _pump(self, track: MediaStreamTrack) -> None:
        converter = FrameConverter(self.channels)
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                break
            self.frames += 1
            self.last_audio_at = time.monotonic()
            planar = converter.convert(frame)  # type: ignore[arg-type]
            if planar.shape[1]:
                await self._on_audio(planar)
        await self._end("track_ended", None)

    async def _watch_connect(self) -> None:
        try:
            await asyncio.wait_for(self._connected.wait(), self.connect_timeout_s)
        except TimeoutError:
            await self._end("failed", WebRtcFailed(
                f"the WebRTC connection did not come up within {self.connect_timeout_s:g} s; "
                "UDP between client and server may be blocked (a TURN server helps)"
            ))

    async def _end(self, reason: str, error: AsrError | None) -> None:
        if self._ended or self._closed:
            return
        self._ended = True
        log.info("session=%s event=webrtc_end reason=%s frames=%d", self.label, reason, self.frames)
        await self._on_end(reason, error)

    def _spawn(self, coro: Any) -> None:
        if self._closed:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
