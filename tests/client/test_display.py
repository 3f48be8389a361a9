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
