"""The scheduler core under seeded random sequences of what sessions and workers do.

Sessions add finals, pause decodes, interims and context passes, withdraw and cancel them, and
go away; a job's refresh keeps it, replaces it with newer audio, skips it or raises; model
calls answer, miss a pack, return the wrong number of results or raise. Whatever the order,
every job is answered exactly once (done, skipped or failed) unless its session stopped
waiting, and once sessions stop adding work, free workers drain the queues: nothing is left
waiting with no worker to take it.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from asr_server.events import DecodeJob
from asr_server.inference.types import DecodeKind, DecodeRequest, Hypothesis
from asr_server.scheduler.core import Entry, SchedulerCore
from asr_server.scheduler.policy import BatchLimits

from ..fakes import FakeRunner

RATE = 16000


class Windows(FakeRunner):
    """Packable finals take a share of a window by their length; the rest a window each."""

    def window_frames(self, request: DecodeRequest) -> int:
        if request.kind is DecodeKind.FINAL and request.pack:
            return min(3000, 100 * (1 + int(request.duration)))
        return 3000


def a_job(rng: random.Random, owner: int) -> DecodeJob:
    kind = rng.choice([DecodeKind.FINAL, DecodeKind.FINAL, DecodeKind.INTERIM, DecodeKind.CONTEXT])
    samples = int(rng.uniform(0.2, 12.0) * RATE)
    request = DecodeRequest(np.zeros(samples, np.float32), kind, prompt=f"s{owner}", pack=kind is DecodeKind.FINAL and rng.random() < 0.5,
                            burst=rng.random() < 0.1, busy=rng.random() < 0.2, short_window=rng.random() < 0.5)
    return DecodeJob(owner % 2, rng.randrange(5), request, kind is DecodeKind.FINAL and rng.random() < 0.3, samples)


class Fuzz:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.workers = self.rng.choice([1, 2, 3])
        limits = BatchLimits(max_batch=self.rng.choice([1, 4, 8]), burst_backlog=self.rng.choice([None, 0, 2]))
        self.core = SchedulerCore(Windows(), limits, workers=self.workers, pack_hold_s=self.rng.choice([0.0, 0.2]))
        self.now = 0.0
        self.owed: dict[int, Entry] = {}  # entries added and not yet answered or given up
        self.answered: list[int] = []
        self.running: dict[int, int] = {}  # worker -> batch id

    def refresh(self, job: DecodeJob) -> DecodeJob | None:
        r = self.rng.random()
        if r < 0.1:
            return None
        if r < 0.15:
            raise RuntimeError("a session's refresh raised")
        if r < 0.25:
            return DecodeJob(job.channel, job.utterance, job.request, job.speculative, job.audio_end)
        return job

    def answer(self, entries) -> None:
        for entry in entries:
            assert self.owed.pop(entry.id, None) is not None, f"job {entry.id} answered twice or after its session left"
            self.answered.append(entry.id)

    def add(self) -> None:
        owner = self.rng.randrange(6)
        entry = self.core.add(f"s{owner}", a_job(self.rng, owner), self.now, refresh=self.refresh)
        self.owed[entry.id] = entry

    def schedule(self) -> None:
        free = [w for w in range(self.workers) if w not in self.running]
        if not free:
            return
        decision = self.core.schedule(self.now, self.rng.choice(free))
        self.answer(decision.skipped + decision.failed)
        if decision.batch is not None:
            self.running[decision.batch.worker] = decision.batch.id
        elif decision.wake_at is not None:
            self.now = max(self.now, decision.wake_at)

    def finish(self) -> None:
        worker = self.rng.choice(list(self.running))
        batch_id = self.running.pop(worker)
        batch = self.core._running[batch_id]
        r = self.rng.random()
        if r < 0.05:
            outcome = self.core.update_from_error(batch_id, self.now)
        elif r < 0.08:
            outcome = self.core.update_from_output(batch_id, [Hypothesis("x")] * (len(batch.entries) + 1), self.now)
        else:
            hyps = [None if e.request.pack and self.rng.random() < 0.2 else Hypothesis("x") for e in batch.entries]
            outcome = self.core.update_from_output(batch_id, hyps, self.now)
        self.answer([e for e, _ in outcome.done] + list(outcome.failed))

    def leave(self) -> None:
        """A session withdraws one job, cancels one, or goes away with all of its jobs."""
        if not self.owed:
            return
        entry = self.rng.choice(list(self.owed.values()))
        r = self.rng.random()
        if r < 0.4:
            if self.core.withdraw(entry.job) is not None:
                self.answer([entry])
        elif r < 0.7:
            self.core.cancel(entry.id)
            self.owed.pop(entry.id)
        else:
            for dropped in self.core.cancel_owner(entry.owner):
                self.owed.pop(dropped.id, None)

    def step(self, adding: bool) -> None:
        self.now += self.rng.uniform(0.0, 0.3)
        r = self.rng.random()
        if adding and r < 0.35:
            self.add()
        elif r < 0.65:
            self.schedule()
        elif r < 0.9 and self.running:
            self.finish()
        elif adding:
            self.leave()


@pytest.mark.parametrize("seed", range(40))
def test_every_job_is_answered_once_and_free_workers_drain_the_queues(seed):
    f = Fuzz(seed)
    for _ in range(400):
        f.step(adding=True)
    for _ in range(5000):  # no more work comes: the workers drain what is owed
        if not f.owed and not f.running:
            break
        f.step(adding=False)
    assert not f.owed, f"{len(f.owed)} jobs never answered: {sorted(f.owed)[:10]}"
    assert f.core.live == 0 and f.core.depth == 0
    assert len(f.answered) == len(set(f.answered))
