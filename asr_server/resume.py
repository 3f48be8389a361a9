"""Resumable sessions, without I/O: the replay log and the table of resume tokens.

A session's ``session`` message carries a ``resume_token``. When its
connection drops without ``close``, the transport keeps the session for
``Limits.resume_ttl_s`` seconds. A client that reconnects with
``?resume=TOKEN&last_seq=N`` gets every message sent after ``N`` again (from
the :class:`ReplayLog`, with their original ``seq``), then ``resumed``, and the
session goes on. :class:`ResumeTable` decides whether a token may be claimed;
every refusal is a :class:`~asr_server.errors.ResumeFailed`.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from .errors import InvalidOption, ResumeFailed
from .options import whole_number

__all__ = ["ReplayLog", "ResumeRequest", "ResumeTable", "new_token", "parse_resume_request", "RESUME_PARAMS"]

# The query parameters of a resume; no stream option may come with them (the session has its own).
RESUME_PARAMS = ("resume", "last_seq")

Owner = TypeVar("Owner")


class ReplayLog:
    """Every message sent on a session, newest last, at most ``max_bytes`` of them (oldest dropped)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: deque[tuple[int, str]] = deque()
        self._bytes = 0
        self.last_seq = 0  # the newest message's seq (0: none yet)

    @property
    def bytes(self) -> int:
        return self._bytes

    def add(self, seq: int, text: str) -> None:
        self._items.append((seq, text))
        self._bytes += len(text)
        self.last_seq = seq
        while self._bytes > self.max_bytes and len(self._items) > 1:
            _, dropped = self._items.popleft()
            self._bytes -= len(dropped)

    @property
    def oldest(self) -> int:
        """The seq of the oldest message still held (last_seq + 1 if none)."""
        return self._items[0][0] if self._items else self.last_seq + 1

    def after(self, seq: int) -> list[str]:
        """The messages after ``seq``, in order; ResumeFailed if the client claims more than was
        sent, or if some of them were already dropped from the log."""
        return [text for _, text in self.entries_after(seq)]

    def entries_after(self, seq: int) -> list[tuple[int, str]]:
        """:meth:`after`, each message with its seq."""
        if seq > self.last_seq:
            raise ResumeFailed(f"last_seq {seq} is past the last message sent ({self.last_seq})")
        if seq == self.last_seq:
            return []
        if seq + 1 < self.oldest:
            raise ResumeFailed(f"the messages after seq {seq} are no longer held (the replay log starts at {self.oldest})")
        return [(s, text) for s, text in self._items if s > seq]


@dataclass(frozen=True)
class ResumeRequest:
    token: str
    last_seq: int


def parse_resume_request(query: Mapping[str, list[str]]) -> ResumeRequest:
    """``?resume=TOKEN&last_seq=N`` (``last_seq`` defaults to 0: replay everything)."""
    extra = sorted(set(query) - set(RESUME_PARAMS))
    if extra:
        raise InvalidOption(f"a resume takes no stream option (got {extra[0]!r}): the session keeps its own")
    for name, values in query.items():
        if len(values) != 1:
            raise InvalidOption(f"option {name!r} given {len(values)} times")
    token = query["resume"][0]
    if not token:
        raise InvalidOption("resume needs the session's resume_token")
    raw = query.get("last_seq", ["0"])[0]
    last_seq = whole_number(raw)
    if last_seq is None:
        raise InvalidOption(f"last_seq must be a non-negative integer, got {raw[:20]!r}")
    return ResumeRequest(token, last_seq)


def new_token() -> str:
    """A resume token: 192 random bits, URL-safe."""
    return secrets.token_urlsafe(24)


@dataclass
class _Entry(Generic[Owner]):
    owner: Owner
    key: str | None
    held_until: float | None = None  # None: its connection is up
    claimed: bool = False  # a resume is being carried out


class ResumeTable(Generic[Owner]):
    """Resume tokens of live sessions: who owns each, which key it belongs to, whether it is held."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry[Owner]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held(self) -> int:
        """Sessions waiting for their client to come back."""
        return sum(1 for e in self._entries.values() if e.held_until is not None)

    def add(self, token: str, owner: Owner, key: str | None) -> None:
        """A new session's token (:func:`new_token`), good for resumes with the same key."""
        self._entries[token] = _Entry(owner, key)

    def hold(self, token: str, until: float) -> None:
        """The connection dropped: the session waits for its client until ``until``."""
        self._entries[token].held_until = until

    def claim(self, token: str, key: str | None, now: float) -> Owner:
        """A client presents ``token`` with ``key``: the session to attach it to. A session whose
        connection still looks up is taken over (its client came back before the server saw the
        drop); a token being resumed by another connection at this moment is refused."""
        entry = self._entries.get(token)
        # An unknown token, another key's and an expired one read the same: no oracle for tokens.
        if entry is None or entry.key != key or (entry.held_until is not None and now >= entry.held_until):
            raise ResumeFailed("unknown or expired resume token; start a new session")
        if entry.claimed:
            raise ResumeFailed("this session is being resumed by another connection")
        entry.claimed = True
        return entry.owner

    def attached(self, token: str) -> None:
        """The claim is done: the session has its connection again."""
        entry = self._entries.get(token)
        if entry is not None:
            entry.held_until, entry.claimed = None, False

    def release(self, token: str) -> None:
        """A claim that failed part-way: the session stays as it was."""
        entry = self._entries.get(token)
        if entry is not None:
            entry.claimed = False

    def forget(self, token: str) -> None:
        """The session ended: its token is no longer good."""
        self._entries.pop(token, None)
