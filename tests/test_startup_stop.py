"""A stop during start-up: the load ends at its next step, and a second signal ends the process."""

import asyncio
import math
import signal
import subprocess
import sys

import pytest

from asr_server import cli
from asr_server.cli import StartupStopped, build_parser, on_stop_signal

# The start-up steps in order, as the stand-in runner records them.
STEPS = ["load", "warm_up", "final_copies", "warm_up_batch", "burst_final", "pass"]


class StandInRunner:
    """Records which start-up steps ran; the capacity measure honours ``stop`` as the real one does."""

    steps: list[str] = []

    def __init__(self, path, **kwargs):
        self.steps.append("load")
        self.final_threads = self.wide_threads = 2

    def measure_final_copies(self, stop=lambda: False):
        if stop():
            return None
        self.steps.append("final_copies")
        return 0.19, 0.13

    def choose_final_copy(self, wide_s, narrow_s):
        self.final_threads = 1
        return False

    def warm_up(self):
        self.steps.append("warm_up")

    def warm_up_batch(self, size):
        self.steps.append("warm_up_batch")

    def measure_burst_final(self, concurrent=1, stop=lambda: False):
        if stop():
            return math.nan
        self.steps.append("burst_final")
        return 0.2

    def measure_context_pass(self, stop=lambda: False):
        if stop():
            return math.nan
        self.steps.append("pass")
        return 0.5


def _load(monkeypatch, stop_after: int | None, argv: tuple[str, ...] = ()):
    """Run the start-up load with the stand-in runner; ``stop`` says yes from its ``stop_after``-th question on."""
    monkeypatch.setattr(cli, "WhisperRunner", StandInRunner)
    monkeypatch.setattr(StandInRunner, "steps", [])
    asked = []

    def stop() -> bool:
        asked.append(len(StandInRunner.steps))
        return stop_after is not None and len(asked) > stop_after

    args = build_parser().parse_args(list(argv))
    return cli._load(args, cli._plan(args, "model"), "model", None, stop), StandInRunner.steps


def test_without_a_stop_every_start_up_step_runs_and_the_capacity_is_measured(monkeypatch):
    (runner, interim, budget, capacity), steps = _load(monkeypatch, None)
    assert steps == STEPS
    assert isinstance(runner, StandInRunner) and interim is None and budget is not None
    assert capacity is not None and capacity.channels() >= 1


def test_finals_threads_given_on_the_command_line_are_kept_without_timing_the_copies(monkeypatch):
    (runner, _, _, _), steps = _load(monkeypatch, None, ("--final-cpu-threads", "2"))
    assert steps == [s for s in STEPS if s != "final_copies"] and runner.final_threads == 2
    (runner, _, _, _), steps = _load(monkeypatch, None)
    assert steps == STEPS and runner.final_threads == 1  # the default: chosen by the timing


def test_the_memory_budget_does_not_count_the_weights_of_a_finals_copy_let_go(monkeypatch):
    rss = [100 << 20]  # resident memory as the stand-ins change it
    monkeypatch.setattr(cli, "process_rss", lambda: rss[0])
    monkeypatch.setattr(cli, "peak_rss", lambda: rss[0])

    class Loading(StandInRunner):
        keeps_wide = False

        def __init__(self, path, **kwargs):
            super().__init__(path, **kwargs)
            rss[0] += 300 << 20  # the weights, the finals' wide copy among them

        def choose_final_copy(self, wide_s, narrow_s):
            if self.keeps_wide:
                return True
            rss[0] -= 80 << 20  # the wide copy let go
            return super().choose_final_copy(wide_s, narrow_s)

    monkeypatch.setattr(cli, "WhisperRunner", Loading)
    for argv, keeps_wide, weights in (((), False, 220), (("--final-cpu-threads", "2"), False, 300), ((), True, 300)):
        monkeypatch.setattr(Loading, "keeps_wide", keeps_wide)
        rss[0] = 100 << 20
        args = build_parser().parse_args(list(argv))
        _runner, _interim, budget, _capacity = cli._load(args, cli._plan(args, "model"), "model", None)
        assert budget is not None and budget.weights == weights << 20, argv


@pytest.mark.parametrize("stop_after", range(8))
def test_a_stop_during_start_up_ends_the_load_before_its_next_step(monkeypatch, stop_after):
    # The questions come before: loading, warming up, timing the finals' copies, that timing's own
    # decodes, the budget's batch, the capacity measure, and then the measure's own two decodes.
    ran = [[], ["load"], ["load", "warm_up"], ["load", "warm_up"], ["load", "warm_up", "final_copies"],
           *[["load", "warm_up", "final_copies", "warm_up_batch"]] * 2, ["load", "warm_up", "final_copies", "warm_up_batch", "burst_final"]][stop_after]
    with pytest.raises(StartupStopped):
        _load(monkeypatch, stop_after)
    assert StandInRunner.steps == ran


def test_the_first_stop_signal_stops_the_server_and_a_second_ends_the_process():
    stop = asyncio.Event()
    died = []
    on_stop_signal(stop, signal.SIGTERM, die=died.append)
    assert stop.is_set() and died == []
    on_stop_signal(stop, signal.SIGINT, die=died.append)
    assert died == [signal.SIGINT]


def test_dying_by_a_signal_ends_the_process_by_that_signal():
    code = "import signal; from asr_server.cli import die_by; die_by(signal.SIGTERM); print('still running')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGTERM
    assert "still running" not in done.stdout
