"""The learned voice-activity detector: streamed exactly, and not fooled by noise."""

import numpy as np
import pytest

from asr_server.audio.chunker import Chunker, EndReason, UtteranceEnded
from asr_server.audio.silero import WINDOW_SAMPLES, default_model
from asr_server.audio.vad import VadGate, VadOptions

from ..harness import MANIFEST, load_channels


def pink(n: int, seed: int) -> np.ndarray:
    """Unit-RMS 1/f noise (the spectrum of room noise and fans)."""
    spectrum = np.fft.rfft(np.random.default_rng(seed).standard_normal(n))
    spectrum[1:] /= np.sqrt(np.arange(1, len(spectrum)))
    noise = np.fft.irfft(spectrum, n)
    return (noise / np.sqrt(np.mean(noise**2))).astype(np.float32)


def librivox() -> tuple[np.ndarray, list[list[float]]]:
    return load_channels("librivox_16k.s16le")[0].astype(np.float32), MANIFEST["librivox_16k.s16le"]["spans"][0]


def endpoints(audio: np.ndarray, options: VadOptions) -> list[UtteranceEnded]:
    gate, chunker = VadGate(options), Chunker()
    events = []
    for i in range(0, len(audio), 320):  # 20 ms pieces, as a browser sends them
        events += chunker.feed(gate.feed(audio[i : i + 320]))
    return [e for e in events if isinstance(e, UtteranceEnded)]


def test_streaming_in_pieces_gives_the_probabilities_of_one_call():
    audio, _ = librivox()
    audio = audio[: 200 * WINDOW_SAMPLES]
    whole = default_model().stream().feed(audio)
    stream = default_model().stream()
    cuts = [0, 100, 613, 1500, 7000, 7001, 40000, len(audio)]
    pieces = np.concatenate([stream.feed(audio[a:b]) for a, b in zip(cuts, cuts[1:])])
    assert len(whole) == 200
    np.testing.assert_allclose(pieces, whole, atol=1e-5)


def test_each_sentence_gets_its_own_endpoint_under_noise_10_db_below_speech():
    audio, spans = librivox()
    level = float(np.sqrt(np.mean(np.concatenate([audio[int(a * 16000) : int(b * 16000)] for a, b in spans]) ** 2)))
    noisy = audio + pink(len(audio), 7) * level * 10 ** (-10 / 20)
    ended = endpoints(noisy, VadOptions())
    assert [e.reason for e in ended] == [EndReason.ENDPOINT] * len(spans)
    for event, (start, end) in zip(ended, spans):  # each utterance ends after its sentence, before the next
        assert end - 0.15 <= event.end / 16000 <= end + 0.6


def test_noise_alone_is_never_speech():
    noise = pink(16000 * 20, 3) * 0.03  # -30 dBFS of fan noise: loud enough for webrtcvad's energy floor
    frames = VadGate(VadOptions()).feed(noise)
    assert not any(f.speech for f in frames)


@pytest.mark.parametrize("kwargs", [dict(detector="neural"), dict(speech_threshold=0.3, release_threshold=0.5), dict(release_threshold=0.0)])
def test_bad_detector_options_are_refused(kwargs):
    with pytest.raises(ValueError):
        VadOptions(**kwargs)
