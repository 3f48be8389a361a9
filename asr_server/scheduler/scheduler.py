"""One model, many sessions: decode jobs run one at a time in a worker thread.

Waiting jobs are ordered by weighted fair queuing across sessions
(:mod:`.policy`): a session's weight comes from its ``priority`` class.
Final decodes wait in their own fair queue, served before any interim: a
final is what a user waits on and is never dropped, while an interim that
waits is superseded by the next one anyway (each channel asks again with
newer audio once it returns), so under load interims thin out first. Each
channel has at most one job outstanding (the incremental decoder waits for its
result before asking again), so the queue holds at most one job per active
channel. The model runs in its own thread; the event loop never blocks on it.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..events import DecodeJob
from ..inference.whisper import DecodeKind, Hypothesis, Runner
from ..metrics import Metrics
from .policy import FairQueue, Ticket, estimated_cost

__all__ = ["Scheduler"]

log = logging.getLogger("asr_server.scheduler")


@dataclass(eq=False)
class _Entry:
    owner: str
    job: DecodeJob
    future: asyncio.Future[Hypothesis] = field(repr=False)


class Scheduler:
    """Call :meth:`start` inside the event loop, then :meth:`decode` from sessions."""

    def __init__(self, runner: Runner, metrics: Metrics | None = None) -> None:
        self.runner = runner
        self.metrics = metrics
        self._finals: FairQueue[_Entry] = FairQueue()
        self._interims: FairQueue[_Entry] = FairQueue()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asr-model")
        self._worker: asyncio.Task[None] | None = None

    @property
    def depth(self) -> int:
        return len(self._finals) + len(self._interims)

    def _pop(self) -> Ticket[_Entry] | None:
        return self._finals.pop() or self._interims.pop()

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._run(), name="asr-scheduler")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        while (ticket := self._pop()) is not None:
            ticket.item.future.cancel()
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def decode(self, owner: str, job: DecodeJob, weight: float = 1.0) -> Hypothesis:
        """Queue ``job`` and wait for its hypothesis. Cancelling the wait drops the job."""
        future: asyncio.Future[Hypothesis] = asyncio.get_running_loop().create_future()
        final = job.request.kind is DecodeKind.FINAL
        queue = self._finals if final else self._interims
        ticket: Ticket[_Entry] = queue.push(owner, _Entry(owner, job, future), weight=weight, cost=estimated_cost(final, job.request.duration))
        self._observe_depth()
        self._wakeup.set()
        try:
            return await future
        except asyncio.CancelledError:
            queue.cancel(ticket)
            self._observe_depth()
            raise

    def cancel_owner(self, owner: str) -> None:
        """Drop every queued job of a session that has gone away."""
        for ticket in self._finals.cancel_owner(owner) + self._interims.cancel_owner(owner):
            ticket.item.future.cancel()
        self._observe_depth()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            ticket = self._pop()
            if ticket is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            self._observe_depth()
            entry = ticket.item
            if entry.future.done():
                continue
            try:
                hyp = await loop.run_in_executor(self._executor, self.runner.transcribe, entry.job.request)
            except Exception as exc:  # the model failed: that session gets the error
                log.exception("decode failed owner=%s", entry.owner)
                if not entry.future.done():
                    entry.future.set_exception(exc)
                continue
            if self.metrics is not None:
                self.metrics.decode_seconds.labels(entry.job.request.kind.value).observe(hyp.decode_s)
            if not entry.future.done():
                entry.future.set_result(hyp)

    def _observe_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(self.depth)
