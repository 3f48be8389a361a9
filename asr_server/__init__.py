"""asr-server: real-time speech recognition over WebSocket.

Data flows through the subpackages in this order::

    transport -> audio (decode, vad, chunker) -> scheduler -> inference -> decoding -> protocol -> transport
"""

__version__ = "0.1.0"
