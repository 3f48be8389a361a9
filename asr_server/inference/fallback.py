"""Whisper's temperature-fallback rule, as pure functions over decode attempts.

As in Whisper's own transcribe (Radford et al. 2022, section 4.5): an
attempt that is too repetitive (gzip compression ratio above 2.4) or too
unlikely (average log probability below -1) is decoded again at the next
temperature, unless the model itself says there was no speech (no-speech
probability above 0.6 with a low log probability). When every temperature
fails, the most likely attempt that is not repetitive is kept.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "NO_SPEECH_THRESHOLD", "LOG_PROB_THRESHOLD", "COMPRESSION_RATIO_THRESHOLD", "FINAL_TEMPERATURES",
    "Attempt", "needs_fallback", "best_attempt", "nothing_said", "compression_ratio",
]

NO_SPEECH_THRESHOLD = 0.6
LOG_PROB_THRESHOLD = -1.0
COMPRESSION_RATIO_THRESHOLD = 2.4
FINAL_TEMPERATURES: tuple[float, ...] = (0.0, 0.4, 0.8)


class Attempt(NamedTuple):
    """One decode of one item: its tokens and Whisper's three checks."""

    tokens: list[int]
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    temperature: float = 0.0  # above 0: sampled, after the attempts before it failed the checks


def needs_fallback(a: Attempt) -> bool:
    """Whether ``a`` fails the checks (and is not the model hearing silence)."""
    too_repetitive = a.compression_ratio > COMPRESSION_RATIO_THRESHOLD
    too_unlikely = a.avg_logprob < LOG_PROB_THRESHOLD
    silence = a.no_speech_prob > NO_SPEECH_THRESHOLD and too_unlikely
    return (too_repetitive or too_unlikely) and not silence


def best_attempt(attempts: Sequence[Attempt]) -> Attempt:
    """Every temperature failed: the most likely attempt that is not repetitive (or any, if all are)."""
    usable = [a for a in attempts if a.compression_ratio <= COMPRESSION_RATIO_THRESHOLD] or list(attempts)
    return max(usable, key=lambda a: a.avg_logprob)


def nothing_said(a: Attempt) -> bool:
    """Whisper's no-speech rule on the kept attempt: its text is dropped."""
    return a.no_speech_prob > NO_SPEECH_THRESHOLD and a.avg_logprob <= LOG_PROB_THRESHOLD


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 1.0
