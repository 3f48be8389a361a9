"""How many channels the server can take: derived from what a final costs, measured.

The case that decides it is a burst: every admitted channel reaches the end
of a sentence at once (callers answering the same prompt, a room going
quiet), and every one of them is owed a final. Finals in a burst run as
burst finals (greedy, short window; see :mod:`.core`), so with ``W`` workers
the last of ``N`` finals comes about ``(N * c + p) / W`` seconds after the
endpoint, where ``c`` is the model time of one burst final and ``p`` of a
context pass: one worker may have just started one when the burst comes (a
model call cannot be interrupted; finals always find the other workers
free). Admitting no more than ``(burst_s * W - p) / c`` channels keeps that
within ``burst_s``: the latency
target minus the endpoint wait, minus room for what else runs meanwhile
(interims, context passes, the decoding of the audio itself): 2.5 s - 0.5 s
- 0.5 s by default. Measured with 24 streams speaking in step on 2 cores, a
budget of 2 s admitted 18 and their finals' p95 was 2.77 s.

``c`` starts from a measurement at start-up (the runner decodes a burst
final with a fixed number of tokens on every worker at once, as a burst
runs them, and counts until the last is done) and follows the burst finals the
server actually decodes (an exponential average of each one's share of its
model call, from the calls on the burst copy or the shared copy of the
weights: on CPU without a burst copy the first call of a burst takes the
finals' own copy, has every core first and ends sooner than the rest), so a slower machine, a larger model or a busier host lowers
the limit and a GPU raises it. ``p`` likewise: a pass timed at start-up,
then the passes the server runs (each one's share of its model call: passes
batched together hold a worker longer, but a burst of finals is admitted on
what one stream's pass costs). On a fast machine ``p`` is a few finals'
worth; on one five times slower it was 2-3 of them, and without it 3
channels were admitted there whose finals in step came p95 3.9 s after
the end of speech (2 streams: 2.7 s).

A measure taken while something else runs on the host (a deploy, a test run)
comes out slow: seen on 2 cores, 0.71-0.75 s for a burst final that takes
0.22-0.32 s on a quiet host, and 4 channels admitted instead of 11-15. Burst
finals would correct it, but with few channels admitted bursts seldom come.
So while no burst final has been seen, the server times one again whenever
it is idle, every ``remeasure_s``, and the lower measure stands (contention
only slows a measure); each measure that does not lower the cost by a tenth
doubles the wait before the next (up to an hour), so a host busy for a
while is measured again after it, at little cost. A plain object: no clock
(times are passed in), no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["CapacityOptions", "CapacityModel"]


@dataclass(frozen=True)
class CapacityOptions:
    burst_s: float = 1.5  # every admitted channel's final decoded within this, all at once
    smoothing: float = 0.05  # weight of each new burst final in the average (about the last 20-40)
    ceiling: int = 1000  # never more than this, whatever the measurement says
    # Never fewer: one two-party call (agent and caller on two channels). Measured on a machine
    # five times slower than the usual 2 cores, two streams in step got their finals p95 2.7 s
    # after the end of speech, a little past the 2.5 s this budget aims at; a call's two parties
    # seldom stop at once, and a server that refuses every stereo call serves no call center.
    floor: int = 2
    # While no burst final was seen, time one again this often when the server is idle (0: never),
    # twice as long after each measure that did not lower the cost, up to remeasure_max_s.
    remeasure_s: float = 60.0
    remeasure_max_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.burst_s <= 0 or not 0 < self.smoothing <= 1 or not 1 <= self.floor <= self.ceiling:
            raise ValueError("burst_s must be positive, smoothing within (0, 1] and 1 <= floor <= ceiling")
        if not 0 <= self.remeasure_s <= self.remeasure_max_s:
            raise ValueError("need 0 <= remeasure_s <= remeasure_max_s")


class CapacityModel:
    def __init__(self, workers: int, final_s: float, options: CapacityOptions = CapacityOptions(), pass_s: float = 0.0) -> None:
        """``final_s``: model seconds of one burst final, as measured at start-up; ``pass_s``: of
        one context pass (0: not known yet)."""
        if final_s <= 0 or workers < 1 or pass_s < 0:
            raise ValueError("need a positive final cost, at least one worker and no negative pass cost")
        self.workers = workers
        self.options = options
        self.final_s = final_s
        self.pass_s = pass_s
        self.observed = 0
        self._measured_at: float | None = None  # when the last measure was taken (None: at start-up)
        self._interval = options.remeasure_s  # before the next measure

    def observe_final(self, seconds: float) -> None:
        """A burst final took ``seconds`` of model time (its share of its call)."""
        if seconds <= 0 or not math.isfinite(seconds):
            return
        self.observed += 1
        self.final_s += self.options.smoothing * (seconds - self.final_s)

    def observe_pass(self, seconds: float) -> None:
        """A context pass took ``seconds`` of model time (its share of its call)."""
        if seconds <= 0 or not math.isfinite(seconds):
            return
        self.pass_s = seconds if self.pass_s == 0 else self.pass_s + self.options.smoothing * (seconds - self.pass_s)

    def remeasure_due(self, now: float, idle: bool) -> bool:
        """Whether to time a burst final and a pass again at ``now``: the server is ``idle``, no burst
        final has been seen (the start-up measure is all there is), and ``remeasure_s`` has passed
        since the last measure, or twice that per measure since that did not lower the cost (the
        first call only starts the count)."""
        if self.options.remeasure_s <= 0 or self.observed:
            return False
        if self._measured_at is None:
            self._measured_at = now
        return idle and now - self._measured_at >= self._interval

    def remeasured(self, now: float, final_s: float, pass_s: float) -> None:
        """A measure taken at ``now`` on an idle server: the lower costs stand."""
        self._measured_at = now
        if not (final_s > 0 and math.isfinite(final_s)):
            return
        if final_s > 0.9 * self.final_s:
            self._interval = min(2 * self._interval, self.options.remeasure_max_s)
        self.final_s = min(self.final_s, final_s)
        if pass_s > 0 and math.isfinite(pass_s):
            self.pass_s = min(self.pass_s, pass_s) if self.pass_s else pass_s

    def channels(self) -> int:
        """The most channels to admit (at least ``floor``)."""
        fit = int((self.options.burst_s * self.workers - self.pass_s) / self.final_s)
        return max(self.options.floor, min(self.options.ceiling, fit))

    def to_wire(self) -> dict[str, float | int]:
        return {"channels": self.channels(), "final_s": round(self.final_s, 4), "pass_s": round(self.pass_s, 4),
                "workers": self.workers, "observed_finals": self.observed}
