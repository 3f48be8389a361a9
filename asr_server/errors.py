"""The one error vocabulary of the server, and its table to the wire.

Every failure a client can see is an :class:`AsrError` subclass with a stable
string ``code``. The tree separates who is at fault::

    AsrError
    ├── ClientError          the client sent something we cannot accept
    │   ├── InvalidOption        bad query value (before any audio)
    │   ├── UnsupportedLanguage  language the model cannot transcribe
    │   ├── InvalidMessage       text frame that is not a JSON object
    │   ├── UnknownMessageType   JSON message with a type we do not know
    │   ├── FrameTooLarge        binary frame over the configured limit
    │   ├── InvalidAudio         bytes that do not decode as the declared encoding
    │   ├── AudioFormatMismatch  container whose channels disagree with the options
    │   ├── IdleTimeout          no message for ``idle_timeout_s``
    │   ├── ResultsNotRead       results not read for ``send_timeout_s``
    │   ├── InvalidOffer         a WebRTC offer we cannot answer
    │   ├── Unauthorized         no API key or token, or not a valid one (HTTP 401 at the handshake)
    │   ├── OriginNotAllowed     a browser page from an origin not allowed (HTTP 403)
    │   ├── QuotaExceeded        the key's channels or streams per minute are used up
    │   ├── TokensDisabled       a token asked of a server that has no keys (HTTP 404)
    │   ├── ResumeFailed         a resume token unknown, expired, in use or another key's
    │   ├── SessionNotFound      a session to follow that is unknown, ended too long ago, or another key's
    │   └── FollowerTooSlow      a follower of a session fell too far behind and was cut off
    ├── OverloadError        we cannot take more work now (retry later)
    │   ├── NotReady             the model is still loading / warming up
    │   ├── ShuttingDown         the server is stopping
    │   ├── MemoryPressure       memory is critical: a batch stream is shed
    │   └── AudioOverrun         live (WebRTC) audio outran the model
    ├── WebRtcFailed         the peer connection did not connect, or failed
    └── ServerError          our fault
        ├── InferenceFailed      the model raised while decoding
        ├── DecodeFailed         one utterance could not be decoded (after a retry);
        │                        its final is empty and the session goes on
        ├── AudioDropped         taking a piece of a channel's audio failed (a bug): the piece
        │                        is dropped, its utterance ends, and the session goes on
        └── InternalError        anything else

:data:`WIRE_TABLE` maps each code to ``retryable`` and the WebSocket close code
(RFC 6455 section 7.4.1), or ``None`` where the session goes on after the
error, and the HTTP status of the errors that refuse a request before any
WebSocket (access control). docs/protocol.md reproduces this table; keep them in step. Internal
exception text never goes on the wire: only the message given here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AsrError",
    "ClientError",
    "InvalidOption",
    "UnsupportedLanguage",
    "InvalidMessage",
    "UnknownMessageType",
    "FrameTooLarge",
    "InvalidAudio",
    "AudioFormatMismatch",
    "IdleTimeout",
    "ResultsNotRead",
    "InvalidOffer",
    "Unauthorized",
    "OriginNotAllowed",
    "QuotaExceeded",
    "TokensDisabled",
    "ResumeFailed",
    "SessionNotFound",
    "FollowerTooSlow",
    "MemoryPressure",
    "AudioOverrun",
    "WebRtcFailed",
    "OverloadError",
    "NotReady",
    "ShuttingDown",
    "ServerError",
    "InferenceFailed",
    "InternalError",
    "DecodeFailed",
    "AudioDropped",
    "WireInfo",
    "WIRE_TABLE",
    "wire_info",
]


class AsrError(Exception):
    """Base of every error that has a wire code."""

    code = "internal_error"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class ClientError(AsrError):
    code = "bad_request"


class InvalidOption(ClientError):
    code = "invalid_option"


class UnsupportedLanguage(ClientError):
    code = "unsupported_language"


class InvalidMessage(ClientError):
    code = "invalid_message"


class UnknownMessageType(ClientError):
    code = "unknown_message_type"


class FrameTooLarge(ClientError):
    code = "frame_too_large"


class InvalidAudio(ClientError):
    code = "invalid_audio"


class AudioFormatMismatch(ClientError):
    code = "audio_format_mismatch"


class IdleTimeout(ClientError):
    code = "idle_timeout"


class ResultsNotRead(ClientError):
    code = "results_not_read"


class InvalidOffer(ClientError):
    code = "invalid_offer"


class Unauthorized(ClientError):
    code = "unauthorized"


class OriginNotAllowed(ClientError):
    code = "origin_not_allowed"


class QuotaExceeded(ClientError):
    code = "quota_exceeded"


class TokensDisabled(ClientError):
    code = "tokens_disabled"


class ResumeFailed(ClientError):
    """The session cannot be resumed; the client starts a new one."""

    code = "resume_failed"


class SessionNotFound(ClientError):
    code = "session_not_found"


class FollowerTooSlow(ClientError):
    code = "follower_too_slow"


class OverloadError(AsrError):
    code = "overloaded"


class NotReady(OverloadError):
    code = "not_ready"


class ShuttingDown(OverloadError):
    code = "shutting_down"


class MemoryPressure(OverloadError):
    code = "memory_pressure"


class AudioOverrun(OverloadError):
    code = "audio_overrun"


class WebRtcFailed(AsrError):
    """Neither side's fault as far as we can tell: the network path failed."""

    code = "webrtc_failed"


class ServerError(AsrError):
    code = "internal_error"


class InferenceFailed(ServerError):
    code = "inference_failed"


class InternalError(ServerError):
    code = "internal_error"


class DecodeFailed(ServerError):
    code = "decode_failed"


class AudioDropped(ServerError):
    code = "audio_dropped"


@dataclass(frozen=True)
class WireInfo:
    retryable: bool
    close_code: int | None  # None: the session continues after the error
    http_status: int = 400  # when refused at the handshake, before any WebSocket (access control)


# code -> (retryable, WebSocket close code or None to keep the session open)
WIRE_TABLE: dict[str, WireInfo] = {
    "bad_request": WireInfo(False, 1008),
    "invalid_option": WireInfo(False, 1008),
    "unsupported_language": WireInfo(False, 1008),
    "invalid_message": WireInfo(False, None),
    "unknown_message_type": WireInfo(False, None),
    "frame_too_large": WireInfo(False, 1009),
    "invalid_audio": WireInfo(False, 1007),
    "audio_format_mismatch": WireInfo(False, 1007),
    "idle_timeout": WireInfo(False, 1008),
    "results_not_read": WireInfo(False, 1008),
    "invalid_offer": WireInfo(False, 1008),
    "unauthorized": WireInfo(False, 1008, 401),
    "origin_not_allowed": WireInfo(False, 1008, 403),
    "quota_exceeded": WireInfo(True, 1013, 429),
    "tokens_disabled": WireInfo(False, 1008, 404),
    "resume_failed": WireInfo(False, 1008),
    "session_not_found": WireInfo(False, 1008, 404),
    "follower_too_slow": WireInfo(True, 1013),
    "overloaded": WireInfo(True, 1013, 503),
    "not_ready": WireInfo(True, 1013),
    "shutting_down": WireInfo(True, 1001),
    "memory_pressure": WireInfo(True, 1013),
    "audio_overrun": WireInfo(True, 1013),
    "webrtc_failed": WireInfo(True, 1011),
    "inference_failed": WireInfo(True, 1011),
    "decode_failed": WireInfo(True, None),
    "audio_dropped": WireInfo(True, None),
    "internal_error": WireInfo(True, 1011),
}


def wire_info(error: AsrError) -> WireInfo:
    """How ``error`` is reported: every code must be in :data:`WIRE_TABLE`."""
    return WIRE_TABLE[error.code]
