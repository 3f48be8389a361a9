"""End to end: finals and the transcript reach a real HTTP receiver on loopback, signed, in
order, retried after failures; a receiver that never answers leaves the stream unharmed."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from asr_server.options import Limits
from asr_server.webhooks import WebhookOptions, verify

from ..harness import ServerThread, replay

pytestmark = pytest.mark.e2e

SECRET = "hook-secret"


class Receiver:
    """An HTTP receiver on a free loopback port that fails its first ``failures`` requests with 500;
    with ``held``, it answers no request until :meth:`release` (a receiver that hangs)."""

    def __init__(self, failures: int, held: bool = False) -> None:
        self.requests: list[dict[str, Any]] = []
        self.failures = failures
        self.gate = threading.Event()
        if not held:
            self.gate.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the library's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                failing = len(receiver.requests) < receiver.failures
                receiver.requests.append({"headers": dict(self.headers), "body": body, "status": 500 if failing else 200})
                receiver.gate.wait(300)  # bounded; released at the latest when the test leaves the receiver
                self.send_response(500 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def release(self) -> None:
        self.gate.set()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(q["body"]) for q in self.requests if q["status"] == 200]

    def wait_for_transcript(self) -> None:
        for _ in range(3000):  # polls, bounded (60 s): until the transcript event came
            if any(e["event"] == "transcript" for e in self.events()):
                return
            time.sleep(0.02)

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        self.http.shutdown()
        self.http.server_close()


def test_finals_and_the_transcript_arrive_signed_in_order_after_retries(whisper_runner):
    with Receiver(failures=2) as receiver:
        options = WebhookOptions(url=receiver.url, secret=SECRET, initial_backoff_s=0.05, max_backoff_s=0.2, timeout_s=10.0)
        server = ServerThread(whisper_runner, webhooks=options).start()
        try:
            r = asyncio.run(replay(server.url, "cards_16k.wav"))
            for _ in range(3000):  # polls, bounded (60 s): until the transcript was delivered
                if any(q["status"] == 200 and json.loads(q["body"])["event"] == "transcript" for q in receiver.requests):
                    break
                time.sleep(0.02)
            metrics = server.server.metrics.render().decode()
        finally:
            server.stop()
    delivered = [q for q in receiver.requests if q["status"] == 200]
    for q in receiver.requests:
        assert verify(SECRET, q["headers"]["Asr-Signature"], q["body"], now=time.time())
    assert receiver.requests[0]["headers"]["Asr-Attempt"] == "1" and delivered[0]["headers"]["Asr-Attempt"] == "3"
    assert len({q["headers"]["Asr-Delivery"] for q in delivered}) == len(delivered)  # each delivered once
    events = [json.loads(q["body"]) for q in delivered]
    finals = [m.message for m in r.messages if m.message["type"] == "final" and m.message["text"]]
    assert [e["message"] for e in events if e["event"] == "final"] == finals  # every final, in order
    # Every revision and settled message too, among the finals as the stream had them: a receiver
    # that applies them as a client does holds the revised transcript before the session ends.
    changes = [m.message for m in r.messages if m.message["type"] in ("revision", "settled") or m.message in finals]
    assert [e["message"] for e in events[:-1]] == changes and all(e["event"] == e["message"]["type"] for e in events[:-1])
    assert [e["number"] for e in events] == list(range(1, len(events) + 1))  # a receiver can tell it missed none
    from asr_client import Transcript

    held = Transcript()
    for e in events[:-1]:
        held.apply(e["message"])
    assert events[-1]["event"] == "transcript" and events[-1]["transcript"]["complete"]
    assert events[-1]["transcript"]["channels"][0]["text"] == r.transcript().final_text(0) == held.final_text(0)
    assert 'asr_webhook_deliveries_total{outcome="retried"} 2.0' in metrics


def test_a_receiver_gets_only_the_events_it_was_set_up_for(whisper_runner):
    """``--webhook-events final,transcript``: the first-pass finals and the revised transcript at the
    end, no revision or settled event (the stream itself still gets them)."""
    with Receiver(failures=0) as receiver:
        options = WebhookOptions(url=receiver.url, initial_backoff_s=0.05, max_backoff_s=0.2, timeout_s=10.0, events=frozenset({"final", "transcript"}))
        server = ServerThread(whisper_runner, webhooks=options).start()
        try:
            r = asyncio.run(replay(server.url, "cards_16k.wav"))
            for _ in range(3000):  # polls, bounded (60 s): until the transcript was delivered
                if any(json.loads(q["body"])["event"] == "transcript" for q in receiver.requests):
                    break
                time.sleep(0.02)
        finally:
            server.stop()
    events = [json.loads(q["body"]) for q in receiver.requests]
    finals = [m.message for m in r.messages if m.message["type"] == "final" and m.message["text"]]
    assert [e["message"] for e in events[:-1]] == finals and events[-1]["event"] == "transcript"
    assert [e["number"] for e in events] == list(range(1, len(events) + 1))  # numbered among the events it gets
    assert events[-1]["transcript"]["channels"][0]["text"] == r.transcript().final_text(0)


def test_the_whole_transcript_outlasts_the_replay_log(whisper_runner):
    """A session longer than its replay log holds (here 1500 bytes, some seconds of messages; by
    default 2 MiB, about 40 minutes of continuous speech): the webhook's transcript at the end and ``GET
    .../transcript`` after it still hold the whole of it, from the first final, and say it is
    not truncated; the replay log itself (for a resume and for followers) kept only its tail."""
    with Receiver(failures=0) as receiver:
        options = WebhookOptions(url=receiver.url, secret=SECRET, initial_backoff_s=0.05, max_backoff_s=0.2, timeout_s=10.0)
        server = ServerThread(whisper_runner, Limits(max_replay_bytes=1500), webhooks=options).start()
        try:
            r = asyncio.run(replay(server.url, "cards_16k.wav"))
            sid = r.messages[0].message["session_id"]
            for _ in range(3000):  # polls, bounded (60 s): until the transcript was delivered
                if any(json.loads(q["body"])["event"] == "transcript" for q in receiver.requests):
                    break
                time.sleep(0.02)
            with urllib.request.urlopen(f"{server.http}/v1/sessions/{sid}/transcript", timeout=30) as answer:
                got = json.loads(answer.read())
            with urllib.request.urlopen(f"{server.http}/v1/sessions/{sid}/transcript?format=srt&line_chars=20&lines=1", timeout=30) as answer:
                narrow = answer.read().decode()
            refused = {}
            for query in ("format=xml", "format=srt&lines=9", "format=vtt&line_chars=wide"):
                with pytest.raises(urllib.error.HTTPError) as error:
                    urllib.request.urlopen(f"{server.http}/v1/sessions/{sid}/transcript?{query}", timeout=30)
                refused[query] = (error.value.code, json.loads(error.value.read())["code"])
            replay_log = server.server.ended.get(sid, time.monotonic()).log
        finally:
            server.stop()
    hooked = next(json.loads(q["body"])["transcript"] for q in receiver.requests if json.loads(q["body"])["event"] == "transcript")
    whole = r.transcript().final_text(0)
    assert replay_log.oldest > 1 and sum(len(m.message["text"]) for m in r.of_type("final")) > 0
    for t in (hooked, got):
        assert t["complete"] and not t["truncated"]
        assert t["channels"][0]["text"] == whole and t["channels"][0]["segments"][0]["start"] < 2.0
    # Subtitles as narrow as asked: one line of 20 characters a cue (a longer word alone), every word kept.
    blocks = [block.split("\n") for block in narrow.strip().split("\n\n")]
    assert all(len(b) == 3 and (len(b[2]) <= 20 or " " not in b[2]) for b in blocks), narrow
    assert " ".join(b[2] for b in blocks) == whole
    assert refused == {q: (400, "invalid_option") for q in refused}


def test_a_receiver_that_never_answers_does_not_slow_the_stream(whisper_runner):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # accepts connections (the kernel does), never answers
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
    server = ServerThread(whisper_runner, webhooks=WebhookOptions(url=url, timeout_s=0.5, max_attempts=2, initial_backoff_s=0.05)).start()
    try:
        r = asyncio.run(replay(server.url, "cards_16k.wav"))
        for _ in range(3000):  # polls, bounded: the first delivery was given up
            if 'asr_webhook_deliveries_total{outcome="failed"}' in server.server.metrics.render().decode():
                break
            time.sleep(0.02)
        metrics = server.server.metrics.render().decode()
    finally:
        server.stop()
        silent.close()
    assert r.messages[-1].message["type"] == "closed" and r.final_text()  # the stream finished, every final sent
    assert 'asr_webhook_deliveries_total{outcome="failed"}' in metrics
    assert 'outcome="delivered"' not in metrics


def test_a_receiver_that_hangs_delays_only_its_own_deliveries(whisper_runner):
    """A call names its own receiver (``callback``), which takes requests and does not answer: the
    server's webhook still gets every event of the call, the transcript included, while the
    hanging one holds its first; once it answers, it gets the same events, in order."""
    from .test_twilio import twilio_call

    with Receiver(failures=0) as main, Receiver(failures=0, held=True) as hanging:
        options = WebhookOptions(url=main.url, allowed_prefixes=(hanging.url,), timeout_s=60.0, initial_backoff_s=0.05)
        server = ServerThread(whisper_runner, webhooks=options).start()
        try:
            _, code = asyncio.run(twilio_call(server.url, asyncio.Event(), {"callback": hanging.url}))
            main.wait_for_transcript()
            main_meanwhile, held_meanwhile = main.events(), len(hanging.requests)
            hanging.release()
            hanging.wait_for_transcript()
        finally:
            server.stop()
    assert code == 1000
    assert main_meanwhile and main_meanwhile[-1]["event"] == "transcript"  # all of it, while the other hung
    assert held_meanwhile == 1  # the hanging receiver's first request, unanswered; one at a time per receiver
    assert hanging.events() == main.events() == main_meanwhile  # then everything, in order
    assert [e["number"] for e in main.events()] == list(range(1, len(main.events()) + 1))
