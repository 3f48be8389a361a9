"""The Deepgram live-streaming dialect of ``/v1/listen``, as a translation of our own protocol.

Deepgram's SDKs (and the voice-agent frameworks built on them) connect to
``/v1/listen`` with Deepgram's query parameters and ``Authorization: Token
KEY``. :func:`is_deepgram` recognises them; :func:`parse_deepgram_options`
turns their parameters into our :class:`~asr_server.options.StreamOptions`
(unknown ones are ignored, as Deepgram does); :class:`DeepgramDialect`
translates each message of the session core into Deepgram's (``Results``,
``SpeechStarted``, ``UtteranceEnd``, ``Metadata``, ``Error``) and
Deepgram's client messages (``KeepAlive``, ``Finalize``, ``CloseStream``)
into ours. No I/O here. docs/compat.md lists what maps to what.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..options import MAX_PROMPT_CHARS, StreamOptions, parse_stream_options, whole_number
from .client_json import read_json

__all__ = ["DeepgramOptions", "DeepgramDialect", "is_deepgram", "parse_deepgram_options", "DEEPGRAM_ONLY"]

# Parameters of Deepgram's that our own protocol does not have: any of them means the Deepgram dialect.
DEEPGRAM_ONLY = frozenset({
    "model", "endpointing", "utterance_end_ms", "vad_events", "punctuate", "smart_format", "multichannel", "keyterm",
    "keywords", "diarize", "numerals", "profanity_filter", "redact", "replace", "search", "tag", "version", "mip_opt_out",
    "dictation", "filler_words", "callback", "callback_method", "extra", "detect_entities", "language_hint",
})
_ENCODINGS = {"linear16": "pcm_s16le", "mulaw": "mulaw", "alaw": "alaw", "opus": "ogg", "ogg-opus": "ogg", "flac": "flac",
              "linear32": "pcm_f32le", "mp3": "mp3", "webm": "webm", "wav": "wav"}
_WORD_EDGES = re.compile(r"^[^\w']+|[^\w']+$")


@dataclass(frozen=True)
class DeepgramOptions:
    """What shapes Deepgram's messages (the stream itself is a :class:`StreamOptions`)."""

    model: str = "nova-3"
    punctuate: bool = False
    vad_events: bool = False
    utterance_end_ms: int | None = None
    channels: int = 1


def is_deepgram(query: Mapping[str, list[str]], authorization: str | None, subprotocol: str | None = None) -> bool:
    """A Deepgram client: ``Authorization: Token ...``, or a parameter only Deepgram has, or
    ``encoding=linear16``, or a browser's credentials in Deepgram's subprotocols (``token`` or
    ``bearer``, then the secret: the subprotocol answered)."""
    if authorization and authorization.strip().lower().startswith("token "):
        return True
    if subprotocol is not None and subprotocol.lower() in ("token", "bearer"):
        return True
    return bool(DEEPGRAM_ONLY & set(query)) or query.get("encoding", [""])[0] in ("linear16", "linear32", "opus", "ogg-opus")


def _flag(query: Mapping[str, list[str]], name: str, default: bool) -> bool:
    raw = query.get(name, [""])[-1].strip().lower()
    return default if raw == "" else raw not in ("false", "0", "no")


def parse_deepgram_options(query: Mapping[str, list[str]], languages: Iterable[str]) -> tuple[StreamOptions, DeepgramOptions]:
    """Deepgram's parameters as ours; InvalidOption / UnsupportedLanguage for values we cannot serve."""
    first = {name: values[-1] for name, values in query.items() if values}
    ours: dict[str, list[str]] = {}
    encoding = _ENCODINGS.get(first.get("encoding", "").lower(), "auto" if "encoding" not in first else first["encoding"])
    ours["encoding"] = [encoding]
    if encoding in ("pcm_s16le", "pcm_f32le", "mulaw", "alaw") and "sample_rate" in first:
        ours["sample_rate"] = [first["sample_rate"]]
    ours["channels"] = [first.get("channels", "1")]
    ours["language"] = [first.get("language", "en").split("-")[0].lower()]
    ours["interim_results"] = ["true" if _flag(query, "interim_results", False) else "false"]
    endpointing = first.get("endpointing", "").strip().lower()
    if endpointing in ("false", "0"):
        ours["endpoint_ms"] = ["5000"]  # no endpointing: finals come at pauses of 5 s, Finalize, or the end
    elif endpointing:
        given = whole_number(endpointing)  # else our parser says what is wrong with it
        ours["endpoint_ms"] = [str(min(5000, max(100, given))) if given is not None else endpointing]
    ours["revisions"] = ["false"]  # Deepgram has no revisions: finals are final
    terms = [t.split(":")[0].strip() for name in ("keyterm", "keywords") for t in query.get(name, []) if t.strip()]
    if terms:
        ours["prompt"] = [_vocabulary(terms)]
    options = parse_stream_options(ours, languages)
    utterance_end = whole_number(first.get("utterance_end_ms", ""))
    dialect = DeepgramOptions(
        model=first.get("model", "nova-3"),
        punctuate=_flag(query, "punctuate", False) or _flag(query, "smart_format", False),
        vad_events=_flag(query, "vad_events", False),
        utterance_end_ms=utterance_end,
        channels=options.channels,
    )
    return options, dialect


def _vocabulary(terms: list[str]) -> str:
    """Deepgram's key terms as our prompt, as many as fit."""
    prompt = ""
    for term in dict.fromkeys(terms):  # in order, once each
        candidate = f"{prompt}, {term}" if prompt else term
        if len(candidate) > MAX_PROMPT_CHARS:
            break
        prompt = candidate
    return prompt


class DeepgramDialect:
    """Our session's messages out as Deepgram's; Deepgram's client messages in as ours."""

    name = "deepgram"

    def __init__(self, options: DeepgramOptions, model_name: str) -> None:
        self.options = options
        self.model_name = model_name
        self._request_id = ""

    # -- in ---------------------------------------------------------------------------

    def incoming(self, text: str) -> list[str]:
        """A client text frame as ours."""
        try:
            message = read_json(text)
        except ValueError:
            return [text]  # our parser reports it
        kind = message.get("type") if isinstance(message, dict) else None
        ours = {"Finalize": "finalize", "CloseStream": "close", "KeepAlive": "keepalive"}.get(str(kind))
        return [json.dumps({"type": ours})] if ours else [text]

    def incoming_binary(self, data: bytes) -> list[bytes]:
        return [data]  # Deepgram's audio comes as binary frames

    # -- out --------------------------------------------------------------------------

    def outgoing(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        """What a Deepgram client gets for one of our messages (often nothing)."""
        kind = message["type"]
        if kind == "session":
            self._request_id = message["session_id"]
            return []
        if kind == "speech_start":
            if not self.options.vad_events:
                return []
            return [{"type": "SpeechStarted", "channel": [message["channel"], self.options.channels], "timestamp": message["at"]}]
        if kind in ("interim", "final"):
            return self._results(message)
        if kind == "error":
            return [self._error(message)]
        if kind == "closed":
            return [self._metadata(message)]
        return []  # revision, settled, load, resumed, webrtc_answer: nothing in Deepgram's protocol

    def _results(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        final = message["type"] == "final"
        if final and not message["text"]:
            return []  # nothing was said (a guard emptied it): Deepgram sends nothing either
        words = [self._word(w) for w in message.get("words", [])] if final else []
        confidence = sum(w["confidence"] for w in words) / len(words) if words else 0.0
        start, end = message["start"], message["end"]
        from_finalize = final and message.get("reason") == "finalize"
        results = {
            "type": "Results",
            "channel_index": [message["channel"], self.options.channels],
            "duration": round(max(0.0, end - start), 3),
            "start": round(start, 3),
            "is_final": final,
            "speech_final": final and message.get("reason") in ("endpoint", "end_of_stream"),
            "from_finalize": from_finalize,
            "channel": {"alternatives": [{"transcript": self._text(message["text"]), "confidence": round(confidence, 4), "words": words}]},
            "metadata": self._result_metadata(),
        }
        out = [results]
        if final and self.options.utterance_end_ms is not None and message.get("reason") == "endpoint":
            last = words[-1]["end"] if words else end
            out.append({"type": "UtteranceEnd", "channel": [message["channel"], self.options.channels], "last_word_end": last})
        return out

    def _text(self, text: str) -> str:
        if self.options.punctuate:
            return text
        return " ".join(w for w in (_WORD_EDGES.sub("", t).lower() for t in text.split()) if w)

    def _word(self, word: dict[str, Any]) -> dict[str, Any]:
        punctuated = word["word"].strip()
        return {
            "word": _WORD_EDGES.sub("", punctuated).lower() or punctuated.lower(),
            "start": round(word["start"], 3),
            "end": round(word["end"], 3),
            "confidence": round(float(word["probability"]), 4),
            "punctuated_word": punctuated,
        }

    def _result_metadata(self) -> dict[str, Any]:
        return {"request_id": self._request_id, "model_uuid": self.model_name,
                "model_info": {"name": self.options.model, "version": self.model_name, "arch": "whisper"}}

    def _metadata(self, closed: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "Metadata",
            "transaction_key": "deprecated",
            "request_id": self._request_id,
            "sha256": "",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
            "duration": closed["audio_received_s"],
            "channels": self.options.channels,
            "models": [self.model_name],
            "model_info": {self.model_name: {"name": self.options.model, "version": self.model_name, "arch": "whisper"}},
        }

    def _error(self, error: dict[str, Any]) -> dict[str, Any]:
        out = {"type": "Error", "variant": error["code"], "description": error["message"], "code": error["code"], "message": error["message"]}
        if "retry_after" in error:
            out["retry_after"] = error["retry_after"]
        return out
