"""Server messages as JSON-ready dicts, and client text frames as commands.

Every server message carries ``type``, ``session_id`` and ``seq`` (1, 2, 3 ...
with no gaps). :class:`MessageWriter` is the only place that assigns ``seq``.
docs/protocol.md describes each message; keep the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, assert_never

from ..errors import AsrError, InvalidMessage, UnknownMessageType, wire_info
from ..events import Final, Interim, Revision, Settled, SpeechStart
from ..inference.types import Word
from ..options import Limits, StreamOptions
from .client_json import read_json

__all__ = ["MessageWriter", "NativeDialect", "Finalize", "CloseStream", "KeepAlive", "WebRtcOffer", "ClientCommand", "parse_client_message", "MAX_SDP_CHARS"]

# An SDP offer for one audio track is a few kB; a browser's with every codec about 6 kB.
MAX_SDP_CHARS = 65536


class MessageWriter:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.seq = 0

    def _message(self, type_: str, body: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        return {"type": type_, "session_id": self.session_id, "seq": self.seq, **body}

    def session(
        self, options: StreamOptions, limits: Limits, model: str, webrtc: dict[str, Any] | None = None, key: str | None = None,
        resume_token: str | None = None, extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"config": options.to_wire(), "limits": limits.to_wire(), "model": model, **(extra or {})}
        if resume_token is not None:
            body["resume_token"] = resume_token  # ?resume=TOKEN&last_seq=N takes the session up again after a drop
        if key is not None:
            body["key"] = key  # the name of the API key it came in with, never the key
        if webrtc is not None:
            body["webrtc"] = webrtc
        return self._message("session", body)

    def webrtc_answer(self, sdp: str) -> dict[str, Any]:
        return self._message("webrtc_answer", {"sdp": sdp})

    def event(self, event: SpeechStart | Interim | Final | Revision | Settled) -> dict[str, Any]:
        match event:
            case SpeechStart():
                return self._message("speech_start", {"channel": event.channel, "utterance": event.utterance, "at": round(event.at, 3)})
            case Interim():
                return self._message(
                    "interim",
                    {
                        "channel": event.channel,
                        "utterance": event.utterance,
                        "offset": event.offset,
                        "text": event.text,
                        "stable": event.stable,
                        "start": event.start,
                        "end": event.end,
                    },
                )
            case Final():
                return self._message(
                    "final",
                    {
                        "channel": event.channel,
                        "utterance": event.utterance,
                        "offset": event.offset,
                        "text": event.text,
                        "start": event.start,
                        "end": event.end,
                        "reason": event.reason.value,
                        "words": _words(event.words),
                    },
                )
            case Revision():
                return self._message(
                    "revision",
                    {
                        "channel": event.channel,
                        "utterances": [event.first, event.last],
                        "changed": list(event.changed),
                        "pass": event.pass_name,
                        "offset": event.offset,
                        "text": event.text,
                        "words": _words(event.words),
                        "segments": [{"utterance": u.utterance, "offset": u.offset, "start": u.start, "end": u.end} for u in event.segments],
                    },
                )
            case Settled():
                return self._message("settled", {"channel": event.channel, "utterance": event.utterance, "offset": event.offset})
            case _:
                assert_never(event)

    def error(self, error: AsrError, *, channel: int | None = None, utterance: int | None = None) -> dict[str, Any]:
        """``channel``/``utterance``: the utterance an error is about (``decode_failed``)."""
        info = wire_info(error)
        body: dict[str, Any] = {"code": error.code, "message": error.message, "retryable": info.retryable}
        if channel is not None:
            body["channel"] = channel
        if utterance is not None:
            body["utterance"] = utterance
        if error.retry_after is not None:
            body["retry_after"] = error.retry_after
        return self._message("error", body)

    def load(self, level: int, interim_ms: int, interim_model: bool, interim_short_window: bool) -> dict[str, Any]:
        if level == 0:
            text = "load is normal again: interim results at the requested rate"
        else:
            text = (f"the server is busy: interim results every {interim_ms} ms of audio"
                    + (" from a smaller model" if interim_model else "") + (", on a shorter window (less accurate)" if interim_short_window else ""))
        body = {"level": level, "interim_ms": interim_ms, "interim_model": interim_model, "interim_short_window": interim_short_window, "message": text}
        return self._message("load", body)

    def resumed(self, audio_received_s: float, audio_received_bytes: int, commands_received: int, replayed: int) -> dict[str, Any]:
        """After the replay: where the client's audio and commands resume from."""
        body = {
            "audio_received_s": round(audio_received_s, 6),
            "audio_received_bytes": audio_received_bytes,
            "commands_received": commands_received,
            "replayed": replayed,
        }
        return self._message("resumed", body)

    def heartbeat(self, audio_received_s: float) -> dict[str, Any]:
        """Sent while nothing else was (``heartbeat_s``): the connection and the server are alive."""
        return self._message("heartbeat", {"audio_received_s": round(audio_received_s, 3)})

    def closed(self, audio_received_s: float, audio_transcribed_s: float) -> dict[str, Any]:
        return self._message(
            "closed",
            {"audio_received_s": round(audio_received_s, 3), "audio_transcribed_s": round(audio_transcribed_s, 3)},
        )


@dataclass(frozen=True)
class Finalize:
    pass


@dataclass(frozen=True)
class CloseStream:
    pass


@dataclass(frozen=True)
class KeepAlive:
    pass


@dataclass(frozen=True)
class WebRtcOffer:
    sdp: str


ClientCommand = Finalize | CloseStream | KeepAlive | WebRtcOffer

_COMMANDS: dict[str, ClientCommand] = {"finalize": Finalize(), "close": CloseStream(), "keepalive": KeepAlive()}
_KNOWN_TYPES = sorted([*_COMMANDS, "webrtc_offer"])


def parse_client_message(text: str) -> ClientCommand:
    """Parse a client text frame; raise :class:`InvalidMessage` or :class:`UnknownMessageType`."""
    try:
        message = read_json(text)
    except ValueError:
        raise InvalidMessage("text frames must be JSON objects such as {\"type\": \"finalize\"}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise InvalidMessage("a text frame must be a JSON object with a string \"type\"")
    if message["type"] == "webrtc_offer":
        sdp = message.get("sdp")
        if not isinstance(sdp, str) or not sdp.strip():
            raise InvalidMessage("webrtc_offer needs \"sdp\": the offer's SDP text")
        if len(sdp) > MAX_SDP_CHARS:
            raise InvalidMessage(f"webrtc_offer sdp is longer than {MAX_SDP_CHARS} characters")
        return WebRtcOffer(sdp)
    command = _COMMANDS.get(message["type"])
    if command is None:
        known = ", ".join(_KNOWN_TYPES)
        raise UnknownMessageType(f"unknown message type {message['type'][:40]!r}; known types: {known}")
    return command


def _words(words: tuple[Word, ...]) -> list[dict[str, Any]]:
    return [{"word": w.word.strip(), "start": w.start, "end": w.end, "probability": w.probability} for w in words]


class NativeDialect:
    """Our own protocol: messages go out as they are."""

    name = "native"

    def incoming(self, text: str) -> list[str]:
        return [text]

    def incoming_binary(self, data: bytes) -> list[bytes]:
        return [data]

    def outgoing(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        return [message]
