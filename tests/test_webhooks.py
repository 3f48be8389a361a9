"""Webhook signing and the delivery queue's lanes, order, bound and retries, without I/O."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from asr_server.metrics import Metrics
from asr_server.webhooks import Delivery, DeliveryQueue, WebhookOptions, WebhookSender, sign, verify


def test_signatures_verify_only_with_the_secret_the_body_and_a_recent_time():
    header = sign("s3cret", 1_000_000, b'{"a":1}')
    assert verify("s3cret", header, b'{"a":1}', now=1_000_010)
    assert not verify("other", header, b'{"a":1}', now=1_000_010)
    assert not verify("s3cret", header, b'{"a":2}', now=1_000_010)
    assert not verify("s3cret", header, b'{"a":1}', now=1_000_000 + 3600)  # replayed an hour later
    assert not verify("s3cret", "garbage", b'{"a":1}', now=1_000_000)


def test_the_head_is_retried_with_growing_jittered_backoff_and_order_is_kept():
    q = DeliveryQueue(WebhookOptions(url="http://x", max_attempts=3, initial_backoff_s=1.0, max_backoff_s=10.0), rng=lambda: 1.0)
    first, second = Delivery("1", "http://x", b"1"), Delivery("2", "http://x", b"2")
    assert q.push(first, now=0.0) is None and q.push(second, now=0.0) is None
    assert q.take(0.0, room=8) == [first] and q.take(0.0, room=8) == []  # one at a time per receiver
    assert q.done(first, ok=False, now=0.0) == "retried" and first.due == 1.0  # 1 s (jitter at its top)
    assert q.take(0.5, room=8) == [] and q.wait_s(0.5) == 0.5  # the second waits behind it: order
    assert q.take(1.0, room=8) == [first] and q.done(first, ok=False, now=1.0) == "retried" and first.due == 3.0  # then 2 s
    assert q.take(3.0, room=8) == [first] and q.done(first, ok=False, now=3.0) == "failed" and len(q) == 1  # out of attempts: given up
    assert q.take(3.0, room=8) == [second] and q.done(second, ok=True, now=3.0) == "delivered" and q.wait_s(3.0) is None
    jittered = DeliveryQueue(WebhookOptions(initial_backoff_s=1.0), rng=lambda: 0.0)
    d = Delivery("3", "http://x", b"3")
    jittered.push(d, 0.0)
    jittered.take(0.0, room=1)
    jittered.done(d, ok=False, now=0.0)
    assert d.due == 0.5  # jitter at its bottom: half the backoff


def test_a_receiver_that_is_down_does_not_hold_up_the_others():
    q = DeliveryQueue(WebhookOptions(max_attempts=6, initial_backoff_s=1.0), rng=lambda: 1.0)
    down = [Delivery(f"d{i}", "http://down", b"") for i in range(3)]
    up = [Delivery(f"u{i}", "http://up", b"") for i in range(3)]
    for a, b in zip(down, up):
        q.push(a, 0.0)
        q.push(b, 0.0)
    assert q.take(0.0, room=8) == [down[0], up[0]]  # both receivers' first, side by side
    assert q.wait_s(0.0) is None  # nothing else may go while they are under way
    q.done(down[0], ok=False, now=0.0)  # retried in 1 s; the other receiver goes on meanwhile
    assert q.done(up[0], ok=True, now=0.0) == "delivered"
    for i in (1, 2):
        assert q.take(0.0, room=8) == [up[i]] and q.done(up[i], ok=True, now=0.0) == "delivered"
    assert q.take(0.0, room=8) == [] and q.wait_s(0.0) == 1.0 and len(q) == 3
    assert q.take(1.0, room=8) == [down[0]]


def test_room_limits_the_requests_under_way_oldest_first():
    q = DeliveryQueue(WebhookOptions())
    late, early = Delivery("1", "http://a", b""), Delivery("2", "http://b", b"")
    q.push(late, 5.0)
    q.push(early, 2.0)
    assert q.take(5.0, room=1) == [early] and q.take(5.0, room=0) == []
    assert q.take(5.0, room=1) == [late]


def test_a_full_queue_drops_the_newest_of_the_receiver_holding_most():
    q = DeliveryQueue(WebhookOptions(queue_limit=3))
    held = [Delivery(str(i), "http://down", b"") for i in range(3)]
    for d in held:
        assert q.push(d, 0.0) is None
    other = Delivery("o", "http://up", b"")
    assert q.push(other, 0.0) is held[2] and len(q) == 3  # the receiver that is down pays for the room
    assert q.push(Delivery("4", "http://down", b""), 0.0) is not None and len(q) == 3  # its own newest: dropped
    second = Delivery("o2", "http://up", b"")
    assert q.push(second, 0.0) is held[1]  # down held 2, up 1
    third = Delivery("o3", "http://up", b"")
    assert q.push(third, 0.0) is third  # up now holds the most: its newest is the one dropped
    assert q.take(0.0, room=8) == [held[0], other]


def test_a_delivery_being_sent_is_never_dropped():
    q = DeliveryQueue(WebhookOptions(queue_limit=1))
    first = Delivery("1", "http://a", b"")
    q.push(first, 0.0)
    q.take(0.0, room=1)
    newer = Delivery("2", "http://b", b"")
    assert q.push(newer, 0.0) is newer and q.done(first, ok=True, now=0.0) == "delivered" and len(q) == 0


@contextmanager
def raw_receiver(answer: Callable[[socket.socket], None]) -> Iterator[tuple[str, threading.Thread]]:
    """A loopback receiver that reads one request and lets ``answer`` write to the socket as it
    likes; its URL, and the thread answering."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            answer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook", thread
    finally:
        thread.join(30)
        listener.close()


def post_once(url: str, timeout_s: float) -> bool:
    return WebhookSender(WebhookOptions(url=url, timeout_s=timeout_s), Metrics())._post(Delivery("1", url, b"{}"))


def test_an_answer_that_is_not_http_is_a_failed_attempt():
    with raw_receiver(lambda conn: conn.sendall(b"nonsense\r\n\r\n")) as (url, _):
        assert post_once(url, timeout_s=30.0) is False


def test_an_attempt_that_breaks_is_retried_and_the_receiver_s_deliveries_go_on():
    posted: list[bytes] = []
    finished = threading.Event()

    def post(delivery: Delivery) -> bool:
        posted.append(delivery.body)
        if len(posted) == 1:
            raise RuntimeError("a bug in an attempt")
        if len(posted) == 3:
            finished.set()
        return True

    async def run() -> None:
        sender = WebhookSender(WebhookOptions(url="http://x", initial_backoff_s=0.0), Metrics())
        sender._post = post  # type: ignore[method-assign]
        sender.start()
        sender.send("http://x", {"n": 1})
        sender.send("http://x", {"n": 2})
        await asyncio.to_thread(finished.wait, 30)
        await sender.stop()

    asyncio.run(run())
    assert posted == [b'{"n":1}', b'{"n":1}', b'{"n":2}']


def test_a_redirect_is_not_followed():
    """A receiver under an allowed prefix answering 302 (or 307) must not send the server elsewhere."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(f"{self.command} {self.path}")
            if self.path.startswith("/hook"):
                self.send_response(int(self.path.rsplit("/", 1)[1]))
                self.send_header("Location", "/elsewhere")
            else:
                self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _answer  # noqa: N815 (the library's names)

        def log_message(self, *args: object) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    sender = WebhookSender(WebhookOptions(timeout_s=30.0), Metrics())
    try:
        for code in (302, 307):
            url = f"http://127.0.0.1:{http.server_address[1]}/hook/{code}"
            assert sender._post(Delivery("1", url, b"{}")) is False
    finally:
        http.shutdown()
        http.server_close()
    assert seen == ["POST /hook/302", "POST /hook/307"]


def test_an_answer_trickled_a_byte_at_a_time_is_cut_at_the_timeout():
    """Each read gets a byte before the socket's timeout, so only a deadline on the whole request
    ends it: without one the sender's thread was the receiver's for as long as it trickled."""
    stop = threading.Event()

    def trickle(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for _ in range(600):  # at most a minute
            if stop.wait(0.1):
                return
            try:
                conn.sendall(b"X")
            except OSError:  # the sender hung up: what it should do
                return
        conn.sendall(b": y\r\nContent-Length: 0\r\n\r\n")

    with raw_receiver(trickle) as (url, thread):
        try:
            assert post_once(url, timeout_s=1.0) is False
            assert thread.is_alive()  # cut while the receiver was still trickling
        finally:
            stop.set()


def test_a_calls_own_callback_must_lie_under_an_allowed_prefix_parsed_not_as_text():
    """Compared as text, ``https://hooks.example.com`` let a call send its events to
    ``https://hooks.example.com.evil.net/`` or, through user info, to ``evil.net``."""
    options = WebhookOptions(allowed_prefixes=("https://hooks.example.com", "http://127.0.0.1:9000/calls/"))
    for url in ("https://hooks.example.com", "https://hooks.example.com/", "https://hooks.example.com/call/7?x=1",
                "https://HOOKS.example.com:443/x", "http://127.0.0.1:9000/calls/1", "http://127.0.0.1:9000/calls"):
        assert options.callback_allowed(url), url
    for url in ("https://hooks.example.com.evil.net/", "https://hooks.example.com@evil.net/", "https://hooks.example.com\\@evil.net/",
                "https://hooks.example.com:444/", "http://hooks.example.com/", "http://127.0.0.1:9000/callsx",
                "http://127.0.0.1:9000/calls/../admin", "http://127.0.0.1:9000/calls/%2e%2e/admin", "http://127.0.0.1:99999/calls/",
                "file:///etc/passwd", "https:///x", ""):
        assert not options.callback_allowed(url), url
