"""A session's transcript from its messages, and its subtitle formats."""

from __future__ import annotations

import json

from asr_server.transcript import TranscriptLog, build_transcript, to_srt, to_vtt


def messages() -> list[str]:
    out = [
        {"type": "session", "session_id": "s", "seq": 1, "call": {"channel_names": ["caller", "agent"]}},
        {"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "I lost my card.", "start": 0.5, "end": 2.0, "words": []},
        {"type": "final", "channel": 1, "utterance": 0, "offset": 0, "text": "Sorry to hear.", "start": 2.5, "end": 3.5, "words": []},
        {"type": "final", "channel": 0, "utterance": 1, "offset": 16, "text": "Yet today.", "start": 4.0, "end": 5.0, "words": []},
        {"type": "final", "channel": 0, "utterance": 2, "offset": 27, "text": "", "start": 6.0, "end": 6.2, "words": []},
        {"type": "revision", "channel": 0, "utterances": [0, 1], "offset": 0, "text": "I lost my card. Yesterday.",
         "words": [{"word": "I", "start": 0.6, "end": 0.7, "probability": 0.9}, {"word": "card.", "start": 1.5, "end": 1.9, "probability": 0.9},
                   {"word": "Yesterday.", "start": 4.1, "end": 4.8, "probability": 0.9}],
         "segments": [{"utterance": 0, "offset": 0, "start": 0.6, "end": 1.9}, {"utterance": 1, "offset": 16, "start": 4.1, "end": 4.8}]},
        {"type": "closed", "audio_received_s": 7.0, "audio_transcribed_s": 5.0},
    ]
    return [json.dumps(m) for m in out]


def test_finals_per_speaker_with_revisions_applied():
    t = build_transcript(messages())
    assert t["complete"] and t["session_id"] == "s"
    caller, agent = t["channels"]
    assert caller["speaker"] == "caller" and agent["speaker"] == "agent"
    assert caller["text"] == "I lost my card. Yesterday."
    # A segment per utterance still, each with its text, times and words.
    assert [(s["utterances"], s["text"], s["start"], s["end"]) for s in caller["segments"]] == [
        ([0, 0], "I lost my card.", 0.6, 1.9), ([1, 1], "Yesterday.", 4.1, 4.8)]
    assert [[w["word"] for w in s["words"]] for s in caller["segments"]] == [["I", "card."], ["Yesterday."]]
    assert agent["text"] == "Sorry to hear."


def test_a_revision_that_cuts_an_earlier_one_keeps_its_part_before():
    t = build_transcript(messages() + [json.dumps({"type": "revision", "channel": 0, "utterances": [1, 1], "offset": 10,
                                                   "text": "wallet. Yesterday!", "words": [],
                                                   "segments": [{"utterance": 1, "offset": 10, "start": 1.2, "end": 4.8}]})])
    assert t["channels"][0]["text"] == "I lost my wallet. Yesterday!"  # as a client applying the offsets has it
    assert [s["text"] for s in t["channels"][0]["segments"]] == ["I lost my", "wallet. Yesterday!"]


def test_an_utterance_a_revision_left_with_no_text_has_no_segment_or_cue():
    """A pass that heard an utterance's audio as part of the word before it (docs/protocol.md): the
    revision's segments leave it out, and it takes no room."""
    said = [
        {"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "Visit www.", "start": 0.5, "end": 1.8, "words": []},
        {"type": "final", "channel": 0, "utterance": 1, "offset": 11, "text": "Pastorisk.", "start": 2.4, "end": 3.0, "words": []},
        {"type": "final", "channel": 0, "utterance": 2, "offset": 22, "text": "Goodbye.", "start": 3.6, "end": 4.1, "words": []},
        {"type": "revision", "channel": 0, "utterances": [0, 2], "changed": [0, 1], "offset": 0, "text": "Visit www.asterisk.org. Goodbye.", "words": [],
         "segments": [{"utterance": 0, "offset": 0, "start": 0.5, "end": 3.0}, {"utterance": 2, "offset": 24, "start": 3.6, "end": 4.1}]},
        {"type": "closed"},
    ]
    t = build_transcript([json.dumps(m) for m in said])
    assert t["channels"][0]["text"] == "Visit www.asterisk.org. Goodbye."
    assert [(s["utterances"], s["text"]) for s in t["channels"][0]["segments"]] == [([0, 0], "Visit www.asterisk.org."), ([2, 2], "Goodbye.")]
    assert "Pastorisk" not in to_srt(t) and "-->" in to_srt(t)


def test_each_channel_says_how_much_of_its_text_is_settled():
    """Up to the latest settled message's offset while the session runs (0 without one); all of
    it once the session ended."""
    running = [m for m in messages() if json.loads(m)["type"] != "closed"] + [
        json.dumps({"type": "settled", "channel": 0, "utterance": 1, "offset": 26}),
        json.dumps({"type": "final", "channel": 0, "utterance": 3, "offset": 27, "text": "Call me.", "start": 8.0, "end": 9.0, "words": []}),
    ]
    t = build_transcript(running)
    assert [c["settled"] for c in t["channels"]] == [26, 0] and not t["complete"]
    assert t["channels"][0]["text"][:26] == "I lost my card. Yesterday." and t["channels"][0]["text"].endswith(" Call me.")
    ended = build_transcript(running + [json.dumps({"type": "closed"})])
    assert [c["settled"] for c in ended["channels"]] == [len("I lost my card. Yesterday. Call me."), len("Sorry to hear.")]


def test_settled_counts_in_the_text_given_when_the_log_lost_the_first_messages():
    """A replay log that no longer holds a session's first messages (``truncated``) gives the text from
    its first final on; ``settled`` is how much of that text is settled, not an offset into the whole."""
    tail = [
        json.dumps({"type": "final", "channel": 0, "utterance": 7, "offset": 120, "text": "Then we flew home.", "start": 50.0, "end": 52.0, "words": []}),
        json.dumps({"type": "final", "channel": 0, "utterance": 8, "offset": 139, "text": "It rained.", "start": 53.0, "end": 54.0, "words": []}),
        json.dumps({"type": "settled", "channel": 0, "utterance": 7, "offset": 138}),
    ]
    [channel] = build_transcript(tail)["channels"]
    assert channel["text"] == "Then we flew home. It rained." and channel["settled"] == len("Then we flew home.")
    [early] = build_transcript(tail[:2] + [json.dumps({"type": "settled", "channel": 0, "utterance": 5, "offset": 90})])["channels"]
    assert early["settled"] == 0  # settled text that the log no longer holds


def _interim(seq: int) -> dict:
    return {"type": "interim", "channel": 0, "utterance": 9, "seq": seq, "offset": 26, "text": "and then " * 20}


def test_the_transcript_log_keeps_what_a_transcript_is_built_from_and_no_interims():
    """Interims (half of a session's bytes and none of its transcript) and empty finals are not
    kept; the transcript built from what is kept is the one built from every message."""
    every = [json.loads(m) for m in messages()]
    every[3:3] = [_interim(seq) for seq in range(100, 140)]
    log = TranscriptLog(1 << 20)
    for m in every:
        log.add(m, json.dumps(m))
    kinds = [json.loads(t)["type"] for t in log.texts()]
    assert "interim" not in kinds and kinds.count("final") == 3  # the empty final left out
    assert log.bytes == sum(len(t) for t in log.texts())
    assert log.transcript() == {**build_transcript(json.dumps(m) for m in every), "truncated": False}


def test_the_transcript_log_is_bounded_keeps_the_session_message_and_says_when_it_dropped_any():
    """Past its bound the oldest messages go, never the session message (the speakers' names), and
    the transcript says ``truncated``."""
    first = [json.loads(m) for m in messages()][:4]  # session and three finals
    later = {"type": "final", "channel": 0, "utterance": 3, "offset": 26, "text": "Call me.", "start": 8.0, "end": 9.0, "words": []}
    size = sum(len(json.dumps(m)) for m in first)  # room for these, then "Call me." only without the caller's first final
    assert len(json.dumps(later)) <= len(json.dumps(first[1]))
    log = TranscriptLog(size)
    for m in first:
        log.add(m, json.dumps(m))
    assert not log.truncated
    log.add(later, json.dumps(later))
    t = log.transcript()
    assert t["truncated"] and log.bytes <= size
    assert [c["speaker"] for c in t["channels"]] == ["caller", "agent"]
    assert t["channels"][0]["text"] == "Yet today. Call me."


def test_srt_and_vtt_cues_in_time_order_with_speakers():
    """A revision that covered two of the caller's turns leaves them two cues, with the agent's
    turn between them, as they were spoken; a short one stays up for a second."""
    t = build_transcript(messages())
    assert to_srt(t) == ("1\n00:00:00,600 --> 00:00:01,900\n[caller] I lost my card.\n\n2\n00:00:02,500 --> 00:00:03,500\n[agent] Sorry to hear.\n\n"
                         "3\n00:00:04,100 --> 00:00:05,100\n[caller] Yesterday.\n")
    assert to_vtt(t) == ("WEBVTT\n\n00:00:00.600 --> 00:00:01.900\n<v caller>I lost my card.\n\n00:00:02.500 --> 00:00:03.500\n<v agent>Sorry to hear.\n\n"
                         "00:00:04.100 --> 00:00:05.100\n<v caller>Yesterday.\n")
    one = build_transcript([m for m in messages() if '"channel": 1' not in m])
    assert to_srt(one).splitlines()[2] == "I lost my card." == to_vtt(one).splitlines()[3]  # one speaker: no label
    assert not build_transcript(messages()[:3])["complete"]


def test_webvtt_escapes_what_would_read_as_markup():
    said = [json.dumps({"type": "session", "session_id": "s", "seq": 1, "call": {"channel_names": ["Tom <sales>", "B&B"]}}),
            json.dumps({"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "Call AT&T, <3 them.", "start": 0.5, "end": 2.0, "words": []}),
            json.dumps({"type": "final", "channel": 1, "utterance": 0, "offset": 0, "text": "Sure.", "start": 3.0, "end": 3.5, "words": []})]
    vtt = to_vtt(build_transcript(said))
    assert "<v Tom &lt;sales&gt;>Call AT&amp;T, &lt;3 them.\n" in vtt and "<v B&amp;B>Sure.\n" in vtt
    assert "Call AT&T, <3 them." in to_srt(build_transcript(said))  # SubRip takes the text as it is
