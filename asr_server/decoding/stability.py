"""Which part of an interim hypothesis may still change.

LocalAgreement-2 (Machacek, Dabre and Bojar, 2023, "Turning Whisper into
Real-Time Transcription System"): words on which two consecutive hypotheses
of the same growing audio agree are committed. Committed words are then
forced as the decoder's prefix for later interims (see
:class:`~asr_server.decoding.incremental.ChannelDecoder`), and whatever a
hypothesis says there, the committed characters are kept: that is the
promise ``stable`` makes to the client.
"""

from __future__ import annotations

from .text import normalize_word

__all__ = ["LocalAgreement"]


class LocalAgreement:
    """Feed each new hypothesis (as words); get ``(text, stable)`` back."""

    def __init__(self) -> None:
        self.committed: list[str] = []
        self._previous_tail: list[str] | None = None

    def copy(self) -> LocalAgreement:
        """An agreement that goes on from where this one is, apart from it."""
        other = LocalAgreement()
        other.committed = list(self.committed)
        other._previous_tail = None if self._previous_tail is None else list(self._previous_tail)
        return other

    @property
    def stable_text(self) -> str:
        return " ".join(self.committed)

    def update(self, words: list[str]) -> tuple[str, int]:
        """Return the interim text and how many leading characters are stable."""
        tail = self._tail_after_committed(words)
        if self._previous_tail is not None:
            agreed = 0
            for a, b in zip(self._previous_tail, tail):
                if normalize_word(a) != normalize_word(b) or not normalize_word(b):
                    break
                agreed += 1
            self.committed.extend(tail[:agreed])
            tail = tail[agreed:]
        self._previous_tail = tail
        stable = len(self.stable_text)
        text = " ".join(self.committed + tail)
        return text, stable

    def _tail_after_committed(self, words: list[str]) -> list[str]:
        """The part of ``words`` that comes after the committed words.

        Usually the hypothesis starts with the committed words (they were its
        forced prefix). When it does not, find where the last committed word
        reappears and continue after it; failing that, align by word count.
        """
        k = len(self.committed)
        if k == 0:
            return list(words)
        norm = [normalize_word(w) for w in words]
        target = [normalize_word(w) for w in self.committed]
        if norm[:k] == target:
            return list(words[k:])
        last = target[-1]
        for i in range(min(len(norm) - 1, k + 2), max(-1, k - 3), -1):
            if i >= 0 and norm[i] == last:
                return list(words[i + 1 :])
        return list(words[k:])
