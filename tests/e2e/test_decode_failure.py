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


def test_a_fault_in_taking_audio_costs_a_piece_of_it_not_the_stream(live_server, monkeypatch, caplog):
    """A server bug in taking audio (here: the chunker raises once, 3 s into the reading's first
    sentence): the client gets ``audio_dropped`` for that utterance, which ends with the audio
    before the piece, and the rest of the reading is transcribed as usual, through to ``closed``;
    operators get ``asr_answer_failures_total{decode="audio"}`` and the traceback. Such a bug used
    to end the session with ``internal_error``."""
    import urllib.request

    from asr_server.audio.chunker import Chunker

    feed, left = Chunker.feed, [1]

    def faulty(chunker, frames):
        if left[0] and frames and frames[0].end >= 3 * 16000:
            left[0] -= 1
            raise RuntimeError("a fault in taking audio")
        return feed(chunker, frames)

    def counted() -> float:
        text = urllib.request.urlopen(live_server.http + "/metrics", timeout=10).read().decode()
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith('asr_answer_failures_total{decode="audio"}'))

    before = counted()
    monkeypatch.setattr(Chunker, "feed", faulty)
    r = asyncio.run(replay(live_server.url, "librivox_16k.wav"))
    msgs = [m.message for m in r.messages]
    assert [m["seq"] for m in msgs] == list(range(1, len(msgs) + 1)) and msgs[-1]["type"] == "closed"
    (error,) = [m.message for m in r.of_type("error")]
    assert (error["code"], error["retryable"], error["utterance"]) == ("audio_dropped", True, 0)
    finals = [m.message for m in r.of_type("final")]
    assert finals[0]["utterance"] == 0 and finals[0]["reason"] == "finalize" and finals[0]["end"] < 4.0  # not at 7.5 s
    assert finals[0]["seq"] > error["seq"] and "dashwood" in finals[0]["text"].lower()
    assert [f["utterance"] for f in finals] == list(range(len(finals)))
    reference = " ".join(MANIFEST["librivox_16k.wav"]["references"][0])
    assert wer(reference, r.transcript().final_text(0)) < 0.25  # a tenth of a second lost, the rest heard
    assert counted() == before + 1
    logged = [rec for rec in caplog.records if "event=answer_failed decode=audio" in rec.getMessage()]
    assert len(logged) == 1 and str(logged[0].exc_info[1]) == "a fault in taking audio"
