"""One model, many sessions: decode jobs run in batches on worker threads.

Waiting jobs are ordered by weighted fair queuing across sessions
(:mod:`.policy`): a session's weight comes from its ``priority`` class.
Final decodes wait in their own fair queue, served before any interim: a
final is what a user waits on and is never dropped or reordered, while an
interim that waits is refreshed with the newest audio of its utterance when
it is picked (pull model: the queue holds "this channel wants an interim",
not a copy of old audio) and skipped once its utterance has paused or ended;
a pause decode (a final-quality decode started when speech paused) is
skipped if the speaker went on talking meanwhile. A session withdraws such a
job the moment it goes stale (:meth:`Scheduler.withdraw`), so it never holds
its channel's next decode until its turn. A final that a shared window
missed goes back to the head of the finals' queue, to be decoded alone.
Each channel has at most one job outstanding, so the queues hold at most one
job per active channel.

Whenever a worker is free, it forms the next batch from the queue heads
(:func:`.policy.form_batch`) and runs it off the event loop; each result goes
back to the session that asked. On CPU two workers with one thread each get
more out of two cores than one worker with two threads (measured: 26% more
decodes per second), since much of a decode does not parallelize.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial

from ..events import DecodeJob
from ..inference.whisper import DecodeKind, DecodeRequest, Hypothesis, Runner
from ..metrics import Metrics
from .policy import BatchLimits, FairQueue, Ticket, estimated_cost, form_batch

__all__ = ["Scheduler", "Refresh", "QueueState"]

log = logging.getLogger("asr_server.scheduler")

# A lone pause decode waits up to this long for another final to share its
# window while another worker is busy (see Scheduler._hold_lone_pause_decode).
PACK_HOLD_S = 0.2

# Called when a waiting job is about to be batched: the job to run instead
# (the same one, or one with newer audio), or None to skip it.
Refresh = Callable[[DecodeJob], DecodeJob | None]


@dataclass(eq=False)
class _Entry:
    owner: str
    job: DecodeJob
    future: asyncio.Future[tuple[DecodeJob, Hypothesis | None]] = field(repr=False)
    queued_at: float
    refresh: Refresh | None = None
    alone: bool = False  # a final a shared window did not clearly transcribe: decode it in its own

    @property
    def request(self) -> DecodeRequest:
        return replace(self.job.request, pack=False) if self.alone else self.job.request


@dataclass(frozen=True)
class QueueState:
    """What the load governor looks at (seconds)."""

    finals: int
    interims: int
    # The longest any final not yet answered has waited since it was queued,
    # running ones included: what its user is waiting for.
    oldest_final_wait: float
    # The longest any interim has waited in the queue (captions lag by that much).
    oldest_interim_wait: float = 0.0


class Scheduler:
    """Call :meth:`start` inside the event loop, then :meth:`decode` from sessions."""

    def __init__(
        self,
        runner: Runner,
        metrics: Metrics | None = None,
        limits: BatchLimits | None = None,
        interim_runner: Runner | None = None,
        workers: int = 1,
        pack_hold_s: float = PACK_HOLD_S,
    ) -> None:
        """``workers``: batches run at once (the runner must allow that many concurrent calls).

        ``pack_hold_s``: how long a lone pause decode may wait for a window-mate while the server is busy (0: never).
        """
        self.pack_hold_s = pack_hold_s
        self.runner = runner
        self.interim_runner = interim_runner
        self.metrics = metrics
        self.limits = limits or BatchLimits()
        self._final_limits = self.limits.for_finals()
        self._finals: FairQueue[_Entry] = FairQueue()
        self._interims: FairQueue[_Entry] = FairQueue()
        self._wakeup = asyncio.Event()
        self._n_workers = max(1, workers)
        self._executor = ThreadPoolExecutor(max_workers=self._n_workers, thread_name_prefix="asr-model")
        self._workers: list[asyncio.Task[None]] = []
        self._running: dict[int, DecodeKind] = {}  # worker -> kind of the batch it runs
        self._running_finals_since: dict[int, float] = {}  # worker -> when its oldest running final was queued
        self._hold_until = 0.0  # when the current pack hold ends (a wake-up is set for it)

    @property
    def depth(self) -> int:
        return len(self._finals) + len(self._interims)

    def state(self, now: float) -> QueueState:
        finals = self._finals.in_order()
        since = [t.item.queued_at for t in finals] + list(self._running_finals_since.values())
        interims = max((now - t.item.queued_at for t in self._interims.waiting()), default=0.0)
        return QueueState(len(finals), len(self._interims), max((now - t for t in since), default=0.0), interims)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._workers = [loop.create_task(self._run(i), name=f"asr-scheduler-{i}") for i in range(self._n_workers)]

    async def stop(self) -> None:
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        for queue in (self._finals, self._interims):
            while (ticket := queue.pop()) is not None:
                ticket.item.future.cancel()
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def decode(self, owner: str, job: DecodeJob, weight: float = 1.0, refresh: Refresh | None = None) -> tuple[DecodeJob, Hypothesis | None]:
        """Queue ``job``; wait for ``(the job that ran, its hypothesis)``.

        The job that ran is ``job`` or the replacement ``refresh`` gave; the
        hypothesis is None when ``refresh`` skipped it. Cancelling the wait
        drops the job.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[DecodeJob, Hypothesis | None]] = loop.create_future()
        final = job.request.kind is DecodeKind.FINAL
        queue = self._finals if final else self._interims
        entry = _Entry(owner, job, future, loop.time(), refresh)
        ticket: Ticket[_Entry] = queue.push(owner, entry, weight=weight, cost=estimated_cost(final, job.request.duration))
        self._observe_depth()
        self._wakeup.set()
        try:
            return await future
        except asyncio.CancelledError:
            if not ticket.cancelled:
                queue.cancel(ticket)
            self._observe_depth()
            raise

    def withdraw(self, job: DecodeJob) -> bool:
        """Answer ``job`` as skipped now if it is still waiting (its result is no longer wanted).

        Returns False when it is not waiting (running, done, or unknown): a
        running job finishes as usual.
        """
        for queue in (self._interims, self._finals):
            ticket = next((t for t in queue.waiting() if t.item.job is job), None)
            if ticket is not None:
                queue.cancel(ticket)
                self._skip(ticket.item)
                self._observe_depth()
                return True
        return False

    def cancel_owner(self, owner: str) -> None:
        """Drop every queued job of a session that has gone away."""
        for ticket in self._finals.cancel_owner(owner) + self._interims.cancel_owner(owner):
            ticket.item.future.cancel()
        self._observe_depth()

    # -- the worker -----------------------------------------------------------------

    def _inspect(self, entry: _Entry) -> tuple[object, int] | None:
        if entry.future.done():
            return None
        if entry.refresh is not None:
            fresh = entry.refresh(entry.job)
            if fresh is None:
                return None
            entry.job = fresh
        request = entry.request
        runner = self._runner_for(request)
        return (id(runner), runner.batch_key(request)), runner.window_frames(request)

    def _runner_for(self, request: DecodeRequest) -> Runner:
        if request.model == "interim" and self.interim_runner is not None:
            return self.interim_runner
        return self.runner

    def _next_batch(self) -> list[_Entry]:
        """Form the next batch; skipped jobs are answered on the way.

        With several workers, at most all but one run interims at a time: a
        final that arrives then finds a worker free instead of waiting behind
        interim batches.
        """
        interims_running = sum(1 for kind in self._running.values() if kind is DecodeKind.INTERIM)
        queues = [] if self._hold_lone_pause_decode() else [(self._finals, self._final_limits)]
        if interims_running < max(1, self._n_workers - 1):
            queues.append((self._interims, self.limits))
        while True:
            batch, skipped = form_batch(queues, self._inspect)
            for ticket in skipped:
                self._skip(ticket.item)
            if batch or not skipped:
                return [t.item for t in batch]

    def _hold_lone_pause_decode(self) -> bool:
        """Whether the only waiting final should wait a moment for a window-mate.

        A pause decode has slack (the endpoint comes ``endpoint - tail`` later)
        and a final alone costs a whole window, where two share one for little
        more. So while another worker is busy, a lone young pause decode that
        could share its call waits up to ``pack_hold_s``; the worker takes
        interims meanwhile. Idle servers never hold.
        """
        if self.pack_hold_s <= 0 or not self._running or len(self._finals) != 1:
            return False
        [ticket] = self._finals.waiting()
        entry = ticket.item
        loop = asyncio.get_running_loop()
        until = entry.queued_at + self.pack_hold_s
        if not entry.job.speculative or entry.alone or until <= loop.time() or entry.future.done():
            return False
        if self.runner.window_frames(entry.request) >= self._final_limits.max_frames:
            return False  # a call of its own anyway
        if until != self._hold_until:  # one wake-up per hold, however often the workers look
            self._hold_until = until
            loop.call_at(until, self._wakeup.set)
        return True

    def _skip(self, entry: _Entry) -> None:
        if not entry.future.done():
            entry.future.set_result((entry.job, None))
            if self.metrics is not None:
                self.metrics.decodes_skipped.labels(entry.job.request.kind.value).inc()

    async def _run(self, worker: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = self._next_batch()
            self._observe_depth()
            if not batch:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self.depth:
                self._wakeup.set()  # more waiting: another idle worker may take it
            requests = [e.request for e in batch]
            kind = requests[0].kind
            now = loop.time()
            self._running[worker] = kind
            if kind is DecodeKind.FINAL:
                self._running_finals_since[worker] = min(e.queued_at for e in batch)
            try:
                call = partial(self._runner_for(requests[0]).transcribe_batch, requests, retry_later=True)
                hyps = await loop.run_in_executor(self._executor, call)
            except Exception:
                log.exception("decode failed kind=%s batch=%d", kind.value, len(batch))
                await self._one_by_one(batch)
                continue
            finally:
                self._running.pop(worker, None)
                self._running_finals_since.pop(worker, None)
                self._wakeup.set()  # a worker kept off interims may take them now
            done = [h for h in hyps if h is not None]
            if self.metrics is not None:
                self.metrics.batch_size.labels(kind.value).observe(len(batch))
                self.metrics.decode_seconds.labels(kind.value).observe(sum(h.decode_s for h in done))
                self.metrics.finals_packed.inc(sum(1 for h in done if h.packed))
                for entry in batch:
                    if not entry.alone:
                        self.metrics.queue_wait_seconds.labels(kind.value).observe(now - entry.queued_at)
            for entry, hyp in zip(batch, hyps):
                if hyp is None:
                    # Its window-mates were heard: they go back now, and it is decoded
                    # alone next, ahead of every waiting final (it has waited longest).
                    entry.alone = True
                    self._finals.requeue(entry.owner, entry)
                    self._wakeup.set()
                elif not entry.future.done():
                    entry.future.set_result((entry.job, hyp))

    async def _one_by_one(self, batch: list[_Entry]) -> None:
        """A batch failed: run its jobs alone, so only the one that fails gets the error."""
        loop = asyncio.get_running_loop()
        for entry in batch:
            if entry.future.done():
                continue
            try:
                [hyp] = await loop.run_in_executor(self._executor, self._runner_for(entry.request).transcribe_batch, [entry.request])
            except Exception as exc:
                if len(batch) > 1:
                    log.exception("decode failed alone owner=%s", entry.owner)
                if not entry.future.done():
                    entry.future.set_exception(exc)
                continue
            if hyp is not None and not entry.future.done():
                entry.future.set_result((entry.job, hyp))

    def _observe_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(self.depth)
