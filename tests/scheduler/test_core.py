"""The scheduler's pure core, driven by hand-written times and a fake model (no threads, no sleeps)."""

from dataclasses import replace

import numpy as np
import pytest

from asr_server.events import DecodeJob
from asr_server.inference.types import DecodeKind, DecodeRequest, Hypothesis
from asr_server.scheduler.core import FINAL_ATTEMPTS, JobStatus, SchedulerCore
from asr_server.scheduler.policy import BatchLimits

from ..fakes import FakeRunner


def interim(tag: str, samples: int = 1600) -> DecodeJob:
    return DecodeJob(0, 0, DecodeRequest(np.zeros(samples, np.float32), DecodeKind.INTERIM, prompt=tag), False, samples)


def final(tag: str, speculative: bool = False) -> DecodeJob:
    return DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.FINAL, prompt=tag), speculative, 1600)


class ThirdOfAWindow(FakeRunner):
    """A final takes a third of a window, an interim a sixth (packable finals share windows)."""

    def window_frames(self, request):
        return 1000 if request.kind is DecodeKind.FINAL and request.pack else 500 if request.kind is DecodeKind.INTERIM else 3000


def ran(core: SchedulerCore, now: float, worker: int = 0) -> list[str]:
    """Schedule for ``worker`` and answer its batch with each prompt as text; the prompts that ran."""
    decision = core.schedule(now, worker)
    if decision.batch is None:
        return []
    out = core.update_from_output(decision.batch.id, [Hypothesis(r.prompt) for r in decision.batch.requests], now)
    assert [e.job.request.prompt for e, _ in out.done] == [r.prompt for r in decision.batch.requests]
    return [r.prompt for r in decision.batch.requests]


def test_finals_run_before_interims_and_sessions_take_turns():
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1))
    for i in range(2):
        core.add("a", interim(f"a{i}"), 0.0)
        core.add("b", interim(f"b{i}"), 0.0)
    core.add("c", final("f"), 0.5)
    order = [p for t in range(5) for p in ran(core, 1.0 + t)]
    assert order == ["f", "a0", "b0", "a1", "b1"]
    assert core.live == 0 and core.depth == 0


def call_and_solo_order(make) -> list[str]:
    """Two jobs each of a call's two channels and of a one-channel session, made by ``make``,
    queued at once: the order they run in, one to a call."""
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1))
    for i in range(2):
        core.add("call", make(f"left {i}"), 0.0)
        core.add("call", replace(make(f"right {i}"), channel=1), 0.0)
        core.add("solo", make(f"solo {i}"), 0.0)
    return [p for t in range(6) for p in ran(core, 1.0 + t)]


def test_each_channel_of_a_session_takes_its_own_turn_for_context_passes():
    """A call's two channels each get a stream's share of passes: with one flow per session, its
    second channel's passes waited behind every other session's (revisions twice as late)."""
    order = call_and_solo_order(context)
    assert order[:3] == ["left 0", "right 0", "solo 0"] and order[3:] == ["left 1", "right 1", "solo 1"]


def test_interims_of_a_session_share_one_flow_whatever_their_channel():
    order = call_and_solo_order(interim)
    assert order == ["left 0", "solo 0", "right 0", "solo 1", "left 1", "right 1"]


def test_a_running_final_counts_as_waiting_until_answered():
    core = SchedulerCore(FakeRunner())
    core.add("a", final("x"), 10.0)
    decision = core.schedule(10.5, 0)
    assert decision.batch is not None
    state = core.state(12.0)
    assert state.finals == 0 and state.oldest_final_wait == pytest.approx(2.0)
    core.update_from_output(decision.batch.id, [Hypothesis("x")], 12.0)
    assert core.state(13.0).oldest_final_wait == 0.0


def test_a_final_whose_call_raises_is_retried_alone_once_then_given_up():
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=4))
    core.add("a", final("bad"), 0.0)
    core.add("b", final("good"), 0.0)
    first = core.schedule(0.0, 0).batch
    assert first is not None and len(first.entries) == 2
    outcome = core.update_from_error(first.id, 1.0)
    assert not outcome.failed and {e.job.request.prompt for e in outcome.requeued} == {"bad", "good"}
    # Each retry runs in a call of its own, in the order they failed.
    bad = core.schedule(1.0, 0).batch
    assert len(bad.entries) == 1
    assert bad.entries[0].job.request.prompt == "bad" and bad.entries[0].request.pack is False
    given_up = core.update_from_error(bad.id, 2.0)
    assert [e.job.request.prompt for e in given_up.failed] == ["bad"] and not given_up.requeued
    assert bad.entries[0].failures == FINAL_ATTEMPTS
    assert ran(core, 3.0) == ["good"]
    assert core.live == 0


def test_an_interim_failing_alone_is_dropped_at_once():
    core = SchedulerCore(FakeRunner())
    core.add("a", interim("x"), 0.0)
    batch = core.schedule(0.0, 0).batch
    outcome = core.update_from_error(batch.id, 0.5)
    assert [e.job.request.prompt for e in outcome.failed] == ["x"] and not outcome.requeued
    assert core.live == 0


def test_a_runner_answering_the_wrong_number_of_results_fails_the_batch_instead_of_leaving_jobs_waiting():
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=4))
    core.add("a", final("x"), 0.0)
    core.add("b", final("y"), 0.0)
    batch = core.schedule(0.0, 0).batch
    outcome = core.update_from_output(batch.id, [Hypothesis("only one")], 0.5)
    assert not outcome.done and len(outcome.requeued) == 2  # retried, never silently pending


def test_a_job_whose_refresh_raises_fails_alone_and_the_rest_runs():
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=4))

    def broken(job):
        raise KeyError("decoder state gone")

    core.add("a", interim("broken"), 0.0, refresh=broken)
    core.add("b", interim("fine"), 0.0)
    decision = core.schedule(0.0, 0)
    assert [e.job.request.prompt for e in decision.failed] == ["broken"]
    assert [r.prompt for r in decision.batch.requests] == ["fine"]


def test_refresh_replaces_or_skips_and_withdraw_answers_a_waiting_job():
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=4))
    newer = interim("newer")
    core.add("a", interim("older"), 0.0, refresh=lambda j: newer)
    core.add("b", interim("stale"), 0.0, refresh=lambda j: None)
    gone = interim("withdrawn")
    core.add("c", gone, 0.0)
    assert core.withdraw(gone).job is gone
    decision = core.schedule(0.0, 0)
    assert [e.job.request.prompt for e in decision.skipped] == ["stale"]
    assert decision.batch.entries[0].job is newer and len(decision.batch.entries) == 1
    assert core.withdraw(newer) is None  # running: it finishes


def test_a_cancelled_running_job_is_not_answered():
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=4))
    a = core.add("a", final("a"), 0.0)
    core.add("b", final("b"), 0.0)
    batch = core.schedule(0.0, 0).batch
    core.cancel_owner("a")
    outcome = core.update_from_output(batch.id, [Hypothesis("a"), Hypothesis("b")], 0.5)
    assert [e.job.request.prompt for e, _ in outcome.done] == ["b"] and a.status is JobStatus.CANCELLED


def test_a_pack_miss_goes_back_to_the_head_and_is_decoded_alone_next():
    core = SchedulerCore(ThirdOfAWindow(), BatchLimits(max_batch=3, final_frames=3000))
    for tag in ("heard", "missed", "also heard", "later"):
        core.add(tag, final(tag), 0.0)
    batch = core.schedule(0.0, 0).batch
    assert [r.prompt for r in batch.requests] == ["heard", "missed", "also heard"]
    outcome = core.update_from_output(batch.id, [Hypothesis("heard"), None, Hypothesis("also heard")], 1.0)
    assert [e.job.request.prompt for e in outcome.requeued] == ["missed"]
    nxt = core.schedule(1.0, 0).batch
    assert [r.prompt for r in nxt.requests] == ["missed"] and nxt.requests[0].pack is False


def test_with_two_workers_one_is_kept_for_finals():
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1), workers=2)
    for i in range(3):
        core.add(f"i{i}", interim(f"i{i}"), 0.0)
    assert core.schedule(0.0, 0).batch is not None  # worker 0 takes an interim
    assert core.schedule(0.0, 1).batch is None  # worker 1 stays free for finals
    core.add("late", final("f"), 0.1)
    assert [r.prompt for r in core.schedule(0.1, 1).batch.requests] == ["f"]


def test_workers_kept_for_finals_take_a_burst_while_interims_run_on():
    """With a burst copy on 2 cores, two of four workers are kept for finals: two calls of
    interims (slow, at a lower priority) may run, and a burst's finals still decode two calls at once."""
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1, final_workers=2), workers=4)
    for i in range(4):
        core.add(f"i{i}", interim(f"i{i}"), 0.0)
    assert [core.schedule(0.0, w).batch is not None for w in range(4)] == [True, True, False, False]
    for i in range(6):
        core.add(f"f{i}", final(f"f{i}"), 0.1)
    picked = [core.schedule(0.1, w).batch for w in (2, 3)]
    assert [r.prompt for b in picked for r in b.requests] == ["f0", "f1"]
    assert all(b.entries[0].burst for b in picked)  # more waiting than workers: burst finals
    with pytest.raises(ValueError):
        BatchLimits(final_workers=0)


def test_a_context_pass_leaves_interims_a_worker_when_one_more_is_kept_for_finals():
    """On two cores the default is three workers: a pass (seconds on a slow core) on one, interims on
    another, the third for finals. With two, a new sentence's interims waited for the whole pass."""
    for workers, interims_meanwhile in ((2, []), (3, ["i"])):
        core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1), workers=workers)
        core.add("a", context("pass"), 0.0)
        assert [r.prompt for r in core.schedule(0.0, 0).batch.requests] == ["pass"]  # still running
        core.add("b", interim("i"), 0.5)
        core.add("c", interim("j"), 0.5)
        assert [r.prompt for w in range(1, workers) if (b := core.schedule(0.5, w).batch) for r in b.requests] == interims_meanwhile
        core.add("d", final("f"), 0.6)
        assert [r.prompt for r in core.schedule(0.6, workers - 1).batch.requests] == ["f"]


def prompts(core: SchedulerCore, now: float, worker: int) -> list[str]:
    """What ``worker`` is given to run at ``now`` (left running)."""
    batch = core.schedule(now, worker).batch
    return [] if batch is None else [r.prompt for r in batch.requests]


def test_passes_hold_no_more_workers_at_once_than_their_cap_even_when_overdue():
    """Three workers, one kept for finals. Unlimited, two passes take both background workers and a new
    sentence's first interim waits behind them; with ``context_workers`` 1 the second pass waits
    (overdue or not) and the interim finds a worker, and the pass runs once the first is done."""
    for cap in (0, 1):
        core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1, context_max_wait_s=1.0, context_workers=cap), workers=3)
        core.add("a", context("pass a"), 0.0)
        core.add("b", context("pass b"), 0.0)
        first = core.schedule(0.0, 0).batch
        assert [r.prompt for r in first.requests] == ["pass a"]
        second = prompts(core, 0.1, 1)
        core.add("i", interim("i"), 2.0)  # pass b, if still waiting, is overdue by now
        assert (second, prompts(core, 2.0, 2)) == ((["pass b"], []) if cap == 0 else ([], ["i"]))
        core.update_from_output(first.id, [Hypothesis("pass a")], 3.0)
        assert prompts(core, 3.0, 0) == (["i"] if cap == 0 else ["pass b"])  # unlimited: the interim only now
    with pytest.raises(ValueError):
        BatchLimits(context_workers=-1)


def _hold_setup(hold: float) -> SchedulerCore:
    core = SchedulerCore(ThirdOfAWindow(), BatchLimits(max_batch=4, final_frames=3000), workers=2, pack_hold_s=hold)
    core.add("i", interim("busy"), 0.0)
    assert core.schedule(0.0, 0).batch is not None  # another worker is busy
    return core


def test_a_lone_pause_decode_waits_for_a_window_mate_while_another_worker_is_busy():
    core = _hold_setup(0.2)
    core.add("a", final("a", speculative=True), 1.0)
    decision = core.schedule(1.05, 1)
    assert decision.batch is None and decision.wake_at == pytest.approx(1.2)
    core.add("b", final("b", speculative=True), 1.1)
    assert [r.prompt for r in core.schedule(1.1, 1).batch.requests] == ["a", "b"]


def test_a_pack_hold_ends_and_idle_servers_or_endpoint_finals_never_hold():
    core = _hold_setup(0.2)
    core.add("a", final("a", speculative=True), 1.0)
    assert [r.prompt for r in core.schedule(1.2, 1).batch.requests] == ["a"]  # the hold ran out
    idle = SchedulerCore(ThirdOfAWindow(), BatchLimits(max_batch=4, final_frames=3000), workers=2, pack_hold_s=0.2)
    idle.add("a", final("a", speculative=True), 1.0)
    assert idle.schedule(1.0, 0).batch is not None
    core = _hold_setup(0.2)
    core.add("e", final("endpoint"), 1.0)  # not a pause decode: its user is waiting now
    assert core.schedule(1.0, 1).batch is not None
    core = _hold_setup(0.0)
    core.add("a", final("a", speculative=True), 1.0)
    assert core.schedule(1.0, 1).batch is not None


def test_a_pause_decode_is_not_held_while_only_its_own_stream_keeps_a_worker_busy():
    """One stream's own interim, left behind at the pause, brings no window-mate: holding its pause
    decode only added to the final's latency where the decode outlasts the endpoint's slack."""
    core = SchedulerCore(ThirdOfAWindow(), BatchLimits(max_batch=4, final_frames=3000), workers=2, pack_hold_s=0.2)
    core.add("a", interim("own"), 0.0)
    assert core.schedule(0.0, 0).batch is not None
    core.add("a", final("a", speculative=True), 1.0)
    assert [r.prompt for r in core.schedule(1.0, 1).batch.requests] == ["a"]


def test_the_queues_hold_only_live_jobs_after_many_sessions():
    """A fair queue that kept every ticket it ever held grew by each job's audio forever."""
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=2))
    for n in range(500):
        owner = f"s{n}"
        core.add(owner, interim(f"{n}", samples=16000), float(n))
        core.add(owner, final(f"{n}f"), float(n))
        while ran(core, float(n)):
            pass
        if n % 3 == 0:
            core.add(owner, interim("left"), float(n))
            core.cancel_owner(owner)
    assert core.live == 0 and core.depth == 0
    assert core._finals.held <= 8 and core._interims.held <= 8


def test_a_worker_that_takes_interims_during_a_pack_hold_is_still_told_when_the_hold_ends():
    """Otherwise the held final waits for whichever batch ends next, not for the hold."""
    core = SchedulerCore(ThirdOfAWindow(), BatchLimits(max_batch=4, final_frames=3000), workers=2, pack_hold_s=0.2)
    core.add("f", final("busy"), 0.0)
    assert core.schedule(0.0, 0).batch is not None  # the other worker runs finals
    core.add("a", final("a", speculative=True), 1.0)
    core.add("j", interim("meanwhile"), 1.0)
    decision = core.schedule(1.05, 1)
    assert [r.prompt for r in decision.batch.requests] == ["meanwhile"] and decision.wake_at == pytest.approx(1.2)


def context(tag: str) -> DecodeJob:
    return DecodeJob(0, 0, DecodeRequest(np.zeros(1600, np.float32), DecodeKind.CONTEXT, prompt=tag), False, 1600)


def test_a_context_pass_waits_behind_finals_and_interims_until_it_is_overdue():
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1, context_max_wait_s=5.0))
    core.add("c", context("pass"), 0.0)
    for i in range(10):
        core.add(f"i{i}", interim(f"interim {i}"), 0.0)
    core.add("f", final("final"), 0.0)
    assert ran(core, 1.0) == ["final"]  # finals first, always
    assert ran(core, 2.0) == ["interim 0"]  # then interims, while the pass is young
    assert ran(core, 5.0) == ["pass"]  # overdue: before the waiting interims
    assert ran(core, 5.5) == ["interim 1"]


def test_the_passes_of_a_session_its_client_closed_go_ahead_of_the_other_passes():
    """Its client waits on them for ``closed``, and a pass still waiting when the close's time runs out
    is dropped; the others only revise what their clients show."""
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1))
    for owner in ("a", "b", "closing", "c"):
        core.add(owner, context(f"{owner} 1"), 0.0)
    core.add("closing", replace(context("closing right"), channel=1), 0.0)
    core.hurry("closing")  # its waiting passes move to the head, in the order they came
    core.add("closing", context("closing 2"), 1.0)  # and those that come after the close go there too
    core.add("a", final("final"), 1.0)
    order = [p for t in range(8) for p in ran(core, 2.0 + t)]
    assert order == ["final", "closing 1", "closing right", "closing 2", "a 1", "b 1", "c 1"]
    core.cancel_owner("closing")  # the session ended: the next one of that name is not hurried
    core.add("x", context("x 1"), 20.0)
    core.add("closing", context("late"), 20.0)
    assert [p for t in range(2) for p in ran(core, 21.0 + t)] == ["x 1", "late"]


def test_context_passes_share_a_call_only_up_to_their_own_cap_while_interims_take_the_full_batch():
    """Beam search over whole windows costs no less per pass in a larger batch (docs/benchmarks.md, GPU):
    passes waiting together run ``context_batch`` to a call, and the rest take the next call."""
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=32, max_frames=32 * 3000, context_batch=3))
    for i in range(5):
        core.add(f"c{i}", context(f"pass {i}"), 0.0)
    assert ran(core, 1.0) == ["pass 0", "pass 1", "pass 2"]
    assert ran(core, 2.0) == ["pass 3", "pass 4"]
    for i in range(5):
        core.add(f"i{i}", interim(f"interim {i}"), 3.0)
    assert len(ran(core, 3.0)) == 5
    with pytest.raises(ValueError):
        BatchLimits(context_batch=-1)


def run_for(core: SchedulerCore, start: float, seconds: float) -> list[str]:
    """Schedule at ``start`` and answer the batch ``seconds`` later; the prompts that ran."""
    decision = core.schedule(start, 0)
    assert decision.batch is not None
    core.update_from_output(decision.batch.id, [Hypothesis(r.prompt) for r in decision.batch.requests], start + seconds)
    return [r.prompt for r in decision.batch.requests]


def test_overdue_passes_go_before_interims_only_while_they_took_less_than_their_share():
    """Under overload interims still come: passes that took most of the background time wait their turn."""
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1, context_max_wait_s=1.0, context_share=0.5))
    for i in range(10):
        core.add(f"i{i}", interim(f"interim {i}"), 0.0)
    core.add("a", context("pass a"), 0.0)
    assert run_for(core, 2.0, 2.0) == ["pass a"]  # overdue, and no pass has run yet
    core.add("b", context("pass b"), 4.0)
    assert run_for(core, 6.0, 1.0) == ["interim 0"]  # overdue, but passes took all the recent time
    assert run_for(core, 7.0, 2.0) == ["interim 1"]  # still more than half
    assert run_for(core, 9.0, 1.0) == ["pass b"]  # now less than half


def test_time_share_decays_with_its_half_life():
    from asr_server.scheduler.policy import TimeShare

    share = TimeShare(half_life_s=10.0)
    assert share.share("context", 0.0) == 0.0
    share.add("context", 3.0, 0.0)
    share.add("interim", 1.0, 10.0)  # the 3 s are worth 1.5 by now
    assert share.share("context", 10.0) == pytest.approx(1.5 / 2.5)
    assert share.share("context", 1000.0) == pytest.approx(1.5 / 2.5)  # decay keeps the ratio


def two_interims_each_second(core: SchedulerCore, seconds: int, with_final: bool = False) -> float:
    """Each second from 0, two interims side by side on workers 0 and 1 (one for 0.2 s, the other for
    0.3 s), and with ``with_final`` a final for 0.4 s after them; returns the time at the end."""
    t = 0.0
    for _ in range(seconds):
        core.add("a", interim("i"), t)
        core.add("b", interim("j"), t)
        first, second = core.schedule(t, 0).batch, core.schedule(t, 1).batch
        assert first is not None and second is not None
        core.update_from_output(first.id, [Hypothesis("i")], t + 0.2)
        core.update_from_output(second.id, [Hypothesis("j")], t + 0.3)
        if with_final:
            core.add("c", final("f"), t + 0.5)
            assert run_for(core, t + 0.5, 0.4) == ["f"]
        t += 1.0
    return t


def test_background_busy_is_the_share_of_recent_time_some_worker_ran_interims_or_passes():
    """What the governor's spare time is judged on: interims and passes only (finals have their own
    workers), counted once however many workers run them at the same time, over the recent time."""
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1), workers=3)  # two workers for interims and passes
    assert core.state(0.0).background_busy == 0.0
    t = two_interims_each_second(core, 200, with_final=True)  # ... and a final that does not count
    assert core.state(t).background_busy == pytest.approx(0.3, abs=0.02)
    core.add("a", interim("long"), t)
    assert core.schedule(t, 0).batch is not None
    assert 0.75 < core.state(t + 30.0).background_busy <= 1.0  # running all along, not yet answered
    fresh = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1), workers=3)
    fresh.add("a", interim("i"), 0.0)
    assert fresh.schedule(0.0, 0).batch is not None
    assert fresh.state(3.0).background_busy == 1.0  # a server that starts busy reads busy at once


def test_background_busy_counts_each_call_as_a_share_where_calls_run_side_by_side():
    """On a GPU, background calls on separate workers overlap: with ``busy_side_by_side`` 2, one call
    running is half busy, two are busy. Sixteen staggered streams on an H200 kept some call running
    nearly all the time, so the measure that counts any call as busy left settle decodes off there."""
    limits = BatchLimits(max_batch=1, busy_side_by_side=2)
    core = SchedulerCore(FakeRunner(), limits, workers=3)
    t = two_interims_each_second(core, 200)  # both workers for 0.2 s, one of them 0.1 s more
    assert core.state(t).background_busy == pytest.approx(0.25, abs=0.02)  # 0.2 + 0.1 / 2 of each second
    core.add("a", interim("long"), t)
    assert core.schedule(t, 0).batch is not None
    assert core.state(t + 100.0).background_busy == pytest.approx(0.5, abs=0.02)  # one call all along: half
    with pytest.raises(ValueError):
        BatchLimits(busy_side_by_side=0)


def test_the_queue_state_tells_how_long_the_oldest_waiting_context_pass_has_waited():
    """What the governor's late passes are judged on: waiting passes only (one running is no backlog)."""
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1), workers=2)
    assert core.state(5.0).oldest_context_wait == 0.0
    core.add("a", context("a"), 1.0)
    core.add("b", context("b"), 2.0)
    assert core.state(5.0).oldest_context_wait == pytest.approx(4.0)
    batch = core.schedule(5.0, 0).batch
    assert batch is not None and [e.owner for e in batch.entries] == ["a"]
    assert core.state(6.0).oldest_context_wait == pytest.approx(4.0)  # b's wait; a runs
    core.update_from_output(batch.id, [Hypothesis("a")], 6.0)
    assert core.schedule(6.0, 0).batch is not None
    assert core.state(7.0).oldest_context_wait == 0.0


def test_finals_run_as_burst_finals_only_while_more_wait_than_workers_can_take():
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1), workers=2)
    assert core.burst_backlog == 3
    for tag in ("a", "b"):
        core.add(tag, final(tag), 0.0)
    calm = core.schedule(0.0, 0).batch
    assert not calm.entries[0].request.burst  # two finals, two workers: as the stream asked
    core.update_from_output(calm.id, [Hypothesis("a")], 0.1)
    for tag in ("c", "d", "e"):
        core.add(tag, final(tag), 0.2)
    burst = core.schedule(0.3, 0).batch
    assert [e.request.burst for e in burst.entries] == [True]  # four waiting: a burst
    assert burst.entries[0].job.request.burst is False  # the session's job is untouched
    never = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1, burst_backlog=0), workers=1)
    for tag in ("x", "y", "z"):
        never.add(tag, final(tag), 0.0)
    assert not never.schedule(0.0, 0).batch.entries[0].request.burst


class BurstKeyed(FakeRunner):
    """Batch keys that tell burst finals apart, as the real runner's do (they decode on another window)."""

    def batch_key(self, request):
        return (request.kind.value, request.language, request.burst)

    def window_frames(self, request):
        return 1000


def test_a_careful_final_is_never_made_a_burst_final():
    """A redo of a cut-back final that heard no words in speech (see DecodeRequest.careful)."""
    core = SchedulerCore(FakeRunner(), BatchLimits(max_batch=1), workers=1)
    first = final("f")
    careful = DecodeJob(first.channel, first.utterance, replace(first.request, careful=True), False, first.audio_end)
    core.add("f", careful, 0.0)
    for tag in ("g", "h", "i"):
        core.add(tag, final(tag), 0.0)
    batch = core.schedule(0.1, 0).batch
    (entry,) = batch.entries
    assert entry.job is careful and not entry.request.burst and not entry.request.cut_back
    core.update_from_output(batch.id, [Hypothesis("f")], 0.2)
    assert core.schedule(0.3, 0).batch.entries[0].request.burst  # the others, still a backlog, are


def test_the_finals_picked_in_a_burst_are_all_burst_finals_and_share_the_call():
    # One worker: two waiting finals are a burst. Judged one final at a time, the head became a
    # burst final and the next, seeing one fewer waiting, did not, so it could not join the call.
    core = SchedulerCore(BurstKeyed(), BatchLimits(max_batch=8), workers=1)
    assert core.burst_backlog == 2
    for tag in ("a", "b"):
        core.add(tag, final(tag), 0.0)
    batch = core.schedule(0.0, 0).batch
    assert [e.job.request.prompt for e in batch.entries] == ["a", "b"]
    assert all(e.request.burst for e in batch.entries)
    core.update_from_output(batch.id, [Hypothesis("a"), Hypothesis("b")], 0.2)
    core.add("c", final("c"), 0.3)  # alone again: as the stream asked
    assert not core.schedule(0.3, 0).batch.entries[0].request.burst
