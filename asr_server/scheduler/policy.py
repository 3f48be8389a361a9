"""Which waiting decode runs next: weighted fair queuing across sessions.

Start-time fair queuing (Goyal, Vin and Cheng, 1996): each session (owner),
or each lane of it (a channel), is a flow with the session's weight; a job
gets a start tag ``max(V, the flow's last finish tag)`` and a finish tag
``start + cost / weight``; the job with the smallest start tag runs next, and
the virtual time ``V`` becomes its start tag. A flow's share of model time is
proportional to its weight and no flow waits behind another's backlog: every
admitted stream keeps making progress, whatever its class (no strict
priority). Context passes queue by channel (the scheduler core's choice): in
one flow per session, a call's two channels had half a stream's share of
passes each, and at 8 streams on 2 cores its revisions came p50 8-10 s after
its finals (three runs of four), against 3.6-5.0 s with a flow each
(docs/benchmarks.md, forty-third session).

Batches (continuous batching): whenever the model is free, :func:`form_batch`
takes the fair-order head and then, in fair order, the other waiting jobs that
share its batch key (same kind, language, encoder window, prompt position),
up to a batch size and a budget of padded encoder frames (finals have their
own budget: on CPU one shared window's worth, see ``BatchLimits``). Jobs that do not
match keep their place. Before a job is looked at, ``inspect`` may refresh it
(an interim takes the newest audio of its utterance) or skip it (an interim
made stale by a pause or an endpoint).

Plain objects: no clock, no threads. The scheduler's worker drives them.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from dataclasses import dataclass, field, replace
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

__all__ = ["CONTEXT_MAX_WAIT_S", "CONTEXT_SHARE", "SHARE_HALF_LIFE_S", "TimeShare", "Priority", "WEIGHTS", "FairQueue", "Ticket", "estimated_cost", "BatchLimits", "form_batch"]

T = TypeVar("T")


class Priority(str, enum.Enum):
    INTERACTIVE = "interactive"
    STANDARD = "standard"
    BATCH = "batch"


# Shares of model time when classes compete: weights, never strict priority.
WEIGHTS: dict[Priority, float] = {Priority.INTERACTIVE: 4.0, Priority.STANDARD: 2.0, Priority.BATCH: 1.0}


# A context pass that has waited this long goes before interims (never before finals; None:
# only when no final or interim waits). Measured at 8 streams (docs/benchmarks.md): with None,
# passes waited while interims did and their revisions came 30 s after the final (p95); with
# 2 s, 15 s (10 s with passes that decode no audio context, --context-back-s 0).
CONTEXT_MAX_WAIT_S: float | None = 2.0
CONTEXT_SHARE = 0.5
# Model time counts for the share with this half-life (s).
SHARE_HALF_LIFE_S = 20.0


class TimeShare:
    """Model time recently spent on each kind of work, decayed with a half-life: which share each took."""

    def __init__(self, half_life_s: float = SHARE_HALF_LIFE_S) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be positive")
        self.half_life_s = half_life_s
        self._spent: dict[Hashable, float] = {}
        self._at = 0.0

    def add(self, kind: Hashable, seconds: float, now: float) -> None:
        self._decay(now)
        self._spent[kind] = self._spent.get(kind, 0.0) + max(0.0, seconds)

    def share(self, kind: Hashable, now: float, ongoing: Sequence[tuple[Hashable, float]] = ()) -> float:
        """``kind``'s part of the time spent (0 when nothing was), with ``ongoing`` (kinds, and seconds
        of each being spent now, not yet added) counted too."""
        self._decay(now)
        spent = dict(self._spent)
        for other, seconds in ongoing:
            spent[other] = spent.get(other, 0.0) + max(0.0, seconds)
        total = sum(spent.values())
        return spent.get(kind, 0.0) / total if total > 0 else 0.0

    def _decay(self, now: float) -> None:
        if now > self._at:
            factor = 0.5 ** ((now - self._at) / self.half_life_s)
            self._spent = {k: v * factor for k, v in self._spent.items()}
            self._at = now


def estimated_cost(final: bool, audio_s: float) -> float:
    """Model seconds a decode is expected to take on 2 CPU cores with tiny.en (docs/benchmarks.md figures)."""
    return 0.30 + 0.03 * audio_s if final else 0.05 + 0.02 * audio_s


@dataclass(eq=False)
class Ticket(Generic[T]):
    owner: str
    item: T
    start: float
    finish: float
    seq: int
    cancelled: bool = field(default=False)


class FairQueue(Generic[T]):
    """Waiting tickets of many owners, served in start-tag order.

    Tickets taken or cancelled out of turn are dropped from the heap lazily,
    but never kept: once they outnumber the live ones the heap is rebuilt,
    so its size stays within twice the number of waiting tickets (a queue
    that kept every ticket it ever held grew by each job's audio forever).
    """

    def __init__(self) -> None:
        self._virtual = 0.0
        self._last_finish: dict[tuple[str, Hashable], float] = {}  # per flow: (owner, lane)
        self._heap: list[tuple[float, int, Ticket[T]]] = []
        self._seq = itertools.count()
        self._live = 0

    def __len__(self) -> int:
        return self._live

    @property
    def held(self) -> int:
        """Tickets in the heap, dead ones included (bounded by twice the live ones, plus a few)."""
        return len(self._heap)

    def push(self, owner: str, item: T, *, weight: float, cost: float, lane: Hashable = None) -> Ticket[T]:
        """Queue ``item`` on the flow of ``owner``'s ``lane`` (a session's channel), at ``weight``."""
        if weight <= 0 or cost < 0:
            raise ValueError("weight must be positive and cost non-negative")
        flow = (owner, lane)
        start = max(self._virtual, self._last_finish.get(flow, 0.0))
        ticket = Ticket(owner, item, start, start + cost / weight, next(self._seq))
        self._last_finish[flow] = ticket.finish
        heapq.heappush(self._heap, (ticket.start, ticket.seq, ticket))
        self._live += 1
        return ticket

    def requeue(self, owner: str, item: T) -> Ticket[T]:
        """Put an item that already had its turn back at the head, ahead of every waiting one.

        The owner's tags do not move: it was charged when the item first came.
        """
        ticket = Ticket(owner, item, -math.inf, -math.inf, next(self._seq))
        heapq.heappush(self._heap, (ticket.start, ticket.seq, ticket))
        self._live += 1
        return ticket

    def pop(self) -> Ticket[T] | None:
        """The next ticket to serve (smallest start tag, then arrival), or None."""
        while self._heap:
            _, _, ticket = heapq.heappop(self._heap)
            if ticket.cancelled:
                continue
            ticket.cancelled = True
            self._live -= 1
            self._virtual = max(self._virtual, ticket.start)
            return ticket
        return None

    def waiting(self) -> list[Ticket[T]]:
        """Waiting tickets, in no particular order."""
        return [t for _, _, t in self._heap if not t.cancelled]

    def in_order(self) -> list[Ticket[T]]:
        """Waiting tickets in the order :meth:`pop` would return them."""
        return [t for _, _, t in sorted(self._heap, key=lambda e: (e[0], e[1])) if not t.cancelled]

    def take(self, ticket: Ticket[T]) -> None:
        """Remove a waiting ticket out of turn (it joins a batch, or is skipped)."""
        if ticket.cancelled:
            raise ValueError("ticket is no longer waiting")
        self._virtual = max(self._virtual, ticket.start)
        self._drop(ticket)

    def cancel(self, ticket: Ticket[T]) -> None:
        if not ticket.cancelled:
            self._drop(ticket)

    def cancel_owner(self, owner: str) -> list[Ticket[T]]:
        """Cancel every waiting ticket of ``owner`` and forget its flow."""
        dropped = [t for t in self.waiting() if t.owner == owner]
        for ticket in dropped:
            self.cancel(ticket)
        self.forget(owner)
        return dropped

    def forget(self, owner: str) -> None:
        """``owner`` has gone: drop the finish tags of its flows (one per lane)."""
        for flow in [f for f in self._last_finish if f[0] == owner]:
            del self._last_finish[flow]

    def _drop(self, ticket: Ticket[T]) -> None:
        ticket.cancelled = True
        self._live -= 1
        if len(self._heap) > 2 * self._live + 8:
            self._heap = [e for e in self._heap if not e[2].cancelled]
            heapq.heapify(self._heap)


@dataclass(frozen=True)
class BatchLimits:
    max_batch: int = 8
    # Padded encoder frames per batch (3000 = one 30 s window): bounds working memory.
    max_frames: int = 8 * 3000
    # The same for batches of finals (0: max_frames). Packed finals count their
    # share of a shared window, so 3000 is one window's worth.
    final_frames: int = 0
    # Waiting finals from which the finals picked run as burst finals (greedy, short
    # window; see SchedulerCore). None: one more than there are workers; 0: never.
    burst_backlog: int | None = None
    # A context pass that has waited this long goes before interims (None: only when no
    # final or interim waits; see SchedulerCore).
    context_max_wait_s: float | None = CONTEXT_MAX_WAIT_S
    # ... as long as passes took less than this share of the recent model time of
    # interims and passes together (so that overloaded streams still get interims).
    context_share: float = CONTEXT_SHARE
    # Context passes per model call (0: max_batch). A pass decodes a whole window with beam 5,
    # which CTranslate2 does no cheaper per pass in a batch: on an H200, 0.13 s per pass alone
    # or in a batch of 9, 0.19 s in a batch of 16 and 0.33 s in one of 32 (docs/benchmarks.md).
    context_batch: int = 0
    # Workers that interims and context passes never take, so that finals always find them
    # (on CPU with a burst copy of the weights, one per core: a burst's finals then decode a
    # call per core while calls of background work, at a lower priority, run on beside them).
    final_workers: int = 1
    # Background calls (interims, context passes) the device runs side by side at full speed. The
    # busy share that decides spare time (QueueState.background_busy) counts each moment as
    # min(1, such calls running / this). 1: any call makes the moment busy, as on CPU, where the
    # calls share the cores. On a GPU, calls on separate workers overlap: there each one running
    # is a share of the workers background work may take (16 staggered streams on an H200 kept
    # some call running nearly all the time, and spare time off, with the GPU far from full).
    busy_side_by_side: int = 1
    # Model calls of context passes running at once (0: on as many workers as background work may
    # take). A pass holds its worker for seconds on a slow CPU; capped, the other background workers
    # are left to interims, so a new sentence's first text does not wait behind passes, and the passes
    # fall further behind instead (4 streams on 2 slow cores with 1: interim lag p50 1.3-2.2 -> 0.9-1.1 s,
    # WER after revisions 1-3 points worse; docs/benchmarks.md, fifty-second session).
    context_workers: int = 0

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_frames < 1 or self.final_frames < 0 or (self.burst_backlog or 0) < 0 or (self.context_max_wait_s or 0) < 0 or self.context_batch < 0 \
                or self.final_workers < 1 or self.busy_side_by_side < 1 or self.context_workers < 0:
            raise ValueError("batch limits must be positive")
        if not 0.0 <= self.context_share <= 1.0:
            raise ValueError("context_share is a fraction")

    def for_finals(self) -> "BatchLimits":
        return replace(self, max_frames=self.final_frames or self.max_frames, final_frames=0)

    def for_contexts(self) -> "BatchLimits":
        """Passes batch as finals do (full windows), at most ``context_batch`` to a call."""
        return replace(self.for_finals(), max_batch=min(self.max_batch, self.context_batch or self.max_batch))


def form_batch(
    queues: Sequence[tuple[FairQueue[T], BatchLimits]],
    inspect: Callable[[T], tuple[Hashable, int] | None],
) -> tuple[list[Ticket[T]], list[Ticket[T]]]:
    """The next batch and the tickets skipped on the way, both removed from their queue.

    Queues are tried in order (finals before interims), each with its own
    limits; the first that yields a head forms the batch. ``inspect`` returns
    a job's ``(batch key, padded frames)``, or None to skip it. The head always
    runs, even when it alone is over ``max_frames``.
    """
    for queue, limits in queues:
        batch: list[Ticket[T]] = []
        skipped: list[Ticket[T]] = []
        key: Hashable = None
        frames = 0
        for ticket in queue.in_order():
            if len(batch) >= limits.max_batch:
                break
            info = inspect(ticket.item)
            if info is None:
                queue.take(ticket)
                skipped.append(ticket)
                continue
            item_key, item_frames = info
            if batch and (item_key != key or frames + item_frames > limits.max_frames):
                continue
            key = item_key
            frames += item_frames
            queue.take(ticket)
            batch.append(ticket)
        if batch or skipped:
            return batch, skipped
    return [], []
