"""The terminal client's own rules, without a server: arguments, files, exit status, the live line."""

import subprocess
import sys

import pytest

from asr_client.cli import Outcome, _options, build_parser, fit_tail

from ..harness import FIXTURES


@pytest.mark.parametrize("argv", [
    ["file", "x.wav", "--fast", "--json", "--url", "ws://h:1", "--no-interim"],  # as both READMEs write it
    ["--json", "--url", "ws://h:1", "--no-interim", "file", "x.wav", "--fast"],
    ["--url", "ws://h:1", "file", "x.wav", "--json", "--no-interim", "--fast"],
])
def test_global_options_work_before_or_after_the_command(argv):
    args = build_parser().parse_args(argv)
    assert (args.command, args.path, args.url, args.json, args.no_interim, args.fast) == ("file", "x.wav", "ws://h:1", True, True, True)


def test_the_server_address_can_be_given_as_server_and_an_unknown_option_is_named(capsys):
    assert build_parser().parse_args(["--server", "ws://h:1", "mic"]).url == "ws://h:1"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--host", "ws://h:1", "file", "x.wav"])
    # Not argparse's "invalid choice: 'ws://h:1'", which names the value as if it were the command.
    assert "unknown option --host" in capsys.readouterr().err


def test_defaults_hold_when_nothing_is_given(monkeypatch):
    monkeypatch.delenv("ASR_URL", raising=False)
    args = build_parser().parse_args(["mic"])
    assert args.url == "ws://127.0.0.1:8765" and not args.json and args.language == "en" and args.endpoint_ms == 500
    assert _options(args)["heartbeat_s"] == 5.0  # the server's heartbeats tell a dead connection from a quiet one
    assert not {"prompt", "priority", "revisions"} & set(_options(args))  # the server's defaults


def test_the_stream_options_a_terminal_user_sets_reach_the_query(monkeypatch):
    monkeypatch.setenv("ASR_URL", "wss://host.example/asr")
    args = build_parser().parse_args(["file", "call.wav", "--prompt", "Dashwood, Norland Park", "--priority", "batch", "--no-revisions"])
    assert args.url == "wss://host.example/asr"
    assert {k: _options(args)[k] for k in ("prompt", "priority", "revisions")} == {"prompt": "Dashwood, Norland Park", "priority": "batch", "revisions": False}
    assert build_parser().parse_args(["--url", "ws://h:1", "mic"]).url == "ws://h:1"  # --url wins over $ASR_URL
    with pytest.raises(SystemExit):
        build_parser().parse_args(["mic", "--priority", "urgent"])


def test_heartbeats_can_be_turned_off():
    assert "heartbeat_s" not in _options(build_parser().parse_args(["mic", "--heartbeat", "0"]))


def _client(*argv):
    return subprocess.run([sys.executable, "-m", "asr_client", "--url", "ws://127.0.0.1:9", *argv], capture_output=True, text=True, timeout=60)


def test_a_missing_file_is_reported_as_such_not_as_an_unreachable_server(tmp_path):
    done = _client("file", str(tmp_path / "nope.wav"))
    assert done.returncode == 2 and "no such file" in done.stderr and "cannot reach" not in done.stderr


def test_an_address_that_is_not_a_servers_is_a_clear_message_not_a_traceback(tmp_path):
    """``--url http://...`` (the address the server prints for its page) raised websockets' InvalidURI."""
    done = subprocess.run([sys.executable, "-m", "asr_client", "--url", "ftp://127.0.0.1:9", "file", "x.wav"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not a server address" in done.stderr and "Traceback" not in done.stderr


def test_tls_to_a_server_that_speaks_none_says_so():
    """A TLS handshake with a plain server is cut off: the message was 'cannot reach wss://...: ' and nothing."""
    import socket
    import threading

    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(30)

        def cut_off() -> None:
            conn, _ = listener.accept()
            conn.recv(4096)  # the ClientHello, which a plain server cannot read
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset, as it does
            conn.close()

        server = threading.Thread(target=cut_off, daemon=True)
        server.start()
        port = listener.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "asr_client", "--url", f"wss://127.0.0.1:{port}", "file", str(FIXTURES / "cards_16k.wav")],
                              capture_output=True, text=True, timeout=60)
        server.join(30)
    assert done.returncode == 2 and "cannot reach" in done.stderr and "--certfile" in done.stderr, done.stderr


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


def test_settled_lines_write_each_settled_stretch_once_and_the_rest_at_the_end():
    """``--settled``: a line per settled message with the revised text up to its offset, nothing
    twice, and at the end what was not settled; a channel's lines joined are its transcript."""
    import io

    from asr_client import Transcript
    from asr_client.cli import SettledLines

    out, transcript = io.StringIO(), Transcript()
    lines = SettledLines(out, transcript)
    messages = [
        {"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "He was not an old-sposed young man."},
        {"type": "final", "channel": 0, "utterance": 1, "offset": 36, "text": "Unless to be cold."},
        {"type": "revision", "channel": 0, "utterances": [0, 1], "offset": 0, "text": "He was not an ill-disposed young man. Unless to be cold."},
        {"type": "settled", "channel": 0, "utterance": 0, "offset": 37},
        {"type": "settled", "channel": 0, "utterance": 0, "offset": 37},  # nothing new: no line
        {"type": "final", "channel": 0, "utterance": 2, "offset": 57, "text": "Had he married."},
        {"type": "settled", "channel": 0, "utterance": 1, "offset": 56},
    ]
    for m in messages:
        transcript.apply(m)
        lines.see(m, 1)
    assert out.getvalue() == "He was not an ill-disposed young man.\nUnless to be cold.\n"
    lines.rest(1)
    assert out.getvalue().splitlines() == ["He was not an ill-disposed young man.", "Unless to be cold.", "Had he married."]
    assert " ".join(out.getvalue().splitlines()) == transcript.final_text(0)


def test_only_one_of_json_transcript_and_settled():
    for pair in (["--json", "--settled"], ["--transcript", "--settled"], ["--turns", "--transcript"], ["--json", "--turns"],
                 ["--subtitles", "srt", "--turns"]):
        done = _client(*pair, "file", "x.wav")
        assert done.returncode == 2 and "choose one" in done.stderr


def test_a_turn_line_says_when_and_who():
    from asr_client import Turn
    from asr_client.cli import turn_line

    assert turn_line(Turn(1, 4, 83.46, 85.0, "Sure."), channels=2) == "[01:23.5 ch1] Sure."
    assert turn_line(Turn(0, 0, 0.04, 1.0, "Hello."), channels=1) == "[00:00.0] Hello."
    assert turn_line(Turn(0, 9, 3725.31, 3726.0, "Later."), channels=1) == "[1:02:05.3] Later."
    assert turn_line(Turn(0, 9, 59.97, 61.0, "Then."), channels=1) == "[01:00.0] Then."
    assert turn_line(Turn(0, 2, None, None, "Untimed."), channels=1) == "[--:--.-] Untimed."


@pytest.mark.parametrize("mode", [[], ["--transcript"], ["--json"], ["--settled"]])
def test_finals_printed_to_a_pipe_and_revised_later_are_pointed_out_at_the_end(mode, capsys):
    from asr_client.cli import Captions

    captions = Captions(build_parser().parse_args(["file", "x.wav", *mode]))
    for message in (
        {"type": "session", "config": {"channels": 1}},
        {"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "He was not an old supposed young man."},
        {"type": "revision", "channel": 0, "utterances": [0, 0], "changed": [0], "offset": 0, "text": "He was not an ill-disposed young man."},
        {"type": "closed"},
    ):
        captions.see(message)
    captions.finish()
    out, err = capsys.readouterr()  # pytest's capture is no terminal: a pipe, as far as the client can tell
    pointed_out = "revised 1 line after printing it" in err and "--transcript" in err
    assert pointed_out == (mode == [])  # the other modes print the revised text themselves, or every message
    if mode == []:
        assert out == "He was not an old supposed young man.\n"
