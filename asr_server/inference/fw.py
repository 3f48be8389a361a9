"""The one adapter to faster-whisper's internals (beyond its public ``WhisperModel``).

Batched decoding needs pieces faster-whisper does not export as API: the
token-suppression list, word alignment over a batch, and punctuation
merging. Each is reached only through a function here, the faster-whisper
version is pinned to one minor release (``pyproject.toml``), and
``tests/inference/test_fw_seam.py`` fails loudly when any of them moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SUPPORTED_MINOR", "Tokens", "load_model", "tokens_for", "align", "merge_punctuation", "silero_vad_path", "version"]

SUPPORTED_MINOR = "1.2"  # keep in step with pyproject.toml's faster-whisper pin


def version() -> str:
    import faster_whisper

    return faster_whisper.__version__


@dataclass(frozen=True)
class Tokens:
    """A language's tokenizer (faster-whisper's) and the tokens Whisper suppresses while decoding."""

    tokenizer: Any
    suppress: tuple[int, ...]


def load_model(path: str, **kwargs: Any) -> Any:
    from faster_whisper import WhisperModel

    return WhisperModel(path, **kwargs)


def tokens_for(model: Any, language: str) -> Tokens:
    """The tokenizer for ``language`` and Whisper's default suppression list (``suppress_tokens=[-1]``)."""
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_suppressed_tokens

    multilingual = model.model.is_multilingual
    tokenizer = Tokenizer(model.hf_tokenizer, multilingual, task="transcribe", language=language if multilingual else None)
    return Tokens(tokenizer, tuple(get_suppressed_tokens(tokenizer, (-1,)) or ()))


def align(model: Any, tokenizer: Any, text_tokens: list[list[int]], encoder_output: Any, num_frames: list[int]) -> list[list[dict]]:
    """Cross-attention word timing for a batch: per item, dicts with word, tokens, start, end, probability.

    faster-whisper 1.2's ``find_alignment`` is typed for one item but takes
    lists (it is what its batched pipeline calls); the seam test checks that.
    """
    return model.find_alignment(tokenizer, text_tokens, encoder_output, num_frames)  # type: ignore[arg-type]


def merge_punctuation(alignment: list[dict], prepended: str, appended: str) -> None:
    """Attach punctuation tokens to their neighbouring words, in place (Whisper's own rule)."""
    from faster_whisper.transcribe import merge_punctuations

    merge_punctuations(alignment, prepended, appended)


def silero_vad_path() -> str:
    """The Silero voice-activity model (ONNX) that faster-whisper ships in its package."""
    import os

    from faster_whisper.vad import get_assets_path

    return os.path.join(get_assets_path(), "silero_vad_v6.onnx")
