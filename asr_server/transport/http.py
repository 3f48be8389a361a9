"""The plain HTTP routes served beside the WebSocket: health, metrics, the captioning page.

:func:`route` answers any request that is not the WebSocket handshake on
``/v1/listen`` (it returns None for that one, to let the handshake go on).
"""

from __future__ import annotations

import http
import json
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from ..scheduler.policy import Priority

if TYPE_CHECKING:
    from ..server import AsrServer

__all__ = ["LISTEN_PATH", "route", "health", "response"]

LISTEN_PATH = "/v1/listen"


def route(server: "AsrServer", request: Request) -> Response | None:
    path = urlsplit(request.path).path
    if path == LISTEN_PATH:
        return None  # go on with the WebSocket handshake
    if path == "/healthz":
        status = http.HTTPStatus.OK if server.ready else http.HTTPStatus.SERVICE_UNAVAILABLE
        return response(status, json.dumps(health(server)).encode(), "application/json")
    if path == "/metrics":
        return response(http.HTTPStatus.OK, server.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
    page = server.static.get(path)
    if page is not None:
        return response(http.HTTPStatus.OK, page.body, page.content_type, cache="no-cache")
    return response(http.HTTPStatus.NOT_FOUND, b'{"error": "not found"}', "application/json")


def health(server: "AsrServer") -> dict:
    """``/healthz``: readiness and capacity, for load balancers and dashboards."""
    budget = server.budget
    return {
        "status": "ok" if server.ready else ("stopping" if server.stopping else "starting"),
        "model": server.model_name,
        "active_channels": server.active_channels,
        "max_channels": server.limits.max_channels,
        "load_level": int(server.governor.level),
        "accepting": [p.value for p in Priority if server.governor.admits(p)] if server.ready else [],
        "memory": {**budget.to_wire(), "reserved_mib": server.reserved_bytes >> 20} if budget else None,
    }


def response(status: http.HTTPStatus, body: bytes, content_type: str, cache: str = "no-store") -> Response:
    headers = Headers([
        ("Content-Type", content_type), ("Content-Length", str(len(body))), ("Cache-Control", cache),
        ("X-Content-Type-Options", "nosniff"),
    ])
    return Response(status.value, status.phrase, headers, body)
