"""The terminal display applies revisions: what a person sees ends up as the server's transcript."""

import io

from asr_client.cli import Display


class Tty(io.StringIO):
    def isatty(self):
        return True


def screen(raw: str) -> list[str]:
    """A tiny terminal: \\r, clear-line, cursor up N lines + clear-below, newlines, dim markers."""
    import re

    lines, col = [""], 0
    tokens = re.split(r"(\x1b\[\d*[A-Za-z]|\r|\n)", raw)
    for tok in tokens:
        if not tok:
            continue
        if tok == "\r":
            col = 0
        elif tok == "\n":
            lines.append("")
            col = 0
        elif tok == "\x1b[K":
            lines[-1] = lines[-1][:col]
        elif tok.endswith("F"):
            n = int(tok[2:-1])
            del lines[len(lines) - n - 1 :]
            lines.append("")
            col = 0
        elif tok == "\x1b[J" or tok.startswith("\x1b["):
            continue
        else:
            lines[-1] = lines[-1][:col] + tok
            col += len(tok)
    return [line for line in lines if line]


def test_a_revision_on_a_terminal_redraws_the_finals_it_changed():
    out = Tty()
    d = Display(out)
    d.show({"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "And so it began."})
    d.show({"type": "final", "channel": 0, "utterance": 1, "offset": 17, "text": "He was not an old-sposed young man."})
    d.show({"type": "final", "channel": 0, "utterance": 2, "offset": 53, "text": "Unless to be cold."})
    d.show({"type": "interim", "channel": 0, "utterance": 3, "offset": 72, "text": "Had he", "stable": 0})
    d.show({"type": "revision", "channel": 0, "utterances": [1, 2], "offset": 17,
            "text": "He was not an ill-disposed young man. Unless to be cold."})
    d.show({"type": "final", "channel": 0, "utterance": 3, "offset": 73, "text": "Had he married."})
    assert screen(out.getvalue()) == [
        "And so it began.", "He was not an ill-disposed young man. Unless to be cold.", "Had he married.",
    ]


def test_a_pipe_gets_first_pass_finals_one_per_line():
    out = io.StringIO()
    d = Display(out)
    d.show({"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "ten of clubs"})
    d.show({"type": "revision", "channel": 0, "utterances": [0, 0], "offset": 0, "text": "10 of clubs"})
    assert out.getvalue() == "ten of clubs\n"


def test_a_revision_from_inside_a_line_an_earlier_revision_joined_rewrites_that_line():
    """The server's second revision may start at an utterance the first one merged into a line
    (seen with the LibriVox reading: revisions [1, 4] then [2, 4]); the line keeps its words
    before the revision's offset and the screen shows each word once."""
    out = Tty()
    d = Display(out)
    finals = ["And so it began.", "He was not an old supposed young man.", "Unless to be cold, is to be ill.", "Had he married."]
    offset = 0
    for n, text in enumerate(finals):
        d.show({"type": "final", "channel": 0, "utterance": n, "offset": offset, "text": text})
        offset += len(text) + 1
    first = "He was not an ill-disposed young man. Unless to be cold is to be ill. Had he married."
    d.show({"type": "revision", "channel": 0, "utterances": [1, 3], "offset": 17, "text": first})
    second = "Unless to be cold, is to be ill. Had he married a more amiable woman."
    d.show({"type": "revision", "channel": 0, "utterances": [2, 3], "offset": 17 + 38, "text": second})
    assert screen(out.getvalue()) == ["And so it began.", "He was not an ill-disposed young man. " + second]


def _segments(pieces: list[tuple[int, str]], offset: int) -> list[dict]:
    """A revision's ``segments`` for its pieces of text, one per utterance with text, from ``offset``."""
    out = []
    for utterance, piece in pieces:
        if piece:
            out.append({"utterance": utterance, "offset": offset, "start": float(utterance), "end": utterance + 0.5})
            offset += len(piece) + 1
    return out


def test_with_segments_a_call_keeps_a_line_per_turn_in_the_order_spoken():
    """A revision of the caller's two turns rewrites each turn's line in place; the agent's turn
    between them stays between them."""
    out = Tty()
    d = Display(out, channels=2)
    d.show({"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "I lost my card."})
    d.show({"type": "final", "channel": 1, "utterance": 0, "offset": 0, "text": "Sorry to hear."})
    d.show({"type": "final", "channel": 0, "utterance": 1, "offset": 16, "text": "Yet today."})
    d.show({"type": "final", "channel": 1, "utterance": 1, "offset": 15, "text": "Your name?"})
    pieces = [(0, "I lost my card,"), (1, "yesterday.")]
    d.show({"type": "revision", "channel": 0, "utterances": [0, 1], "offset": 0, "text": "I lost my card, yesterday.", "segments": _segments(pieces, 0)})
    assert screen(out.getvalue()) == ["[ch0] I lost my card,", "[ch1] Sorry to hear.", "[ch0] yesterday.", "[ch1] Your name?"]


def test_what_a_terminal_shows_is_the_transcript_after_every_message():
    """Random finals and revisions on two channels, each revision from an utterance boundary or
    from inside a line an earlier revision joined, with ``segments`` (a line per utterance, kept
    in the order the finals came) or without (a server from before them): the screen, line by
    line per channel, joins up to :class:`Transcript`'s final text (the rule the server and the
    other clients apply). Some finals are empty, and some revisions give an empty one words or
    leave an utterance with none (the server does both): with ``segments`` each utterance's line
    appears, or goes, in its place."""
    import random

    from asr_client import Transcript

    rng = random.Random(7)
    words = "ten of clubs queen of hearts two of spades the quick brown fox jumps over a lazy dog".split()
    for run in range(400):
        out, t = Tty(), Transcript()
        with_segments = run % 2 == 0
        order: list[tuple[int, int]] = []  # (channel, utterance) of the finals, as they came
        said: dict[tuple[int, int], str] = {}  # each utterance's text now
        d = Display(out, channels=2)
        starts: dict[int, list[int]] = {0: [], 1: []}  # where each channel's utterances start
        utterance = {0: 0, 1: 0}
        for _ in range(rng.randint(1, 14)):
            ch = rng.randint(0, 1)
            text = " ".join(rng.choices(words, k=rng.randint(1, 9))) if rng.random() > 0.15 else ""
            held = t.final_text(ch)
            if starts[ch] and rng.random() < 0.4:
                # A revision covers utterance k to the latest, a piece of text each (none for some; the last has one).
                k = rng.randrange(len(starts[ch]))
                offset = starts[ch][k]
                pieces = [" ".join(rng.choices(words, k=rng.randint(1, 5))) if rng.random() > 0.15 else "" for _ in range(k, utterance[ch])]
                pieces[-1] = pieces[-1] or "dog"
                text = " ".join(p for p in pieces if p)
                message = {"type": "revision", "channel": ch, "utterances": [k, utterance[ch] - 1], "offset": offset, "text": text}
                if with_segments:
                    message["segments"] = _segments(list(zip(range(k, utterance[ch]), pieces)), offset)
                starts[ch][k:] = [offset + sum(len(p) + 1 for p in pieces[:i] if p) for i in range(len(pieces))]
                said.update({(ch, u): p for u, p in zip(range(k, utterance[ch]), pieces)})
            else:
                offset = len(held) + 1 if held else 0
                message = {"type": "final", "channel": ch, "utterance": utterance[ch], "offset": offset, "text": text}
                starts[ch].append(offset)
                order.append((ch, utterance[ch]))
                said[(ch, utterance[ch])] = text
                utterance[ch] += 1
            t.apply(message)
            d.show(message)
            shown = screen(out.getvalue())
            for c in (0, 1):
                mine = [line[len(f"[ch{c}] "):] for line in shown if line.startswith(f"[ch{c}] ")]
                assert " ".join(mine) == t.final_text(c), (c, shown)
                turns = t.turns(c)  # the library's turns hold the same text, a turn per line
                assert " ".join(turn.text for turn in turns) == t.final_text(c)
                if with_segments:
                    assert [turn.text for turn in turns] == mine
            if with_segments:  # a line per utterance with text, in the order their finals came
                assert [line[:5] for line in shown] == [f"[ch{c}]" for c, u in order if said[(c, u)]]
                assert [line[6:] for line in shown] == [said[key] for key in order if said[key]]


def test_a_pipe_counts_the_printed_lines_a_revision_changed_afterwards():
    out = io.StringIO()
    d = Display(out)
    d.show({"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "ten of clubs"})
    d.show({"type": "final", "channel": 0, "utterance": 1, "offset": 13, "text": ""})  # empty: never printed
    d.show({"type": "final", "channel": 0, "utterance": 2, "offset": 13, "text": "four of close"})
    assert d.outdated == 0
    d.show({"type": "revision", "channel": 0, "utterances": [0, 2], "changed": [0, 1], "offset": 0, "text": "10 of clubs. Five."})
    assert d.outdated == 1  # the empty final's new words were never on the page
    d.show({"type": "revision", "channel": 0, "utterances": [0, 2], "changed": [0, 2], "offset": 0, "text": "10 of clubs. Five. Four of clubs."})
    assert d.outdated == 2  # each line once, however often it changed
    assert out.getvalue() == "ten of clubs\nfour of close\n"  # what was printed stays as it was


def test_a_terminal_rewrites_revised_lines_and_counts_none_as_outdated():
    d = Display(Tty())
    d.show({"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "ten of clubs"})
    d.show({"type": "revision", "channel": 0, "utterances": [0, 0], "changed": [0], "offset": 0, "text": "10 of clubs"})
    assert d.outdated == 0
