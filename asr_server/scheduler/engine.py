"""One model, many sessions: the engine loop that carries out the scheduler's decisions.

:class:`Scheduler` owns the model's executor threads and one worker task per
thread. A free worker asks :meth:`.core.SchedulerCore.schedule` what to run,
runs that batch in the executor, and hands the output (or the exception) to
``update_from_output`` / ``update_from_error``; each answer goes to the
future its session awaits. Nothing here decides anything: the policy and its
invariants live in :mod:`.core`, which a test drives with a fake clock.

It cannot stall silently: every step of a worker is guarded, a failure costs
only the jobs involved, and a worker task that ends for any reason other
than :meth:`Scheduler.stop` is logged, counted
(``asr_scheduler_worker_restarts_total``) and replaced, after its batch is
failed so nobody waits for it.

On CPU two workers with one thread each get more out of two cores than one
worker with two threads (measured: 26% more decodes per second), since much
of a decode does not parallelize. Finals are the exception: the runner decodes
them with a thread per core (``--final-cpu-threads``), so a final that finds
the other worker idle has both cores. Finals in a burst decode a call per core at
once instead (``--burst-copy``: they drain faster so), on workers kept for them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from ..events import DecodeJob
from ..inference.types import DecodeKind, Hypothesis, Runner
from ..metrics import Metrics
from ..tracing import Tracing
from .core import PACK_HOLD_S, Batch, Decision, Entry, Outcome, QueueState, Refresh, SchedulerCore
from .capacity import CapacityModel
from .policy import BatchLimits

__all__ = ["Scheduler", "Refresh", "QueueState", "DecodeAnswer", "JobFailed"]

log = logging.getLogger("asr_server.scheduler")

# What a session's wait resolves to: the job that ran (the one queued, or its
# refreshed replacement) and its hypothesis, or None when it was skipped.
DecodeAnswer = tuple[DecodeJob, Hypothesis | None]


class JobFailed(Exception):
    """A final the model could not decode, even alone on a retry: ``job`` is the one that failed."""

    def __init__(self, job: DecodeJob) -> None:
        super().__init__(f"decode failed: channel {job.channel} utterance {job.utterance}")
        self.job = job


class Scheduler:
    """Call :meth:`start` inside the event loop, then :meth:`decode` from sessions; :meth:`stop` at the end."""

    def __init__(
        self,
        runner: Runner,
        metrics: Metrics | None = None,
        limits: BatchLimits | None = None,
        interim_runner: Runner | None = None,
        workers: int = 1,
        pack_hold_s: float = PACK_HOLD_S,
        tracing: Tracing | None = None,
    ) -> None:
        """``workers``: batches run at once (the runner must allow that many concurrent calls).

        ``pack_hold_s``: how long a lone pause decode may wait for a window-mate while the server is busy (0: never).
        """
        self.core = SchedulerCore(runner, limits, interim_runner, workers, pack_hold_s)
        self.metrics = metrics
        self.tracing = tracing or Tracing()
        self.capacity: CapacityModel | None = None  # told the cost of every final in a burst
        self._n_workers = self.core.workers
        self._executor = ThreadPoolExecutor(max_workers=self._n_workers, thread_name_prefix="asr-model")
        self._futures: dict[int, asyncio.Future[DecodeAnswer]] = {}
        self._wakeup = asyncio.Event()
        self._workers: dict[int, asyncio.Task[None]] = {}
        self._wake_at: float | None = None  # the pack hold's wake-up already armed
        self._stopping = False
        self.restarts = 0  # worker tasks replaced after they ended unexpectedly

    @property
    def depth(self) -> int:
        return self.core.depth

    def state(self, now: float) -> QueueState:
        return self.core.state(now)

    def start(self) -> None:
        for worker in range(self._n_workers):
            self._spawn(worker)

    async def stop(self) -> None:
        self._stopping = True
        workers = list(self._workers.values())
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def decode(self, owner: str, job: DecodeJob, weight: float = 1.0, refresh: Refresh | None = None, trace: Any = None) -> DecodeAnswer:
        """Queue ``job``; wait for ``(the job that ran, its hypothesis)``.

        The job that ran is ``job`` or the replacement ``refresh`` gave; the
        hypothesis is None when the job was skipped (stale, withdrawn, or an
        interim whose model call failed: the next interim covers it). Raises
        :class:`JobFailed` for a final the model could
        not decode after a retry. Cancelling the wait drops the job.
        ``trace``: the job's :class:`~asr_server.tracing.DecodeTrace` (its stream is traced).
        """
        loop = asyncio.get_running_loop()
        entry = self.core.add(owner, job, loop.time(), weight=weight, refresh=refresh, trace=trace)
        future: asyncio.Future[DecodeAnswer] = loop.create_future()
        self._futures[entry.id] = future
        self._changed()
        try:
            return await future
        except asyncio.CancelledError:
            self._futures.pop(entry.id, None)
            self.core.cancel(entry.id)
            self._changed()
            raise

    def withdraw(self, job: DecodeJob) -> bool:
        """Answer ``job`` as skipped now if it is still waiting; False if it runs (it finishes) or is done."""
        entry = self.core.withdraw(job)
        if entry is None:
            return False
        self._skip(entry)
        self._changed()
        return True

    def hurry(self, owner: str) -> None:
        """``owner``'s client closed it: its context passes go ahead of the others' (:meth:`SchedulerCore.hurry`)."""
        self.core.hurry(owner)
        self._changed()

    def cancel_owner(self, owner: str) -> None:
        """Drop every job of a session that has gone away."""
        for entry in self.core.cancel_owner(owner):
            future = self._futures.pop(entry.id, None)
            if future is not None:
                future.cancel()
        self._changed()

    # -- the workers -----------------------------------------------------------------

    def _spawn(self, worker: int) -> None:
        task = asyncio.get_running_loop().create_task(self._run(worker), name=f"asr-scheduler-{worker}")
        self._workers[worker] = task
        task.add_done_callback(partial(self._worker_ended, worker))

    def _worker_ended(self, worker: int, task: asyncio.Task[None]) -> None:
        """A worker task ended with an error: fail its batch and replace it.

        A cancelled worker is not replaced: only :meth:`stop` or the event
        loop's own shutdown cancels one.
        """
        if self._stopping or task.cancelled():
            return
        error = task.exception()
        log.error("scheduler worker %d ended unexpectedly (%r); replacing it", worker, error, exc_info=error)
        self.restarts += 1
        if self.metrics is not None:
            self.metrics.worker_restarts.inc()
        batch = self.core.running_batch(worker)
        if batch is not None:
            self._answer(self.core.update_from_error(batch.id, asyncio.get_running_loop().time()), batch)
        self._spawn(worker)
        self._changed()

    async def _run(self, worker: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                decision = self.core.schedule(loop.time(), worker)
            except Exception:
                # A broken invariant: logged, and the worker waits for the next change instead of dying.
                log.exception("scheduling failed; worker %d waits for the next change", worker)
                decision = Decision()
            self._answer_decision(decision)
            self._arm(decision.wake_at)
            if decision.batch is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self.core.depth:
                self._wakeup.set()  # more waiting: another idle worker may take it
            await self._execute(decision.batch)

    async def _execute(self, batch: Batch) -> None:
        loop = asyncio.get_running_loop()
        times = [batch.started_at, batch.started_at]  # the model call's start and end (monotonic, as loop.time())

        def call() -> list[Hypothesis]:
            times[0] = time.monotonic()
            try:
                return batch.runner.transcribe_batch(batch.requests, retry_later=True)
            finally:
                times[1] = time.monotonic()

        try:
            hyps = await loop.run_in_executor(self._executor, call)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("decode failed kind=%s batch=%d", batch.kind.value, len(batch.entries))
            outcome = self.core.update_from_error(batch.id, loop.time())
        else:
            outcome = self.core.update_from_output(batch.id, hyps, loop.time())
        finally:
            self._wakeup.set()  # a worker kept off interims may take them now
        self._observe_batch(batch, outcome, times[0], times[1])
        self._answer(outcome, batch)

    # -- answering sessions ----------------------------------------------------------

    def _answer_decision(self, decision: Decision) -> None:
        for entry in decision.skipped:
            self._skip(entry)
        for entry in decision.failed:
            self._fail(entry) if entry.final else self._skip(entry)
        if decision.failed and self.metrics is not None:
            for entry in decision.failed:
                self.metrics.decode_failures.labels(entry.job.request.kind.value).inc()
        self._observe_depth()

    def _answer(self, outcome: Outcome, batch: Batch) -> None:
        for entry, hyp in outcome.done:
            future = self._futures.pop(entry.id, None)
            if future is not None and not future.done():
                future.set_result((entry.job, hyp))
        for entry in outcome.failed:
            if entry.final:
                self._fail(entry)
            else:
                self._skip(entry)  # an interim: the next one covers it
        if outcome.failed and self.metrics is not None:
            self.metrics.decode_failures.labels(batch.kind.value).inc(len(outcome.failed))
        if outcome.requeued:
            self._wakeup.set()

    def _skip(self, entry: Entry) -> None:
        future = self._futures.pop(entry.id, None)
        if future is not None and not future.done():
            future.set_result((entry.job, None))
            if self.metrics is not None:
                self.metrics.decodes_skipped.labels(entry.job.request.kind.value).inc()

    def _fail(self, entry: Entry) -> None:
        future = self._futures.pop(entry.id, None)
        if future is not None and not future.done():
            future.set_exception(JobFailed(entry.job))

    # -- wake-ups and metrics --------------------------------------------------------

    def _changed(self) -> None:
        self._observe_depth()
        self._wakeup.set()

    def _arm(self, wake_at: float | None) -> None:
        """One wake-up per pack hold, however often the workers look."""
        if wake_at is not None and wake_at != self._wake_at:
            self._wake_at = wake_at
            asyncio.get_running_loop().call_at(wake_at, self._wakeup.set)

    def _observe_batch(self, batch: Batch, outcome: Outcome, model_start: float, model_end: float) -> None:
        if self.capacity is not None and batch.kind is DecodeKind.CONTEXT:
            self.capacity.observe_pass((model_end - model_start) / len(batch.entries))  # each pass's share, as for finals
        if self.capacity is not None and batch.kind is DecodeKind.FINAL:
            for entry, hyp in outcome.done:
                # A burst's call on the finals' own copy has every core first and ends sooner than
                # the calls beside it, which wait for the cores it leaves: theirs are the burst's pace.
                if entry.request.burst and not hyp.finals_copy:
                    self.capacity.observe_final(hyp.decode_s)
        kind = batch.kind.value
        if self.tracing.enabled:
            variant = "interim" if batch.runner is self.core.interim_runner and batch.runner is not self.core.runner else "main"
            traced = [(e.trace, e.queued_at, batch.started_at) for e in batch.entries if e.trace is not None]
            self.tracing.batch(traced, kind, len(batch.entries), variant, batch.started_at, model_start, model_end)
        if self.metrics is None:
            return
        self.metrics.batch_formation_seconds.labels(kind).observe(max(0.0, model_start - batch.started_at))
        self.metrics.batch_size.labels(kind).observe(len(batch.entries))
        self.metrics.decode_seconds.labels(kind).observe(sum(h.decode_s for _, h in outcome.done))
        self.metrics.finals_packed.inc(sum(1 for _, h in outcome.done if h.packed))
        for entry, _ in outcome.done:
            if entry.request.cut_back:
                self.metrics.finals_greedy.labels("burst" if entry.request.burst else "busy").inc()
            elif entry.request.careful:
                self.metrics.finals_careful.inc()
        for entry in batch.entries:
            if not entry.alone:
                self.metrics.queue_wait_seconds.labels(kind).observe(batch.started_at - entry.queued_at)

    def _observe_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(self.core.depth)

