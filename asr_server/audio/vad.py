"""Voice activity detection: 16 kHz float audio in, smoothed 30 ms frames out.

webrtcvad classifies each 30 ms frame on its own, and a single click or a
single dropped syllable flips it. :class:`VadGate` smooths that with a
majority vote over the last ``window`` frames: speech needs ``threshold`` of
them voiced, so one noisy frame neither starts nor ends speech. The vote
delays decisions by at most ``window - threshold`` frames; ``onset`` on the
frame where speech starts points back at the first voiced frame of the vote,
so start times are not late.

Which frames are voiced is up to ``VadOptions.detector``: ``webrtc`` alone;
``silero``, a learned model's probability (see :mod:`.silero`) with
hysteresis (speech from ``speech_threshold``, kept down to
``release_threshold``); or ``both``, voiced only where both agree. Frames
under the energy floor are never speech, and neither are frames far below
the talker's own recent level (:class:`TalkerLevel`): a learned detector
rightly calls a television, a neighbour's conversation or line echo speech,
and while it does the speaker's pause never comes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import webrtcvad

from .decode import MODEL_RATE
from .silero import WINDOW_SAMPLES, SileroModel, default_model

__all__ = ["VadOptions", "VadFrame", "VadGate", "TalkerLevel", "voice_level", "FRAME_SAMPLES", "DETECTORS", "NARROWBAND_RATE"]

FRAME_MS = 30
FRAME_SAMPLES = MODEL_RATE * FRAME_MS // 1000  # 480
DETECTORS = ("webrtc", "silero", "both")
NARROWBAND_RATE = 8000  # a stream sampled at this or less is telephone audio (G.711, 8 kHz PCM)


@dataclass(frozen=True)
class VadOptions:
    aggressiveness: int = 2  # webrtcvad mode 0 (permissive) .. 3 (strict)
    window: int = 5
    threshold: int = 3
    # Frames quieter than this are never speech where webrtcvad decides (alone or with Silero):
    # it calls faint hiss voiced.
    min_rms_dbfs: float = -50.0
    # The same for Silero alone, which goes by the shape of the sound, not its level: pink, white
    # and dithered noise and mains hum from -80 to -40 dBFS started nothing, where a quiet talker
    # (speech at -40 to -60 dBFS: a laptop's microphone at low gain, a far speaker) lost the soft
    # ends of words to the -50 dBFS floor and at -60 dBFS most sentences (bench/vad_bench.py --gain-db).
    learned_min_rms_dbfs: float = -80.0
    # Measured by bench/vad_bench.py: Silero ends speech as soon as webrtcvad on clean audio,
    # sooner in a reverberant room, and under noise 10 dB down it gives 27 of 31 sentences
    # an endpoint of their own with no false starts, where webrtcvad gave 20 and started 15.
    detector: str = "silero"
    speech_threshold: float = 0.5  # Silero probability that starts speech ...
    release_threshold: float = 0.35  # ... and the one it must fall under to end it
    # The same for telephone audio (a stream sampled at NARROWBAND_RATE or less). The network is
    # the 16 kHz one, and speech cut to a phone line's 300-3400 Hz reads to it as far less
    # speech-like: on the human recordings sent as 8 kHz mu-law (bench/stream_bench.py --phone)
    # its median probability inside speech fell from 0.93-0.98 to 0.26-0.46, and with 0.5 / 0.35
    # it lost two of five card names outright, started sentences late (a call's "Hi" and
    # "thank you" missing) and cut them in pieces. With these every sentence is found, in the
    # room and under noise too, and noise alone still starts nothing (docs/benchmarks.md).
    narrowband_speech_threshold: float = 0.25
    narrowband_release_threshold: float = 0.15
    # A frame this many dB below the talker's level (see TalkerLevel) is not speech; 0: off.
    # Measured by bench/vad_bench.py: with three other voices 20 dB under the speaker Silero calls
    # them speech (probability 0.6-0.9 in the pauses) and 25 of 31 sentences got an endpoint of
    # their own; with this, 30 of 31 (27 -> 30 over a phone line). 25 dB gave 28 of 31; 15 dB cut clean
    # speech more (one sentence of 31 merged into the next; telephone speech in 65 utterances, not 57).
    talker_floor_db: float = 20.0
    # A frame this many dB below the talker's level is never speech, whatever the detector says and
    # with no hold: the energy floor, relative (at the fixtures' levels, about where -50 dBFS was).
    # A room's reverberant tail and room tone end the utterance there. 30 dB found as many endpoints
    # (bench/vad_bench.py), but over the 27 replays of bench/replay_matrix.py (a processor with AVX-512)
    # it cost 26 errors in 8226 words against 35 dB (0.172 -> 0.169 after revisions, offline 0.167;
    # 12 -> 15 replays within 0.5 points) and 16 in 1740 on held-out sets 3 and 4 (0.278 -> 0.269,
    # offline 0.285): a loud talker's floor rose above the -50 dBFS that had been, and clipped the
    # soft ends of words (docs/benchmarks.md, fifty-sixth session).
    talker_silence_db: float = 35.0
    talker_window_s: float = 10.0  # the frames that passed as speech in this much of the stream set the level
    # After the talker's speech, frames under the floor still count as speech for this long. Without
    # it the gate cut telephone speech at its commas (57 -> 73 utterances for 31 sentences, 1.8 points
    # of WER after revisions in the phone replay); with it wideband endpoints are as without the gate.
    talker_hold_ms: int = 150
    # A final whose level lies this many dB under the loudest of the channel's finals in the last
    # minute, and that the model was unsure of, is other people's talk, and dropped
    # (asr_server/decoding/background.py); 0: off. Voices nearer than talker_floor_db pass the
    # gate, and where the talker is silent Whisper writes them. Off by default: at 12 it also lost
    # a far participant's words (docs/benchmarks.md, seventy-eighth session); 12 for a channel
    # that carries one talker over other people's talk (a call centre's agent on an open floor).
    talker_final_db: float = 0.0

    @property
    def learned(self) -> bool:
        return self.detector != "webrtc"

    def for_rate(self, sample_rate: int | None) -> "VadOptions":
        """The options for a stream sampled at ``sample_rate`` (None: a container's, not known
        up front): telephone audio takes the narrowband thresholds."""
        if sample_rate is None or sample_rate > NARROWBAND_RATE:
            return self
        return replace(self, speech_threshold=self.narrowband_speech_threshold, release_threshold=self.narrowband_release_threshold)

    def __post_init__(self) -> None:
        if self.detector not in DETECTORS:
            raise ValueError(f"detector must be one of {', '.join(DETECTORS)}")
        if not 0 < self.release_threshold <= self.speech_threshold < 1:
            raise ValueError("need 0 < release_threshold <= speech_threshold < 1")
        if not 0 < self.narrowband_release_threshold <= self.narrowband_speech_threshold < 1:
            raise ValueError("need 0 < narrowband_release_threshold <= narrowband_speech_threshold < 1")
        if not 0 <= self.aggressiveness <= 3:
            raise ValueError("aggressiveness must be 0..3")
        if not 1 <= self.threshold <= self.window:
            raise ValueError("threshold must be within 1..window")
        if self.talker_floor_db < 0 or self.talker_silence_db < 0 or self.talker_window_s <= 0 or self.talker_hold_ms < 0 or self.talker_final_db < 0:
            raise ValueError("need talker_floor_db >= 0, talker_silence_db >= 0, talker_window_s > 0, talker_hold_ms >= 0 and talker_final_db >= 0")


@dataclass(frozen=True)
class VadFrame:
    """One 30 ms frame. ``start`` counts samples from the start of the stream."""

    start: int
    samples: np.ndarray
    speech: bool
    # Set on the frame where speech begins: sample index of the first voiced frame of the vote.
    onset: int | None = None
    rms: float = 0.0  # the frame's level (the chunker cuts long utterances at quiet frames)
    # The learned detector's own call on this frame (its probability, with hysteresis), before the
    # energy floor, the talker's level and the vote (None: the detector is webrtcvad alone, whose
    # single frames flip on a click). A frame it did not hear as speech inside speech is a pause
    # too short for the vote (see the chunker's dips).
    learned: bool | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.samples)


BURST_DB = 10.0  # a voice's level is at most this far over its frames' 75th percentile (see TalkerLevel)


def voice_level(frame_dbs: Sequence[float] | np.ndarray) -> float:
    """The level of a voice from its frames' levels (dBFS): their 90th percentile, but never more than
    ``BURST_DB`` over their 75th (see :class:`TalkerLevel`)."""
    upper, high = np.percentile(frame_dbs, [75, 90])
    return float(min(high, upper + BURST_DB))


class TalkerLevel:
    """The level of the voice being transcribed, in dBFS: the 90th percentile of the frames that
    passed as speech within the last ``window`` frames, but never more than ``BURST_DB`` over
    their 75th percentile (a talker who stops for longer than the window no longer sets it).
    Until ``warmup`` frames passed there is no level, and every frame a detector calls speech
    passes.

    Speech's 90th percentile lies at most 5.6 dB over its 75th (every 1 s step of a 10 s window
    over the fixtures and held-out sets 1-4), so the cap leaves a voice's level as it is. It is
    for a loud burst inside speech (a cough, a knock on the table, a laugh near the microphone),
    which the detector hears as part of the speech: a tenth of the frames 40 dB over a quiet
    talker made the percentile the burst's, the floors under it then shut the talker's own
    frames out of the level, and the next burst held it there (two readings 30 dB down with a
    cough every 5.3 s: 3.4 s of their 21.6 and 14.3 s of speech heard; forty-sixth session).
    A burst now has to fill a quarter of the window's speech. The median as the reference held
    bursts better but let other voices 15-20 dB down pull the level and the floors under it
    down (fewer endpoints with voices nearby), and the 75th percentile does not.

    A frame ``floor_db`` or more below the level is not the talker's, except within ``hold``
    frames after a stretch where most frames (``SPOKEN`` of the last ``RECENT``) were: a short
    pause inside a sentence stays as the detector heard it, so the utterance is not cut there,
    and a soft last syllable is not clipped. A background voice that only now and then comes
    within the floor gets no hold: held, its single loud frames would join into speech."""

    SPOKEN, RECENT = 3, 5

    def __init__(self, window: int, floor_db: float, hold: int = 0, warmup: int = 10) -> None:
        self.window = window
        self.floor_db = floor_db
        self.hold = hold
        self.warmup = warmup
        self._frames: deque[tuple[int, float]] = deque()  # (frame index, dBFS) of frames that passed
        self._away = 0  # frames in a row that were not the talker's
        self._recent: deque[bool] = deque(maxlen=self.RECENT)  # whether each of the last frames was
        self._held = False  # whether the frames before this stretch of ``_away`` ones earn it the hold
        self._level: float | None = None  # the level of ``_frames`` as they stand (None: not worked out)

    @property
    def level(self) -> float | None:
        if len(self._frames) < self.warmup:
            return None
        if self._level is None:
            self._level = voice_level([db for _, db in self._frames])
        return self._level

    def level_at(self, index: int) -> float | None:
        """The level when frame ``index`` comes (the frames that set it have left the window by then)."""
        while self._frames and self._frames[0][0] <= index - self.window:
            self._frames.popleft()
            self._level = None
        return self.level

    def _below(self, db: float) -> bool:
        """Whether ``db`` is under the floor (the level's percentile is only worked out for frames a
        detector called speech: the rest are not the talker's either way)."""
        if not self.floor_db:
            return False
        level = self.level
        return level is not None and db < level - self.floor_db

    def hears(self, index: int, db: float, voiced: bool) -> bool:
        """Whether frame ``index`` at ``db`` dBFS, which a detector called ``voiced`` or not, is the
        talker speaking (if so it counts toward the level)."""
        self.level_at(index)
        if voiced and not self._below(db):
            self._away = 0
            self._recent.append(True)
            self._frames.append((index, db))
            self._level = None
            return True
        if not self._away:
            self._held = sum(self._recent) >= self.SPOKEN
        self._away += 1
        self._recent.append(False)
        return voiced and self._held and self._away <= self.hold


class VadGate:
    """Feed any amount of audio; get whole frames back with a smoothed decision."""

    def __init__(
        self,
        options: VadOptions = VadOptions(),
        classifier: Callable[[bytes], bool] | None = None,
        silero: SileroModel | None = None,
        origin: int = 0,
    ) -> None:
        """``classifier`` replaces webrtcvad (16-bit PCM frame in, voiced out); tests use it.
        ``silero``: the loaded model when ``options.detector`` uses it (default: the shared one).
        ``origin``: the stream sample the first audio fed starts at (a channel that listens afresh
        part-way through its stream, see :meth:`~asr_server.session.Session.receive_audio`)."""
        self.options = options
        vad = webrtcvad.Vad(options.aggressiveness)
        self._floor_db = options.learned_min_rms_dbfs if options.detector == "silero" else options.min_rms_dbfs
        self._is_voiced = classifier or (lambda pcm: vad.is_speech(pcm, MODEL_RATE))
        self._silero = (silero or default_model()).stream() if options.learned else None
        self._probs: deque[tuple[int, float]] = deque()  # (end sample, probability) of windows not yet used
        self._windows = 0
        self._origin = origin
        self._prob = 0.0
        self._learned_on = False
        self._pending = np.zeros(0, np.float32)
        self._position = origin
        self._votes: deque[tuple[int, bool]] = deque(maxlen=options.window)
        self._speaking = False
        self._talker = TalkerLevel(round(options.talker_window_s * 1000 / FRAME_MS), options.talker_floor_db, options.talker_hold_ms // FRAME_MS)

    @property
    def position(self) -> int:
        """Samples consumed into whole frames so far."""
        return self._position

    @property
    def talker_level(self) -> float | None:
        """The talker's level in dBFS (:class:`TalkerLevel`; None until enough speech was heard)."""
        return self._talker.level

    def feed(self, audio: np.ndarray) -> list[VadFrame]:
        if self._silero is not None:
            for p in self._silero.feed(audio):
                self._windows += 1
                self._probs.append((self._origin + self._windows * WINDOW_SAMPLES, float(p)))
        if len(self._pending):
            audio = np.concatenate([self._pending, audio])
        n = len(audio) // FRAME_SAMPLES
        frames = [self._classify(audio[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]) for i in range(n)]
        self._pending = audio[n * FRAME_SAMPLES :].copy()
        return frames

    def flush(self) -> list[VadFrame]:
        """Pad the last partial frame with silence and classify it."""
        if not len(self._pending):
            return []
        tail = np.zeros(FRAME_SAMPLES, np.float32)
        tail[: len(self._pending)] = self._pending
        self._pending = np.zeros(0, np.float32)
        return [self._classify(tail)]

    def _classify(self, samples: np.ndarray) -> VadFrame:
        pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
        rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
        db = 20 * float(np.log10(max(rms, 1e-10)))
        learned = self._silero is None or self._learned(self._position + FRAME_SAMPLES)  # always: hysteresis
        voiced = db >= self._floor(self._position // FRAME_SAMPLES) and learned and (self.options.detector == "silero" or self._is_voiced(pcm))
        voiced = self._talker.hears(self._position // FRAME_SAMPLES, db, voiced)
        start = self._position
        self._position += FRAME_SAMPLES
        self._votes.append((start, voiced))
        speech = sum(v for _, v in self._votes) >= self.options.threshold
        onset = None
        if speech and not self._speaking:
            onset = next(s for s, v in self._votes if v)
        self._speaking = speech
        return VadFrame(start, samples, speech, onset, rms, learned if self._silero is not None else None)

    def _floor(self, index: int) -> float:
        """The energy floor for frame ``index`` (dBFS): the detector's own, or ``talker_silence_db``
        under the talker's level where that is higher."""
        level = self._talker.level_at(index)
        if level is None or not self.options.talker_silence_db:
            return self._floor_db
        return max(self._floor_db, level - self.options.talker_silence_db)

    def _learned(self, end: int) -> bool:
        """Silero's call for the frame ending at ``end``: its latest window that ended by then
        (at most 32 ms earlier), with hysteresis."""
        while self._probs and self._probs[0][0] <= end:
            self._prob = self._probs.popleft()[1]
        threshold = self.options.release_threshold if self._learned_on else self.options.speech_threshold
        self._learned_on = self._prob >= threshold
        return self._learned_on
