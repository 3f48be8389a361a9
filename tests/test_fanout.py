"""A follower's queue: bounded, and a follower that falls behind is cut off without holding anyone."""

from __future__ import annotations

import asyncio

from asr_server.transport.fanout import FOLLOWER_QUEUE, EndedSessions, Follower, parse_follow_path
from asr_server.resume import ReplayLog
from asr_server.transcript import TranscriptLog


def test_a_follower_that_falls_behind_is_cut_off_and_never_blocks_the_stream():
    async def main() -> tuple[list[str | None], bool]:
        follower = Follower()
        for i in range(FOLLOWER_QUEUE + 10):  # the stream pushes on, never waiting
            follower.push(f"m{i}")
        got = []
        while (item := await follower.queue.get()) is not None:
            got.append(item)
        return got, follower.too_slow

    got, too_slow = asyncio.run(main())
    assert too_slow and len(got) < FOLLOWER_QUEUE  # cut off: its reader ends (then follower_too_slow) instead of growing


def test_a_follower_gets_everything_then_the_end():
    async def main() -> list[str | None]:
        follower = Follower()
        for i in range(3):
            follower.push(f"m{i}")
        follower.end()
        return [await follower.queue.get() for _ in range(4)]

    assert asyncio.run(main()) == ["m0", "m1", "m2", None]


def test_ended_sessions_are_kept_for_their_time_and_bounded():
    ended = EndedSessions(ttl_s=10.0, limit=2)
    for i, now in enumerate((0.0, 1.0, 2.0)):
        ended.keep(f"s{i}", ReplayLog(100), TranscriptLog(100), None, {}, now)
    assert ended.get("s0", 2.0) is None  # the oldest went when a third came
    assert ended.get("s1", 5.0) is not None and ended.get("s1", 11.5) is None  # and each one after its time
    assert EndedSessions(ttl_s=0).get("x", 0.0) is None
    small = EndedSessions(ttl_s=10.0, max_bytes=14)
    for i in range(3):
        log, kept = ReplayLog(100), TranscriptLog(100)
        log.add(1, "x" * 6)
        kept.add({"type": "session"}, "y" * 3)
        small.keep(f"s{i}", log, kept, None, {}, 0.0)
    # bounded in bytes too, the transcript's messages counted with the replay log's
    assert small.get("s1", 0.0) is None and small.get("s2", 0.0) is not None and small.bytes == 9


def test_only_a_sessions_events_path_names_it():
    assert parse_follow_path("/v1/sessions/abc/events") == "abc"
    assert parse_follow_path("/v1/sessions/abc/transcript", "transcript") == "abc"
    assert parse_follow_path("/v1/sessions//events") is None and parse_follow_path("/v1/sessions/abc") is None
