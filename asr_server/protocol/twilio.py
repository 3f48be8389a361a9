"""Twilio Media Streams (``/v1/twilio``), translated into a session of ours.

Twilio's ``<Stream>`` sends JSON events on a WebSocket: ``connected``,
``start`` (the call's ids, its ``tracks``, ``customParameters`` and the
``mediaFormat``, 8 kHz mu-law mono), ``media`` (a track's 20 ms of base64
mu-law, with its ``timestamp`` in milliseconds since the stream began),
``mark``, ``dtmf`` and ``stop``. :class:`TwilioDialect` makes the ``start``
into stream options (one channel per track: inbound, the caller, is
channel 0; outbound, the agent, channel 1) and the media into interleaved
mu-law frames of both tracks on one clock (:class:`TrackAligner`). Nothing is
ever sent back to Twilio: results go to the session's followers
(``/v1/sessions/{id}/events``). No I/O here.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, replace
from typing import Any

from ..errors import AsrError, AudioFormatMismatch, InvalidMessage
from ..options import StreamOptions, parse_stream_options
from .client_json import read_json
from .openai_realtime import Reconfigure

__all__ = ["TwilioDialect", "TrackAligner", "TWILIO_PATH", "TRACKS", "twilio_options"]

TWILIO_PATH = "/v1/twilio"
TRACKS = ("inbound", "outbound")  # channel 0: the caller; channel 1: the agent
RATE = 8000
SILENCE = 0xFF  # mu-law zero
MAX_SKEW_MS = 1000  # a track further behind than this is filled with silence so the other flows
# A timestamp further than this from where its track stands is taken as a clock that jumped, not
# as a gap to fill with silence or audio already held: a client's 10**12 ms asked for terabytes.
MAX_JUMP_MS = 10_000
# customParameters that are stream options of ours.
_OPTIONS = ("interim_results", "interim_ms", "endpoint_ms", "language", "priority", "revisions", "prompt", "max_utterance_s", "word_timestamps", "split_after_s")


def twilio_options(channels: int = 2) -> StreamOptions:
    return StreamOptions(encoding="mulaw", sample_rate=RATE, channels=channels)


class TrackAligner:
    """Each track's mu-law placed by Twilio's timestamps, handed out interleaved as far as every track goes.

    A gap in a track (a timestamp past where it stands) is filled with silence;
    audio before where it stands (a repeat) is dropped. A track that falls more
    than ``max_skew_ms`` behind another is filled with silence up to it. A
    timestamp more than ``max_jump_ms`` either way from where its track stands
    moves that track's clock instead: its audio goes on where the track stands."""

    def __init__(self, tracks: int, max_skew_ms: int = MAX_SKEW_MS, max_jump_ms: int = MAX_JUMP_MS) -> None:
        self._pending = [bytearray() for _ in range(tracks)]
        self._position = [0] * tracks  # samples placed per track (sent or pending)
        self._shift = [0] * tracks  # samples added to a track's timestamps since its clock jumped
        self._max_skew = max_skew_ms * RATE // 1000
        self._max_jump = max_jump_ms * RATE // 1000

    def add(self, track: int, timestamp_ms: int, payload: bytes) -> bytes:
        at = timestamp_ms * RATE // 1000 + self._shift[track]
        if abs(at - self._position[track]) > self._max_jump:
            self._shift[track] += self._position[track] - at
            at = self._position[track]
        gap = at - self._position[track]
        if gap > 0:
            self._pending[track] += bytes([SILENCE]) * gap
        elif gap < 0:
            payload = payload[-gap:]
        self._pending[track] += payload
        self._position[track] = max(self._position[track], at) + len(payload)
        return self._ready()

    def flush(self) -> bytes:
        """The end: every track padded with silence to the longest."""
        longest = max(self._position)
        for track, position in enumerate(self._position):
            self._pending[track] += bytes([SILENCE]) * (longest - position)
            self._position[track] = longest
        return self._ready()

    def _ready(self) -> bytes:
        lead = max(self._position)
        for track, position in enumerate(self._position):
            if lead - position > self._max_skew:
                fill = lead - self._max_skew - position
                self._pending[track] += bytes([SILENCE]) * fill
                self._position[track] += fill
        n = min(len(p) for p in self._pending)
        if n == 0:
            return b""
        if len(self._pending) == 1:
            out = bytes(self._pending[0][:n])
        else:
            interleaved = bytearray(n * len(self._pending))
            for track, pending in enumerate(self._pending):
                interleaved[track :: len(self._pending)] = pending[:n]
            out = bytes(interleaved)
        for pending in self._pending:
            del pending[:n]
        return out


@dataclass(frozen=True)
class CallInfo:
    stream_sid: str
    call_sid: str
    account_sid: str
    tracks: tuple[str, ...]
    custom_parameters: dict[str, str]

    def to_wire(self) -> dict[str, Any]:
        return {"stream_sid": self.stream_sid, "call_sid": self.call_sid, "account_sid": self.account_sid,
                "tracks": list(self.tracks), "channel_names": ["caller" if t == "inbound" else "agent" for t in self.tracks],
                "custom_parameters": self.custom_parameters}


def _rate(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's 1e999 is an infinite float
        return None


class TwilioDialect:
    """One media stream: Twilio's events in, nothing out (results go to the session's followers)."""

    name = "twilio"

    def __init__(self, options: StreamOptions, languages: tuple[str, ...], query: dict[str, list[str]] | None = None) -> None:
        self.options = options
        self.languages = languages
        self.query = query or {}
        self.call: CallInfo | None = None
        self._tracks: tuple[str, ...] = ()
        self._aligner: TrackAligner | None = None
        self.stopped = False

    def incoming(self, text: str) -> list[Any]:
        try:
            event = read_json(text)
        except ValueError:
            return [text]  # our parser reports it (logged and on the followers' channel)
        kind = event.get("event") if isinstance(event, dict) else None
        if kind in ("start", "media"):
            body = event.get(kind) or {}
            if not isinstance(body, dict):
                return [InvalidMessage(f"a {kind} event's {kind!r} must be an object")]
            return self._start(body) if kind == "start" else self._media(body)
        if kind == "stop":
            self.stopped = True
            tail = self._aligner.flush() if self._aligner is not None else b""
            return ([tail] if tail else []) + ['{"type": "close"}']
        return []  # connected, mark, dtmf: nothing for the transcript

    def _start(self, start: dict[str, Any]) -> list[Any]:
        listed, fmt, given = start.get("tracks") or ["inbound"], start.get("mediaFormat") or {}, start.get("customParameters") or {}
        if not (isinstance(listed, list) and isinstance(fmt, dict) and isinstance(given, dict)):
            return [InvalidMessage("a start event's tracks must be a list, its mediaFormat and customParameters objects")]
        tracks = tuple(t for t in TRACKS if t in listed)
        if fmt and (fmt.get("encoding") != "audio/x-mulaw" or _rate(fmt.get("sampleRate", RATE)) != RATE):
            return [AudioFormatMismatch(f"Twilio media must be audio/x-mulaw at 8000 Hz, got {fmt.get('encoding')} at {fmt.get('sampleRate')}")]
        custom = {str(k): str(v) for k, v in given.items()}
        self.call = CallInfo(str(start.get("streamSid", "")), str(start.get("callSid", "")), str(start.get("accountSid", "")), tracks, custom)
        self._tracks = tracks or ("inbound",)
        self._aligner = TrackAligner(len(self._tracks))
        try:
            options = self._options(custom)
        except AsrError as error:
            return [error]
        self.options = options
        return [Reconfigure(options, announce=True, info={"call": self.call.to_wire()})]

    def _options(self, custom: dict[str, str]) -> StreamOptions:
        given = {name: [value] for name, value in custom.items() if name in _OPTIONS}
        given.update({name: values for name, values in self.query.items() if name in _OPTIONS})
        parsed = parse_stream_options({**given, "encoding": ["mulaw"], "sample_rate": [str(RATE)], "channels": [str(len(self._tracks))]},
                                      self.languages)
        return replace(parsed, channels=len(self._tracks))

    def _media(self, media: dict[str, Any]) -> list[Any]:
        if self._aligner is None:
            return []  # media before start: Twilio never does this
        track = media.get("track", "inbound")
        if track not in self._tracks:
            return []
        try:
            payload = base64.b64decode(media.get("payload", ""), validate=True)
            timestamp = int(media.get("timestamp", 0))
        except (binascii.Error, ValueError, TypeError, OverflowError):
            return [InvalidMessage("a media event's payload must be base64 and its timestamp an integer")]
        audio = self._aligner.add(self._tracks.index(track), timestamp, payload)
        return [audio] if audio else []

    def incoming_binary(self, data: bytes) -> list[Any]:
        """Twilio's audio travels base64 in media events: a binary frame is an error (on the
        followers' channel), and is not taken as audio."""
        return [InvalidMessage(f"a binary frame ({len(data)} bytes) is not a Twilio media stream event; audio comes in media events")]

    def outgoing(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        return []  # Twilio shows nothing: a bidirectional stream must only ever get audio, and we send none
