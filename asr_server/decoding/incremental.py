"""The incremental decoder of one channel: utterances and hypotheses in, results out.

Feed it the chunker's events and the results of the decodes it asked for;
it answers with :class:`~asr_server.events.SubmitJob` (a decode to run),
:class:`~asr_server.events.SpeechStart`, :class:`~asr_server.events.Interim`
and :class:`~asr_server.events.Final`. It never runs a model itself.

Rules it keeps:

* At most one decode in flight per channel, and finals in utterance order:
  an utterance's final always comes before anything of the next one, so the
  next utterance's ``offset`` and prompt are known when it is decoded.
* Interims re-decode the open utterance from its start whenever it has grown
  by ``interim_ms`` and the speaker is talking (not in a pause); stability
  follows LocalAgreement-2 and the stable words are forced as the decoder's
  prefix (:mod:`.stability`).
* When speech pauses (``tail_ms`` of silence), a final-quality decode of the
  utterance up to that point starts at once. If the endpoint then comes with
  no new speech, the final audio is identical and that result is the final:
  the endpoint wait and the decode overlap instead of adding up. If speech
  resumes, the result was just another interim.
* Offsets: a channel's transcript is its non-empty final texts joined by
  single spaces; ``offset`` is where the utterance starts in it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..audio.buffer import AudioBuffer
from ..audio.chunker import ChunkEvent, EndReason, UtteranceAudio, UtteranceEnded, UtterancePaused, UtteranceStarted
from ..audio.decode import MODEL_RATE
from ..events import DecodeJob, Final, Interim, PipelineEvent, SpeechStart, SubmitJob, WithdrawJob
from ..inference.types import DecodeKind, DecodeRequest, Hypothesis, Word
from ..options import StreamOptions
from .stability import LocalAgreement
from .text import guard

__all__ = ["ChannelDecoder", "PROMPT_CHARS"]

# Context given to the model: the channel's previous final only, cut to this
# many characters. Measured on the fixtures (README, "Decoding choices"): a
# longer history lets one misheard word or a hallucinated "Thank you" spread
# into every later final; the last final alone keeps style and names.
PROMPT_CHARS = 120
PROMPT_MIN_WORD_PROBABILITY = 0.5


@dataclass(eq=False)
class _Utterance:
    index: int
    start: int
    speech_at: int
    audio: AudioBuffer = field(default_factory=AudioBuffer)
    voiced: int = 0
    last_voiced_end: int = 0
    interim_len: int = 0  # audio length at the last interim request
    agreement: LocalAgreement = field(default_factory=LocalAgreement)
    last_interim: tuple[str, int] | None = None
    paused_at: int | None = None
    in_silence: bool = False  # the newest audio was not speech
    spec_requested: int | None = None
    spec: tuple[int, Hypothesis] | None = None
    ended: UtteranceEnded | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.audio)


class ChannelDecoder:
    def __init__(self, channel: int, options: StreamOptions) -> None:
        self.channel = channel
        self.options = options
        self._utterances: OrderedDict[int, _Utterance] = OrderedDict()
        self._in_flight: DecodeJob | None = None
        self._transcript_len = 0
        self._prompt = ""
        self._carry: tuple[np.ndarray, int] | None = None  # (audio, voiced samples) after a max-length cut
        self.transcribed_samples = 0
        # Audio an utterance must grow by between interim decodes; the server
        # raises it under load (fewer, larger interims) and lowers it again.
        self.interim_ms = options.interim_ms
        self.interim_model = False  # interims on the server's smaller interim model
        self.interim_short_window = False  # interims on the model's short encoder window
        self._withdrawn: DecodeJob | None = None  # the in-flight job already withdrawn

    # -- state the session looks at -------------------------------------------------

    @property
    def pending_finals(self) -> int:
        return sum(1 for u in self._utterances.values() if u.ended is not None)

    @property
    def idle(self) -> bool:
        return not self._utterances and self._in_flight is None

    @property
    def in_flight(self) -> DecodeJob | None:
        return self._in_flight

    # -- inputs ---------------------------------------------------------------------

    def feed(self, events: list[ChunkEvent]) -> list[PipelineEvent]:
        out: list[PipelineEvent] = []
        for event in events:
            match event:
                case UtteranceStarted():
                    out.extend(self._started(event))
                case UtteranceAudio():
                    self._audio(event)
                case UtterancePaused():
                    self._utterances[event.utterance].paused_at = event.end
                case UtteranceEnded():
                    self._ended(event)
        out.extend(self._dispatch())
        job = self._in_flight
        if job is not None and job is not self._withdrawn and self._stale(job):
            # A queued interim would hold this channel's pause decode (or a resumed
            # pause decode its interims) until the scheduler reached it: under load,
            # seconds. Ask for it to be answered as skipped now.
            self._withdrawn = job
            out.append(WithdrawJob(job))
        return out

    def refresh(self, job: DecodeJob) -> DecodeJob | None:
        """The scheduler is about to run ``job``: the job to run instead, or None to skip it.

        Finals run as asked, except a pause decode (speculative) after which
        speech resumed: it is skipped. A waiting interim takes the newest audio of its
        utterance (the stable prefix cannot have moved: it is the only job in
        flight); it is skipped once the utterance has paused or ended, since a
        final-quality decode is owed next. Call :meth:`job_skipped` when the
        skip is reported.
        """
        if job is not self._in_flight:
            return job
        if self._stale(job):
            return None
        if job.request.kind is DecodeKind.FINAL:
            return job
        utt = self._utterances[job.utterance]  # an interim that is not stale: its utterance is open
        if utt.end == job.audio_end:
            return job
        utt.interim_len = len(utt.audio)
        fresh = self._submit(utt, DecodeKind.INTERIM, utt.end, speculative=False).job
        return fresh

    def _stale(self, job: DecodeJob) -> bool:
        """Whether the result of ``job`` (in flight) is no longer wanted.

        An interim is stale once its utterance has paused or ended (a
        final-quality decode is owed next); a pause decode once the speaker
        went on talking (it can no longer become the final).
        """
        utt = self._utterances.get(job.utterance)
        if job.request.kind is DecodeKind.FINAL:
            return job.speculative and utt is not None and utt.ended is None and utt.paused_at != job.audio_end
        return utt is None or utt.ended is not None or utt.paused_at is not None

    def job_skipped(self, job: DecodeJob) -> list[PipelineEvent]:
        """The scheduler skipped ``job`` (see :meth:`refresh`): decide what runs next."""
        if job is not self._in_flight:
            raise ValueError("skip reported for a job that is not in flight on this channel")
        self._in_flight = None
        return self._dispatch()

    def job_failed(self, job: DecodeJob) -> list[PipelineEvent]:
        """The model could not decode ``job``, even after the scheduler's retry.

        An interim or a pause decode is dropped as if skipped (the next decode
        covers it); a final is given up: its utterance is finalized with empty
        text, so the transcript and later offsets go on.
        """
        if job is not self._in_flight:
            raise ValueError("failure reported for a job that is not in flight on this channel")
        self._in_flight = None
        utt = self._utterances.get(job.utterance)
        out: list[PipelineEvent] = []
        if utt is not None and job.request.kind is DecodeKind.FINAL and not job.speculative:
            out.extend(self._finalize(utt, Hypothesis(text="", dropped=("decode_failed",))))
        out.extend(self._dispatch())
        return out

    def job_done(self, job: DecodeJob, hypothesis: Hypothesis) -> list[PipelineEvent]:
        """Hand back the result of the job this decoder submitted last."""
        if job is not self._in_flight:
            raise ValueError("result for a job that is not in flight on this channel")
        self._in_flight = None
        utt = self._utterances.get(job.utterance)
        out: list[PipelineEvent] = []
        if utt is not None:
            audio_s = len(job.request.audio) / MODEL_RATE
            hyp = guard(hypothesis, audio_s, utt.voiced / MODEL_RATE)
            if job.request.kind is DecodeKind.FINAL and not job.speculative:
                out.extend(self._finalize(utt, hyp))
            else:
                if job.speculative:
                    utt.spec = (job.audio_end, hyp)
                out.extend(self._interim(utt, hyp, job.audio_end))
        out.extend(self._dispatch())
        return out

    # -- chunker events -------------------------------------------------------------

    def _started(self, event: UtteranceStarted) -> list[PipelineEvent]:
        utt = _Utterance(event.utterance, event.start, event.speech_at)
        self._utterances[event.utterance] = utt
        if event.continuation and self._carry is not None:
            samples, voiced = self._carry
            utt.audio.append(samples)
            utt.voiced = voiced
            utt.last_voiced_end = utt.end
            self._carry = None
            return []
        return [SpeechStart(self.channel, event.speech_at / MODEL_RATE, event.utterance)]

    def _audio(self, event: UtteranceAudio) -> None:
        utt = self._utterances[event.utterance]
        utt.audio.append(event.samples)
        utt.in_silence = not event.voiced
        if event.voiced:
            utt.voiced += event.voiced
            utt.last_voiced_end = utt.end
            utt.paused_at = None  # speech resumed

    def _ended(self, event: UtteranceEnded) -> None:
        utt = self._utterances[event.utterance]
        utt.ended = event
        if event.reason is EndReason.MAX_LENGTH:
            keep = event.end - utt.start
            rest = utt.audio.copy(keep)
            # Voiced share of the remainder, estimated by length (it is speech: no endpoint came).
            moved = int(utt.voiced * len(rest) / max(1, len(utt.audio)))
            utt.voiced -= moved
            self._carry = (rest, moved)
            utt.last_voiced_end = min(utt.last_voiced_end, event.end)

    # -- scheduling decodes ---------------------------------------------------------

    def _dispatch(self) -> list[PipelineEvent]:
        out: list[PipelineEvent] = []
        while self._in_flight is None and self._utterances:
            utt = next(iter(self._utterances.values()))
            if utt.ended is not None:
                end = utt.ended.end
                if utt.spec is not None and utt.spec[0] == end:
                    out.extend(self._finalize(utt, utt.spec[1]))
                    continue
                if utt.voiced == 0 or end <= utt.start:
                    out.extend(self._finalize(utt, Hypothesis(text="")))
                    continue
                out.append(self._submit(utt, DecodeKind.FINAL, end, speculative=False))
                break
            if utt.paused_at is not None and utt.spec_requested != utt.paused_at:
                utt.spec_requested = utt.paused_at
                out.append(self._submit(utt, DecodeKind.FINAL, utt.paused_at, speculative=True))
                break
            grown = len(utt.audio) - utt.interim_len
            # No interim decode while the speaker is silent: speech may be ending, and a
            # decode in flight would delay the pause decode that becomes the final.
            if self.options.interim_results and not utt.in_silence and grown * 1000 >= self.interim_ms * MODEL_RATE:
                utt.interim_len = len(utt.audio)
                out.append(self._submit(utt, DecodeKind.INTERIM, utt.end, speculative=False))
            break
        return out

    def _submit(self, utt: _Utterance, kind: DecodeKind, end: int, *, speculative: bool) -> SubmitJob:
        final = kind is DecodeKind.FINAL
        request = DecodeRequest(
            audio=utt.audio.copy(0, end - utt.start),
            kind=kind,
            language=self.options.language,
            prompt=self._prompt,
            prefix="" if final else utt.agreement.stable_text,
            # Finals are always aligned: the guards use word timing even when the client did not ask for it.
            word_timestamps=final,
            model="interim" if self.interim_model and not final else "",
            short_window=self.interim_short_window and not final,
        )
        job = DecodeJob(self.channel, utt.index, request, speculative, end)
        self._in_flight = job
        return SubmitJob(job)

    # -- results --------------------------------------------------------------------

    def _next_offset(self) -> int:
        return self._transcript_len + 1 if self._transcript_len else 0

    def _interim(self, utt: _Utterance, hyp: Hypothesis, audio_end: int) -> list[PipelineEvent]:
        if not self.options.interim_results or not hyp.text:
            return []
        text, stable = utt.agreement.update(hyp.text.split())
        if utt.last_interim == (text, stable):
            return []
        utt.last_interim = (text, stable)
        return [
            Interim(
                channel=self.channel,
                utterance=utt.index,
                offset=self._next_offset(),
                text=text,
                stable=stable,
                start=round(utt.speech_at / MODEL_RATE, 3),
                end=round(audio_end / MODEL_RATE, 3),
            )
        ]

    def _finalize(self, utt: _Utterance, hyp: Hypothesis) -> list[PipelineEvent]:
        assert utt.ended is not None
        del self._utterances[utt.index]
        offset = self._next_offset()
        text = hyp.text
        base = utt.start / MODEL_RATE
        words = tuple(Word(w.word, round(base + w.start, 3), round(base + w.end, 3), w.probability) for w in hyp.words)
        sent_words = words if self.options.word_timestamps else ()
        start, end = utt.speech_at / MODEL_RATE, utt.ended.end / MODEL_RATE
        if words:
            start, end = words[0].start, min(end, max(words[-1].end, words[0].start))
        if text:
            self._transcript_len = offset + len(text)
            # Only a confidently heard final becomes context: a doubtful word in the
            # prompt is copied into the next final (measured: "old-sposed" twice).
            confident = all(w.probability >= PROMPT_MIN_WORD_PROBABILITY for w in hyp.words)
            self._prompt = _tail_words(text, PROMPT_CHARS) if confident else ""
        self.transcribed_samples += utt.ended.end - utt.start
        out: list[PipelineEvent] = []
        if self.options.interim_results and text and utt.last_interim is None:
            # Guarantee: a client always sees an interim before a non-empty final, even
            # when the utterance ended before any interim decode ran (audio sent fast).
            out.append(Interim(self.channel, utt.index, offset, text, 0, round(utt.speech_at / MODEL_RATE, 3), round(utt.ended.end / MODEL_RATE, 3)))
        return out + [
            Final(
                channel=self.channel,
                utterance=utt.index,
                offset=offset,
                text=text,
                start=round(start, 3),
                end=round(end, 3),
                reason=utt.ended.reason,
                words=sent_words,
                speech_end=round(max(utt.last_voiced_end, utt.start) / MODEL_RATE, 3),
                dropped=hyp.dropped,
            )
        ]


def _tail_words(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    space = cut.find(" ")
    return cut[space + 1 :] if space >= 0 else cut
