"""Finals that are other people's talk: heard well under the talker, and unsure.

The voice-activity gate shuts out sound 20 dB or more under the talker
(:class:`asr_server.audio.vad.TalkerLevel`), but voices nearer than that pass
it as speech, and where the talker is silent they are all there is: the
gate's level follows them down within its 10 s window, and Whisper writes
words nobody near the microphone said. Babble 15 dB under a call's agent
made its transcript "in a little bit. I'll see you all in a little bit..."
where the agent said nothing (WER 0.895 against 0.105 offline;
docs/benchmarks.md, seventy-sixth session).

So a channel keeps the level of its recent finals, and a final whose level
lies ``margin_db`` or more under the loudest of those within ``window_s`` of
stream time, and that the model was unsure of (:func:`doubtful`), is dropped
as the guards drop a hallucination. Level alone cannot tell babble from a
second participant far from the microphone (a meeting room's, a speakerphone's,
a call recorded as one channel): with every other sentence 10 dB down the
fixtures' WER after revisions went 0.043 -> 0.288 on level alone, 0.048 with
the doubt as well (14 dB down: 0.066 -> 0.474, and 0.110; over a phone line
0.181 -> 0.462 on level alone), so a clearly heard quiet voice stays. But
Whisper hears a far participant as unsurely as babble more often than not on
the held-out sets (14 dB down their WER after revisions went 0.204-0.298 ->
0.325-0.379), so the server runs this only where asked (``--talker-final-db``,
off by default): for a channel that carries one talker over other people's talk.

A final's level is worked out as the gate's is, from its 30 ms frames: their
90th percentile, but never more than 10 dB over their 75th (a cough or a
knock inside an utterance does not raise it). Only finals with
``MIN_VOICED_S`` of speech set the reference, so a burst heard alone as an
utterance does not; and the reference forgets (the loudest of the last
minute, not of the stream), so one shouted sentence, or a talker who moves
away from the microphone, is not held against what follows for long.

The same test keeps such an utterance's interims from being shown
(:meth:`BackgroundFilter.unheard`, on the utterance's audio so far and the
interim's hypothesis): words nobody near the microphone said would flash up
and vanish when the final comes out empty.

Plain object, no clock: the decoder passes each final's (and interim's)
audio, its hypothesis and where it ends in the stream.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..audio.decode import MODEL_RATE
from ..audio.vad import FRAME_SAMPLES, voice_level
from ..inference.types import Hypothesis

__all__ = ["BackgroundFilter", "WINDOW_S", "doubtful", "level_db"]

MIN_FRAMES = 5  # a shorter final has no level (kept, and sets nothing)
MIN_VOICED_S = 1.0  # a final with less speech than this is judged, but sets no reference
# A quiet final is other people's talk only where the model was unsure of it.
DOUBT_WORD_P = 0.5
DOUBT_LOGPROB = -0.5
WINDOW_S = 60.0  # the reference is the loudest of the finals kept within this much stream time


def doubtful(hyp: Hypothesis) -> bool:
    """Whether the model was unsure of ``hyp``: its words' mean probability under ``DOUBT_WORD_P``
    and its mean token log-probability under ``DOUBT_LOGPROB`` (the latter alone without words)."""
    unsure = hyp.avg_logprob < DOUBT_LOGPROB
    if not hyp.words:
        return unsure
    return unsure and sum(w.probability for w in hyp.words) / len(hyp.words) < DOUBT_WORD_P


def level_db(audio: np.ndarray) -> float | None:
    """The level of ``audio`` (16 kHz float samples) in dBFS, as the gate works out a talker's,
    or None for audio shorter than ``MIN_FRAMES`` frames."""
    n = len(audio) // FRAME_SAMPLES
    if n < MIN_FRAMES:
        return None
    frames = np.asarray(audio[: n * FRAME_SAMPLES], np.float32).reshape(n, FRAME_SAMPLES)
    rms = np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1))
    return voice_level(20.0 * np.log10(np.maximum(rms, 1e-10)))


class BackgroundFilter:
    """One channel's finals, by level: :meth:`heard` says whether a final is the talker's."""

    def __init__(self, margin_db: float, window_s: float = WINDOW_S) -> None:
        """``margin_db``: how far under the reference an unsure final is other people's talk (0: every
        final is kept)."""
        if margin_db < 0 or window_s <= 0:
            raise ValueError("need margin_db >= 0 and window_s > 0")
        self.margin_db = margin_db
        self.window = int(window_s * MODEL_RATE)
        # (stream sample where a final ends, its level): finals that set the reference hold MIN_VOICED_S
        # of speech each, so no more than this many fit in the window.
        self._kept: deque[tuple[int, float]] = deque(maxlen=int(window_s / MIN_VOICED_S) + 1)

    def reference(self, end: int) -> float | None:
        """The loudest level of the finals kept within the window before ``end`` (None: none)."""
        while self._kept and self._kept[0][0] < end - self.window:
            self._kept.popleft()
        return max((db for _, db in self._kept), default=None)

    def heard(self, audio: np.ndarray, end: int, voiced_s: float, hyp: Hypothesis) -> bool:
        """Whether ``hyp``, a final of ``audio`` (ending at stream sample ``end``, ``voiced_s`` of it
        speech the gate heard), is the talker's: False when it lies ``margin_db`` or more under the
        reference and the model was unsure of it (:func:`doubtful`). A final taken as the talker's
        with enough speech becomes part of the reference."""
        level = level_db(audio) if self.margin_db else None
        if level is None:
            return True
        if self._under(level, end, hyp):
            return False
        if voiced_s >= MIN_VOICED_S:
            self._kept.append((end, level))
        return True

    def unheard(self, audio: np.ndarray, end: int, hyp: Hypothesis) -> bool:
        """Whether ``hyp``, an interim of ``audio`` (the utterance so far, ending at stream sample
        ``end``), is one :meth:`heard` would drop as a final: not shown, so that words nobody near
        the microphone said do not flash up before their final comes out empty. Adds nothing to the reference."""
        level = level_db(audio) if self.margin_db else None
        return level is not None and self._under(level, end, hyp)

    def _under(self, level: float, end: int, hyp: Hypothesis) -> bool:
        reference = self.reference(end)
        return reference is not None and level <= reference - self.margin_db and doubtful(hyp)
