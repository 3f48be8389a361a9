"""The chunker: smoothed VAD frames in, utterance boundaries out.

An utterance opens on the first speech frame (with up to ``preroll_ms`` of
the audio before it, so a soft first syllable is not clipped) and ends when:

* ``endpoint_ms`` of trailing silence has passed (reason ``endpoint``); the
  utterance keeps ``tail_ms`` of that silence and drops the rest. Once the
  talking has lasted ``long_utterance_s`` (counted across cuts into
  continuations, and across pauses shorter than ``talk_pause_ms``), a pause
  of ``long_endpoint_ms`` is enough: in continuous reading or a monologue
  the pauses between sentences are often shorter than the endpoint, and
  without this the final would wait for ``max_utterance_s``;
* it reaches ``max_utterance_s``: it is cut in the middle of the longest
  pause in its second half, or at its quietest frame, and the next utterance
  continues from there (reason ``max_length``);
* the caller splits it (:meth:`Chunker.split`) where a sentence ends inside
  it: cut in the middle of the quietest stretch of the span it names, and the
  next utterance continues from there (reason ``sentence``);
* the caller ends it (``finalize`` or ``end_of_stream``).

Before an endpoint there is always an :class:`UtterancePaused` once the
trailing silence reaches ``tail_ms``: the audio up to its ``end`` is exactly
what the final will hold if the speaker does not resume, so a decode can
start early (see :mod:`asr_server.decoding.incremental`).

A pause too short for that (the learned detector heard a frame or two as not
speech, and the speaker went on) is kept as a dip once speech resumes. In a
reverberant room the echo fills the 0.2-0.3 s a speaker leaves between two
sentences, and such a dip is all the VAD hears of it; a split may cut at one
(see :meth:`Chunker.split`).

All positions are sample indices at 16 kHz from the start of the stream.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

import numpy as np

from .decode import MODEL_RATE
from .vad import FRAME_SAMPLES, VadFrame

__all__ = [
    "EndReason",
    "ChunkerOptions",
    "UtteranceStarted",
    "UtteranceAudio",
    "UtterancePaused",
    "UtteranceEnded",
    "ChunkEvent",
    "Chunker",
]


class EndReason(str, enum.Enum):
    ENDPOINT = "endpoint"
    MAX_LENGTH = "max_length"
    SENTENCE = "sentence"
    FINALIZE = "finalize"
    END_OF_STREAM = "end_of_stream"


@dataclass(frozen=True)
class ChunkerOptions:
    endpoint_ms: int = 500
    max_utterance_s: float = 20.0
    preroll_ms: int = 300
    # Silence kept after speech, and when the pause decode starts. Measured on the
    # fixtures: 100 ms is as accurate as 150-350 ms and starts the final decode sooner.
    tail_ms: int = 100
    # The max-length cut looks in this last share of the utterance: for the middle
    # of its longest non-speech stretch, or failing that its quietest frame.
    cut_search_fraction: float = 0.5
    # An utterance this long ends at a pause this short (when shorter than endpoint_ms).
    # 200 ms, not 250: under noise and reverberation the VAD hears a 0.3 s pause between two
    # read sentences as 0.2 s (its probability decays slower), and with 250 ms those finals
    # waited for the next pause or a split: long-form reading with pink noise 20 dB down,
    # decodes instant, p95 1.37 -> 0.70 s, in the room 1.37 -> 0.76 s; after revisions the
    # same WER there, one word more clean ("3,800" as "three 800"; docs/benchmarks.md).
    long_utterance_s: float = 6.0
    long_endpoint_ms: int = 200
    # The talking goes on across a pause shorter than this (one that ended an utterance):
    # long_utterance_s counts from where it began.
    talk_pause_ms: int = 1000

    @property
    def endpoint_samples(self) -> int:
        return self.endpoint_ms * MODEL_RATE // 1000

    def endpoint_after(self, length: int) -> int:
        """Silence (samples) that ends an utterance ``length`` samples long."""
        if length >= self.long_utterance_s * MODEL_RATE:
            return min(self.endpoint_samples, self.long_endpoint_ms * MODEL_RATE // 1000)
        return self.endpoint_samples

    @property
    def tail_samples(self) -> int:
        return min(self.tail_ms, self.endpoint_ms) * MODEL_RATE // 1000

    @property
    def max_samples(self) -> int:
        return int(self.max_utterance_s * MODEL_RATE)


@dataclass(frozen=True)
class UtteranceStarted:
    utterance: int
    start: int
    # Where speech was detected; equals ``start`` for a continuation after a max-length cut.
    speech_at: int
    continuation: bool = False
    # Where the talking it belongs to began (across cuts and short pauses; None: at ``start``).
    talk_start: int | None = None


@dataclass(frozen=True)
class UtteranceAudio:
    """Audio appended to the open utterance, contiguous with what came before."""

    utterance: int
    samples: np.ndarray
    voiced: int = 0  # how many of these samples the VAD called speech


@dataclass(frozen=True)
class UtterancePaused:
    utterance: int
    end: int


@dataclass(frozen=True)
class UtteranceEnded:
    utterance: int
    end: int
    reason: EndReason


ChunkEvent = UtteranceStarted | UtteranceAudio | UtterancePaused | UtteranceEnded


class _State(enum.Enum):
    IDLE = "idle"
    SPEECH = "speech"


class Chunker:
    """Feed :class:`VadFrame` lists; get :data:`ChunkEvent` lists back."""

    def __init__(self, options: ChunkerOptions = ChunkerOptions(), origin: int = 0, first_utterance: int = 0) -> None:
        """``origin``: the stream sample the first frame fed starts at; ``first_utterance``: the
        index of the first utterance (a channel that listens afresh part-way through its stream)."""
        self.options = options
        self._state = _State.IDLE
        self._preroll: deque[VadFrame] = deque(maxlen=max(1, options.preroll_ms * MODEL_RATE // 1000 // FRAME_SAMPLES))
        self._utterance = first_utterance
        self._start = origin
        # Where the talking began: a cut utterance's continuation keeps it, and so does an
        # utterance that starts within ``talk_pause_ms`` of the last one's speech.
        self._talk_start = origin
        self._talked = False
        self._position = origin
        self._last_speech_end = origin
        self._silence = 0
        self._paused = False
        self._energy: list[tuple[int, float, bool]] = []  # (frame start, rms, speech) of the open utterance
        self._dip: tuple[int, float] | None = None  # a dip under way: its quietest frame's middle, and rms
        # The dips of the open utterance (where a split may cut), as _dip: speech resumed after frames the
        # learned detector did not hear as speech, too few for a pause (no UtterancePaused came).
        self._dips: list[tuple[int, float]] = []

    @property
    def in_speech(self) -> bool:
        return self._state is _State.SPEECH

    def feed(self, frames: list[VadFrame]) -> list[ChunkEvent]:
        events: list[ChunkEvent] = []
        for frame in frames:
            self._position = frame.end
            if self._state is _State.IDLE:
                self._idle_frame(frame, events)
            else:
                self._speech_frame(frame, events)
        return events

    def end(self, reason: EndReason) -> list[ChunkEvent]:
        """Close the open utterance now (client ``finalize`` or end of stream)."""
        if self._state is _State.IDLE:
            return []
        end = min(self._last_speech_end + self.options.tail_samples, self._position)
        return [self._close(end, reason)]

    def split(self, utterance: int, lo: int, hi: int, pause_ms: int = 0, at: int | None = None, dips: bool = False) -> list[ChunkEvent]:
        """End the open ``utterance`` in the quietest stretch of frames starting in ``[lo, hi]``
        (stream samples) and continue it in the next one: a sentence ended there and the
        speaker went on. With ``pause_ms``, only at a pause: in the middle of the longest run of
        non-speech frames in the span if one is that long; else, with ``dips``, at the quietest
        dip of the utterance in it (see the module's docstring); else in an energy valley
        (:func:`_valley`: reverberation can hide a pause from the learned detector too).

        The cut is in the middle of the stretch, so that each side keeps some of the pause
        (a word that starts right at the cut is easily lost). With ``at`` (a point inside the
        span, where a pause decode ended), the cut is exactly there instead when its frame is
        not speech and belongs to a run of non-speech frames ``pause_ms`` long: the audio
        before the cut is then the audio that decode heard. Nothing happens (``[]``) when
        ``utterance`` is no longer open, or no frame of it with speech after it starts in the
        span, or (with ``pause_ms``) the span holds no such pause.
        """
        if self._state is _State.IDLE or utterance != self._utterance:
            return []
        frames = [f for f in self._energy if self._may_cut(f[0], lo, hi)]
        if not frames:
            return []
        if at is not None and _in_pause(frames, at, pause_ms * MODEL_RATE // 1000):
            return self._continue_at(at, EndReason.SENTENCE)
        if pause_ms <= 0:
            return self._continue_at(_middle_of_quietest(frames), EndReason.SENTENCE)
        length, middle = _longest_run([not f[2] for f in frames], latest=False)
        if length * FRAME_SAMPLES >= pause_ms * MODEL_RATE // 1000:
            return self._continue_at(frames[middle][0], EndReason.SENTENCE)
        dipped = [d for d in self._dips if self._may_cut(d[0], lo, hi)] if dips else []
        if dipped:
            return self._continue_at(min(dipped, key=lambda d: d[1])[0], EndReason.SENTENCE)
        valley = _valley(frames, self._energy)
        return [] if valley is None else self._continue_at(valley, EndReason.SENTENCE)

    def _may_cut(self, at: int, lo: int, hi: int) -> bool:
        """Whether a split may cut the open utterance at ``at``: in ``[lo, hi]``, after its start, with speech after it."""
        return lo <= at <= hi and self._start < at < self._last_speech_end

    def _idle_frame(self, frame: VadFrame, events: list[ChunkEvent]) -> None:
        if not frame.speech:
            self._preroll.append(frame)
            return
        earlier = list(self._preroll)
        self._preroll.clear()
        self._state = _State.SPEECH
        self._start = earlier[0].start if earlier else frame.start
        if not self._talked or frame.start - self._last_speech_end >= self.options.talk_pause_ms * MODEL_RATE // 1000:
            self._talk_start = self._start
        self._talked = True
        self._energy = [(f.start, f.rms, False) for f in earlier]
        self._dip, self._dips = None, []
        self._last_speech_end = frame.end
        self._silence = 0
        self._paused = False
        speech_at = frame.onset if frame.onset is not None else frame.start
        events.append(UtteranceStarted(self._utterance, self._start, max(self._start, speech_at), talk_start=self._talk_start))
        audio = np.concatenate([f.samples for f in earlier] + [frame.samples])
        events.append(UtteranceAudio(self._utterance, audio, voiced=len(frame.samples)))
        self._energy.append((frame.start, frame.rms, True))

    def _speech_frame(self, frame: VadFrame, events: list[ChunkEvent]) -> None:
        opts = self.options
        events.append(UtteranceAudio(self._utterance, frame.samples, voiced=len(frame.samples) if frame.speech else 0))
        self._energy.append((frame.start, frame.rms, frame.speech))
        if frame.speech:
            self._last_speech_end = frame.end
            self._silence = 0
            self._paused = False
        else:
            self._silence += len(frame.samples)
        # The shorter pause ends continuous speech, however it was cut into utterances.
        if self._silence >= opts.endpoint_after(self._last_speech_end - self._talk_start):
            events.append(self._close(self._last_speech_end + opts.tail_samples, EndReason.ENDPOINT))
            return
        if self._silence >= opts.tail_samples and not self._paused:
            self._paused = True
            self._dip = None  # a pause, not a dip: the pause decode hears it
            events.append(UtterancePaused(self._utterance, self._last_speech_end + opts.tail_samples))
        if not self._paused:
            self._track_dip(frame)
        if frame.end - self._start >= opts.max_samples:
            self._cut(events)

    def _track_dip(self, frame: VadFrame) -> None:
        """Follow frames the learned detector did not hear as speech; when it hears speech again
        (and no pause came), keep the dip at the middle of the quietest of them."""
        if frame.learned is None:
            return
        if not frame.learned:
            if self._dip is None or frame.rms < self._dip[1]:
                self._dip = (frame.start + FRAME_SAMPLES // 2, frame.rms)
        elif self._dip is not None:
            self._dips.append(self._dip)
            self._dip = None

    def _cut(self, events: list[ChunkEvent]) -> None:
        events.extend(self._continue_at(self._quietest_point(), EndReason.MAX_LENGTH))

    def _continue_at(self, cut: int, reason: EndReason) -> list[ChunkEvent]:
        ended = UtteranceEnded(self._utterance, cut, reason)
        self._utterance += 1
        self._start = cut
        self._energy = [f for f in self._energy if f[0] >= cut]
        self._dips = [d for d in self._dips if d[0] >= cut]
        self._dip = None
        self._last_speech_end = max(self._last_speech_end, cut)
        self._paused = False
        return [ended, UtteranceStarted(self._utterance, cut, cut, continuation=True, talk_start=self._talk_start)]

    def _quietest_point(self) -> int:
        """Where to cut: the middle of the longest pause in the recent part, else its quietest frame."""
        frames = self._energy
        first = max(1, int(len(frames) * (1 - self.options.cut_search_fraction)))
        length, middle = _longest_run([not f[2] for f in frames[first:]], latest=True)
        if length >= 2:
            return frames[first + middle][0]
        best_at, best = frames[-1][0], (float("inf"), float("inf"))
        for i in range(first, len(frames)):
            window = [e for _, e, _ in frames[max(0, i - 1) : i + 2]]
            level = (sum(window) / len(window), frames[i][1])  # ties go to the quieter frame itself
            if level <= best:  # among equals, the latest: fewer, longer pieces
                best_at, best = frames[i][0], level
        return best_at

    def _close(self, end: int, reason: EndReason) -> UtteranceEnded:
        event = UtteranceEnded(self._utterance, end, reason)
        self._utterance += 1
        self._state = _State.IDLE
        self._preroll.clear()
        self._energy = []
        self._dip, self._dips = None, []
        return event


# A valley in the energy that counts as a pause for a split, where reverberation hides it from the
# VAD: frames this far under the level of the utterance's speech frames (their 90th percentile),
# this many in a row. Measured on the room of bench/stream_bench.py --room (RT60 0.5 s, room tone
# 35 dB down): a 0.2-0.3 s pause between two sentences leaves 60 ms 30-42 dB under it. Inside
# sentences such valleys come mostly at commas, and a split looks only near a sentence end the
# words show. Under pink noise 20 dB below the speech no 60 ms goes 30 dB under (26-29 dB at
# most, fixtures and held-out recordings), so there the VAD's pauses decide, as before.
VALLEY_DB = 30.0
VALLEY_FRAMES = 2
VALLEY_LEVEL_FRAMES = 10  # speech frames needed to know the level


def _valley(frames: list[tuple[int, float, bool]], utterance: list[tuple[int, float, bool]]) -> int | None:
    """The start of the middle frame of the longest run of at least ``VALLEY_FRAMES`` frames in
    ``frames`` that are all ``VALLEY_DB`` under the level of ``utterance``'s speech frames (the
    90th percentile of their RMS); None when there is no such run or too little speech to say."""
    speech = [rms for _, rms, spoken in utterance if spoken]
    if len(speech) < VALLEY_LEVEL_FRAMES:
        return None
    floor = float(np.percentile(speech, 90)) * 10 ** (-VALLEY_DB / 20)
    length, middle = _longest_run([f[1] <= floor for f in frames], latest=False)
    return frames[middle][0] if length >= VALLEY_FRAMES else None


def _in_pause(frames: list[tuple[int, float, bool]], at: int, least: int) -> bool:
    """Whether sample ``at`` lies in a non-speech frame of ``frames`` whose run of non-speech
    frames is at least ``least`` samples long."""
    hit = [i for i, f in enumerate(frames) if f[0] <= at < f[0] + FRAME_SAMPLES]
    if not hit or frames[hit[0]][2]:
        return False
    first = last = hit[0]
    while first > 0 and not frames[first - 1][2]:
        first -= 1
    while last + 1 < len(frames) and not frames[last + 1][2]:
        last += 1
    return (last - first + 1) * FRAME_SAMPLES >= least


def _middle_of_quietest(frames: list[tuple[int, float, bool]]) -> int:
    """The start of the middle frame of the longest run within 6 dB of the quietest frame."""
    floor = max(min(f[1] for f in frames), 1e-5) * 2.0
    _, middle = _longest_run([f[1] <= floor for f in frames], latest=False)
    return frames[middle][0]


def _longest_run(flags: list[bool], latest: bool) -> tuple[int, int]:
    """(length, index of its middle) of the longest run of True in ``flags``; among runs of
    equal length the latest if ``latest``, else the first. (0, 0) when there is none."""
    best, run = (0, 0), 0
    for i, flag in enumerate(flags):
        run = run + 1 if flag else 0
        if run and (run >= best[0] if latest else run > best[0]):
            best = (run, i - (run - 1) // 2)
    return best
