"""The WebSocket transport's public names, kept where earlier code imports them.

The shell is split by idea: :mod:`asr_server.server` (lifecycle),
:mod:`.http` (routes), :mod:`.connection` (one stream: read, feed, send),
:mod:`.ingest` (containers and live audio), and
:mod:`asr_server.scheduler.admission` (whether a stream is taken).
"""

from ..server import AsrServer
from .connection import Connection
from .http import LISTEN_PATH

__all__ = ["AsrServer", "Connection", "LISTEN_PATH"]
