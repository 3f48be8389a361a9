import pytest

from asr_server.scheduler.policy import WEIGHTS, FairQueue, Priority


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
