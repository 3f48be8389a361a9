"""JSON a client sent, read so that no text can raise anything but ``ValueError``.

``json.loads`` raises ``RecursionError``, not ``ValueError``, for nesting deeper than
the interpreter's recursion limit: a text frame or a request body of a few thousand
``[`` is enough. Every reader of a client's JSON goes through :func:`read_json`, so
that such text is bad input like any other, not a crash.
"""

from __future__ import annotations

import json
from typing import Any


def read_json(text: str | bytes) -> Any:
    """``json.loads(text)``; ``ValueError`` (or its ``UnicodeDecodeError``) for anything it cannot read."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
