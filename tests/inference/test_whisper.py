import math
import sys
import threading

import numpy as np
import pytest

from asr_server.inference.whisper import DecodeKind, DecodeRequest, ModelNotFound, WhisperRunner, resolve_model


def test_real_model_interim_and_final(whisper_runner):
    from ..harness import MANIFEST, load_mono
    from ..wer import wer

    start, end = MANIFEST["espeak_16k.wav"]["spans"][0][1]
    audio = load_mono("espeak_16k.wav")[int((start - 0.3) * 16000) : int((end + 0.2) * 16000)]
    interim = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.INTERIM))
    final = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.FINAL, word_timestamps=True))
    short = DecodeRequest(audio, DecodeKind.INTERIM, short_window=True)
    assert whisper_runner.window_frames(short) < whisper_runner.window_frames(DecodeRequest(audio, DecodeKind.INTERIM))
    assert whisper_runner.batch_key(short) != whisper_runner.batch_key(DecodeRequest(audio, DecodeKind.INTERIM))
    # The sentence, heard by every kind of decode. Not word for word: the same int8 model gives
    # slightly different numbers on different CPUs (oneDNN's kernels on AMD, MKL's on Intel), and
    # tiny.en hears this synthetic voice's "back" as "Mac" on some of them.
    reference = MANIFEST["espeak_16k.wav"]["references"][0][1]
    for hyp in (interim, final, whisper_runner.transcribe(short)):
        assert wer(reference, hyp.text) <= 0.2, hyp.text
    assert final.words and all(0 <= w.start <= w.end <= len(audio) / 16000 + 0.01 for w in final.words)


def test_a_busy_final_decodes_greedily_on_the_burst_window_but_not_as_a_burst(whisper_runner):
    """A quick final under load costs what a burst final does, yet keeps the finals' own copy of
    the weights (a burst has every worker on finals; a busy final has the cores to itself) and
    its own batches: a quick final's beam or a burst's copy would be the wrong one for it."""
    from ..harness import MANIFEST, load_mono
    from ..wer import wer

    start, end = MANIFEST["espeak_16k.wav"]["spans"][0][1]
    audio = load_mono("espeak_16k.wav")[int((start - 0.3) * 16000) : int((end + 0.2) * 16000)]
    quick = DecodeRequest(audio, DecodeKind.FINAL, word_timestamps=True, short_window=True)
    busy = DecodeRequest(audio, DecodeKind.FINAL, word_timestamps=True, short_window=True, busy=True)
    burst = DecodeRequest(audio, DecodeKind.FINAL, word_timestamps=True, short_window=True, burst=True)
    assert whisper_runner.window_frames(busy) == whisper_runner.window_frames(burst) < whisper_runner.window_frames(quick)
    assert whisper_runner._beam(DecodeKind.FINAL, busy) == 1 < whisper_runner._beam(DecodeKind.FINAL, quick)
    keys = {whisper_runner.batch_key(r) for r in (quick, busy, burst)}
    assert len(keys) == 3 and not whisper_runner.batch_key(busy).burst  # burst in the key: the shared copy
    hyp = whisper_runner.transcribe(busy)
    assert wer(MANIFEST["espeak_16k.wav"]["references"][0][1], hyp.text) <= 0.2, hyp.text  # as in the test above
    assert hyp.words  # the guards and the context pass need its words


def test_a_settle_decode_searches_wider_than_a_pass_and_never_shares_its_call(whisper_runner, monkeypatch):
    """Settle decodes run only while the server has time to spare and decide a stretch for good,
    so their beam is ``settle_beam_size`` (10) where a pass's is 5; a settle decode and a pass
    with the same window and prompt length never share a model call (their batch keys differ:
    a call has one beam). A late pass's long prompt makes it no settle decode: its beam is a pass's."""
    from ..harness import MANIFEST, load_mono
    from ..wer import wer

    start, end = MANIFEST["espeak_16k.wav"]["spans"][0][1]
    audio = load_mono("espeak_16k.wav")[int((start - 0.3) * 16000) : int((end + 0.2) * 16000)]
    settle = DecodeRequest(audio, DecodeKind.CONTEXT, word_timestamps=True, long_prompt=True, settle=True)
    pass_ = DecodeRequest(audio, DecodeKind.CONTEXT, word_timestamps=True)
    late = DecodeRequest(audio, DecodeKind.CONTEXT, word_timestamps=True, short_window=True, long_prompt=True)
    assert whisper_runner.batch_key(settle) != whisper_runner.batch_key(pass_)
    beams: list[int] = []
    attempt = whisper_runner._attempt

    def counted(tokenizer, items, source, temperature, beam_size):
        beams.append(beam_size)
        return attempt(tokenizer, items, source, temperature, beam_size)

    monkeypatch.setattr(whisper_runner, "_attempt", counted)
    hyps = [whisper_runner.transcribe(settle), whisper_runner.transcribe(pass_), whisper_runner.transcribe(late)]
    assert beams == [10, 5, 5]
    for hyp in hyps:
        assert wer(MANIFEST["espeak_16k.wav"]["references"][0][1], hyp.text) <= 0.2, hyp.text
    with pytest.raises(ValueError):
        WhisperRunner(resolve_model("tiny.en"), settle_beam_size=0)


def test_the_runaway_guard_lets_a_decode_give_as_many_tokens_as_it_says(whisper_runner, monkeypatch):
    """CTranslate2's Whisper decodes at most half the ``max_length`` it is given: asked for the
    guard's count as it was, a decode stopped at half of it, and a 21 s context pass of a fast
    reader lost its last sentence mid-word ("... plenty of gr"). A guard of 12 tokens must let
    about 12 through, and no more."""
    from asr_server.inference import whisper as module

    from ..harness import MANIFEST, load_mono

    spans = MANIFEST["librivox_16k.wav"]["spans"][0]
    audio = load_mono("librivox_16k.wav")[int((spans[0][0] - 0.3) * 16000) : int((spans[1][1] + 0.2) * 16000)]
    tokenizer = whisper_runner._tokenizer("en")
    full = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.CONTEXT, word_timestamps=True))
    assert len(tokenizer.encode(full.text)) > 20  # two sentences: far more than the guard below
    monkeypatch.setattr(module, "max_new_tokens", lambda duration: 12)
    for kind in (DecodeKind.CONTEXT, DecodeKind.INTERIM):
        cut = whisper_runner.transcribe(DecodeRequest(audio, kind, word_timestamps=kind.final_quality))
        # Timestamp tokens count too (a context decode's first is one), and the text is encoded
        # again here, a token either way: 8-13, where the halved guard let 5 or 6 through.
        assert 8 <= len(tokenizer.encode(cut.text)) <= 13, (kind, cut.text)
        assert cut.text.lower().split()[:2] == full.text.lower().split()[:2], (full.text, cut.text)  # its start


def test_a_settle_decode_keeps_128_tokens_of_its_prompt_and_decodes_as_many_tokens_as_it_says(whisper_runner, monkeypatch):
    """A settle decode's prompt is the last 128 tokens of the text before it (32 for others). The
    decoder also stops at ``max_length`` less the prompt: given 24 after a 130-token prompt it
    crashed the process (a settle decode's continuation on 5 s of audio)."""
    from asr_server.inference import whisper as module

    from ..harness import MANIFEST, load_mono

    spans = MANIFEST["librivox_16k.wav"]["spans"][0]
    audio = load_mono("librivox_16k.wav")[int((spans[0][0] - 0.3) * 16000) : int((spans[1][1] + 0.2) * 16000)]
    tokenizer = whisper_runner._tokenizer("en")
    prompt = " ".join(MANIFEST["librivox_16k.wav"]["references"][0][1] for _ in range(20))
    assert len(whisper_runner._prompt_tokens(tokenizer, prompt, long=True)) == 128
    assert len(whisper_runner._prompt_tokens(tokenizer, prompt)) == 32
    # A stream's vocabulary goes first, whole; the text before is what it is without one.
    vocabulary = tokenizer.encode(" Dashwood, Norland Park")
    for long, limit in ((False, 32), (True, 128)):
        tokens = whisper_runner._prompt_tokens(tokenizer, prompt, long=long, vocabulary="Dashwood, Norland Park")
        assert tokens == vocabulary + whisper_runner._prompt_tokens(tokenizer, prompt, long=long) and len(tokens) == len(vocabulary) + limit
    assert whisper_runner._prompt_tokens(tokenizer, "", vocabulary="Dashwood, Norland Park") == vocabulary  # alone: whole, not cut to 4
    # A vocabulary of 200 odd characters (far over 64 tokens) is capped, and a decode with it and
    # a long prompt stays within Whisper's prompt positions: it decodes, it does not crash.
    odd = "\u02a4" * 200
    assert len(whisper_runner._prompt_tokens(tokenizer, prompt, long=True, vocabulary=odd)) == 64 + 128
    heard = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.CONTEXT, prompt=prompt, word_timestamps=True, long_prompt=True, vocabulary=odd))
    assert heard.words, heard.text
    monkeypatch.setattr(module, "max_new_tokens", lambda duration: 12)
    cut = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.CONTEXT, prompt=prompt, word_timestamps=True, long_prompt=True))
    assert 8 <= len(tokenizer.encode(cut.text)) <= 13, cut.text  # as in the test above


def test_a_context_pass_that_stops_early_decodes_the_rest_of_its_audio(whisper_runner, monkeypatch):
    """Whisper can end a window's decode on a pair of timestamps (a segment closed, the next begun)
    long before the audio ends, the last sentence unheard: offline transcription seeks there and
    decodes on. A context pass made to stop so after the first of two sentences still hears the
    second, with its words after the first's and within the audio; stopped in the last half
    second, or after the audio whose words it needs, it decodes nothing more."""
    from ..harness import MANIFEST, load_mono
    from ..wer import wer

    spans = MANIFEST["librivox_16k.wav"]["spans"][0]
    references = MANIFEST["librivox_16k.wav"]["references"][0]
    begin = spans[1][0] - 0.3
    audio = load_mono("librivox_16k.wav")[int(begin * 16000) : int((spans[2][1] + 0.2) * 16000)]
    attempt, calls = whisper_runner._attempt, []

    def stops_at(seconds: float):
        def early(tok, items, source, temperature, beam_size):
            calls.append(items[0].request.duration)
            out = attempt(tok, items, source, temperature, beam_size)
            if len(calls) > 1:
                return out
            stamp = tok.timestamp_begin + round(seconds / 0.02)
            said = tok.encode(" He was not an ill-disposed young man.")
            return [a._replace(tokens=[tok.timestamp_begin, *said, stamp, stamp]) for a in out]
        return early

    monkeypatch.setattr(whisper_runner, "_attempt", stops_at(spans[1][1] - begin + 0.3))
    hyp = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.CONTEXT, word_timestamps=True))
    assert len(calls) == 2 and calls[1] < len(audio) / 16000 - 3  # the rest, decoded once more
    assert wer(" ".join(references[1:3]), hyp.text) <= 0.2, hyp.text
    starts = [w.start for w in hyp.words]
    assert starts == sorted(starts) and hyp.words[-1].end <= len(audio) / 16000 + 0.01
    k = next(k for k, w in enumerate(hyp.words) if w.word.strip() == "man.")
    assert hyp.words[k + 1].start >= spans[1][1] - begin  # "Unless", after the first sentence
    calls.clear()
    monkeypatch.setattr(whisper_runner, "_attempt", stops_at(len(audio) / 16000 - 0.5))
    hyp = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.CONTEXT, word_timestamps=True))
    assert len(calls) == 1 and hyp.text == "He was not an ill-disposed young man."
    # Stopped after the audio whose words the pass needs (the rest: a lookahead it drops): no more.
    calls.clear()
    first_end = spans[1][1] - begin
    monkeypatch.setattr(whisper_runner, "_attempt", stops_at(first_end + 0.3))
    hyp = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.CONTEXT, word_timestamps=True, needed_s=first_end + 0.5))
    assert len(calls) == 1 and hyp.text == "He was not an ill-disposed young man."


def test_early_stop_is_a_decode_ending_on_two_timestamps_with_audio_left():
    """Whisper's own rule: a decode that ends on one timestamp closed its segment at the end of what
    it heard; one that ends on two began another and stopped."""
    from asr_server.inference.whisper import CONTINUE_REST_S, early_stop

    class Tok:
        timestamp_begin = 1000

    def at(seconds: float) -> int:
        return Tok.timestamp_begin + round(seconds / 0.02)

    assert early_stop(Tok, [at(0.0), 5, 6, at(4.0), at(4.0)], 10.0) == pytest.approx(4.0)
    assert early_stop(Tok, [at(0.0), 5, 6, at(4.0)], 10.0) is None  # one timestamp: done
    assert early_stop(Tok, [at(0.0), 5, 6, at(9.5), at(9.5)], 10.0) is None  # too little left
    assert early_stop(Tok, [at(0.0), 5, 6, at(4.0), at(4.0)], 4.0 + CONTINUE_REST_S) == pytest.approx(4.0)
    assert early_stop(Tok, [at(0.0), 5, 6], 10.0) is None and early_stop(Tok, [], 10.0) is None


def test_a_decode_that_runs_to_its_token_budget_is_doubtful(whisper_runner, monkeypatch):
    """A decode that gives as many tokens as its runaway guard allows is a loop Whisper's checks let
    through (a fast recipe under noise: "cookie tony, the tony, tony, tony, ..." to the budget), so
    its hypothesis is marked doubtful (``sampled``: no prompt, and the context pass's words win);
    the same final with room to end is not."""
    from asr_server.inference import whisper as module

    from ..harness import MANIFEST, load_mono

    start, end = MANIFEST["espeak_16k.wav"]["spans"][0][1]
    audio = load_mono("espeak_16k.wav")[int((start - 0.3) * 16000) : int((end + 0.2) * 16000)]
    final = DecodeRequest(audio, DecodeKind.FINAL, word_timestamps=True, short_window=True)
    assert not whisper_runner.transcribe(final).sampled
    monkeypatch.setattr(module, "max_new_tokens", lambda duration: 6)
    cut = whisper_runner.transcribe(final)
    assert cut.sampled and cut.text  # kept (the guards and the pass decide), but doubtful


def test_model_resolution(tmp_path):
    assert resolve_model("tiny.en").endswith("model")
    with pytest.raises(ModelNotFound, match="model.bin"):
        resolve_model(str(tmp_path))
    with pytest.raises(ModelNotFound, match="neither"):
        resolve_model("huge-v9")


def test_batched_decodes_give_the_same_text_as_one_at_a_time(whisper_runner):
    """Several streams' utterances in one model call: same words as decoding each alone.

    Finals are batched, not packed, here (packing changes the window: test_packing).
    """
    whisper_runner.pack_finals = False
    try:
        _batched_equals_alone(whisper_runner)
    finally:
        whisper_runner.pack_finals = True


def _batched_equals_alone(whisper_runner):
    from collections import defaultdict

    from ..harness import MANIFEST, load_mono

    requests = []
    for name in ("librivox_16k.wav", "cards_16k.wav"):
        audio = load_mono(name)
        for start, end in MANIFEST[name]["spans"][0][:3]:
            clip = audio[int((start - 0.3) * 16000) : int((end + 0.2) * 16000)]
            requests.append(DecodeRequest(clip, DecodeKind.FINAL, word_timestamps=True))
            requests.append(DecodeRequest(clip[: len(clip) // 2], DecodeKind.INTERIM, prompt="He was not an ill disposed young man."))
    groups = defaultdict(list)
    for i, r in enumerate(requests):
        groups[whisper_runner.batch_key(r)].append(i)
    assert max(len(g) for g in groups.values()) >= 3  # real batches, not batches of one
    batched = {}
    for indices in groups.values():
        for i, hyp in zip(indices, whisper_runner.transcribe_batch([requests[i] for i in indices])):
            batched[i] = hyp
    for i, r in enumerate(requests):
        alone = whisper_runner.transcribe(r)
        assert batched[i].text == alone.text, (r.kind, alone.text, batched[i].text)
        assert [w.word for w in batched[i].words] == [w.word for w in alone.words]
    assert all(batched[i].text for i in batched)


def test_requests_with_different_keys_cannot_share_a_batch(whisper_runner):
    a = DecodeRequest(np.zeros(16000, np.float32), DecodeKind.FINAL)
    b = DecodeRequest(np.zeros(16000, np.float32), DecodeKind.INTERIM)
    with pytest.raises(ValueError, match="batch key"):
        whisper_runner.transcribe_batch([a, b])


def test_finals_decode_on_the_wide_copy_one_call_at_a_time():
    """With more threads for finals than for other calls, a call of finals takes the copy of the
    weights loaded with them, unless another call of finals is on it (it then decodes as the rest;
    the background copy computes at normal priority here, so no call waits for the wide one)."""
    import threading

    runner = WhisperRunner(resolve_model("tiny.en"), cpu_threads=1, workers=2, final_threads=2)
    assert runner.final_threads == 2
    base = runner.model

    def model_for(kind: DecodeKind, found: dict) -> None:
        with runner._using(kind):
            found[kind] = runner.model

    with runner._using(DecodeKind.FINAL):
        wide = runner.model
        beside: dict = {}
        for kind in (DecodeKind.FINAL, DecodeKind.CONTEXT, DecodeKind.INTERIM):
            worker = threading.Thread(target=model_for, args=(kind, beside))
            worker.start()
            worker.join()
    assert wide is not base and all(model is base for model in beside.values())
    after: dict = {}
    model_for(DecodeKind.FINAL, after)
    assert after[DecodeKind.FINAL] is wide  # free again once the first call ended
    with runner._using(DecodeKind.FINAL, burst=True):
        assert runner.model is wide  # the first call of a burst has the cores at the finals' priority ...
        beside = {}
        worker = threading.Thread(target=lambda: beside.update(burst=_burst_model(runner)))
        worker.start()
        worker.join()  # ... and the next one does not wait for it: it decodes on the shared copy
        assert beside["burst"] is base
        # Its finals say so (the capacity model learns a burst's pace from the shared copy's calls).
        burst = DecodeRequest(np.zeros(16000, np.float32), DecodeKind.FINAL, short_window=True, burst=True)
        assert runner.transcribe_batch([burst])[0].finals_copy is False  # this thread holds the finals' copy
    assert runner.transcribe_batch([burst])[0].finals_copy is True
    assert runner.measure_burst_final(repeats=1, concurrent=2) > 0
    assert runner.measure_context_pass(seconds=6.0, tokens=8) > 0
    # A re-measure that a session interrupts makes no model call more and says so with NaN.
    asked: list[int] = []

    def stop_after_two() -> bool:
        asked.append(1)
        return len(asked) > 2

    assert math.isnan(runner.measure_burst_final(repeats=3, concurrent=1, stop=stop_after_two))
    assert len(asked) == 3  # asked before each decode: two ran, the third did not
    assert math.isnan(runner.measure_burst_final(repeats=1, concurrent=2, stop=lambda: True))
    assert math.isnan(runner.measure_context_pass(seconds=6.0, tokens=8, stop=lambda: True))
    same = WhisperRunner(resolve_model("tiny.en"), cpu_threads=2, final_threads=2)
    with same._using(DecodeKind.FINAL):
        assert same.final_threads == 2 and same.model is same._base_model  # no second copy


def _burst_model(runner: WhisperRunner):
    with runner._using(DecodeKind.FINAL, burst=True):
        return runner.model


def _model(runner: WhisperRunner, kind: DecodeKind):
    with runner._using(kind):
        return runner.model


def _threads() -> set[int]:
    import os

    return {int(tid) for tid in os.listdir("/proc/self/task")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_the_copy_for_interims_and_passes_computes_below_the_finals_copy_in_cpu_priority():
    """A final beside a context pass gets the cores first: the shared copy's compute threads
    start at the lowered priority, the finals' copy's at the process's, which stays as it was."""
    from asr_server.inference.priority import thread_nice

    own = thread_nice(threading.get_native_id())
    before = _threads()
    runner = WhisperRunner(resolve_model("tiny.en"), cpu_threads=1, workers=2, final_threads=2, background_nice=3, burst_copy=False)
    niceness = sorted(thread_nice(tid) for tid in _threads() - before)
    assert runner.background_nice == 3
    assert niceness.count(min(19, own + 3)) >= 2  # one compute thread per worker of the shared copy
    assert own in niceness  # the finals' copy
    assert thread_nice(threading.get_native_id()) == own
    assert runner.transcribe(DecodeRequest(np.zeros(16000, np.float32), DecodeKind.FINAL, word_timestamps=True)).text is not None
    same = WhisperRunner(resolve_model("tiny.en"), cpu_threads=2, final_threads=2, background_nice=3)
    assert same.background_nice == 0  # no finals' copy to give way to: nothing lowered

    # A second call of finals waits for the finals' copy rather than run on the lowered one
    # (with no burst copy to decode on instead).
    entered = threading.Event()
    found: dict = {}

    def second_final() -> None:
        with runner._using(DecodeKind.FINAL):
            found["model"] = runner.model
            entered.set()

    with runner._using(DecodeKind.FINAL):
        wide = runner.model
        worker = threading.Thread(target=second_final)
        worker.start()
        with runner._using(DecodeKind.CONTEXT):  # other kinds go to the shared copy at once
            assert runner.model is runner._base_model
        assert not entered.wait(0.2)  # still waiting for the first call of finals
    worker.join()
    assert found["model"] is wide is not runner._base_model


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_calls_of_burst_finals_decode_at_once_on_their_own_copy_at_the_finals_priority():
    """In a burst every worker kept for finals decodes one: two one-thread calls at once drain a
    burst a third faster on 2 cores than one call on both. They take neither the finals' copy (one
    call at a time) nor the lowered shared one (whose threads give way to every other call); nor
    does a call of finals wait for the finals' copy while another has it: it decodes there too."""
    from asr_server.inference.priority import thread_nice

    own = thread_nice(threading.get_native_id())
    before = _threads()
    runner = WhisperRunner(resolve_model("tiny.en"), cpu_threads=1, workers=2, final_threads=2, background_nice=3)
    niceness = sorted(thread_nice(tid) for tid in _threads() - before)
    assert niceness.count(own) >= 1 + 2  # the finals' copy, and one per worker of the burst copy
    burst = runner._burst_model
    assert burst is not None and burst is not runner._base_model and burst is not runner._wide_model
    inside = threading.Barrier(2, timeout=30)  # both calls must be inside at once, or it breaks
    found: list = []

    def burst_call() -> None:
        with runner._using(DecodeKind.FINAL, burst=True) as wide:
            found.append((runner.model, wide))
            inside.wait()

    with runner._using(DecodeKind.FINAL) as first:  # a call of finals on the finals' copy does not hold them up
        assert first and runner.model is runner._wide_model
        calls = [threading.Thread(target=burst_call) for _ in range(2)]
        for call in calls:
            call.start()
        for call in calls:
            call.join()
        second = threading.Thread(target=lambda: found.append(_model(runner, DecodeKind.FINAL)))
        second.start()
        second.join(timeout=30)
        assert not second.is_alive()  # it did not wait for the first
    assert found == [(burst, False), (burst, False), burst]
    assert _model(runner, DecodeKind.FINAL) is runner._wide_model  # the finals' copy is free again
    assert _model(runner, DecodeKind.INTERIM) is runner._base_model
    request = DecodeRequest(np.zeros(16000, np.float32), DecodeKind.FINAL, short_window=True, burst=True)
    assert runner.transcribe_batch([request])[0].finals_copy is False  # the capacity model learns from it
    assert runner.measure_burst_final(repeats=1, concurrent=2) > 0
    off = WhisperRunner(resolve_model("tiny.en"), cpu_threads=1, workers=2, final_threads=2, background_nice=3, burst_copy=False)
    assert off._burst_model is None and _burst_model(off) is off._wide_model  # the first of a burst: the finals' copy
    level = WhisperRunner(resolve_model("tiny.en"), cpu_threads=1, workers=2, final_threads=2)
    assert level._burst_model is None  # nothing lowered: the shared copy computes at the finals' priority already


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_finals_decode_on_one_thread_where_the_wide_copy_is_no_faster():
    """On some machines a lone final is slower on a thread per core than on one (a 2-core Xeon:
    0.19 s against 0.13 s): there every call of finals decodes on the burst copy, one thread at
    the finals' priority, and the wide copy is let go; where it is clearly faster it keeps them.
    Both timed on the real model; without a burst copy there is no one-thread copy at that
    priority to choose."""
    runner = WhisperRunner(resolve_model("tiny.en"), cpu_threads=1, workers=2, final_threads=2, background_nice=3)
    timed = runner.measure_final_copies(seconds=2.0, tokens=4, repeats=1)
    assert timed is not None and all(t > 0 for t in timed)
    wide = runner._wide_model
    assert runner.choose_final_copy(0.58, 0.87) is True  # the slow EPYC's figures: two threads clearly faster
    assert runner.final_threads == 2 and _model(runner, DecodeKind.FINAL) is wide
    assert runner.choose_final_copy(0.80, 0.87) is False  # faster, not clearly: it would hold both cores
    assert runner.final_threads == 1
    assert _model(runner, DecodeKind.FINAL) is runner._burst_model  # not the wide copy, not the lowered one
    assert _model(runner, DecodeKind.INTERIM) is runner._base_model
    request = DecodeRequest(np.zeros(16000, np.float32), DecodeKind.FINAL, short_window=True)
    assert runner.transcribe_batch([request])[0].finals_copy is False
    assert runner._wide_model is None  # let go: its memory is the streams'
    assert runner.choose_final_copy(0.19, 0.13) is False and runner.choose_final_copy(0.58, 0.87) is False
    assert runner.measure_final_copies(repeats=1) is None
    off = WhisperRunner(resolve_model("tiny.en"), cpu_threads=1, workers=2, final_threads=2, background_nice=3, burst_copy=False)
    assert off.measure_final_copies(repeats=1) is None
    assert off.choose_final_copy(0.19, 0.13) is True and _model(off, DecodeKind.FINAL) is off._wide_model


def test_a_load_lowered_that_fails_raises_in_the_caller():
    from asr_server.inference.priority import call_lowered

    def broken() -> None:
        raise ModelNotFound("no weights here")

    with pytest.raises(ModelNotFound, match="no weights"):
        call_lowered(4, broken)
    assert call_lowered(0, lambda: threading.get_native_id()) == threading.get_native_id()


def test_a_quick_final_keeps_its_beam_attempt_where_a_full_final_falls_back(whisper_runner, monkeypatch):
    """Whisper's temperature fallback re-encodes the audio and samples again when a beam attempt
    fails its checks: in the room, on an 8 kHz caller, that made a pause decode take 0.5-0.77 s
    instead of 0.2 s, for a final the context pass rewrote anyway. A quick final (a stream with
    revisions: the pass refines it) keeps the beam attempt and is marked doubtful (``sampled``:
    not a prompt, and the pass's wording wins); a full final still falls back."""
    from ..harness import MANIFEST, load_mono

    start, end = MANIFEST["espeak_16k.wav"]["spans"][0][1]
    audio = load_mono("espeak_16k.wav")[int((start - 0.3) * 16000) : int((end + 0.2) * 16000)]
    tried: list[float] = []
    attempt = whisper_runner._attempt

    def unlikely(tokenizer, items, source, temperature, beam_size):  # every attempt fails the log-probability check
        tried.append(temperature)
        return [a._replace(avg_logprob=-2.0) for a in attempt(tokenizer, items, source, temperature, beam_size)]

    monkeypatch.setattr(whisper_runner, "_attempt", unlikely)
    quick = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.FINAL, word_timestamps=True, short_window=True))
    assert tried == [0.0] and quick.sampled and quick.text and quick.words
    tried.clear()
    full = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.FINAL, word_timestamps=True))
    assert tried == [0.0, 0.4, 0.8] and full.text


def test_a_language_two_workers_meet_first_at_once_gives_each_a_tokenizer_it_can_decode_with(monkeypatch):
    """Seen with two burst calls timed at once on a fresh runner: the second worker to build
    the tokenizer replaced the first one's entry, and the first one's decode failed looking up
    its suppressed tokens. Here the other worker builds its tokenizer while this one is building."""
    from asr_server.inference import fw

    runner = WhisperRunner(resolve_model("tiny.en"), cpu_threads=1)
    assert not runner._tokens
    real = fw.tokens_for
    meanwhile: list = []

    def racing(model, language):
        if not meanwhile:
            meanwhile.append(None)
            meanwhile.append(runner._tokenizer(language))  # the other worker, in between
        return real(model, language)

    monkeypatch.setattr(fw, "tokens_for", racing)
    mine = runner._tokenizer("en")
    assert mine is meanwhile[1]  # the first entry stored stays
    assert runner._suppress(mine) and runner._suppress(meanwhile[1])


def test_a_quiet_talkers_decodes_reach_the_model_raised_by_the_talkers_gain(whisper_runner, monkeypatch):
    """A request's ``gain_db`` (the talker's, set by the session from its VAD) raises its audio before
    the features, alone and in a pack: the quiet sentence is heard as the one at the usual level."""
    from ..harness import MANIFEST, load_mono
    from ..wer import edit_distance, normalize, wer

    start, end = MANIFEST["espeak_16k.wav"]["spans"][0][1]
    audio = load_mono("espeak_16k.wav")[int((start - 0.3) * 16000) : int((end + 0.2) * 16000)]
    quiet = (audio * 10 ** (-35 / 20)).astype(np.float32)
    heard: list[np.ndarray] = []  # the audio each feature extraction was given
    extract = whisper_runner.model.feature_extractor
    monkeypatch.setattr(whisper_runner.model, "feature_extractor", lambda a, *args, **kw: (heard.append(np.array(a)), extract(a, *args, **kw))[1])
    loud_hyp = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.FINAL, word_timestamps=True))
    quiet_hyp = whisper_runner.transcribe(DecodeRequest(quiet, DecodeKind.FINAL, word_timestamps=True, gain_db=35.0))
    assert np.allclose(heard[1], heard[0], atol=1e-5)
    # The same features within 1e-5: the same words, but for one that int8 kernels without AVX-512 may
    # flip on so small a difference ("call me Mac" / "call me back", as between machines).
    reference = MANIFEST["espeak_16k.wav"]["references"][0][1]
    assert edit_distance(normalize(loud_hyp.text), normalize(quiet_hyp.text)) <= 1, (loud_hyp.text, quiet_hyp.text)
    assert wer(reference, quiet_hyp.text) <= 0.2, quiet_hyp.text
    heard.clear()
    packed = whisper_runner.transcribe_batch([DecodeRequest(a, DecodeKind.FINAL, word_timestamps=True, gain_db=g) for a, g in ((quiet, 35.0), (audio, 0.0))])
    assert len(heard) == 1 and all(h.packed for h in packed)  # one window for both, the quiet one raised in it
    assert np.allclose(heard[0][: len(audio)], audio, atol=1e-5) and np.allclose(heard[0][-len(audio) :], audio, atol=1e-5)
    for hyp in packed:
        assert wer(reference, hyp.text) <= 0.2, hyp.text  # as in the first test
