import numpy as np

from asr_server.audio.vad import FRAME_SAMPLES, VadGate, VadOptions

from ..harness import MANIFEST, load_mono


def scripted(pattern: str) -> VadGate:
    """A gate whose raw classifier answers from ``pattern`` ('1' voiced, '0' not)."""
    answers = iter(pattern)  # frames below are silent, so disable the energy floor
    return VadGate(VadOptions(window=5, threshold=3, min_rms_dbfs=float("-inf"), detector="webrtc"), classifier=lambda pcm: next(answers) == "1")


def speech_flags(gate: VadGate, n: int) -> str:
    frames = gate.feed(np.zeros(n * FRAME_SAMPLES, np.float32))
    return "".join("S" if f.speech else "." for f in frames)


def test_one_noisy_frame_does_not_start_speech():
    assert speech_flags(scripted("0001000000"), 10) == ".........."


def test_one_dropped_frame_does_not_end_speech():
    assert speech_flags(scripted("1111101111000000"), 16) == "..SSSSSSSSSS...."


def test_onset_points_back_to_first_voiced_frame():
    gate = scripted("0011100000")
    frames = gate.feed(np.zeros(10 * FRAME_SAMPLES, np.float32))
    first = next(f for f in frames if f.speech)
    assert first.onset == 2 * FRAME_SAMPLES


def test_frames_are_whole_and_positions_continuous():
    gate = VadGate()
    frames = gate.feed(np.zeros(1000, np.float32)) + gate.feed(np.zeros(1000, np.float32))
    assert [f.start for f in frames] == [0, 480, 960, 1440]
    assert all(len(f.samples) == FRAME_SAMPLES for f in frames)
    tail = gate.flush()
    assert len(tail) == 1 and tail[0].start == 1920


def test_real_speech_regions_match_the_fixture_spans():
    audio = load_mono("espeak_16k.wav")
    frames = VadGate().feed(audio)
    spans = MANIFEST["espeak_16k.wav"]["spans"][0]
    in_span = lambda t: any(s - 0.1 <= t <= e + 0.2 for s, e in spans)
    speech_times = [f.start / 16000 for f in frames if f.speech]
    outside = [t for t in speech_times if not in_span(t)]
    assert not outside, f"speech detected in silence at {outside[:5]}"
    for s, e in spans:  # most of every sentence is detected
        covered = sum(1 for t in speech_times if s <= t <= e) * 0.03
        assert covered > 0.6 * (e - s)


def test_silence_and_low_noise_are_not_speech():
    noise = (np.random.default_rng(3).standard_normal(16000 * 3) * 0.002).astype(np.float32)
    assert not any(f.speech for f in VadGate().feed(noise))


def test_telephone_streams_take_the_narrowband_thresholds():
    options = VadOptions()
    narrow = options.for_rate(8000)
    assert (narrow.speech_threshold, narrow.release_threshold) == (options.narrowband_speech_threshold, options.narrowband_release_threshold)
    assert narrow.speech_threshold < options.speech_threshold and narrow.detector == options.detector
    assert options.for_rate(16000) == options and options.for_rate(48000) == options
    assert options.for_rate(None) == options  # a container's rate is not known up front
