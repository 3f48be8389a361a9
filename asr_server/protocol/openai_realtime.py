"""OpenAI's Realtime transcription dialect (``/v1/realtime?intent=transcription``), translated.

The ``openai`` SDK's realtime client (and the frameworks built on it) sends
JSON events: ``session.update`` (or the older ``transcription_session.update``)
with the audio format, language and turn detection; ``input_audio_buffer.append``
with base64 audio; ``input_audio_buffer.commit`` and ``.clear``.
:class:`OpenAiDialect` turns them into what our session takes (audio bytes,
``finalize``, a new configuration before any audio) and our session's
messages into OpenAI's server events: ``input_audio_buffer.speech_started``,
``speech_stopped``, ``committed``, ``conversation.item.input_audio_transcription.delta``
(append-only: only text that will not change, our stable prefix) and
``.completed`` (the final text). No I/O here; docs/compat.md has the table.
"""

from __future__ import annotations

import base64
import binascii
import itertools
from dataclasses import dataclass, replace
from typing import Any

from ..errors import AsrError, InvalidMessage
from ..options import StreamOptions, parse_prompt
from .client_json import read_json

__all__ = ["OpenAiDialect", "Reconfigure", "REALTIME_PATH", "CLIENT_SECRETS_PATH", "default_realtime_options"]

REALTIME_PATH = "/v1/realtime"
CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"  # a short-lived key for a browser, with its session's settings
# Formats by the current SDK's names and the older ones.
_FORMATS = {
    "audio/pcm": ("pcm_s16le", 24000), "pcm16": ("pcm_s16le", 24000),
    "audio/pcmu": ("mulaw", 8000), "g711_ulaw": ("mulaw", 8000),
    "audio/pcma": ("alaw", 8000), "g711_alaw": ("alaw", 8000),
}
_CONTINUED = ("sentence", "max_length")  # final reasons after which the next utterance continues the talk
_MANUAL_ENDPOINT_MS = 5000  # turn_detection null: commits end utterances (and pauses of 5 s)


def default_realtime_options() -> StreamOptions:
    """OpenAI's defaults: 24 kHz pcm16, server VAD, interims on (its deltas come from them)."""
    return StreamOptions(encoding="pcm_s16le", sample_rate=24000, channels=1, revisions=False, interim_results=True, endpoint_ms=500)


@dataclass(frozen=True)
class Reconfigure:
    """New stream options from a session update; the transport applies them while no audio has arrived.

    ``announce``: send the new session's ``session`` message (with ``info`` in it), in sequence."""

    options: StreamOptions
    announce: bool = False
    info: dict[str, Any] | None = None


Action = str | bytes | dict[str, Any] | Reconfigure  # our command text, audio, an event for the client, new options


def _object(parent: dict[str, Any], name: str) -> dict[str, Any]:
    """``parent[name]``, an object in a client's event (absent or null: empty)."""
    value = parent.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidMessage(f"{name!r} must be an object")
    return value


class OpenAiDialect:
    """One transcription session's translation, both ways."""

    name = "openai"

    def __init__(self, options: StreamOptions, model_name: str, languages: tuple[str, ...]) -> None:
        self.options = options
        self.model_name = model_name
        self.languages = languages
        self.legacy = False  # the client spoke transcription_session.* (older SDKs): answer in kind
        self.manual = False  # turn_detection null: only commits end utterances
        self._events = itertools.count(1)
        self._session_id = ""
        self._emitted: dict[int, str] = {}  # per utterance: the text already sent as deltas
        self._previous_item: str | None = None
        self._cleared: set[int] = set()  # utterances whose audio the client cleared: no transcript
        self._open: int | None = None  # the utterance in progress

    # -- in ---------------------------------------------------------------------------

    def incoming(self, text: str) -> list[Action]:
        try:
            event = read_json(text)
        except ValueError:
            return [self._error(InvalidMessage("client events must be JSON objects"))]
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "input_audio_buffer.append":
            try:
                return [base64.b64decode(event.get("audio", ""), validate=True)]
            except (binascii.Error, ValueError, TypeError):
                return [self._error(InvalidMessage("input_audio_buffer.append needs base64 audio"), event)]
        if kind == "input_audio_buffer.commit":
            if self._open is None:  # nothing said since the last commit or pause: OpenAI's error for it
                return [self._event("error", {"error": {"type": "invalid_request_error", "code": "input_audio_buffer_commit_empty",
                                                        "message": "nothing to commit: no speech since the last commit", "param": None,
                                                        "event_id": event.get("event_id")}})]
            self._open = None  # being finalized
            return ['{"type": "finalize"}']
        if kind == "input_audio_buffer.clear":
            if self._open is not None:
                self._cleared.add(self._open)
            return ['{"type": "finalize"}', self._event("input_audio_buffer.cleared", {})]
        if kind in ("session.update", "transcription_session.update"):
            return self._update(event)
        return [self._error(InvalidMessage(f"unsupported event type {str(kind)[:60]!r} on a transcription session"), event)]

    def configure(self, session: Any) -> StreamOptions:
        """A client secret's session settings (``session.update``'s ``session``), taken as the
        session's own before any event: its options; InvalidMessage for settings it cannot serve."""
        if not isinstance(session, dict):
            raise InvalidMessage("'session' must be an object")
        self.options = self._options(session)
        return self.options

    def _update(self, event: dict[str, Any]) -> list[Action]:
        self.legacy = event["type"] == "transcription_session.update"
        try:
            session = _object(event, "session")
            options = self._legacy_options(session) if self.legacy else self._options(session)
        except AsrError as error:
            return [self._error(error, event)]
        self.options = options
        return [Reconfigure(options), self._event(f"{self._prefix()}.updated", {"session": self.session_object()})]

    def _options(self, session: dict[str, Any]) -> StreamOptions:
        audio_in = _object(_object(session, "audio"), "input")
        transcription = _object(audio_in, "transcription")
        return self._apply(_object(audio_in, "format").get("type"), transcription, audio_in.get("turn_detection", "keep"))

    def _legacy_options(self, session: dict[str, Any]) -> StreamOptions:
        return self._apply(session.get("input_audio_format"), _object(session, "input_audio_transcription"), session.get("turn_detection", "keep"))

    def _apply(self, fmt: Any, transcription: dict[str, Any], turn: Any) -> StreamOptions:
        options = self.options
        if fmt is not None:
            if not isinstance(fmt, str) or fmt not in _FORMATS:
                raise InvalidMessage(f"unsupported input audio format {str(fmt)[:40]!r}; supported: {', '.join(_FORMATS)}")
            encoding, rate = _FORMATS[fmt]
            options = replace(options, encoding=encoding, sample_rate=rate)
        language = transcription.get("language")
        if language:
            language = str(language).split("-")[0].lower()
            if language not in self.languages:
                raise InvalidMessage(f"language {language!r} is not supported by this model")
            options = replace(options, language=language)
        if transcription.get("prompt") is not None:
            options = replace(options, prompt=parse_prompt(str(transcription["prompt"])))
        if turn is None:
            self.manual = True
            options = replace(options, endpoint_ms=_MANUAL_ENDPOINT_MS)
        elif isinstance(turn, dict):
            self.manual = False
            silence = turn.get("silence_duration_ms")
            if isinstance(silence, int):
                options = replace(options, endpoint_ms=min(5000, max(100, silence)))
        return options

    def incoming_binary(self, data: bytes) -> list[Action]:
        """OpenAI's audio travels in ``input_audio_buffer.append`` events: a binary frame is an
        error, and is not taken as audio."""
        return [self._error(InvalidMessage(f"a binary frame ({len(data)} bytes) is not an event; "
                                           "send audio as base64 in input_audio_buffer.append"))]

    # -- out --------------------------------------------------------------------------

    def outgoing(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        kind = message["type"]
        if kind == "session":
            self._session_id = message["session_id"]
            return [self._event("session.created", {"session": self.session_object()})]
        utterance = message.get("utterance")
        if utterance in self._cleared:
            if kind == "final":
                self._cleared.discard(utterance)
                self._open = None
            return []
        if kind == "speech_start":
            self._open = utterance
            return [] if self.manual else [self._event("input_audio_buffer.speech_started",
                                                      {"audio_start_ms": int(message["at"] * 1000), "item_id": self._item(utterance)})]
        if kind == "interim":
            return self._delta(utterance, message["text"][: message.get("stable", 0)])
        if kind == "final":
            return self._final(message)
        if kind == "error":
            return [self._error_event(message)]
        return []  # revision, settled, load, closed, resumed: not in this protocol

    def _final(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        utterance, text = message["utterance"], message["text"]
        self._open = None
        item = self._item(utterance)
        out = []
        if not self.manual:
            out.append(self._event("input_audio_buffer.speech_stopped", {"audio_end_ms": int(message["end"] * 1000), "item_id": item}))
        out.append(self._event("input_audio_buffer.committed", {"item_id": item, "previous_item_id": self._previous_item}))
        self._previous_item = item
        out += self._delta(utterance, text)
        seconds = round(max(0.0, message["end"] - message["start"]), 3)
        out.append(self._event("conversation.item.input_audio_transcription.completed", {
            "item_id": item, "content_index": 0, "transcript": text, "usage": {"type": "duration", "seconds": seconds},
        }))
        self._emitted.pop(utterance, None)
        if message.get("reason") in _CONTINUED:
            # The talk goes on in the next utterance, which gets no speech_start of ours: its item starts here, so
            # that every item has its speech_started and a commit finalizes it.
            self._open = utterance + 1
            if not self.manual:
                started = {"audio_start_ms": int(message["end"] * 1000), "item_id": self._item(utterance + 1)}
                out.append(self._event("input_audio_buffer.speech_started", started))
        return out

    def _delta(self, utterance: int, text: str) -> list[dict[str, Any]]:
        """Only what extends what was already sent: deltas never take anything back."""
        sent = self._emitted.get(utterance, "")
        if not text.startswith(sent) or len(text) == len(sent):
            return []
        self._emitted[utterance] = text
        return [self._event("conversation.item.input_audio_transcription.delta",
                            {"item_id": self._item(utterance), "content_index": 0, "delta": text[len(sent):]})]

    def session_object(self) -> dict[str, Any]:
        fmt = next(k for k, v in _FORMATS.items() if v == (self.options.encoding, self.options.sample_rate or 0) and k.startswith("audio/"))
        turn = None if self.manual else {"type": "server_vad", "silence_duration_ms": self.options.endpoint_ms, "prefix_padding_ms": 300}
        if self.legacy:
            legacy_fmt = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}[fmt]
            return {"id": self._session_id, "object": "realtime.transcription_session", "input_audio_format": legacy_fmt,
                    "input_audio_transcription": {"model": self.model_name, "language": self.options.language, "prompt": self.options.prompt},
                    "turn_detection": turn}
        audio_input = {"format": {"type": fmt, **({"rate": self.options.sample_rate} if fmt == "audio/pcm" else {})},
                       "transcription": {"model": self.model_name, "language": self.options.language, "prompt": self.options.prompt},
                       "turn_detection": turn}
        return {"type": "transcription", "id": self._session_id, "object": "realtime.transcription_session", "audio": {"input": audio_input}}

    # -- helpers ----------------------------------------------------------------------

    def _prefix(self) -> str:
        return "transcription_session" if self.legacy else "session"

    def _item(self, utterance: int) -> str:
        return f"item_{self._session_id}_{utterance}"

    def _event(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"type": kind, "event_id": f"event_{next(self._events)}", **body}

    def _error(self, error: AsrError, event: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._error_event({"code": error.code, "message": error.message, "retryable": False},
                                 event.get("event_id") if isinstance(event, dict) else None)

    def _error_event(self, error: dict[str, Any], client_event: str | None = None) -> dict[str, Any]:
        retryable = error.get("retryable", False)
        body: dict[str, Any] = {"type": "server_error" if retryable else "invalid_request_error", "code": error["code"],
                                "message": error["message"], "param": None, "event_id": client_event}
        if "retry_after" in error:
            body["retry_after"] = error["retry_after"]
        return self._event("error", {"error": body})
