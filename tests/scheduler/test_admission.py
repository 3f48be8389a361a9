"""Admission: which channels count against ``max_channels`` when a stream asks to come in."""

from asr_server.scheduler.admission import Capacity, refusal
from asr_server.scheduler.governor import LoadGovernor
from asr_server.scheduler.policy import Priority


def admits(active: int, limit: int, channels: int = 1, finishing: int = 0) -> bool:
    capacity = Capacity(active, limit, reserved_bytes=0, budget=None, finishing_channels=finishing)
    return refusal(capacity, channels, 0, Priority.INTERACTIVE, LoadGovernor()) is None


def test_streams_still_bringing_audio_fill_the_limit():
    assert admits(active=9, limit=10)
    assert not admits(active=10, limit=10)
    assert not admits(active=9, limit=10, channels=2)  # a call's two channels
    assert admits(active=500, limit=0)  # 0: no limit


def test_a_stream_finishing_after_its_close_leaves_its_place_to_the_next_caller():
    assert admits(active=10, limit=10, finishing=1)
    assert admits(active=10, limit=10, channels=2, finishing=2)
    assert not admits(active=10, limit=10, channels=2, finishing=1)  # the nine others still speak


def test_finishing_streams_count_past_as_many_again_as_the_limit():
    # Ten speaking and ten finishing: the eleventh finishing one takes a place, so nothing fits.
    assert admits(active=19, limit=10, finishing=10)
    assert not admits(active=20, limit=10, finishing=10)
    assert not admits(active=21, limit=10, finishing=11)
    assert admits(active=11, limit=10, finishing=11)  # eleven finishing, none speaking: one counts


def test_the_refusal_says_how_many_channels_count():
    capacity = Capacity(12, 10, reserved_bytes=0, budget=None, finishing_channels=2)
    error = refusal(capacity, 1, 0, Priority.INTERACTIVE, LoadGovernor())
    assert error is not None and error.code == "overloaded" and "10 of 10 channels busy" in error.message
