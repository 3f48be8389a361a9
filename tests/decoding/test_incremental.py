from dataclasses import replace

import numpy as np

from asr_server.audio.chunker import EndReason, UtteranceAudio, UtteranceEnded, UtterancePaused, UtteranceStarted
from asr_server.decoding.incremental import CLAUSE_PAUSE_MS, LONG_CLAUSE_S, SENTENCE_PAUSE_MS, SPLIT_SOLO_PAUSE_MS, UNMARKED_PREFIX_WORDS, ChannelDecoder
from asr_server.events import DecodeJob, Final, Interim, SpeechStart, SplitUtterance, SubmitJob, WithdrawJob
from asr_server.inference.types import Word
from asr_server.inference.whisper import DecodeKind, Hypothesis
from asr_server.options import StreamOptions

SR = 16000


def audio(u, seconds, voiced=True):
    n = int(seconds * SR)
    return UtteranceAudio(u, np.full(n, 0.1, np.float32), voiced=n if voiced else 0)


def only(events, kind):
    return [e for e in events if isinstance(e, kind)]


def test_interims_then_final_with_offsets_across_utterances():
    d = ChannelDecoder(0, StreamOptions(interim_ms=500))
    ev = d.feed([UtteranceStarted(0, 0, 4800), audio(0, 0.6)])
    assert only(ev, SpeechStart)[0].at == 0.3
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert job.request.kind is DecodeKind.INTERIM
    ev = d.job_done(job, Hypothesis("hello"))
    (interim,) = only(ev, Interim)
    assert (interim.offset, interim.text, interim.stable) == (0, "hello", 0)
    ev = d.feed([UtteranceEnded(0, int(0.6 * SR), EndReason.ENDPOINT)])
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert job.request.kind is DecodeKind.FINAL and not job.speculative and job.request.word_timestamps
    (final,) = only(d.job_done(job, Hypothesis("hello world")), Final)
    assert (final.offset, final.text, final.reason) == (0, "hello world", EndReason.ENDPOINT)
    # Next utterance starts after "hello world" and one space.
    ev = d.feed([UtteranceStarted(1, SR, SR), audio(1, 0.6)])
    job = only(ev, SubmitJob)[0].job
    assert job.request.prompt == "hello world"
    (interim,) = only(d.job_done(job, Hypothesis("again")), Interim)
    assert interim.offset == len("hello world") + 1


def test_one_decode_in_flight_per_channel():
    d = ChannelDecoder(0, StreamOptions(interim_ms=100))
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 0.2)])
    assert len(only(ev, SubmitJob)) == 1
    for _ in range(5):
        assert not only(d.feed([audio(0, 0.2)]), SubmitJob)
    job = d.in_flight
    ev = d.job_done(job, Hypothesis("a b"))
    (nxt,) = only(ev, SubmitJob)
    assert len(nxt.job.request.audio) == int(1.2 * SR)  # the newest audio, not a backlog


def test_pause_decode_becomes_the_final_without_another_decode():
    d = ChannelDecoder(0, StreamOptions(interim_results=False))
    end = int(1.0 * SR)
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 1.0), UtterancePaused(0, end)])
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert job.speculative and job.request.kind is DecodeKind.FINAL
    assert not only(d.job_done(job, Hypothesis("hi there")), Final)  # not ended yet
    ev = d.feed([audio(0, 0.3, voiced=False), UtteranceEnded(0, end, EndReason.ENDPOINT)])
    assert not only(ev, SubmitJob)
    (final,) = only(ev, Final)
    assert final.text == "hi there"


def test_pause_result_is_not_reused_when_speech_resumed():
    d = ChannelDecoder(0, StreamOptions(interim_results=False))
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 1.0), UtterancePaused(0, SR)])
    job = only(ev, SubmitJob)[0].job
    d.feed([audio(0, 0.5)])  # speech again
    d.job_done(job, Hypothesis("first part"))
    ev = d.feed([UtteranceEnded(0, int(1.5 * SR), EndReason.ENDPOINT)])
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert not job.speculative and len(job.request.audio) == int(1.5 * SR)


def test_finals_stay_in_order_when_utterances_end_during_a_decode():
    d = ChannelDecoder(0, StreamOptions(interim_results=False))
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 0.5), UtteranceEnded(0, 8000, EndReason.ENDPOINT),
                 UtteranceStarted(1, 16000, 16000), audio(1, 0.5), UtteranceEnded(1, 24000, EndReason.ENDPOINT)])
    first = only(ev, SubmitJob)[0].job
    assert first.utterance == 0 and d.pending_finals == 2
    ev = d.job_done(first, Hypothesis("one"))
    assert only(ev, Final)[0].utterance == 0
    second = only(ev, SubmitJob)[0].job
    assert second.utterance == 1
    (final,) = only(d.job_done(second, Hypothesis("two")), Final)
    assert (final.utterance, final.offset) == (1, 4)


def test_utterance_without_words_gets_an_empty_final_that_takes_no_room():
    d = ChannelDecoder(0, StreamOptions(interim_results=False))
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 0.5), UtteranceEnded(0, 8000, EndReason.ENDPOINT)])
    d.job_done(only(ev, SubmitJob)[0].job, Hypothesis("one"))
    ev = d.feed([UtteranceStarted(1, SR, SR), audio(1, 0.5), UtteranceEnded(1, SR + 8000, EndReason.ENDPOINT)])
    (empty,) = only(d.job_done(only(ev, SubmitJob)[0].job, Hypothesis("")), Final)
    assert empty.text == "" and empty.offset == 4
    ev = d.feed([UtteranceStarted(2, 2 * SR, 2 * SR), audio(2, 0.5), UtteranceEnded(2, 2 * SR + 8000, EndReason.ENDPOINT)])
    (final,) = only(d.job_done(only(ev, SubmitJob)[0].job, Hypothesis("three")), Final)
    assert final.offset == 4


def test_interim_decodes_force_the_stable_prefix():
    d = ChannelDecoder(0, StreamOptions(interim_ms=100))
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 0.2)])
    ev = d.job_done(only(ev, SubmitJob)[0].job, Hypothesis("the quick"))
    d.feed([audio(0, 0.2)])
    ev = d.job_done(d.in_flight, Hypothesis("the quick brown"))
    d.feed([audio(0, 0.2)])
    assert d.in_flight.request.prefix == "the quick"


def test_interims_go_on_without_the_prefix_once_it_has_run_on_with_no_mark():
    """A prefix that runs on unpunctuated keeps Whisper writing on without a mark, where the same
    audio decoded without it is written in sentences (a museum tour read fast in a reverberant
    room got no final for 20 s). Once UNMARKED_PREFIX_WORDS are committed with no mark among
    them, the utterance's interims are decoded without the prefix; the committed text the client
    holds stays as it was. A prefix with a comma in it is kept."""
    def committed_run(words):
        d = ChannelDecoder(0, StreamOptions(interim_ms=100))
        ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 0.2)])
        job = only(ev, SubmitJob)[0].job
        texts = []
        for n in range(2, len(words) + 1):
            (interim,) = only(d.job_done(job, Hypothesis(" ".join(words[:n]))), Interim)
            texts.append(interim.text[: interim.stable])
            d.feed([audio(0, 0.2)])
            job = d.in_flight
        return job.request.prefix, texts

    run_on = [f"w{i}" for i in range(UNMARKED_PREFIX_WORDS + 2)]
    prefix, texts = committed_run(run_on[: UNMARKED_PREFIX_WORDS])
    assert prefix.split() == run_on[: UNMARKED_PREFIX_WORDS - 1]  # not yet
    prefix, texts = committed_run(run_on)
    assert prefix == ""
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # what was stable stays
    marked = run_on[:5] + ["w5,"] + run_on[6:]
    assert committed_run(marked)[0].split()[5] == "w5,"


def test_max_length_continuation_keeps_the_audio_after_the_cut():
    d = ChannelDecoder(0, StreamOptions(interim_results=False))
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 2.0), UtteranceEnded(0, int(1.5 * SR), EndReason.MAX_LENGTH),
                 UtteranceStarted(1, int(1.5 * SR), int(1.5 * SR), continuation=True)])
    assert not only(ev, SpeechStart)[1:]  # a continuation is not a new speech start
    job = only(ev, SubmitJob)[0].job
    assert len(job.request.audio) == int(1.5 * SR)
    d.job_done(job, Hypothesis("part one"))
    ev = d.feed([audio(1, 0.5), UtteranceEnded(1, int(2.5 * SR), EndReason.ENDPOINT)])
    assert len(only(ev, SubmitJob)[0].job.request.audio) == int(1.0 * SR)


def test_an_interim_always_precedes_a_non_empty_final():
    d = ChannelDecoder(0, StreamOptions(interim_ms=5000))
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 0.5), UtteranceEnded(0, 8000, EndReason.ENDPOINT)])
    ev = d.job_done(only(ev, SubmitJob)[0].job, Hypothesis("quick"))
    assert [type(e).__name__ for e in ev] == ["Interim", "Final"]
    assert ev[0].text == ev[1].text == "quick" and ev[0].offset == ev[1].offset


def test_no_interim_decode_starts_during_a_pause():
    d = ChannelDecoder(0, StreamOptions(interim_ms=500))
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 0.4), audio(0, 0.2, voiced=False)])
    assert not only(ev, SubmitJob)  # grown past interim_ms, but silent now
    ev = d.feed([audio(0, 0.03)])
    assert only(ev, SubmitJob)[0].job.request.kind is DecodeKind.INTERIM


def test_guard_drops_are_reported_on_the_final():
    d = ChannelDecoder(0, StreamOptions(interim_results=False))
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 1.0), UtteranceEnded(0, SR, EndReason.ENDPOINT)])
    (final,) = only(d.job_done(only(ev, SubmitJob)[0].job, Hypothesis("so so so so so so so yes")), Final)
    assert final.text == "so so so yes" and final.dropped == ("repetition",)


def test_a_waiting_interim_is_refreshed_with_the_newest_audio():
    d = ChannelDecoder(0, StreamOptions(interim_ms=100))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 0.2)]), SubmitJob)]
    d.feed([audio(0, 0.5)])  # arrives while the job waits for the model
    fresh = d.refresh(job)
    assert fresh is not job and len(fresh.request.audio) == int(0.7 * SR) and d.in_flight is fresh
    assert d.refresh(fresh) is fresh  # nothing new: run as is
    (interim,) = only(d.job_done(fresh, Hypothesis("one two")), Interim)
    assert interim.end == 0.7


def test_a_stale_interim_is_skipped_and_the_final_follows():
    d = ChannelDecoder(0, StreamOptions(interim_ms=100))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 0.5)]), SubmitJob)]
    d.feed([UtteranceEnded(0, int(0.5 * SR), EndReason.ENDPOINT)])
    assert d.refresh(job) is None
    (nxt,) = [e.job for e in only(d.job_skipped(job), SubmitJob)]
    assert nxt.request.kind is DecodeKind.FINAL and not nxt.speculative
    assert d.refresh(nxt) is nxt  # finals always run as asked
    (final,) = only(d.job_done(nxt, Hypothesis("done")), Final)
    assert final.text == "done"


def test_interims_slow_down_when_the_server_asks():
    d = ChannelDecoder(0, StreamOptions(interim_ms=200))
    d.interim_ms = 800
    d.feed([UtteranceStarted(0, 0, 0), audio(0, 0.8)])
    job = d.in_flight
    ev = d.job_done(job, Hypothesis("a"))
    assert not only(d.feed([audio(0, 0.5)]) + ev, SubmitJob)  # 0.5 s < 0.8 s
    assert only(d.feed([audio(0, 0.3)]), SubmitJob)


def test_a_waiting_pause_decode_is_skipped_once_speech_resumes():
    d = ChannelDecoder(0, StreamOptions(interim_results=False))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 1.0), UtterancePaused(0, SR)]), SubmitJob)]
    assert job.speculative and d.refresh(job) is job  # still paused: it may become the final
    d.feed([audio(0, 0.4)])  # the speaker goes on
    assert d.refresh(job) is None
    assert not only(d.job_skipped(job), SubmitJob)  # no interims asked: nothing until the next pause


def test_a_queued_interim_is_withdrawn_when_its_utterance_pauses_so_the_pause_decode_need_not_wait():
    d = ChannelDecoder(0, StreamOptions(interim_ms=100))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 1.0)]), SubmitJob)]
    assert not only(d.feed([audio(0, 0.2)]), WithdrawJob)  # still talking: the interim is wanted
    ev = d.feed([audio(0, 0.1, voiced=False), UtterancePaused(0, int(1.3 * SR))])
    assert [e.job for e in only(ev, WithdrawJob)] == [job]
    assert not only(d.feed([audio(0, 0.1, voiced=False)]), WithdrawJob)  # asked once
    (pause,) = [e.job for e in only(d.job_skipped(job), SubmitJob)]
    assert pause.speculative and pause.audio_end == int(1.3 * SR)


def _paused_with_a_running_interim():
    d = ChannelDecoder(0, StreamOptions(interim_ms=100))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 1.0)]), SubmitJob)]
    assert not d.job_running(job)  # still talking: the running interim is waited for
    ev = d.feed([audio(0, 0.1, voiced=False), UtterancePaused(0, int(1.1 * SR))])
    assert [e.job for e in only(ev, WithdrawJob)] == [job]
    (pause,) = [e.job for e in only(d.job_running(job), SubmitJob)]
    assert pause.speculative and pause.audio_end == int(1.1 * SR) and d.in_flight is pause
    return d, job, pause


def test_a_running_interim_of_a_paused_utterance_is_left_behind_and_only_shown():
    """The scheduler could not withdraw the stale interim (it already runs): the pause decode goes
    at once, beside it; the interim's answer, when it comes first, is shown and starts nothing."""
    d, job, pause = _paused_with_a_running_interim()
    ev = d.job_done(job, Hypothesis("stale words"))
    assert [(e.text, e.end) for e in ev] == [("stale words", 1.0)] and isinstance(ev[0], Interim)
    ev = d.feed([audio(0, 0.4, voiced=False), UtteranceEnded(0, int(1.1 * SR), EndReason.ENDPOINT)])
    assert not only(ev, SubmitJob)  # the pause decode in flight becomes the final
    (final,) = only(d.job_done(pause, Hypothesis("the words")), Final)
    assert (final.offset, final.text) == (0, "the words")
    assert not d.job_running(pause)  # a final-quality decode is never left behind


def test_a_left_behind_interim_that_comes_after_newer_words_is_dropped():
    d, job, pause = _paused_with_a_running_interim()
    (newer,) = only(d.job_done(pause, Hypothesis("the words")), Interim)
    assert newer.end == 1.1
    assert d.job_done(job, Hypothesis("stale")) == []  # older audio than what the client has
    d.feed([audio(0, 0.4, voiced=False)])
    (final,) = only(d.feed([UtteranceEnded(0, int(1.1 * SR), EndReason.ENDPOINT)]), Final)
    assert final.text == "the words"


def test_a_running_pause_decode_after_which_speech_resumed_is_still_waited_for():
    d = ChannelDecoder(0, StreamOptions(interim_ms=200))
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 1.0, voiced=False), UtterancePaused(0, SR)])
    (job,) = [e.job for e in only(ev, SubmitJob)]
    d.feed([audio(0, 0.4)])  # the speaker goes on: the pause decode is stale
    assert not d.job_running(job) and d.in_flight is job  # what follows is only an interim
    (nxt,) = [e.job for e in only(d.job_done(job, Hypothesis("x")), SubmitJob)]
    assert nxt.request.kind is DecodeKind.INTERIM


def test_a_pause_decode_is_withdrawn_when_speech_resumes_and_an_interim_follows():
    d = ChannelDecoder(0, StreamOptions(interim_ms=200))
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 1.0, voiced=False), UtterancePaused(0, SR)])
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert job.speculative and not only(ev, WithdrawJob)
    ev = d.feed([audio(0, 0.4)])  # the speaker goes on
    assert [e.job for e in only(ev, WithdrawJob)] == [job]
    (nxt,) = [e.job for e in only(d.job_skipped(job), SubmitJob)]
    assert nxt.request.kind is DecodeKind.INTERIM and nxt.audio_end == int(1.4 * SR)


def test_an_interim_still_wanted_is_never_withdrawn_and_a_final_never():
    d = ChannelDecoder(0, StreamOptions(interim_ms=100))
    d.feed([UtteranceStarted(0, 0, 0), audio(0, 0.5)])
    ev = d.feed([UtteranceEnded(0, int(0.5 * SR), EndReason.ENDPOINT)])
    interim = only(ev, WithdrawJob)[0].job
    (final,) = [e.job for e in only(d.job_skipped(interim), SubmitJob)]
    assert final.request.kind is DecodeKind.FINAL and not final.speculative
    assert not only(d.feed([UtteranceStarted(1, SR, SR), audio(1, 0.5)]), WithdrawJob)


def _final_request(options: StreamOptions, context=None, lean: bool = False):
    d = ChannelDecoder(0, options, context)
    d.lean_context = lean  # as Session.set_load sets it once a final was late
    d.feed([UtteranceStarted(0, 0, 0), audio(0, 1.0)])
    d.job_done(d.in_flight, Hypothesis("one"))
    ev = d.feed([UtteranceEnded(0, SR, EndReason.ENDPOINT)])
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert job.request.kind is DecodeKind.FINAL
    return job.request


def test_first_pass_finals_are_quick_only_when_a_context_pass_refines_them():
    from asr_server.decoding.context import ContextOptions

    assert _final_request(StreamOptions(revisions=True)).short_window  # greedy, short window: the pass refines it
    assert not _final_request(StreamOptions(revisions=False)).short_window  # the first pass is what stays
    assert not _final_request(StreamOptions(revisions=True), ContextOptions(quick_finals=False)).short_window


def test_quick_finals_are_busy_only_while_the_server_is_loaded_and_a_pass_refines_them():
    """Under load (passes lean since a final was late) a quick final decodes as a burst final does;
    a stream whose first pass is what stays (no revisions, or full finals) keeps its full final."""
    from asr_server.decoding.context import ContextOptions

    assert _final_request(StreamOptions(revisions=True), lean=True).busy
    assert not _final_request(StreamOptions(revisions=True)).busy  # the server is not loaded
    assert not _final_request(StreamOptions(revisions=False), lean=True).busy
    assert not _final_request(StreamOptions(revisions=True), ContextOptions(quick_finals=False), lean=True).busy
    assert not _final_request(StreamOptions(revisions=True), ContextOptions(busy_finals=False), lean=True).busy


def test_a_vocabulary_prompt_goes_ahead_of_the_text_before_in_every_decode():
    """The vocabulary travels apart from the text said before (DecodeRequest.vocabulary), so that
    the runner keeps it whole where it cuts the text (tests/inference/test_whisper.py)."""
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, prompt="Dashwood, Norland"))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 4800), audio(0, 0.6)]), SubmitJob)]
    assert (job.request.vocabulary, job.request.prompt) == ("Dashwood, Norland", "")  # nothing said before: the vocabulary alone
    d.job_done(job, Hypothesis("hello"))
    (job,) = [e.job for e in only(d.feed([UtteranceEnded(0, int(0.6 * SR), EndReason.ENDPOINT)]), SubmitJob)]
    assert (job.request.vocabulary, job.request.prompt) == ("Dashwood, Norland", "")
    d.job_done(job, Hypothesis("hello world"))
    job = only(d.feed([UtteranceStarted(1, SR, SR), audio(1, 0.6)]), SubmitJob)[0].job
    assert (job.request.vocabulary, job.request.prompt) == ("Dashwood, Norland", "hello world")


def _sentence_then_more() -> Hypothesis:
    """An interim of 3.5 s that heard one sentence end at 2.1 s and the next begin at 2.4 s."""
    words = (Word(" The", 0.3, 0.5, 0.9), Word(" end.", 0.5, 2.1, 0.9), Word(" Next", 2.4, 2.8, 0.9), Word(" one", 2.8, 3.2, 0.9))
    return Hypothesis("The end. Next one", words)


def test_a_long_utterance_is_split_where_an_interim_hears_a_sentence_end():
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 2.0)]), SubmitJob)]
    assert not job.request.word_timestamps  # not long yet: no word timing asked for
    d.job_done(job, Hypothesis("The end."))
    (job,) = [e.job for e in only(d.feed([audio(0, 1.5)]), SubmitJob)]
    assert job.request.kind is DecodeKind.INTERIM and job.request.word_timestamps
    ev = d.job_done(job, _sentence_then_more())
    (split,) = only(ev, SplitUtterance)
    # Around the gap between "end." and "Next", 0.1 s either side.
    assert (split.utterance, split.lo, split.hi) == (0, int(2.0 * SR), int(2.5 * SR))
    assert not only(ev, SubmitJob)  # nothing more is decoded until the chunker has answered
    cut = int(2.2 * SR)
    ev = d.feed([audio(0, 0.3), UtteranceEnded(0, cut, EndReason.SENTENCE), UtteranceStarted(1, cut, cut, continuation=True)])
    assert not only(ev, SpeechStart)  # the speaker did not start again: the utterance goes on
    # The interim that asked for the split heard the sentence through and past the cut: its
    # words before the cut are the final, with no decode to wait for.
    (final,) = only(ev, Final)
    assert (final.utterance, final.reason, final.offset, final.text) == (0, EndReason.SENTENCE, 0, "The end.")
    # The continuation holds the audio after the cut and goes on with interims at the next offset.
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert job.utterance == 1 and len(job.request.audio) == int(3.8 * SR) - cut
    (interim,) = only(d.job_done(job, Hypothesis("Next one")), Interim)
    assert (interim.utterance, interim.offset) == (1, len("The end.") + 1)


def _split_cut_at(cut_s: float, revisions: bool = True, interim_model: bool = False) -> list:
    """An utterance split where an interim heard "The end." end at 2.1 s and "Next" begin at
    2.4 s, the chunker's cut at ``cut_s``: what the decoder does then."""
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0, revisions=revisions))
    d.interim_model = interim_model
    d.job_done(_long_interim(d, "The end."), _sentence_then_more())
    cut = int(cut_s * SR)
    return d.feed([audio(0, 0.3), UtteranceEnded(0, cut, EndReason.SENTENCE), UtteranceStarted(1, cut, cut, continuation=True)])


def test_a_split_whose_cut_runs_through_a_word_the_interim_heard_is_decoded():
    """The interim's words are the final only where they fall whole on either side of the cut:
    a cut through "Next" (the chunker found its quietest stretch there) is decoded as usual, and
    so is one before the sentence's last word ends."""
    assert only(_split_cut_at(2.25), Final)
    # Nor where no context pass will refine it (revisions=false: a greedy interim's words would
    # be the transcript for good), nor where the smaller interim model heard them (under load).
    for cut_s, revisions, interim_model in ((2.5, True, False), (1.9, True, False), (2.25, False, False), (2.25, True, True)):
        ev = _split_cut_at(cut_s, revisions, interim_model)
        (job,) = [e.job for e in only(ev, SubmitJob)]
        assert not only(ev, Final) and job.request.kind is DecodeKind.FINAL and len(job.request.audio) == int(cut_s * SR)


def test_a_short_utterance_splits_once_the_talking_it_continues_has_run_split_after_s():
    """A fast reader: a split sentence's continuation (or an utterance after a pause too short to
    end the talking) is short, but the talking has run 10 s: its first sentence end splits it,
    not one heard after it has run split_after_s of its own (measured: 5.4 s late so)."""
    start = 10 * SR
    talk = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    fresh = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    for d, talk_start in ((talk, 0), (fresh, None)):
        (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, start, start, continuation=True, talk_start=talk_start), audio(0, 2.0)]), SubmitJob)]
        d.job_done(job, Hypothesis("The end."))
        (job,) = [e.job for e in only(d.feed([audio(0, 0.6)]), SubmitJob)]
        assert job.request.word_timestamps is (d is talk)
        words = (Word(" The", 0.3, 0.5, 0.9), Word(" end.", 0.5, 2.1, 0.9), Word(" Next", 2.4, 2.6, 0.9))
        splits = only(d.job_done(job, Hypothesis("The end. Next", words)), SplitUtterance)
        if d is talk:
            (split,) = splits
            assert (split.lo, split.hi) == (start + int(2.0 * SR), start + int(2.5 * SR))
        else:
            assert not splits  # talking that began with this utterance: 2.6 s, under split_after_s


def test_a_continuation_splits_off_the_end_of_the_sentence_a_split_cut_short():
    """A split at a full stop Whisper put inside a sentence ("...or more. | obscure. We know the
    names...") leaves the sentence's last word to open the continuation: that short piece ends a
    sentence that began before it, and splits off (measured under noise: else the sentence's
    final waited 5.8 s, for the next pause). In talking that begins with the utterance, a
    sentence under SPLIT_MIN_S does not split."""
    words = (Word(" obscure.", 0.1, 0.6, 0.9), Word(" We", 0.8, 1.0, 0.9), Word(" know", 1.0, 1.3, 0.9), Word(" the", 1.3, 1.5, 0.9))
    for talk_start, splits in ((0, 1), (None, 0)):
        d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
        start = 10 * SR
        (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, start, start, continuation=True, talk_start=talk_start), audio(0, 3.0)]), SubmitJob)]
        d.job_done(job, Hypothesis("obscure. We know"))
        (job,) = [e.job for e in only(d.feed([audio(0, 0.6)]), SubmitJob)]
        found = only(d.job_done(job, Hypothesis("obscure. We know the", words)), SplitUtterance)
        assert len(found) == splits
        if found:
            assert (found[0].lo, found[0].hi) == (start + int(0.5 * SR), start + int(0.9 * SR))


def _long_interim(d: ChannelDecoder, before: str) -> DecodeJob:
    """Start an utterance, answer its first interim with ``before``; the second interim (3.5 s) in flight."""
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 2.5)]), SubmitJob)]
    d.job_done(job, Hypothesis(before))
    (job,) = [e.job for e in only(d.feed([audio(0, 1.0)]), SubmitJob)]
    return job


def test_a_sentence_end_heard_by_one_interim_only_splits_only_at_a_pause_the_vad_heard():
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    # The interim before heard "The end next": the full stop is this interim's alone, so the
    # chunker is to cut only where its VAD heard a pause around it.
    (split,) = only(d.job_done(_long_interim(d, "The end next"), _sentence_then_more()), SplitUtterance)
    assert split.pause_ms == SPLIT_SOLO_PAUSE_MS > 0
    assert not split.dips  # a pause too short for the VAD's vote will not do: commas have those
    # Heard by two in a row, any quiet stretch will do.
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    (split,) = only(d.job_done(_long_interim(d, "The end."), _sentence_then_more()), SplitUtterance)
    assert split.pause_ms == 0


def test_two_interims_agree_on_a_sentence_end_by_its_last_words():
    """Greedy interims flip an earlier word from one to the next ("the stones came" / "the storms
    came", "that word." / "the word."): the sentence end is still heard twice, and splits at any
    quiet stretch. Where its last word differs, it was heard once."""
    words = (Word(" Snow", 0.3, 0.6, 0.9), Word(" came", 0.6, 0.9, 0.9), Word(" from", 0.9, 1.2, 0.9), Word(" the", 1.2, 1.4, 0.9),
             Word(" north.", 1.4, 2.1, 0.9), Word(" Next", 2.4, 2.8, 0.9), Word(" one", 2.8, 3.2, 0.9))
    for before, pause_ms in (("Rain came from the north.", 0), ("Rain came from that north.", 0), ("Rain came from the porch.", SPLIT_SOLO_PAUSE_MS)):
        d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
        (split,) = only(d.job_done(_long_interim(d, before), Hypothesis("Snow came from the north. Next one", words)), SplitUtterance)
        assert split.pause_ms == pause_ms, before


def test_a_split_the_chunker_declines_leaves_the_utterance_going():
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    ev = d.job_done(_long_interim(d, "The end."), _sentence_then_more())
    assert only(ev, SplitUtterance) and not only(ev, SubmitJob)
    assert d.feed([]) == []  # the chunker's answer, nothing, which the session feeds all the same
    ev = d.feed([audio(0, 0.6)])
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert job.request.kind is DecodeKind.INTERIM and job.utterance == 0


def test_no_split_when_turned_off_or_no_sentence_ends_before_more_words():
    off = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=0))
    job = _long_interim(off, "The end.")
    assert not job.request.word_timestamps and not only(off.job_done(job, _sentence_then_more()), SplitUtterance)
    for before, words in [
        # "Mr." is no sentence end, and after "home." nothing has been said yet.
        ("Mr. Smith came home.", (Word(" Mr.", 0.3, 1.2, 0.9), Word(" Smith", 1.3, 1.8, 0.9), Word(" came", 1.9, 2.4, 0.9), Word(" home.", 2.5, 3.2, 0.9))),
        # Speech trailing off is no sentence end; nor is a full stop with no pause before the next word.
        ("So then...", (Word(" So", 0.3, 0.9, 0.9), Word(" then...", 0.9, 1.6, 0.9), Word(" we", 1.9, 2.4, 0.9))),
        ("It was 3000.", (Word(" It", 0.3, 0.5, 0.9), Word(" was", 0.5, 0.9, 0.9), Word(" 3000.", 0.9, 1.6, 0.9), Word(" 800", 1.62, 2.4, 0.9))),
        # A full stop with no capital after it, heard by one interim only, is inside a sentence.
        ("Of the second of", (Word(" Of", 0.3, 0.5, 0.9), Word(" the", 0.5, 0.9, 0.9), Word(" second.", 0.9, 1.6, 0.9), Word(" of", 1.9, 2.4, 0.9))),
    ]:
        on = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
        text = " ".join(w.word.strip() for w in words)
        assert not only(on.job_done(_long_interim(on, before), Hypothesis(text, words)), SplitUtterance), text


def test_a_sentence_end_two_interims_heard_before_a_lower_case_word_splits_only_at_a_pause():
    """An interim's forced prefix can hold "name. but" in lower case for good (measured: that
    sentence then waited 5-15 s for a pause). Heard by two interims in a row, such a sentence end
    splits, but only where the VAD heard a pause (a full stop inside a sentence, "of the second.
    of the seven", is seldom at one); a capital after it, heard twice, splits at any quiet stretch."""
    words = (Word(" its", 0.3, 0.8, 0.9), Word(" name.", 0.8, 1.6, 0.9), Word(" but", 1.9, 2.4, 0.9), Word(" in", 2.4, 2.8, 0.9))
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    (split,) = only(d.job_done(_long_interim(d, "its name. but"), Hypothesis("its name. but in", words)), SplitUtterance)
    assert (split.lo, split.hi, split.pause_ms, split.dips) == (int(1.5 * SR), int(2.0 * SR), SPLIT_SOLO_PAUSE_MS, True)
    # "3000. 800": a number goes on, however often it was heard so.
    digits = (Word(" as", 0.3, 0.8, 0.9), Word(" 3000.", 0.8, 1.6, 0.9), Word(" 800", 1.9, 2.4, 0.9), Word(" BC", 2.4, 2.8, 0.9))
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    assert not only(d.job_done(_long_interim(d, "as 3000. 800"), Hypothesis("as 3000. 800 BC", digits)), SplitUtterance)


def test_a_sentence_end_whose_last_word_was_stretched_over_the_pause_splits_at_a_pause_the_vad_heard():
    """Whisper's timing often stretches a sentence's last word over the pause after it (measured on
    a telephone recording: "nine." ran 0.4 s past the speech, "Can" began 0.05 s after it, and the
    sentence waited 3.7 s for a long pause). With a capital after it, it splits where the VAD heard
    a pause near where the two words meet, however many interims heard it; lower case does not."""
    words = (Word(" to", 1.6, 1.9, 0.9), Word(" nine.", 1.9, 2.5, 0.9), Word(" Can", 2.55, 2.9, 0.9), Word(" you", 2.9, 3.1, 0.9))
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    (split,) = only(d.job_done(_long_interim(d, "to nine."), Hypothesis("to nine. Can you", words)), SplitUtterance)
    assert split.pause_ms == SPLIT_SOLO_PAUSE_MS
    # Within 0.5 s of where they meet (2.525 s), and no further than the two words reach.
    assert abs(split.lo - 2.025 * SR) <= 1 and abs(split.hi - 2.9 * SR) <= 1
    lower = tuple(replace(w, word=" can") if w.word == " Can" else w for w in words)
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    assert not only(d.job_done(_long_interim(d, "to nine."), Hypothesis("to nine. can you", lower)), SplitUtterance)


def test_a_sentence_an_interim_ended_while_the_next_was_heard_splits_at_a_pause():
    """Greedy interims often stop at a sentence end and leave out the start of the next sentence
    (measured under noise: two in a row ended "...of the tower." with 1.1 and 1.7 s of the next
    sentence heard, and that sentence waited 2.7 s for an interim that wrote it). With
    SPLIT_UNHEARD_S (0.3 s) or more of speech the VAD heard after the last word, it splits there,
    at a pause only: a dip will do where the interim before heard that sentence end too, else
    the chunker looks for an energy valley (in the room one interim alone heard "...of the
    hardware." end, and that sentence waited 4.6 s)."""
    words = (Word(" The", 0.3, 0.6, 0.9), Word(" tower.", 0.6, 2.2, 0.9))  # 3.5 s heard, all voiced
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    (split,) = only(d.job_done(_long_interim(d, "The tower."), Hypothesis("The tower.", words)), SplitUtterance)
    assert (split.lo, split.hi, split.pause_ms, split.dips) == (int(2.1 * SR), int(2.7 * SR), SPLIT_SOLO_PAUSE_MS, True)
    # 0.4 s of speech after it is enough (the cut reaches no further than the speech heard).
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    near = (words[0], Word(" tower.", 0.6, 3.1, 0.9))
    (split,) = only(d.job_done(_long_interim(d, "The tower."), Hypothesis("The tower.", near)), SplitUtterance)
    assert (split.lo, split.hi, split.pause_ms, split.dips) == (int(3.0 * SR), int(3.5 * SR), SPLIT_SOLO_PAUSE_MS, True)
    # Heard by this interim alone: a pause or a valley, not a dip.
    for before in ("The tower", "The cargo."):
        d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
        (split,) = only(d.job_done(_long_interim(d, before), Hypothesis("The tower.", words)), SplitUtterance)
        assert (split.lo, split.hi, split.pause_ms, split.dips) == (int(2.1 * SR), int(2.7 * SR), SPLIT_SOLO_PAUSE_MS, False), before
    # A last word that is no sentence end; 0.2 s after it only.
    cases = [("The tower of", (*words[:1], Word(" tower", 0.6, 2.2, 0.9))),
             ("The tower.", (*words[:1], Word(" tower.", 0.6, 3.3, 0.9)))]
    for before, heard in cases:
        d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
        text = " ".join(w.word.strip() for w in heard)
        assert not only(d.job_done(_long_interim(d, before), Hypothesis(text, heard)), SplitUtterance), (before, text)


def test_a_pause_decode_the_speaker_talked_on_after_splits_as_an_interim_would():
    """A pause at a comma after the next sentence began ("...the change. However,"): its pause
    decode heard that sentence end with words after it. Once speech resumed, it splits there;
    while the speaker is still silent it may yet be the final, and nothing is split."""
    words = (Word(" The", 0.3, 0.5, 0.9), Word(" end.", 0.5, 2.1, 0.9), Word(" However,", 2.5, 3.0, 0.9))
    for resumed in (True, False):
        d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
        (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 3.0)]), SubmitJob)]
        d.job_done(job, Hypothesis("The end. However"))
        (spec,) = [e.job for e in only(d.feed([audio(0, 0.2, voiced=False), UtterancePaused(0, int(3.1 * SR))]), SubmitJob)]
        assert spec.speculative
        d.feed([audio(0, 0.2, voiced=resumed)])
        splits = only(d.job_done(spec, Hypothesis("The end. However,", words)), SplitUtterance)
        assert len(splits) == resumed
        if resumed:
            assert abs(splits[0].lo - 2.0 * SR) <= 1 and abs(splits[0].hi - 2.6 * SR) <= 1 and splits[0].at is None


def _split_after_pause_decode(spec_text: str, spec_words: tuple[Word, ...]) -> SplitUtterance:
    """A pause decode at 3.0 s answered with ``spec_text``, the speaker went on, and the next
    interim heard "The end. Next": the split it asks for."""
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 2.6)]), SubmitJob)]
    d.job_done(job, Hypothesis("The end"))
    d.feed([audio(0, 0.3)])
    (spec,) = [e.job for e in only(d.feed([audio(0, 0.2, voiced=False), UtterancePaused(0, int(3.0 * SR))]), SubmitJob)]
    d.feed([audio(0, 0.2)])
    d.job_done(spec, Hypothesis(spec_text, spec_words))
    (job,) = [e.job for e in only(d.feed([audio(0, 0.25)]), SubmitJob)]
    words = (Word(" The", 0.3, 0.5, 0.9), Word(" end.", 0.5, 2.8, 0.9), Word(" Next", 3.2, 3.5, 0.9))
    (split,) = only(d.job_done(job, Hypothesis("The end. Next", words)), SplitUtterance)
    return split


def test_a_pause_decode_that_did_not_hear_the_sentence_through_is_no_final_for_it():
    """A pause decode that heard nothing (the guard dropped it) or stopped inside the sentence
    would lose the sentence's words as its final: the split then cuts as it would without one."""
    assert _split_after_pause_decode("The end.", (Word(" The", 0.3, 0.5, 0.9), Word(" end.", 0.5, 2.8, 0.9))).at == int(3.0 * SR)
    assert _split_after_pause_decode("", ()).at is None
    assert _split_after_pause_decode("The", (Word(" The", 0.3, 0.5, 0.9),)).at is None


def test_a_split_at_the_pause_a_pause_decode_heard_takes_that_decode_as_the_final():
    """After a pause decode the next interim waits for interim_ms of new audio (one as soon as
    speech resumes hears nothing new); when it hears the sentence end and the next one begin,
    the split is asked for exactly where the pause decode ended, and that decode is the final."""
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 2.6)]), SubmitJob)]
    d.job_done(job, Hypothesis("The end"))
    assert not only(d.feed([audio(0, 0.3)]), SubmitJob)
    (spec,) = [e.job for e in only(d.feed([audio(0, 0.2, voiced=False), UtterancePaused(0, int(3.0 * SR))]), SubmitJob)]
    d.feed([audio(0, 0.2)])  # the speaker goes on
    first = (Word(" The", 0.3, 0.5, 0.9), Word(" end.", 0.5, 2.8, 0.9))
    assert not only(d.job_done(spec, Hypothesis("The end.", first)), SubmitJob)  # 0.3 s past the pause decode: no interim yet
    (job,) = [e.job for e in only(d.feed([audio(0, 0.25)]), SubmitJob)]
    assert job.request.kind is DecodeKind.INTERIM and len(job.request.audio) == int(3.55 * SR)
    (split,) = only(d.job_done(job, Hypothesis("The end. Next", first + (Word(" Next", 3.2, 3.5, 0.9),))), SplitUtterance)
    assert abs(split.lo - 2.7 * SR) <= 1 and abs(split.hi - 3.3 * SR) <= 1  # 0.1 s either side of the gap
    assert (split.pause_ms, split.at) == (0, int(3.0 * SR))
    at = int(3.0 * SR)
    ev = d.feed([UtteranceEnded(0, at, EndReason.SENTENCE), UtteranceStarted(1, at, at, continuation=True)])
    (final,) = only(ev, Final)
    assert (final.utterance, final.text, final.reason) == (0, "The end.", EndReason.SENTENCE)
    assert [e.job.utterance for e in only(ev, SubmitJob)] == [1]  # no decode of utterance 0 again


def _pause_decode_answered(text: str, words: tuple[Word, ...], talked: float = 3.0, resume: bool = True, split_after_s: float = 3.0):
    """An utterance talked ``talked`` s, paused (its pause decode ends at ``talked`` + 0.1 s) and,
    with ``resume``, the speaker went on before the pause decode answered ``text``: the decoder and
    the events of that answer."""
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=split_after_s))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, talked)]), SubmitJob)]
    d.job_done(job, Hypothesis("The end"))
    at = int((talked + 0.1) * SR)
    (spec,) = [e.job for e in only(d.feed([audio(0, 0.2, voiced=False), UtterancePaused(0, at)]), SubmitJob)]
    d.feed([audio(0, 0.2, voiced=resume)])
    return d, d.job_done(spec, Hypothesis(text, words))


def test_a_pause_decode_that_ends_a_sentence_asks_for_the_cut_there_once_the_speaker_talks_on():
    """A speaker who leaves 0.2-0.4 s between sentences gets no endpoint, and a split waited for an
    interim that heard the next sentence begin (0.8-1.5 s later). A pause decode whose words end a
    sentence asks for the cut exactly where its audio ends, where the VAD heard SENTENCE_PAUSE_MS
    of pause (the chunker checks), as soon as speech resumes; the pause decode is then the final."""
    words = (Word(" The", 0.3, 0.5, 0.9), Word(" end.", 0.5, 2.9, 0.9))
    d, ev = _pause_decode_answered("The end.", words)
    (split,) = only(ev, SplitUtterance)
    at = int(3.1 * SR)
    assert (split.at, split.pause_ms) == (at, SENTENCE_PAUSE_MS) and split.lo < at < split.hi
    ev = d.feed([UtteranceEnded(0, at, EndReason.SENTENCE), UtteranceStarted(1, at, at, continuation=True)])  # the chunker's cut
    (final,) = only(ev, Final)
    assert (final.text, final.reason) == ("The end.", EndReason.SENTENCE)
    assert all(e.job.utterance == 1 for e in only(ev, SubmitJob))  # no second decode of utterance 0
    # Still silent when it answered: asked when the speaker talks on (else it is the endpoint's final).
    d, ev = _pause_decode_answered("The end.", words, resume=False)
    assert not only(ev, SplitUtterance)
    (split,) = only(d.feed([audio(0, 0.1)]), SplitUtterance)
    assert split.at == at
    assert not only(d.feed([]), SplitUtterance)  # the chunker declined (the pause was shorter)
    assert not only(d.feed([audio(0, 0.3)]), SplitUtterance)  # and it is not asked again


def test_after_a_declined_cut_at_a_pause_decode_the_next_interim_comes_sooner():
    """The chunker declines the cut at a pause decode that ended a sentence when the VAD heard a
    shorter pause (a narration's 0.25 s between sentences under noise): the interim that hears the
    next sentence begin, and splits there with that decode as the final, then comes
    SENTENCE_RESUME_MS after the pause decode instead of interim_ms; later ones as usual. After a
    pause decode that ended no sentence, interim_ms as before."""
    words = (Word(" The", 0.3, 0.5, 0.9), Word(" end.", 0.5, 2.9, 0.9))
    d, ev = _pause_decode_answered("The end.", words)  # paused at 3.1 s, 0.3 s heard since
    assert only(ev, SplitUtterance)
    (job,) = [e.job for e in only(d.feed([]), SubmitJob)]  # the chunker's answer: no cut
    assert job.request.kind is DecodeKind.INTERIM and len(job.request.audio) == int(3.4 * SR)
    d.job_done(job, Hypothesis("The end."))
    assert not only(d.feed([audio(0, 0.3)]), SubmitJob)
    (job,) = [e.job for e in only(d.feed([audio(0, 0.2)]), SubmitJob)]
    assert len(job.request.audio) == int(3.9 * SR)
    comma = (Word(" The", 0.3, 0.5, 0.9), Word(" end,", 0.5, 2.9, 0.9))
    d, ev = _pause_decode_answered("The end,", comma)
    assert not only(ev, SplitUtterance) and not only(d.feed([]), SubmitJob)
    (job,) = [e.job for e in only(d.feed([audio(0, 0.2)]), SubmitJob)]
    assert len(job.request.audio) == int(3.6 * SR)


def test_after_a_declined_cut_an_interim_that_marks_the_same_word_asks_for_it_again_at_a_shorter_pause():
    """A reader who leaves 0.12 s between sentences, under noise: the VAD hears 100-170 ms of it,
    the chunker declines the cut at the pause decode that ended the sentence, and the interims
    after it (their forced prefix too) write a comma there ("...the lazy dog, please call"), so no
    split found that sentence end: it waited 6.6 s for the next one. An interim that puts a mark
    after the word the pause decode ended its sentence with asks for that cut again, once, at
    CLAUSE_PAUSE_MS (a pause decode starts after 100 ms of pause), and the pause decode is the
    final. An interim that runs the words on (a speaker who hesitated inside a sentence, where
    the pause decode put a full stop at its end, as Whisper does), or marks another word, does not."""
    words = (Word(" The", 0.3, 0.5, 0.9), Word(" end.", 0.5, 2.9, 0.9))
    at = int(3.1 * SR)

    def declined_then_heard(word: str):
        d, ev = _pause_decode_answered("The end.", words)
        assert only(ev, SplitUtterance)
        (job,) = [e.job for e in only(d.feed([]), SubmitJob)]  # the chunker's answer: no cut
        assert job.request.kind is DecodeKind.INTERIM and job.request.word_timestamps
        heard = (Word(" The", 0.3, 0.5, 0.9), Word(word, 0.5, 3.0, 0.9), Word(" next", 3.2, 3.35, 0.9))
        return d, heard, only(d.job_done(job, Hypothesis(f"The{word} next", heard)), SplitUtterance)

    for word in (" end", " bend,"):
        assert not declined_then_heard(word)[2]
    d, heard, (split,) = declined_then_heard(" end,")
    assert (split.at, split.pause_ms) == (at, CLAUSE_PAUSE_MS) and split.lo < at < split.hi
    (job,) = [e.job for e in only(d.feed([audio(0, 0.5)]), SubmitJob)]  # declined again
    assert not only(d.job_done(job, Hypothesis("The end, next one", heard + (Word(" one", 3.4, 3.8, 0.9),))), SplitUtterance)
    d, _, (split,) = declined_then_heard(" end;")
    ev = d.feed([UtteranceEnded(0, at, EndReason.SENTENCE), UtteranceStarted(1, at, at, continuation=True)])  # the cut
    (final,) = only(ev, Final)
    assert (final.text, final.reason) == ("The end.", EndReason.SENTENCE)
    assert all(e.job.utterance == 1 for e in only(ev, SubmitJob))  # no second decode of utterance 0


def _clause_splits(talked: float, first: str, second: str, comma_end: float = 5.0, gap: float = 0.1) -> list[SplitUtterance]:
    """An utterance talked ``talked`` s with no pause; two interims in a row heard words with
    ``first`` and then ``second`` ending at ``comma_end`` s and more words after it, the next
    starting ``gap`` s after it: the splits the second asks for."""
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, talked)]), SubmitJob)]

    def heard(word: str) -> Hypothesis:
        words = (Word(" of", comma_end - 0.6, comma_end - 0.3, 0.9), Word(word, comma_end - 0.3, comma_end, 0.9),
                 Word(" let", comma_end + gap, comma_end + 0.4, 0.9), Word(" the", comma_end + 0.4, comma_end + 0.6, 0.9))
        return Hypothesis(" ".join(w.word.strip() for w in words), words)

    assert not only(d.job_done(job, heard(first)), SplitUtterance)
    (job,) = [e.job for e in only(d.feed([audio(0, 0.5)]), SubmitJob)]
    return only(d.job_done(job, heard(second)), SplitUtterance)


def test_a_long_utterance_with_no_sentence_end_splits_at_a_comma_two_interims_heard():
    """A fast reader under noise: the VAD hears none of the 0.12 s pauses, and the interims join
    the sentences with commas ("a pinch of salt, let the sauce"), so a recipe got no final for
    17 s, until max_utterance_s. Once an utterance has run LONG_CLAUSE_S, a comma (; :) that two
    interims in a row put after the same word, 2 s or more into it, splits there, in the quietest
    stretch around it. Not sooner, not a comma one interim alone heard, nor one near the start."""
    (split,) = _clause_splits(LONG_CLAUSE_S, " salt,", " salt,")
    assert (split.pause_ms, split.at) == (0, None)
    assert abs(split.lo - 4.9 * SR) <= 1 and abs(split.hi - 5.2 * SR) <= 1
    assert _clause_splits(LONG_CLAUSE_S, " salt;", " salt;")
    assert not _clause_splits(LONG_CLAUSE_S - 1.0, " salt,", " salt,")  # heard at 7.5 s: not yet
    assert not _clause_splits(LONG_CLAUSE_S, " salt", " salt,")
    assert not _clause_splits(LONG_CLAUSE_S, " salt,", " salt,", comma_end=1.5)


def test_a_long_utterance_splits_at_a_sentence_end_two_interims_heard_without_a_pause():
    """A fast reader with other people talking 20 dB down: the VAD hears neither a pause nor a dip
    between sentences, and the interims' forced prefix keeps Whisper's lower case after a full
    stop ("date palms. it was about"), so a sentence waited 13.6 s, until max_utterance_s cut it.
    Such a sentence end, heard by two interims in a row, needs a pause the VAD heard (or a dip)
    while the utterance is short, and none once it has run LONG_CLAUSE_S, as an agreed comma
    needs none then. One interim's sentence end alone still needs a pause there."""
    (split,) = _clause_splits(LONG_CLAUSE_S - 1.0, " salt.", " salt.", gap=0.2)
    assert split.pause_ms == SPLIT_SOLO_PAUSE_MS and split.dips
    (split,) = _clause_splits(LONG_CLAUSE_S, " salt.", " salt.", gap=0.2)
    assert (split.pause_ms, split.at) == (0, None)
    assert abs(split.lo - 4.9 * SR) <= 1 and abs(split.hi - 5.3 * SR) <= 1
    assert not _clause_splits(LONG_CLAUSE_S, " salt", " salt.", gap=0.2)  # one interim's lower case: no split


def test_no_cut_at_a_pause_decode_that_ends_no_sentence_or_in_short_talking():
    """A comma, a sentence end under SPLIT_MIN_S into the audio, talking shorter than split_after_s
    less a second (a short answer with a pause at its comma: "That is great news, thank you") or
    splits turned off: the pause decode only waits to be the final, as before."""
    words = (Word(" The", 0.3, 0.5, 0.9), Word(" end,", 0.5, 2.9, 0.9))
    assert not only(_pause_decode_answered("The end,", words)[1], SplitUtterance)
    early = (Word(" End.", 0.2, 0.8, 0.9),)
    assert not only(_pause_decode_answered("End.", early)[1], SplitUtterance)
    ended = (Word(" The", 0.3, 0.5, 0.9), Word(" end.", 0.5, 1.6, 0.9))
    assert not only(_pause_decode_answered("The end.", ended, talked=1.7)[1], SplitUtterance)  # 1.8 s < 3 - 1
    assert only(_pause_decode_answered("The end.", ended, talked=2.0)[1], SplitUtterance)  # 2.1 s: a second sooner than split_after_s
    assert not only(_pause_decode_answered("The end.", ended, talked=2.0, split_after_s=5.0)[1], SplitUtterance)
    assert not only(_pause_decode_answered("The end.", ended, split_after_s=0.0)[1], SplitUtterance)


def _pause_decode_waiting(talked: float, split_after_s: float = 3.0):
    """An utterance talked ``talked`` s and paused; its pause decode (ending at ``talked`` + 0.1 s)
    still waits its turn when the speaker goes on: the decoder, that job and the feed's events."""
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=split_after_s))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, talked)]), SubmitJob)]
    d.job_done(job, Hypothesis("The end"))
    (spec,) = [e.job for e in only(d.feed([audio(0, 0.2, voiced=False), UtterancePaused(0, int((talked + 0.1) * SR))]), SubmitJob)]
    return d, spec, d.feed([audio(0, 0.2)])


def test_a_waiting_pause_decode_that_may_end_a_sentence_still_runs_once_the_speaker_talks_on():
    """Sixteen streams in step pause between two sentences at once; most of their pause decodes are
    still queued when the speakers go on. Skipped, the first sentence waited for an interim that
    split it or for the next endpoint (3.3-5.6 s after its speech ended, held-out meeting). Where the
    talking is long enough for a cut at a pause decode, it runs: its sentence end is the cut there,
    and it is the final."""
    d, spec, ev = _pause_decode_waiting(3.0)
    assert not only(ev, WithdrawJob) and not only(ev, SubmitJob) and d.refresh(spec) is spec
    words = (Word(" The", 0.3, 0.5, 0.9), Word(" end.", 0.5, 2.9, 0.9))
    (split,) = only(d.job_done(spec, Hypothesis("The end.", words)), SplitUtterance)
    at = int(3.1 * SR)
    assert split.at == at
    ev = d.feed([UtteranceEnded(0, at, EndReason.SENTENCE), UtteranceStarted(1, at, at, continuation=True)])
    (final,) = only(ev, Final)
    assert (final.text, final.reason) == ("The end.", EndReason.SENTENCE)
    assert all(e.job.utterance == 1 for e in only(ev, SubmitJob))


def test_a_waiting_pause_decode_that_cannot_end_a_sentence_is_skipped_once_the_speaker_talks_on():
    """Talking too short for a cut at a pause decode, or splits off: withdrawn as before, and the
    interim of the newest audio follows. One whose utterance paused again later gives way to the
    newer pause decode."""
    for talked, split_after_s in ((1.7, 3.0), (3.0, 0.0)):
        d, spec, ev = _pause_decode_waiting(talked, split_after_s)
        assert [e.job for e in only(ev, WithdrawJob)] == [spec] and d.refresh(spec) is None
    d, spec, _ = _pause_decode_waiting(3.0)
    d.feed([audio(0, 0.2, voiced=False), UtterancePaused(0, int(3.5 * SR))])
    assert d.refresh(spec) is None
    (newer,) = [e.job for e in only(d.job_skipped(spec), SubmitJob)]
    assert newer.speculative and newer.audio_end == int(3.5 * SR)


def _second_final(d: ChannelDecoder, first: str) -> DecodeJob:
    """Utterance 0 finalized as ``first`` (the prompt of the next); utterance 1 ended, its final in flight."""
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 2.0), UtteranceEnded(0, 2 * SR, EndReason.ENDPOINT)]), SubmitJob)]
    d.job_done(job, Hypothesis(first))
    ev = d.feed([UtteranceStarted(1, 2 * SR, 2 * SR, continuation=True), audio(1, 0.8), UtteranceEnded(1, int(2.8 * SR), EndReason.ENDPOINT)])
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert job.request.kind is DecodeKind.FINAL and job.request.prompt == first
    return job


def test_a_final_that_only_echoes_its_prompt_is_decoded_again_without_it():
    d = ChannelDecoder(0, StreamOptions(interim_results=False, revisions=False))
    job = _second_final(d, "This old ever means of the second.")
    # A fragment ("of the"): Whisper gave back the sentence before it, from the prompt.
    ev = d.job_done(job, Hypothesis("this old ever means of the second"))
    assert not only(ev, Final)
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert job.request.kind is DecodeKind.FINAL and job.utterance == 1 and job.request.prompt == ""
    (final,) = only(d.job_done(job, Hypothesis("of the")), Final)
    assert (final.utterance, final.text) == (1, "Of the")  # a capital: the sentence before ended
    # What the unprompted decode hears is the final, a repetition or not.
    d = ChannelDecoder(0, StreamOptions(interim_results=False, revisions=False))
    job = _second_final(d, "Thank you very much.")
    (job,) = [e.job for e in only(d.job_done(job, Hypothesis("Thank you very much.")), SubmitJob)]
    (final,) = only(d.job_done(job, Hypothesis("Thank you very much.")), Final)
    assert final.text == "Thank you very much."
    # Two words repeated ("Yes, yes.") are taken as said.
    d = ChannelDecoder(0, StreamOptions(interim_results=False, revisions=False))
    job = _second_final(d, "Oh yes.")
    (final,) = only(d.job_done(job, Hypothesis("Oh yes.")), Final)
    assert final.text == "Oh yes."


def _final_after(seconds: float, first: str = "Sure, my name is Mary Johnson.") -> tuple[ChannelDecoder, DecodeJob]:
    """Utterance 0 finalized as ``first``; utterance 1, ``seconds`` of speech, its final in flight."""
    d = ChannelDecoder(0, StreamOptions(interim_results=False, revisions=False))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 2.0), UtteranceEnded(0, 2 * SR, EndReason.ENDPOINT)]), SubmitJob)]
    d.job_done(job, Hypothesis(first))
    end = 7 * SR + int(seconds * SR)  # after a 5 s pause
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(1, 7 * SR, 7 * SR), audio(1, seconds), UtteranceEnded(1, end, EndReason.ENDPOINT)]), SubmitJob)]
    assert job.request.prompt == first
    return d, job


def test_an_empty_final_of_speech_after_text_said_before_is_decoded_again_without_the_prompt():
    """A prompted final decode can end at once and give nothing for 2.5 s of speech; the context
    pass never hears an empty final again, so it would be lost for good."""
    d, job = _final_after(2.5)
    ev = d.job_done(job, Hypothesis(""))
    assert not only(ev, Final)
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert (job.utterance, job.request.kind, job.request.prompt, len(job.request.audio)) == (1, DecodeKind.FINAL, "", int(2.5 * SR))
    (final,) = only(d.job_done(job, Hypothesis("That is great news.")), Final)
    assert (final.utterance, final.text) == (1, "That is great news.")
    # Nothing again: the final is empty, and there is no third decode.
    d, job = _final_after(2.5)
    (job,) = [e.job for e in only(d.job_done(job, Hypothesis("")), SubmitJob)]
    ev = d.job_done(job, Hypothesis(""))
    assert [f.text for f in only(ev, Final)] == [""] and not only(ev, SubmitJob)
    # What the guards dropped (a stock phrase on noise), under 1 s of speech, or nothing said
    # before (no prompt to blame): empty at once.
    for seconds, hyp, first in [(2.5, Hypothesis("", dropped=("hallucination",)), "Hello."), (0.8, Hypothesis(""), "Hello."), (2.5, Hypothesis(""), "")]:
        d, job = _final_after(seconds, first)
        ev = d.job_done(job, hyp)
        assert [f.text for f in only(ev, Final)] == [""] and not only(ev, SubmitJob), (seconds, hyp, first)


def test_a_cut_back_final_that_heard_no_words_in_speech_is_decoded_again_carefully():
    """Under load a greedy (cut-back) final of a call's "That is great news, thank you very much."
    (2.9 s) gave "Thank you very much.", a stock phrase the guards drop, in every CI-like run; the
    beam heard the whole sentence. The redo is never cut back, and its answer is the final."""
    d, job = _final_after(2.5)
    dropped = Hypothesis("", dropped=("hallucination",), cut_back=True)
    ev = d.job_done(job, dropped)
    assert not only(ev, Final)
    (redo,) = [e.job for e in only(ev, SubmitJob)]
    assert (redo.utterance, redo.request.kind, redo.request.careful, redo.request.cut_back) == (1, DecodeKind.FINAL, True, False)
    assert redo.request.prompt == job.request.prompt and len(redo.request.audio) == len(job.request.audio)
    (final,) = only(d.job_done(redo, Hypothesis("That is great news, thank you very much.")), Final)
    assert (final.utterance, final.text) == (1, "That is great news, thank you very much.")
    # A careful decode is not redone carefully again (what the guards drop there stays dropped).
    d, job = _final_after(2.5)
    (redo,) = [e.job for e in only(d.job_done(job, dropped), SubmitJob)]
    ev = d.job_done(redo, Hypothesis("", dropped=("hallucination",), cut_back=False))
    assert [f.text for f in only(ev, Final)] == [""] and not only(ev, SubmitJob)
    # Not cut back (a beam heard nothing), under 1 s of speech, or words heard: no careful redo.
    for seconds, hyp in [(2.5, Hypothesis("", dropped=("hallucination",))), (0.8, dropped), (2.5, Hypothesis("Thank you.", cut_back=True))]:
        d, job = _final_after(seconds)
        ev = d.job_done(job, hyp)
        assert not only(ev, SubmitJob) and [f.text for f in only(ev, Final)] == [hyp.text], (seconds, hyp)


def test_a_careful_final_is_never_a_busy_one():
    d = ChannelDecoder(0, StreamOptions(interim_results=False))
    d.lean_context = True  # loaded: quick finals are busy
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 2.0), UtteranceEnded(0, 2 * SR, EndReason.ENDPOINT)]), SubmitJob)]
    assert job.request.busy and job.request.cut_back
    (redo,) = [e.job for e in only(d.job_done(job, Hypothesis("", cut_back=True)), SubmitJob)]
    assert redo.request.careful and not redo.request.busy and redo.request.short_window


def test_an_echo_is_judged_against_the_prompt_its_decode_was_given():
    """A context pass may revise the text before an utterance while its final is being decoded
    (the channel's prompt changes): the echo is of the prompt the decode had, and still caught."""
    d = ChannelDecoder(0, StreamOptions(interim_results=False, revisions=False))
    job = _second_final(d, "This old ever means of the second.")
    d._prompt = "is all that remains of the second"  # as a revision of utterance 0 would leave it
    ev = d.job_done(job, Hypothesis("This old ever means of the second."))
    assert not only(ev, Final)
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert job.utterance == 1 and job.request.prompt == ""


def test_a_stream_without_interims_still_splits_long_utterances_at_sentence_ends():
    # Deepgram's clients ask for no interims by default: their finals should come per sentence too.
    d = ChannelDecoder(0, StreamOptions(interim_results=False, interim_ms=500, split_after_s=3.0))
    assert not only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 2.5)]), SubmitJob)  # short yet: nothing to find
    (job,) = [e.job for e in only(d.feed([audio(0, 1.0)]), SubmitJob)]
    assert job.request.kind is DecodeKind.INTERIM and job.request.word_timestamps
    ev = d.job_done(job, _sentence_then_more())
    assert not only(ev, Interim)  # decoded for the split, never sent
    (split,) = only(ev, SplitUtterance)
    assert (split.lo, split.hi) == (int(2.0 * SR), int(2.5 * SR))
    # Turned off, such a stream decodes nothing before its utterance ends.
    off = ChannelDecoder(0, StreamOptions(interim_results=False, interim_ms=500, split_after_s=0))
    assert not only(off.feed([UtteranceStarted(0, 0, 0), audio(0, 2.5), audio(0, 1.0)]), SubmitJob)


def _words(text: str, start: float, end: float) -> tuple[Word, ...]:
    parts = text.split()
    step = (end - start) / len(parts)
    return tuple(Word(" " + w, round(start + i * step, 3), round(start + (i + 1) * step, 3), 0.9) for i, w in enumerate(parts))


def _stopped_short(words_end: float):
    """A 6 s utterance after one final ("before."), ended; its final decode heard two words, ending
    at ``words_end``: the decoder and what that answer gave (no context pass: the first pass alone
    is what a stream with ``revisions=false`` keeps)."""
    d = ChannelDecoder(0, StreamOptions(interim_results=False, revisions=False))
    ev = d.feed([UtteranceStarted(0, 0, 0), audio(0, 1.0), UtteranceEnded(0, SR, EndReason.ENDPOINT)])
    d.job_done(only(ev, SubmitJob)[0].job, Hypothesis("before.", _words("before.", 0.1, 0.9)))
    ev = d.feed([UtteranceStarted(1, 2 * SR, 2 * SR), audio(1, 6.0), UtteranceEnded(1, 8 * SR, EndReason.ENDPOINT)])
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert job.request.prompt == "before."
    return d, d.job_done(job, Hypothesis("In winter.", _words("In winter.", 0.2, words_end)))


def test_a_final_decode_that_stopped_short_of_its_audio_goes_on_from_its_last_word():
    """Whisper can end a decode early (a fast narration under noise: an utterance held two
    sentences and its final gave the first alone). The rest of the audio, from the last word's
    end, is decoded once more without the text before it as prompt, and the final holds both."""
    d, ev = _stopped_short(words_end=2.5)
    assert not only(ev, Final)
    (job,) = [e.job for e in only(ev, SubmitJob)]
    assert job.request.kind is DecodeKind.FINAL and not job.speculative
    assert len(job.request.audio) == int(3.5 * SR) and job.request.prompt == ""
    (final,) = only(d.job_done(job, Hypothesis("Ships passed.", _words("Ships passed.", 0.5, 3.0))), Final)
    assert final.text == "In winter. Ships passed."
    assert [(w.word.strip(), w.start) for w in final.words] == [("In", 2.2), ("winter.", 3.35), ("Ships", 5.0), ("passed.", 6.25)]
    assert d.idle


def test_a_final_decode_is_continued_once_and_a_failed_continuation_keeps_what_was_heard():
    d, ev = _stopped_short(words_end=2.5)
    (job,) = [e.job for e in only(ev, SubmitJob)]
    (final,) = only(d.job_failed(job), Final)
    assert final.text == "In winter."
    d, ev = _stopped_short(words_end=2.5)
    (job,) = [e.job for e in only(ev, SubmitJob)]
    (final,) = only(d.job_done(job, Hypothesis("")), Final)  # the rest held no words after all
    assert final.text == "In winter." and d.idle


def test_a_final_decode_whose_words_reach_near_its_end_is_the_final():
    d, ev = _stopped_short(words_end=4.5)  # 1.5 s of audio after its last word
    assert not only(ev, SubmitJob)
    (final,) = only(ev, Final)
    assert final.text == "In winter."


def _continued_to_a_pause(busy: bool):
    """Utterance 0 talked 3.0 s and was cut at a sentence end at 2.0 s; utterance 1, the rest of
    that talking, talked 0.5 s more, paused (a pause decode would end at 3.6 s) and went on 0.3 s,
    all while utterance 0's final was still being decoded (``busy``) or after it and an interim of
    utterance 1 were answered.
    The decoder, that final's job and the jobs asked when the speaker paused."""
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 3.0)]), SubmitJob)]
    d.job_done(job, Hypothesis("Sentence one and"))
    cut = 2 * SR
    ev = d.feed([UtteranceEnded(0, cut, EndReason.SENTENCE), UtteranceStarted(1, cut, cut, continuation=True, talk_start=0)])
    (final,) = [e.job for e in only(ev, SubmitJob)]
    assert final.utterance == 0 and not final.speculative
    if not busy:
        ev = d.job_done(final, Hypothesis("Sentence one."))
        (interim,) = [e.job for e in only(ev, SubmitJob)]
        d.job_done(interim, Hypothesis("And"))
    ev = d.feed([audio(1, 0.5), audio(1, 0.1, voiced=False), UtterancePaused(1, int(3.6 * SR))])
    asked = [e.job for e in only(ev, SubmitJob)]
    return d, final, asked + [e.job for e in only(d.feed([audio(1, 0.3)]), SubmitJob)]


def test_a_pause_that_passed_while_the_sentence_before_was_decoded_gets_its_pause_decode():
    """One decode in flight per channel: under load the final of a sentence cut off by a split
    can still be queued when the next sentence ends at a short pause and the speaker goes on,
    and no pause decode heard that pause (16 streams in step: that sentence's final came with
    the next one's, 5-6 s late). Once the final is answered, the pause decode it held back is
    asked; when its words end a sentence, the cut is asked exactly there, and it is the final."""
    d, final, asked = _continued_to_a_pause(busy=True)
    assert not asked  # the slot is held by utterance 0's final
    ev = d.job_done(final, Hypothesis("Sentence one."))
    assert only(ev, Final)[0].utterance == 0
    (spec,) = [e.job for e in only(ev, SubmitJob)]
    at = int(3.6 * SR)
    assert (spec.utterance, spec.speculative, spec.audio_end, spec.request.kind) == (1, True, at, DecodeKind.FINAL)
    words = (Word(" And", 0.1, 0.4, 0.9), Word(" two.", 0.4, 1.5, 0.9))
    (split,) = only(d.job_done(spec, Hypothesis("And two.", words)), SplitUtterance)
    assert (split.at, split.pause_ms) == (at, SENTENCE_PAUSE_MS)
    ev = d.feed([UtteranceEnded(1, at, EndReason.SENTENCE), UtteranceStarted(2, at, at, continuation=True, talk_start=0)])
    (done,) = only(ev, Final)
    assert (done.utterance, done.text, done.reason) == (1, "And two.", EndReason.SENTENCE)
    assert all(e.job.utterance == 2 for e in only(ev, SubmitJob))  # no second decode of utterance 1


def test_a_pause_decode_asked_while_the_pause_lasted_is_not_asked_again():
    """With the slot free when the speaker paused, the pause decode is asked at once, as always,
    and not again once speech resumes."""
    d, _, asked = _continued_to_a_pause(busy=False)
    (spec,) = asked
    assert spec.speculative and spec.audio_end == int(3.6 * SR)
    ev = d.job_done(spec, Hypothesis("And", (Word(" And", 0.1, 0.4, 0.9),)))
    assert all(not e.job.speculative for e in only(ev, SubmitJob))


def test_a_pause_heard_before_the_cut_that_came_after_it_is_decoded_for_the_utterance_cut_off():
    """A split asked late (its interim queued under load) cuts before a pause the VAD had
    already heard: the pause decode asked then was the utterance before the cut's, and none
    heard the pause as the end of the part after it. That part gets one once the final of the
    part before the cut is answered."""
    d = ChannelDecoder(0, StreamOptions(interim_ms=500, split_after_s=3.0))
    (job,) = [e.job for e in only(d.feed([UtteranceStarted(0, 0, 0), audio(0, 3.0)]), SubmitJob)]
    d.job_done(job, Hypothesis("Sentence one and"))
    (spec0,) = [e.job for e in only(d.feed([audio(0, 0.1, voiced=False), UtterancePaused(0, int(3.1 * SR))]), SubmitJob)]
    d.feed([audio(0, 0.3)])
    cut = 2 * SR
    d.feed([UtteranceEnded(0, cut, EndReason.SENTENCE), UtteranceStarted(1, cut, cut, continuation=True, talk_start=0)])
    (final,) = [e.job for e in only(d.job_done(spec0, Hypothesis("Sentence one and two.")), SubmitJob)]
    assert final.utterance == 0 and not final.speculative
    (spec,) = [e.job for e in only(d.job_done(final, Hypothesis("Sentence one.")), SubmitJob)]
    assert (spec.utterance, spec.speculative, spec.audio_end) == (1, True, int(3.1 * SR))
