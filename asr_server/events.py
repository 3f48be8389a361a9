"""What the pipeline tells its transport: one union of frozen events.

Times are seconds of stream audio (from sample counts), never wall clock.
:mod:`asr_server.protocol` turns these into wire messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from .audio.chunker import EndReason
from .inference.types import DecodeRequest, Word

__all__ = ["SpeechStart", "Interim", "Final", "RevisedSegment", "Revision", "Settled", "ContextDecided", "AnswerFailed", "DecodeJob", "SubmitJob", "WithdrawJob", "SplitUtterance", "PipelineEvent"]


@dataclass(frozen=True)
class SpeechStart:
    channel: int
    at: float
    utterance: int = 0


@dataclass(frozen=True)
class Interim:
    channel: int
    utterance: int
    offset: int
    text: str
    stable: int
    start: float
    end: float


@dataclass(frozen=True)
class Final:
    channel: int
    utterance: int
    offset: int
    text: str
    start: float
    end: float
    reason: EndReason
    words: tuple[Word, ...]
    # Seconds of stream audio at which speech ended (for latency metrics).
    speech_end: float
    # Guards that removed text from this final (logs and metrics only, not sent).
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True)
class RevisedSegment:
    """One utterance of a :class:`Revision`: its text starts at ``offset`` in the channel's
    transcript (and runs to the next one's, less the joining space), and it is heard from
    ``start`` to ``end`` (stream seconds: its first and last words, as a final's are)."""

    utterance: int
    offset: int
    start: float
    end: float


@dataclass(frozen=True)
class Revision:
    """The channel's transcript from ``offset`` to the end of its finals is now ``text``.

    It covers every finalized utterance from ``first`` to ``last`` (the
    latest), and comes from the context pass: those utterances decoded
    together, as offline transcription would. ``changed``: the utterances of
    that range whose text it changed, in order (``first``, then those of the
    later ones whose text differs), so that a client can mark them and a
    bench can tell an utterance's first revision from a later one.
    ``settle``: it comes from a settle decode (a stretch decoded once more, whole,
    while the server has time to spare), not from a context pass. ``segments``:
    where each utterance of the range (each with text) sits in ``text`` and in
    time, so that a client showing one line or cue per utterance (a call's turns,
    subtitles) can keep them apart.
    """

    channel: int
    first: int
    last: int
    offset: int
    text: str
    words: tuple[Word, ...]
    changed: tuple[int, ...] = ()
    settle: bool = False
    segments: tuple[RevisedSegment, ...] = ()

    @property
    def pass_name(self) -> str:
        """The decode that sent it, as the wire and the metrics name it: ``settle`` or ``context``."""
        return "settle" if self.settle else "context"


@dataclass(frozen=True)
class Settled:
    """The channel's transcript up to ``offset`` (the end of utterance ``utterance``'s text) is
    final for good: no revision changes it again. Sent when that point moves on: a settle decode
    has decided those utterances, or the channel no longer keeps their audio for any decode."""

    channel: int
    utterance: int
    offset: int


@dataclass(frozen=True)
class ContextDecided:
    """A context pass has decided these finalized ``utterances`` of the channel, having heard them
    (whether or not it changed their text): the pass has caught up with them. ``passed_over``: finals
    it let go unheard, which keep their first-pass text (more waited than one window holds and a
    live stream's pass took the newest, or the pass was skipped or failed). Not sent to the client;
    the transport times the first against each final (``asr_context_lag_seconds``) and counts the
    others (``asr_finals_passed_over_total``)."""

    channel: int
    utterances: tuple[int, ...]
    passed_over: tuple[int, ...] = ()


@dataclass(frozen=True, eq=False)
class AnswerFailed:
    """Handling the answer of a decode raised ``error``: a fault in this server, not in the
    client's audio. The channel went back to where it was before that answer and took it as a
    failed decode's: an interim or a pause decode is dropped, a final is given up (empty text,
    or the words an earlier decode of it heard; the session sends ``decode_failed`` for it), a
    context pass or settle decode ends as a skipped one (the finals keep the text the client
    holds); where the answer was an earlier one taken as an utterance's final once the utterance
    ended (``ended``), that final is decoded instead; where taking a piece of audio raised
    (``audio``), the piece is dropped and the channel's open utterance ends there. The session goes on. Not sent to the client itself; the transport logs it with its
    traceback and counts it (``asr_answer_failures_total``)."""

    channel: int
    utterance: int
    # "interim", "pause" (a final decode at a pause), "final", "context", "settle"; "ended": an
    # earlier answer taken as an ended utterance's final (a pause decode's, or the words of the
    # interim that split it), where the finals are then decoded instead (no decode_failed);
    # "plan": planning a pass raised; it is tried again once another final came, and after
    # PLAN_FAULTS_MAX such faults (or at the close) the channel's passes are given up;
    # "audio": taking a piece of audio raised (ChannelDecoder.feed_contained): the piece is
    # dropped, the open utterance (``utterance``; -1: none) ends there, the session sends
    # audio_dropped, and the channel listens afresh.
    decode: str
    error: Exception


@dataclass(frozen=True, eq=False)
class DecodeJob:
    """A decode the channel wants. Identity matters: results come back with it."""

    channel: int
    utterance: int
    request: DecodeRequest
    # A FINAL-kind decode started when speech paused, before the endpoint: its
    # result becomes the final if the utterance ends exactly there.
    speculative: bool
    audio_end: int  # sample index (stream) where the decoded audio ends


@dataclass(frozen=True)
class SubmitJob:
    job: DecodeJob


@dataclass(frozen=True)
class WithdrawJob:
    """The result of a submitted job is no longer wanted (an interim whose
    utterance paused, a pause decode after which speech resumed). If it is
    still waiting, the transport has it answered as skipped now rather than
    when its turn comes, so the channel's next decode is not held behind it;
    a job already running finishes as usual."""

    job: DecodeJob


@dataclass(frozen=True)
class SplitUtterance:
    """A sentence ended inside the open ``utterance`` and the next one began: end it in the
    middle of the quietest stretch of ``[lo, hi]`` (stream samples) and go on in a continuation.

    The session passes it to the channel's chunker (:meth:`~asr_server.audio.chunker.Chunker.split`)
    and feeds what that returns, even nothing, back to the decoder, which waits for it
    before it decodes that utterance again."""

    channel: int
    utterance: int
    lo: int
    hi: int
    # When only one interim heard the sentence end: the span must hold a pause the VAD heard,
    # at least this long (the cut goes in its middle); 0: any quiet stretch will do.
    pause_ms: int = 0
    # Where a pause decode of the utterance ended, inside the span: cut exactly there if the VAD
    # heard no speech at that point, so that the pause decode is the final (None: no such point).
    at: int | None = None
    # A dip (a pause too short for the VAD's vote) counts as that pause: two hearings in a row
    # agreed on the sentence end. One hearing alone often puts a full stop at a comma's short pause.
    dips: bool = False


PipelineEvent = SpeechStart | Interim | Final | Revision | Settled | ContextDecided | AnswerFailed | SubmitJob | WithdrawJob | SplitUtterance
