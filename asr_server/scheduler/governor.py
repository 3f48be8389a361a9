"""Graceful degradation: the load level, raised and lowered one step at a time.

Fed the scheduler's queue state and memory use at a time passed in, the
:class:`LoadGovernor` keeps a :class:`Level`. Pressure means a final has
been waiting for its result (queued or being decoded) longer than
``high_wait_s``: finals are served first, so that means the model is
saturated, or its batches have grown long. Interims waiting in the queue
longer than ``interim_high_wait_s`` are pressure too, but only up to the
interim steps (1 and 2): finals still keep their latency then, and it is
the interims that lag, so no stream is refused for it. A context pass
waiting longer than ``context_high_wait_s`` (off unless set) is pressure up
to the first step only (fewer interims leave the passes more of the time).
Calm means the oldest final waits less than ``low_wait_s``, (below the
refusal steps) the oldest interim less than ``interim_low_wait_s`` and (at
the first step) the oldest pass less than ``context_low_wait_s``. Sustained
pressure raises the level by one step every ``raise_after_s``; sustained
calm lowers it one step every ``lower_after_s`` (slower down than up, so it
does not flap). The steps, in order:

1. ``FEWER_INTERIMS`` - interims every ``interim_factor`` times more audio,
   and on the runner's short encoder window (cheaper, less accurate); context
   passes lean (only the utterances they decide) and quick finals busy
   (greedy on the burst window) once a final was late through a raise
   period or a pass waited ``lean_context_wait_s``, until the level is back at 0
   (and at any level while more than ``lean_channels`` channels are open,
   where an operator sets it);
2. ``INTERIM_MODEL`` - interims on the smaller ``--interim-model`` (without
   one: interims slowed by the factor once more);
3. ``REFUSE_BATCH`` - new ``batch`` streams are refused;
4. ``REFUSE_STANDARD`` - new ``standard`` streams too;
5. ``REFUSE_ALL`` - every new stream is refused with ``retry_after``;
   admitted streams keep being served.

Independently, memory above ``critical_fraction`` of the budget is
``memory_critical``: the server then closes its longest-running ``batch``
stream (finals flushed first); once that one has ended, the next, until it
is not.

A plain object: no clock, no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .policy import Priority

__all__ = ["Level", "GovernorOptions", "LoadGovernor", "LoadSettings"]


class Level(enum.IntEnum):
    NORMAL = 0
    FEWER_INTERIMS = 1
    INTERIM_MODEL = 2
    REFUSE_BATCH = 3
    REFUSE_STANDARD = 4
    REFUSE_ALL = 5


_REFUSED_FROM: dict[Priority, Level] = {
    Priority.BATCH: Level.REFUSE_BATCH,
    Priority.STANDARD: Level.REFUSE_STANDARD,
    Priority.INTERACTIVE: Level.REFUSE_ALL,
}


@dataclass(frozen=True)
class LoadSettings:
    """What the load level does to interims and context passes."""

    level: int = 0
    scale: int = 1  # times the requested interim_ms
    model: bool = False  # on the smaller --interim-model
    short_window: bool = False  # on the short encoder window
    lean_context: bool = False  # context passes decode only the utterances they decide, quick finals are busy (see LoadGovernor.lean_context)
    settle: bool = False  # settle decodes may run: the server has time to spare (see GovernorOptions.spare_busy_low)
    late_context: bool = False  # context passes wait their turn behind others' (see GovernorOptions.late_context_s)


@dataclass(frozen=True)
class GovernorOptions:
    high_wait_s: float = 0.8
    low_wait_s: float = 0.4
    interim_high_wait_s: float = 1.0
    interim_low_wait_s: float = 0.3
    # A context pass waiting in the queue longer than this raises the level to FEWER_INTERIMS (no
    # further), and the level leaves it only once none has waited context_low_wait_s. At level 0
    # interims come twice as often and on the full window, and an overdue pass goes before them
    # only while passes took under half the background time (BatchLimits.context_share), which
    # at 8 streams on 2 cores they never do: the time that lean passes or a calm moment freed went
    # back to interims at level 0 and the passes fell behind again (the level was 1+ for 40-60%
    # of the runs). With 4 s, 8 staggered streams' revisions came a little sooner where the level
    # had fallen (revision delay p95, median of 4-6 runs: the fixtures 16.7 s against 16.9, held-out
    # set 4 13.6 against 15.3), as before where it had not (set 3), but WER after revisions was
    # 0.4-0.8 points worse on average on all three (the fixtures 0.110 against 0.103; docs/
    # benchmarks.md, fifty-ninth session), so it is an operator's choice. 0 (default): passes
    # waiting never raise the level.
    context_high_wait_s: float = 0.0
    context_low_wait_s: float = 1.0
    raise_after_s: float = 1.0
    lower_after_s: float = 4.0
    interim_factor: int = 2
    critical_fraction: float = 0.95
    # The highest level pressure may raise it to (REFUSE_ALL: every step). A
    # deployment that would rather lag than refuse, or a test server on a busy
    # machine, stops at INTERIM_MODEL.
    max_level: Level = Level.REFUSE_ALL
    # Settle decodes (ContextOptions.settle_window_s) take time the server has to spare: at level
    # 0, from when some worker ran interims or passes less than spare_busy_low of the recent time
    # (QueueState.background_busy; on a GPU each call counts as a share, BatchLimits.busy_side_by_side)
    # until it is more than spare_busy_high or the level rises (then not before it is under
    # spare_busy_low again). On 2 cores that left
    # them on through runs of one and two real-time streams and off at eight, where they had made
    # revisions later (p95 12.0 -> 18.2 s) for no better transcript; at one stream they brought
    # it to offline's (docs/benchmarks.md, thirty-sixth session).
    spare_busy_low: float = 0.6
    spare_busy_high: float = 0.75
    # While some context pass has waited this long in the queue (passes queued behind each other),
    # passes hold less of the decided audio (ContextOptions.late_back_s) and catch up: revisions
    # sooner at 8 streams on 2 cores, a worse transcript there (see late_back_s). 0 (default): never.
    late_context_s: float = 0.0
    # A context pass waiting this long in the queue, from the first level, makes passes lean (and
    # quick finals busy) as a late final does, until the level is back at 0. 16 staggered streams
    # on 2 cores keep their finals in time while passes fall further and further behind (one
    # waited 22 s), so whether passes went lean hung on a final happening to be late at the start:
    # revisions p95 13-16.5 s when one was, 33-36 s when not (6 of 10 runs). With 10 s, 18.6-29.5
    # s over eight runs (median 21.3), finals p95 and WER after revisions better too; at 8 streams
    # about as before (passes there wait up to 8 s on held-out recordings, 17 s on the fixtures).
    # With 5 s, 8 streams' revisions came later (passes turned lean, then the level fell and
    # interims took the time back; docs/benchmarks.md, fifty-eighth session). 0: only late finals
    # make passes lean.
    lean_context_wait_s: float = 10.0
    # Passes lean (and quick finals busy) at any level while more than this many channels are
    # open: revisions sooner and less model time, for a transcript after revisions 1-4 points
    # worse on most audio (as good only on the clean fixtures; a human voice 0.024 against 0.014,
    # the fixtures under noise 0.147 against 0.135). 8 staggered streams on 2 cores with every
    # pass lean: on the fixtures revisions p95 8.0-8.2 s against 14.9-17.7 s and WER after
    # revisions 0.108-0.111 against 0.113-0.116; on held-out set 3 under noise 20 dB down 6.2 s
    # against 10.6-11.0 s, but 0.313-0.319 against 0.275-0.276 (docs/benchmarks.md, eighty-ninth
    # session). 0 (default): never by count.
    lean_channels: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.low_wait_s < self.high_wait_s or not 0 <= self.interim_low_wait_s < self.interim_high_wait_s:
            raise ValueError("need 0 <= low_wait_s < high_wait_s, and the same for interims")
        if self.context_high_wait_s < 0 or (self.context_high_wait_s and not 0 <= self.context_low_wait_s < self.context_high_wait_s):
            raise ValueError("need context_high_wait_s 0 (off) or 0 <= context_low_wait_s < context_high_wait_s")
        if self.raise_after_s <= 0 or self.lower_after_s <= 0 or self.interim_factor < 1:
            raise ValueError("governor periods and factor must be positive")
        if not 0 <= self.spare_busy_low <= self.spare_busy_high:
            raise ValueError("need 0 <= spare_busy_low <= spare_busy_high")
        if self.late_context_s < 0 or self.lean_context_wait_s < 0 or self.lean_channels < 0:
            raise ValueError("late_context_s, lean_context_wait_s and lean_channels must be 0 or more")


class LoadGovernor:
    def __init__(self, options: GovernorOptions = GovernorOptions()) -> None:
        self.options = options
        self.level = Level.NORMAL
        self.memory_critical = False
        self._since: float | None = None  # when the current pressure (or calm) began
        self._pressured: bool | None = None
        self._changed_at = 0.0
        self._lean = False  # a final was late through a raise period, or a pass waited lean_context_wait_s, since the level left NORMAL
        self._spare = True  # the background workers have time to spare (see GovernorOptions.spare_busy_low)
        self._late = False  # a context pass has waited late_context_s
        self._channels = 0  # channels open, as last observed

    def observe(self, now: float, oldest_final_wait: float, memory_used: int = 0, memory_budget: int = 0, oldest_interim_wait: float = 0.0,
                background_busy: float = 0.0, oldest_context_wait: float = 0.0, channels: int = 0) -> Level:
        """Update from the queue, memory and the number of ``channels`` open; returns the (possibly new) level."""
        o = self.options
        self._channels = channels
        self.memory_critical = memory_budget > 0 and memory_used > o.critical_fraction * memory_budget
        self._observe_busy(background_busy)
        self._late = 0 < o.late_context_s <= oldest_context_wait
        self._lean = self._lean or (self.level > Level.NORMAL and 0 < o.lean_context_wait_s <= oldest_context_wait)
        # Lagging interims raise the level through the interim steps only, and hold it there.
        interims_lag = oldest_interim_wait > o.interim_high_wait_s and self.level < Level.INTERIM_MODEL
        interims_calm = oldest_interim_wait < o.interim_low_wait_s or self.level > Level.INTERIM_MODEL
        # Lagging passes raise it to the first step only, and hold it there.
        passes_lag = 0 < o.context_high_wait_s < oldest_context_wait and self.level < Level.FEWER_INTERIMS
        passes_calm = not o.context_high_wait_s or oldest_context_wait < o.context_low_wait_s or self.level > Level.FEWER_INTERIMS
        if oldest_final_wait > o.high_wait_s or interims_lag or passes_lag:
            state: bool | None = True
        elif oldest_final_wait < o.low_wait_s and interims_calm and passes_calm:
            state = False
        else:
            state = None  # in between: hold the level
        if state != self._pressured:
            self._pressured, self._since = state, now
        if state is None or self._since is None:
            return self.level
        held = now - max(self._since, self._changed_at)
        if state and held >= o.raise_after_s:
            if self.level < o.max_level:
                self._step(now, +1)
            # Late finals through a raise period make passes lean, at the highest level allowed too.
            self._lean = self._lean or (self.level > Level.NORMAL and oldest_final_wait > o.high_wait_s)
        elif not state and self.level > Level.NORMAL and held >= o.lower_after_s:
            self._step(now, -1)
        return self.level

    def _observe_busy(self, background_busy: float) -> None:
        """Spare time goes above ``spare_busy_high`` and under load, and comes back below ``spare_busy_low``
        (a level back at 0 with the workers still busy in between leaves it off)."""
        o = self.options
        if background_busy > o.spare_busy_high or self.level is not Level.NORMAL:
            self._spare = False
        elif background_busy < o.spare_busy_low:
            self._spare = True

    def reset(self) -> None:
        """Back to level 0 with no pressure or calm on record."""
        self.level = Level.NORMAL
        self.memory_critical = False
        self._since = None
        self._pressured = None
        self._changed_at = 0.0
        self._lean = False
        self._spare = True
        self._late = False
        self._channels = 0

    def _step(self, now: float, delta: int) -> None:
        self.level = Level(self.level + delta)
        self._changed_at = now
        if self.level is Level.NORMAL:
            self._lean = False

    def admits(self, priority: Priority) -> bool:
        """Whether a new stream of this class is taken at the current level."""
        return self.level < _REFUSED_FROM[priority]

    def interim_scale(self, has_interim_model: bool) -> int:
        """How many times the configured ``interim_ms`` an interim waits for."""
        f = self.options.interim_factor
        if self.level >= Level.INTERIM_MODEL and not has_interim_model:
            return f * f
        return f if self.level >= Level.FEWER_INTERIMS else 1

    def use_interim_model(self) -> bool:
        return self.level >= Level.INTERIM_MODEL

    def short_interim_window(self) -> bool:
        return self.level >= Level.FEWER_INTERIMS

    def lean_context(self) -> bool:
        """Whether context passes leave out the decided audio before the new utterances (and quick
        finals are busy ones, :attr:`~asr_server.decoding.context.ContextOptions.busy_finals`): from the
        first level, once a final was late through a raise period or a pass waited
        ``lean_context_wait_s`` in the queue. Interims lagging alone (one stream on a slow machine,
        its interims waiting behind the pass itself) make interims cheaper but leave passes whole:
        a lean pass decides its utterances without the context it is there for.

        And at any level while more than ``lean_channels`` channels are open (an operator's choice:
        see :attr:`GovernorOptions.lean_channels`)."""
        by_count = 0 < self.options.lean_channels < self._channels
        return (self.level >= Level.FEWER_INTERIMS and self._lean) or by_count

    def spare_time(self) -> bool:
        """Whether settle decodes may run: level 0, and the background workers have time to spare."""
        return self.level is Level.NORMAL and self._spare

    def late_context(self) -> bool:
        """Whether context passes are late: one has waited ``late_context_s`` in the queue (never when that is 0)."""
        return self._late

    def load_settings(self, has_interim_model: bool) -> LoadSettings:
        """The interim and context-pass settings of the current level."""
        return LoadSettings(int(self.level), self.interim_scale(has_interim_model),
                            self.use_interim_model() and has_interim_model, self.short_interim_window(), self.lean_context(), self.spare_time(), self.late_context())
