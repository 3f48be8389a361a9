"""A quiet talker's audio raised to a level Whisper hears well, before it reaches the model.

Whisper's features are the log of the audio's power, shifted by a fixed amount, not
normalised: a talker 20 or 30 dB quieter than the recordings it learned from reads to it
as different sound. faster-whisper's own offline transcription of the fixtures turned
down by 10, 20 and 30 dB (16-bit samples) lost accuracy as the level fell, WER 0.046 at
their own level (speech at -19 to -25 dBFS) against 0.054, 0.061 and 0.079; raised back
to a speaking level of ``TARGET_DBFS`` first, 0.051, 0.038 and 0.051 (docs/benchmarks.md,
forty-fifth session). A laptop's microphone at low gain, a far talker or a quiet telephone
line sends such audio, and a browser's automatic gain control is not always on.

The gain is the talker's, not each decode's: the voice-activity gate keeps the level of
the frames it heard as the talker (:class:`asr_server.audio.vad.TalkerLevel`, the 90th
percentile of the last 10 s of them), and a channel's decodes are raised by what brings
that level to ``TARGET_DBFS`` (never lowered; at most ``MAX_GAIN_DB``). So a cough or a
breath between a talker's sentences is raised no more than the talker's own speech (a
decode's own level would raise a faint noise to the level of speech, where Whisper writes
words nobody said: 2 s of noise at -54 dBFS gave no word in 24 finals as it came, and
"You" in 21 of them raised 32 dB), and every recording the benches replay is above the target and reaches
the model unchanged. Noise rises with the speech: what Whisper hears is the same
recording, at a level it knows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TARGET_DBFS", "MAX_GAIN_DB", "talker_gain_db", "raised"]

TARGET_DBFS = -22.0
MAX_GAIN_DB = 40.0


def talker_gain_db(level_dbfs: float | None) -> float:
    """The gain (dB) that brings a talker at ``level_dbfs`` to ``TARGET_DBFS``: 0 when the level is
    that high or not known yet, at most ``MAX_GAIN_DB``."""
    if level_dbfs is None:
        return 0.0
    return min(max(0.0, TARGET_DBFS - level_dbfs), MAX_GAIN_DB)


def raised(audio: np.ndarray, gain_db: float) -> np.ndarray:
    """``audio`` raised by ``gain_db`` (``audio`` itself for 0)."""
    if gain_db <= 0.0:
        return audio
    return (np.asarray(audio, np.float32) * np.float32(10.0 ** (gain_db / 20.0))).astype(np.float32, copy=False)
