"""Silero VAD, streamed: 16 kHz float audio in, one speech probability per 32 ms out.

webrtcvad judges each frame on its spectrum alone, so the reverberant tail of
a word and a room's hum read as speech for a few hundred milliseconds after
the talker stops; that wait lands on every final. Silero's small recurrent
network (the ONNX export faster-whisper ships and uses for its own VAD
filter) has learned what speech is, and its probability falls within a
window or two of the last syllable.

:class:`SileroModel` is the loaded network, shared by every stream (an ONNX
Runtime session may be run from several threads). :class:`SileroStream` is
one channel's state: the recurrent state, the 64 samples of context the
model reads before each window, and audio not yet a whole window. Feeding a
stream piece by piece gives exactly the probabilities of one call over the
whole recording.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["SileroModel", "SileroStream", "WINDOW_SAMPLES", "default_model"]

WINDOW_SAMPLES = 512  # 32 ms at 16 kHz: the window the model was trained on
CONTEXT_SAMPLES = 64
STATE_SHAPE = (1, 1, 128)


class SileroModel:
    """The network, loaded once from its ONNX file (single-threaded: one window is ~0.2 ms)."""

    def __init__(self, path: str) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        opts.enable_cpu_mem_arena = False
        opts.log_severity_level = 4
        self._session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"], sess_options=opts)

    def run(self, windows: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``windows``: consecutive ``(k, 64 + 512)`` inputs (context then window); the state carries over."""
        probs, h, c = self._session.run(None, {"input": windows, "h": h, "c": c})
        return np.asarray(probs).reshape(-1), h, c

    def stream(self) -> "SileroStream":
        return SileroStream(self)


class SileroStream:
    """One channel: feed audio in any pieces, get the probabilities of the windows it completed."""

    def __init__(self, model: SileroModel) -> None:
        self._model = model
        self._h = np.zeros(STATE_SHAPE, np.float32)
        self._c = np.zeros(STATE_SHAPE, np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, np.float32)
        self._pending = np.zeros(0, np.float32)

    def feed(self, audio: np.ndarray) -> np.ndarray:
        audio = np.concatenate([self._pending, np.asarray(audio, np.float32)])
        k = len(audio) // WINDOW_SAMPLES
        self._pending = audio[k * WINDOW_SAMPLES :].copy()
        if k == 0:
            return np.zeros(0, np.float32)
        windows = audio[: k * WINDOW_SAMPLES].reshape(k, WINDOW_SAMPLES)
        contexts = np.concatenate([self._context[None], windows[:-1, -CONTEXT_SAMPLES:]])
        self._context = windows[-1, -CONTEXT_SAMPLES:].copy()
        probs, self._h, self._c = self._model.run(np.concatenate([contexts, windows], axis=1), self._h, self._c)
        return probs


@lru_cache(maxsize=1)
def default_model() -> SileroModel:
    """The model faster-whisper ships, loaded once per process (~2 MB, a few ms)."""
    from ..inference.fw import silero_vad_path

    return SileroModel(silero_vad_path())
