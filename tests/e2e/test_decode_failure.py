"""End to end: a model that raises on one utterance costs that utterance, not the session or the server."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ..harness import MANIFEST, ServerThread, replay
from ..wer import wer

pytestmark = pytest.mark.e2e

POISON_S = 6.5  # librivox's first sentence lasts 7.0 s; the others at most 5.84 s


class FaultyRunner:
    """The real model, except that any call holding a final of POISON_S or more raises."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.languages = runner.languages
        self.raised = 0
        self._lock = threading.Lock()

    def batch_key(self, request):
        return self.runner.batch_key(request)

    def window_frames(self, request):
        return self.runner.window_frames(request)

    def transcribe_batch(self, requests, retry_later=False):
        if any(r.kind.value == "final" and r.duration >= POISON_S for r in requests):
            with self._lock:
                self.raised += 1
            raise RuntimeError("injected model fault")
        return self.runner.transcribe_batch(requests, retry_later=retry_later)


def test_a_final_the_model_fails_on_gets_decode_failed_and_the_stream_and_its_neighbours_go_on(whisper_runner):
    faulty = FaultyRunner(whisper_runner)
    server = ServerThread(faulty, workers=1).start()
    try:
        async def both():
            return await asyncio.gather(
                replay(server.url, "librivox_16k.wav"),
                replay(server.url, "espeak_16k.wav"),  # a neighbour whose finals may share the failing batch
            )

        hurt, neighbour = asyncio.run(both())
    finally:
        server.stop()
    msgs = [m.message for m in hurt.messages]
    assert [m["seq"] for m in msgs] == list(range(1, len(msgs) + 1))
    errors = hurt.of_type("error")
    assert [e.message["code"] for e in errors] == ["decode_failed"]
    assert errors[0].message["retryable"] is True and errors[0].message["utterance"] == 0
    finals = [m.message for m in hurt.of_type("final")]
    assert finals[0]["utterance"] == 0 and finals[0]["text"] == ""
    # The other four sentences are transcribed as usual, and the session ends normally.
    rest = " ".join(f["text"] for f in finals[1:])
    assert wer(" ".join(MANIFEST["librivox_16k.wav"]["references"][0][1:]), rest) < 0.25
    assert msgs[-1]["type"] == "closed"
    assert faulty.raised >= 2  # the first call and its retry alone
    # The neighbour never saw an error and got all its finals.
    assert not neighbour.of_type("error") and neighbour.of_type("closed")
    assert wer(" ".join(MANIFEST["espeak_16k.wav"]["references"][0]), neighbour.final_text()) < 0.3
