import asyncio

import numpy as np

from asr_server.events import DecodeJob
from asr_server.inference.whisper import DecodeKind, DecodeRequest
from asr_server.scheduler import Scheduler
from asr_server.scheduler.policy import BatchLimits

from ..fakes import FakeRunner


def job(tag: str) -> DecodeJob:
    return DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.INTERIM, prompt=tag), False, 1600)


def test_jobs_of_competing_sessions_are_interleaved_and_cancelled_with_their_session():
    runner = FakeRunner(lambda r: r.prompt)

    async def main():
        s = Scheduler(runner)
        # Queue everything before the worker starts, so the order is the policy's alone.
        a = [asyncio.ensure_future(s.decode("a", job(f"a{i}"))) for i in range(4)]
        b = [asyncio.ensure_future(s.decode("b", job(f"b{i}"))) for i in range(2)]
        gone = [asyncio.ensure_future(s.decode("gone", job(f"gone{i}"))) for i in range(2)]
        await asyncio.sleep(0)
        s.cancel_owner("gone")
        s.start()
        results = await asyncio.gather(*a, *b)
        await s.stop()
        return results, gone

    results, gone = asyncio.run(main())
    assert [hyp.text for _, hyp in results] == ["a0", "a1", "a2", "a3", "b0", "b1"]
    assert [r.prompt for r in runner.requests] == ["a0", "b0", "a1", "b1", "a2", "a3"]
    assert all(g.cancelled() for g in gone)


def test_a_failing_decode_fails_only_its_own_job():
    """A batch that raises is split: each job runs once more alone. The bad final is given up
    (JobFailed), the bad interim is answered as skipped, and their batch-mates get their results."""
    from asr_server.scheduler.engine import JobFailed

    def script(request):
        if request.prompt.startswith("bad"):
            raise RuntimeError("model exploded")
        return "fine"

    def final(tag):
        return DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.FINAL, prompt=tag), False, 1600)

    runner = FakeRunner(script)

    async def main():
        s = Scheduler(runner)
        jobs = [("x", final("bad final")), ("y", final("good final")), ("z", job("bad interim")), ("w", job("good interim"))]
        waits = [asyncio.ensure_future(s.decode(owner, j)) for owner, j in jobs]
        await asyncio.sleep(0)
        s.start()
        done = await asyncio.gather(*waits, return_exceptions=True)
        await s.stop()
        return done

    bad_final, good_final, bad_interim, good_interim = asyncio.run(main())
    assert isinstance(bad_final, JobFailed) and bad_final.job.request.prompt == "bad final"
    assert good_final[1].text == "fine" and good_interim[1].text == "fine"
    assert bad_interim[1] is None
    prompts = [[r.prompt for r in b] for b in runner.batches]
    # finals together, then each once more alone (the retry); then interims the same way
    assert prompts[0] == ["bad final", "good final"]
    assert prompts.count(["bad final"]) == 1 and prompts.count(["bad interim"]) == 1


def test_finals_go_before_waiting_interims():
    runner = FakeRunner(lambda r: r.prompt)

    def final(tag):
        return DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.FINAL, prompt=tag), False, 1600)

    async def main():
        s = Scheduler(runner)
        waits = [asyncio.ensure_future(s.decode(f"s{i}", job(f"interim{i}"))) for i in range(3)]
        waits.append(asyncio.ensure_future(s.decode("late", final("final"))))
        await asyncio.sleep(0)
        s.start()
        await asyncio.gather(*waits)
        await s.stop()

    asyncio.run(main())
    assert runner.requests[0].prompt == "final"


def test_waiting_jobs_of_many_sessions_run_as_one_batch():
    runner = FakeRunner(lambda r: r.prompt)

    async def main():
        s = Scheduler(runner, limits=BatchLimits(max_batch=3))
        waits = [asyncio.ensure_future(s.decode(f"s{i}", job(f"j{i}"))) for i in range(5)]
        await asyncio.sleep(0)
        s.start()
        results = await asyncio.gather(*waits)
        await s.stop()
        return results

    results = asyncio.run(main())
    assert [len(b) for b in runner.batches] == [3, 2]
    assert [hyp.text for _, hyp in results] == [f"j{i}" for i in range(5)]  # each result to its own job


def test_refresh_replaces_a_waiting_interim_or_skips_it():
    runner = FakeRunner(lambda r: r.prompt)
    newer = job("newer")

    async def main():
        s = Scheduler(runner)
        fresh = asyncio.ensure_future(s.decode("a", job("older"), refresh=lambda j: newer))
        stale = asyncio.ensure_future(s.decode("b", job("stale"), refresh=lambda j: None))
        await asyncio.sleep(0)
        s.start()
        done = await asyncio.gather(fresh, stale)
        await s.stop()
        return done

    (ran, hyp), (skipped_job, nothing) = asyncio.run(main())
    assert ran is newer and hyp.text == "newer"
    assert nothing is None and skipped_job.request.prompt == "stale"
    assert [r.prompt for r in runner.requests] == ["newer"]


class _Gate(FakeRunner):
    """Interims (or every job, with ``all_kinds``) block until released; ``entered`` is set when one starts."""

    def __init__(self, script=None, all_kinds=False):
        import threading

        super().__init__(script or (lambda r: r.prompt))
        self.entered = threading.Event()
        self.release = threading.Event()
        self.all_kinds = all_kinds

    def transcribe_batch(self, requests, retry_later=False):
        if self.all_kinds or requests[0].kind is DecodeKind.INTERIM:
            self.entered.set()
            assert self.release.wait(30)
        return super().transcribe_batch(requests)


def test_with_two_workers_a_final_does_not_wait_behind_interims():
    runner = _Gate()

    async def main():
        s = Scheduler(runner, limits=BatchLimits(max_batch=1), workers=2)
        s.start()
        interims = [asyncio.ensure_future(s.decode(f"i{i}", job(f"i{i}"))) for i in range(3)]
        assert await asyncio.to_thread(runner.entered.wait, 30)  # one worker is stuck in an interim
        final = DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.FINAL, prompt="f"), False, 1600)
        _, hyp = await s.decode("late", final)  # the other worker must be free for it
        stuck = sum(not i.done() for i in interims)
        runner.release.set()
        await asyncio.gather(*interims)
        await s.stop()
        return hyp, stuck

    hyp, stuck = asyncio.run(main())
    assert hyp.text == "f" and stuck == 3


def test_a_withdrawn_job_still_waiting_is_answered_as_skipped_at_once_and_a_running_one_finishes():
    runner = _Gate(all_kinds=True)

    async def main():
        s = Scheduler(runner, limits=BatchLimits(max_batch=1))
        s.start()
        running_job, waiting_job = job("running"), job("waiting")
        running = asyncio.ensure_future(s.decode("a", running_job))
        assert await asyncio.to_thread(runner.entered.wait, 30)  # the only worker is now busy with it
        waiting = asyncio.ensure_future(s.decode("b", waiting_job))
        await asyncio.sleep(0)  # let the wait queue its job
        withdrew = (s.withdraw(waiting_job), s.withdraw(running_job))
        skipped = await waiting  # answered without the worker
        runner.release.set()
        ran = await running
        await s.stop()
        return withdrew, skipped, ran

    withdrew, skipped, ran = asyncio.run(main())
    assert withdrew == (True, False)
    assert skipped[1] is None and ran[1].text == "running"


def test_a_worker_task_that_dies_is_replaced_and_its_batch_answered():
    """Nothing inside a worker may stall the server: a worker that ends is logged, counted and replaced."""
    from asr_server.metrics import Metrics
    class Fatal(BaseException):
        """Escapes every ``except Exception``: the worker task itself ends."""

    calls = []

    class DiesOnce(FakeRunner):
        def transcribe_batch(self, requests, retry_later=False):
            calls.append([r.prompt for r in requests])
            if len(calls) == 1:
                raise Fatal()
            return super().transcribe_batch(requests)

    def final(tag):
        return DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.FINAL, prompt=tag), False, 1600)

    metrics = Metrics()

    async def main():
        s = Scheduler(DiesOnce(lambda r: r.prompt), metrics, workers=1)
        s.start()
        first = await asyncio.gather(s.decode("a", final("first")), return_exceptions=True)
        second = await s.decode("b", final("second"))  # served by the replacement worker
        await s.stop()
        return first[0], second, s.restarts

    first, second, restarts = asyncio.run(main())
    assert restarts == 1 and metrics.worker_restarts._value.get() == 1
    # The dead worker's final was retried alone by the new worker, and answered.
    assert first[1].text == "first" and calls == [["first"], ["first"], ["second"]]
    assert second[1].text == "second"


def test_finals_made_greedy_by_load_are_counted_by_why():
    """Operators see how much of the first pass the load degraded: busy finals (the server loaded)
    and burst finals (more waiting than workers), not the quick finals asked for at rest."""
    from asr_server.metrics import Metrics

    def final(tag, **flags):
        return DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.FINAL, prompt=tag, short_window=True, **flags), False, 1600)

    metrics = Metrics()

    async def main():
        s = Scheduler(FakeRunner(lambda r: r.prompt), metrics, BatchLimits(burst_backlog=0), workers=1)
        s.start()
        for tag, flags in (("quick", {}), ("busy", {"busy": True}), ("burst", {"burst": True}), ("busy again", {"busy": True}), ("careful", {"careful": True})):
            await s.decode(tag, final(tag, **flags))
        await s.stop()

    asyncio.run(main())
    counted = {why: metrics.finals_greedy.labels(why)._value.get() for why in ("busy", "burst")}
    assert counted == {"busy": 2, "burst": 1}
    assert metrics.finals_careful._value.get() == 1  # a redo that heard nothing greedily, at full beam


def test_a_burst_final_decoded_on_the_finals_copy_does_not_teach_the_capacity_model():
    """The first call of a burst has every core on the finals' copy and ends sooner than the calls
    beside it: the cost of a final in a burst is learnt from those, which drain the burst."""
    from dataclasses import replace

    from asr_server.scheduler.capacity import CapacityModel

    class TwoCopies(FakeRunner):
        def transcribe_batch(self, requests, retry_later: bool = False):
            hyps = super().transcribe_batch(requests, retry_later)
            wide = requests[0].prompt == "wide"
            return [replace(h, decode_s=0.1 if wide else 0.9, finals_copy=wide) for h in hyps]

    capacity = CapacityModel(2, 0.5)

    async def main():
        s = Scheduler(TwoCopies(), None, BatchLimits(burst_backlog=0), workers=1)
        s.capacity = capacity
        s.start()
        for tag in ("wide", "shared"):
            await s.decode(tag, DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.FINAL, prompt=tag, short_window=True, burst=True), False, 1600))
        await s.stop()

    asyncio.run(main())
    assert capacity.observed == 1 and capacity.final_s > 0.5  # only the shared copy's 0.9 s was counted
