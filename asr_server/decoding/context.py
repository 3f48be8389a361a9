"""The context pass: a channel's recent finals decoded again, together, as offline transcription would.

Whisper leans on context: an utterance decoded alone loses the sentences
around it (measured on held-out read speech: WER 0.085 alone vs 0.028 for
blocks of up to 20 s decoded together, equal to offline, and in less model
time per audio second). So after the first-pass finals, the decoder asks for
a decode of its latest finalized utterances joined with short gaps, with the
text before them as the prompt, and where the words differ from what the
client holds it sends a ``revision`` of the transcript from the first changed
utterance to the end of its finals.

Plain functions over :class:`Finalized` records; :class:`~.incremental.ChannelDecoder`
decides when to run one and applies the result.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher

import numpy as np

from ..audio.decode import MODEL_RATE
from ..inference.types import DecodeKind, DecodeRequest, Word
from .text import normalize_word

# A pass's words are taken only if they reach within this much of where the first pass's began and ended.
COVER_MARGIN_S = 0.6
# A hearing this many words shorter than the first pass always counts as one (a short first pass
# can split one word into several: "Babylon," as "Add it on."); see :func:`_fewest_words`.
SPLIT_WORDS = 2
# ... and a hearing with fewer words still counts where it spells about as many letters as the
# first pass: this share of them, less one word's worth (:func:`_spells_as_much`).
LETTER_SHARE = 0.8
WORD_LETTERS = 4
# A first pass whose words end this long before its utterance's audio does stopped short: Whisper
# ended the decode early and left speech unheard. Seen on a fast narration under noise (bench/
# heldout.py): one utterance held two sentences, its first pass gave the first alone, and no
# pass could restore the second, since its hearings had too many words against the first pass's.
SHORT_STOP_S = 2.0
# A settle decode does not change an utterance it heard less surely than the words the client
# holds: mean word probability more than this under theirs (:func:`surer_texts`). A settle decode
# is one hearing that decides for good, and on noisy speech it can hallucinate ("8, 6, 5, 6, 6,
# 6," for "and so long will the response take."). Over the 27 replays of bench/replay_matrix.py,
# of the 65 changes settle decodes made this way, 9 mended words and 31 made errors; with the
# rule, 39 fewer errors in 8226 words (13 replays better, 4 worse), pooled 0.176 -> 0.171 against
# 0.168 offline (docs/benchmarks.md, fortieth session). The margin was read off those replays.
SURER_MARGIN = 0.05
# The most words a second of speech holds (270 a minute, beyond fast talkers): the bound on a
# hearing of an utterance whose first pass is no yardstick (:attr:`Finalized.most_words`), and
# what makes a first pass one (:func:`crowded`).
MOST_WORDS_PER_S = 4.5
# A word heard near a seam between two utterances goes to the one whose first pass heard it,
# if it lies within this much of that utterance's audio (else to the one it lies in).
SEAM_S = 1.0
# At most this many words before a lookahead may be its opening words put before the seam
# (:func:`_ahead_opening`), when the decode's first words after the seam (up to
# AHEAD_OPENING_FOLLOW) go on from them as the lookahead's interim does.
AHEAD_OPENING_WORDS = 2
AHEAD_OPENING_FOLLOW = 2
# The most words, and seconds from its first word's start to its last one's end, of a first pass
# that a decode can hear as part of a neighbour's word (:func:`_heard_across`): a stretch cut out
# of a word said slowly ("dot asterisk", "five five five"), which a first pass may hear as a few
# short words ("I'll ask to ask."), not a sentence.
ACROSS_WORDS = 4
ACROSS_SPEECH_S = 1.5
# ... and how near the pieces must come to both ends of its first pass's words: all of it lies under them.
ACROSS_MARGIN_S = 0.2
# A word timed longer than this, or as starting after the word that follows it, was mistimed: the
# alignment lost its place (:func:`word_times`).
MISTIMED_WORD_S = 2.0
# What is left of a word to tell a respacing of the same letters from another wording (:func:`respaced`).
_HYPHENATED = re.compile(r"[^\w'-]+")

__all__ = [
    "ContextOptions", "before_ahead", "Finalized", "Span", "joint", "plan_window", "settle_window", "window_request", "split_words",
    "revised_texts", "window_words", "word_times", "retimed", "count_votes", "mark_heard", "heard_in", "reached", "trusted", "word_key", "repeats_itself", "looped", "crowded", "garbled", "respaced",
]


@dataclass(frozen=True)
class ContextOptions:
    enabled: bool = True
    # Audio one context decode covers: utterances plus gaps, within Whisper's 30 s window. The
    # whole 30 s was 0.3 points more accurate over 27 replays (0.176 -> 0.173), but its passes
    # cost 13-18% more and 8 streams' revision delay p95 rose from 9.3-9.6 s to 10.2-13.7 s,
    # past the 10 s target (docs/benchmarks.md, thirty-third session).
    window_s: float = 24.0
    # Of it, at most this much audio of utterances a pass already decided (acoustic context
    # before the new ones; the text before the window is its prompt either way). Without it
    # (0) a pass is cheaper and as accurate on clean audio, but worse under noise (pooled WER
    # 0.074 against 0.059 with pink noise 20 dB down; docs/benchmarks.md).
    back_s: float = 24.0
    # ... but at most this much while passes wait their turn behind others' (LoadSettings.late_context,
    # off unless GovernorOptions.late_context_s is set), on the lean window (the audio plus a pad):
    # they cost less and catch up. At 8 held-out streams on 2 cores, revision delay p95 13.0-15.9 ->
    # 9.8-11.6 s with none, for 2-3 points of WER after revisions there (0.180-0.205 -> 0.216-0.227);
    # with 8 s, 14.9-15.0 s, inside the spread (docs/benchmarks.md, thirty-eighth session). Since
    # late passes are prompted with all the text before them, the WER cost is within the runs'
    # spread; with 4 s held they cost a third more and came no sooner (fifty-seventh session).
    late_back_s: float = 0.0
    # Silence between joined utterances (the measurement above used 0.5 s) ...
    gap_s: float = 0.5
    # ... unless the pause between them was at most this long and the stream's own audio of
    # it is at hand: then they are joined as they were spoken, room tone and all, as offline
    # transcription hears them (a sentence cut from the next one mid-breath keeps its onset).
    # At hand is mostly 0.11 s of it (the final comes at the pause decode, before the endpoint),
    # so a longer pause gets the silence. The real audio of every pause up to 1 s, read from the
    # replayed recordings, made the replays worse clean (fixtures 0.046 -> 0.064, held-out set 2
    # 0.197 -> 0.254; docs/benchmarks.md, thirtieth session), so the silence stays.
    real_gap_s: float = 1.0
    # A pass runs once this much speech has been finalized since the last one (the utterance under
    # way counts too, once it may be the lookahead: ``ahead_s``) ...
    min_new_s: float = 5.0
    # ... or once the channel has been silent this long after its last final (a pause in talk).
    idle_s: float = 2.0
    # The newest final is decided only with a later one in the window (context on both sides,
    # as offline transcription has), unless the channel has been silent this long, or ended ...
    settle_s: float = 3.0
    # ... or the next utterance has this much audio so far: its first ``ahead_max_s`` go in the
    # window after the newest final as lookahead (heard, never decided), so a final need not
    # wait for the whole next sentence to end (0: wait for the next final). 8 streams in step on
    # 2 cores: context lag p95 11.7-11.9 -> 9.5-9.8 s, revision delay p95 11.2-11.8 -> 9.5-10.4 s;
    # with 2 s (up to 4 s) the lag fell as far, but a lookahead that short decided "old-sposed"
    # where the whole next sentence had fixed it, and later passes changed it 18 s after its
    # final (revision delay p95 18.7-19.2 s). WER after revisions in the replays the same on net
    # (-2.6 to +2.2 points by set and condition; docs/benchmarks.md, twenty-ninth session).
    ahead_s: float = 3.0
    ahead_max_s: float = 8.0
    # First-pass finals are quick (a shorter window) while the pass is on.
    quick_finals: bool = True
    # ... and while the server is loaded (its passes lean, since a final was late) they decode
    # as finals in a burst do: greedy on the burst window, a third of a quick final's model
    # time; the pass brings the accuracy back. 16 streams on 2 cores, four runs each: finals
    # p50 1.16-1.46 -> 0.73-0.77 s, p95 2.61-3.53 -> 1.95-2.78 s; WER after revisions the same,
    # the first pass 1-2 points worse; at 8 streams revisions may come later (docs/benchmarks.md,
    # fourteenth session).
    busy_finals: bool = True
    # Then each stretch of this much audio may be *settled*: decoded once more, whole, once the
    # passes have decided it and speech has gone on past it (or the stream ended), as offline
    # transcription decodes a recording, window after window, with the text before as the
    # prompt; its words decide the stretch for good (no pass changes it after). 0: never. It runs
    # only while the server has time to spare (LoadSettings.settle; GovernorOptions.spare_busy_low).
    # With 30, 27 replays went 0.176 -> 0.171 (offline 0.167; a fast recipe's sentences, where the
    # passes' votes split, gained most; docs/benchmarks.md, thirty-fourth session), and one
    # real-time stream of the held-out sets under noise 0.194 -> 0.180 and 0.338 -> 0.294 (offline
    # 0.190, 0.289), its revisions later. At 8 streams on 2 cores, where it ran whenever the
    # server was not loaded, revisions came later (p95 10.0-12.2 -> 13.6-21.6 s) for no better
    # transcript (it hears the LibriVox "ill-disposed" as offline does, "old-sposed", where the
    # votes had it right), so a busy server runs none (docs/benchmarks.md, thirty-sixth session).
    # A window's last utterance, heard with nothing after it, is left to the next window, which
    # starts with it (as offline transcription goes on from its last whole segment; at the close
    # the last window decides all): 27 replays 0.173 -> 0.169 (docs/benchmarks.md, thirty-seventh).
    settle_window_s: float = 30.0


@dataclass
class Finalized:
    """A finalized utterance with text, as the client holds it now."""

    index: int
    start: int  # stream sample where its audio starts
    audio: np.ndarray
    offset: int  # where its text starts in the channel's transcript
    text: str
    words: tuple[Word, ...]  # stream times
    # The stream's audio right after ``audio`` that no utterance holds (the pause the
    # chunker dropped before the endpoint), to join it to the next utterance as spoken.
    trail: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    # Its first pass was sampled (:attr:`Hypothesis.sampled`): the beam decode failed Whisper's
    # checks, and a sampled text can be a hallucination (a loop of words the audio does not hold),
    # so its number of words is no yardstick for a context decode's (see :attr:`doubtful`).
    sampled: bool = False
    # Wordings heard for it (:func:`word_key`) and by how many decodes: the first pass's, then
    # each context decode's that covered it as context or decided it (not as lookahead).
    votes: dict[tuple[str, ...], int] = field(default_factory=dict)
    # The first pass's wording (:func:`word_key`): its vote was heard without context.
    first_pass: tuple[str, ...] = ()
    # A context decode has heard it whole (:func:`heard_in`) in a window that decided it or held
    # it as context (:func:`mark_heard`). A pass decides at least one record even where Whisper
    # stopped before its end (:func:`reached`); such a record is decided unheard, and the first
    # window that hears it later decides it as a fresh one is decided (:func:`revised_texts`).
    heard: bool = False
    # A settle decode (:attr:`ContextOptions.settle_window_s`) has decided it for good.
    settled: bool = False
    # Its first pass heard no words at all in speech the VAD heard (and dropped none): an empty
    # final, kept so that a pass can hear it in context. Seen on a human voice over the phone in
    # real time: the prompt's last word, "PBX", said alone after a pause, was cut off as an
    # utterance of its own whose first pass heard nothing; no pass held its audio, and the
    # transcript at the close ended "...the asterisk open source." (bench/heldout.py --set 5).
    unheard: bool = False

    def __post_init__(self) -> None:
        if not self.votes and self.text:
            self.votes[word_key(self.text)] = 1
        if not self.first_pass and self.text:
            self.first_pass = word_key(self.text)

    @property
    def seconds(self) -> float:
        return len(self.audio) / MODEL_RATE

    @property
    def doubtful(self) -> bool:
        """Whether its first pass is no yardstick for a context decode's words: :attr:`garbled`, it
        :attr:`stopped_short`, or it heard nothing (:attr:`unheard`). A pass that decides it takes
        its own words as it heard them (not respaced as the first pass spaced them)."""
        return self.garbled or self.stopped_short or self.unheard

    @property
    def garbled(self) -> bool:
        """Whether its first pass was sampled, is :func:`crowded`, or is a loop that passed Whisper's checks
        (:func:`looped`; seen in the fresh-clone CI under a busy machine: "I'll be back
        around, and" three times and a half for "The quick brown fox jumps over the lazy dog",
        kept for good since the pass's 9 words were too few against 17)."""
        return garbled(self.text, self.seconds, self.sampled)

    @property
    def stopped_short(self) -> bool:
        """Whether its first pass's words end more than ``SHORT_STOP_S`` before its audio does
        (the audio ends a tail after the speech the VAD heard): Whisper left speech unheard."""
        return bool(self.words) and (self.start + len(self.audio)) / MODEL_RATE - self.words[-1].end > SHORT_STOP_S

    @property
    def most_words(self) -> float:
        """The most words a decode may hear in it: half as many again as its first pass, and
        where that is no yardstick (:attr:`doubtful`) as many as its audio can hold."""
        most = 1.5 * len(self.text.split()) + 2
        return max(most, MOST_WORDS_PER_S * len(self.audio) / MODEL_RATE) if self.doubtful else most

    def yardstick(self, heard: int) -> float:
        """The number of words a decode that heard ``heard`` words in it is measured against: its
        first pass's, or the decode's own where that is fewer and the first pass garbled (a loop
        can triple its words); for one that stopped short the decode's own where that is more, up
        to :attr:`most_words`, as for one that heard nothing (:attr:`unheard`)."""
        old = len(self.text.split())
        if self.garbled:
            return min(heard, old)
        if self.stopped_short or self.unheard:
            return min(max(heard, old), self.most_words)
        return old


@dataclass(frozen=True)
class Span:
    """Where a finalized utterance sits in a context window (seconds)."""

    index: int
    start: float
    end: float


def plan_window(done: Sequence[Finalized], options: ContextOptions, fresh: int | None = None, in_order: bool = False) -> list[Finalized]:
    """The latest finalized utterances that fit one window together (always at least the newest).

    ``fresh``: how many of the latest are not yet decided; of the ones before
    them, only ``back_s`` of audio is taken (None: no such limit). Where the fresh
    ones do not all fit, the newest of them are taken and the oldest left undecided
    by any pass; ``in_order``: the oldest are taken instead (as many as fit from the
    first fresh one on), and the window ends short of the newest, for the next one.
    """
    if in_order and fresh:
        first = len(done) - fresh
        end = _in_order_end(done, first, options)
        done, fresh = done[:end], end - first
    chosen: list[Finalized] = []
    total = back = 0.0
    for n, record in enumerate(reversed(done)):
        need = record.seconds + (len(joint(record, chosen[-1], options)) / MODEL_RATE if chosen else 0.0)
        if chosen and total + need > options.window_s:
            break
        if fresh is not None and n >= fresh:
            back += record.seconds
            if back > options.back_s:
                break
        chosen.append(record)
        total += need
    return chosen[::-1]


def _in_order_end(done: Sequence[Finalized], first: int, options: ContextOptions) -> int:
    """Where a window that starts with ``done[first]`` ends (exclusive): as many records on from
    it as fit ``window_s`` with what goes between them (always the first)."""
    total = done[first].seconds
    for k in range(first + 1, len(done)):
        total += len(joint(done[k - 1], done[k], options)) / MODEL_RATE + done[k].seconds
        if total > options.window_s:
            return k
    return len(done)


def settle_window(done: Sequence[Finalized], decided_to: int, options: ContextOptions, ending: bool) -> list[Finalized]:
    """The records the next settle decode covers: from the first one not settled, as many as fit
    ``settle_window_s`` together; none until they fill it (the record after them would not
    fit) or the stream is ``ending``, nor while one of them waits for a pass (index past
    ``decided_to``). It decides all but the last of them, unless ``ending`` or alone
    (:meth:`ChannelDecoder._dispatch_settle`)."""
    start = next((k for k, r in enumerate(done) if not r.settled), None)
    if not options.settle_window_s or start is None:
        return []
    chosen = [done[start]]
    total = chosen[0].seconds
    for record in done[start + 1 :]:
        total += len(joint(chosen[-1], record, options)) / MODEL_RATE + record.seconds
        if total > options.settle_window_s:
            break
        chosen.append(record)
    else:
        if not ending:
            return []
    return chosen if chosen[-1].index <= decided_to else []


def window_request(
    records: Sequence[Finalized], options: ContextOptions, language: str, prompt: str, lean: bool = False, gain_db: float = 0.0
) -> tuple[DecodeRequest, list[Span]]:
    """The records' audio, each :func:`joint` to the next, and each one's span in it (``lean``:
    a pass under load, on the runner's lean window, the audio plus a pad; ``gain_db``: the talker's)."""
    pieces: list[np.ndarray] = []
    spans: list[Span] = []
    position = 0
    for before, record in zip([None, *records], records):
        if before is not None:
            gap = joint(before, record, options)
            pieces.append(gap)
            position += len(gap)
        spans.append(Span(record.index, position / MODEL_RATE, (position + len(record.audio)) / MODEL_RATE))
        pieces.append(record.audio)
        position += len(record.audio)
    audio = np.concatenate(pieces).astype(np.float32, copy=False)
    request = DecodeRequest(audio, DecodeKind.CONTEXT, language=language, prompt=prompt, word_timestamps=True, short_window=lean, pack=False, gain_db=gain_db)
    return request, spans


def joint(before: Finalized, after: Finalized, options: ContextOptions) -> np.ndarray:
    """What goes between two records in a window: the stream's audio between them when they
    were at most ``real_gap_s`` apart and it is at hand, else ``gap_s`` of silence."""
    pause = after.start - (before.start + len(before.audio))
    if 0 <= pause <= min(len(before.trail), options.real_gap_s * MODEL_RATE):
        return before.trail[:pause]
    return np.zeros(int(options.gap_s * MODEL_RATE), np.float32)


def split_words(words: Sequence[Word], spans: Sequence[Span], texts: Sequence[str] | None = None) -> list[list[Word]]:
    """Each word to the span it belongs to: by its time (the span holding its middle, or in a
    gap the nearer edge), or, given the spans' first-pass ``texts``, to the span whose
    first-pass word it matches, when that span is near it (within ``SEAM_S``).

    The match settles words at a seam: a word said in the pause between two utterances (or
    cut in two by the boundary) goes to the utterance that already holds it, so it is neither
    lost from one nor given to both. A word the model wrote in pieces (" 3" and ",800": a
    piece without a space before it) stays whole, with its first piece, and is matched whole
    ("3,800" against a first pass's "3,800"; piece by piece, " 3" matched nothing, went by
    time to the next utterance, and the two utterances each held "3,800" in the long-form
    reading's revised transcript).
    """
    times = word_times(words)
    by_time = [min(range(len(spans)), key=lambda j: _distance(t, spans[j])) for t in times]
    if texts is not None and words:  # no words (the guards dropped a loop): nothing to match
        starts, wholes = _whole_words(words)
        for n, j in _matched_spans(wholes, texts).items():
            k = starts[n]
            if _distance(times[k], spans[j]) <= SEAM_S:
                by_time[k] = j
    for k in range(1, len(words)):
        if not _opens_word(words, k):  # the rest of the word before (",800" after " 3")
            by_time[k] = by_time[k - 1]
    out: list[list[Word]] = [[] for _ in spans]
    for w, j in zip(words, by_time, strict=True):
        out[j].append(w)
    return out


def before_ahead(words: Sequence[Word], start: float, ahead_text: str = "") -> tuple[Word, ...]:
    """The words a decode heard before a lookahead that starts at ``start`` (window seconds): a word
    whose middle lies in the lookahead goes, with the pieces written after it (",800" after " 3").
    Not left to :func:`split_words`: its seam rule gives a word near a seam to the utterance whose
    first-pass text holds it at the aligned place, and the lookahead has no first pass to hold its
    own words (the next utterance's first word went to the one before so, in a test).

    Given the lookahead's latest interim (``ahead_text``), the words just before the seam that are
    its opening words go too, where the words after the seam go on from them (:func:`_ahead_opening`)."""
    out: list[Word] = []
    keep = True
    times = word_times(words)
    for k, w in enumerate(words):
        if _opens_word(words, k):
            keep = times[k] < start
        if keep:
            out.append(w)
    return tuple(out[: len(out) - _ahead_opening(out, words[len(out) :], times[: len(out)], ahead_text, start)])


def _ahead_opening(kept: Sequence[Word], dropped: Sequence[Word], times: Sequence[float], ahead_text: str, start: float) -> int:
    """How many of the ``kept`` pieces at the end are the lookahead's opening words, timed before its
    start: the last one to :data:`AHEAD_OPENING_WORDS` whole words of ``kept``, within ``SEAM_S`` of
    ``start``, are the first words of the lookahead's interim ``ahead_text``, and the first ``dropped``
    words are the interim's next ones. Whisper's alignment can put a sentence's first word in the
    pause before it; kept, it was decided into the utterance before, and the next one's final held
    it too. Seen in real time, a ringback tone in the pause: "Press 3 to re-record your message.
    After" then "After the tone, say your name..." (docs/benchmarks.md, eighty-third session)."""
    said = [w for w in map(normalize_word, ahead_text.split()) if w]
    starts, wholes = _whole_words(kept)
    heard_next = [normalize_word(w) for w in "".join(w.word for w in dropped).split()][:AHEAD_OPENING_FOLLOW]
    for n in range(1, min(AHEAD_OPENING_WORDS, len(starts)) + 1):
        follow = said[n : n + len(heard_next)]
        if wholes[-n:] == said[:n] and follow and heard_next[: len(follow)] == follow and times[starts[-n]] >= start - SEAM_S:
            return len(kept) - starts[-n]
    return 0


def word_times(words: Sequence[Word]) -> list[float]:
    """Where each word lies (window seconds): its middle, or, for a mistimed word (longer than
    ``MISTIMED_WORD_S``, or starting after the next word starts), the middle of the stretch between
    the well-timed words around it. Seen in a 26 s decode of the LibriVox reading under noise:
    "have" timed over 6.5 s and "been" at the window's end, so "been" went to the next sentence
    ("he might have made still more respectable than he was. Been He might even...")."""
    bad = _mistimed(words)
    out: list[float] = []
    for k, w in enumerate(words):
        if not bad[k]:
            out.append((w.start + w.end) / 2)
            continue
        before = next((words[i].end for i in range(k - 1, -1, -1) if not bad[i]), None)
        after = next((words[i].start for i in range(k + 1, len(words)) if not bad[i]), None)
        known = [t for t in (before, after) if t is not None]
        out.append(sum(known) / len(known) if known else (w.start + w.end) / 2)
    return out


def _mistimed(words: Sequence[Word]) -> list[bool]:
    """Per word, whether the alignment lost its place there: timed longer than ``MISTIMED_WORD_S``, or
    starting after the next word starts."""
    return [w.end - w.start > MISTIMED_WORD_S or (k + 1 < len(words) and w.start > words[k + 1].start) for k, w in enumerate(words)]


def retimed(words: Sequence[Word]) -> tuple[Word, ...]:
    """``words`` as clients get them: each mistimed one (:func:`_mistimed`) moved into the stretch
    between the well-timed words around it (a run of them shares it evenly; with none after, at the
    end of the one before), so that no word a client aligns or highlights is timed over seconds or
    out of order. Seen: "have" from 22.04 to 28.52 s before "been" at 22.04 s, in a settle decode of
    the LibriVox reading."""
    bad = _mistimed(words)
    out = list(words)
    k = 0
    while k < len(words):
        if not bad[k]:
            k += 1
            continue
        j = next((i for i in range(k, len(words)) if not bad[i]), len(words))
        after = words[j].start if j < len(words) else None
        lo = words[k - 1].end if k else (after if after is not None else words[k].start)
        lo = lo if after is None else min(lo, after)
        step = ((after if after is not None else lo) - lo) / (j - k)
        for i in range(k, j):
            out[i] = replace(words[i], start=round(lo + (i - k) * step, 3), end=round(lo + (i - k + 1) * step, 3))
        k = j
    return tuple(out)


def _whole_words(words: Sequence[Word]) -> tuple[list[int], list[str]]:
    """Where each whole word begins in ``words`` (its first piece, :func:`_opens_word`), and each
    whole word's pieces joined and normalized. No words, no whole words: a decode that heard
    nothing, or a pass whose every word lay in its lookahead (that case once closed a session
    with an internal error, a word's end being taken where no word began)."""
    starts = [k for k in range(len(words)) if _opens_word(words, k)]
    ends = [*starts[1:], len(words)] if starts else []
    return starts, [normalize_word("".join(w.word for w in words[a:b])) for a, b in zip(starts, ends, strict=True)]


def _opens_word(words: Sequence[Word], k: int) -> bool:
    """Whether ``words[k]`` begins a whole word: the model writes one in pieces (" 3", ",800"), and
    each piece after the first has no space before it."""
    return k == 0 or words[k].word[:1].isspace()


def _matched_spans(heard: list[str], texts: Sequence[str]) -> dict[int, int]:
    """Heard word -> the span whose first-pass text has it at the aligned place (same words,
    or a substitution of as many words)."""
    labels = [(normalize_word(x), j) for j, text in enumerate(texts) for x in text.split()]
    old = [word for word, _ in labels]
    out: dict[int, int] = {}
    for op, i1, i2, j1, j2 in SequenceMatcher(a=old, b=heard, autojunk=False).get_opcodes():
        if op == "equal" or (op == "replace" and i2 - i1 == j2 - j1):
            out.update({j1 + n: labels[i1 + n][1] for n in range(j2 - j1)})
    return out


def _distance(t: float, span: Span) -> float:
    return 0.0 if span.start <= t <= span.end else min(abs(t - span.start), abs(t - span.end))


def revised_texts(
    records: Sequence[Finalized], groups: Sequence[Sequence[Word]], spans: Sequence[Span], fresh_from: int, decide_to: int
) -> list[tuple[str, tuple[Word, ...]]]:
    """Per record, its text and words (window times) after a context decode (``groups``: the
    decode's words per record, :func:`split_words`; check :func:`trusted` first).

    Only records with index from ``fresh_from`` to ``decide_to`` are decided
    now: the ones before are in the window as context (a pass already decided
    them), the ones after as lookahead (decided by a later pass, with context
    after them too). What the decode heard in each record's span
    (:func:`heard_in`) counts as one vote for that wording in the record's
    :attr:`Finalized.votes` (the first pass's text holds one from the start; a
    window of one record alone does not count its present wording); count them with
    :func:`count_votes` before calling this. Wordings that differ only in how
    their letters are spaced into words count as one (:func:`respaced`), and
    keep the spacing the record has.

    A record being decided takes the decode's words, spaced as it holds them where
    they spell the same letters (:func:`respaced`; not where it is
    :attr:`Finalized.doubtful`, as a sampled first pass is: a text that failed
    Whisper's checks at beam search, as likely a loop as a hearing). They used to
    be merged with the first pass's, each differing stretch going to the pass that
    heard it more confidently; taken whole, the replays over 27 takes
    (``bench/replay_matrix.py``: three sets, three conditions, three speeds) had 31
    fewer errors in 8226 words, fewer in 16 replays and more in 6: a first pass is
    heard without context, and Whisper's word probabilities do not tell its mistakes
    from the pass's fixes (docs/benchmarks.md, thirty-second session). A record
    decided before changes only to a wording at least two decodes heard
    and more decodes than its present one (one unlucky window can decide a
    record wrong: the next ones, which hear it in the middle of their window,
    outvote it), or as many where its present one is the first pass's, whose
    vote was heard without context (:func:`_outvotes`); but one that no decode has
    heard yet (:attr:`Finalized.heard`: the pass that decided it stopped short of it) is
    decided as a fresh one is. A record keeps what it had when the decode gave it no words
    or a very different number of them, or words that stop short of its audio
    (Whisper can skip or cut an utterance at a window's edge).
    """
    out: list[tuple[str, tuple[Word, ...]]] = []
    for record, group, span, around in zip(records, groups, spans, _neighbours(groups), strict=True):
        heard = heard_in(record, group, span, around)
        if heard is None or record.index > decide_to or record.settled:
            out.append((record.text, ()))
        elif record.index < fresh_from and record.heard:
            outvoted = _outvotes(record, word_key(heard))
            out.append(_spelled(respaced(window_words(record, span), group)) if outvoted else (record.text, ()))
        else:
            out.append(_spelled(respaced(() if record.doubtful else window_words(record, span), group)))
    return out


def surer_texts(records: Sequence[Finalized], groups: Sequence[Sequence[Word]], texts: Sequence[tuple[str, tuple[Word, ...]]]) -> list[tuple[str, tuple[Word, ...]]]:
    """``texts`` (a settle decode's :func:`revised_texts`), less each change to a record whose
    present words the decode heard less surely: the mean probability of its words there is more
    than :data:`SURER_MARGIN` under that of the words the record holds."""
    return [
        (record.text, ()) if text != record.text and _less_sure(record, group) else (text, words)
        for record, group, (text, words) in zip(records, groups, texts, strict=True)
    ]


def _less_sure(record: Finalized, group: Sequence[Word]) -> bool:
    """Whether a decode heard ``record`` (its words there: ``group``) less surely than the words
    it holds; never where those are no yardstick (:attr:`Finalized.doubtful`)."""
    if not group or not record.words or record.doubtful:
        return False
    return _mean_probability(group) < _mean_probability(record.words) - SURER_MARGIN


def _mean_probability(words: Sequence[Word]) -> float:
    return sum(w.probability for w in words) / len(words)


def _spelled(words: tuple[Word, ...]) -> tuple[str, tuple[Word, ...]]:
    """The text the words spell (one space between words), and the words."""
    return " ".join("".join(w.word for w in words).split()), words


def window_words(record: Finalized, span: Span) -> tuple[Word, ...]:
    """The record's words (stream times) in the times of a window where it sits at ``span``."""
    shift = span.start - record.start / MODEL_RATE
    return tuple(replace(w, start=w.start + shift, end=w.end + shift) for w in record.words)


def _outvotes(record: Finalized, heard: tuple[str, ...]) -> bool:
    """Whether ``heard`` takes the place of the wording a decided record holds: heard at least
    twice and more often; or as often, where the wording held is the first pass's (one of its
    votes was heard without context, all of ``heard``'s with it). Measured with
    ``bench/replay_bench.py`` (2026-11-25, seventh session, oneDNN's int8 kernels): the LibriVox
    reading's first "ill-disposed" tied two against two and stayed "old-sposed" (0.042; 0.014
    with this rule), and the long-form reading under noise lost a word so (0.022; 0.011)."""
    held, heard = _hearing(record, word_key(record.text)), _hearing(record, heard)
    votes, against = record.votes.get(heard, 0), record.votes.get(held, 0)
    if votes < 2 or heard == held:
        return False
    return votes > against or (votes == against and held == record.first_pass)


def count_votes(records: Sequence[Finalized], groups: Sequence[Sequence[Word]], spans: Sequence[Span], decide_to: int, ahead: bool = False) -> None:
    """Add to each record's votes what a context decode heard in its span, where that is to be
    trusted (:func:`heard_in`). Call once per decode, and only for a :func:`trusted` one;
    ``decide_to``: the last record it decides.

    The lookahead (the window's last record, after ``decide_to``: nothing after it in the
    window, and left to the next pass for that reason) gets no vote. Heard at the edge it is
    heard as a first pass hears it, without what follows; counted, a wording the window's
    edge gave it and the next window repeated decided it outright, two votes, where one
    hearing with context after it was all there was. Measured with ``bench/replay_bench.py``
    (2026-11-25, fourth session): the espeak voice's "The weather today is sunny with a light
    green" became "The winner today is sunny when the light's green" that way (0.176; 0.118
    without lookahead votes, offline 0.137), pooled after revisions clean 0.051 -> 0.043, under
    noise 0.069 -> 0.061, in the room 0.097 -> 0.094, the load streams 0.105 -> 0.096 (lean
    passes: 0.111 both); no recording worse anywhere.

    A window that holds one utterance alone adds no vote for the wording the utterance holds
    now: it hears the audio the first pass heard, cut at the same places, with nothing around
    it, so its agreement is not a second hearing (measured on the call under noise: "How can I
    help you to make?" held two votes so, and the two later windows that heard "today" with
    the sentences after it could not outvote it). A different wording it hears does count,
    as before (dropping that too delayed revisions: a later window then had to wait for the
    other party's turn before two windows could outvote). ``ahead``: the window held the next
    utterance's first seconds after ``records`` (:attr:`ContextOptions.ahead_s`), so no record is alone."""
    for n, (record, group, span, around) in enumerate(zip(records, groups, spans, _neighbours(groups), strict=True)):
        heard = heard_in(record, group, span, around)
        lookahead = len(spans) > 1 and n == len(spans) - 1 and record.index > decide_to
        if heard is None or lookahead:
            continue
        key = _hearing(record, word_key(heard))
        if len(spans) > 1 or ahead or key != _hearing(record, word_key(record.text)):
            record.votes[key] = record.votes.get(key, 0) + 1


def mark_heard(records: Sequence[Finalized], groups: Sequence[Sequence[Word]], spans: Sequence[Span], decide_to: int) -> None:
    """Note which records a trusted decode heard (:attr:`Finalized.heard`): those up to ``decide_to``
    it gave words :func:`heard_in` takes. Call after :func:`revised_texts`.

    Seen on the long-form reading: the pass deciding "Its history for the next 1500 years or more
    is obscure." stopped after "or more" (Whisper ends a window early at times), so it kept the
    first pass's "It's" unheard; the next window heard "Its" whole, but as one vote against the
    first pass's one it could not outvote it (a decided record needs two). Now that window
    decides it as it decides a fresh one."""
    for record, group, span, around in zip(records, groups, spans, _neighbours(groups), strict=True):
        if record.index <= decide_to and heard_in(record, group, span, around) is not None:
            record.heard = True


def reached(records: Sequence[Finalized], groups: Sequence[Sequence[Word]], spans: Sequence[Span], fresh_from: int, decide_to: int) -> int:
    """The last record a decode may decide: ``decide_to``, but none of the records after the
    last one it gave words to or heard as part of a word given to another (:func:`_heard_across`;
    Whisper can stop before the end of a window: the records it never reached are left to the
    next pass), and always ``fresh_from`` (each pass decides at least one record, so passes
    cannot repeat themselves)."""
    around = _neighbours(groups)
    heard = [r.index for r, g, span, near in zip(records, groups, spans, around, strict=True) if g or _heard_across(r, span, near)]
    return max(fresh_from, min(decide_to, heard[-1] if heard else fresh_from))


def trusted(records: Sequence[Finalized], groups: Sequence[Sequence[Word]], fresh_from: int, decide_to: int) -> bool:
    """Whether a decode holds about as many words as the first pass over the records it decides
    (far fewer or far more: a loop, or a lost stretch). Two words fewer always pass, as in
    :func:`heard_in`."""
    fresh = [(r, g) for r, g in zip(records, groups, strict=True) if fresh_from <= r.index <= decide_to]
    old_words = sum(r.yardstick(len(g)) for r, g in fresh)
    new_words = sum(len(g) for _, g in fresh)
    return new_words > 0 and _fewest_words(old_words, 0.6) <= new_words <= 1.6 * old_words + 2


def heard_in(record: Finalized, group: Sequence[Word], span: Span, around: Sequence[Word] = ()) -> str | None:
    """The text a decode heard in ``record``'s span (``group``: its words there), or None where it
    is not to be trusted: no words (but "" where its audio lies under the pieces of a
    neighbour's word: :func:`_heard_across`), a very different number of words than the first
    pass, or words that stop short of the audio the first pass's words reached. Two words fewer always
    pass: a short first pass can split one word into several (the long-form reading in the room:
    "Babylon," as "Add it on."), and 0.8 of its words less one would have left it so for good;
    so do fewer words that spell about as many letters (:func:`_spells_as_much`).

    ``around``: the decode's words given to the other records. One of them that lies in this
    span (a word said across the seam, given to the record whose first pass holds it or to
    the word it continues) shows that the decode heard that stretch: the words there moved
    to the neighbour, they were not lost. (Seen on the long-form reading: the pass heard
    "as early as 3,800 BC", ",800" went with " 3" to the first utterance though it lay where
    the next one's first pass had "1800", and that one kept its "1800 B.C." for good, as
    if the pass had dropped its first word: "3,800 1800 B.C.". Matching words in pieces
    whole now gives the number to the next utterance there; the rule holds wherever a piece
    still goes with its first one across a seam.)"""
    text, _ = _spelled(tuple(group))
    old = len(record.text.split())
    fewest = 1 if record.garbled else _fewest_words(old, 0.8, less=1)
    if not group:
        return "" if _heard_across(record, span, around) else None
    inside = [w for w in around if _distance((w.start + w.end) / 2, span) == 0.0]
    words = _words(text)
    enough = fewest <= len(words) or _spells_as_much(record, words)
    if not enough or len(words) > record.most_words or not _covers([*group, *inside], span, record):
        return None
    return text


def _spells_as_much(record: Finalized, words: Sequence[str]) -> bool:
    """Whether a hearing of ``record`` with fewer words than :func:`heard_in` takes spells about as
    many letters as its first pass (:data:`LETTER_SHARE`, less :data:`WORD_LETTERS`): a first pass
    can mishear a few long words as many short ones. Seen on a human voice over the phone in a
    reverberant room: "Using your touchtone keypad." came first as "You think you're touched on
    who keep at?" (8 words, 31 letters); every pass heard the 4 words (24 letters) and none was
    taken, so the utterance kept its first pass for good (bench/heldout.py --set 5)."""
    return len("".join(words)) >= LETTER_SHARE * len("".join(_words(record.text))) - WORD_LETTERS


def _heard_across(record: Finalized, span: Span, around: Sequence[Word]) -> bool:
    """Whether a decode that gave ``record`` no words heard its audio as part of a neighbour's word
    (``around``: the neighbours' words): one the model wrote in pieces across the seams, pieces
    without a space before them over the span, reaching as far as the first pass's words did at
    both ends (within ``ACROSS_MARGIN_S``), over a short first pass (``ACROSS_WORDS``,
    ``ACROSS_SPEECH_S``). Then the record holds no words of its own. Seen on a human voice
    reading an address slowly ("visit w w w dot asterisk dot org"): the first pass made three
    utterances of it ("www." "Pastorisk." ".org."), every pass heard " www" ".asterisk" ".org."
    as one word given to the first, and the other two kept their first pass for good:
    "www.asterisk.org. Pastorisk. .org." (bench/heldout.py --set 5)."""
    if not 0 < len(record.text.split()) <= ACROSS_WORDS or (record.words and record.words[-1].end - record.words[0].start > ACROSS_SPEECH_S):
        return False
    pieces = [w for w in around if not w.word[:1].isspace() and w.start < span.end and w.end > span.start]
    return bool(pieces) and _covers(pieces, span, record, ACROSS_MARGIN_S)


def crowded(text: str, seconds: float) -> bool:
    """Whether ``text`` holds more words than ``seconds`` of speech can (``MOST_WORDS_PER_S``): Whisper
    wrote words the audio does not hold. Seen on a bulletin in a reverberant room: "the roof of the
    650, so it is slightly stable, but it is very hot in here." (17 words in 3.5 s) where every pass
    heard "the river is expected to reach its highest level by Wednesday morning." (12 words), and
    12 were too few against 17 to be taken (docs/benchmarks.md, seventy-fifth session)."""
    return len(text.split()) > MOST_WORDS_PER_S * seconds


def garbled(text: str, seconds: float, sampled: bool) -> bool:
    """Whether a first pass's ``text`` (of ``seconds`` of audio; ``sampled``: :attr:`Hypothesis.sampled`)
    is no yardstick for a pass's words, nor a prompt: sampled, a loop, or crowded (:attr:`Finalized.garbled`)."""
    return sampled or looped(text) or crowded(text, seconds)


def _fewest_words(old: int, share: float, less: float = 0.0) -> float:
    """The fewest words a decode may hear where the first pass heard ``old``: ``share`` of them less
    ``less``, but never more than :data:`SPLIT_WORDS` short."""
    return min(share * old - less, old - SPLIT_WORDS)


def _neighbours(groups: Sequence[Sequence[Word]]) -> list[list[Word]]:
    """For each group, the words of the groups next to it (the ones a seam shares), passing over
    groups with none (a word in pieces can lie across two seams: :func:`_heard_across`)."""
    def near(k: int, step: int) -> Sequence[Word]:
        k += step
        while 0 <= k < len(groups) and not groups[k]:
            k += step
        return groups[k] if 0 <= k < len(groups) else ()

    return [[*near(k, -1), *near(k, 1)] for k in range(len(groups))]


def repeats_itself(text: str, times: int = 3, shortest: int = 2) -> bool:
    """Whether a run of ``shortest`` or more words comes ``times`` times back to back: a decoding loop
    (speech seldom says one phrase three times over; a single word repeated is not counted)."""
    words = _words(text)
    for size in range(shortest, len(words) // times + 1):
        for start in range(len(words) - size * times + 1):
            run = words[start : start + size]
            if all(words[start + k * size : start + (k + 1) * size] == run for k in range(1, times)):
                return True
    return False


def looped(text: str) -> bool:
    """Whether ``text`` is a decoding loop: a run of two words or more three times back to back
    (:func:`repeats_itself`), or one of three or more twice. Whisper also writes a whole sentence
    twice for one said once: a first pass of the long-form reading gave "It was about 2250 BC. It was
    about 2250 BC." for 2.3 s of "It was about 2250 BC", and since every pass heard half its words,
    too few against it, the transcript kept it for good (forty-fifth session; the reading raised to
    -10 dBFS). Speech seldom says a phrase of three words twice in a row."""
    return repeats_itself(text) or repeats_itself(text, times=2, shortest=3)


def word_key(text: str) -> tuple[str, ...]:
    """A wording as votes count it: the words, without case or punctuation."""
    return tuple(_words(text))


def _hearing(record: Finalized, key: tuple[str, ...]) -> tuple[str, ...]:
    """The wording among ``record``'s votes that spells ``key``'s letters (``key`` if none): one
    hearing written with its words spaced two ways ("mud huts", "mudhuts") counts as one."""
    letters = "".join(key)
    return next((k for k in record.votes if "".join(k) == letters), key)


def respaced(held: Sequence[Word], new: Sequence[Word]) -> tuple[Word, ...]:
    """``new``, except where a stretch of its words spells the same letters as the ``held`` words
    at that place, spaced apart differently: there the held words stay. The acoustics are the
    same either way, so such a change is no better hearing, only a revision the reader sees
    for nothing (seen on the long-form reading: first pass "mud huts", passes "mudhuts")."""
    a, b = [normalize_word(w.word) for w in held], [normalize_word(w.word) for w in new]
    out: list[Word] = []
    for op, i1, i2, j1, j2 in SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        out += held[i1:i2] if _respelling(op, held[i1:i2], new[j1:j2]) else new[j1:j2]
    return tuple(out)


def _respelling(op: str, old: Sequence[Word], new: Sequence[Word]) -> bool:
    """Whether a differing stretch is the same letters spaced apart differently (a hyphen counts as
    a letter here: "ill disposed" -> "ill-disposed" is punctuation the pass may mend, as it does
    commas and capitals)."""
    return op == "replace" and _letters(old) == _letters(new)


def _letters(words: Sequence[Word]) -> str:
    return "".join(_HYPHENATED.sub("", w.word.lower()) for w in words)


def _covers(heard: Sequence[Word], span: Span, record: Finalized, margin: float = COVER_MARGIN_S) -> bool:
    """Whether the decode's words reach as far into the utterance's audio as the first pass's did,
    within ``margin`` (Whisper can stop early at the end of a window and drop the last words)."""
    if not record.words or not heard:
        return True
    base = record.start / MODEL_RATE
    return max(w.end for w in heard) - span.start >= record.words[-1].end - base - margin and \
        min(w.start for w in heard) - span.start <= record.words[0].start - base + margin


def _words(text: str) -> list[str]:
    return [w for w in (normalize_word(x) for x in text.split()) if w]
