import threading

import numpy as np
import pytest

from asr_server.audio.decode import ContainerDecoder, FrameConverter, PcmDecoder, WavFormat, alaw_to_float, mulaw_to_float, wav_header
from asr_server.errors import AsrError, AudioFormatMismatch, InvalidAudio

from ..harness import FIXTURES, MANIFEST, wav_bytes


def decode_all(decoder: PcmDecoder, data: bytes, piece: int) -> np.ndarray:
    parts = [decoder.feed(data[i : i + piece]) for i in range(0, len(data), piece)]
    parts.append(decoder.flush())
    return np.concatenate(parts, axis=1)


def test_s16_at_16k_is_exact_and_split_anywhere():
    rng = np.random.default_rng(1)
    samples = rng.integers(-32768, 32767, 3200, dtype=np.int16)
    data = samples.astype("<i2").tobytes()
    for piece in (1, 3, 7, 640, len(data)):
        out = decode_all(PcmDecoder("pcm_s16le", 16000, 1), data, piece)
        np.testing.assert_allclose(out[0], samples / 32768.0, atol=1e-7)


def test_interleaved_channels_are_separated():
    left = np.full(1600, 0.25, np.float32)
    right = np.full(1600, -0.5, np.float32)
    data = np.stack([left, right], axis=1).astype("<f4").tobytes()
    out = decode_all(PcmDecoder("pcm_f32le", 16000, 2), data, 1001)
    assert out.shape == (2, 1600)
    np.testing.assert_allclose(out[0], 0.25)
    np.testing.assert_allclose(out[1], -0.5)


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 44100, 48000])
def test_resampling_keeps_duration_and_pitch(rate):
    t = np.arange(rate) / rate  # one second of a 440 Hz tone
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype("<f4")
    out = decode_all(PcmDecoder("pcm_f32le", rate, 1), tone.tobytes(), rate // 10 * 4)
    assert abs(out.shape[1] - 16000) <= 32
    spectrum = np.abs(np.fft.rfft(out[0][:16000]))
    assert abs(np.argmax(spectrum) * 16000 / 16000 - 440) <= 2


def test_g711_tables_match_reference_points():
    # ITU-T G.711: mu-law 0xFF and A-law 0xD5 are the smallest positive codes; 0x00 / 0x2A the largest negative.
    assert mulaw_to_float(b"\xff")[0] == 0.0
    assert mulaw_to_float(b"\x00")[0] == pytest.approx(-32124 / 32768)
    assert alaw_to_float(b"\xd5")[0] == pytest.approx(8 / 32768)
    assert alaw_to_float(b"\x2a")[0] == pytest.approx(-32256 / 32768)


def test_f32_nan_is_invalid_audio():
    with pytest.raises(InvalidAudio):
        PcmDecoder("pcm_f32le", 16000, 1).feed(np.array([0.1, np.nan], "<f4").tobytes())


def run_container(data: bytes, encoding: str, channels: int = 1, piece: int = 3000):
    decoder = ContainerDecoder(encoding, channels)

    def feed():
        for i in range(0, len(data), piece):
            decoder.feed(data[i : i + piece])
        decoder.end()

    feeder = threading.Thread(target=feed)
    feeder.start()
    out, error = [], None
    try:
        for chunk in decoder.frames():
            out.append(chunk)
    except AsrError as exc:
        error = exc
    feeder.join(5)
    audio = np.concatenate(out, axis=1) if out else np.zeros((channels, 0), np.float32)
    return audio, error


@pytest.mark.parametrize("name", ["librivox.ogg", "librivox.webm", "librivox.mp3", "librivox.flac", "librivox_16k.wav"])
def test_containers_decode_incrementally_to_full_length(name):
    audio, error = run_container((FIXTURES / name).read_bytes(), MANIFEST[name]["encoding"])
    assert error is None
    expected = (FIXTURES / "librivox_16k.s16le").stat().st_size // 2
    assert abs(audio.shape[1] - expected) < 16000 * 0.1
    assert np.abs(audio).max() > 0.1


@pytest.mark.parametrize("encoding", ["ogg", "webm", "wav", "mp3", "flac"])
def test_garbage_bytes_are_invalid_audio(encoding):
    data = np.random.default_rng(7).integers(0, 256, 20000, dtype=np.uint8).tobytes()
    _, error = run_container(data, encoding)
    assert isinstance(error, InvalidAudio)


@pytest.mark.parametrize("name", ["librivox.ogg", "librivox.webm", "librivox.mp3", "librivox.flac", "librivox_16k.wav"])
def test_a_stream_cut_short_yields_what_arrived_without_an_error(name):
    data = (FIXTURES / name).read_bytes()
    audio, error = run_container(data[: len(data) // 3], MANIFEST[name]["encoding"])
    assert error is None  # FLAC's decoder complained here: the session ended 1007 instead of 1000
    assert 5 * 16000 < audio.shape[1] < 15 * 16000


@pytest.mark.parametrize("channels", [1, 8])
def test_an_eight_channel_wav_decodes_instead_of_crashing_the_process(channels):
    """PyAV's planar to_ndarray on 8 planes took the whole server down (segfault)."""
    rng = np.random.default_rng(3)
    samples = (rng.standard_normal((16000, 8)) * 3000).astype("<i2")
    audio, error = run_container(wav_bytes(channels=8, data=samples.tobytes()), "wav", channels=channels)
    assert error is None and audio.shape == (channels, 16000)
    if channels == 8:
        np.testing.assert_allclose(audio[5], samples[:, 5] / 32768.0, atol=1e-4)  # channels stay apart


@pytest.mark.parametrize("rate", [8000, 11025, 44100])
def test_raw_audio_with_eight_channels_at_any_rate_decodes(rate):
    """from_ndarray on an 8-channel planar frame raised IndexError (internal_error on the wire)."""
    interleaved = np.tile(np.arange(8, dtype=np.float32) / 10, rate // 10)
    out = PcmDecoder("pcm_f32le", rate, 8).feed(interleaved.astype("<f4").tobytes())
    assert out.shape[0] == 8 and out.shape[1] > 0
    np.testing.assert_allclose(out[:, out.shape[1] // 2], np.arange(8) / 10, atol=1e-3)


@pytest.mark.parametrize(
    "header",
    [dict(bits=0), dict(fmt=0xFFFE), dict(fmt=3, bits=16), dict(rate=1), dict(rate=1_000_000), dict(channels=0), dict(channels=40)],
    ids=["bits0", "extensible-without-extension", "float-16bit", "1Hz", "1MHz", "no-channels", "40-channels"],
)
def test_crafted_wav_headers_are_invalid_audio(header):
    _, error = run_container(wav_bytes(**header), "wav")
    assert isinstance(error, InvalidAudio), error


def test_a_wav_stream_yields_its_samples_as_they_arrive():
    """FFmpeg's WAV demuxer reads 64 KB before its first packet: a 16 kHz stream's first 2 s
    (3.3 s measured through the server) were heard late. Read here, 0.25 s of samples give
    0.25 s of audio at once, while the stream goes on."""
    samples = (np.sin(np.arange(4000) / 5) * 8000).astype("<i2")
    decoder = ContainerDecoder("wav", 1)
    decoder.feed(wav_bytes(data=b"")[:-8] + b"data" + b"\xff\xff\xff\xff" + samples.tobytes())  # a live writer's unsized data
    heard: list[np.ndarray] = []

    def read() -> None:
        for chunk in decoder.frames():
            heard.append(chunk)
            if sum(c.shape[1] for c in heard) >= len(samples):
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)  # a bound for the failure only: the input has not ended, so the old decoder blocked for more
    decoder.end()
    assert heard, "nothing decoded before the stream went on"
    np.testing.assert_allclose(np.concatenate(heard, axis=1)[0], samples / 32768.0, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "encoding"),
    [("librivox.ogg", "ogg"), ("librivox.webm", "webm"), ("librivox.mp3", "mp3"), ("librivox.flac", "flac"), ("librivox_16k.wav", "wav"), ("librivox_16k.wav", "auto")],
)
def test_a_container_stream_yields_audio_before_its_first_two_seconds_are_in(name, encoding):
    """The first 1.5 s of the file (by its share of the bytes), the stream still open: some audio
    comes out. FFmpeg's probing held an MP3 stream's first 2.2 s and a WAV stream's first 3.3 s
    (a Deepgram client's WAV, whose format the server finds itself, too)."""
    data = (FIXTURES / name).read_bytes()
    seconds = (FIXTURES / "librivox_16k.s16le").stat().st_size / 32000
    decoder = ContainerDecoder(encoding, 1)
    decoder.feed(data[: int(len(data) * 1.5 / seconds)])
    heard: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: heard.append(next(decoder.frames())), daemon=True)
    reader.start()
    reader.join(60)  # a bound for the failure only
    decoder.end()
    assert heard and heard[0].shape[1] > 0


def _pyav_reference(data: bytes, channels: int) -> np.ndarray:
    """The file decoded by PyAV alone, resampled and mixed as the container path does."""
    import io

    import av

    with av.open(io.BytesIO(data), format="wav") as container:
        swr = av.AudioResampler(format="flt", layout="mono" if channels == 1 else "stereo", rate=16000)
        frames = [f for frame in container.decode(audio=0) for f in swr.resample(frame)] + swr.resample(None)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).reshape(-1, channels).T


@pytest.mark.parametrize(
    ("fmt", "bits", "rate", "source_channels", "channels", "dtype"),
    [(1, 16, 16000, 1, 1, "<i2"), (3, 32, 44100, 2, 1, "<f4"), (3, 32, 44100, 2, 2, "<f4"), (7, 8, 8000, 1, 1, "u1"), (6, 8, 8000, 1, 1, "u1")],
    ids=["s16-16k", "f32-44k-stereo-mixed", "f32-44k-stereo-apart", "mulaw-8k", "alaw-8k"],
)
def test_a_wav_stream_decodes_as_ffmpeg_decodes_it(fmt, bits, rate, source_channels, channels, dtype):
    rng = np.random.default_rng(5)
    if dtype == "u1":
        data = rng.integers(0, 256, rate, dtype=np.uint8).tobytes()
    elif dtype == "<f4":
        data = (rng.standard_normal((rate, source_channels)) * 0.2).astype(dtype).tobytes()
    else:
        data = (rng.standard_normal(rate) * 3000).astype(dtype).tobytes()
    wav = wav_bytes(fmt=fmt, channels=source_channels, rate=rate, bits=bits, data=data)
    audio, error = run_container(wav, "wav", channels=channels, piece=777)
    assert error is None
    expected = _pyav_reference(wav, channels)
    assert audio.shape == expected.shape
    np.testing.assert_allclose(audio, expected, atol=1e-6)


def test_a_wav_of_another_sample_format_is_left_to_ffmpeg():
    """24-bit samples are no raw encoding here: FFmpeg reads the stream, header and all."""
    samples = (np.sin(np.arange(16000) / 7) * 2**22).astype(np.int32)
    packed = b"".join(int(v).to_bytes(4, "little", signed=True)[:3] for v in samples)
    audio, error = run_container(wav_bytes(bits=24, data=packed), "wav")
    assert error is None and audio.shape == (1, 16000)
    np.testing.assert_allclose(audio[0], samples / 2**23, atol=1e-4)


def test_a_wav_data_chunk_ends_where_its_size_says():
    """A chunk after the samples (a LIST of tags, as editors write) is not audio."""
    samples = np.full(8000, 1000, "<i2").tobytes()
    tags = b"LIST" + (20).to_bytes(4, "little") + b"INFOISFT" + (8).to_bytes(4, "little") + b"abcdefgh"
    whole = wav_bytes(data=samples)
    audio, error = run_container(whole + tags, "wav")
    assert error is None and audio.shape == (1, 8000)


def test_a_wav_whose_header_runs_past_the_limit_is_left_to_ffmpeg_and_decodes():
    """Metadata over 64 KB before the samples: the server stops reading the header (it holds no
    more than that) and FFmpeg gets every byte, the ones already read included."""
    samples = (np.sin(np.arange(8000) / 5) * 8000).astype("<i2")
    junk = b"junk" + (70000).to_bytes(4, "little") + bytes(70000)
    wav = wav_bytes(data=samples.tobytes())
    audio, error = run_container(wav[:36] + junk + wav[36:], "wav")
    assert error is None and audio.shape == (1, 8000)
    np.testing.assert_allclose(audio[0], samples / 32768.0, atol=1e-4)


def test_a_wav_header_is_read_once_all_of_it_has_come():
    data = np.zeros(100, "<i2").tobytes()
    tags = b"LIST" + (5).to_bytes(4, "little") + b"abcde" + b"\0"  # an odd size: padded to even
    wav = wav_bytes(data=data)
    wav = wav[:36] + tags + wav[36:]  # between the fmt chunk and the data chunk
    header = len(wav) - len(data)
    for cut in range(header):
        assert wav_header(wav[:cut]) is None, cut
    assert wav_header(wav) == (WavFormat("pcm_s16le", 16000, 1, len(data)), header)
    assert wav_header(b"OggS" + wav[4:]) == (None, 0)  # not RIFF: FFmpeg reads it
    assert wav_header(wav_bytes(bits=24)) == (None, 0)


def test_f32_infinities_are_refused_not_clipped():
    with pytest.raises(InvalidAudio):
        PcmDecoder("pcm_f32le", 16000, 1).feed(np.array([0.1, np.inf], "<f4").tobytes())


@pytest.mark.parametrize("name", ["librivox.ogg", "librivox.webm", "librivox.mp3", "librivox.flac", "librivox_16k.wav"])
def test_fuzzed_containers_decode_or_fail_with_a_client_error(name):
    """Bounded mutation fuzzing of real files (header bytes flipped, spans zeroed or cut): every
    outcome is audio of the right shape, or InvalidAudio/AudioFormatMismatch; never another exception.
    ``python tools/fuzz_decode.py`` runs the same with many more cases."""
    from tools.fuzz_decode import mutations

    data = (FIXTURES / name).read_bytes()[:48000]
    for case in mutations(data, seed=11, count=25):
        audio, error = run_container(case, MANIFEST[name]["encoding"])
        assert error is None or isinstance(error, (InvalidAudio, AudioFormatMismatch))
        assert audio.ndim == 2 and audio.shape[0] == 1 and np.all(np.isfinite(audio))


def test_container_channel_mismatch_is_refused():
    _, error = run_container((FIXTURES / "librivox.ogg").read_bytes(), "ogg", channels=2)
    assert isinstance(error, AudioFormatMismatch)


def test_empty_container_stream_is_not_an_error():
    audio, error = run_container(b"", "ogg")
    assert error is None and audio.shape[1] == 0


def test_empty_frames_in_a_container_stream_are_harmless():
    data = (FIXTURES / "librivox.ogg").read_bytes()
    decoder = ContainerDecoder("ogg", 1)

    def feed():
        import time

        for i in range(0, len(data), 5000):
            decoder.feed(b"")
            time.sleep(0.002)  # let the decoder wake up on the empty frame alone
            decoder.feed(data[i : i + 5000])
        decoder.end()

    feeder = threading.Thread(target=feed)
    feeder.start()
    total = sum(chunk.shape[1] for chunk in decoder.frames())
    feeder.join(5)
    assert total > 29 * 16000


def _frames(left: np.ndarray, right: np.ndarray | None, rate: int = 48000, block: int = 960):
    import av

    for i in range(0, len(left) - block + 1, block):
        rows = [left[i:i + block]] if right is None else [left[i:i + block], right[i:i + block]]
        interleaved = np.stack(rows).T.reshape(1, -1).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(interleaved, format="s16", layout="mono" if right is None else "stereo")
        frame.sample_rate = rate
        yield frame


def test_webrtc_frames_become_16k_audio_mixed_or_kept_apart():
    t = np.arange(48000) / 48000
    left = (0.5 * 32767 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)
    right = (0.2 * 32767 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)
    mono = FrameConverter(1)
    out = np.concatenate([mono.convert(f) for f in _frames(left, right)], axis=1)
    assert out.shape[0] == 1 and abs(out.shape[1] - 16000) < 100  # one second at 16 kHz (the resampler holds a few samples)
    assert abs(np.abs(out[0, 1000:]).max() - 0.35) < 0.01  # the average of the two channels, not their sum
    stereo = FrameConverter(2)
    both = np.concatenate([stereo.convert(f) for f in _frames(left, right)], axis=1)
    assert both.shape[0] == 2 and abs(both.shape[1] - 16000) < 100
    assert abs(np.abs(both[0, 1000:]).max() - 0.5) < 0.01 and abs(np.abs(both[1, 1000:]).max() - 0.2) < 0.01
    # A mono track (PCMU from a gateway, at 8 kHz) is copied to both channels when two are asked for.
    from_mono = FrameConverter(2)
    pcmu = np.concatenate([from_mono.convert(f) for f in _frames(left[:8000], None, rate=8000, block=160)], axis=1)
    assert pcmu.shape[0] == 2 and np.allclose(pcmu[0], pcmu[1]) and abs(pcmu.shape[1] - 16000) < 100
