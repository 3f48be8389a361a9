"""The Python client's pieces that need no server."""

import io

import pytest
from asr_client import Transcript, listen_url
from asr_client.client import transcript_url
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
    # The address the server prints for its page, and one without a scheme, are the same server.
    assert listen_url("http://h:1") == "ws://h:1/v1/listen" and listen_url("HTTPS://h/asr/") == "wss://h/asr/v1/listen"
    assert listen_url("127.0.0.1:8765") == "ws://127.0.0.1:8765/v1/listen"
    with pytest.raises(ValueError, match="not a server address"):
        listen_url("ftp://h:1")
    # ... and the transcript is read from that same server (it was http:///127.0.0.1:8765/...).
    assert transcript_url("127.0.0.1:8765", "s1") == "http://127.0.0.1:8765/v1/sessions/s1/transcript"
    assert transcript_url("https://h/asr/", "s1") == "https://h/asr/v1/sessions/s1/transcript"


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


def test_a_revision_replaces_finals_from_its_offset_and_keeps_the_live_interim_after_them():
    from asr_client import Transcript

    for replacement in ("he was not ill-disposed", "he was not an ill-disposed young man at all, no"):
        t = Transcript()
        t.apply({"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "And so it began."})
        t.apply({"type": "final", "channel": 0, "utterance": 1, "offset": 17, "text": "He was not an old-sposed young man."})
        t.apply({"type": "interim", "channel": 0, "utterance": 2, "offset": 53, "text": "Unless to", "stable": 0})
        t.apply({"type": "revision", "channel": 0, "utterances": [1, 1], "offset": 17, "text": replacement})
        assert t.final_text() == "And so it began. " + replacement
        assert t.text() == t.final_text() + " Unless to"
        # The server re-sends the interim at its new offset, and later finals follow the revised text.
        t.apply({"type": "interim", "channel": 0, "utterance": 2, "offset": len(t.final_text()) + 1, "text": "Unless to be", "stable": 0})
        assert t.text() == t.final_text() + " Unless to be"
        t.apply({"type": "final", "channel": 0, "utterance": 2, "offset": len(t.final_text()) + 1, "text": "Unless to be cold."})
        assert t.final_text() == "And so it began. " + replacement + " Unless to be cold."


def test_a_container_is_sent_packet_by_packet_when_each_is_due_and_raw_audio_at_a_steady_rate():
    """A variable bit rate paced by its average sends a sentence's last bytes late (FLAC spends
    more bytes on speech): with a schedule each stretch goes out as one piece at its own time."""
    from asr_client.client import _paced

    data = bytes(range(100))
    assert list(_paced(data, 40, 400.0, None)) == [(data[:40], 0.0), (data[40:80], 0.1), (data[80:], 0.2)]
    schedule = [(10, 0.072), (90, 0.144), (95, 0.216)]  # the header and a small frame, a large frame, ...
    assert list(_paced(data, 40, 400.0, schedule)) == [(data[:10], 0.072), (data[10:90], 0.144), (data[90:95], 0.216), (data[95:], 0.216)]


def final(channel, utterance, offset, text, start, end):
    return {"type": "final", "channel": channel, "utterance": utterance, "offset": offset, "text": text, "start": start, "end": end}


def test_turns_are_a_call_in_spoken_order_with_revisions_applied_to_each():
    """Two parties' finals come in per channel; ``turns()`` interleaves them by start time, and a
    revision with ``segments`` rewrites each utterance it covers in place, times included."""
    from asr_client import Turn

    t = Transcript()
    t.apply(final(0, 0, 0, "I lost my card.", 0.4, 1.9))
    t.apply(final(0, 1, 16, "Yesterday.", 4.2, 4.9))  # the caller's next turn comes before the agent's first final
    t.apply(final(1, 0, 0, "Sorry to hear.", 2.3, 3.6))
    t.apply(final(0, 2, 27, "", 6.0, 6.0))  # nothing recognised: no turn
    t.apply({"type": "interim", "channel": 1, "utterance": 1, "offset": 15, "text": "your", "stable": 0})
    assert t.turns() == [Turn(0, 0, 0.4, 1.9, "I lost my card."), Turn(1, 0, 2.3, 3.6, "Sorry to hear."), Turn(0, 1, 4.2, 4.9, "Yesterday.")]
    t.apply({"type": "revision", "channel": 0, "utterances": [0, 1], "offset": 0, "text": "I lost my card, yesterday.",
             "segments": [{"utterance": 0, "offset": 0, "start": 0.4, "end": 2.0}, {"utterance": 1, "offset": 16, "start": 4.1, "end": 4.9}]})
    assert t.turns() == [Turn(0, 0, 0.4, 2.0, "I lost my card,"), Turn(1, 0, 2.3, 3.6, "Sorry to hear."), Turn(0, 1, 4.1, 4.9, "yesterday.")]
    assert t.turns(0) == [Turn(0, 0, 0.4, 2.0, "I lost my card,"), Turn(0, 1, 4.1, 4.9, "yesterday.")]
    assert t.turns(1) == [Turn(1, 0, 2.3, 3.6, "Sorry to hear.")]  # the live interim is not a turn
    assert t.turns(5) == []
    # A revision from the second utterance keeps the first as it is.
    t.apply({"type": "revision", "channel": 0, "utterances": [1, 1], "offset": 16, "text": "Yesterday.", "segments": [{"utterance": 1, "offset": 16, "start": 4.1, "end": 4.8}]})
    assert t.turns(0) == [Turn(0, 0, 0.4, 2.0, "I lost my card,"), Turn(0, 1, 4.1, 4.8, "Yesterday.")]
    t.apply(final(0, 3, 27, "Bye.", 9.0, 9.5))
    assert [turn.text for turn in t.turns()] == ["I lost my card,", "Sorry to hear.", "Yesterday.", "Bye."]


def test_speaker_turns_join_a_partys_utterances_until_the_other_speaks_or_it_pauses():
    """``speaker_turns`` (the CLI's ``--turns``): a party's utterances cut at short pauses read as
    one turn; the other party speaking, a pause of ``gap_s`` or a turn grown to ``max_chars``
    starts the next. A joined turn starts at its first utterance and ends at its last."""
    from asr_client import Turn, speaker_turns

    t = Transcript()
    t.apply(final(0, 0, 0, "I lost my card,", 0.4, 1.9))
    t.apply(final(0, 1, 16, "yesterday, at the station.", 2.3, 4.0))  # 0.4 s later: the same turn
    t.apply(final(1, 0, 0, "Sorry to hear.", 4.5, 5.6))
    t.apply(final(0, 2, 43, "Can you block it?", 6.0, 7.0))
    t.apply(final(0, 3, 61, "Please.", 9.0, 9.4))  # after a 2 s pause: a turn of its own
    t.apply(final(1, 1, 15, "Of course.", 9.2, 9.9))  # said over "Please.": it starts later, so it comes after
    assert speaker_turns(t.turns()) == [
        Turn(0, 0, 0.4, 4.0, "I lost my card, yesterday, at the station."), Turn(1, 0, 4.5, 5.6, "Sorry to hear."),
        Turn(0, 2, 6.0, 7.0, "Can you block it?"), Turn(0, 3, 9.0, 9.4, "Please."), Turn(1, 1, 9.2, 9.9, "Of course.")]
    assert [turn.text for turn in speaker_turns(t.turns(), gap_s=3.0)][2:] == ["Can you block it? Please.", "Of course."]
    assert [turn.text for turn in speaker_turns(t.turns(), max_chars=10)][:2] == ["I lost my card,", "yesterday, at the station."]
    # The turns' texts hold every word, once, in order.
    for channel in (0, 1):
        assert " ".join(turn.text for turn in speaker_turns(t.turns()) if turn.channel == channel) == t.final_text(channel)
    assert speaker_turns([]) == []


def test_a_revision_that_gives_an_empty_final_words_appends_them_as_its_turn():
    """The server's context pass can hear words in an utterance whose final was empty (a last word
    said alone after a pause): the revision starts where that final stood, one past the end of the
    text, and names the utterance in ``segments`` for the first time (docs/protocol.md)."""
    from asr_client import Turn

    t = Transcript()
    t.apply(final(0, 0, 0, "Thank you for trying out the asterisk open source.", 94.1, 97.2))
    t.apply(final(0, 1, 51, "", 97.4, 98.1))
    t.apply({"type": "revision", "channel": 0, "utterances": [1, 1], "changed": [1], "offset": 51, "text": "PBX.",
             "segments": [{"utterance": 1, "offset": 51, "start": 97.4, "end": 98.0}]})
    assert t.final_text() == "Thank you for trying out the asterisk open source. PBX."
    assert t.turns() == [Turn(0, 0, 94.1, 97.2, "Thank you for trying out the asterisk open source."), Turn(0, 1, 97.4, 98.0, "PBX.")]


def test_without_segments_a_revisions_utterances_become_one_turn():
    """A server from before ``segments``: the revised range is one turn, heard from its first
    utterance's start to its last one's end."""
    from asr_client import Turn

    t = Transcript()
    t.apply(final(0, 0, 0, "And so it began.", 0.5, 2.0))
    t.apply(final(0, 1, 17, "He was not an old-sposed", 3.0, 5.0))
    t.apply(final(0, 2, 42, "young man.", 5.2, 6.0))
    t.apply({"type": "revision", "channel": 0, "utterances": [1, 2], "offset": 17, "text": "He was not an ill-disposed young man."})
    assert t.turns() == [Turn(0, 0, 0.5, 2.0, "And so it began."), Turn(0, 1, 3.0, 6.0, "He was not an ill-disposed young man.")]


def test_the_transcript_address_comes_from_the_websocket_one():
    from asr_client.client import transcript_url

    assert transcript_url("ws://127.0.0.1:8765", "ab12", format="srt") == "http://127.0.0.1:8765/v1/sessions/ab12/transcript?format=srt"
    assert transcript_url("wss://asr.example.com/v1/listen", "ab12", format="vtt", lines=1) == "https://asr.example.com/v1/sessions/ab12/transcript?format=vtt&lines=1"
    assert transcript_url("ws://h:1", "a/b?c") == "http://h:1/v1/sessions/a%2Fb%3Fc/transcript"  # an id cannot leave its path segment
    # Behind a proxy at a path: kept, as listen_url keeps it for the stream.
    assert transcript_url("wss://h/asr/v1/listen/", "ab12") == transcript_url("wss://h/asr", "ab12") == "https://h/asr/v1/sessions/ab12/transcript"
