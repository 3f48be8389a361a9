"""Frozen option objects, parsed and validated once at the boundary.

:class:`StreamOptions` comes from the ``/v1/listen`` query string,
:class:`Limits` and :class:`ServerOptions` from the command line. Everything
below the transport receives these objects and never re-validates.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

from .errors import InvalidOption, UnsupportedLanguage

__all__ = [
    "RAW_ENCODINGS",
    "CONTAINER_ENCODINGS",
    "ENCODINGS",
    "StreamOptions",
    "Limits",
    "FRAMES_READ_AHEAD",
    "ServerOptions",
    "IceServer",
    "RtcOptions",
    "parse_stream_options",
    "parse_prompt",
    "whole_number",
]

RAW_ENCODINGS = ("pcm_s16le", "pcm_f32le", "mulaw", "alaw")
CONTAINER_ENCODINGS = ("ogg", "webm", "wav", "mp3", "flac", "auto")  # auto: the container is found from its bytes
# Audio arrives over a WebRTC peer connection negotiated on the WebSocket.
WEBRTC = "webrtc"
ENCODINGS = RAW_ENCODINGS + CONTAINER_ENCODINGS + (WEBRTC,)
# A WebRTC audio track is decoded to stereo at most.
MAX_WEBRTC_CHANNELS = 2

MIN_RATE, MAX_RATE = 8000, 48000
MAX_CHANNELS = 8


@dataclass(frozen=True)
class StreamOptions:
    """What one client asked for. Defaults are the documented ones."""

    encoding: str = "pcm_s16le"
    # For raw encodings, the rate of the bytes; for containers, None (the
    # container says, and its own rate wins).
    sample_rate: int | None = 16000
    channels: int = 1
    language: str = "en"
    interim_results: bool = True
    interim_ms: int = 500
    endpoint_ms: int = 500
    max_utterance_s: float = 20.0
    word_timestamps: bool = True
    # Share of model time when streams compete: interactive 4, standard 2, batch 1.
    priority: str = "interactive"
    # Second pass: recent finals decoded again together, sent as revisions where they differ.
    revisions: bool = True
    # Words the audio is likely to hold (names, jargon), given to the model ahead of each decode.
    prompt: str = ""
    # Once the talking has run this long (s; across splits and short pauses), an utterance ends
    # where an interim hears a sentence end and the next sentence begin, instead of at the next
    # pause the endpoint sees. 0: never.
    split_after_s: float = 3.0
    # While the server has sent nothing for this long (s), it sends a `heartbeat` message, so
    # a client that cannot see WebSocket pings (a browser) can tell a dead connection from a
    # quiet one. 0: never.
    heartbeat_s: float = 0.0

    @property
    def is_container(self) -> bool:
        return self.encoding in CONTAINER_ENCODINGS

    @property
    def is_webrtc(self) -> bool:
        return self.encoding == WEBRTC

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


FRAMES_READ_AHEAD = 4  # frames a connection reads before the session takes them (then the socket is not read)


@dataclass(frozen=True)
class Limits:
    """Server-wide bounds applied to every session (reported in ``session``)."""

    max_frame_bytes: int = 1 << 20
    idle_timeout_s: float = 10.0
    # Utterances waiting for their final decode, per channel, before the
    # server stops reading audio from the client (backpressure).
    max_pending_finals: int = 4
    # Bytes of compressed input buffered ahead of the container decoder.
    max_container_buffer_bytes: int = 4 << 20
    # Channels transcribed at once across all sessions; a stream that would go
    # past it is refused at connect (overloaded, 1013). 0: no limit.
    max_channels: int = 0
    # Seconds a result may wait to be written to a client that does not read
    # before the connection is closed (results_not_read).
    send_timeout_s: float = 30.0
    # WebRTC: seconds for ICE and DTLS to connect after the answer (webrtc_failed).
    webrtc_connect_timeout_s: float = 15.0
    # WebRTC audio cannot be slowed down: while finals are owed (backpressure) it
    # waits in a buffer of at most this many seconds, then audio_overrun.
    max_live_backlog_s: float = 30.0
    # Our own WebSocket keepalive: a ping every interval; a client whose pong is
    # missing for the timeout while the server was reading (never while it held
    # back reading for backpressure) is cut off (results_not_read). 0: no pings.
    keepalive_interval_s: float = 20.0
    keepalive_timeout_s: float = 20.0
    # After the client's close, the context pass may take this long to refine the
    # last finals; then `closed` is sent with what it has.
    context_close_s: float = 10.0
    # A connection that drops without `close` leaves its session held this long for
    # the client to resume (`?resume=TOKEN&last_seq=N`). 0: sessions end with their connection.
    resume_ttl_s: float = 30.0
    # Messages kept per session for a resume to replay and for its followers (oldest dropped past this many bytes).
    max_replay_bytes: int = 2 << 20
    # The messages a session's whole transcript is built from (its finals, revisions and settled
    # messages; no interims), kept apart for GET .../transcript and the webhook's. Continuous reading
    # sends 0.6 KB of them a second (0.9 KB of messages in all), so 8 MiB is about four hours (the
    # replay log's 2 MiB, 40 minutes); past it the oldest go and the transcript says ``truncated``.
    max_transcript_bytes: int = 8 << 20
    # An ended session's messages stay readable by followers this long (0: not kept).
    ended_session_ttl_s: float = 300.0

    @property
    def resumable(self) -> bool:
        return self.resume_ttl_s > 0

    @property
    def read_ahead_bytes(self) -> int:
        """What a stream's connection may hold of frames it read but the session has not taken (while
        it holds back reading for backpressure): ``FRAMES_READ_AHEAD`` frames of up to twice
        ``max_frame_bytes`` (the most read, to answer ``frame_too_large``)."""
        return FRAMES_READ_AHEAD * 2 * self.max_frame_bytes

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class IceServer:
    """A STUN or TURN server, as a browser's ``RTCIceServer`` takes it."""

    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"urls": list(self.urls)}
        if self.username is not None:
            out["username"] = self.username
        if self.credential is not None:
            out["credential"] = self.credential
        return out


@dataclass(frozen=True)
class RtcOptions:
    """WebRTC ingest settings shared by every session.

    ``ice_servers`` are used by the server and sent to clients in the
    ``session`` message (none by default: host candidates only, which is what
    a browser on the same host or LAN needs). ``host_addresses``, when given,
    are the only addresses offered as host candidates (127.0.0.1 included,
    which is otherwise never offered).
    """

    ice_servers: tuple[IceServer, ...] = ()
    host_addresses: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {"ice_servers": [s.to_wire() for s in self.ice_servers]}


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8765
    model: str = "tiny.en"
    device: str = "cpu"
    compute_type: str = "default"
    cpu_threads: int = 0
    limits: Limits = field(default_factory=Limits)


def whole_number(raw: str) -> int | None:
    """``raw`` as a whole number when it is ASCII digits alone, at most 18 of them; else None.

    For a client's text where only a count of something is sensible: ``str.isdigit()`` also
    takes '\u00b2' and other digits ``int()`` refuses, and ``int()`` refuses more than 4300
    digits, each with a ``ValueError`` a check by ``isdigit()`` does not expect."""
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else None


def _int(name: str, raw: str, lo: int, hi: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise InvalidOption(f"{name} must be an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise InvalidOption(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def _float(name: str, raw: str, lo: float, hi: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise InvalidOption(f"{name} must be a number, got {raw!r}") from None
    if not lo <= value <= hi:  # also refuses NaN
        raise InvalidOption(f"{name} must be between {lo:g} and {hi:g}, got {raw}")
    return value


def _bool(name: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise InvalidOption(f"{name} must be true or false, got {raw!r}")


def _choice(name: str, raw: str, allowed: tuple[str, ...]) -> str:
    if raw not in allowed:
        raise InvalidOption(f"{name} must be one of {', '.join(allowed)}, got {raw!r}")
    return raw


_KNOWN = (
    "encoding",
    "sample_rate",
    "channels",
    "language",
    "interim_results",
    "interim_ms",
    "endpoint_ms",
    "max_utterance_s",
    "word_timestamps",
    "priority",
    "revisions",
    "prompt",
    "split_after_s",
    "heartbeat_s",
)
MAX_PROMPT_CHARS = 200
PRIORITIES = ("interactive", "standard", "batch")


def parse_stream_options(query: Mapping[str, list[str]], languages: Iterable[str]) -> StreamOptions:
    """Build :class:`StreamOptions` from a parsed query string.

    ``query`` is what :func:`urllib.parse.parse_qs` returns; ``languages`` are
    the codes the loaded model supports. Raises :class:`InvalidOption` or
    :class:`UnsupportedLanguage` naming the first bad parameter.
    """
    unknown = sorted(set(query) - set(_KNOWN))
    if unknown:
        raise InvalidOption(f"unknown option {unknown[0]!r}; known options: {', '.join(_KNOWN)}")
    single = _single_values(query)
    encoding = single.get("encoding", "pcm_s16le")
    if encoding not in ENCODINGS:
        raise InvalidOption(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    sample_rate: int | None
    if encoding in CONTAINER_ENCODINGS or encoding == WEBRTC:
        # The container (or the WebRTC codec) carries its own rate; a stated one is checked for range only.
        if "sample_rate" in single:
            _int("sample_rate", single["sample_rate"], MIN_RATE, MAX_RATE)
        sample_rate = None
    else:
        default_rate = 8000 if encoding in ("mulaw", "alaw") else 16000
        sample_rate = _int("sample_rate", single.get("sample_rate", str(default_rate)), MIN_RATE, MAX_RATE)

    language = single.get("language", "en").strip().lower()
    supported = set(languages)
    if language not in supported:
        listed = ", ".join(sorted(supported)[:12])
        raise UnsupportedLanguage(f"language {language!r} is not supported by this model (supported: {listed})")

    return StreamOptions(
        encoding=encoding,
        sample_rate=sample_rate,
        channels=_int("channels", single.get("channels", "1"), 1, MAX_WEBRTC_CHANNELS if encoding == WEBRTC else MAX_CHANNELS),
        language=language,
        interim_results=_bool("interim_results", single.get("interim_results", "true")),
        interim_ms=_int("interim_ms", single.get("interim_ms", "500"), 100, 10000),
        endpoint_ms=_int("endpoint_ms", single.get("endpoint_ms", "500"), 100, 5000),
        # Capped at 30 s: one Whisper window, so an utterance is never split inside the model.
        max_utterance_s=_float("max_utterance_s", single.get("max_utterance_s", "20"), 2.0, 30.0),
        word_timestamps=_bool("word_timestamps", single.get("word_timestamps", "true")),
        priority=_choice("priority", single.get("priority", "interactive"), PRIORITIES),
        revisions=_bool("revisions", single.get("revisions", "true")),
        prompt=parse_prompt(single.get("prompt", "")),
        split_after_s=_split_after(single.get("split_after_s", "3")),
        heartbeat_s=_zero_or_between("heartbeat_s", single.get("heartbeat_s", "0"), 1.0, 60.0),
    )


def _split_after(raw: str) -> float:
    return _zero_or_between("split_after_s", raw, 1.0, 30.0)


def _zero_or_between(name: str, raw: str, lo: float, hi: float) -> float:
    value = _float(name, raw, 0.0, hi)
    if 0 < value < lo:
        raise InvalidOption(f"{name} must be 0 (never) or from {lo:g} to {hi:g}, got {raw!r}")
    return value


def _single_values(query: Mapping[str, list[str]]) -> dict[str, str]:
    for name, values in query.items():
        if len(values) != 1:
            raise InvalidOption(f"option {name!r} given {len(values)} times")
    return {name: values[0] for name, values in query.items()}


def parse_prompt(raw: str) -> str:
    """A vocabulary prompt: one line of at most MAX_PROMPT_CHARS printable characters."""
    text = " ".join("".join(c if c.isprintable() else " " for c in raw).split())
    if len(text) > MAX_PROMPT_CHARS:
        raise InvalidOption(f"prompt must be at most {MAX_PROMPT_CHARS} characters, got {len(text)}")
    return text
