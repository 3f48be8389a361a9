"""Whether a new stream is taken: a pure decision, made before any audio.

A stream is refused (``overloaded``, WebSocket close 1013, with a retry
delay) when its channels would take the server past ``max_channels``, when
its memory reservation does not fit the budget, or when the load level
refuses its priority class. No await may come between this check and the
stream being counted, so that admission is atomic.

A stream whose client has closed it (``close``, a call's ``stop``) brings no
more audio: what it still owes its client (its last final, the close's
context passes) is bounded by ``context_close_s``. It leaves its place at
once, so that a call center at its limit takes the next call while the last
one finishes rather than refusing it for up to 10 s; a caller that never
retries (Twilio's media streams) would lose that call. Finishing streams
take no place up to as many channels again as the limit: past that they
count, so a client cannot pile up finishing streams for the server to decode.
A key's channel quota (:mod:`..access`) counts them the same way.
A stream held after its connection dropped keeps its place: its client may
come back and go on speaking.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OverloadError
from .budget import MemoryBudget
from .governor import LoadGovernor
from .policy import Priority

__all__ = ["Capacity", "counted_channels", "refusal"]


def counted_channels(active: int, finishing: int, limit: int) -> int:
    """Of ``active`` channels, those that count against ``limit``: the ``finishing`` ones (streams
    their clients closed) only past as many again as the limit."""
    return active - finishing + max(0, finishing - limit)


@dataclass(frozen=True)
class Capacity:
    """What is in use when a stream asks to come in."""

    active_channels: int  # every stream's channels, finishing ones included
    max_channels: int  # 0: no limit
    reserved_bytes: int
    budget: MemoryBudget | None
    finishing_channels: int = 0  # of streams whose client closed them, still finishing

    def counted_channels(self) -> int:
        """Channels that count against ``max_channels``: finishing ones only past as many again."""
        return counted_channels(self.active_channels, self.finishing_channels, self.max_channels)


def refusal(capacity: Capacity, channels: int, stream_bytes: int, priority: Priority, governor: LoadGovernor) -> OverloadError | None:
    """The error to refuse a stream with, or None to admit it."""
    limit = capacity.max_channels
    if limit and (busy := capacity.counted_channels()) + channels > limit:
        return OverloadError(
            f"the server is at capacity ({busy} of {limit} channels busy); retry later or elsewhere",
            retry_after=5.0,
        )
    budget = capacity.budget
    if budget is not None and not budget.fits(capacity.reserved_bytes, stream_bytes):
        return OverloadError(
            f"the server's memory budget is spoken for ({capacity.reserved_bytes >> 20} of {budget.for_streams >> 20} MiB); retry later or elsewhere",
            retry_after=5.0,
        )
    if not governor.admits(priority):
        return OverloadError(
            f"the server is overloaded (load level {int(governor.level)}) and not taking new {priority.value} streams; retry later",
            retry_after=10.0,
        )
    return None
