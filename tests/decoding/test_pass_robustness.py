"""Whatever the model writes, the passes keep the session going and the transcript rules hold.

Whisper's output is not well-formed in the ways the revision code could assume: a decode may hear
nothing, write a word in pieces (" 3" then ",800"), time words outside the window, out of order,
over seconds or over none, and a pass with lookahead may hear only the lookahead. A pass whose
every word lay in its lookahead once closed a session with an internal error, eleven minutes into
a long stream (docs/benchmarks.md, eighty-sixth session); these tests feed the session core
hypotheses drawn at random (seeded, so a failure replays) for every kind of decode, with passes,
lookahead and settle decodes, and some passes skipped or failed, and check after every step what a client relies on
(:func:`.test_context.check_rules`).
"""

from __future__ import annotations

import numpy as np
import pytest

from asr_server.decoding.context import ContextOptions
from asr_server.inference.types import Hypothesis, Word

from .test_context import ALONE, Driver, TwoPassModel, check_rules, passes, server_transcript, speech

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


@pytest.mark.parametrize("settle", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_passes_over_random_hypotheses_keep_the_session_going_and_the_transcript_rules(seed, settle):
    model = RandomModel(seed)
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
