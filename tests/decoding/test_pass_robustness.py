"""Whatever the model writes, the passes keep the session going and the transcript rules hold.

Whisper's output is not well-formed in the ways the revision code could assume: a decode may hear
nothing, write a word in pieces (" 3" then ",800"), time words outside the window, out of order,
over seconds or over none, and a pass with lookahead may hear only the lookahead. A pass whose
every word lay in its lookahead once closed a session with an internal error, eleven minutes into
a long stream (docs/benchmarks.md, eighty-sixth session); these tests feed the session core
hypotheses drawn at random (seeded, so a failure replays) for every kind of decode, with passes,
lookahead and settle decodes, and some passes skipped or failed, and check after every step what a client relies on
(:func:`.test_context.check_rules`), over stream options, load settings and audio pieces drawn
at random too. And where handling an answer does raise (a bug), it costs that decode only: the
last test compares such a run with its twin in which that decode failed.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from unittest.mock import patch

import numpy as np
import pytest

from asr_server.decoding.context import ContextOptions
from asr_server.decoding.incremental import ChannelDecoder
from asr_server.inference.types import DecodeKind, Hypothesis, Word
from asr_server.options import StreamOptions
from asr_server.scheduler.governor import LoadSettings

from asr_server.session import Send

from .test_context import ALONE, Driver, TwoPassModel, check_rules, passes, server_transcript, speech, streamed
from .test_settle import SettleModel

VOCABULARY = [w for sentence in ALONE for w in sentence.split()] + ["3", "the", "I", "you."]
PIECES = [",800", "'s", ".", "-ish", "%"]  # written after a word with no space before them


class RandomDriver(Driver):
    """Some passes come back skipped (the scheduler had newer work) or failed (the model raised)."""

    def answer_context(self, job):
        fate = self.model.rng.random()
        if fate < 0.1:
            return self.session.job_skipped(job)
        if fate < 0.15:
            return self.session.job_failed(job)
        return super().answer_context(job)


class RandomModel(TwoPassModel):
    """Each decode a random hypothesis: 0-12 words, some in pieces, timed anywhere from a second
    before the window to two after it, at times out of order, zero-long or seconds long."""

    def __init__(self, seed: int) -> None:
        super().__init__(ALONE * 20, ALONE * 20)  # random finals may split the speech into more utterances
        self.rng = np.random.default_rng(seed)

    def _random(self, duration: float) -> Hypothesis:
        words: list[Word] = []
        for _ in range(int(self.rng.integers(0, 13))):
            piece = bool(words) and self.rng.random() < 0.15
            text = str(self.rng.choice(PIECES)) if piece else " " + str(self.rng.choice(VOCABULARY))
            start = float(self.rng.uniform(-1.0, duration + 2.0)) if self.rng.random() < 0.3 else (words[-1].end if words else 0.0) + float(self.rng.uniform(0, 0.6))
            length = float(self.rng.choice([0.0, self.rng.uniform(0.05, 0.5), self.rng.uniform(2.0, 8.0)], p=[0.1, 0.8, 0.1]))
            words.append(Word(text, round(start, 3), round(start + length, 3), float(self.rng.uniform(0.05, 1.0))))
        return Hypothesis("".join(w.word for w in words).strip(), tuple(words), avg_logprob=float(self.rng.uniform(-1.5, -0.05)))

    def final(self, request) -> Hypothesis:
        super().final(request)
        return self._random(request.duration)

    def interim(self, request) -> Hypothesis:
        return self._random(request.duration)

    def context(self, request) -> Hypothesis:
        heard = super().context(request)  # the window's sentences, as a pass hears them
        return heard if self.rng.random() < 0.3 else self._random(request.duration)


HALLUCINATIONS = ["Thank you.", "Thanks for watching!", "[BLANK_AUDIO]", "(upbeat music)", "♪", "...", "you"]


class ShapedModel(RandomModel):
    """The sentences as heard (:class:`TwoPassModel`), often gone wrong as Whisper goes wrong: a run
    of words looped, a hallucination after the speech (or past the audio's end), a decode that
    stopped early, timestamps collapsed onto the last word, no case or marks, two words joined or
    one split in pieces, every word shifted by up to a second, nothing heard."""

    def _shaped(self, hyp: Hypothesis, duration: float) -> Hypothesis:
        words = list(hyp.words)
        for _ in range(int(self.rng.integers(1, 3))):
            words = self._misheard(words, duration, int(self.rng.integers(0, 8)))
        return Hypothesis("".join(w.word for w in words).strip(), tuple(words), avg_logprob=float(self.rng.uniform(-1.5, -0.05)))

    def _misheard(self, words: list[Word], duration: float, how: int) -> list[Word]:
        r = self.rng
        k = int(r.integers(0, len(words))) if words else 0
        if how == 0 and words:  # a loop: a run of 1-3 words again and again, each time shorter
            run, t, loop = words[k : k + int(r.integers(1, 4))], words[k].end, []
            for w in run * int(r.integers(3, 10)):
                step = (w.end - w.start) * float(r.uniform(0.2, 1.0))
                loop.append(Word(w.word, round(t, 3), round(t + step, 3), float(r.uniform(0.1, 0.9))))
                t += step
            return words[: k + len(run)] + loop + words[k + len(run) :]
        if how == 1:  # a hallucination in the quiet after the speech, or past the audio
            t = float(r.uniform(max(0.0, duration - 2.0), duration + 1.0))
            parts = str(r.choice(HALLUCINATIONS)).split()
            return words + [Word(" " + p, round(t + 0.2 * j, 3), round(t + 0.2 * j + 0.2, 3), float(r.uniform(0.05, 0.6))) for j, p in enumerate(parts)]
        if how == 2:
            return words[:k]
        if how == 3 and words:
            return [Word(w.word, words[-1].end, words[-1].end, w.probability) for w in words]
        if how == 4:
            return [Word(w.word.lower().rstrip(".,?!"), w.start, w.end, w.probability) for w in words]
        if how == 5 and k + 1 < len(words):  # "ill-disposed" for "ill disposed"
            a, b = words[k], words[k + 1]
            return words[:k] + [Word(a.word + "-" + b.word.strip(), a.start, b.end, min(a.probability, b.probability))] + words[k + 2 :]
        if how == 5 and words and len(words[k].word) > 3:  # a word in two pieces
            w, cut = words[k], len(words[k].word) // 2 + 1
            mid = round((w.start + w.end) / 2, 3)
            return words[:k] + [Word(w.word[:cut], w.start, mid, w.probability), Word(w.word[cut:], mid, w.end, w.probability)] + words[k + 1 :]
        if how == 6:
            shift = float(r.uniform(-1.0, 1.0))
            return [Word(w.word, round(max(0.0, w.start + shift), 3), round(max(0.0, w.end + shift), 3), w.probability) for w in words]
        return [] if how == 7 else words

    def final(self, request) -> Hypothesis:
        heard = TwoPassModel.final(self, request)
        return self._shaped(heard, request.duration) if self.rng.random() < 0.5 else heard

    def interim(self, request) -> Hypothesis:
        return self._shaped(TwoPassModel.final(self, request), request.duration) if self.rng.random() < 0.3 else Hypothesis("so far")

    def context(self, request) -> Hypothesis:
        heard = TwoPassModel.context(self, request)
        return self._shaped(heard, request.duration) if self.rng.random() < 0.7 else heard


@pytest.mark.parametrize("settle", [False, True])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("model_kind", [RandomModel, ShapedModel])
def test_passes_over_random_hypotheses_keep_the_session_going_and_the_transcript_rules(seed, settle, model_kind):
    """Random hypotheses (:class:`RandomModel`), or the sentences misheard as Whisper mishears
    (:class:`ShapedModel`), for finals, interims and passes: every message keeps the transcript
    rules, no pass fails (the driver raises on a :class:`AnswerFailed`), and the stream closes."""
    model = model_kind(seed)
    options = ContextOptions(ahead_s=1.5, min_new_s=0.1) if settle else passes(ahead_s=1.5, min_new_s=0.1)
    d = RandomDriver(model, context=options)
    d.session._decoders[0].spare_time = settle
    audio = speech()
    for i in range(0, len(audio), 1600):
        d.feed(audio[i : i + 1600])
        if d.context_jobs and model.rng.random() < 0.7:  # passes now, or left to wait a while
            d.run_context()
        check_rules(d)
    d.apply(d.session.end_of_stream())
    d.run_context()
    check_rules(d)
    assert model.context_requests > 0 and not d.of_type("error")
    assert d.of_type("closed")
    assert d.client.final_text() == server_transcript(d)


def _stream_options(rng: np.random.Generator) -> tuple[StreamOptions, ContextOptions]:
    """Stream and pass options the other tests keep fixed, drawn at random."""
    options = StreamOptions(
        interim_results=bool(rng.random() < 0.8), word_timestamps=bool(rng.random() < 0.8),
        max_utterance_s=float(rng.choice([3.0, 6.0, 20.0])), split_after_s=float(rng.choice([0.0, 1.5, 3.0])),
        endpoint_ms=int(rng.choice([200, 500, 1000])), interim_ms=int(rng.choice([200, 500])), prompt=str(rng.choice(["", "PBX asterisk"])),
    )
    context = ContextOptions(
        ahead_s=float(rng.choice([0.0, 1.5])), min_new_s=float(rng.choice([0.1, 2.0, 5.0])),
        settle_window_s=float(rng.choice([0.0, 8.0, 30.0])), back_s=float(rng.choice([0.0, 10.0])),
    )
    return options, context


def _random_load(rng: np.random.Generator) -> LoadSettings:
    level = int(rng.integers(0, 4))
    return LoadSettings(
        level=level, scale=int(rng.choice([1, 2])), short_window=bool(rng.random() < 0.3), lean_context=bool(rng.random() < 0.4),
        settle=bool(rng.random() < 0.5), late_context=bool(rng.random() < 0.3),
    )


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 533, 545])
def test_varied_options_load_and_pieces_over_random_hypotheses_keep_the_transcript_rules(seed):
    """Random or Whisper-shaped hypotheses as above, with the stream's options drawn at random
    (interims and word timings on or off, short utterance limits, split and endpoint times, a
    vocabulary prompt), the pass options too (lookahead, settle windows, back context), audio in
    pieces of 10-300 ms with silence inserted at times, the load settings changed at random
    moments and the close's time bound at times cutting the last passes off. Seeds 533 and 545
    sent ``settled`` at offset 0 for an empty first final (eighty-seventh session)."""
    rng = np.random.default_rng(10_000 + seed)
    model = (ShapedModel if rng.random() < 0.5 else RandomModel)(seed)
    options, context = _stream_options(rng)
    d = RandomDriver(model, context=context, options=options)
    audio = speech()
    if rng.random() < 0.3:
        half = len(audio) // 2
        audio = np.concatenate([audio[:half], np.zeros(int(rng.integers(1, 40000)), np.float32), audio[half:]])
    piece = int(rng.choice([160, 1600, 4800]))
    for i in range(0, len(audio), piece):
        d.feed(audio[i : i + piece], piece)
        if rng.random() < 0.05:
            d.apply(d.session.set_load(_random_load(rng)))
        if d.context_jobs and rng.random() < 0.6:
            d.run_context()
    check_rules(d)
    d.apply(d.session.end_of_stream())
    if rng.random() < 0.2:
        d.apply(d.session.close_context())
    d.run_context()
    check_rules(d)
    assert d.of_type("closed") and d.client.final_text() == server_transcript(d)


FAULT = "a fault in handling the answer"
# What each kind of decode's answer is handled by, and the message it sends where it shows something.
HANDLER = {
    "interim": ("_interim", "interim"), "pause": ("_interim", "interim"), "final": ("_final", "final"),
    "context": ("_revise", "revision"), "settle": ("_revise", "revision"),
    "ended": ("_final", "final"),  # a final taken from an earlier answer as audio is fed (no decode answered)
}


class FaultDriver(Driver):
    """Answers every decode. Answer number ``fault`` (from 1) of the decodes of kind ``target``
    raises once its handler (:data:`HANDLER`) has changed the channel, as a late fault finds it
    (``faulty``), or is taken as a failed decode's (not ``faulty``: the twin)."""

    def __init__(self, model, context: ContextOptions, target: str, fault: int | None = None, faulty: bool = True) -> None:
        self.target, self.fault, self.faulty = target, fault, faulty
        self.answered = {kind: 0 for kind in HANDLER}
        self.fed = 0  # pieces of audio fed
        self.showing: list[tuple[str, int]] = []  # (kind, answer) for each answer that showed something (HANDLER)
        self.failures: list = []
        super().__init__(model, context=context)

    def failed(self, event) -> None:
        self.failures.append(event)

    def feed(self, audio, piece: int = 1600) -> None:
        """Audio; piece number ``fault`` (target ``ended``) ends an utterance whose final is taken
        from an earlier answer, and that raises, or is decoded instead (the twin drops the answers
        it would be taken from)."""
        for i in range(0, len(audio), piece):
            self.fed += 1
            receive = functools.partial(self.session.receive_audio, audio[i : i + piece].reshape(1, -1))
            if ("ended", self.fed) != (self.target, self.fault):
                outputs = receive()
                if any(isinstance(o, Send) and o.message["type"] == "final" and o.message["text"] for o in outputs):
                    self.showing.append(("ended", self.fed))
            elif self.faulty:
                with patch.object(ChannelDecoder, "_final", _failing_once(ChannelDecoder._final)):
                    outputs = receive()
            else:
                for utt in self.session._decoders[0]._utterances.values():
                    utt.spec, utt.split_from = None, None
                outputs = receive()
            self.apply(outputs)

    def answer(self, job):
        return self._answer(job, self.model.interim(job.request) if job.request.kind is DecodeKind.INTERIM else self.model.final(job.request))

    def answer_context(self, job):
        if hasattr(self.model, "settling"):  # the settle tests' model hears a settle decode otherwise
            self.model.settling = self.session._decoders[0]._settling
        return self._answer(job, self.model.context(job.request))

    def _answer(self, job, hypothesis):
        kind = "settle" if job.request.kind is DecodeKind.CONTEXT and self.session._decoders[0]._settling else job.request.kind.value
        kind = "pause" if job.speculative else kind
        if kind == "pause" and self.target == "final":  # skipped: the final is decoded, not taken from it
            return self.session.job_skipped(job)
        self.answered[kind] += 1
        method, shown = HANDLER[kind]
        if (kind, self.answered[kind]) != (self.target, self.fault):
            outputs = self.session.job_done(job, hypothesis)
            if any(isinstance(o, Send) and o.message["type"] == shown and o.message["text"] and o.message.get("pass", kind) == kind for o in outputs):
                self.showing.append((kind, self.answered[kind]))
            return outputs
        if not self.faulty:
            return self.session.job_failed(job)
        with patch.object(ChannelDecoder, method, _failing_once(getattr(ChannelDecoder, method))):
            return self.session.job_done(job, hypothesis)


def _failing_once(method):
    """``method``, raising the first time once it has done its work (the decoder changed in place)."""
    calls = []

    def failing(decoder, *args, **kwargs):
        out = method(decoder, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError(FAULT)
        return out

    return failing


TOGETHER = ["he was not an ill-disposed young man", "unless to be rather cold-hearted", "and rather selfish", "is to be ill-disposed", "the end of it"]


@pytest.mark.parametrize("target", list(HANDLER))
def test_a_fault_in_handling_an_answer_costs_that_decode_only(target):
    """Handling an answer that shows something (an interim, a pause decode's interim, a final with
    words, a revision, a final taken from an earlier answer as audio ends an utterance) raises
    after it has changed the channel: the session goes on, and sends word for word what it sends
    where that decode failed (an interim or pause decode dropped; a final given up, empty, after
    ``decode_failed``; a pass skipped, the client keeping what it had; the final decoded instead). One
    :class:`AnswerFailed` tells the transport. Such a fault used to end the session with
    ``internal_error``."""
    def model() -> TwoPassModel:
        return SettleModel(lambda n: ALONE[n], lambda n: TOGETHER[n]) if target == "settle" else TwoPassModel(ALONE, TOGETHER)

    options = ContextOptions(min_new_s=0.1, idle_s=30.0, settle_s=30.0, ahead_s=0.0, settle_window_s=8.0) if target == "settle" else passes(min_new_s=0.1, ahead_s=1.5)
    clean = streamed(FaultDriver(model(), options, target))
    fault = next(answer for kind, answer in clean.showing if kind == target)
    faulty = streamed(FaultDriver(model(), options, target, fault))
    failed = streamed(FaultDriver(model(), options, target, fault, faulty=False))
    assert [(f.decode, str(f.error)) for f in faulty.failures] == [(target, FAULT)]
    assert faulty.messages == failed.messages
    # The fault cost something: what was sent, or (a final decoded instead of taken) what was decoded.
    assert (faulty.messages, faulty.answered) != (clean.messages, clean.answered)
    assert not failed.failures and not clean.failures
    check_rules(faulty)
    assert faulty.messages[-1]["type"] == "closed"
    assert [m["code"] for m in faulty.of_type("error")] == (["decode_failed"] if target == "final" else [])
    assert faulty.client.final_text() == server_transcript(faulty)
    shown = HANDLER[target][1]
    assert sum(1 for m in faulty.messages if m["type"] == shown and m.get("pass", target) == target) > 1  # later ones still come


def _planning_faults(faulty: Callable[[int], bool]) -> tuple[FaultDriver, TwoPassModel, list[int]]:
    """A stream whose pass planning raises (a bug) at the calls ``faulty`` picks (counted from 1)."""
    window, calls = ChannelDecoder._context_window, []

    def planned(decoder):
        if sys._getframe(1).f_code.co_name == "_dispatch_pass":  # not a waiting pass's refresh
            calls.append(1)
            if faulty(len(calls)):
                raise RuntimeError(FAULT)
        return window(decoder)

    model = TwoPassModel(ALONE, TOGETHER)
    with patch.object(ChannelDecoder, "_context_window", planned):
        d = streamed(FaultDriver(model, passes(min_new_s=0.1, ahead_s=1.5), "plan"))
    check_rules(d)
    assert [m["text"] for m in d.of_type("final")] == ALONE  # every final, its first pass's text
    assert d.messages[-1]["type"] == "closed" and not d.of_type("error")
    assert d.client.final_text() == server_transcript(d)
    return d, model, calls


def test_a_fault_in_planning_a_pass_is_tried_again_once_another_final_came():
    """Planning the second pass raises (a bug): it is not tried again at every piece of audio (it
    would raise again), but once the next final has come, and then the passes go on: the
    transcript at the close is the passes' as if nothing had happened. One
    :class:`AnswerFailed` tells the transport."""
    d, model, calls = _planning_faults(lambda call: call == 2)
    assert [(f.decode, str(f.error)) for f in d.failures] == [("plan", FAULT)]
    assert len(calls) >= 3 and model.context_requests >= 2
    assert server_transcript(d) == " ".join(TOGETHER)


def test_a_fault_in_planning_the_last_pass_still_lets_the_stream_close():
    """Planning raises at the last pass a stream would plan, after which no final comes to try it
    again on: the close does not wait for passes that cannot be planned."""
    _, _, calls = _planning_faults(lambda call: False)
    d, _, _ = _planning_faults(lambda call: call == len(calls))
    assert [f.decode for f in d.failures] == ["plan"]


def test_a_fault_in_planning_the_pass_after_the_speaker_stopped_still_lets_the_stream_close():
    """The speaker stops; the pass planned in the silence after the last final raises, and no
    other final comes to try it again on: the close gives the passes up instead of waiting for
    one that cannot be planned."""
    window, draining = ChannelDecoder._context_window, []
    audio = speech()

    def planned(decoder):
        if decoder._position > len(audio):  # in the silence after the speech
            draining.append(decoder._draining)
            raise RuntimeError(FAULT)
        return window(decoder)

    d = FaultDriver(TwoPassModel(ALONE, TOGETHER), passes(min_new_s=30.0, ahead_s=1.5), "plan")  # no pass until the silence
    then_silence = np.concatenate([audio, np.zeros(3 * 16000, np.float32)])  # 3 s, past idle_s
    with patch.object(ChannelDecoder, "_context_window", planned):
        for i in range(0, len(then_silence), 1600):
            d.feed(then_silence[i : i + 1600])
            d.run_context()
        d.apply(d.session.end_of_stream())
        d.run_context()
    assert draining == [False] and [f.decode for f in d.failures] == ["plan"]
    assert d.messages[-1]["type"] == "closed" and [m["text"] for m in d.of_type("final")] == ALONE


def test_planning_that_keeps_faulting_gives_up_the_passes_not_the_session():
    """Planning raises at every pass after the first: tried again after each new final, PLAN_FAULTS_MAX
    times in all, and then the channel's passes are given up for the rest of its stream, as at a
    close whose time bound ran out; the first pass's revision stays, and the stream closes."""
    from asr_server.decoding.incremental import PLAN_FAULTS_MAX

    d, model, calls = _planning_faults(lambda call: call >= 2)
    assert [f.decode for f in d.failures] == ["plan"] * PLAN_FAULTS_MAX and len(calls) == 1 + PLAN_FAULTS_MAX
    assert model.context_requests == 1 and len(d.of_type("revision")) == 1
    assert server_transcript(d) != " ".join(ALONE)
