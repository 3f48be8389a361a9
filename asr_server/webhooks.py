"""Webhooks: each final, revision and settled message, and each session's whole transcript at its end,
POSTed as signed JSON.

:class:`DeliveryQueue` (no I/O, time passed in) holds the deliveries in a lane
per receiver, each in order, bounded in all, and decides retries: exponential
backoff with jitter, up to ``max_attempts``; a full queue drops the newest
delivery of the receiver holding the most (counted), so a stream never waits
for a receiver and one that is down costs only its own deliveries.
:class:`WebhookSender` is the thin shell that POSTs each lane's head (one at a
time per receiver, so a receiver gets them in order; receivers side by side).

Each request carries ``Asr-Signature: t=<unix seconds>,v1=<hex>``, the
HMAC-SHA256 of ``<t>.<body>`` with ``--webhook-secret`` (docs/telephony.md
shows how to check it), ``Asr-Delivery`` (the same on every attempt of one
delivery, to drop duplicates) and ``Asr-Attempt``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import http.client
import itertools
import json
import logging
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from .metrics import Metrics

__all__ = ["EVENTS", "WebhookOptions", "Delivery", "DeliveryQueue", "WebhookSender", "sign", "verify"]

log = logging.getLogger("asr_server.webhooks")


EVENTS = ("final", "revision", "settled", "transcript")


@dataclass(frozen=True)
class WebhookOptions:
    url: str | None = None  # every session's events go here
    secret: str | None = None  # signs each body (HMAC-SHA256)
    allowed_prefixes: tuple[str, ...] = ()  # a session's own `callback` URL must start with one of these
    timeout_s: float = 5.0
    max_attempts: int = 6
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    queue_limit: int = 1000  # deliveries held, all receivers together
    concurrency: int = 8  # receivers sent to at once (one request each)
    events: frozenset[str] = frozenset(EVENTS)  # which of EVENTS are sent

    @property
    def enabled(self) -> bool:
        return self.url is not None or bool(self.allowed_prefixes)

    def callback_allowed(self, url: str) -> bool:
        return any(_under(url, prefix) for prefix in self.allowed_prefixes)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _under(url: str, prefix: str) -> bool:
    """Whether ``url`` lies under ``prefix`` as a receiver: the same scheme, host and port, and a path
    at or below the prefix's, compared parsed (as text, ``https://hooks.example.com`` let
    ``https://hooks.example.com.evil.net/`` and ``https://hooks.example.com@evil.net/`` through).
    No user info, no ``..`` segment, nothing but http(s)."""
    try:
        got, allowed = urlsplit(url), urlsplit(prefix)
        ports = (got.port or _DEFAULT_PORTS.get(got.scheme), allowed.port or _DEFAULT_PORTS.get(allowed.scheme))
    except ValueError:  # a port that is not a number, or out of range
        return False
    if got.scheme not in _DEFAULT_PORTS or got.scheme != allowed.scheme or ports[0] != ports[1]:
        return False
    if not got.hostname or got.hostname != allowed.hostname or "@" in got.netloc or "\\" in url:
        return False
    if {".", ".."} & {unquote(segment) for segment in got.path.split("/")}:
        return False
    base = allowed.path.rstrip("/")
    return got.path == base or got.path.startswith(base + "/")


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: str, header: str, body: bytes, now: float, tolerance_s: float = 300.0) -> bool:
    """What a receiver does with ``Asr-Signature``: the HMAC matches, and it is recent."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, fields.get("v1", "")) and abs(now - timestamp) <= tolerance_s


@dataclass
class Delivery:
    id: str
    url: str
    body: bytes
    attempts: int = 0
    due: float = 0.0
    sending: bool = False  # an attempt is under way


@dataclass
class DeliveryQueue:
    """Deliveries in a lane per receiver (URL), each lane in order: a lane's head is retried
    until delivered or out of attempts before the next goes, while other receivers' lanes go on.
    ``queue_limit`` bounds the deliveries held in all lanes; when it is reached, the receiver
    holding the most loses its newest delivery, so a receiver that is down costs only its own."""

    options: WebhookOptions
    rng: Callable[[], float] = random.random
    _lanes: dict[str, deque[Delivery]] = field(default_factory=dict)
    _held: int = 0

    def __len__(self) -> int:
        return self._held

    def push(self, delivery: Delivery, now: float) -> Delivery | None:
        """Queue ``delivery``; when the queue is full, the one dropped for it (``delivery`` itself
        unless another receiver holds more), else None."""
        delivery.due = now
        dropped = None
        if self._held >= self.options.queue_limit:
            fullest = max(self._lanes.values(), key=len, default=deque())
            if len(fullest) <= len(self._lanes.get(delivery.url, ())) or fullest[-1].sending:
                return delivery
            dropped = fullest.pop()
            self._held -= 1
        self._lanes.setdefault(delivery.url, deque()).append(delivery)
        self._held += 1
        return dropped

    def take(self, now: float, room: int) -> list[Delivery]:
        """Up to ``room`` lane heads that are due and not being sent, the longest-waiting first;
        they are marked as being sent."""
        due = sorted((lane[0] for lane in self._lanes.values() if not lane[0].sending and lane[0].due <= now), key=lambda d: d.due)
        taken = due[: max(0, room)]
        for delivery in taken:
            delivery.sending = True
        return taken

    def wait_s(self, now: float) -> float | None:
        """Until the next lane head not being sent is due (None: none waits)."""
        dues = [lane[0].due for lane in self._lanes.values() if not lane[0].sending]
        return max(0.0, min(dues) - now) if dues else None

    def done(self, delivery: Delivery, ok: bool, now: float) -> str:
        """An attempt's outcome: ``delivered``, ``retried`` (first in its lane again after a backoff) or ``failed`` (given up)."""
        delivery.attempts += 1
        delivery.sending = False
        if ok or delivery.attempts >= self.options.max_attempts:
            lane = self._lanes[delivery.url]
            lane.popleft()
            self._held -= 1
            if not lane:
                del self._lanes[delivery.url]
            return "delivered" if ok else "failed"
        backoff = min(self.options.max_backoff_s, self.options.initial_backoff_s * 2 ** (delivery.attempts - 1))
        delivery.due = now + backoff * (0.5 + self.rng() / 2)  # jitter: receivers that recover are not hit all at once
        return "retried"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is not followed (it is an answer that is not 2xx): a receiver under an allowed
    prefix must not send the server to another address."""

    def redirect_request(self, *args: Any) -> None:
        return None


class _Watched:
    """The sockets of one request, shut when its time is up: a socket's timeout bounds each read,
    so a receiver that answers a byte at a time would otherwise hold the request for as long as it
    likes."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []
        self.expired = False  # an answer read after this is cut short, whatever it says

    def connection(self, cls: type[http.client.HTTPConnection]) -> Callable[..., http.client.HTTPConnection]:
        """A factory of ``cls`` connections whose sockets are kept here (the plain one before TLS
        wraps it, and the one it reads from)."""

        def make(host: str, **kwargs: Any) -> http.client.HTTPConnection:
            conn = cls(host, **kwargs)
            connect, create = conn.connect, conn._create_connection  # type: ignore[attr-defined]

            def created(*args: Any, **kw: Any) -> socket.socket:
                self.sockets.append(create(*args, **kw))
                return self.sockets[-1]

            def connected() -> None:
                connect()
                self.sockets.append(conn.sock)

            conn._create_connection, conn.connect = created, connected  # type: ignore[attr-defined, method-assign]
            return conn

        return make

    def shut(self) -> None:
        self.expired = True
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # a read under way returns at once
            except OSError:
                pass


class _Watching:
    """A urllib handler whose connections' sockets ``watched`` keeps."""

    def __init__(self, watched: _Watched) -> None:
        super().__init__()
        self.watched = watched


class _WatchedHTTP(_Watching, urllib.request.HTTPHandler):
    watched: _Watched

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self.watched.connection(http.client.HTTPConnection), req)  # type: ignore[arg-type]


class _WatchedHTTPS(_Watching, urllib.request.HTTPSHandler):
    watched: _Watched

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self.watched.connection(http.client.HTTPSConnection), req, context=self._context)  # type: ignore[arg-type, attr-defined]


class WebhookSender:
    """POSTs each receiver's next delivery, receivers side by side (at most ``concurrency`` requests
    at once, in threads of its own), from a task of its own: the event loop never waits on a receiver."""

    def __init__(self, options: WebhookOptions, metrics: Metrics) -> None:
        self.options = options
        self.metrics = metrics
        self.queue = DeliveryQueue(options)
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._attempts: set[asyncio.Task[None]] = set()
        self._pool: ThreadPoolExecutor | None = None

    def start(self) -> None:
        if self.options.enabled:
            self._pool = ThreadPoolExecutor(self.options.concurrency, thread_name_prefix="asr-webhook")
            self._task = asyncio.get_running_loop().create_task(self._run(), name="asr-webhooks")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._attempts) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)  # a request under way ends at its timeout

    def send(self, url: str, event: dict[str, Any]) -> None:
        body = json.dumps(event, separators=(",", ":")).encode()
        dropped = self.queue.push(Delivery(f"d{next(self._ids)}-{int(time.time())}", url, body), time.monotonic())
        if dropped is not None:
            self.metrics.webhook_deliveries.labels("dropped").inc()
            log.warning("webhook queue full: a delivery to %s was dropped", dropped.url)
        self.metrics.webhook_queue.set(len(self.queue))
        self._wake.set()

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            for delivery in self.queue.take(now, self.options.concurrency - len(self._attempts)):
                task = asyncio.get_running_loop().create_task(self._attempt(delivery))
                self._attempts.add(task)
                task.add_done_callback(self._attempts.discard)
            self._wake.clear()
            wait = self.queue.wait_s(now) if len(self._attempts) < self.options.concurrency else None
            try:
                await asyncio.wait_for(self._wake.wait(), wait)  # a timer, a new delivery or an attempt's end
            except TimeoutError:
                pass

    async def _attempt(self, delivery: Delivery) -> None:
        try:
            ok = await asyncio.get_running_loop().run_in_executor(self._pool, self._post, delivery)
        except Exception:  # whatever went wrong, the attempt failed: the receiver's lane must go on
            log.exception("webhook delivery %s to %s", delivery.id, delivery.url)
            ok = False
        outcome = self.queue.done(delivery, ok, time.monotonic())
        self.metrics.webhook_deliveries.labels(outcome).inc()
        self.metrics.webhook_queue.set(len(self.queue))
        if outcome == "failed":
            log.warning("webhook delivery %s to %s failed after %d attempts", delivery.id, delivery.url, delivery.attempts)
        self._wake.set()

    def _post(self, delivery: Delivery) -> bool:
        headers = {"Content-Type": "application/json", "Asr-Delivery": delivery.id, "Asr-Attempt": str(delivery.attempts + 1)}
        if self.options.secret:
            headers["Asr-Signature"] = sign(self.options.secret, int(time.time()), delivery.body)
        request = urllib.request.Request(delivery.url, data=delivery.body, headers=headers, method="POST")
        watched = _Watched()
        deadline = threading.Timer(self.options.timeout_s, watched.shut)  # the whole request, not each read
        deadline.daemon = True
        deadline.start()
        try:
            opener = urllib.request.build_opener(_NoRedirects, _WatchedHTTP(watched), _WatchedHTTPS(watched))
            with opener.open(request, timeout=self.options.timeout_s) as answer:
                return 200 <= answer.status < 300 and not watched.expired
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):  # HTTPException: an answer that is not HTTP
            return False
        finally:
            deadline.cancel()
