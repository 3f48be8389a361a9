"""The plain HTTP routes served beside the WebSocket: health, metrics, the captioning page.

:func:`route` answers any request that is not the WebSocket handshake on
``/v1/listen`` (it returns None for that one, to let the handshake go on).
"""

from __future__ import annotations

import http
import json
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from ..scheduler.policy import Priority

if TYPE_CHECKING:
    from ..server import AsrServer

__all__ = ["LISTEN_PATH", "route", "health", "response", "OneRequestConnection"]

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
        "max_channels": server.max_channels,
        "capacity": server.capacity.to_wire() if server.capacity else None,
        "load_level": int(server.governor.level),
        "accepting": [p.value for p in Priority if server.governor.admits(p)] if server.ready else [],
        "memory": {**budget.to_wire(), "reserved_mib": server.reserved_bytes >> 20} if budget else None,
    }


def response(status: http.HTTPStatus, body: bytes, content_type: str, cache: str = "no-store") -> Response:
    headers = Headers([
        ("Content-Type", content_type), ("Content-Length", str(len(body))), ("Cache-Control", cache),
        ("X-Content-Type-Options", "nosniff"), ("Connection", "close"),  # one request per connection
    ])
    return Response(status.value, status.phrase, headers, body)


class OneRequestConnection(ServerConnection):
    """A connection that reads one HTTP request before anything else.

    websockets parses the bytes after the handshake request as WebSocket
    frames at once, even when the request is plain HTTP: a pipelined second
    request then failed the connection before the answer to the first was
    written (the client got nothing, and websockets logged an internal
    error). Here what follows the first request is held back until the
    handshake is over: fed on for a WebSocket (a client sends no frame
    before our 101 anyway), dropped for plain HTTP, whose connection closes
    after its one answer.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._reading_head = True  # until the first request head has been fed
        self._tail = b""  # the last bytes of the request head seen so far (to find its end across reads)
        self._held: bytes | None = None  # bytes after the request head, until the handshake is over

    def data_received(self, data: bytes) -> None:
        if not self._reading_head:  # the handshake is over: a WebSocket's frames go straight through
            super().data_received(data)
            return
        if self._held is not None:
            self._held += data
            return
        seen = self._tail + data
        end = seen.find(b"\r\n\r\n")
        if end < 0:
            self._tail = seen[-3:]
            super().data_received(data)
            return
        cut = end + 4 - len(self._tail)
        self._held = data[cut:]
        super().data_received(data[:cut])

    async def handshake(self, *args: object, **kwargs: object) -> None:
        try:
            await super().handshake(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            self._reading_head = False
        held, self._held = self._held, None
        upgraded = self.response is not None and self.response.status_code == http.HTTPStatus.SWITCHING_PROTOCOLS
        if held and upgraded:
            super().data_received(held)
