"""The session core: one stream's whole pipeline, with no I/O and no clock.

A transport shell creates a :class:`Session`, calls :meth:`Session.start`,
then feeds it 16 kHz planar audio, client commands and decode results, and
carries out what each call returns, in order:

* :class:`Send` - write this JSON message to the client;
* :class:`~asr_server.events.SubmitJob` - run this decode job, then call
  :meth:`Session.job_done` (or :meth:`Session.job_skipped` if the scheduler
  skipped it after :meth:`Session.refresh_job` said so, or
  :meth:`Session.job_failed` if the model could not decode it);
* :class:`~asr_server.events.WithdrawJob` - if that submitted job is still
  waiting, have it skipped now (then :meth:`Session.job_skipped` as above);
  if it already runs, call :meth:`Session.job_running` (the core may go on
  without its answer, which is still handed back when it comes);
* :class:`Close` - close the connection with this code (the last output).

Per channel the data flows VAD -> chunker -> incremental decoder.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from .audio.chunker import ChunkEvent, Chunker, ChunkerOptions, EndReason
from .audio.decode import MODEL_RATE
from .audio.vad import VadGate, VadOptions
from .decoding.context import ContextOptions
from .decoding.incremental import ChannelDecoder
from .errors import AsrError, AudioDropped, DecodeFailed, ServerError, wire_info
from .events import AnswerFailed, ContextDecided, DecodeJob, Final, Interim, PipelineEvent, Revision, Settled, SpeechStart, SplitUtterance, SubmitJob, WithdrawJob
from .inference.level import talker_gain_db
from .inference.types import DecodeKind, Hypothesis
from .options import Limits, StreamOptions
from .protocol.messages import MessageWriter
from .scheduler.governor import LoadSettings

__all__ = ["SessionState", "Send", "Close", "SessionOutput", "Session"]


# A channel listens afresh after a fault in taking its audio (Session._channel_audio) this many
# times in a session; the next such fault ends the session (internal_error), as a fault that
# comes back with every piece of audio would otherwise drop them all, one audio_dropped each.
MAX_CHANNEL_RESTARTS = 3

# An upload sent faster than real time (a file, ``--fast``) is read no further while a channel's
# context pass is running and this much of its finalized speech waits for one. Before, on a busy
# server its finals came at the model's speed and its passes fell behind: its oldest finals were
# trimmed (a channel keeps the last 30 s or so) before a pass decided them, and the close gave the
# rest context_close_s, so it got much of its first-pass transcript. 20 s stays under what a
# channel keeps; with 12 an idle server took a 232 s file 1.45 times as long as unheld, with 20
# 1.1 times (docs/benchmarks.md, ninety-fifth session). A live stream is never held for its passes.
PACE_PASSES_S = 20.0
# ... and "faster than real time" is this far ahead of the wall clock since its first audio.
PACE_AHEAD_S = 5.0


class SessionState(enum.IntEnum):
    """Ordered: a later state never goes back to an earlier one."""

    NEW = 0
    STREAMING = 1
    DRAINING = 2  # no more audio: finishing the decodes already owed
    CLOSED = 3


@dataclass(frozen=True)
class Send:
    message: dict[str, Any]
    event: SpeechStart | Interim | Final | Revision | Settled | None = None


@dataclass(frozen=True)
class Close:
    code: int
    reason: str


SessionOutput = Send | SubmitJob | WithdrawJob | ContextDecided | AnswerFailed | Close


class Session:
    def __init__(
        self,
        session_id: str,
        options: StreamOptions,
        limits: Limits = Limits(),
        model_name: str = "",
        vad_options: VadOptions = VadOptions(),
        webrtc: dict[str, Any] | None = None,
        context: ContextOptions | None = None,
        key: str | None = None,
        resume_token: str | None = None,
        extra: dict[str, Any] | None = None,
        first_seq: int = 0,
    ) -> None:
        """``webrtc``: what the ``session`` message tells a WebRTC client (its ICE servers);
        ``context``: the context pass's settings (default: on when ``options.revisions``);
        ``key``: the name of the API key the stream came in with; ``resume_token``: what the
        client presents to take the session up again after its connection dropped; ``extra``:
        more for the ``session`` message (a call's ids); ``first_seq``: the seq before this
        session's first message (a session re-made before any audio goes on in sequence)."""
        self.session_id = session_id
        self.key = key
        self.resume_token = resume_token
        self._webrtc = webrtc
        self.options = options
        self.limits = limits
        self.model_name = model_name
        self.state = SessionState.NEW
        self._writer = MessageWriter(session_id)
        self._writer.seq = first_seq
        self._extra = extra
        self._chunker_options = ChunkerOptions(endpoint_ms=options.endpoint_ms, max_utterance_s=options.max_utterance_s)
        self._vad_options = vad_options.for_rate(options.sample_rate)
        self._vads = [VadGate(self._vad_options) for _ in range(options.channels)]
        self._chunkers = [Chunker(self._chunker_options) for _ in range(options.channels)]
        context = context or ContextOptions()
        context = replace(context, enabled=context.enabled and options.revisions)
        self._decoders = [ChannelDecoder(c, options, context, vad_options.talker_final_db) for c in range(options.channels)]
        self._received = 0  # samples per channel at 16 kHz
        self._restarts = [0] * options.channels  # times each channel listened afresh after a fault in taking audio
        self._close_code = 1000
        self._close_reason = "closed"

    # -- what the shell may ask ------------------------------------------------------

    @property
    def audio_received_s(self) -> float:
        return self._received / MODEL_RATE

    @property
    def audio_transcribed_s(self) -> float:
        return sum(d.transcribed_samples for d in self._decoders) / MODEL_RATE

    @property
    def backpressured(self) -> bool:
        """True while the shell should stop reading audio: too many finals owed."""
        return any(d.pending_finals >= self.limits.max_pending_finals for d in self._decoders)

    def held_for_passes(self, elapsed_s: float) -> bool:
        """True while the shell should stop reading an upload (``elapsed_s``: wall-clock seconds
        since its first audio) for its context passes to catch up (:data:`PACE_PASSES_S`). A stream
        found ahead of real time has its passes take its finals in order from then on
        (``ChannelDecoder.in_order_passes``): none is left to its first pass."""
        if self.audio_received_s - elapsed_s <= PACE_AHEAD_S:
            return False
        for d in self._decoders:
            d.in_order_passes = True
        return any(d.passes_behind_s > PACE_PASSES_S for d in self._decoders)

    @property
    def received_samples(self) -> int:
        return self._received

    # -- inputs ----------------------------------------------------------------------

    def start(self, announce: bool = True) -> list[SessionOutput]:
        """Streaming from now on; ``announce``: with the ``session`` message (a session re-made
        for new options before any audio may go on without one)."""
        self._transition(SessionState.NEW, SessionState.STREAMING)
        if not announce:
            return []
        return [Send(self._writer.session(self.options, self.limits, self.model_name, self._webrtc, self.key, self.resume_token, self._extra))]

    @property
    def seq(self) -> int:
        """The last message's seq."""
        return self._writer.seq

    def resumed(self, audio_received_s: float, audio_received_bytes: int, commands_received: int, replayed: int) -> list[SessionOutput]:
        """The client is back (its missed messages were replayed): tell it where to resume its input from."""
        if self.state is SessionState.CLOSED:
            return []
        return [Send(self._writer.resumed(audio_received_s, audio_received_bytes, commands_received, replayed))]

    def heartbeat(self) -> list[SessionOutput]:
        """The shell has sent nothing for ``options.heartbeat_s``: a ``heartbeat`` message, while
        the session streams or finishes its last decodes after the client's close."""
        if self.state not in (SessionState.STREAMING, SessionState.DRAINING):
            return []
        return [Send(self._writer.heartbeat(self.audio_received_s))]

    def webrtc_answer(self, sdp: str) -> list[SessionOutput]:
        """The transport answered the client's WebRTC offer: send the answer."""
        if self.state is not SessionState.STREAMING:
            return []
        return [Send(self._writer.webrtc_answer(sdp))]

    def receive_audio(self, planar: np.ndarray) -> list[SessionOutput]:
        """Feed ``(channels, n)`` float32 audio at 16 kHz."""
        if self.state is not SessionState.STREAMING or planar.shape[1] == 0:
            return []
        if planar.shape[0] != self.options.channels:
            raise ValueError(f"expected {self.options.channels} channels, got {planar.shape[0]}")
        self._received += planar.shape[1]
        out: list[SessionOutput] = []
        for c in range(self.options.channels):
            out.extend(self._pipeline(self._channel_audio(c, planar[c])))
            out.extend(self._pipeline(self._decoders[c].advance(self._received)))
        return out

    def _channel_audio(self, c: int, samples: np.ndarray) -> list[PipelineEvent]:
        """Channel ``c``'s VAD, chunker and decoder over ``samples`` (:meth:`_taken`)."""

        def events() -> list[ChunkEvent]:
            vad = self._vads[c]
            frames = vad.feed(samples)
            self._decoders[c].gain_db = talker_gain_db(vad.talker_level)
            return self._chunkers[c].feed(frames)

        return self._taken(c, events)

    def _taken(self, c: int, events_of: Callable[[], list[ChunkEvent]]) -> list[PipelineEvent]:
        """What channel ``c``'s decoder makes of ``events_of()``, its VAD and chunker at work. Where
        one of them raises (a bug, not the client's audio: that was checked as it was decoded), the
        audio they were taking is dropped, the channel's open utterance ends where its audio ends
        (:meth:`ChannelDecoder.feed_contained`), and the channel listens afresh from the next piece
        with a new VAD and chunker: at most ``MAX_CHANNEL_RESTARTS`` times, after which such a
        fault ends the session."""
        out, next_utterance = self._decoders[c].feed_contained(events_of, contain=self._restarts[c] < MAX_CHANNEL_RESTARTS)
        if next_utterance is not None:
            self._restarts[c] += 1
            self._vads[c] = VadGate(self._vad_options, origin=self._received)
            self._chunkers[c] = Chunker(self._chunker_options, origin=self._received, first_utterance=next_utterance)
        return out

    def finalize(self) -> list[SessionOutput]:
        """The client's ``finalize``: close every open utterance now."""
        if self.state is not SessionState.STREAMING:
            return []
        out: list[SessionOutput] = []
        for c in range(self.options.channels):
            out.extend(self._pipeline(self._taken(c, partial(self._chunkers[c].end, EndReason.FINALIZE))))
        return out

    def end_of_stream(self) -> list[SessionOutput]:
        """No more audio: finalize everything held, then ``closed`` and close 1000."""
        if self.state is not SessionState.STREAMING:
            return []
        return self._drain()

    def refresh_job(self, job: DecodeJob) -> DecodeJob | None:
        """The scheduler is about to run ``job``: what to run instead (None: skip it)."""
        if self.state is SessionState.CLOSED:
            return None
        return self._decoders[job.channel].refresh(job)

    def job_skipped(self, job: DecodeJob) -> list[SessionOutput]:
        if self.state is SessionState.CLOSED:
            return []
        out = self._pipeline(self._decoders[job.channel].job_skipped(job))
        return out + self._maybe_closed()

    def close_context(self) -> list[SessionOutput]:
        """The time after close for the context pass ran out: withdraw what still waits, then close."""
        if self.state is not SessionState.DRAINING:
            return []
        out: list[SessionOutput] = []
        for decoder in self._decoders:
            out.extend(self._pipeline(decoder.close_context()))
        return out + self._maybe_closed()

    @property
    def draining(self) -> bool:
        return self.state is SessionState.DRAINING

    def set_load(self, load: LoadSettings) -> list[SessionOutput]:
        """The server's load level changed: adjust interims and context passes, and tell the client if interims change."""
        settings = (self.options.interim_ms * load.scale, load.model, load.short_window)
        changed = False
        for d in self._decoders:
            d.lean_context = load.lean_context
            d.late_context = load.late_context
            d.spare_time = load.settle
            changed |= (d.interim_ms, d.interim_model, d.interim_short_window) != settings
            d.interim_ms, d.interim_model, d.interim_short_window = settings
        if not changed or not self.options.interim_results or self.state is not SessionState.STREAMING:
            return []
        return [Send(self._writer.load(load.level, *settings))]

    def job_done(self, job: DecodeJob, hypothesis: Hypothesis) -> list[SessionOutput]:
        if self.state is SessionState.CLOSED:
            return []
        out = self._pipeline(self._decoders[job.channel].job_done(job, hypothesis))
        return out + self._maybe_closed()

    def job_running(self, job: DecodeJob) -> list[SessionOutput]:
        """A job this core withdrew (:class:`~asr_server.events.WithdrawJob`) was already running."""
        if self.state is SessionState.CLOSED:
            return []
        return self._pipeline(self._decoders[job.channel].job_running(job))

    def job_failed(self, job: DecodeJob) -> list[SessionOutput]:
        """The model could not decode ``job`` (the scheduler already retried a final once).

        An interim or pause decode is dropped; a final is sent with empty text (or the words
        an earlier decode heard, where only its continuation failed),
        preceded by a ``decode_failed`` error naming its utterance. The session
        goes on either way: nothing already owed is lost.
        """
        if self.state is SessionState.CLOSED:
            return []
        out: list[SessionOutput] = []
        if job.request.kind is DecodeKind.FINAL and not job.speculative:
            out.append(self._final_given_up(job.channel, job.utterance))
        out += self._pipeline(self._decoders[job.channel].job_failed(job))
        return out + self._maybe_closed()

    def fail(self, error: AsrError) -> list[SessionOutput]:
        """Report ``error``. If it ends the session, finish what can be finished first."""
        if self.state is SessionState.CLOSED:
            return []
        out: list[SessionOutput] = [Send(self._writer.error(error))]
        code = wire_info(error).close_code
        if code is None:
            return out
        self._close_code, self._close_reason = code, error.code
        if isinstance(error, ServerError) or self.state is SessionState.NEW:
            self.state = SessionState.CLOSED
            return out + [Close(code, error.code)]
        if self.state is SessionState.STREAMING:
            return out + self._drain()
        return out + self._maybe_closed()

    # -- internals -------------------------------------------------------------------

    def _transition(self, expected: SessionState, new: SessionState) -> None:
        if self.state is not expected:
            raise RuntimeError(f"session {self.session_id}: cannot go from {self.state.name} to {new.name}")
        self.state = new

    def _drain(self) -> list[SessionOutput]:
        self._transition(SessionState.STREAMING, SessionState.DRAINING)
        out: list[SessionOutput] = []
        for c in range(self.options.channels):
            out.extend(self._pipeline(self._taken(c, partial(self._last_events, c))))
            out.extend(self._pipeline(self._decoders[c].drain()))
        return out + self._maybe_closed()

    def _last_events(self, c: int) -> list[ChunkEvent]:
        """Channel ``c``'s VAD and chunker at the end of the stream: its last partial frame, then its open utterance closed."""
        return self._chunkers[c].feed(self._vads[c].flush()) + self._chunkers[c].end(EndReason.END_OF_STREAM)

    def _maybe_closed(self) -> list[SessionOutput]:
        if self.state is not SessionState.DRAINING or not all(d.idle for d in self._decoders):
            return []
        self.state = SessionState.CLOSED
        out: list[SessionOutput] = []
        if self._close_code == 1000:
            out.append(Send(self._writer.closed(self.audio_received_s, self.audio_transcribed_s)))
        out.append(Close(self._close_code, self._close_reason))
        return out

    def _final_given_up(self, channel: int, utterance: int) -> Send:
        """The ``decode_failed`` error that goes before a final given up (empty, or with only what an earlier decode heard)."""
        error = DecodeFailed(f"utterance {utterance} of channel {channel} could not be decoded; its final is empty, or holds only what an earlier decode of it heard")
        return Send(self._writer.error(error, channel=channel, utterance=utterance))

    def _audio_dropped(self, channel: int, utterance: int) -> Send:
        """The ``audio_dropped`` error that goes before the final of an utterance a fault in taking audio ended."""
        error = AudioDropped(f"channel {channel}'s audio could not be taken at this point (a fault on the server); the piece being taken was dropped, its open utterance ended there, and the channel listens afresh")
        return Send(self._writer.error(error, channel=channel, utterance=utterance if utterance >= 0 else None))

    def _pipeline(self, events: list[PipelineEvent]) -> list[SessionOutput]:
        out: list[SessionOutput] = []
        for event in events:
            if isinstance(event, AnswerFailed) and event.decode == "final":  # its final given up follows
                out += [event, self._final_given_up(event.channel, event.utterance)]
            elif isinstance(event, AnswerFailed) and event.decode == "audio":  # the utterance's final follows
                out += [event, self._audio_dropped(event.channel, event.utterance)]
            elif isinstance(event, SubmitJob | WithdrawJob | ContextDecided | AnswerFailed):
                out.append(event)
            elif isinstance(event, SplitUtterance):
                c, split = event.channel, event
                out.extend(self._pipeline(self._taken(c, lambda: self._chunkers[c].split(split.utterance, split.lo, split.hi, split.pause_ms, split.at, split.dips))))
            else:
                out.append(Send(self._writer.event(event), event))
        return out
