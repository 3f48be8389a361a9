from dataclasses import replace

import numpy as np

from asr_server.audio.chunker import Chunker, EndReason, UtteranceEnded
from asr_server.audio.vad import FRAME_SAMPLES, TalkerLevel, VadGate, VadOptions

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


def tone(seconds: float, dbfs: float) -> np.ndarray:
    t = np.arange(int(seconds * 16000)) / 16000
    return (np.sin(2 * np.pi * 220 * t) * np.sqrt(2) * 10 ** (dbfs / 20)).astype(np.float32)


def voiced_flags(options: VadOptions, audio: np.ndarray) -> str:
    """Speech flags of ``audio`` through a gate whose detector calls every frame voiced."""
    gate = VadGate(options, classifier=lambda pcm: True)
    return "".join("S" if f.speech else "." for f in gate.feed(audio))


EVERY_FRAME = VadOptions(detector="webrtc", window=5, threshold=3, talker_hold_ms=0)


def test_a_voice_far_below_the_talker_does_not_hold_speech_open():
    # A talker at -12 dBFS, then only a voice 25 dB under them (a television, a neighbour's call):
    # a detector rightly hears speech, but the talker's pause must still come.
    audio = np.concatenate([tone(1.0, -12), tone(1.5, -37)])
    flags = voiced_flags(EVERY_FRAME, audio)
    assert flags[:33].count("S") >= 30
    assert flags[-40:] == "." * 40
    assert voiced_flags(replace(EVERY_FRAME, talker_floor_db=0), audio)[-40:] == "S" * 40  # the gate off: held open


def test_speech_within_the_floor_keeps_going():
    # Syllables vary: a talker 12 dB quieter for a while is still the talker.
    audio = np.concatenate([tone(1.0, -12), tone(1.0, -24), tone(0.5, -14)])
    flags = voiced_flags(EVERY_FRAME, audio)
    assert "." not in flags[3:]


def test_a_quieter_talker_is_heard_once_the_window_has_passed():
    # The level is set by the last talker_window_s of speech: someone quieter who talks on after the
    # loud talker stopped is heard again once the window has passed.
    options = replace(EVERY_FRAME, talker_window_s=1.0)
    audio = np.concatenate([tone(1.0, -12), tone(2.5, -40)])
    flags = voiced_flags(options, audio)
    quiet = flags[37:]  # past the vote's few frames of lag
    assert quiet[:20] == "." * 20
    assert quiet[-30:] == "S" * 30


def test_the_first_frames_set_the_level():
    level = TalkerLevel(window=100, floor_db=20, warmup=3)
    assert [level.hears(i, -60.0 + i, True) for i in range(3)] == [True, True, True]  # no level yet: every frame passes
    assert level.level is not None and -59.0 < level.level < -57.0
    assert level.hears(3, -70.0, True) is True  # within 20 dB of about -58
    assert level.hears(4, -90.0, True) is False
    assert level.hears(5, -50.0, False) is False  # what the detector did not call speech never is


def test_a_short_dip_under_the_floor_stays_speech():
    # A pause inside a sentence, or a soft last syllable, shorter than the hold: as the detector heard it.
    options = replace(EVERY_FRAME, talker_hold_ms=150)
    dip = np.concatenate([tone(1.0, -12), tone(0.12, -40), tone(0.5, -12)])
    assert "." not in voiced_flags(options, dip)[3:]
    long_dip = np.concatenate([tone(1.0, -12), tone(0.6, -40), tone(0.5, -12)])
    flags = voiced_flags(options, long_dip)
    assert "." not in flags[3:38] and flags[43:50] == "." * 7  # held 5 frames (150 ms), then not speech


def test_sentences_end_under_other_voices_20_db_down():
    # Read sentences with another recording played backwards 20 dB under them (speech to Silero, no
    # words): each sentence's pause still ends an utterance near the end of that sentence.
    name = "librivox_16k.s16le"
    audio, spans = load_mono(name), MANIFEST[name]["spans"][0]
    other = np.resize(load_mono("ljspeech_babylon_16k.s16le")[::-1], len(audio))
    level = np.sqrt(np.mean(np.concatenate([audio[int(a * 16000) : int(b * 16000)] for a, b in spans]) ** 2))
    heard = (audio + other / np.sqrt(np.mean(other**2)) * level * 10 ** (-20 / 20)).astype(np.float32)
    assert_each_sentence_ends_an_utterance(heard, spans, early_s=0.3)


def assert_each_sentence_ends_an_utterance(audio: np.ndarray, spans: list[list[float]], early_s: float) -> None:
    """Through the default gate and chunker, each sentence (``spans``, s) has an endpoint of its own:
    one from ``early_s`` before its end to the start of the next sentence."""
    chunker = Chunker()
    ends = [e.end / 16000 for e in chunker.feed(VadGate().feed(audio)) if isinstance(e, UtteranceEnded) and e.reason is EndReason.ENDPOINT]
    for i, (_, end) in enumerate(spans):
        following = spans[i + 1][0] if i + 1 < len(spans) else float("inf")
        assert any(end - early_s <= t < following for t in ends), f"sentence {i} (ends {end} s) got no endpoint of its own: {ends}"


def test_a_quiet_talker_is_heard_sentence_by_sentence():
    # Read sentences 35 dB quieter than recorded, in 16-bit samples: speech at about -59 dBFS, as a
    # laptop's microphone at low gain or a far talker delivers it. Every sentence is speech and ends
    # an utterance of its own near its end, its last word not cut off (a -50 dBFS floor lost most of them).
    name = "librivox_16k.s16le"
    audio, spans = load_mono(name), MANIFEST[name]["spans"][0]
    quiet = (np.round(audio * 10 ** (-35 / 20) * 32767) / 32767).astype(np.float32)
    assert_each_sentence_ends_an_utterance(quiet, spans, early_s=0.1)


def test_frames_far_below_the_talker_are_silence_even_within_the_hold():
    # The talker's level sets an energy floor talker_silence_db (35 dB) under it, with no hold: a
    # room's reverberant tail or room tone ends the utterance there, whatever a detector says.
    options = replace(EVERY_FRAME, talker_hold_ms=150)
    dip = np.concatenate([tone(1.0, -12), tone(0.15, -50), tone(0.5, -12)])
    assert "." in voiced_flags(options, dip)[33:40]
    assert "." not in voiced_flags(replace(options, talker_silence_db=0), dip)[3:]  # the floor off: held


def test_a_loud_burst_inside_speech_does_not_shut_the_talker_out():
    # A talker at -45 dBFS with a 0.3 s burst at -6 dBFS (a cough, a knock near the microphone) every
    # 1.5 s, which the detector hears as part of the speech. The bursts are a fifth of the frames: the
    # level must stay the talker's, or the floors under it shut the talker out after the first burst.
    talk = [tone(1.0, -45)]
    for _ in range(4):
        talk += [tone(0.3, -6), tone(1.2, -45)]
    flags = voiced_flags(EVERY_FRAME, np.concatenate(talk))
    for k in range(4):
        after = 33 + k * 50 + 10  # the talker's 1.2 s after the k-th burst
        assert flags[after + 5 : after + 40] == "S" * 35, f"the talker after burst {k}: {flags}"
    # A talker who gets louder and stays so still sets the level: a burst is loud for a moment only.
    level = TalkerLevel(window=333, floor_db=20)
    for i in range(133):
        level.hears(i, -45.0 if i < 33 else -20.0, True)
    assert level.level is not None and abs(level.level - -20.0) < 0.5


def test_a_quiet_talker_with_loud_coughs_is_heard_sentence_by_sentence():
    # Read sentences 30 dB quieter than recorded (about -52 dBFS) with a 0.3 s noise burst at -12 dBFS,
    # 40 dB over the speech, every 5.3 s, several inside sentences (to Silero, part of the speech):
    # every sentence still ends an utterance of its own. (When the bursts set the talker's level,
    # the floors under it left about 3 s of the 21 s of speech.)
    name = "librivox_16k.s16le"
    audio, spans = load_mono(name), MANIFEST[name]["spans"][0]
    quiet = np.round(audio * 10 ** (-30 / 20) * 32767) / 32767
    burst, rng = int(0.3 * 16000), np.random.default_rng(3)
    for at in range(int(2.5 * 16000), len(audio) - burst, int(5.3 * 16000)):
        quiet[at : at + burst] += rng.standard_normal(burst) * np.hanning(burst) * 10 ** (-12 / 20) * 2
    assert_each_sentence_ends_an_utterance(np.clip(quiet, -1, 1).astype(np.float32), spans, early_s=0.3)
