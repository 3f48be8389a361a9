"""How many TCP connections the server holds at once, in all and still opening from one address.

Every connection costs a file descriptor from the moment it is accepted.
Without a bound, a client that opened a few thousand connections and sent
nothing used up the process's descriptors: the server could accept nobody
else (nor open a webhook's or a WebRTC peer's socket), and asyncio logged a
traceback for every failed accept, hundreds a second, for as long as the
client held them. :class:`ConnectionGate` counts connections and says which
new ones to refuse: past ``max_connections`` in all, or past
``max_opening_per_address`` from one address that have not yet sent their
request (a client that opens connections and says nothing; a proxy sends its
requests at once, so its connections are not held here). The HTTP shell
answers a refused one 503 ``overloaded`` and closes it once its request head
is in, within ``LINGER_S``. No I/O; the time is passed in, for the rate of
the refusals' log lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GateOptions", "ConnectionGate", "Ticket", "Refusal", "RESERVED_DESCRIPTORS", "MAX_AUTO_CONNECTIONS", "MAX_LINGERING", "LOG_EVERY_S", "LINGER_S", "connections_for"]

# Descriptors kept out of the connections' share: the model's files, webhooks' connections,
# WebRTC peers' UDP sockets and the logs.
RESERVED_DESCRIPTORS = 256
MAX_AUTO_CONNECTIONS = 16384  # about 10 KB of memory each while idle
LOG_EVERY_S = 10.0  # at most one log line about refusals this often
MAX_LINGERING = 64  # refused connections held at once to read their request (more are closed at once)
LINGER_S = 1.0  # a refused connection's request is waited for this long at most


def connections_for(open_files: int) -> int:
    """``--max-connections auto``: the open-files limit less the descriptors kept for the rest, within bounds."""
    return max(64, min(MAX_AUTO_CONNECTIONS, open_files - RESERVED_DESCRIPTORS))


@dataclass(frozen=True)
class GateOptions:
    """0 in either: no such limit."""

    max_connections: int = 4096  # TCP connections at once (WebSockets, followers, page and health requests)
    max_opening_per_address: int = 64  # connections from one address that have not finished their request

    def __post_init__(self) -> None:
        if self.max_connections < 0 or self.max_opening_per_address < 0:
            raise ValueError("connection limits must be 0 (none) or more")


@dataclass(eq=False)
class Refusal:
    """A connection the gate turned away. ``log``: the first refusal for a while (log it, with
    ``unlogged``, the refusals since the last line, this one included). ``linger``: answer it and
    read its request before closing (closing on a request not yet read resets the connection, and
    the client may never see the answer), for at most ``LINGER_S``; :meth:`close` when it ends."""

    gate: "ConnectionGate"
    reason: str  # "connections" (the server's limit) or "address" (too many still opening from its address)
    message: str
    log: bool
    unlogged: int
    linger: bool

    def close(self) -> None:
        if self.linger:
            self.linger = False
            self.gate.lingering -= 1


@dataclass(eq=False)
class Ticket:
    """One admitted connection; :meth:`opened` once its request has been read, :meth:`close` when it ends (both idempotent)."""

    gate: "ConnectionGate"
    address: str
    opening: bool = True
    closed: bool = False

    def opened(self) -> None:
        if self.opening and not self.closed:
            self.opening = False
            self.gate._done_opening(self.address)

    def close(self) -> None:
        if self.closed:
            return
        self.opened()
        self.closed = True
        self.gate.open -= 1


@dataclass
class ConnectionGate:
    options: GateOptions = GateOptions()
    open: int = 0  # connections admitted and not yet closed
    opening: dict[str, int] = field(default_factory=dict)  # by address: admitted, request not yet read
    lingering: int = 0  # refused connections whose request is still being read
    _unlogged: int = 0
    _logged_at: float | None = None

    def enter(self, address: str, now: float) -> Ticket | Refusal:
        """A connection just accepted from ``address``: its ticket, or why it is refused."""
        limits = self.options
        if limits.max_connections and self.open >= limits.max_connections:
            return self._refuse("connections", f"the server has {self.open} connections open, its limit (--max-connections)", now)
        if limits.max_opening_per_address and self.opening.get(address, 0) >= limits.max_opening_per_address:
            return self._refuse(
                "address", f"{limits.max_opening_per_address} connections from this address have not sent their request yet "
                "(--max-opening-per-address)", now)
        self.open += 1
        self.opening[address] = self.opening.get(address, 0) + 1
        return Ticket(self, address)

    def _done_opening(self, address: str) -> None:
        left = self.opening[address] - 1
        if left:
            self.opening[address] = left
        else:
            del self.opening[address]

    def _refuse(self, reason: str, message: str, now: float) -> Refusal:
        self._unlogged += 1
        due = self._logged_at is None or now - self._logged_at >= LOG_EVERY_S
        linger = self.lingering < MAX_LINGERING
        self.lingering += linger
        refusal = Refusal(self, reason, message, due, self._unlogged, linger)
        if due:
            self._logged_at, self._unlogged = now, 0
        return refusal
