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
    def script(request):
        if request.prompt == "bad":
            raise RuntimeError("model exploded")
        return "fine"

    async def main():
        s = Scheduler(FakeRunner(script))
        s.start()
        bad = asyncio.ensure_future(s.decode("x", job("bad")))
        good = asyncio.ensure_future(s.decode("y", job("good")))
        done = await asyncio.gather(bad, good, return_exceptions=True)
        await s.stop()
        return done

    bad, good = asyncio.run(main())
    assert isinstance(bad, RuntimeError) and good[1].text == "fine"


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


def test_with_two_workers_a_final_does_not_wait_behind_interims():
    import threading

    release = threading.Event()

    class SlowInterims(FakeRunner):
        def transcribe_batch(self, requests, retry_later=False):
            if requests[0].kind is DecodeKind.INTERIM:
                release.wait(10)
            return super().transcribe_batch(requests)

    runner = SlowInterims(lambda r: r.prompt)

    async def main():
        s = Scheduler(runner, limits=BatchLimits(max_batch=1), workers=2)
        s.start()
        interims = [asyncio.ensure_future(s.decode(f"i{i}", job(f"i{i}"))) for i in range(3)]
        await asyncio.sleep(0.05)  # one worker is now stuck in an interim; the other must stay free
        final = DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.FINAL, prompt="f"), False, 1600)
        _, hyp = await asyncio.wait_for(s.decode("late", final), timeout=5)
        stuck = sum(not i.done() for i in interims)
        release.set()
        await asyncio.gather(*interims)
        await s.stop()
        return hyp, stuck

    hyp, stuck = asyncio.run(main())
    assert hyp.text == "f" and stuck == 3


def test_a_final_being_decoded_still_counts_as_waiting_for_the_governor():
    """What a user waits for is the result, so a long-running batch is pressure even with an empty queue."""
    import threading

    release = threading.Event()

    def script(request):
        release.wait(5)
        return "done"

    def final(tag):
        return DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.FINAL, prompt=tag), False, 1600)

    async def main():
        s = Scheduler(FakeRunner(script))
        s.start()
        loop = asyncio.get_running_loop()
        waiting = asyncio.ensure_future(s.decode("a", final("x")))
        await asyncio.sleep(0.3)
        running = s.state(loop.time())
        release.set()
        await waiting
        done = s.state(loop.time())
        await s.stop()
        return running, done

    running, done = asyncio.run(main())
    assert running.finals == 0 and running.oldest_final_wait >= 0.25
    assert done.oldest_final_wait == 0.0


def test_a_withdrawn_job_still_waiting_is_answered_as_skipped_at_once_and_a_running_one_finishes():
    import threading

    release = threading.Event()

    def script(request):
        release.wait(5)
        return request.prompt

    async def main():
        s = Scheduler(FakeRunner(script), limits=BatchLimits(max_batch=1))
        s.start()
        running_job, waiting_job = job("running"), job("waiting")
        running = asyncio.ensure_future(s.decode("a", running_job))
        await asyncio.sleep(0.1)  # the only worker is now busy with it
        waiting = asyncio.ensure_future(s.decode("b", waiting_job))
        await asyncio.sleep(0)
        withdrew = (s.withdraw(waiting_job), s.withdraw(running_job))
        skipped = await asyncio.wait_for(waiting, timeout=1)  # without waiting for the worker
        release.set()
        ran = await running
        await s.stop()
        return withdrew, skipped, ran

    withdrew, skipped, ran = asyncio.run(main())
    assert withdrew == (True, False)
    assert skipped[1] is None and ran[1].text == "running"


def test_a_final_a_shared_window_missed_is_decoded_alone_next_while_its_window_mates_are_answered():
    """The runner's retry_later: the members it heard come back at once; the missed one is decoded
    alone (pack=False) before any other waiting final."""

    class MissesOne(FakeRunner):
        def window_frames(self, request):
            return 1000 if request.pack else 3000  # a packable final's share of a window, or a whole one

        def transcribe_batch(self, requests, retry_later=False):
            self.batches.append(list(requests))
            return [None if retry_later and r.prompt == "missed" and r.pack and len(requests) > 1 else self.transcribe(r) for r in requests]

    runner = MissesOne(lambda r: r.prompt)
    answered: list[str] = []

    def final(tag):
        return DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.FINAL, prompt=tag), False, 1600)

    async def main():
        s = Scheduler(runner, limits=BatchLimits(max_batch=3, final_frames=3000))
        jobs = [final(t) for t in ("heard", "missed", "also heard", "later")]
        futures = []
        for n, j in enumerate(jobs):
            f = asyncio.ensure_future(s.decode(f"s{n}", j))
            f.add_done_callback(lambda f: answered.append(f.result()[1].text))
            futures.append(f)
        await asyncio.sleep(0)
        s.start()
        await asyncio.gather(*futures)
        await s.stop()

    asyncio.run(main())
    assert [[r.prompt for r in b] for b in runner.batches] == [["heard", "missed", "also heard"], ["missed"], ["later"]]
    assert runner.batches[1][0].pack is False
    assert answered == ["heard", "also heard", "missed", "later"]


def _pause_decode(tag):
    return DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.FINAL, prompt=tag), True, 1600)


class _BusyInterims(FakeRunner):
    """Interims block until released (a worker kept busy); a final takes a third of a window."""

    def __init__(self, release):
        super().__init__(lambda r: r.prompt)
        self.release = release

    def window_frames(self, request):
        return 1000 if request.kind is DecodeKind.FINAL else 500

    def transcribe_batch(self, requests, retry_later=False):
        if requests[0].kind is DecodeKind.INTERIM:
            self.release.wait(5)
        return super().transcribe_batch(requests)


def _pause_decodes_apart(busy: bool, hold: float) -> list[list[str]]:
    """Two pause decodes 0.1 s apart, with or without another worker busy: the batches of finals that ran."""
    import threading

    release = threading.Event()
    runner = _BusyInterims(release)

    async def main():
        s = Scheduler(runner, limits=BatchLimits(max_batch=4, final_frames=3000), workers=2, pack_hold_s=hold)
        s.start()
        other = asyncio.ensure_future(s.decode("i", job("busy"))) if busy else None
        await asyncio.sleep(0.05)
        first = asyncio.ensure_future(s.decode("a", _pause_decode("a")))
        await asyncio.sleep(0.1)
        second = asyncio.ensure_future(s.decode("b", _pause_decode("b")))
        await asyncio.wait_for(asyncio.gather(first, second), timeout=5)
        release.set()
        if other is not None:
            await other
        await s.stop()

    asyncio.run(main())
    return [[r.prompt for r in b] for b in runner.batches if b[0].kind is DecodeKind.FINAL]


def test_a_lone_pause_decode_waits_briefly_for_a_window_mate_while_another_worker_is_busy():
    assert _pause_decodes_apart(busy=True, hold=1.0) == [["a", "b"]]


def test_an_idle_server_never_holds_a_pause_decode_and_a_hold_ends():
    assert _pause_decodes_apart(busy=False, hold=1.0) == [["a"], ["b"]]  # idle: at once
    assert _pause_decodes_apart(busy=True, hold=0.0) == [["a"], ["b"]]  # no hold configured
    assert _pause_decodes_apart(busy=True, hold=0.05) == [["a"], ["b"]]  # the hold ran out before "b" came
