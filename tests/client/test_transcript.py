"""The Python client's pieces that need no server."""

import io

from asr_client import Transcript, listen_url
from asr_client.cli import Display


def msg(kind, offset, text, channel=0, utterance=0, stable=0):
    return {"type": kind, "channel": channel, "utterance": utterance, "offset": offset, "text": text, "stable": stable}


def test_transcript_applies_revisions_by_offset():
    t = Transcript()
    t.apply(msg("interim", 0, "hello"))
    t.apply(msg("interim", 0, "hello word"))
    t.apply(msg("final", 0, "Hello world."))
    assert t.text() == t.final_text() == "Hello world."
    t.apply(msg("interim", 13, "how", utterance=1))
    assert t.text() == "Hello world. how" and t.final_text() == "Hello world."
    t.apply(msg("interim", 13, "how are you", utterance=1))
    t.apply(msg("final", 13, "", utterance=1))  # nothing recognised: takes no room
    assert t.text() == "Hello world."
    t.apply(msg("final", 13, "Bye.", utterance=2))
    assert t.text() == "Hello world. Bye."


def test_channels_are_kept_apart():
    t = Transcript()
    t.apply(msg("final", 0, "agent", channel=0))
    t.apply(msg("final", 0, "customer", channel=1))
    assert (t.text(0), t.text(1)) == ("agent", "customer")


def test_listen_url():
    assert listen_url("ws://h:1", encoding="ogg", interim_results=False) == "ws://h:1/v1/listen?encoding=ogg&interim_results=false"
    assert listen_url("ws://h:1/v1/listen/") == "ws://h:1/v1/listen"


class FakeTty(io.StringIO):
    def isatty(self):
        return True


def test_terminal_display_rewrites_interims_and_keeps_finals():
    out = FakeTty()
    d = Display(out)
    d.show(msg("interim", 0, "hel"))
    d.show(msg("interim", 0, "hello wor"))
    d.show(msg("final", 0, "Hello world."))
    screen = out.getvalue()
    assert screen.count("\r\x1b[K") == 3  # each interim redraws the line, the final clears it
    assert screen.endswith("Hello world.\n")


def test_pipe_display_prints_only_finals():
    out = io.StringIO()
    d = Display(out)
    d.show(msg("interim", 0, "hel"))
    d.show(msg("final", 0, "Hello."))
    assert out.getvalue() == "Hello.\n"
