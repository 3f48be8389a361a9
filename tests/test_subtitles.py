"""Subtitle cues a player can show: lines, length on screen, where a cue ends."""

from __future__ import annotations

from asr_server.subtitles import Cue, CueOptions, cues

READING = ("And Mr. John Dashwood had then leisure to consider how much there might be prudently in his power to do for them, "
           "and he was not an ill-disposed young man.")


def segment(text: str, start: float, utterance: int = 0, step: float = 0.3, timed: bool = True) -> dict:
    """An utterance whose words last ``step`` seconds each, back to back from ``start``."""
    words = [{"word": w, "start": round(start + i * step, 3), "end": round(start + (i + 1) * step, 3)} for i, w in enumerate(text.split())]
    return {"utterances": [utterance, utterance], "start": start, "end": words[-1]["end"], "text": text, "words": words if timed else []}


def transcript(*channels: list[dict]) -> dict:
    return {"channels": [{"channel": c, "speaker": f"channel {c}", "segments": s} for c, s in enumerate(channels)]}


def text_of(shown: list[Cue]) -> str:
    return " ".join(" ".join(cue.lines) for cue in shown)


def test_a_long_sentence_is_cut_into_cues_of_two_lines_of_42_at_most_within_7_seconds():
    shown = cues(transcript([segment(READING, 0.5)]))
    assert len(shown) > 1 and text_of(shown) == READING  # every word, once, in order
    for cue in shown:
        assert 1 <= len(cue.lines) <= 2 and all(len(line) <= 42 for line in cue.lines)
        assert cue.end - cue.start <= 7.0
    assert [c.start for c in shown] == sorted(c.start for c in shown) and all(a.end <= b.start for a, b in zip(shown, shown[1:]))
    # A cue that has to end ends at a sentence's end, or a comma, when that leaves it full enough.
    said = "He was not an ill-disposed young man. Unless to be rather cold-hearted and rather selfish is to be ill-disposed."
    assert [c.lines for c in cues(transcript([segment(said, 0.5)]))] == [
        ("He was not an ill-disposed young man.",), ("Unless to be rather cold-hearted and", "rather selfish is to be ill-disposed.")]
    said = "Unless to be rather cold-hearted and rather selfish, is to be ill-disposed, he told everyone who would listen that evening."
    assert [c.lines[-1][-8:] for c in cues(transcript([segment(said, 0.5)]))] == ["selfish,", "evening."]
    # A long sentence ends a cue where it ends, rather than the cues running on across it.
    said = ("Your journey is at an end, before you is Babylon, the gate of God, as the old name means about you, is all that "
            "remains of the second of the seven wonders of the world. Babylon, even in the days of Nebuchadnezzar, was an old old city.")
    babylon = cues(transcript([segment(said, 0.1, step=0.25)]))
    assert any(c.lines[-1].endswith("world.") for c in babylon) and all(c.lines[-1].endswith((",", ".")) for c in babylon)
    # A sentence that needs two cues gets two even ones, not a full cue and a scrap.
    said = "And Mr. John Dashwood had then leisure to consider how much there might be prudently in his power to do for them."
    halves = [len(" ".join(c.lines)) for c in cues(transcript([segment(said, 0.5)]))]
    assert len(halves) == 2 and abs(halves[0] - halves[1]) <= 12, halves
    # Its times are its words': the first cue starts with the first word and ends with its last.
    first_words = " ".join(shown[0].lines).split()
    assert shown[0].start == 0.5 and shown[0].end == round(0.5 + 0.3 * len(first_words), 3)


def test_lines_are_as_even_as_the_words_allow_and_short_text_keeps_one_line():
    (cue,) = cues(transcript([segment("He was not an ill-disposed young man, unless to be cold-hearted.", 0.0, step=0.2)]))
    assert len(cue.lines) == 2 and abs(len(cue.lines[0]) - len(cue.lines[1])) <= 10
    (cue,) = cues(transcript([segment("Babylon.", 3.0)]))
    assert cue.lines == ("Babylon.",)
    narrow = cues(transcript([segment(READING, 0.0, step=0.1)]), CueOptions(line_chars=32, lines=1))
    assert text_of(narrow) == READING and all(len(c.lines) == 1 and len(c.lines[0]) <= 32 for c in narrow)


def test_a_speakers_short_utterances_share_a_cue_unless_someone_else_spoke_between():
    # "about you," / "is all that remains" / "of the second": a reader's phrases, pauses under 1.5 s.
    phrases = [segment("about you,", 8.36, 0), segment("is all that remains", 9.26, 1), segment("of the second", 10.5, 2)]
    (cue,) = cues(transcript(phrases))
    assert cue.lines == ("about you, is all that", "remains of the second")  # 44 characters: two even lines
    assert (cue.start, cue.end) == (8.36, 11.4)
    # A call: the agent answers between the caller's two turns, which stay two cues around it.
    caller = [segment("I lost my card.", 0.5, 0), segment("Yesterday.", 2.6, 1)]
    agent = [segment("Oh no.", 2.1, 0)]
    shown = cues(transcript(caller, agent))
    assert [(c.speaker, " ".join(c.lines)) for c in shown] == [("channel 0", "I lost my card."), ("channel 1", "Oh no."), ("channel 0", "Yesterday.")]
    # A long pause between two of the same speaker's utterances: two cues.
    assert len(cues(transcript([segment("Hello.", 0.0, 0), segment("Anyone there?", 3.0, 1)]))) == 2


def test_a_short_cue_stays_up_a_second_unless_the_speakers_next_one_comes_sooner():
    (cue,) = cues(transcript([segment("Babylon.", 13.83, step=0.38)]))
    assert (cue.start, cue.end) == (13.83, 14.83)
    apart = cues(transcript([segment("Yes.", 1.0, 0, step=0.2), segment("Definitely, without any doubt, it is true.", 2.9, 1)]))
    assert apart[0].end == 2.0
    pushed = cues(transcript([segment(READING, 0.0, step=0.3), segment("Right.", 0.0 + 0.3 * len(READING.split()) + 1.6, 1, step=0.2)]))
    assert all(a.end <= b.start for a, b in zip(pushed, pushed[1:]))


def test_words_without_times_share_their_utterances_time():
    """A segment whose words are not its own (a revision cut it) or were not asked for: the
    utterance's time is shared by characters, in order, within it."""
    shown = cues(transcript([segment(READING, 2.0, timed=False) | {"end": 14.0}]))
    assert text_of(shown) == READING and len(shown) > 1
    assert shown[0].start == 2.0 and shown[-1].end == 14.0
    assert all(2.0 <= c.start < c.end <= 14.0 for c in shown) and all(a.end <= b.start for a, b in zip(shown, shown[1:]))


def test_a_word_longer_than_a_line_or_a_cue_gets_its_own():
    long_word = "Pneumonoultramicroscopicsilicovolcanoconiosis-like"
    shown = cues(transcript([segment(f"It was {long_word} indeed.", 0.0, step=0.3)]))
    assert text_of(shown) == f"It was {long_word} indeed." and any(long_word in c.lines for c in shown)
    slow = cues(transcript([segment("Well then.", 0.0, step=9.0)]))
    assert [c.lines for c in slow] == [("Well",), ("then.",)]


def test_a_speakers_label_counts_in_its_cues_first_line():
    """SRT shows ``[channel 1] `` before a cue of a call: a reader sees it, so it takes room."""
    call = transcript([segment("Thank you for calling.", 0.0)], [segment(READING, 2.0, utterance=1, step=0.2)])
    labelled = cues(call, labelled=True)
    for cue in labelled:
        assert cue.lines[0].startswith(f"[{cue.speaker}] ") and all(len(line) <= 42 for line in cue.lines), cue.lines
    assert " ".join(" ".join(c.lines) for c in labelled if c.speaker == "channel 1").replace("[channel 1] ", "") == READING
    plain = cues(call)
    assert not any(line.startswith("[") for c in plain for line in c.lines)
    # Without its room, the label would have run the first line past 42 (what SRT showed before).
    assert any(len(f"[{c.speaker}] " + c.lines[0]) > 42 for c in plain)
