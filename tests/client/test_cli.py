"""The terminal client's own rules, without a server: arguments, files, exit status, the live line."""

import subprocess
import sys

import pytest

from asr_client.cli import Outcome, build_parser, fit_tail

from ..harness import FIXTURES


@pytest.mark.parametrize("argv", [
    ["file", "x.wav", "--fast", "--json", "--url", "ws://h:1", "--no-interim"],  # as both READMEs write it
    ["--json", "--url", "ws://h:1", "--no-interim", "file", "x.wav", "--fast"],
    ["--url", "ws://h:1", "file", "x.wav", "--json", "--no-interim", "--fast"],
])
def test_global_options_work_before_or_after_the_command(argv):
    args = build_parser().parse_args(argv)
    assert (args.command, args.path, args.url, args.json, args.no_interim, args.fast) == ("file", "x.wav", "ws://h:1", True, True, True)


def test_defaults_hold_when_nothing_is_given():
    args = build_parser().parse_args(["mic"])
    assert args.url == "ws://127.0.0.1:8765" and not args.json and args.language == "en" and args.endpoint_ms == 500


def _client(*argv):
    return subprocess.run([sys.executable, "-m", "asr_client", "--url", "ws://127.0.0.1:9", *argv], capture_output=True, text=True, timeout=60)


def test_a_missing_file_is_reported_as_such_not_as_an_unreachable_server(tmp_path):
    done = _client("file", str(tmp_path / "nope.wav"))
    assert done.returncode == 2 and "no such file" in done.stderr and "cannot reach" not in done.stderr


def test_a_file_that_is_not_audio_is_a_clear_message_not_a_traceback(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("these are not sounds\n" * 50)
    done = _client("file", str(junk))
    assert done.returncode == 2 and "as audio" in done.stderr and "Traceback" not in done.stderr


def _status(*messages):
    outcome = Outcome()
    for m in messages:
        outcome.see(m)
    return outcome.status()


def test_exit_status_says_whether_the_transcript_was_finished():
    session, closed = {"type": "session"}, {"type": "closed"}
    assert _status(session, {"type": "final", "text": "hi"}, closed) == 0
    # The server went away (shutting_down, retryable): the transcript was cut short.
    assert _status(session, {"type": "error", "code": "shutting_down", "retryable": True}) == 1
    assert _status(session, {"type": "error", "code": "invalid_audio", "retryable": False}) == 1
    assert _status(session) == 1  # connection lost with no closed
    # Errors after which the session goes on do not fail it.
    assert _status(session, {"type": "error", "code": "decode_failed", "retryable": True}, closed) == 0
    assert _status(session, {"type": "error", "code": "invalid_message", "retryable": False}, closed) == 0


def test_a_live_line_wider_than_the_terminal_shows_its_end_cut_at_a_word():
    line = "the quick brown fox jumps over the lazy dog"
    shown = fit_tail(line, 20)
    assert len(shown) <= 20 and shown.startswith("…") and line.endswith(shown[1:])
    assert shown[1:].split()[0] in line.split()  # no word cut in half
    assert fit_tail("short", 20) == "short"
