"""Webhook signing and the delivery queue's order, bound and retries, without I/O."""

from __future__ import annotations

from asr_server.webhooks import Delivery, DeliveryQueue, WebhookOptions, sign, verify


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
    assert q.push(first, now=0.0) and q.push(second, now=0.0)
    assert q.head(0.0) is first
    assert q.done(first, ok=False, now=0.0) == "retried" and first.due == 1.0  # 1 s (jitter at its top)
    assert q.head(0.5) is None and q.wait_s(0.5) == 0.5  # the second waits behind it: order
    assert q.done(first, ok=False, now=1.0) == "retried" and first.due == 3.0  # then 2 s
    assert q.done(first, ok=False, now=3.0) == "failed" and len(q) == 1  # out of attempts: given up
    assert q.head(3.0) is second and q.done(second, ok=True, now=3.0) == "delivered" and q.wait_s(3.0) is None
    jittered = DeliveryQueue(WebhookOptions(initial_backoff_s=1.0), rng=lambda: 0.0)
    d = Delivery("3", "http://x", b"3")
    jittered.push(d, 0.0)
    jittered.done(d, ok=False, now=0.0)
    assert d.due == 0.5  # jitter at its bottom: half the backoff


def test_a_full_queue_drops_the_newest_instead_of_waiting():
    q = DeliveryQueue(WebhookOptions(queue_limit=2))
    assert q.push(Delivery("1", "u", b""), 0.0) and q.push(Delivery("2", "u", b""), 0.0)
    assert not q.push(Delivery("3", "u", b""), 0.0) and len(q) == 2
