"""The server's command line refuses settings that cannot work before loading anything."""

import pytest

from asr_server.cli import build_parser


@pytest.mark.parametrize("flag", ["--final-beam-size", "--quick-final-beam-size"])
def test_a_beam_of_no_hypotheses_is_refused(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([flag, "0"])
    assert exit_info.value.code == 2 and "at least 1" in capsys.readouterr().err
    assert getattr(build_parser().parse_args([flag, "1"]), flag.lstrip("-").replace("-", "_")) == 1


def test_the_vad_defaults_to_silero_and_takes_only_known_detectors():
    assert build_parser().parse_args([]).vad == "silero"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--vad", "energy"])


def test_the_context_pass_settings_reach_the_server_and_negative_seconds_are_refused(capsys):
    from asr_server.cli import _context, _plan

    args = build_parser().parse_args(["--context-window-s", "40", "--context-back-s", "4", "--context-min-new-s", "5", "--context-max-wait-s", "2"])
    options = _context(args)
    assert (options.window_s, options.back_s, options.min_new_s) == (30.0, 4.0, 5.0)  # one Whisper window at most
    assert _plan(args).batch.context_max_wait_s == 2.0
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--context-max-wait-s", "-1"])
    assert exit_info.value.code == 2 and "0 or more" in capsys.readouterr().err
