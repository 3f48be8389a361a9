"""FLAC framing: a FLAC stream's bytes in, its STREAMINFO and whole frames out.

FFmpeg's FLAC parser holds ten frame headers before it gives the decoder a frame (it scores
chains of headers to resync on damaged input): 1.4 s of a 16 kHz stream, measured. Here a frame
goes to the decoder as soon as the next frame's header has come: one frame late (4096 samples:
0.26 s at 16 kHz). A candidate header counts only if its CRC-8 holds and it carries the frame
(or sample) number that follows, with the blocking strategy, rate, channel count and sample size
of the first frame: a chance match inside a frame's data is then out of the question. A plain
object (no I/O): :class:`~asr_server.audio.decode.ContainerDecoder` feeds it and decodes the
frames with FFmpeg's FLAC decoder.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidAudio

__all__ = ["FLAC_MAGIC", "FlacFramer", "streaminfo_layout"]

FLAC_MAGIC = b"fLaC"
# Bytes without the next frame's header before the stream counts as corrupt (a frame of 65536
# samples x 8 channels x 32 bits, the format's largest, is 2 MB uncoded; encoders use 4096 or less).
_FLAC_MAX_FRAME = 1 << 21


def _crc8(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


@dataclass(frozen=True)
class _FlacHeader:
    variable: bool  # blocking strategy: the number is a sample number, else a frame number
    rate_code: int
    channels: int
    size_code: int
    number: int
    block: int  # samples in the frame


_FLAC_BLOCKS = {1: 192, **{c: 576 << (c - 2) for c in range(2, 6)}, **{c: 256 << (c - 8) for c in range(8, 16)}}


def _flac_header(data: bytes, at: int) -> _FlacHeader | None:
    """The frame header at ``data[at:]`` if it is a well-formed one with a good CRC-8; None if not
    (or not all of it is there yet)."""
    head = data[at : at + 16]
    if len(head) < 6 or head[0] != 0xFF or head[1] & 0xFE != 0xF8 or head[3] & 1:
        return None
    block_code, rate_code, chan_code, size_code = head[2] >> 4, head[2] & 15, head[3] >> 4, (head[3] >> 1) & 7
    if block_code == 0 or rate_code == 15 or chan_code > 10 or size_code == 3:
        return None
    number, pos = _utf8_number(head, 4)
    if number is None:
        return None
    extra = {6: 1, 7: 2}.get(block_code, 0)
    block = int.from_bytes(head[pos : pos + extra], "big") + 1 if extra else _FLAC_BLOCKS[block_code]
    pos += extra + {12: 1, 13: 2, 14: 2}.get(rate_code, 0)
    if len(head) < pos + 1 or _crc8(head[:pos]) != head[pos]:
        return None
    return _FlacHeader(bool(head[1] & 1), rate_code, chan_code + 1 if chan_code < 8 else 2, size_code, number, block)


def _utf8_number(head: bytes, at: int) -> tuple[int | None, int]:
    """FLAC's UTF-8-like coded frame or sample number at ``head[at]``, and where it ends."""
    first = head[at]
    length = next((n for n in range(8) if not first & (0x80 >> n)), 8)
    if length in (1, 8) or at + max(1, length) > len(head):
        return None, at
    if length == 0:
        return first, at + 1
    value = first & (0x7F >> length)
    for byte in head[at + 1 : at + length]:
        if byte & 0xC0 != 0x80:
            return None, at
        value = (value << 6) | (byte & 0x3F)
    return value, at + length


def _follows(first: _FlacHeader, last: _FlacHeader, nxt: _FlacHeader) -> bool:
    """Whether ``nxt`` is the header of the frame after the one ``last`` heads."""
    same = (nxt.variable, nxt.rate_code, nxt.channels, nxt.size_code) == (first.variable, first.rate_code, first.channels, first.size_code)
    return same and nxt.number == last.number + (last.block if last.variable else 1)


class FlacFramer:
    """A FLAC stream's bytes in, its metadata (the STREAMINFO block) and whole frames out."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._scan = 2  # where the search for the next frame's header goes on
        self.streaminfo: bytes | None = None
        self._first: _FlacHeader | None = None
        self._last: _FlacHeader | None = None

    def feed(self, data: bytes) -> list[bytes]:
        """The frames that are now whole (their next frame's header has come)."""
        self._data += data
        if self._first is None and not self._read_metadata():
            return []
        frames = []
        while (end := self._next_header()) is not None:
            frames.append(bytes(self._data[:end]))
            del self._data[:end]
            self._scan = 2
        if len(self._data) > _FLAC_MAX_FRAME:
            raise InvalidAudio("flac stream is corrupt: no frame header where the next frame should begin")
        return frames

    def end(self) -> bytes:
        """What is left at the end of the stream: the last frame (or a piece of one)."""
        rest, self._data = bytes(self._data), bytearray()
        return rest if self._first is not None else b""

    def _read_metadata(self) -> bool:
        """Skip the magic and the metadata blocks, keeping STREAMINFO; whether frames come next."""
        data = self._data
        if len(data) >= 4 and data[:4] != FLAC_MAGIC:
            raise InvalidAudio("could not read a flac stream: it does not begin with 'fLaC'")
        pos = 4
        while len(data) >= pos + 4:
            last, kind, length = data[pos] & 0x80, data[pos] & 0x7F, int.from_bytes(data[pos + 1 : pos + 4], "big")
            if len(data) < pos + 4 + length:
                return False
            if kind == 0:
                self.streaminfo = bytes(data[pos + 4 : pos + 4 + length])
            pos += 4 + length
            if last:
                return self._first_frame(pos)
        return False

    def _first_frame(self, pos: int) -> bool:
        if self.streaminfo is None or len(self.streaminfo) != 34:
            raise InvalidAudio("could not read a flac stream: it has no STREAMINFO block")
        if (header := _flac_header(bytes(self._data), pos)) is None:
            if len(self._data) >= pos + 16:
                raise InvalidAudio("flac stream is corrupt: no frame header after its metadata")
            return False
        del self._data[:pos]
        self._first = self._last = header
        return True

    def _next_header(self) -> int | None:
        """Where the frame after the first one in the buffer begins, once its header has come."""
        assert self._first is not None and self._last is not None
        data, at = bytes(self._data), self._scan
        while (at := data.find(b"\xff", at)) >= 0:
            header = _flac_header(data, at)
            if header is not None and _follows(self._first, self._last, header):
                self._last = header
                return at
            at += 1
        self._scan = max(2, len(data) - 16)  # a header cut off at the end is looked at again
        return None


def streaminfo_layout(streaminfo: bytes) -> tuple[int, int]:
    """(sample rate, channels) from a STREAMINFO block."""
    packed = int.from_bytes(streaminfo[10:13], "big")
    return packed >> 4, ((packed >> 1) & 7) + 1
