"""FLAC is framed by the server (asr_server/audio/flac.py) and decoded by FFmpeg's FLAC decoder:
the same samples as FFmpeg's own demuxer gives, each frame as soon as the next one's header is in."""

import io
import threading

import av
import numpy as np
import pytest

from asr_server.audio.decode import ContainerDecoder
from asr_server.audio.flac import FlacFramer, streaminfo_layout
from asr_server.errors import AudioFormatMismatch, InvalidAudio

from ..harness import FIXTURES
from .test_decode import run_container


def flac_bytes(samples: np.ndarray, rate: int) -> bytes:
    """``samples`` (frames x channels, int16) encoded as a FLAC file by FFmpeg's encoder."""
    out = io.BytesIO()
    with av.open(out, "w", format="flac") as container:
        stream = container.add_stream("flac", rate=rate, layout="mono" if samples.shape[1] == 1 else "stereo")
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples.reshape(1, -1)), format="s16", layout=stream.layout.name)
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return out.getvalue()


def ffmpeg_decode(data: bytes, channels: int) -> np.ndarray:
    """The file as FFmpeg's demuxer and decoder give it, resampled and mixed as the server does."""
    with av.open(io.BytesIO(data), format="flac") as container:
        swr = av.AudioResampler(format="flt", layout="mono" if channels == 1 else "stereo", rate=16000)
        frames = [f for frame in container.decode(audio=0) for f in swr.resample(frame)] + swr.resample(None)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).reshape(-1, channels).T


def _tone(rate: int, channels: int, seconds: float = 2.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    rows = [np.sin(2 * np.pi * (300 + 200 * c) * t) * (6000 + 3000 * c) for c in range(channels)]
    return np.stack(rows, axis=1).astype(np.int16)


@pytest.mark.parametrize(
    ("rate", "source_channels", "channels"), [(16000, 1, 1), (44100, 2, 1), (44100, 2, 2), (8000, 1, 1)],
    ids=["16k-mono", "44k-stereo-mixed", "44k-stereo-apart", "8k-mono"],
)
@pytest.mark.parametrize("encoding", ["flac", "auto"])
def test_a_flac_stream_decodes_as_ffmpeg_decodes_it(rate, source_channels, channels, encoding):
    data = flac_bytes(_tone(rate, source_channels), rate)
    audio, error = run_container(data, encoding, channels=channels, piece=333)
    assert error is None
    np.testing.assert_array_equal(audio, ffmpeg_decode(data, channels))


def test_the_fixture_decodes_sample_for_sample_as_ffmpeg_decodes_it():
    data = (FIXTURES / "librivox.flac").read_bytes()
    audio, error = run_container(data, "flac", piece=997)
    assert error is None
    np.testing.assert_array_equal(audio, ffmpeg_decode(data, 1))


def test_frames_come_whole_however_the_bytes_are_cut_and_as_soon_as_the_next_header_is_in():
    data = (FIXTURES / "librivox.flac").read_bytes()
    whole = FlacFramer()
    frames = whole.feed(data)
    last = whole.end()
    assert streaminfo_layout(whole.streaminfo) == (16000, 1)
    assert len(frames) > 100 and all(f[:2] == b"\xff\xf8" for f in [*frames, last])
    pieces = FlacFramer()
    got = [f for i in range(0, len(data), 101) for f in pieces.feed(data[i : i + 101])]
    assert got == frames and pieces.end() == last
    # Frame k is out once frame k+1's header (at most 16 bytes) is in, not ten frames later.
    metadata = len(data) - sum(map(len, frames)) - len(last)
    upto = metadata + sum(map(len, frames[:5])) + 16
    assert FlacFramer().feed(data[:upto]) == frames[:5]


def test_a_flac_stream_yields_its_first_frames_while_the_stream_goes_on():
    """FFmpeg's parser held ten frames back (0.6-1.4 s of a 16 kHz stream): the first 0.3 s of
    frames gave no audio at all until more came."""
    data = (FIXTURES / "librivox.flac").read_bytes()
    framer = FlacFramer()
    frames = framer.feed(data)
    metadata = len(data) - sum(map(len, frames)) - len(framer.end())
    decoder = ContainerDecoder("flac", 1)
    decoder.feed(data[: metadata + sum(map(len, frames[:5])) + 16])  # five frames (0.36 s) and a header
    heard: list[np.ndarray] = []

    def read() -> None:
        for chunk in decoder.frames():
            heard.append(chunk)
            if sum(c.shape[1] for c in heard) >= 5 * 1152:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)  # a bound for the failure only: the input has not ended
    decoder.end()
    assert sum(c.shape[1] for c in heard) >= 5 * 1152


def _with_streaminfo(data: bytes, rate: int | None = None, channels: int | None = None) -> bytes:
    info = bytearray(data[8:42])
    packed = int.from_bytes(info[10:13], "big")
    if rate is not None:
        packed = (packed & 0xF) | (rate << 4)
    if channels is not None:
        packed = (packed & ~0xE) | ((channels - 1) << 1)
    info[10:13] = packed.to_bytes(3, "big")
    return data[:8] + bytes(info) + data[42:]


def test_bad_flac_streams_are_invalid_audio_or_a_format_mismatch_after_what_decoded():
    data = flac_bytes(_tone(16000, 1), 16000)
    assert isinstance(run_container(b"OggS" + data[4:], "flac")[1], InvalidAudio)  # not FLAC at all
    _, error = run_container(_with_streaminfo(data, rate=1), "flac")
    assert isinstance(error, InvalidAudio) and "1 Hz" in str(error)
    assert isinstance(run_container(data, "flac", channels=2)[1], AudioFormatMismatch)  # mono, and two asked for
    # Metadata, then no frame: nothing decodes. (Garbage between two frames decodes as FFmpeg's
    # own demuxer did: the frame before it is whole, the decoder ignores its trailing bytes.)
    framer = FlacFramer()
    frames = framer.feed(data)
    metadata = len(data) - sum(map(len, frames)) - len(framer.end())
    noise = np.random.default_rng(7).integers(0, 256, 20000, dtype=np.uint8).tobytes()
    audio, error = run_container(data[:metadata] + noise, "flac")
    assert isinstance(error, InvalidAudio) and audio.shape[1] == 0
