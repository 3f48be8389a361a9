"""Subtitle cues from a session's transcript: what SRT and WebVTT show, and when. No I/O.

A transcript has a segment per utterance, and an utterance can run 20 s and 200 characters
(a reader's long sentence) or half a second and one word ("Babylon."). A player shows a cue
whole, so a cue per utterance is a wall of text for one and a flash for the other. A cue here
is at most ``lines`` lines of ``line_chars`` characters (two of 42 by default, the usual
limit for broadcast subtitles), shown for at most ``max_s`` seconds, and for at least
``min_s`` unless the speaker's next cue comes sooner.

A channel's words, each with its time (the segment's ``words`` when they are its words, else
the segment's time shared out by characters), make runs: a speaker's next utterance joins the
run when it follows within ``join_gap_s`` and no one else began to speak meanwhile, so a
call's turns stay apart and in the order they were spoken. A run is cut into the cues that
cost a reader least: few, evenly filled (not a full cue and a scrap), and ending at a
sentence's end where they can, else at a comma, rather than mid-phrase. A cue's lines are as
even as its words allow. A speaker's label shown before a cue's text (``[caller] ``, SRT's with
several channels) is counted in its first line.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

__all__ = ["CueOptions", "Cue", "cues"]

SENTENCE_ENDS = (".", "?", "!", "…")
PAUSES = (",", ";", ":", "—")
ABBREVIATIONS = frozenset({"mr.", "mrs.", "ms.", "dr.", "st.", "vs.", "e.g.", "i.e.", "etc.", "no.", "mt.", "jr.", "sr.", "prof."})
# What :func:`_cost` charges: each cue, the room it leaves empty, and ending one after a comma or
# mid-phrase (after a sentence: nothing). Chosen by reading the cues of nine recordings
# (docs/benchmarks.md, sixty-second session): with the room weighed double, a reading's long
# sentences ran across cues rather than leave one a third full.
CUE_COST = 0.15
EMPTY_COST = 0.5  # times the share of a cue's room left empty, squared
PAUSE_BREAK_COST = 0.1
PHRASE_BREAK_COST = 0.3


@dataclass(frozen=True)
class CueOptions:
    line_chars: int = 42  # a line's characters at most (a longer word has a line of its own)
    lines: int = 2  # a cue's lines at most
    max_s: float = 7.0  # a cue's time on screen at most (a word longer than that: its own)
    min_s: float = 1.0  # ... and at least, unless the speaker's next cue starts sooner
    join_gap_s: float = 1.5  # a speaker's next utterance may join a cue when it starts within this


@dataclass(frozen=True)
class Cue:
    start: float
    end: float
    speaker: str
    lines: tuple[str, ...]  # with the speaker's label before the first, when asked for


@dataclass(frozen=True)
class _Word:
    text: str
    start: float
    end: float
    opens: bool  # the first word of its segment (an utterance)


def cues(transcript: dict[str, Any], options: CueOptions = CueOptions(), labelled: bool = False) -> list[Cue]:
    """Every channel's cues (``transcript`` as :func:`asr_server.transcript.build_transcript`
    makes it), in time order; ``labelled``: each cue's first line starts with ``[speaker]``."""
    starts = {c["channel"]: [s["start"] for s in c["segments"]] for c in transcript["channels"]}
    out: list[Cue] = []
    for channel in transcript["channels"]:
        others = sorted(t for ch, ts in starts.items() if ch != channel["channel"] for t in ts)
        label = f"[{channel['speaker']}]" if labelled else ""
        groups = _pack(_words(channel["segments"]), others, options, label)
        out.extend(_timed(groups, channel["speaker"], options, label))
    return sorted(out, key=lambda cue: (cue.start, cue.end))


def _words(segments: list[dict[str, Any]]) -> list[_Word]:
    out: list[_Word] = []
    for segment in segments:
        texts = segment["text"].split()
        words = segment.get("words") or []
        if len(words) == len(texts):
            times = [(float(w["start"]), float(w["end"])) for w in words]
        else:
            times = _shared(texts, float(segment["start"]), float(segment["end"]))
        out.extend(_Word(text, a, max(a, b), i == 0) for i, (text, (a, b)) in enumerate(zip(texts, times)))
    return out


def _shared(texts: list[str], start: float, end: float) -> list[tuple[float, float]]:
    """Times for words that have none of their own: the segment's time shared by characters."""
    total = sum(len(t) + 1 for t in texts) - 1
    span = max(0.0, end - start)
    out, at = [], 0
    for text in texts:
        out.append((start + span * at / max(1, total), start + span * (at + len(text)) / max(1, total)))
        at += len(text) + 1
    return out


def _pack(words: list[_Word], others: list[float], options: CueOptions, label: str) -> list[list[_Word]]:
    """The channel's words in runs that may share cues (:func:`_apart`), each run cut into cues
    by :func:`_cut_run` (``label``: shown before each cue's words)."""
    groups: list[list[_Word]] = []
    run: list[_Word] = []
    for word in words:
        if run and _apart(run, word, others, options):
            groups.extend(_cut_run(run, options, label))
            run = []
        run.append(word)
    if run:
        groups.extend(_cut_run(run, options, label))
    return groups


def _apart(run: list[_Word], word: _Word, others: list[float], options: CueOptions) -> bool:
    """Whether ``word`` starts another utterance that may not share a cue with ``run``: it starts
    too long after, or someone else began speaking since the run began."""
    if not word.opens:
        return False
    if word.start - run[-1].end > options.join_gap_s:
        return True
    k = bisect.bisect_right(others, run[0].start)  # the first of the others' starts after the run's
    return k < len(others) and others[k] <= word.start


def _cut_run(words: list[_Word], options: CueOptions, label: str) -> list[list[_Word]]:
    """The cues of a run of words: of all the ways to cut it into cues that fit, the cheapest
    (:func:`_cost`), found by dynamic programming over where each cue ends."""
    lead = len(label) + 1 if label else 0  # a cue's characters before its words
    ends = [0]  # ends[k]: the characters of the first k words, a space after each
    for word in words:
        ends.append(ends[-1] + len(word.text) + 1)
    best = [0.0] + [float("inf")] * len(words)
    back = [0] * (len(words) + 1)
    for j in range(1, len(words) + 1):
        for i in range(j - 1, -1, -1):
            if i < j - 1 and not _fits(words, i, j, lead + ends[j] - ends[i] - 1, options, label):
                break  # taking in more words never fits again
            cost = best[i] + _cost(lead + ends[j] - ends[i] - 1, words[j - 1].text, j == len(words), options)
            if cost < best[j]:
                best[j], back[j] = cost, i
    cuts = [len(words)]
    while cuts[-1] > 0:
        cuts.append(back[cuts[-1]])
    cuts.reverse()
    return [words[a:b] for a, b in zip(cuts, cuts[1:])]


def _fits(words: list[_Word], i: int, j: int, chars: int, options: CueOptions, label: str) -> bool:
    """Whether ``words[i:j]`` after ``label`` (``chars`` characters with their spaces) fit one cue."""
    if words[j - 1].end - words[i].start > options.max_s or chars > options.lines * options.line_chars:
        return False
    return chars <= options.line_chars or len(_wrap(_texts(words[i:j], label), options.line_chars)) <= options.lines


def _texts(words: list[_Word], label: str) -> list[str]:
    """What a cue shows, word by word: the label (when there is one) first."""
    return ([label] if label else []) + [w.text for w in words]


def _cost(chars: int, last_word: str, last: bool, options: CueOptions) -> float:
    """What a cue of ``chars`` characters costs a reader: a cue more to read, room left empty
    (squared, so that a run's cues come out even rather than full ones and a scrap), and, unless
    it ends its run, ending where the words run on: nothing after a sentence end, a little after
    a comma or the like, most mid-phrase."""
    empty = max(0.0, 1 - chars / (options.lines * options.line_chars))
    return CUE_COST + EMPTY_COST * empty * empty + (0.0 if last else _break_cost(last_word))


def _break_cost(text: str) -> float:
    if text.endswith(SENTENCE_ENDS) and text.lower() not in ABBREVIATIONS:
        return 0.0
    if text.endswith(PAUSES):
        return PAUSE_BREAK_COST
    return PHRASE_BREAK_COST


def _wrap(texts: list[str], width: int) -> list[str]:
    """Words in lines of at most ``width`` characters, filled in order (a longer word alone)."""
    rows: list[str] = []
    for text in texts:
        if rows and len(rows[-1]) + 1 + len(text) <= width:
            rows[-1] += " " + text
        else:
            rows.append(text)
    return rows


def _lines(texts: list[str], options: CueOptions) -> tuple[str, ...]:
    """A cue's lines: as few as ``line_chars`` allows, and as even as its words allow (the
    narrowest width that still takes them in that many)."""
    fewest = _wrap(texts, options.line_chars)
    narrowest = -(-len(" ".join(texts)) // len(fewest))
    for width in range(narrowest, options.line_chars):
        rows = _wrap(texts, width)
        if len(rows) <= len(fewest):
            return tuple(rows)
    return tuple(fewest)


def _timed(groups: list[list[_Word]], speaker: str, options: CueOptions, label: str) -> list[Cue]:
    out = []
    for k, group in enumerate(groups):
        start, end = group[0].start, group[-1].end
        after = groups[k + 1][0].start if k + 1 < len(groups) else float("inf")
        end = max(end, min(start + options.min_s, after))
        out.append(Cue(round(start, 3), round(end, 3), speaker, _lines(_texts(group, label), options)))
    return out
