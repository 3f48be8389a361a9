"""The resume bookkeeping without I/O: the replay log, resume requests and the token table."""

from __future__ import annotations

import pytest

from asr_server.errors import InvalidOption, ResumeFailed
from asr_server.resume import ReplayLog, ResumeTable, new_token, parse_resume_request


def filled(n: int, max_bytes: int = 1 << 20) -> ReplayLog:
    log = ReplayLog(max_bytes)
    for seq in range(1, n + 1):
        log.add(seq, f"m{seq:03d}")
    return log


def test_the_log_replays_exactly_what_came_after_the_last_seq_the_client_had():
    log = filled(5)
    assert log.after(0) == ["m001", "m002", "m003", "m004", "m005"]
    assert log.after(3) == ["m004", "m005"]
    assert log.after(5) == []


def test_a_client_claiming_messages_never_sent_is_refused():
    with pytest.raises(ResumeFailed, match="past the last message"):
        filled(5).after(6)


def test_the_log_is_bounded_and_refuses_a_resume_from_before_what_it_still_holds():
    log = filled(10, max_bytes=4 * 4)  # four messages of four bytes
    assert log.bytes <= 16
    assert log.after(6) == ["m007", "m008", "m009", "m010"]
    with pytest.raises(ResumeFailed, match="no longer held"):
        log.after(5)


def test_a_message_larger_than_the_bound_is_still_kept_until_the_next():
    log = ReplayLog(4)
    log.add(1, "x" * 10)
    assert log.after(0) == ["x" * 10]
    log.add(2, "y")
    assert log.after(1) == ["y"]


def test_resume_requests_take_a_token_and_last_seq_and_nothing_else():
    assert parse_resume_request({"resume": ["abc"], "last_seq": ["12"]}).last_seq == 12
    assert parse_resume_request({"resume": ["abc"]}).last_seq == 0
    for bad in ({"resume": ["abc"], "encoding": ["ogg"]}, {"resume": [""]}, {"resume": ["abc"], "last_seq": ["-1"]},
                {"resume": ["abc"], "last_seq": ["x"]}, {"resume": ["a", "b"]}):
        with pytest.raises(InvalidOption):
            parse_resume_request(bad)


def test_tokens_are_long_and_unique():
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100 and all(len(t) >= 32 for t in tokens)


def test_a_held_session_is_claimed_once_by_its_own_key_before_it_expires():
    table: ResumeTable[str] = ResumeTable()
    table.add("t", "session-1", "alice")
    table.hold("t", until=100.0)
    assert table.held == 1
    with pytest.raises(ResumeFailed, match="unknown or expired"):
        table.claim("t", "bob", now=50.0)  # another key's: reads as unknown
    assert table.claim("t", "alice", now=50.0) == "session-1"
    with pytest.raises(ResumeFailed, match="another connection"):
        table.claim("t", "alice", now=50.0)  # a second resume while the first is carried out
    table.attached("t")
    assert table.held == 0
    assert table.claim("t", "alice", now=500.0) == "session-1"  # attached: no expiry applies


def test_an_expired_or_forgotten_token_is_refused_and_a_failed_claim_can_be_retried():
    table: ResumeTable[str] = ResumeTable()
    table.add("t", "s", None)
    table.hold("t", until=10.0)
    with pytest.raises(ResumeFailed):
        table.claim("t", None, now=10.0)
    table.hold("t", until=20.0)
    table.claim("t", None, now=11.0)
    table.release("t")  # the attach failed: the session stays held, claimable again
    assert table.claim("t", None, now=12.0) == "s"
    table.forget("t")
    with pytest.raises(ResumeFailed):
        table.claim("t", None, now=12.0)
    assert len(table) == 0
