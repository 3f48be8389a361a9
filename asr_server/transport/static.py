"""The captioning page and the browser client, served from memory.

Only the files present in ``asr_server/web`` at start-up are served, by exact
path, so no request can reach anything else on disk. ``web/client`` is the
browser client (``clients/js/src``; a link in the source tree, a copy in the
wheel).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

__all__ = ["StaticFile", "load_static", "WEB_ROOT"]

WEB_ROOT = Path(__file__).resolve().parent.parent / "web"

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json",
}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    content_type: str

    @cached_property
    def etag(self) -> str:
        """A strong validator of the content: a browser asking again with it gets 304, no body."""
        return f'"{hashlib.sha256(self.body).hexdigest()[:20]}"'


def load_static(root: Path = WEB_ROOT) -> dict[str, StaticFile]:
    """URL path -> file, for every servable file under ``root`` (``/`` is ``index.html``)."""
    files: dict[str, StaticFile] = {}
    if not root.is_dir():
        return files
    for folder, _dirs, names in os.walk(root, followlinks=True):  # web/client is a link in the source tree
        for name in sorted(names):
            path = Path(folder) / name
            if path.suffix in _TYPES:
                url = "/" + path.relative_to(root).as_posix()
                files[url] = StaticFile(path.read_bytes(), _TYPES[path.suffix])
    if "/index.html" in files:
        files["/"] = files["/index.html"]
    return files
