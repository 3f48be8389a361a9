import numpy as np
import pytest

from asr_server.audio.chunker import (
    Chunker,
    ChunkerOptions,
    EndReason,
    UtteranceAudio,
    UtteranceEnded,
    UtterancePaused,
    UtteranceStarted,
)
from asr_server.audio.vad import FRAME_SAMPLES, VadFrame


def frames(pattern: str, start: int = 0, level: float = 0.1, quiet_at: set[int] = frozenset(), silence: float = 0.001,
           learned: bool = False):
    """VadFrames from a pattern of 'S' (speech) and '.' (silence, at ``silence``), 30 ms each; with
    ``learned``, the learned detector's own calls too (speech on 'S'), and 'd' is a frame the vote
    still calls speech that the detector did not (at ``silence`` as well)."""
    out = []
    for i, ch in enumerate(pattern):
        amp = silence if (ch in ".d" or (start + i) in quiet_at) else level
        out.append(VadFrame((start + i) * FRAME_SAMPLES, np.full(FRAME_SAMPLES, amp, np.float32), ch in "Sd", rms=amp,
                            learned=(ch == "S") if learned else None))
    return out


def kinds(events):
    return [type(e).__name__ for e in events if not isinstance(e, UtteranceAudio)]


def test_endpoint_after_trailing_silence_with_pause_first():
    c = Chunker(ChunkerOptions(endpoint_ms=300, tail_ms=120, preroll_ms=90))
    events = c.feed(frames("...SSSS" + "." * 12))
    assert kinds(events) == ["UtteranceStarted", "UtterancePaused", "UtteranceEnded"]
    started = events[0]
    assert isinstance(started, UtteranceStarted) and started.start == 0 and started.speech_at == 3 * FRAME_SAMPLES
    paused = next(e for e in events if isinstance(e, UtterancePaused))
    ended = next(e for e in events if isinstance(e, UtteranceEnded))
    speech_end = 7 * FRAME_SAMPLES
    assert paused.end == ended.end == speech_end + 120 * 16
    assert ended.reason is EndReason.ENDPOINT


def test_audio_is_contiguous_and_covers_preroll():
    c = Chunker(ChunkerOptions(preroll_ms=60))
    events = c.feed(frames(".....SSS"))
    audio = [e for e in events if isinstance(e, UtteranceAudio)]
    assert sum(len(a.samples) for a in audio) == 5 * FRAME_SAMPLES  # 2 preroll + 3 speech
    assert sum(a.voiced for a in audio) == 3 * FRAME_SAMPLES


def test_short_pause_does_not_end_utterance():
    c = Chunker(ChunkerOptions(endpoint_ms=500))
    events = c.feed(frames("SSSS" + "." * 10 + "SSSS"))
    assert kinds(events) == ["UtteranceStarted", "UtterancePaused"]
    assert c.in_speech


def test_finalize_and_end_of_stream_close_the_open_utterance():
    c = Chunker()
    c.feed(frames("SSSS"))
    (ended,) = c.end(EndReason.FINALIZE)
    assert ended.reason is EndReason.FINALIZE and ended.end == 4 * FRAME_SAMPLES
    assert c.end(EndReason.END_OF_STREAM) == []
    events = c.feed(frames("SS", start=4))
    assert isinstance(events[0], UtteranceStarted) and events[0].utterance == 1


def test_max_length_cuts_at_the_quietest_recent_frame():
    opts = ChunkerOptions(max_utterance_s=3.0, cut_search_fraction=0.3)
    c = Chunker(opts)
    n = int(3.0 * 16000 / FRAME_SAMPLES) + 1
    events = c.feed(frames("S" * n, quiet_at={90}))
    ends = [e for e in events if isinstance(e, UtteranceEnded)]
    assert len(ends) == 1 and ends[0].reason is EndReason.MAX_LENGTH
    assert ends[0].end == 90 * FRAME_SAMPLES
    cont = [e for e in events if isinstance(e, UtteranceStarted) and e.continuation]
    assert cont and cont[0].start == ends[0].end and cont[0].utterance == 1


@pytest.mark.parametrize("seconds", [25, 61])
def test_long_speech_without_pauses_stays_bounded(seconds):
    c = Chunker(ChunkerOptions(max_utterance_s=20.0))
    n = seconds * 16000 // FRAME_SAMPLES
    events = c.feed(frames("S" * n))
    starts = [e.start for e in events if isinstance(e, UtteranceStarted)]
    ends = [e for e in events if isinstance(e, UtteranceEnded)]
    assert len(ends) == seconds // 20
    lengths = [e.end - s for s, e in zip(starts, ends)]
    assert all(length <= 20 * 16000 for length in lengths)


def test_max_length_prefers_the_middle_of_a_pause():
    c = Chunker(ChunkerOptions(max_utterance_s=3.0, endpoint_ms=1000))
    n = int(3.0 * 16000 / FRAME_SAMPLES) + 1
    pattern = "S" * 70 + "." * 10 + "S" * (n - 80)  # a 300 ms pause at frames 70-79
    events = c.feed(frames(pattern, quiet_at={95}))
    (end,) = [e for e in events if isinstance(e, UtteranceEnded)]
    assert end.end == 75 * FRAME_SAMPLES


def test_a_long_utterance_ends_at_a_shorter_pause():
    """Continuous reading: past long_utterance_s, a pause of long_endpoint_ms ends the utterance."""
    options = ChunkerOptions(endpoint_ms=500, long_utterance_s=3.0, long_endpoint_ms=240)
    pause = "." * 9  # 270 ms: short of the endpoint, longer than the long-utterance one
    early = Chunker(options).feed(frames("S" * 40 + pause + "SSSS"))  # 1.2 s of speech: goes on
    assert "UtteranceEnded" not in kinds(early)
    late = Chunker(options).feed(frames("S" * 110 + pause + "SSSS"))  # 3.3 s: ends at the pause
    ended = [e for e in late if isinstance(e, UtteranceEnded)]
    assert [e.reason for e in ended] == [EndReason.ENDPOINT]
    assert ended[0].end == 110 * FRAME_SAMPLES + options.tail_samples
    assert kinds(late)[-2:] == ["UtteranceEnded", "UtteranceStarted"]  # the next sentence opens a new one


def test_an_endpoint_shorter_than_the_long_one_is_kept():
    options = ChunkerOptions(endpoint_ms=150, tail_ms=60, long_utterance_s=1.0, long_endpoint_ms=240)
    assert options.endpoint_after(10 * 16000) == options.endpoint_after(0) == 150 * 16


def test_a_split_ends_the_utterance_at_the_quietest_frame_of_the_span_and_continues_it():
    c = Chunker()
    c.feed(frames("S" * 100, quiet_at={61}))
    # The span holds frames 55-70 (the caller's guess at where a sentence ended): frame 61 is quietest.
    events = c.split(0, 55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES)
    assert [type(e) for e in events] == [UtteranceEnded, UtteranceStarted]
    ended, started = events
    assert ended.utterance == 0 and ended.end == 61 * FRAME_SAMPLES and ended.reason is EndReason.SENTENCE
    assert started.utterance == 1 and started.start == started.speech_at == ended.end and started.continuation
    assert started.talk_start == 0  # the talking it continues began with the stream
    # The continuation goes on as any utterance: more speech, then the endpoint ends it.
    later = c.feed(frames("SSSS" + "." * 20, start=100))
    assert [e.utterance for e in later if isinstance(e, UtteranceEnded)] == [1]


def test_a_split_that_is_stale_or_finds_no_frame_does_nothing():
    c = Chunker()
    c.feed(frames("S" * 50))
    assert c.split(1, 0, 40 * FRAME_SAMPLES) == []  # not the open utterance
    assert c.split(0, 60 * FRAME_SAMPLES, 70 * FRAME_SAMPLES) == []  # past the audio: no speech after it
    assert c.split(0, 0, 0) == []  # the utterance's first frame: nothing before the cut
    c.feed(frames("." * 30, start=50))  # the endpoint closed it
    assert c.split(0, 10 * FRAME_SAMPLES, 40 * FRAME_SAMPLES) == []


def test_the_shorter_pause_of_continuous_speech_counts_across_a_split():
    """A continuation after a sentence split is still continuous speech: past long_utterance_s of
    talking, the long-utterance pause ends it, however short the continuation is."""
    options = ChunkerOptions(endpoint_ms=500, long_utterance_s=3.0, long_endpoint_ms=240)
    c = Chunker(options)
    c.feed(frames("S" * 100, quiet_at={90}))
    assert [type(e) for e in c.split(0, 85 * FRAME_SAMPLES, 95 * FRAME_SAMPLES)] == [UtteranceEnded, UtteranceStarted]
    late = c.feed(frames("S" * 20 + "." * 9 + "SSSS", start=100))  # the continuation is 1 s long, the talk 3.6 s
    assert [(e.utterance, e.reason) for e in late if isinstance(e, UtteranceEnded)] == [(1, EndReason.ENDPOINT)]


@pytest.mark.parametrize(("between", "ends_at_short_pause"), [(20, True), (40, False)])
def test_the_talking_goes_on_across_a_pause_that_ended_an_utterance_if_it_was_short(between, ends_at_short_pause):
    """Reading aloud: a 0.6 s pause ends a sentence, the next one runs 1.2 s and pauses 0.27 s.
    The talking began 3.6 s before: that pause ends it too. After a 1.2 s pause (over
    talk_pause_ms) the talking begins again, and the short pause does not end it."""
    options = ChunkerOptions(endpoint_ms=500, long_utterance_s=3.0, long_endpoint_ms=240, talk_pause_ms=1000)
    c = Chunker(options)
    first = c.feed(frames("S" * 60 + "." * between))
    assert [e.reason for e in first if isinstance(e, UtteranceEnded)] == [EndReason.ENDPOINT]
    later = c.feed(frames("S" * 40 + "." * 9 + "SSSS", start=60 + between))
    assert [e.utterance for e in later if isinstance(e, UtteranceEnded)] == ([1] if ends_at_short_pause else [])
    (started,) = [e for e in later if isinstance(e, UtteranceStarted) and e.utterance == 1]
    assert started.talk_start == (0 if ends_at_short_pause else started.start)  # what the decoder's splits count from


def test_a_split_cuts_in_the_middle_of_the_quiet_stretch():
    c = Chunker()
    c.feed(frames("S" * 100, quiet_at={58, 59, 60, 61, 62, 63, 64, 80}))
    (ended, _) = c.split(0, 50 * FRAME_SAMPLES, 75 * FRAME_SAMPLES)
    assert ended.end == 61 * FRAME_SAMPLES  # not at the stretch's first or last frame: each side keeps some pause


def test_a_split_that_needs_a_pause_cuts_only_where_the_vad_heard_one_or_the_energy_fell_as_far():
    for quiet in (0.05, 0.01):  # 6 and 20 dB down, and the VAD called it speech: no pause
        c = Chunker()
        c.feed([*frames("S" * 60), *frames("SSS", 60, level=quiet), *frames("S" * 37, 63)])
        assert c.split(0, 55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES, pause_ms=120) == []
        assert c.split(0, 55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES)  # without the condition: the quiet stretch
    c = Chunker()
    c.feed(frames("S" * 58 + "." * 5 + "S" * 37))  # a 150 ms pause at frames 58-62
    (ended, _) = c.split(0, 55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES, pause_ms=120)
    assert ended.end == 60 * FRAME_SAMPLES and ended.reason is EndReason.SENTENCE
    c = Chunker()
    c.feed(frames("S" * 58 + "." * 3 + "S" * 39, silence=0.01))  # 90 ms, and only 20 dB down: too short
    assert c.split(0, 55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES, pause_ms=120) == []


def test_a_valley_the_vad_called_speech_counts_as_the_pause_in_a_reverberant_room():
    """Reverberation fills a 0.2 s pause between sentences, and the VAD hears speech there; the
    energy still falls 30 dB or more under the talker's speech for 60 ms, and the split cuts in
    the middle of that valley. One such frame alone, or a valley while too little speech has been
    heard to know the level, is not a pause."""
    c = Chunker()
    c.feed(frames("S" * 100, quiet_at={60, 61, 62}))  # 40 dB under: a valley
    (ended, started) = c.split(0, 55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES, pause_ms=120)
    assert ended.end == started.start == 61 * FRAME_SAMPLES and ended.reason is EndReason.SENTENCE
    c = Chunker()
    c.feed(frames("S" * 100, quiet_at={61, 80}))  # single frames
    assert c.split(0, 55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES, pause_ms=120) == []
    c = Chunker()
    c.feed(frames("S" * 9, quiet_at={4, 5, 6}))  # 9 frames of speech: no level yet
    assert c.split(0, 2 * FRAME_SAMPLES, 8 * FRAME_SAMPLES, pause_ms=120) == []


def test_a_split_cuts_where_the_pause_decode_ended_when_the_vad_heard_no_speech_there():
    """The cut at ``at`` (where the decoder's pause decode ended) leaves the utterance exactly the
    audio that decode heard, so it is the final; in speech, or at a pause too short, it is not used."""
    pause = frames("S" * 58 + "." * 5 + "S" * 37)  # a 150 ms pause at frames 58-62
    at = 58 * FRAME_SAMPLES + 1600  # 100 ms into the pause, where the tail ends
    c = Chunker()
    c.feed(pause)
    ended, started = c.split(0, 55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES, pause_ms=120, at=at)
    assert ended.end == started.start == at and ended.reason is EndReason.SENTENCE
    c = Chunker()
    c.feed(pause)
    (ended, _) = c.split(0, 55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES, pause_ms=120, at=57 * FRAME_SAMPLES + 10)
    assert ended.end == 60 * FRAME_SAMPLES  # ``at`` in speech: the middle of the pause, as without it
    c = Chunker()
    c.feed(frames("S" * 58 + "." * 3 + "S" * 39, silence=0.01))  # 90 ms, 20 dB down: too short for the condition
    assert c.split(0, 55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES, pause_ms=120, at=59 * FRAME_SAMPLES) == []


def test_the_sentence_pause_cut_is_made_at_the_pause_the_vad_hears_of_a_short_gap_under_noise():
    """Under pink noise 20 dB down the VAD hears a 0.3 s pause between two sentences as 180-210 ms.
    The decoder's cut where a pause decode ended a sentence (``SENTENCE_PAUSE_MS``) is made at such
    a pause (with 250 ms a fast recipe's first sentence waited 4.4-5.1 s for the next one), but not at
    one of 120 ms."""
    from asr_server.decoding.incremental import SENTENCE_PAUSE_MS

    at = 58 * FRAME_SAMPLES + 1600  # 100 ms into the pause, where the pause decode's audio ends
    c = Chunker()
    c.feed(frames("S" * 58 + "." * 6 + "S" * 36, silence=0.01))  # 180 ms heard, 20 dB down
    ended, started = c.split(0, 55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES, pause_ms=SENTENCE_PAUSE_MS, at=at)
    assert ended.end == started.start == at and ended.reason is EndReason.SENTENCE
    c = Chunker()
    c.feed(frames("S" * 58 + "." * 4 + "S" * 38, silence=0.01))  # 120 ms
    assert c.split(0, 55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES, pause_ms=SENTENCE_PAUSE_MS, at=at) == []


def test_a_pause_too_short_for_the_vote_is_a_dip_once_speech_resumes():
    """Frames the learned detector did not hear as speech, too few for the vote to end speech:
    once the detector hears speech again they are a dip, at the middle of the quietest of them,
    where a split that may cut at dips does. Not while the speaker is still silent, not a pause
    the VAD heard (the pause decode has it), and nothing without a learned detector's calls."""
    span = (55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES)
    c = Chunker()
    c.feed(frames("S" * 60 + "d", learned=True, silence=0.01) + frames("d", 61, learned=True, silence=0.008))  # 20 dB: no valley
    assert c.split(0, *span, pause_ms=120, dips=True) == []  # not yet: the speaker may be pausing
    c.feed(frames("S" * 5, 62, learned=True))
    (ended, _) = c.split(0, *span, pause_ms=120, dips=True)
    assert ended.end == 61 * FRAME_SAMPLES + FRAME_SAMPLES // 2  # the quieter frame's middle
    c = Chunker(ChunkerOptions(tail_ms=60))
    events = c.feed(frames("S" * 60 + "." * 4 + "S" * 40, learned=True, silence=0.01))  # 120 ms: the VAD paused
    assert "UtterancePaused" in kinds(events)
    assert c.split(0, *span, pause_ms=200, dips=True) == []  # 120 ms, under 200: no pause, and no dip
    c = Chunker()
    c.feed(frames("S" * 60 + "dd" + "S" * 38, silence=0.01))
    assert c.split(0, *span, pause_ms=120, dips=True) == []


def test_a_dip_is_the_pause_a_split_needs_only_where_the_sentence_end_was_heard_twice():
    """With ``dips`` the split cuts at the quietest dip in the span when the VAD heard no pause
    there; without, a pause that short does not count (one hearing alone often put a full stop at
    a comma's short pause)."""
    talk = frames("S" * 60 + "d" + "S" * 39, learned=True, level=0.1)
    dip = 60 * FRAME_SAMPLES + FRAME_SAMPLES // 2
    span = (55 * FRAME_SAMPLES, 70 * FRAME_SAMPLES)
    for dips, cut in [(True, dip), (False, None)]:
        c = Chunker()
        c.feed(talk)
        events = c.split(0, *span, pause_ms=120, dips=dips)
        assert (events[0].end if events else None) == cut, dips
    c = Chunker()
    c.feed(talk)
    assert c.split(0, 62 * FRAME_SAMPLES, 70 * FRAME_SAMPLES, pause_ms=120, dips=True) == []  # no dip in the span
    (ended, _) = c.split(0, 20 * FRAME_SAMPLES, 40 * FRAME_SAMPLES)  # a cut before the dip ...
    assert ended.end < dip
    assert c.split(1, *span, pause_ms=120, dips=True)[0].end == dip  # ... keeps it for the next
