"""A fake model runner with the real runner's interface, for tests above the model seam."""

from __future__ import annotations

from typing import Callable

from asr_server.inference.types import DecodeKind, DecodeRequest, Hypothesis, Word


class FakeRunner:
    """Answers each request with ``script(request)``; records what it was asked."""

    languages = ("en",)

    def __init__(self, script: Callable[[DecodeRequest], str] | None = None) -> None:
        self.script = script or (lambda r: "hello world")
        self.requests: list[DecodeRequest] = []
        self.batches: list[list[DecodeRequest]] = []

    def batch_key(self, request: DecodeRequest) -> tuple[str, str]:
        return (request.kind.value, request.language)

    def window_frames(self, request: DecodeRequest) -> int:
        return 3000

    def transcribe_batch(self, requests, retry_later: bool = False) -> list[Hypothesis]:
        self.batches.append(list(requests))
        return [self.transcribe(r) for r in requests]

    def transcribe(self, request: DecodeRequest) -> Hypothesis:
        self.requests.append(request)
        text = self.script(request)
        words: tuple[Word, ...] = ()
        if request.word_timestamps and text:
            parts = text.split()
            step = request.duration / (len(parts) + 1)
            words = tuple(Word(" " + w, round(i * step, 3), round((i + 1) * step, 3), 0.9) for i, w in enumerate(parts))
        return Hypothesis(text=text, words=words, avg_logprob=-0.2)


def words_for_length(sentence: str, seconds_per_word: float = 0.3) -> Callable[[DecodeRequest], str]:
    """A script that 'hears' as many words of ``sentence`` as the audio is long."""
    words = sentence.split()

    def script(request: DecodeRequest) -> str:
        n = min(len(words), max(1, int(request.duration / seconds_per_word)))
        if request.kind is DecodeKind.FINAL:
            n = len(words)
        return " ".join(words[:n])

    return script


class SyncDriver:
    """Drives a Session without a server: decode jobs run as soon as they are submitted."""

    def __init__(self, session, runner) -> None:
        from asr_server.events import AnswerFailed
        from asr_server.events import SubmitJob as Submit
        from asr_server.session import Close, Send

        self._types = (Close, Send, Submit, AnswerFailed)
        self.session = session
        self.runner = runner
        self.messages: list[dict] = []
        self.close = None
        self._jobs: list = []
        self.apply(session.start())

    def apply(self, outputs) -> None:
        Close, Send, Submit, AnswerFailed = self._types
        for out in outputs:
            if isinstance(out, Send):
                self.messages.append(out.message)
            elif isinstance(out, AnswerFailed):  # the server contains it, but it is a fault all the same
                raise out.error
            elif isinstance(out, Submit):
                self._jobs.append(out.job)
            elif isinstance(out, Close):
                self.close = out

    def run_jobs(self) -> None:
        while self._jobs:
            job = self._jobs.pop(0)
            self.apply(self.session.job_done(job, self.runner.transcribe(job.request)))

    def feed(self, planar, piece: int = 1600) -> None:
        for i in range(0, planar.shape[1], piece):
            self.apply(self.session.receive_audio(planar[:, i : i + piece]))
            self.run_jobs()

    def of_type(self, kind: str) -> list[dict]:
        return [m for m in self.messages if m["type"] == kind]
