"""The session core under every order of answers a busy scheduler can give (seeded random orders).

In the server the scheduler picks jobs when a worker frees up, refreshes a waiting job as it
picks it, answers a withdrawn job as skipped only while it still waits (else the core is told
it runs), and the close's time bound fires whenever it fires: possibly while a pass is on its
way back. Here a fake scheduler does all of that in a random order, with a fake model whose
answers are random words at random times, sometimes none, sometimes a failure. Whatever the
order, the session must end with ``closed``, its messages must follow the protocol's rules,
and a client applying them must hold the transcript the server holds. An 8-stream load run
ended one session with ``internal_error`` this way: a pass came back with no words.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from asr_client import Transcript
from asr_server.events import DecodeJob, SubmitJob, WithdrawJob
from asr_server.inference.types import DecodeRequest, Hypothesis, Word
from asr_server.options import StreamOptions
from asr_server.scheduler.governor import LoadSettings
from asr_server.session import Close, Send, Session

from .harness import load_channels

WORDS = "four queen of clubs seven eight spades hearts the old city".split()


def heard(rng: random.Random, request: DecodeRequest) -> Hypothesis:
    """Random words at random (possibly overlapping, possibly out-of-span) times; sometimes none."""
    if rng.random() < 0.1:
        return Hypothesis(text="")
    n = max(1, int(request.duration / rng.uniform(0.2, 0.6)))
    parts = [rng.choice(WORDS) + rng.choice(["", "", ",", "."]) for _ in range(n)]
    times = sorted(rng.uniform(-0.5, request.duration + 0.5) for _ in range(2 * n))
    words = tuple(Word(" " + p, round(times[2 * i], 3), round(times[2 * i + 1], 3), rng.random()) for i, p in enumerate(parts))
    return Hypothesis(text=" ".join(parts), words=words if request.word_timestamps else (), avg_logprob=-0.3)


class Shuffled:
    """A session driven by a scheduler that answers in a random order."""

    def __init__(self, seed: int, channels: int) -> None:
        self.rng = random.Random(seed)
        self.session = Session("t", StreamOptions(channels=channels, interim_results=self.rng.random() < 0.8))
        self.waiting: list[DecodeJob] = []
        self.running: list[DecodeJob] = []
        self.late: list[list] = []  # outputs computed but not yet carried out (the close bound's callback)
        self.messages: list[dict] = []
        self.client = Transcript()
        self.closed: Close | None = None
        self.carry(self.session.start())

    def carry(self, outputs: list) -> None:
        for out in outputs:
            if isinstance(out, SubmitJob):
                self.waiting.append(out.job)
            elif isinstance(out, WithdrawJob):
                if any(j is out.job for j in self.waiting):  # still waiting: answered as skipped
                    self.waiting = [j for j in self.waiting if j is not out.job]
                    self.carry(self.session.job_skipped(out.job))
                else:
                    self.carry(self.session.job_running(out.job))
            elif isinstance(out, Send):
                self.messages.append(out.message)
                self.client.apply(out.message)
            elif isinstance(out, Close):
                self.closed = out

    def pick(self) -> None:
        """A worker takes a waiting job: refreshed first, as the scheduler does."""
        job = self.waiting.pop(self.rng.randrange(len(self.waiting)))
        fresh = self.session.refresh_job(job)
        if fresh is None:
            self.carry(self.session.job_skipped(job))
        else:
            self.running.append(fresh)

    def answer(self) -> None:
        job = self.running.pop(self.rng.randrange(len(self.running)))
        x = self.rng.random()
        if x < 0.05:
            self.carry(self.session.job_skipped(job))
        elif x < 0.08:
            self.carry(self.session.job_failed(job))
        else:
            self.carry(self.session.job_done(job, heard(self.rng, job.request)))

    def load(self) -> None:
        lean = self.rng.random() < 0.5
        self.carry(self.session.set_load(LoadSettings(level=int(lean), scale=1 + int(lean), short_window=lean, lean_context=lean)))


def run(seed: int, audio: np.ndarray, piece: int = 1600, upload: bool = False) -> Shuffled:
    """``upload``: the audio comes as fast as the session takes it (no wall-clock time passes), so
    its passes take the finals in order and the shell stops reading while they are behind."""
    d = Shuffled(seed, audio.shape[0])
    rng, fed, ended, bound = d.rng, 0, False, False
    for _ in range(50_000):
        if d.closed is not None:
            break
        r = rng.random()
        held = upload and d.session.held_for_passes(0.0)
        if r < 0.35 and fed < audio.shape[1] and not held:
            d.carry(d.session.receive_audio(audio[:, fed : fed + piece]))
            fed += piece
        elif r < 0.50 and d.waiting:
            d.pick()
        elif r < 0.70 and d.running:
            d.answer()
        elif r < 0.75:
            d.load()
        elif r < 0.76 and not ended:
            d.carry(d.session.finalize())
        elif r < 0.80 and fed >= audio.shape[1] and not ended:
            ended = True
            d.carry(d.session.end_of_stream())
        elif r < 0.82 and ended and not bound and d.session.draining:
            bound = True  # the close's time bound: carried out now, or after other answers
            out = d.session.close_context()
            if rng.random() < 0.5:
                d.late.append(out)
            else:
                d.carry(out)
        elif r < 0.87 and d.late:
            d.carry(d.late.pop(0))
    return d


@pytest.mark.parametrize("upload", [False, True], ids=["live", "upload"])
@pytest.mark.parametrize("fixture", ["cards_16k.wav", "call_8k_stereo.s16le"])
@pytest.mark.parametrize("seed", range(8))
def test_any_order_of_scheduler_answers_ends_in_closed_with_the_transcript_the_client_holds(fixture, seed, upload):
    audio = np.stack([np.concatenate([c, c]) for c in load_channels(fixture)])  # two rounds: passes with decided audio
    d = run(seed, audio, upload=upload)
    assert not upload or all(decoder.in_order_passes for decoder in d.session._decoders)
    assert d.closed is not None and d.closed.code == 1000, "the session never closed"
    assert {m["code"] for m in d.messages if m["type"] == "error"} <= {"decode_failed"}  # a final the model failed, named
    assert [m["seq"] for m in d.messages] == list(range(1, len(d.messages) + 1))
    assert d.messages[-1]["type"] == "closed"
    for ch, decoder in enumerate(d.session._decoders):
        held = [r for r in decoder._done if r.text]  # the finals the server still holds (older ones are let go)
        client = d.client.final_text(ch)
        assert client[held[0].offset :] == " ".join(r.text for r in held) if held else client == ""
