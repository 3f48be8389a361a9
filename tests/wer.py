"""Word error rate with a small English normalizer (shared by tests and bench).

What it forgives, on both sides alike: case, punctuation, hyphens, whole numbers under a million
written as digits ("112" is "one hundred twelve", and the "and" in "one hundred and twelve" is
dropped; "$2,000" is "two thousand dollars"; a year the reference says, "fifteen ninety", is
what "1590" in the hypothesis reads as), ordinals written as digits ("16th" is "sixteenth"),
British spelling ("neighbours" is "neighbors"), a few abbreviations, contractions ("you're"
counts as "you are"; ``'s`` stays, since it may be a possessive), and the spacing of compounds
("voice mail" against "voicemail", where both parts have at least :data:`COMPOUND_PART` letters).
Whisper's own English normalizer expands contractions the same way and respells British words
too (from a word list, where ours goes by endings); the compounds are ours (the reference scripts
and the model split them differently, and no listener would call it a wrong word)."""

from __future__ import annotations

import re
from collections.abc import Sequence

_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_NUMBER_WORDS = frozenset(_ONES) | frozenset(_TENS[2:])
_ABBREV = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint", "ok": "okay"}
_CONTRACTED = {"won't": "will not", "can't": "can not", "cannot": "can not", "shan't": "shall not", "let's": "let us", "i'm": "i am"}
_ENDINGS = (("n't", " not"), ("'re", " are"), ("'ll", " will"), ("'ve", " have"), ("'d", " would"), ("'m", " am"))
COMPOUND_PART = 3
_ORDINAL_DIGITS = re.compile(r"(\d+)(?:st|nd|rd|th)")
_ORDINAL_WORDS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}
# British endings and their American spelling, each with enough letters before it that a short
# word stays itself ("four" is not "for", "filled" not "filed").
_SPELLINGS = tuple((re.compile(a), b) for a, b in (
    (r"(?<=\w{3})our(s|ed|ing|ite|ites|able|ably|er|ers|ful|less)?$", r"or\1"),  # neighbour, colour, favourite
    (r"(?<=\w{2})([tbg])re(s)?$", r"\1er\2"),  # centre, metre, fibre, meagre
    (r"(?<=\w{4})is(e|es|ed|ing|ation|ations)$", r"iz\1"),  # realise, organisation
    (r"(?<=\w{3})ys(e|es|ed|ing)$", r"yz\1"),  # analyse
    (r"(?<=\w{2}[ae])ll(ed|ing|er|ers)$", r"l\1"),  # travelled, cancelling
    (r"(?<=\w{4})ogue(s)?$", r"og\1"),  # catalogue, dialogue
    (r"(?<=\w{2})(fen|cen|ten)ce(s)?$", r"\1se\2"),  # defence, licence, pretence
))
_SPELLED = {"grey": "gray", "programme": "program", "programmes": "programs", "aluminium": "aluminum", "judgement": "judgment", "ageing": "aging", "pyjamas": "pajamas"}


def _number(n: int) -> str:
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    for size, name in ((1000, "thousand"), (100, "hundred")):
        if size <= n < 1000 * size:
            rest = n % size
            return f"{_number(n // size)} {name}" + ("" if rest == 0 else " " + _number(rest))
    return str(n)


def _year(n: int) -> str | None:
    """How ``n`` is said as a year ("fifteen ninety", "nineteen oh five", "nineteen hundred",
    "twenty twenty four"), where that differs from the number; None where it does not."""
    if not (1100 <= n <= 1999 or 2010 <= n <= 2099):
        return None
    century, rest = divmod(n, 100)
    said = "hundred" if rest == 0 else f"oh {_ONES[rest]}" if rest < 10 else _number(rest)
    return f"{_number(century)} {said}"


def _holds(words: Sequence[str], run: list[str]) -> bool:
    return any(list(words[i : i + len(run)]) == run for i in range(len(words) - len(run) + 1))


def normalize(text: str, spoken: Sequence[str] = ()) -> list[str]:
    """``text`` as words to compare. A number written in digits that ``spoken`` (the other side's
    words) says as a year is read as that year ("1590" as "fifteen ninety"), else as a number."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)  # 3,800 -> 3800
    text = re.sub(r"\$(\d+)\b", r"\1 dollars", text)  # $2000 -> 2000 dollars
    text = re.sub(r"\b([a-z])\.", r"\1", text)  # b.c. -> bc
    text = re.sub(r"[^\w' ]+", " ", text)
    words: list[str] = []
    for w in text.split():
        words.extend(_read(w.strip("'"), spoken))
    return _without_number_and(words)


def _read(w: str, spoken: Sequence[str]) -> list[str]:
    """One written word as the words said: a number or an ordinal in digits spelled out, an
    abbreviation or a contraction expanded, a British spelling as the American one."""
    ordinal = _ORDINAL_DIGITS.fullmatch(w)
    if ordinal:
        return _ordinal(_number(int(ordinal.group(1)))).split()
    if w.isdigit():
        year = (_year(int(w)) or "").split()
        return year if year and _holds(spoken, year) else _number(int(w)).split()
    return [_american(x) for x in _expanded(_ABBREV.get(w, w))] if w else []


def _ordinal(said: str) -> str:
    """A number's words as the ordinal ("twenty one" -> "twenty first")."""
    head, _, last = said.rpartition(" ")
    last = _ORDINAL_WORDS.get(last) or (last[:-1] + "ieth" if last.endswith("y") else last + "th")
    return f"{head} {last}".strip()


def _american(word: str) -> str:
    """``word`` in American spelling where a British one differs by a regular ending ("neighbours",
    "centre", "realise", "travelled", "catalogue", "defence"); the same on both sides, so that the
    references' British spelling and the model's American one are the same word."""
    for pattern, replacement in _SPELLINGS:
        word = pattern.sub(replacement, word)
    return _SPELLED.get(word, word)


def _without_number_and(words: list[str]) -> list[str]:
    """``words`` less each "and" between "hundred" or "thousand" and a number word ("one hundred
    and twelve" is said both ways)."""
    return [w for i, w in enumerate(words)
            if not (w == "and" and 0 < i < len(words) - 1 and words[i - 1] in ("hundred", "thousand") and words[i + 1] in _NUMBER_WORDS)]


def _expanded(word: str) -> list[str]:
    if word in _CONTRACTED:
        return _CONTRACTED[word].split()
    for ending, full in _ENDINGS:
        if word.endswith(ending) and len(word) > len(ending):
            return (word[: -len(ending)] + full).split()
    return [word]


def _joined(words: list[str], other: list[str]) -> list[str]:
    """``words`` with each pair of neighbours that ``other`` writes as one word (both parts of
    at least COMPOUND_PART letters) joined into it."""
    vocabulary, out, i = set(other), [], 0
    while i < len(words):
        pair = words[i] + words[i + 1] if i + 1 < len(words) else ""
        if pair in vocabulary and min(len(words[i]), len(words[i + 1])) >= COMPOUND_PART:
            out.append(pair)
            i += 2
        else:
            out.append(words[i])
            i += 1
    return out


def errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """Word errors in ``hypothesis`` against ``reference``, and the reference's word count."""
    ref = normalize(reference)
    hyp = normalize(hypothesis, ref)
    return edit_distance(_joined(ref, hyp), _joined(hyp, ref)), len(ref)


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def wer(reference: str, hypothesis: str) -> float:
    wrong, words = errors(reference, hypothesis)
    return wrong / max(1, words)
