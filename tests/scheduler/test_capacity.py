"""Admission from the measured cost of a burst final and of a context pass."""

import pytest

from asr_server.scheduler.capacity import CapacityModel, CapacityOptions


def test_channels_are_those_whose_finals_fit_the_burst_budget_at_once():
    assert CapacityModel(2, 0.25).channels() == 12  # 1.5 s x 2 workers / 0.25 s
    assert CapacityModel(1, 0.25).channels() == 6
    assert CapacityModel(2, 0.25, CapacityOptions(burst_s=1.0)).channels() == 8
    assert CapacityModel(1, 10.0).channels() == 2  # a slow model still serves a two-party call
    assert CapacityModel(1, 10.0, CapacityOptions(floor=1)).channels() == 1
    assert CapacityModel(1, 0.0001).channels() == CapacityOptions().ceiling


def test_observed_finals_move_the_cost_and_the_limit_follows():
    model = CapacityModel(2, 0.20, CapacityOptions(smoothing=0.5))
    before = model.channels()
    for _ in range(6):
        model.observe_final(0.40)  # the host got busier: finals cost twice as much
    assert model.final_s == pytest.approx(0.40, abs=0.01) and model.channels() < before
    assert model.channels() == 7 and model.observed == 6
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        model.observe_final(bad)
    assert model.observed == 6


def test_a_pass_that_may_hold_a_worker_when_the_burst_comes_is_taken_out_of_the_budget():
    # The slow machine: burst finals 0.87 s, a pass 1.5 s on 2 workers: 3 channels without the
    # pass (their finals in step came p95 3.9 s late), 1 with it (2 with the floor: one stereo call).
    assert CapacityModel(2, 0.87).channels() == 3
    assert CapacityModel(2, 0.87, CapacityOptions(floor=1), pass_s=1.5).channels() == 1
    assert CapacityModel(2, 0.87, pass_s=1.5).channels() == 2
    assert CapacityModel(2, 0.25, pass_s=0.5).channels() == 10  # (1.5 s x 2 - 0.5 s) / 0.25 s
    model = CapacityModel(2, 0.25, CapacityOptions(smoothing=0.5))
    model.observe_pass(1.0)  # the first pass sets it
    assert model.pass_s == 1.0 and model.channels() == 8
    model.observe_pass(0.5)
    assert model.pass_s == pytest.approx(0.75) and model.channels() == 9
    for bad in (0.0, -1.0, float("nan")):
        model.observe_pass(bad)
    assert model.pass_s == pytest.approx(0.75)
    with pytest.raises(ValueError):
        CapacityModel(2, 0.25, pass_s=-1.0)


@pytest.mark.parametrize("kwargs", [dict(burst_s=0), dict(smoothing=0), dict(smoothing=1.5), dict(ceiling=0), dict(floor=0), dict(floor=3, ceiling=2)])
def test_bad_options_are_refused(kwargs):
    with pytest.raises(ValueError):
        CapacityOptions(**kwargs)
    with pytest.raises(ValueError):
        CapacityModel(0, 0.2)


def test_while_no_burst_was_seen_an_idle_server_measures_again_and_the_lower_cost_stands():
    """A start-up measure taken on a busy host is slow (here three times the quiet cost: 2 channels
    instead of 9); with few channels admitted, bursts that would correct it seldom come."""
    model = CapacityModel(2, 0.75, CapacityOptions(remeasure_s=60.0), pass_s=0.9)
    assert not model.remeasure_due(100.0, idle=True)  # the first look starts the count
    assert not model.remeasure_due(150.0, idle=True) and not model.remeasure_due(170.0, idle=False)  # too soon; not idle
    assert model.remeasure_due(170.0, idle=True)
    model.remeasured(171.0, 0.25, 0.66)
    assert (model.final_s, model.pass_s, model.channels()) == (0.25, 0.66, 9)
    assert model.remeasure_due(231.0, idle=True)
    model.remeasured(231.0, 0.5, 1.0)  # a measure on a busy host again: the lower costs stand
    assert (model.final_s, model.pass_s) == (0.25, 0.66)
    assert not model.remeasure_due(300.0, idle=True) and model.remeasure_due(351.0, idle=True)  # it did not lower them: twice the wait
    for at in (351.0, 591.0, 1071.0, 2031.0, 3951.0, 7551.0):
        assert model.remeasure_due(at, idle=True)
        model.remeasured(at, 0.25, 0.66)
    assert not model.remeasure_due(7551.0 + 3599.0, idle=True) and model.remeasure_due(7551.0 + 3600.0, idle=True)  # at most an hour


def test_burst_finals_seen_are_the_evidence_and_no_more_measures_are_asked_for():
    model = CapacityModel(2, 0.75, CapacityOptions(remeasure_s=60.0))
    model.remeasure_due(0.0, idle=True)
    model.observe_final(0.5)
    assert not model.remeasure_due(1000.0, idle=True)
    assert not CapacityModel(2, 0.75, CapacityOptions(remeasure_s=0.0)).remeasure_due(1e6, idle=True)  # 0: never
    failed = CapacityModel(2, 0.75, CapacityOptions(remeasure_s=60.0))
    failed.remeasure_due(0.0, idle=True)
    failed.remeasured(61.0, float("nan"), 0.0)  # the measure failed: the cost stays, and it is asked for again later
    assert failed.final_s == 0.75 and not failed.remeasure_due(100.0, idle=True) and failed.remeasure_due(121.0, idle=True)
