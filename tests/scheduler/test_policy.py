import pytest

from asr_server.scheduler.policy import WEIGHTS, BatchLimits, FairQueue, Priority, form_batch


def drain(q, n=None):
    out = []
    while (t := q.pop()) is not None and (n is None or len(out) < n):
        out.append(t.owner)
        if n is not None and len(out) == n:
            break
    return out


def test_equal_weights_take_turns_even_behind_a_backlog():
    q = FairQueue()
    for i in range(10):
        q.push("a", i, weight=1, cost=1)
    for i in range(3):
        q.push("b", i, weight=1, cost=1)
    assert drain(q, 6) == ["a", "b", "a", "b", "a", "b"]


def test_shares_follow_the_weights():
    q = FairQueue()
    for i in range(100):
        q.push("interactive", i, weight=WEIGHTS[Priority.INTERACTIVE], cost=1)
        q.push("batch", i, weight=WEIGHTS[Priority.BATCH], cost=1)
    served = drain(q, 50)
    assert served.count("interactive") == pytest.approx(40, abs=2)
    assert served.count("batch") == pytest.approx(10, abs=2)


def test_no_starvation_a_late_low_class_job_is_served_soon():
    q = FairQueue()
    for i in range(100):
        q.push("busy", i, weight=WEIGHTS[Priority.INTERACTIVE], cost=1)
    drain(q, 10)
    q.push("late-batch", "x", weight=WEIGHTS[Priority.BATCH], cost=1)
    assert "late-batch" in drain(q, 2)


def test_each_owner_is_served_in_its_own_order():
    q = FairQueue()
    for i in range(5):
        q.push("a", i, weight=1, cost=1)
        q.push("b", i, weight=3, cost=1)
    order = {"a": [], "b": []}
    while (t := q.pop()) is not None:
        order[t.owner].append(t.item)
    assert order == {"a": [0, 1, 2, 3, 4], "b": [0, 1, 2, 3, 4]}


def test_each_lane_of_an_owner_is_a_flow_of_its_own():
    """A call's two channels get two streams' shares (admission counts channels), not one between them."""
    q = FairQueue()
    for i in range(10):
        q.push("call", ("left", i), weight=1, cost=1, lane=0)
        q.push("call", ("right", i), weight=1, cost=1, lane=1)
        q.push("solo", ("solo", i), weight=1, cost=1, lane=0)
    served = [q.pop().item[0] for _ in range(12)]
    assert served.count("left") == served.count("right") == served.count("solo") == 4


def test_forgetting_an_owner_drops_the_tags_of_all_its_lanes():
    q = FairQueue()
    for lane in (0, 1):
        for i in range(5):
            q.push("gone", i, weight=1, cost=1, lane=lane)
    q.cancel_owner("gone")
    for i in range(3):
        q.push("other", i, weight=1, cost=1)
    q.push("gone", "back", weight=1, cost=1, lane=1)  # the name again: a flow that starts afresh
    assert [q.pop().item for _ in range(4)] == [0, "back", 1, 2]


def test_cancel_and_cancel_owner():
    q = FairQueue()
    t1 = q.push("a", 1, weight=1, cost=1)
    q.push("a", 2, weight=1, cost=1)
    q.push("b", 3, weight=1, cost=1)
    q.cancel(t1)
    assert len(q) == 2
    assert [t.item for t in q.cancel_owner("a")] == [2]
    assert len(q) == 1 and q.pop().item == 3 and q.pop() is None


def test_bad_weight_is_refused():
    with pytest.raises(ValueError):
        FairQueue().push("a", 1, weight=0, cost=1)


def _queue(*items):
    q = FairQueue()
    for owner, key, frames in items:
        q.push(owner, (key, frames), weight=1, cost=1)
    return q


def _inspect(item):
    key, frames = item
    return None if key == "stale" else (key, frames)


def test_a_batch_takes_compatible_jobs_in_fair_order_and_leaves_the_rest_waiting():
    q = _queue(("a", "k1", 500), ("b", "k2", 500), ("c", "k1", 500), ("d", "k1", 500))
    batch, skipped = form_batch([(q, BatchLimits(max_batch=8, max_frames=10_000))], _inspect)
    assert [t.owner for t in batch] == ["a", "c", "d"] and not skipped
    assert [t.owner for t in q.in_order()] == ["b"]


def test_batch_size_and_frame_budget_bound_a_batch_but_the_head_always_runs():
    q = _queue(*[(o, "k", 3000) for o in "abcde"])
    batch, _ = form_batch([(q, BatchLimits(max_batch=3, max_frames=100_000))], _inspect)
    assert [t.owner for t in batch] == ["a", "b", "c"]
    batch, _ = form_batch([(q, BatchLimits(max_batch=8, max_frames=3000))], _inspect)
    assert [t.owner for t in batch] == ["d"]
    batch, _ = form_batch([(q, BatchLimits(max_batch=8, max_frames=10))], _inspect)
    assert [t.owner for t in batch] == ["e"]  # over the budget alone: still runs


def test_finals_have_their_own_frame_budget():
    limits = BatchLimits(max_batch=8, max_frames=6000, final_frames=3000)
    assert limits.for_finals() == BatchLimits(max_batch=8, max_frames=3000)
    assert BatchLimits(max_frames=6000).for_finals().max_frames == 6000  # 0: the same as everything else
    finals = _queue(*[(o, "final", 1000) for o in "abcd"])
    interims = _queue(*[(o, "k", 1000) for o in "efgh"])
    queues = [(finals, limits.for_finals()), (interims, limits)]
    assert [t.owner for t in form_batch(queues, _inspect)[0]] == ["a", "b", "c"]
    assert [t.owner for t in form_batch(queues, _inspect)[0]] == ["d"]
    assert [t.owner for t in form_batch(queues, _inspect)[0]] == ["e", "f", "g", "h"]


def test_first_queue_with_work_wins_and_stale_jobs_are_skipped():
    finals = _queue()
    interims = _queue(("a", "stale", 1), ("b", "k", 1))
    batch, skipped = form_batch([(finals, BatchLimits()), (interims, BatchLimits())], _inspect)
    assert [t.owner for t in batch] == ["b"] and [t.owner for t in skipped] == ["a"]
    finals = _queue(("f", "final", 3000))
    interims = _queue(("i", "k", 1))
    batch, _ = form_batch([(finals, BatchLimits()), (interims, BatchLimits())], _inspect)
    assert [t.owner for t in batch] == ["f"] and len(interims) == 1
    assert form_batch([(_queue(), BatchLimits()), (_queue(), BatchLimits())], _inspect) == ([], [])


def test_every_stream_progresses_under_batching_whatever_its_class():
    # Starvation check through batch formation: a batch-class stream behind a
    # backlog of interactive jobs is in one of the first batches.
    q = FairQueue()
    for i in range(40):
        q.push(f"busy{i % 4}", ("k", 1), weight=WEIGHTS[Priority.INTERACTIVE], cost=1)
    q.push("low", ("k", 1), weight=WEIGHTS[Priority.BATCH], cost=1)
    seen = []
    for _ in range(3):
        batch, _ = form_batch([(q, BatchLimits(max_batch=4))], _inspect)
        seen += [t.owner for t in batch]
    assert "low" in seen


def test_a_requeued_item_goes_ahead_of_every_waiting_one_without_charging_its_owner_again():
    q = FairQueue()
    q.push("a", 1, weight=1, cost=1)
    q.push("b", 2, weight=1, cost=1)
    first = q.pop()
    q.push("c", 3, weight=1, cost=1)
    q.requeue(first.owner, first.item)
    assert [t.item for t in q.in_order()] == [1, 2, 3]
    assert q.push("a", 4, weight=1, cost=1).start == 1.0  # its tag moved once, when it first came
