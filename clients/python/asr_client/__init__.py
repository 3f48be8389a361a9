"""Client for asr-server: ``connect`` for the async API, ``stream_file`` to replay a file."""

from .client import AsrStream, Keepalive, fetch_transcript, ServerError, Timed, Transcript, Turn, connect, speaker_turns, listen_url, read_pcm, stream_bytes, stream_file, websocket_url

__all__ = ["AsrStream", "Keepalive", "fetch_transcript", "ServerError", "Timed", "Transcript", "Turn", "connect", "speaker_turns", "listen_url", "read_pcm", "stream_bytes", "stream_file", "websocket_url"]
__version__ = "0.1.0"
