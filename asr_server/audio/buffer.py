"""A growable float32 buffer: appends in amortised O(1)."""

from __future__ import annotations

import numpy as np

__all__ = ["AudioBuffer"]


class AudioBuffer:
    def __init__(self, initial: int = 16000) -> None:
        self._data = np.zeros(max(1, initial), np.float32)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, samples: np.ndarray) -> None:
        need = self._size + len(samples)
        if need > len(self._data):
            grown = np.zeros(max(need, 2 * len(self._data)), np.float32)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        self._data[self._size : need] = samples
        self._size = need

    def truncate(self, size: int) -> None:
        """Keep the first ``size`` samples: what was appended after them is undone."""
        self._size = min(self._size, max(0, size))

    def copy(self, start: int = 0, end: int | None = None) -> np.ndarray:
        stop = self._size if end is None else max(0, min(end, self._size))
        return self._data[max(0, start) : stop].copy()
