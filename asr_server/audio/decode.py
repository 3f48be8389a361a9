"""Bytes in, 16 kHz float32 audio out, one row per channel.

Two decoders share one output shape, ``np.ndarray`` of shape
``(channels, samples)`` at :data:`MODEL_RATE`:

* :class:`PcmDecoder` for raw encodings (PCM s16/f32, G.711 mu-law/A-law).
  A plain object: ``feed(bytes)`` returns audio at once, ``flush()`` at the end.
* :class:`ContainerDecoder` for ogg/webm/wav/mp3/flac. PyAV's demuxers want a
  file they can block on, so it decodes in whatever thread calls
  :meth:`ContainerDecoder.frames` while another thread feeds bytes. A WAV
  stream (named, or found by ``auto``) whose samples are one of the raw
  encodings is read here instead (:func:`wav_header`): FFmpeg's WAV demuxer
  reads 64 KB before its first packet (it looks for other codecs wrapped in
  PCM), which held back the first 2 s of a 16 kHz stream and 3.3 s of what
  the server heard. A FLAC stream is framed here too (:mod:`.flac`) and its
  frames go to FFmpeg's decoder: FFmpeg's parser held ten frames back.
"""

from __future__ import annotations

import io
import struct
import threading
from collections import deque
from dataclasses import dataclass
from typing import Iterator

import av
import numpy as np

from ..errors import AudioFormatMismatch, InvalidAudio
from .flac import FLAC_MAGIC, FlacFramer, streaminfo_layout

__all__ = ["MODEL_RATE", "PcmDecoder", "ContainerDecoder", "FrameConverter", "Resampler", "WavFormat", "layout_for", "mulaw_to_float", "alaw_to_float", "wav_header"]

MODEL_RATE = 16000
# What a container may claim: telephone 8 kHz down to 4 kHz, studio 192 kHz up (a
# stream claiming 1 Hz turned 160 KB into 22 hours of "received" audio).
MIN_CONTAINER_RATE = 4000
MAX_CONTAINER_RATE = 192000
MAX_CONTAINER_CHANNELS = 8

_LAYOUTS = {1: "mono", 2: "stereo", 3: "3.0", 4: "quad", 5: "5.0", 6: "5.1", 7: "6.1", 8: "7.1"}


def layout_for(channels: int) -> str:
    """An FFmpeg channel layout with ``channels`` channels (no remixing is implied)."""
    return _LAYOUTS[channels]


def _mulaw_table() -> np.ndarray:
    # ITU-T G.711 mu-law expansion of every byte value.
    codes = ~np.arange(256, dtype=np.int32) & 0xFF
    sign = codes & 0x80
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return (np.where(sign, -magnitude, magnitude) / 32768.0).astype(np.float32)


def _alaw_table() -> np.ndarray:
    # ITU-T G.711 A-law expansion of every byte value (even bits inverted).
    codes = np.arange(256, dtype=np.int32) ^ 0x55
    sign = codes & 0x80
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = np.where(
        exponent == 0,
        (mantissa << 4) + 8,
        ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0),
    )
    return (np.where(sign, magnitude, -magnitude) / 32768.0).astype(np.float32)


def to_planar(frames: list[av.AudioFrame], channels: int) -> np.ndarray:
    """Packed float frames (format ``flt``) as ``(channels, n)`` float32.

    Always through the packed format: PyAV's ``to_ndarray``/``from_ndarray``
    on a planar frame of 8 channels crashes the process (8 planes overrun
    FFmpeg's inline data pointers) or raises IndexError.
    """
    if not frames:
        return np.zeros((channels, 0), np.float32)
    packed = np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32, copy=False)
    return np.ascontiguousarray(packed.reshape(-1, channels).T)


def from_planar(planar: np.ndarray, layout: str, rate: int) -> av.AudioFrame:
    """``(channels, n)`` float32 as one packed frame at ``rate`` (see :func:`to_planar`)."""
    packed = np.ascontiguousarray(planar.T, dtype=np.float32).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(packed, format="flt", layout=layout)
    frame.sample_rate = rate
    return frame


# What PyAV raises on bad bytes: FFmpeg's errors, and plain Python errors where
# crafted headers or tags reach its wrappers (a tag that is not UTF-8, a stream
# with no codec). Found by tools/fuzz_decode.py; all of them mean bad input.
_BAD_INPUT = (av.FFmpegError, UnicodeError, ValueError, AttributeError, IndexError, TypeError, OverflowError)

_MULAW = _mulaw_table()
_ALAW = _alaw_table()


def mulaw_to_float(data: bytes) -> np.ndarray:
    return _MULAW[np.frombuffer(data, dtype=np.uint8)]


def alaw_to_float(data: bytes) -> np.ndarray:
    return _ALAW[np.frombuffer(data, dtype=np.uint8)]


class Resampler:
    """Streaming resampler from ``rate`` to 16 kHz keeping every channel apart (or, with
    ``mix_to=1``, mixed down as FFmpeg mixes a container's channels)."""

    def __init__(self, rate: int, channels: int, mix_to: int | None = None) -> None:
        self.rate = rate
        self.channels = mix_to or channels  # of the output
        self._layout = layout_for(channels)
        keep = rate == MODEL_RATE and self.channels == channels
        self._swr = None if keep else av.AudioResampler(format="flt", layout=layout_for(self.channels), rate=MODEL_RATE)

    def feed(self, planar: np.ndarray) -> np.ndarray:
        """Resample ``(channels, n)`` float32 audio; the output may lag a little."""
        if self._swr is None:
            return planar
        return self._collect(self._swr.resample(from_planar(planar, self._layout, self.rate)))

    def flush(self) -> np.ndarray:
        if self._swr is None:
            return np.zeros((self.channels, 0), np.float32)
        return self._collect(self._swr.resample(None))

    def _collect(self, frames: list[av.AudioFrame]) -> np.ndarray:
        return to_planar(frames, self.channels)


class FrameConverter:
    """Decoded :class:`av.AudioFrame` objects (a WebRTC track's) to 16 kHz planar float.

    Any sample format, rate and layout; a change mid-stream starts a new
    resampler. ``channels=1`` averages every input channel (a browser sends
    its mono microphone as identical left and right); ``channels=2`` keeps
    left and right apart (a mono input is copied to both).
    """

    def __init__(self, channels: int) -> None:
        if channels not in (1, 2):
            raise ValueError("a WebRTC track gives one or two channels")
        self.channels = channels
        self._swr: av.AudioResampler | None = None
        self._key: tuple[str, int, int] | None = None
        self._layout_channels = 1

    def convert(self, frame: av.AudioFrame) -> np.ndarray:
        key = (frame.format.name, len(frame.layout.channels), frame.sample_rate)
        if key != self._key:
            self._key = key
            self._layout_channels = min(key[1], 8)
            self._swr = av.AudioResampler(format="flt", layout=layout_for(self._layout_channels), rate=MODEL_RATE)
        assert self._swr is not None
        planar = to_planar(self._swr.resample(frame), self._layout_channels)
        if planar.shape[1] == 0:
            return np.zeros((self.channels, 0), np.float32)
        if self.channels == 1:
            return planar.mean(axis=0, keepdims=True) if planar.shape[0] > 1 else planar
        if planar.shape[0] == 1:
            return np.repeat(planar, 2, axis=0)
        return planar[:2]


class PcmDecoder:
    """Raw interleaved samples to 16 kHz planar float.

    Frames may split samples anywhere: a partial sample is kept for the next
    :meth:`feed`. Call :meth:`flush` once at the end of the stream.
    """

    WIDTH = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1, "alaw": 1}  # bytes per sample

    def __init__(self, encoding: str, sample_rate: int, channels: int, mix_to: int | None = None) -> None:
        if encoding not in self.WIDTH:
            raise ValueError(f"not a raw encoding: {encoding}")
        self.encoding = encoding
        self.channels = channels
        self._block = self.WIDTH[encoding] * channels
        self._carry = b""
        self._resampler = Resampler(sample_rate, channels, mix_to)

    def feed(self, data: bytes) -> np.ndarray:
        data = self._carry + data
        usable = len(data) - len(data) % self._block
        self._carry = data[usable:]
        if usable == 0:
            return np.zeros((self._resampler.channels, 0), np.float32)
        samples = self._to_float(data[:usable])
        planar = samples.reshape(-1, self.channels).T
        return self._resampler.feed(planar)

    def flush(self) -> np.ndarray:
        self._carry = b""
        return self._resampler.flush()

    def _to_float(self, data: bytes) -> np.ndarray:
        if self.encoding == "pcm_s16le":
            return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
        if self.encoding == "pcm_f32le":
            samples = np.frombuffer(data, dtype="<f4").astype(np.float32)
            if not np.all(np.isfinite(samples)):  # before clipping, which would turn infinities into full scale
                raise InvalidAudio("pcm_f32le audio contains NaN or infinite samples")
            return np.clip(samples, -1.0, 1.0)
        if self.encoding == "mulaw":
            return mulaw_to_float(data)
        return alaw_to_float(data)


# A WAV header longer than this (metadata chunks before the samples) is left to PyAV.
WAV_HEADER_LIMIT = 1 << 16
# (format tag, bits per sample) of the WAV sample formats that are raw encodings here.
_WAV_ENCODINGS = {(1, 16): "pcm_s16le", (3, 32): "pcm_f32le", (6, 8): "alaw", (7, 8): "mulaw"}
_WAV_EXTENSIBLE = 0xFFFE
_WAV_UNSIZED = (0, 0xFFFFFFFF)  # data sizes a live writer puts before it knows the length


@dataclass(frozen=True)
class WavFormat:
    encoding: str  # one of PcmDecoder.WIDTH
    sample_rate: int
    channels: int
    data_bytes: int | None  # how many bytes of samples follow the header; None: up to the end


def wav_header(head: bytes) -> tuple[WavFormat | None, int] | None:
    """What the WAV header at the start of ``head`` says, once ``head`` holds all of it: the
    format and the header's length in bytes, or ``(None, 0)`` where PyAV is to read the stream
    (not RIFF/WAVE, another sample format, a header past :data:`WAV_HEADER_LIMIT`, a chunk
    it cannot skip). None while ``head`` ends inside the header."""
    if len(head) < 12:
        return None if b"RIFF"[: len(head)] == head[:4] else (None, 0)
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None, 0
    at, fmt = 12, None
    while at + 8 <= min(len(head), WAV_HEADER_LIMIT):
        tag, size = head[at : at + 4], struct.unpack_from("<I", head, at + 4)[0]
        if tag == b"data":
            if fmt is None:
                return None, 0
            return WavFormat(*fmt, data_bytes=None if size in _WAV_UNSIZED else size), at + 8
        end = at + 8 + size + (size & 1)  # chunks are padded to an even length
        if end > WAV_HEADER_LIMIT:
            return None, 0
        if end > len(head):
            return None
        if tag == b"fmt ":
            fmt = _wav_format(head[at + 8 : at + 8 + size])
            if fmt is None:
                return None, 0
        at = end
    return None if len(head) < WAV_HEADER_LIMIT else (None, 0)


def _wav_format(body: bytes) -> tuple[str, int, int] | None:
    """(encoding, rate, channels) of a ``fmt `` chunk whose samples are a raw encoding, else None."""
    if len(body) < 16:
        return None
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", body)
    if tag == _WAV_EXTENSIBLE and len(body) >= 26:
        tag = struct.unpack_from("<H", body, 24)[0]  # the sub-format GUID starts with the tag
    encoding = _WAV_ENCODINGS.get((tag, bits))
    return None if encoding is None else (encoding, rate, channels)


class _ByteQueue(io.RawIOBase):
    """A blocking, bounded file that PyAV reads while bytes are still arriving.

    End of input is sticky: once :meth:`readinto` has returned 0 it keeps
    returning 0, because demuxers read again after EOF and a second blocking
    wait there would hang the decoding thread.
    """

    def __init__(self, limit: int) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._limit = limit
        self._ended = False
        self._cond = threading.Condition()

    def readable(self) -> bool:
        return True

    def put(self, data: bytes) -> None:
        with self._cond:
            if self._ended or not data:  # an empty chunk would read as end of file
                return
            self._chunks.append(data)
            self._size += len(data)
            self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def discard(self) -> None:
        """End input and drop whatever is buffered (the session is going away)."""
        with self._cond:
            self._chunks.clear()
            self._size = 0
            self._ended = True
            self._cond.notify_all()

    @property
    def buffered(self) -> int:
        return self._size

    @property
    def exhausted(self) -> bool:
        """Input has ended and every byte has been read."""
        with self._cond:
            return self._ended and not self._chunks

    def has_room(self) -> bool:
        return self._size < self._limit

    def readinto(self, buffer) -> int:  # type: ignore[override]
        with self._cond:
            self._cond.wait_for(lambda: self._chunks or self._ended)
            if not self._chunks:
                return 0
            view = memoryview(buffer)
            n = 0
            while self._chunks and n < len(view):
                chunk = self._chunks[0]
                take = min(len(chunk), len(view) - n)
                view[n : n + take] = chunk[:take]
                n += take
                if take == len(chunk):
                    self._chunks.popleft()
                else:
                    self._chunks[0] = chunk[take:]
            self._size -= n
            self._cond.notify_all()
            return n


_NO_PROBE = {"probesize": "32", "analyzeduration": "0"}


class _Replayed(io.RawIOBase):
    """``head`` (bytes already read from ``rest``), then ``rest``: a file for PyAV."""

    def __init__(self, head: bytes, rest: io.RawIOBase) -> None:
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if not self._head:
            return self._rest.readinto(buffer)
        n = min(len(self._head), len(buffer))
        memoryview(buffer)[:n] = self._head[:n]
        self._head = self._head[n:]
        return n


class ContainerDecoder:
    """Incremental decoding of a compressed stream (ogg, webm, wav, mp3, flac).

    One thread calls :meth:`feed` (and :meth:`end` once); another iterates
    :meth:`frames`, which blocks for input and yields ``(channels, n)`` float32
    at 16 kHz until the input ends. ``channels`` is what the client asked
    for: 1 mixes every channel of the stream down; more must match the stream.
    Garbage raises :class:`InvalidAudio` from the iterator after yielding
    whatever decoded cleanly; a stream cut short at the end of the input
    just ends (what decoded is kept). Headers that claim an absurd rate or
    channel count, or name nothing decodable, are :class:`InvalidAudio`.
    """

    _FORMATS = {"ogg": "ogg", "webm": "webm", "wav": "wav", "mp3": "mp3", "flac": "flac", "auto": None}  # None: PyAV probes

    def __init__(self, encoding: str, channels: int, max_buffer_bytes: int = 4 << 20) -> None:
        self.encoding = encoding
        self.channels = channels
        self._input = _ByteQueue(max_buffer_bytes)
        self.received_bytes = 0

    def feed(self, data: bytes) -> None:
        self.received_bytes += len(data)
        self._input.put(data)

    def has_room(self) -> bool:
        return self._input.has_room()

    def end(self) -> None:
        self._input.end()

    def close(self) -> None:
        self._input.discard()

    def frames(self) -> Iterator[np.ndarray]:
        source: io.RawIOBase = self._input
        if self.encoding == "flac":
            yield from self._flac_samples(b"")
            return
        if self.encoding in ("wav", "auto"):  # auto: a Deepgram client's WAV, found by its first bytes
            head, wav, length = self._wav_header()
            if wav is not None:
                yield from self._wav_samples(wav, head[length:])
                return
            if self.encoding == "auto" and head.startswith(FLAC_MAGIC):
                yield from self._flac_samples(head)
                return
            source = _Replayed(head, self._input)
        fmt = self._FORMATS[self.encoding]
        try:
            # A named format needs no probing: without these limits FFmpeg reads ahead to find
            # stream details the decoders do not need (an MP3 stream's first 2 s were held back;
            # decoded the same either way). ``auto`` needs the probe to find the format.
            container = av.open(source, mode="r", format=fmt, options=_NO_PROBE if fmt else {})
        except _BAD_INPUT as exc:
            if self.received_bytes == 0:
                return  # the stream ended before any audio: nothing to decode
            what = "the audio as any container format (encoding=auto)" if self.encoding == "auto" else f"a {self.encoding} stream"
            raise InvalidAudio(f"could not read {what}: {getattr(exc, 'strerror', None) or 'unrecognised data'}") from None
        try:
            yield from self._decode(container)
        finally:
            container.close()

    def _wav_header(self) -> tuple[bytes, WavFormat | None, int]:
        """The stream's first bytes, up to the end of its WAV header (all of them when PyAV is to
        read it), and what :func:`wav_header` made of them."""
        head, buffer = bytearray(), bytearray(4096)
        while (parsed := wav_header(bytes(head))) is None:
            n = self._input.readinto(buffer)
            if n == 0:
                return bytes(head), None, 0
            head += buffer[:n]
        return bytes(head), *parsed

    def _wav_samples(self, wav: WavFormat, first: bytes) -> Iterator[np.ndarray]:
        """A WAV stream's samples (``first``, then the rest of the input), as :class:`PcmDecoder`
        decodes a raw stream, up to the data chunk's end if the header gave one."""
        self._check_layout(wav.channels, wav.sample_rate)
        decoder = PcmDecoder(wav.encoding, wav.sample_rate, wav.channels, mix_to=self.channels)
        left = wav.data_bytes
        for chunk in self._read(first):
            if left is not None:
                chunk, left = chunk[:left], left - min(left, len(chunk))
            if (out := decoder.feed(chunk)).shape[1]:
                yield out
            if left == 0:
                break
        if (out := decoder.flush()).shape[1]:
            yield out

    def _flac_samples(self, first: bytes) -> Iterator[np.ndarray]:
        """A FLAC stream (``first``, then the rest of the input), framed here (:class:`FlacFramer`:
        FFmpeg's parser held ten frames back) and decoded by FFmpeg's FLAC decoder."""
        framer, codec, out = FlacFramer(), None, _Resampled(self.channels)
        packets = (packet for chunk in self._read(first) for packet in framer.feed(chunk))
        for packet in packets:
            codec = codec or self._flac_codec(framer)
            yield from self._flac_decode(codec, packet, out)
        if rest := framer.end():
            codec = codec or self._flac_codec(framer)
            try:
                yield from self._flac_decode(codec, rest, out)
            except InvalidAudio:
                if not out.decoded:
                    raise  # else the stream was cut short: what decoded is kept
        if (tail := out.flush()).shape[1]:
            yield tail
        if not out.decoded and self.received_bytes > 0:
            raise InvalidAudio(f"no audio could be decoded from the {self.encoding} stream")

    def _flac_codec(self, framer: FlacFramer) -> av.CodecContext:
        assert framer.streaminfo is not None
        rate, channels = streaminfo_layout(framer.streaminfo)
        self._check_layout(channels, rate)
        codec = av.CodecContext.create("flac", "r")
        codec.extradata = framer.streaminfo
        return codec

    def _flac_decode(self, codec: av.CodecContext, packet: bytes, out: _Resampled) -> Iterator[np.ndarray]:
        try:
            frames = codec.decode(av.Packet(packet))
        except _BAD_INPUT as exc:
            raise _corrupt(self.encoding, exc) from None
        for frame in frames:
            if (audio := out.convert(frame)).shape[1]:
                yield audio

    def _read(self, first: bytes) -> Iterator[bytes]:
        """``first``, then the input as it arrives, until it ends."""
        if first:
            yield first
        buffer = bytearray(8192)
        while n := self._input.readinto(buffer):
            yield bytes(buffer[:n])

    def _check_layout(self, channels: int, rate: int) -> None:
        """InvalidAudio for a header's absurd rate or channel count; AudioFormatMismatch where the
        client asked for more than one channel and the stream has another number."""
        if channels == 0:
            raise InvalidAudio(f"the {self.encoding} stream's header names no codec or channel layout that can be decoded")
        if not MIN_CONTAINER_RATE <= rate <= MAX_CONTAINER_RATE:
            raise InvalidAudio(f"the {self.encoding} stream claims a sample rate of {rate} Hz; {MIN_CONTAINER_RATE}-{MAX_CONTAINER_RATE} Hz is accepted")
        if channels > MAX_CONTAINER_CHANNELS:
            raise InvalidAudio(f"the {self.encoding} stream has {channels} channels; at most {MAX_CONTAINER_CHANNELS} are accepted")
        if self.channels > 1 and channels != self.channels:
            raise AudioFormatMismatch(f"channels={self.channels} was requested but the {self.encoding} stream has {channels}")

    def _check_stream(self, stream: av.AudioStream) -> int:
        """The stream's channel count, once its header is known to be usable (else InvalidAudio)."""
        codec = stream.codec_context
        layout = getattr(codec, "layout", None) if codec is not None else None
        channels = (getattr(codec, "channels", 0) or (len(layout.channels) if layout is not None else 0)) if codec is not None else 0
        rate = (codec.sample_rate if codec is not None else 0) or 0
        self._check_layout(channels, rate)
        return channels

    def _decode(self, container) -> Iterator[np.ndarray]:
        if not container.streams.audio:
            raise InvalidAudio(f"the {self.encoding} stream has no audio track")
        stream = container.streams.audio[0]
        self._check_stream(stream)
        out = _Resampled(self.channels)
        try:
            for frame in container.decode(stream):
                if (audio := out.convert(frame)).shape[1]:
                    yield audio
            tail = out.flush()
        except _BAD_INPUT as exc:
            if out.decoded and self._input.exhausted:
                # The stream was cut short (a decoder says so; demuxers stop quietly): what
                # decoded is kept and the session ends as for any stream.
                return
            raise _corrupt(self.encoding, exc) from None
        if tail.shape[1]:
            yield tail
        if out.decoded == 0 and self.received_bytes > 0:
            raise InvalidAudio(f"no audio could be decoded from the {self.encoding} stream")


def _corrupt(encoding: str, exc: BaseException) -> InvalidAudio:
    return InvalidAudio(f"{encoding} stream is corrupt or truncated: {getattr(exc, 'strerror', None) or type(exc).__name__}")


class _Resampled:
    """Decoded frames in, 16 kHz float32 out: ``channels`` rows, the stream's, or mixed down as
    FFmpeg mixes a container's channels."""

    def __init__(self, channels: int) -> None:
        self.channels = channels
        self._swr = av.AudioResampler(format="flt", layout=layout_for(channels), rate=MODEL_RATE)
        self.decoded = 0  # samples decoded, at the stream's rate

    def convert(self, frame: av.AudioFrame) -> np.ndarray:
        frame.pts = None  # the resampler needs no timing; keep it from complaining about gaps
        self.decoded += frame.samples
        return to_planar(self._swr.resample(frame), self.channels)

    def flush(self) -> np.ndarray:
        return to_planar(self._swr.resample(None), self.channels)
