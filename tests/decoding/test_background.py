"""Finals well under the talker's recent ones are another voice's: dropped, and the transcript goes on."""

import numpy as np
import pytest

from asr_server.audio.chunker import EndReason, UtteranceAudio, UtteranceEnded, UtteranceStarted
from asr_server.decoding.background import BackgroundFilter, doubtful, level_db
from asr_server.decoding.incremental import ChannelDecoder
from asr_server.events import Final, Interim, SubmitJob
from asr_server.inference.types import DecodeKind, Hypothesis, Word
from asr_server.options import StreamOptions

SR = 16000


def tone(seconds: float, dbfs: float) -> np.ndarray:
    """A 200 Hz tone whose RMS is ``dbfs``."""
    t = np.arange(int(seconds * SR)) / SR
    return (np.sqrt(2) * 10 ** (dbfs / 20) * np.sin(2 * np.pi * 200 * t)).astype(np.float32)


def _hyp(text: str, probability: float, avg_logprob: float) -> Hypothesis:
    # Words placed one after another (words of no length, unsure, are no speech at all: guard's "unplaced").
    return Hypothesis(text, tuple(Word(" " + w, 0.3 * i, 0.3 * i + 0.25, probability) for i, w in enumerate(text.split())), avg_logprob)


UNSURE = _hyp("in a little bit", 0.35, -1.0)  # babble, as Whisper writes it
SURE = _hyp("see you all in a little bit", 0.85, -0.2)


def test_a_final_has_the_level_of_its_loud_frames_not_of_a_burst_inside_it():
    assert level_db(tone(2.0, -25.0)) == pytest.approx(-25.0, abs=0.1)
    with_pause = np.concatenate([np.zeros(SR, np.float32), tone(2.0, -25.0)])  # a third of it silence
    assert level_db(with_pause) == pytest.approx(-25.0, abs=0.1)
    # A knock 40 dB over a quiet talker, a sixth of the frames: the level is at most 10 dB over
    # the talker's 75th percentile, not the knock's.
    knocked = np.concatenate([tone(2.5, -50.0), tone(0.5, -10.0)])
    assert level_db(knocked) == pytest.approx(-40.0, abs=0.1)
    assert level_db(tone(0.1, -20.0)) is None  # too short to tell


def test_a_final_far_under_the_talkers_recent_ones_is_not_the_talkers():
    f = BackgroundFilter(12.0)
    assert f.heard(tone(2.0, -20.0), 2 * SR, 1.8, UNSURE)
    assert not f.heard(tone(2.0, -33.0), 5 * SR, 1.8, UNSURE)  # 13 dB under: another voice
    assert f.heard(tone(2.0, -30.0), 8 * SR, 1.8, UNSURE)  # 10 dB under: the talker, quieter
    assert f.reference(8 * SR) == pytest.approx(-20.0, abs=0.1)


def test_a_quiet_final_the_model_was_sure_of_is_kept():
    """A participant far from a meeting room's microphone, 14 dB under the one near it, is heard
    clearly: only babble (and speech Whisper could not make out) is dropped."""
    f = BackgroundFilter(12.0)
    assert f.heard(tone(2.0, -20.0), 2 * SR, 1.8, SURE)
    assert f.heard(tone(2.0, -34.0), 5 * SR, 1.8, SURE)
    assert not f.heard(tone(2.0, -34.0), 8 * SR, 1.8, UNSURE)
    assert doubtful(UNSURE) and not doubtful(SURE)
    assert not doubtful(_hyp("yes", 0.3, -0.2)) and not doubtful(_hyp("yes", 0.9, -1.0))  # both must be low
    assert doubtful(Hypothesis("yes", (), -0.8)) and not doubtful(Hypothesis("yes", (), -0.3))  # no words: the log-probability


def test_the_reference_forgets_a_loud_final_after_a_minute():
    f = BackgroundFilter(12.0, window_s=60.0)
    assert f.heard(tone(2.0, -10.0), 2 * SR, 1.8, UNSURE)  # a shout
    assert not f.heard(tone(2.0, -30.0), 30 * SR, 1.8, UNSURE)
    # The talker, now further from the microphone: heard again once the shout is a minute old
    # (and the quieter finals it dropped set nothing meanwhile).
    assert f.heard(tone(2.0, -30.0), 63 * SR, 1.8, UNSURE)
    assert f.heard(tone(2.0, -32.0), 66 * SR, 1.8, UNSURE)


def test_a_short_final_is_judged_but_sets_no_reference():
    f = BackgroundFilter(12.0)
    assert f.heard(tone(0.6, -5.0), SR, 0.4, UNSURE)  # a loud "Yes." (or a burst heard as one)
    assert f.reference(SR) is None
    assert f.heard(tone(2.0, -25.0), 3 * SR, 1.8, UNSURE)
    assert not f.heard(tone(0.6, -40.0), 4 * SR, 0.4, UNSURE)


def test_margin_zero_keeps_every_final_and_bad_options_are_refused():
    f = BackgroundFilter(0.0)
    assert f.heard(tone(2.0, -10.0), 2 * SR, 1.8, UNSURE) and f.heard(tone(2.0, -60.0), 4 * SR, 1.8, UNSURE)
    with pytest.raises(ValueError):
        BackgroundFilter(-1.0)


def _final(d: ChannelDecoder, index: int, start_s: float, samples: np.ndarray, text: str, probability: float = 0.9, avg_logprob: float = -0.2) -> Final:
    start, end = int(start_s * SR), int(start_s * SR) + len(samples)
    ev = d.feed([UtteranceStarted(index, start, start), UtteranceAudio(index, samples, voiced=len(samples)), UtteranceEnded(index, end, EndReason.ENDPOINT)])
    (job,) = [e.job for e in ev if isinstance(e, SubmitJob) and e.job.utterance == index]
    words = tuple(Word(" " + w, 0.1 * i, 0.1 * i + 0.1, probability) for i, w in enumerate(text.split()))
    (final,) = [e for e in d.job_done(job, Hypothesis(text, words, avg_logprob)) if isinstance(e, Final)]
    return final


def test_the_decoder_drops_another_voices_final_and_the_transcript_goes_on():
    d = ChannelDecoder(0, StreamOptions(interim_results=False, revisions=False), background_db=12.0)
    assert _final(d, 0, 0.0, tone(2.0, -20.0), "Good morning.").text == "Good morning."
    voice = _final(d, 1, 3.0, tone(2.0, -35.0), "See you all in a bit.", 0.4, -0.9)  # babble 15 dB down, the talker silent
    assert (voice.text, voice.words, voice.offset) == ("", (), len("Good morning.") + 1)
    assert voice.dropped == ("background",)
    after = _final(d, 2, 6.0, tone(2.0, -21.0), "How can I help?")
    assert (after.text, after.offset) == ("How can I help?", len("Good morning.") + 1)
    far = _final(d, 3, 9.0, tone(2.0, -35.0), "Thank you.")  # as quiet, heard clearly: kept
    assert (far.text, far.dropped) == ("Thank you.", ())


def test_the_decoder_keeps_every_final_unless_asked():
    d = ChannelDecoder(0, StreamOptions(interim_results=False, revisions=False))
    _final(d, 0, 0.0, tone(2.0, -20.0), "Good morning.")
    assert _final(d, 1, 3.0, tone(2.0, -35.0), "See you all in a bit.", 0.4, -0.9).text == "See you all in a bit."


def test_babble_after_the_talker_stopped_short_of_the_utterances_end_is_dropped_from_its_final():
    """An utterance whose final decode ends its words more than 2 s before its audio does is decoded
    again from its last word (see ChannelDecoder._final): where that rest is babble under the
    talker, the final keeps the talker's words alone (a replayed call's agent: "...arrive by mail next
    week. in a little bit comfortable. Hopefully there's no longer there.")."""
    d = ChannelDecoder(0, StreamOptions(interim_results=False, revisions=False), background_db=12.0)
    _final(d, 0, 0.0, tone(2.0, -20.0), "Hello.")
    samples = np.concatenate([tone(2.0, -20.0), tone(3.0, -35.0)])
    start, end = 3 * SR, 3 * SR + len(samples)
    ev = d.feed([UtteranceStarted(1, start, start), UtteranceAudio(1, samples, voiced=len(samples)), UtteranceEnded(1, end, EndReason.ENDPOINT)])
    (job,) = [e.job for e in ev if isinstance(e, SubmitJob)]
    head = Hypothesis("Your card will arrive.", tuple(Word(" " + w, 0.5 * i, 0.5 * i + 0.5, 0.9) for i, w in enumerate("Your card will arrive.".split())), -0.2)
    (rest,) = [e.job for e in d.job_done(job, head) if isinstance(e, SubmitJob)]
    assert rest.request.kind is DecodeKind.FINAL and len(rest.request.audio) == end - (start + 2 * SR)
    (final,) = [e for e in d.job_done(rest, UNSURE) if isinstance(e, Final)]
    assert (final.text, final.dropped) == ("Your card will arrive.", ("background",))


def _interims(d: ChannelDecoder, index: int, start_s: float, samples: np.ndarray, hyp: Hypothesis) -> list[Interim]:
    """The interims sent for an utterance of ``samples`` still going on, its decode answered with ``hyp``."""
    start = int(start_s * SR)
    ev = d.feed([UtteranceStarted(index, start, start), UtteranceAudio(index, samples, voiced=len(samples))])
    (job,) = [e.job for e in ev if isinstance(e, SubmitJob) and e.job.utterance == index]
    assert job.request.kind is DecodeKind.INTERIM
    return [e for e in d.job_done(job, hyp) if isinstance(e, Interim)]


def test_an_interim_of_another_voice_is_not_shown_before_its_final_comes_out_empty():
    """Words nobody near the microphone said would flash up as an interim and vanish at the final."""
    d = ChannelDecoder(0, StreamOptions(revisions=False), background_db=12.0)
    _final(d, 0, 0.0, tone(2.0, -20.0), "Good morning.")
    assert _interims(d, 1, 3.0, tone(2.0, -35.0), UNSURE) == []  # babble 15 dB down
    (job,) = [e.job for e in d.feed([UtteranceEnded(1, 5 * SR, EndReason.ENDPOINT)]) if isinstance(e, SubmitJob)]
    (final,) = [e for e in d.job_done(job, UNSURE) if isinstance(e, Final)]
    assert final.text == ""
    far = _interims(d, 2, 6.0, tone(2.0, -35.0), SURE)  # as quiet, heard clearly: shown
    assert [i.text for i in far] == [SURE.text]
    near = _interims(ChannelDecoder(0, StreamOptions(revisions=False)), 0, 0.0, tone(2.0, -35.0), UNSURE)
    assert [i.text for i in near] == [UNSURE.text]  # off by default in the decoder
