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
