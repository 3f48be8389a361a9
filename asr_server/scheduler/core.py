"""The scheduler's decisions, with no clock, no threads and no asyncio.

In the shape of vLLM's v1 scheduler: the engine loop (:mod:`.engine`) asks
:meth:`SchedulerCore.schedule` what a free worker should run now, runs it
off the event loop, and hands the model's output (or its exception) back to
:meth:`SchedulerCore.update_from_output` / :meth:`SchedulerCore.update_from_error`.
Every call takes ``now`` and returns what to tell the waiting sessions, so
a test drives the whole policy with hand-written times and a fake model.

Policy (unchanged from the single-file scheduler it replaces):

* Finals wait in their own fair queue, served before any interim: a final is
  what a user waits on and is never dropped or reordered. With several
  workers, interims never take the last ``BatchLimits.final_workers`` of them
  (one by default), so a final that comes finds a worker free.
* Context passes (a channel's recent finals decoded together, the second
  pass) have a third queue, served when no final or interim waits, or once
  one has waited ``BatchLimits.context_max_wait_s`` (2 s by default): then
  before interims, never before finals. Interims are refreshed with the newest
  audio when they run, so under load they come less often; a pass left
  waiting would only fall further behind. Like interims, passes never take
  the workers kept for finals, nor more workers at once than
  ``BatchLimits.context_workers`` allows (unlimited by default). The passes
  of a session its client has closed (:meth:`SchedulerCore.hurry`) go ahead
  of every other waiting pass: the client waits on them for ``closed``, and
  the time after a close is bounded (a pass still waiting then is dropped,
  its finals never refined), while the others' passes only revise text
  their clients already show.
* A waiting job is refreshed when it is picked (an interim takes the newest
  audio of its utterance) or skipped once it has gone stale; a session may
  also withdraw a stale job at once (:meth:`SchedulerCore.withdraw`).
* A final that a shared window missed goes back to the head of the finals'
  queue, to be decoded alone.
* While another worker is busy, a lone young pause decode waits up to
  ``pack_hold_s`` for a window-mate (:meth:`SchedulerCore._hold`).
* A burst: when more finals wait than there are workers to take them
  (``BatchLimits.burst_backlog``), the finals picked run as burst finals (greedy, on the
  runner's burst window: a third of the model time), so that streams speaking in step
  get their finals in time; their context passes bring the accuracy back.

Failures cost one job, never a worker or a session: a job whose refresh or
batch arithmetic raises fails alone; a batch whose model call raises fails
sends each of its jobs back to run once more in a call of its own (a
batch-mate may have been the cause; :data:`FINAL_ATTEMPTS`). An interim that
fails alone is dropped (the next interim covers it); a final that fails
alone twice is given up, and its session reports it (``decode_failed``).
"""

from __future__ import annotations

import enum
import itertools
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..events import DecodeJob
from ..inference.types import DecodeKind, DecodeRequest, Hypothesis, Runner
from .policy import BatchLimits, FairQueue, Ticket, TimeShare, estimated_cost, form_batch

__all__ = [
    "Refresh", "JobStatus", "Entry", "Batch", "Decision", "Outcome", "QueueState", "SchedulerCore",
    "FINAL_ATTEMPTS", "PACK_HOLD_S",
]

log = logging.getLogger("asr_server.scheduler")

# A lone pause decode waits up to this long for another final to share its
# window while another worker is busy (see SchedulerCore._hold).
PACK_HOLD_S = 0.2
# Model calls a final may take part in that raise before it is given up.
FINAL_ATTEMPTS = 2

# Called when a waiting job is about to be batched: the job to run instead
# (the same one, or one with newer audio), or None to skip it.
Refresh = Callable[[DecodeJob], DecodeJob | None]


class JobStatus(enum.IntEnum):
    """Ordered: ``status >= DONE`` means the job's session has its answer (or left)."""

    WAITING = 0
    RUNNING = 1
    DONE = 2
    CANCELLED = 3


@dataclass(eq=False)
class Entry:
    """One decode a session waits for. ``id`` lets the engine find the session's future."""

    id: int
    owner: str
    job: DecodeJob
    queued_at: float
    refresh: Refresh | None = None
    alone: bool = False  # decode in a window of its own (a pack missed it, or a retry)
    burst: bool = False  # a final made a burst final because finals were queueing (see SchedulerCore)
    failures: int = 0  # model calls it took part in that raised
    status: JobStatus = JobStatus.WAITING
    ticket: Ticket["Entry"] | None = field(default=None, repr=False)
    trace: Any = field(default=None, repr=False)  # the session's decode span, when its stream is traced

    @property
    def request(self) -> DecodeRequest:
        request = self.job.request
        if self.burst and not request.burst and not request.careful:
            request = replace(request, burst=True)
        return replace(request, pack=False) if self.alone else request

    @property
    def final(self) -> bool:
        return self.job.request.kind is DecodeKind.FINAL


@dataclass(frozen=True, eq=False)
class Batch:
    """Jobs that one model call runs together (same runner, same batch key)."""

    id: int
    worker: int
    kind: DecodeKind
    runner: Runner
    entries: tuple[Entry, ...]
    started_at: float

    @property
    def requests(self) -> list[DecodeRequest]:
        return [e.request for e in self.entries]


@dataclass(frozen=True)
class Decision:
    """What :meth:`SchedulerCore.schedule` decided for one free worker."""

    batch: Batch | None = None
    skipped: tuple[Entry, ...] = ()  # answer "skipped" (stale)
    failed: tuple[Entry, ...] = ()  # answer "failed" (its refresh or batch arithmetic raised)
    wake_at: float | None = None  # a pack hold ends then: look again (even if this worker took interims meanwhile)


@dataclass(frozen=True)
class Outcome:
    """What a finished model call means for its jobs."""

    done: tuple[tuple[Entry, Hypothesis], ...] = ()
    failed: tuple[Entry, ...] = ()  # given up: answer "failed"
    requeued: tuple[Entry, ...] = ()  # back in the finals' queue, to be decoded alone


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
    # The share of the recent time (half-life SHARE_HALF_LIFE_S, since the first such decode) during
    # which some worker ran interims or context passes (each moment counted as min(1, calls running /
    # BatchLimits.busy_side_by_side)): how much time the server has to spare.
    background_busy: float = 0.0
    # The longest any context pass has waited in the queue.
    oldest_context_wait: float = 0.0


class SchedulerCore:
    """Call :meth:`add` for each job, :meth:`schedule` whenever a worker is free,
    then :meth:`update_from_output` or :meth:`update_from_error` with that batch's id."""

    def __init__(
        self,
        runner: Runner,
        limits: BatchLimits | None = None,
        interim_runner: Runner | None = None,
        workers: int = 1,
        pack_hold_s: float = PACK_HOLD_S,
    ) -> None:
        self.runner = runner
        self.interim_runner = interim_runner
        self.limits = limits or BatchLimits()
        self._background = TimeShare()  # model time of interims and context passes
        # Time during which workers ran interims or context passes ("busy"; each moment counted as
        # min(1, calls running / BatchLimits.busy_side_by_side)) and the rest ("idle"); the busy
        # level of the present stretch, and since when it has lasted (None: nothing ran yet).
        self._busy = TimeShare()
        self._busy_level = 0.0
        self._busy_at: float | None = None
        self.workers = max(1, workers)
        backlog = self.limits.burst_backlog
        self.burst_backlog = self.workers + 1 if backlog is None else backlog
        self.pack_hold_s = pack_hold_s
        self._final_limits = self.limits.for_finals()
        self._context_limits = self.limits.for_contexts()
        self._finals: FairQueue[Entry] = FairQueue()
        self._interims: FairQueue[Entry] = FairQueue()
        self._contexts: FairQueue[Entry] = FairQueue()
        self._ids = itertools.count(1)
        self._entries: dict[int, Entry] = {}  # every job not yet answered, waiting or running
        self._hurried: set[str] = set()  # sessions their clients closed: their passes go first
        self._running: dict[int, Batch] = {}  # batch id -> batch

    # -- what the engine asks ------------------------------------------------------

    @property
    def depth(self) -> int:
        """Jobs waiting (not running)."""
        return len(self._finals) + len(self._interims) + len(self._contexts)

    @property
    def queues(self) -> tuple[FairQueue[Entry], ...]:
        return (self._finals, self._interims, self._contexts)

    @property
    def live(self) -> int:
        """Jobs waiting or running: every one is still owed an answer."""
        return len(self._entries)

    def state(self, now: float) -> QueueState:
        finals = [e.queued_at for e in self._entries.values() if e.final and e.status <= JobStatus.RUNNING]
        interims = max((now - t.item.queued_at for t in self._interims.waiting()), default=0.0)
        contexts = max((now - t.item.queued_at for t in self._contexts.waiting()), default=0.0)
        return QueueState(len(self._finals), len(self._interims), max((now - t for t in finals), default=0.0), interims, self._busy_share(now), contexts)

    # -- sessions' requests ----------------------------------------------------------

    def add(self, owner: str, job: DecodeJob, now: float, *, weight: float = 1.0, refresh: Refresh | None = None, trace: Any = None) -> Entry:
        """Queue ``job``; its answer comes out of a later schedule or update."""
        entry = Entry(next(self._ids), owner, job, now, refresh, trace=trace)
        queue = self._queue(entry)
        # Context passes queue per channel (see policy.py: a call's channels' revisions waited twice
        # another stream's); interims and finals per session, as per channel cost 16 streams 0.1 s of
        # finals p95 (cause not found; docs/benchmarks.md, forty-third session).
        lane = job.channel if job.request.kind is DecodeKind.CONTEXT else None
        if lane is not None and owner in self._hurried:
            entry.ticket = queue.requeue(owner, entry)
        else:
            entry.ticket = queue.push(owner, entry, weight=weight, cost=estimated_cost(job.request.kind.final_quality, job.request.duration), lane=lane)
        self._entries[entry.id] = entry
        return entry

    def hurry(self, owner: str) -> None:
        """``owner``'s client closed it: its context passes, waiting and to come, go ahead of the others'."""
        self._hurried.add(owner)
        for ticket in self._contexts.in_order():
            if ticket.owner == owner:
                self._contexts.cancel(ticket)
                ticket.item.ticket = self._contexts.requeue(owner, ticket.item)

    def withdraw(self, job: DecodeJob) -> Entry | None:
        """The entry of ``job`` if it was still waiting: now answered as skipped. A running job finishes."""
        entry = next((e for e in self._entries.values() if e.job is job and e.status is JobStatus.WAITING), None)
        if entry is not None:
            self._finish(entry, JobStatus.DONE)
        return entry

    def cancel(self, entry_id: int) -> None:
        """Its session stopped waiting: drop it if waiting, ignore its result if running."""
        entry = self._entries.get(entry_id)
        if entry is not None:
            self._finish(entry, JobStatus.CANCELLED)

    def cancel_owner(self, owner: str) -> list[Entry]:
        """Drop every job of a session that has gone away; the entries dropped."""
        dropped = [e for e in self._entries.values() if e.owner == owner]
        for entry in dropped:
            self._finish(entry, JobStatus.CANCELLED)
        self._hurried.discard(owner)
        for queue in self.queues:
            queue.forget(owner)
        return dropped

    # -- deciding --------------------------------------------------------------------

    def schedule(self, now: float, worker: int) -> Decision:
        """What free ``worker`` runs now. Skipped and failed jobs are answered on the way."""
        skipped: list[Entry] = []
        failed: list[Entry] = []

        # Whether this is a burst is decided once, on the queue as it stands before any final is
        # taken: every final picked now is then alike and may share the call (judged per final,
        # the head became a burst final and the next one, seeing one fewer waiting, did not).
        burst = bool(self.burst_backlog) and len(self._finals) >= self.burst_backlog

        def inspect(entry: Entry) -> tuple[Hashable, int] | None:
            try:
                return self._inspect(entry, burst)
            except Exception:
                log.exception("job of %s could not be prepared; it fails alone", entry.owner)
                failed.append(entry)
                return None

        wake_at = self._hold(now)
        queues = [] if wake_at is not None else [(self._finals, self._final_limits)]
        if self._background_workers() < max(1, self.workers - self.limits.final_workers):
            passes = self._passes_may_start()
            overdue = passes and self._context_overdue(now)
            if overdue:
                queues.append((self._contexts, self._context_limits))
            queues.append((self._interims, self.limits))
            if passes and not overdue and not self._finals and not self._interims:
                queues.append((self._contexts, self._context_limits))
        while True:
            tickets, dropped = form_batch(queues, inspect)
            for ticket in dropped:
                entry = ticket.item
                entry.ticket = None
                if entry not in failed:
                    skipped.append(entry)
                self._finish(entry, JobStatus.DONE)
            if tickets or not dropped:
                break
        batch = self._start(worker, [t.item for t in tickets], now) if tickets else None
        self._check()
        return Decision(batch, tuple(skipped), tuple(failed), wake_at)

    def update_from_output(self, batch_id: int, hypotheses: Sequence[Hypothesis | None], now: float) -> Outcome:
        """The model answered ``batch_id``: one hypothesis (or None: a pack missed it) per job, in order."""
        batch = self._running.pop(batch_id)
        self._spent(batch, now)
        if len(hypotheses) != len(batch.entries):
            log.error("runner returned %d results for %d jobs", len(hypotheses), len(batch.entries))
            return self._failed(batch)
        done: list[tuple[Entry, Hypothesis]] = []
        requeued: list[Entry] = []
        for entry, hyp in zip(batch.entries, hypotheses, strict=True):
            if entry.status is JobStatus.CANCELLED:
                continue
            if hyp is None:
                # Its window-mates were heard: they are answered now, and it is decoded
                # alone next, ahead of every waiting final (it has waited longest).
                self._requeue(entry)
                requeued.append(entry)
                continue
            self._finish(entry, JobStatus.DONE)
            done.append((entry, hyp))
        self._check()
        return Outcome(tuple(done), (), tuple(requeued))

    def update_from_error(self, batch_id: int, now: float) -> Outcome:
        """The model call for ``batch_id`` raised (or its worker died running it)."""
        batch = self._running.pop(batch_id, None)
        if batch is None:
            return Outcome()
        self._spent(batch, now)
        outcome = self._failed(batch)
        self._check()
        return outcome

    def running_batch(self, worker: int) -> Batch | None:
        return next((b for b in self._running.values() if b.worker == worker), None)

    # -- internals -------------------------------------------------------------------

    def _queue(self, entry: Entry) -> FairQueue[Entry]:
        kind = entry.job.request.kind
        return self._finals if kind is DecodeKind.FINAL else self._contexts if kind is DecodeKind.CONTEXT else self._interims

    def _runner_for(self, request: DecodeRequest) -> Runner:
        if request.model == "interim" and self.interim_runner is not None:
            return self.interim_runner
        return self.runner

    def _inspect(self, entry: Entry, burst: bool) -> tuple[Hashable, int] | None:
        if entry.refresh is not None:
            fresh = entry.refresh(entry.job)
            if fresh is None:
                return None
            entry.job = fresh
        if entry.final and burst:
            entry.burst = True  # once a burst final, always: its batch key is settled
        request = entry.request
        runner = self._runner_for(request)
        key = runner.batch_key(request)
        # A retry after a failed call runs in a batch of its own: a batch-mate may have been the cause.
        return (id(runner), ("retry", entry.id) if entry.failures else key), runner.window_frames(request)

    def _context_overdue(self, now: float) -> bool:
        """Whether a context pass goes before interims: one has waited ``context_max_wait_s``, and
        passes took less than ``context_share`` of the recent background model time."""
        limit = self.limits.context_max_wait_s
        if limit is None or not any(now - t.item.queued_at >= limit for t in self._contexts.waiting()):
            return False
        return self._background.share(DecodeKind.CONTEXT, now) < self.limits.context_share

    def _passes_may_start(self) -> bool:
        """Whether fewer model calls of context passes run than ``BatchLimits.context_workers`` allows."""
        cap = self.limits.context_workers
        return not cap or sum(1 for b in self._running.values() if b.kind is DecodeKind.CONTEXT) < cap

    def _background_workers(self) -> int:
        """Workers running interims or context passes (never those kept for finals)."""
        return sum(1 for b in self._running.values() if b.kind is not DecodeKind.FINAL)

    def _hold(self, now: float) -> float | None:
        """When to look again if the only waiting final should wait for a window-mate, else None.

        A pause decode has slack (the endpoint comes ``endpoint - tail`` later)
        and a final alone costs a whole window, where two share one for little
        more. So while another worker is busy with another stream's work, a
        lone young pause decode that could share its call waits up to
        ``pack_hold_s``; the worker takes interims meanwhile. Idle servers never
        hold, nor do servers busy only with the same stream (its own interim
        left behind at the pause, its context pass): no window-mate is coming,
        and where the decode takes longer than the slack (a slow core, or a long
        utterance's 200 ms endpoint) the hold was added to the final's latency.
        """
        if self.pack_hold_s <= 0 or len(self._finals) != 1:
            return None
        [ticket] = self._finals.waiting()
        entry = ticket.item
        until = entry.queued_at + self.pack_hold_s
        if not entry.job.speculative or entry.alone or until <= now:
            return None
        if all(e.owner == entry.owner for b in self._running.values() for e in b.entries):
            return None
        try:
            if self.runner.window_frames(entry.request) >= self._final_limits.max_frames:
                return None  # a call of its own anyway
        except Exception:
            return None  # schedule() will fail it when it inspects it
        return until

    def _busy_share(self, now: float) -> float:
        """The share of the recent time during which workers ran interims or passes (see ``_busy``)."""
        return 0.0 if self._busy_at is None else self._busy.share("busy", now, self._stretch(now))

    def _stretch(self, now: float) -> tuple[tuple[str, float], ...]:
        """The present stretch until ``now``, as busy and idle seconds (none before anything ran)."""
        if self._busy_at is None:
            return ()
        seconds = now - self._busy_at
        return (("busy", seconds * self._busy_level), ("idle", seconds * (1.0 - self._busy_level)))

    def _busy_changed(self, now: float) -> None:
        """A background call started or ended: close the present stretch if its busy level changes."""
        level = min(1.0, self._background_workers() / self.limits.busy_side_by_side)
        if level == self._busy_level:
            return
        for kind, seconds in self._stretch(now):
            self._busy.add(kind, seconds, now)
        self._busy_level, self._busy_at = level, now

    def _spent(self, batch: Batch, now: float) -> None:
        """A batch is over (it left ``_running``): its model time, and its end in the busy share."""
        if batch.kind is not DecodeKind.FINAL:
            self._background.add(batch.kind, now - batch.started_at, now)
            self._busy_changed(now)

    def _start(self, worker: int, entries: list[Entry], now: float) -> Batch:
        for entry in entries:
            entry.status = JobStatus.RUNNING
            entry.ticket = None
        first = entries[0].request
        batch = Batch(next(self._ids), worker, first.kind, self._runner_for(first), tuple(entries), now)
        self._running[batch.id] = batch
        if batch.kind is not DecodeKind.FINAL:
            self._busy_changed(now)
        return batch

    def _failed(self, batch: Batch) -> Outcome:
        failed: list[Entry] = []
        requeued: list[Entry] = []
        shared = len(batch.entries) > 1
        for entry in batch.entries:
            if entry.status is JobStatus.CANCELLED:
                continue
            entry.failures += 1
            # A final gets one more call, alone; an interim only if a batch-mate may have been the cause.
            if entry.failures < FINAL_ATTEMPTS and (entry.final or shared):
                self._requeue(entry)
                requeued.append(entry)
            else:
                self._finish(entry, JobStatus.DONE)
                failed.append(entry)
        return Outcome((), tuple(failed), tuple(requeued))

    def _requeue(self, entry: Entry) -> None:
        entry.alone = entry.final
        entry.status = JobStatus.WAITING
        entry.ticket = self._queue(entry).requeue(entry.owner, entry)

    def _finish(self, entry: Entry, status: JobStatus) -> None:
        if entry.ticket is not None:
            self._queue(entry).cancel(entry.ticket)
            entry.ticket = None
        entry.status = status
        self._entries.pop(entry.id, None)

    def _check(self) -> None:
        """Invariants after each decision (cheap: one job per active channel at most)."""
        waiting = sum(1 for e in self._entries.values() if e.status is JobStatus.WAITING)
        assert waiting == self.depth, (waiting, self.depth)
        assert len(self._running) <= self.workers, "more batches running than workers"
