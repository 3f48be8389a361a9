"""Webhooks: each final, revision and settled message, and each session's whole transcript at its end,
POSTed as signed JSON.

:class:`DeliveryQueue` (no I/O, time passed in) holds the deliveries in order,
bounded, and decides retries: exponential backoff with jitter, up to
``max_attempts``; a full queue drops the newest delivery (counted) so a stream
never waits for a slow receiver. :class:`WebhookSender` is the thin shell that
POSTs the head of the queue (one at a time, so a receiver gets them in order).

Each request carries ``Asr-Signature: t=<unix seconds>,v1=<hex>``, the
HMAC-SHA256 of ``<t>.<body>`` with ``--webhook-secret`` (docs/telephony.md
shows how to check it), ``Asr-Delivery`` (the same on every attempt of one
delivery, to drop duplicates) and ``Asr-Attempt``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import logging
import random
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    queue_limit: int = 1000
    events: frozenset[str] = frozenset(EVENTS)  # which of EVENTS are sent

    @property
    def enabled(self) -> bool:
        return self.url is not None or bool(self.allowed_prefixes)

    def callback_allowed(self, url: str) -> bool:
        return any(url.startswith(prefix) for prefix in self.allowed_prefixes)


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


@dataclass
class DeliveryQueue:
    """Deliveries in order; the head is retried until delivered or out of attempts."""

    options: WebhookOptions
    rng: Callable[[], float] = random.random
    _items: deque[Delivery] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self._items)

    def push(self, delivery: Delivery, now: float) -> bool:
        """False (dropped) when the queue is full."""
        if len(self._items) >= self.options.queue_limit:
            return False
        delivery.due = now
        self._items.append(delivery)
        return True

    def head(self, now: float) -> Delivery | None:
        """The next delivery to attempt, if it is due."""
        return self._items[0] if self._items and self._items[0].due <= now else None

    def wait_s(self, now: float) -> float | None:
        """Until the head is due (None: nothing queued)."""
        return max(0.0, self._items[0].due - now) if self._items else None

    def done(self, delivery: Delivery, ok: bool, now: float) -> str:
        """An attempt's outcome: ``delivered``, ``retried`` (back in line after a backoff) or ``failed`` (given up)."""
        delivery.attempts += 1
        if ok or delivery.attempts >= self.options.max_attempts:
            self._items.remove(delivery)
            return "delivered" if ok else "failed"
        backoff = min(self.options.max_backoff_s, self.options.initial_backoff_s * 2 ** (delivery.attempts - 1))
        delivery.due = now + backoff * (0.5 + self.rng() / 2)  # jitter: receivers that recover are not hit all at once
        return "retried"


class WebhookSender:
    """POSTs the queue's head, one at a time, in a task of its own (the event loop never waits on a receiver)."""

    def __init__(self, options: WebhookOptions, metrics: Metrics) -> None:
        self.options = options
        self.metrics = metrics
        self.queue = DeliveryQueue(options)
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.options.enabled:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="asr-webhooks")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def send(self, url: str, event: dict[str, Any]) -> None:
        body = json.dumps(event, separators=(",", ":")).encode()
        if not self.queue.push(Delivery(f"d{next(self._ids)}-{int(time.time())}", url, body), time.monotonic()):
            self.metrics.webhook_deliveries.labels("dropped").inc()
            log.warning("webhook queue full: a %s delivery was dropped", event.get("event"))
        self.metrics.webhook_queue.set(len(self.queue))
        self._wake.set()

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            delivery = self.queue.head(now)
            if delivery is None:
                self._wake.clear()
                wait = self.queue.wait_s(now)
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)  # a timer or a new delivery, not synchronisation
                except TimeoutError:
                    pass
                continue
            ok = await asyncio.to_thread(self._post, delivery)
            outcome = self.queue.done(delivery, ok, time.monotonic())
            self.metrics.webhook_deliveries.labels(outcome).inc()
            self.metrics.webhook_queue.set(len(self.queue))
            if outcome == "failed":
                log.warning("webhook delivery %s to %s failed after %d attempts", delivery.id, delivery.url, delivery.attempts)

    def _post(self, delivery: Delivery) -> bool:
        headers = {"Content-Type": "application/json", "Asr-Delivery": delivery.id, "Asr-Attempt": str(delivery.attempts + 1)}
        if self.options.secret:
            headers["Asr-Signature"] = sign(self.options.secret, int(time.time()), delivery.body)
        request = urllib.request.Request(delivery.url, data=delivery.body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.options.timeout_s) as answer:
                return 200 <= answer.status < 300
        except (urllib.error.URLError, OSError, ValueError):
            return False
