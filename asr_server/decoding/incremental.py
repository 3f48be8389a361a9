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
  prefix (:mod:`.stability`), unless ``UNMARKED_PREFIX_WORDS`` of them hold
  no mark: a prefix run on unpunctuated keeps Whisper from writing sentences.
* When speech pauses (``tail_ms`` of silence), a final-quality decode of the
  utterance up to that point starts at once. If the endpoint then comes with
  no new speech, the final audio is identical and that result is the final:
  the endpoint wait and the decode overlap instead of adding up. If speech
  resumes, the result was just another interim (one still waiting its turn
  then is skipped, unless its words may end a sentence where it ends: below).
* Sentences in continuous speech: once an utterance is ``split_after_s``
  long its interims carry word timing, and when one hears a sentence end
  (``.``, ``?``, ``!``) with the next sentence begun after it, the decoder asks for
  the utterance to end there (:class:`~asr_server.events.SplitUtterance`; heard by
  that interim alone, only at a pause the VAD heard):
  that sentence gets its final now, not at the next pause long enough for
  the endpoint, and the rest goes on as a continuation. A pause decode the
  speaker talked on after counts as such an interim; a split at the point
  where a pause decode ended takes that decode as the final. A stream with
  ``interim_results=false`` gets these interim decodes too (unsent), only
  for utterances long enough to split. Where the speaker runs sentences
  together and the interims join them with commas (a fast reader under
  noise), an utterance that has run ``LONG_CLAUSE_S`` splits at a comma two
  interims heard, or a sentence end two heard without a pause (other people
  talking fill the reader's pauses), and a pause decode's sentence end is cut at a shorter
  pause where an interim marks the same word (:meth:`ChannelDecoder._clause_at_pause`).
* Offsets: a channel's transcript is its non-empty final texts joined by
  single spaces; ``offset`` is where the utterance starts in it.
* Context pass (:mod:`.context`): once enough speech has been finalized, or
  the speaker pauses, or the stream ends, the latest finals are decoded
  again together, in a job of their own beside the channel's one in-flight
  decode. Where the words differ, a :class:`~asr_server.events.Revision`
  replaces the transcript from the first changed utterance to the end of the
  finals, and a live interim is sent again at its new offset.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..audio.buffer import AudioBuffer
from ..audio.chunker import ChunkEvent, EndReason, UtteranceAudio, UtteranceEnded, UtterancePaused, UtteranceStarted
from ..audio.decode import MODEL_RATE
from ..events import AnswerFailed, ContextDecided, DecodeJob, Final, Interim, PipelineEvent, RevisedSegment, Revision, Settled, SpeechStart, SplitUtterance, SubmitJob, WithdrawJob
from ..inference.types import DecodeKind, DecodeRequest, Hypothesis, Word
from ..options import StreamOptions
from .background import BackgroundFilter
from .context import (SHORT_STOP_S, ContextOptions, Finalized, Span, before_ahead, count_votes, garbled, mark_heard, plan_window, reached, retimed, revised_texts, settle_window, split_words, surer_texts, trusted, window_request,
                      window_words)
from .stability import LocalAgreement
from .text import SENTENCE_ENDS, ends_sentence, guard, normalize_word, normalized_text

__all__ = ["ChannelDecoder", "PROMPT_CHARS", "context_kept_s"]

# Context given to the model: the channel's previous final only, cut to this
# many characters. Measured on the fixtures (docs/benchmarks.md, "Decoding
# choices, as measured"): a longer history lets one misheard word or a
# hallucinated "Thank you" spread into every later final; the last final alone
# keeps style and names.
PROMPT_CHARS = 120
# A settle decode's prompt: the text before its window, up to this much (see LONG_PROMPT_TOKEN_LIMIT).
SETTLE_PROMPT_CHARS = 800
PROMPT_MIN_WORD_PROBABILITY = 0.5
# A final that repeats this many words or more of the end of its prompt is decoded again without it.
ECHO_MIN_WORDS = 3
# ... and so is one that came back with no words at all (none dropped by the guards) for an
# utterance with this much speech the VAD heard: a prompted decode can end at once (the context
# pass hears an empty final again, but only where a pass runs, and later).
EMPTY_REDO_VOICED_S = 1.0
# A sentence split: the sentence is at least SPLIT_MIN_S long, the next word starts at least
# SPLIT_MIN_GAP_S after its last one (a pause, not a word run together with the next), and the
# cut is looked for SPLIT_MARGIN_S around that gap (word timing is that rough).
SPLIT_MIN_S = 1.0
SPLIT_MIN_GAP_S = 0.1
# ... except in an utterance that continues the talking (after a cut or a short pause), where
# the sentence began before it: its first words may be the end of a sentence a split cut
# short ("...or more. | obscure. We know..."), and that sentence is long already.
SPLIT_MIN_CONTINUED_S = 0.3
SPLIT_MARGIN_S = 0.1
# ... and where the words leave no gap, at a pause the VAD heard this close to where they meet.
SPLIT_TIGHT_S = 0.5
# A sentence end one interim alone heard splits only where the VAD heard a pause this long.
SPLIT_SOLO_PAUSE_MS = 120
# Two interims agree on a sentence end when its last this many words agree: greedy interims flip an
# earlier word from one to the next ("the stones came" / "the storms came", "windows of the tower" /
# "windows on the tower"), and with every word compared, or three, that sentence waited 1.2-2.3 s
# more for the next one to be heard (held-out narration, in the room and under noise). Two were
# still too many where the word before the last flipped ("that word." / "the word." before a
# lower-case "she"): with float32 the narration's "...took over the work." waited 1.36 s in a
# replay, 1.30 s with float16 on a GPU; with one, 0.84 s (twenty-sixth session).
SENTENCE_KEY_WORDS = 1
# Speech the VAD heard after an interim's last word that it left out, its words ending a sentence
# there: the speaker has begun the next one (see unheard_tail). The cut still needs a pause there,
# or a dip where the interim before heard that sentence end too (the chunker checks). At 0.8 s, a narration under
# noise whose two interims ended "...of the tower." 0.36 s and 0.96 s before their audio ended
# waited for the second; the held-out meeting in the room likewise. Replays with every interim
# (bench/replay_bench.py --interims): 0.3 s took worst final latency in audio time under noise
# 1.15 -> 0.79 s and in the room p95 1.27 -> 0.84 s; the fixtures and clean audio the same.
SPLIT_UNHEARD_S = 0.3
# A pause decode whose words end a sentence (SPLIT_MIN_S or more into its audio) ends its utterance
# exactly where its audio ends once the speaker talks on after a pause the VAD heard this long
# there, and it is the final: a sentence whose speaker leaves 0.2-0.4 s before the next waits
# for no interim to hear the next one begin (see _sentence_pause). Under pink noise 20 dB down the
# VAD hears a 0.3 s pause between two sentences as 180-210 ms, and with 250 ms a fast recipe's
# first sentence waited for the next one (4.4-5.1 s; its interims end it with a comma): with 180
# the replays' late sentences went 5 -> 3 (27 replays, 0.7 s or less for those two), one stream
# of held-out set 2 under noise in real time p95 0.80 -> 0.57 s (max 4.56 -> 0.85 s), for 0.2 points of WER after
# revisions over the 27 replays (0.176 -> 0.178; 5 better, 10 worse, 12 the same) and 0.4 on the
# first pass, whose sentences are decoded alone more often (docs/benchmarks.md, 35th session).
SENTENCE_PAUSE_MS = 180
# ... in talking that has run this much less than split_after_s (a pause decode that heard the
# sentence through, and a pause, are more than one interim's word for it). Measured in replays of
# the held-out recordings (bench/replay_bench.py): 1 s sooner, p95 final latency in audio time
# clean 1.27 -> 0.64 s and WER after revisions 0.170 -> 0.160 (a narration's first sentence, 2.6 s
# of talking, no longer waited 2.5 s); under noise and in the room, and on the fixtures, the same.
# Not from the start of the talking: a call's "That is great news, | thank you very much." has a
# pause at its comma 1.2 s in, where the pause decode ends "news." with a full stop.
SENTENCE_PAUSE_SOONER_S = 1.0
# A pause no decode was asked for while it lasted is decoded once speech has resumed, if it was at
# most this long ago (see ChannelDecoder._owed_pause_decode); an older one is left to the interims.
OWED_PAUSE_S = 4.0
# Where the chunker declined that cut (the VAD heard a shorter pause), the next interim comes this
# much audio after the pause decode, not interim_ms: it is the one that hears the next sentence
# begin and splits there, with the pause decode as the final (a 0.25 s pause between a narration's
# sentences under noise: that final 0.2 s sooner).
SENTENCE_RESUME_MS = 300
# Where the chunker declined that cut and the next interim put a comma (or any other mark) after
# the word the pause decode ended its sentence with, two decodes heard a boundary there: the cut is
# made at a pause this long, which the VAD heard there (a pause decode starts after the chunker's
# tail_ms, 100 ms, of pause). A reader who leaves 0.12 s between sentences, under noise: the VAD
# hears 100-170 ms of it, the interims' forced prefix keeps the comma, and such a sentence waited
# for the next one (docs/benchmarks.md, seventy-third session).
CLAUSE_PAUSE_MS = 90
# An utterance that has run this long with no sentence end found in it splits at a comma (or ; :)
# two interims in a row put after the same word, LONG_CLAUSE_MIN_S or more into it, in the
# quietest stretch around it. Under noise a fast reader's 0.12 s pauses are not heard by the VAD,
# and the interims (their forced prefix too) join the sentences with commas: a recipe read so
# got no final for 17 s, until max_utterance_s cut it (docs/benchmarks.md, seventy-third session).
LONG_CLAUSE_S = 8.0
LONG_CLAUSE_MIN_S = 2.0
CLAUSE_ENDS = ",;:"  # the marks a clause inside a sentence ends with, as Whisper writes them
MARKS = CLAUSE_ENDS + "".join(SENTENCE_ENDS)  # ... and those with a sentence's ends
# Once this many words of an utterance are committed (LocalAgreement) with no mark among them, its
# interims are decoded without the forced prefix: a prefix that runs on unpunctuated (an interim of
# the stream's first half second came back lower case, "this", and was committed) keeps Whisper
# writing on without a mark, so no split finds a sentence end, where the same audio decoded
# without it is written in sentences (a fast reader in a reverberant room: a museum tour got no
# final for 20 s, until max_utterance_s cut it, a lecture's sentence 14.7 s late; docs/benchmarks.md,
# seventy-fourth session). Starting such a prefix with a capital as well was tried and left out.
UNMARKED_PREFIX_WORDS = 12
# Finals kept before a context window, for its prompt (seconds of their audio).
PROMPT_CONTEXT_S = 10.0
# Planning a pass that raises (a bug) is tried again once another final has come (what planning
# reads has changed), this many times in a stream; then the channel's passes are given up.
PLAN_FAULTS_MAX = 3
# Passes' windows kept with their results: the same window again is not decoded again.
HEARD_WINDOWS_KEPT = 4


def _heard_nothing(hyp: Hypothesis) -> bool:
    """Whether an empty final's decode heard no words in its speech (the passes hear it again, in
    context): none, or only words the alignment found no sound for (``unplaced``, decoding/text.py).
    Seen on a phone prompt under noise (bench/heldout.py --set 5): "PBX" said alone after a pause
    came back as "It will be accurate", words of no length; dropped and not heard again, the
    transcript lost the word the passes had restored."""
    return not hyp.dropped or hyp.dropped[-1] == "unplaced"


def _trim_at_s(context: ContextOptions) -> float:
    """Finalized audio past the newest record that a channel trims down to: a window (the larger of
    a pass's and a settle decode's) and its prompt's (:meth:`ChannelDecoder._trim`)."""
    return max(context.window_s, context.settle_window_s) + PROMPT_CONTEXT_S


def context_kept_s(context: ContextOptions) -> float:
    """Finalized audio a channel keeps for the context pass and settle decodes, at most (for the
    memory budget): what it trims down to, and the newest record (up to one utterance)."""
    return _trim_at_s(context) + 30.0


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
    decoded_end: int = 0  # the end of the audio the newest interim-giving answer heard
    paused_at: int | None = None
    last_pause: int | None = None  # where the newest pause the VAD heard in it was (as paused_at), kept when speech resumes
    owed_pause: int | None = None  # a pause no decode of it could be asked for while it lasted (see ChannelDecoder._owed_pause_decode)
    in_silence: bool = False  # the newest audio was not speech
    spec_requested: int | None = None
    spec: tuple[int, Hypothesis, str] | None = None  # a pause decode's (audio end, result, prompt)
    ended: UtteranceEnded | None = None
    splitting: bool = False  # a split was asked for: no new decode until the chunker's answer
    pause_cut: int | None = None  # the pause decode end a sentence-pause cut was asked at (see _sentence_pause)
    clause_cut: int | None = None  # ... and where a cut at a pause decode's end was asked again (see _clause_at_pause)
    heard_ends: frozenset[tuple[str, ...]] = frozenset()  # the sentence ends the last interim heard (_sentence_key)
    heard_clauses: frozenset[tuple[str, ...]] = frozenset()  # ... and the words it put a comma after (see long_clause)
    split_from: tuple[Hypothesis, int] | None = None  # the interim that asked for the last split, and its audio end
    unprompted: bool = False  # its final is decoded without the text before it (that decode echoed it)
    careful: bool = False  # its final is decoded never cut back (a cut-back decode heard no words in it)
    free: bool = False  # its interims are decoded without the forced prefix (see UNMARKED_PREFIX_WORDS)
    talk_start: int = 0  # where the talking it belongs to began (:attr:`UtteranceStarted.talk_start`)
    # A final decode that stopped short of the audio, and the stream sample its continuation starts at.
    head: tuple[Hypothesis, int] | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.audio)


class ChannelDecoder:
    # Faults in planning a pass so far, and the newest record when the last came (see PLAN_FAULTS_MAX).
    _plan_faults = 0
    _plan_failed_at: int | None = None
    # Passes take the oldest undecided finals first where more are waiting than one window
    # holds, so that a pass decides every final: an upload sent ahead of real time (the session
    # sets it; Session.held_for_passes). A live stream's passes take the newest, and the older
    # ones keep their first-pass text: what was just said is revised while it is on screen.
    in_order_passes = False

    def __init__(self, channel: int, options: StreamOptions, context: ContextOptions | None = None, background_db: float = 0.0) -> None:
        self.channel = channel
        self.options = options
        self.context = context or ContextOptions(enabled=options.revisions)
        self._background = BackgroundFilter(background_db) if background_db else None  # other people's talk (None: off)
        self._done: list[Finalized] = []  # recent non-empty finals, for the context pass
        self._unrevised = 0  # how many of the latest records no context pass has covered yet
        self._context_job: DecodeJob | None = None
        self._context_spans: list[Span] = []
        self._context_ahead: Span | None = None  # where the pass in flight's lookahead sits in its window
        self._context_ahead_text = ""  # the lookahead's interim when the pass was planned (its opening words: before_ahead)
        self._context_fresh = 0  # the first utterance the pass in flight may revise (earlier ones: context only)
        self._context_decide_to = 0  # the last one it may revise (later ones: lookahead only)
        self._context_closed = False  # no more context passes (given up at close)
        self._history = ""  # the text of records trimmed away, its last SETTLE_PROMPT_CHARS (settle prompts)
        self._trimmed: tuple[int, int] | None = None  # the last record trimmed away: its index, where its text ends
        self._settled_sent = -1  # the last utterance a Settled event has named
        self._settling = False  # the context job in flight is a settle decode (ContextOptions.settle_window_s)
        self._settle_to = -1  # the last record the settle decode in flight may decide (the one after it: lookahead)
        self._heard_windows: OrderedDict[tuple, tuple[int, Hypothesis]] = OrderedDict()  # latest passes' windows (keys): utterance each was to decide to, result
        self._draining = False  # no more audio: one last pass over what is unrevised
        self._position = 0  # stream samples received
        self._last_final_end = 0  # stream sample where the latest final's audio ends
        self._utterances: OrderedDict[int, _Utterance] = OrderedDict()
        self._in_flight: DecodeJob | None = None
        self._transcript_len, self._next_utterance = 0, 0  # the next: the index the chunker gives the next utterance
        self._last_text = ""  # the latest non-empty final's text, as the client holds it now
        self._prompt = ""
        self._carry: tuple[np.ndarray, int, int | None] | None = None  # (audio, voiced samples, a pause in it) after a cut
        self.transcribed_samples = 0
        # Audio an utterance must grow by between interim decodes (raised under load: fewer, larger interims).
        self.interim_ms = options.interim_ms
        self.interim_model = False  # interims on the server's smaller interim model
        self.interim_short_window = False  # interims on the model's short encoder window
        # First-pass finals are quick (the audio plus 10 s, not 30 s) when a context pass refines
        # them: finals come sooner and cost half, and the transcript that stays is the pass's.
        self.quick_finals = self.context.enabled and self.context.quick_finals
        self._withdrawn: DecodeJob | None = None  # the in-flight job already withdrawn
        self._abandoned: list[DecodeJob] = []  # stale interims still running, left behind (see job_running)
        # Under load, context passes decode no audio they already decided (cheaper, catch up sooner),
        # and quick finals are busy ones (ContextOptions.busy_finals).
        self.lean_context = False
        # Passes wait their turn behind others' (LoadSettings.late_context): they hold less decided audio.
        self.late_context = False
        self._context_late = False  # the pass in flight was planned while passes were late
        # Settle decodes run only while the server has time to spare (LoadSettings.settle): not under
        # load, nor at the close then. A decoder no server told otherwise (a replay) has it.
        self.spare_time = True
        # The talker's gain (inference/level.py): the session sets it from the channel's VAD as audio comes.
        self.gain_db = 0.0

    # -- state the session looks at -------------------------------------------------

    @property
    def pending_finals(self) -> int:
        return sum(1 for u in self._utterances.values() if u.ended is not None)

    @property
    def passes_behind_s(self) -> float:
        """Seconds of finalized speech no context pass has covered yet, while a pass is in flight
        (0 with none: nothing the channel could wait for). The shell slows an upload sent faster
        than real time on it, so that its passes keep up (:data:`asr_server.session.PACE_PASSES_S`)."""
        if self._context_job is None or self._settling or not self._unrevised:
            return 0.0
        return sum(r.seconds for r in self._done[-self._unrevised :])

    @property
    def idle(self) -> bool:
        return not self._utterances and self._in_flight is None and self._context_job is None and not self._context_owed

    @property
    def _context_owed(self) -> bool:
        if not self._draining or not self.context.enabled or self._context_closed:
            return False
        return self._unrevised > 0 or (self.context.settle_window_s > 0 and self.spare_time and any(not r.settled for r in self._done))

    @property
    def in_flight(self) -> DecodeJob | None:
        return self._in_flight

    # -- inputs ---------------------------------------------------------------------

    def feed(self, events: list[ChunkEvent]) -> list[PipelineEvent]:
        """The chunker's events; what they call for. A fault in what follows them (taking an
        earlier answer as an ended utterance's final, above all) is contained as one in handling
        an answer is (:meth:`job_done`): the channel goes back to where the events left it, and
        the finals are decoded instead of taken from earlier answers."""
        out: list[PipelineEvent] = []
        for utt in self._utterances.values():
            utt.splitting = False  # the chunker has answered (a split comes back as these events, or not at all)
        for event in events:
            match event:
                case UtteranceStarted():
                    out.extend(self._started(event))
                case UtteranceAudio():
                    self._audio(event)
                case UtterancePaused():
                    self._paused(event)
                case UtteranceEnded():
                    self._ended(event)
        if not any(u.spec is not None or u.split_from is not None for u in self._utterances.values()):
            return out + self._heard_to_now()  # no earlier answer to take as a final: none to do without
        return out + self._contained(self._heard_to_now, self._decoded_instead)

    def feed_contained(self, events_of: Callable[[], list[ChunkEvent]], contain: bool = True) -> tuple[list[PipelineEvent], int | None]:
        """``feed(events_of())`` and None; or where either raises (a bug in this decoder, or in the VAD or
        chunker ``events_of`` runs) and ``contain``, what the channel calls for once it went back to
        where it was before and its open utterance ended where its audio does (:meth:`_cut_short`),
        and the index of the next utterance: the session gives the channel a new VAD and chunker,
        which number their utterances from it."""
        if not contain:
            return self.feed(events_of()), None
        saved = _Saved.of(self)
        try:
            return self.feed(events_of()), None
        except Exception as error:  # noqa: BLE001 - contained, as the docstring says; the transport logs its traceback
            saved.restore(self)
            return self._cut_short(error), self._next_utterance

    def _cut_short(self, error: Exception) -> list[PipelineEvent]:
        """Taking a piece of audio raised (``error``): the piece is dropped, and the utterance it
        was for ends where its audio ends, as at a client's ``finalize`` (its final is decoded from
        the audio it holds). A fault here is not contained: the session ends."""
        open_ = [u for u in self._utterances.values() if u.ended is None]
        ended: list[ChunkEvent] = [UtteranceEnded(u.index, u.end, EndReason.FINALIZE) for u in open_]
        return [AnswerFailed(self.channel, open_[0].index if open_ else -1, "audio", error), *self.feed(ended)]

    def _decoded_instead(self, error: Exception) -> list[PipelineEvent]:
        """Taking an earlier answer as an ended utterance's final (a pause decode's, or the words of
        the interim that asked for a sentence split) raised: the finals are decoded instead, so
        nothing the client holds changes and its finals come a decode later."""
        for utt in self._utterances.values():
            utt.spec, utt.split_from = None, None
        return [AnswerFailed(self.channel, next(iter(self._utterances), -1), "ended", error), *self._heard_to_now()]

    def _contained(self, step: Callable[[], list[PipelineEvent]], fallback: Callable[[Exception], list[PipelineEvent]]) -> list[PipelineEvent]:
        """``step``, or where it raises (a bug), ``fallback`` from the state the channel had before it
        (:class:`_Saved`): a fault in handling one decode's answer costs that decode, not the session."""
        saved = _Saved.of(self)
        try:
            return step()
        except Exception as error:  # noqa: BLE001 - contained, as the docstring says; the transport logs its traceback
            saved.restore(self)
            return fallback(error)

    def _heard_to_now(self) -> list[PipelineEvent]:
        """What the audio fed so far calls for: a cut at a pause decode's sentence end, finals, decodes."""
        out: list[PipelineEvent] = []
        for utt in self._utterances.values():
            out.extend(self._sentence_pause(utt))
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
        speech resumed and that can end no sentence: it is skipped. A waiting interim takes the newest audio of its
        utterance (the stable prefix cannot have moved: it is the only job in
        flight); it is skipped once the utterance has paused or ended, since a
        final-quality decode is owed next. Call :meth:`job_skipped` when the
        skip is reported.
        """
        if job.request.kind is DecodeKind.CONTEXT:
            return self._refresh_context(job)
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
        went on talking (it can no longer become the final at the endpoint),
        unless its words may still end a sentence there (:meth:`_may_end_sentence`).
        """
        utt = self._utterances.get(job.utterance)
        if job.request.kind is DecodeKind.FINAL:
            return job.speculative and utt is not None and utt.ended is None and utt.paused_at != job.audio_end and not self._may_end_sentence(utt, job)
        return utt is None or utt.ended is not None or utt.paused_at is not None

    def _may_end_sentence(self, utt: _Utterance, job: DecodeJob) -> bool:
        """Whether pause decode ``job``, still waiting its turn, may yet be the final of a sentence
        ending where its audio ends, the speaker having talked on (:meth:`_sentence_pause` asks for
        that cut once it answers): the talking is long enough for such a cut, and the utterance has
        not paused again since (the newer pause decode is owed). Under load a pause decode waits:
        16 streams in step pause between two sentences together, and those whose pause decode was
        skipped when their speaker went on got that sentence's final with the next one's, or from
        a later interim's split, 2-5.6 s after its speech ended (docs/benchmarks.md, 39th session)."""
        at = job.audio_end
        return at - utt.start >= SPLIT_MIN_S * MODEL_RATE and self._may_cut_at_pause(utt, at)

    def job_running(self, job: DecodeJob) -> list[PipelineEvent]:
        """``job``, withdrawn, was already running: if it is an interim of an utterance that paused or
        ended, stop waiting for it and decode what is owed now (a pause decode or the final),
        beside it on another worker; its answer, when it comes, is only shown as an interim
        (see :meth:`_late_interim`). A stale pause decode is still waited for: what follows it
        is only an interim."""
        if job is not self._in_flight or job.request.kind is not DecodeKind.INTERIM or not self._stale(job):
            return []
        self._abandoned.append(job)
        self._in_flight = None
        return self._dispatch()

    def _dropped(self, job: DecodeJob) -> bool:
        """Whether ``job`` was abandoned (see :meth:`job_running`): nothing waits for its answer."""
        for i, abandoned in enumerate(self._abandoned):
            if abandoned is job:
                del self._abandoned[i]
                return True
        return False

    def job_skipped(self, job: DecodeJob) -> list[PipelineEvent]:
        """The scheduler skipped ``job`` (see :meth:`refresh`): decide what runs next."""
        if self._dropped(job):
            return []
        if job.request.kind is DecodeKind.CONTEXT:
            return self._context_ended(job, None)
        if job is not self._in_flight:
            raise ValueError("skip reported for a job that is not in flight on this channel")
        self._in_flight = None
        return self._dispatch()

    def job_failed(self, job: DecodeJob) -> list[PipelineEvent]:
        """The model could not decode ``job``, even after the scheduler's retry.

        An interim or a pause decode is dropped as if skipped (the next decode
        covers it); a final is given up: its utterance is finalized with empty
        text (or with what the decode before its continuation heard, :meth:`_final`),
        so the transcript and later offsets go on.
        """
        if self._dropped(job):
            return []
        if job.request.kind is DecodeKind.CONTEXT:
            return self._context_ended(job, None)
        utt = self._landed(job)
        out: list[PipelineEvent] = []
        if utt is not None and job.request.kind is DecodeKind.FINAL and not job.speculative:
            out.extend(self._final(utt, Hypothesis(text=""), job.audio_end))
        out.extend(self._dispatch())
        return out

    def _landed(self, job: DecodeJob) -> _Utterance | None:
        """``job`` (this channel's one in flight) came back: the utterance it was for, if still open."""
        if job is not self._in_flight:
            raise ValueError("an answer for a job that is not in flight on this channel")
        self._in_flight = None
        return self._utterances.get(job.utterance)

    def job_done(self, job: DecodeJob, hypothesis: Hypothesis) -> list[PipelineEvent]:
        """Hand back the result of the job this decoder submitted last.

        A fault in handling a first-pass answer costs that decode only, as one in handling a
        pass's does (:meth:`_context_ended`): the channel goes back to where it was before it
        (:class:`_Saved`), an :class:`AnswerFailed` tells the session, and the answer is taken as
        a failed decode's (:meth:`job_failed`: an interim dropped, a final given up). Such a fault
        used to end the whole session with ``internal_error``."""
        if job.request.kind is DecodeKind.CONTEXT:
            return self._answered(job, hypothesis)
        decode = "pause" if job.speculative else job.request.kind.value
        return self._contained(
            lambda: self._answered(job, hypothesis),
            lambda error: [AnswerFailed(self.channel, job.utterance, decode, error), *self.job_failed(job)],
        )

    def _answered(self, job: DecodeJob, hypothesis: Hypothesis) -> list[PipelineEvent]:
        if self._dropped(job):
            return self._late_interim(job, hypothesis)
        if job.request.kind is DecodeKind.CONTEXT:
            return self._context_ended(job, hypothesis)
        utt = self._landed(job)
        out: list[PipelineEvent] = []
        if utt is not None:
            hyp = self._guarded(utt, job, hypothesis)
            if job.request.kind is DecodeKind.FINAL and not job.speculative:
                if not self._redo(utt, hyp, _full_prompt(job.request)):
                    out.extend(self._final(utt, hyp, job.audio_end))
            else:
                if job.speculative:
                    utt.spec = (job.audio_end, hyp, _full_prompt(job.request))
                out.extend(self._interim(utt, hyp, job.audio_end))
                # A pause decode the speaker talked on after is one more interim: a sentence end
                # in it with words after it splits as an interim's would.
                out.extend(self._split(utt, hyp, job) or self._sentence_pause(utt))
        out.extend(self._dispatch())
        return out

    def _guarded(self, utt: _Utterance, job: DecodeJob, hypothesis: Hypothesis) -> Hypothesis:
        audio = len(job.request.audio)
        return guard(hypothesis, audio / MODEL_RATE, min(utt.voiced, audio) / MODEL_RATE)

    def _late_interim(self, job: DecodeJob, hypothesis: Hypothesis) -> list[PipelineEvent]:
        """The answer of an interim left behind (see :meth:`job_running`): still shown while its
        utterance waits for its final and no answer about newer audio has been shown."""
        utt = self._utterances.get(job.utterance)
        if utt is None or job.audio_end <= utt.decoded_end:
            return []
        return self._interim(utt, self._guarded(utt, job, hypothesis), job.audio_end)

    def advance(self, position: int) -> list[PipelineEvent]:
        """``position`` samples of the stream have been received (the context pass waits for pauses)."""
        self._position = position
        return self._dispatch_context()

    def drain(self) -> list[PipelineEvent]:
        """No more audio: once the last finals are out, one context pass over what is unrevised."""
        self._draining = True
        return self._dispatch()

    def close_context(self) -> list[PipelineEvent]:
        """Give up the context pass (the close's time bound ran out): withdraw one that still waits."""
        self._context_closed = True
        job = self._context_job
        return [WithdrawJob(job)] if job is not None else []

    # -- chunker events -------------------------------------------------------------

    def _started(self, event: UtteranceStarted) -> list[PipelineEvent]:
        talk_start = event.start if event.talk_start is None else event.talk_start
        utt = _Utterance(event.utterance, event.start, event.speech_at, talk_start=talk_start)
        self._utterances[event.utterance] = utt
        self._next_utterance = event.utterance + 1
        if event.continuation and self._carry is not None:
            samples, voiced, utt.owed_pause = self._carry
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

    def _paused(self, event: UtterancePaused) -> None:
        utt = self._utterances[event.utterance]
        utt.paused_at = utt.last_pause = event.end
        if self._in_flight is not None:  # the pause decode waits for it: the pause may pass first
            utt.owed_pause = event.end

    def _ended(self, event: UtteranceEnded) -> None:
        utt = self._utterances[event.utterance]
        utt.ended = event
        if event.reason in (EndReason.MAX_LENGTH, EndReason.SENTENCE):
            keep = event.end - utt.start
            rest = utt.audio.copy(keep)
            # Voiced share of the remainder, estimated by length (it is speech: no endpoint came).
            moved = int(utt.voiced * len(rest) / max(1, len(utt.audio)))
            utt.voiced -= moved
            pause = utt.last_pause if utt.last_pause is not None and utt.last_pause > event.end else None
            self._carry = (rest, moved, pause)
            utt.last_voiced_end = min(utt.last_voiced_end, event.end)

    # -- scheduling decodes ---------------------------------------------------------

    def _dispatch(self) -> list[PipelineEvent]:
        return self._dispatch_main() + self._dispatch_context()

    def _dispatch_main(self) -> list[PipelineEvent]:
        out: list[PipelineEvent] = []
        while self._in_flight is None and self._utterances:
            utt = next(iter(self._utterances.values()))
            if utt.ended is not None:
                end = utt.ended.end
                if utt.spec is not None and utt.spec[0] == end and not self._redo(utt, utt.spec[1], utt.spec[2]):
                    out.extend(self._final(utt, utt.spec[1], end))
                    continue
                heard = self._split_heard(utt, end)
                if heard is not None:
                    out.extend(self._final(utt, heard, end))
                    continue
                if utt.voiced == 0 or end <= utt.start:
                    out.extend(self._finalize(utt, Hypothesis(text="")))
                    continue
                out.append(self._submit(utt, DecodeKind.FINAL, end, speculative=False))
                break
            owed = self._owed_pause_decode(utt)
            if owed is not None:
                out.append(owed)
                break
            if utt.paused_at is not None and utt.spec_requested != utt.paused_at:
                utt.spec_requested = utt.paused_at
                # It shows as an interim: the next interim waits until interim_ms more is heard
                # (one as soon as speech resumes would hear nothing new of it).
                utt.interim_len = max(utt.interim_len, utt.paused_at - utt.start)
                out.append(self._submit(utt, DecodeKind.FINAL, utt.paused_at, speculative=True))
                break
            if utt.splitting:
                break
            grown = len(utt.audio) - utt.interim_len
            # No interim decode while the speaker is silent: speech may be ending, and a
            # decode in flight would delay the pause decode that becomes the final. A stream
            # that asked for no interims still gets these decodes, unsent, once an utterance
            # is long enough to split: they are what finds its sentence ends.
            wanted = self.options.interim_results or self._may_split(utt, utt.end)
            if wanted and not utt.in_silence and grown * 1000 >= self._interim_due(utt) * MODEL_RATE:
                utt.interim_len = len(utt.audio)
                out.append(self._submit(utt, DecodeKind.INTERIM, utt.end, speculative=False))
            break
        return out

    def _owed_pause_decode(self, utt: _Utterance) -> SubmitJob | None:
        """The pause decode ``utt`` is owed for its newest pause, once speech has resumed after it,
        where none was asked for it: this channel's one decode in flight was another utterance's
        (the final of the sentence before, under load) until the pause had passed, or the pause
        was heard before the cut that began ``utt`` came (the utterance before it had it). Asked
        where its words could still end a sentence there (as a pause decode the speaker talked on
        after, :meth:`_may_end_sentence`) within ``OWED_PAUSE_S`` of the newest audio, and
        ``utt`` is not paused now (its own pause decode is owed then).

        16 streams in step split a sentence at a comma together: the first halves' finals
        queued past the pause that ended the sentence, and the second halves (2 s of speech)
        waited for an interim's split or the next endpoint, 5-6 s after their speech ended
        (docs/benchmarks.md, ninety-second session)."""
        at = utt.owed_pause
        if at is None or utt.spec_requested == at or utt.paused_at is not None or utt.end - at > OWED_PAUSE_S * MODEL_RATE:
            return None
        if at - utt.start < SPLIT_MIN_S * MODEL_RATE or not self._may_cut_at_pause(utt, at):
            return None
        utt.spec_requested = at
        utt.interim_len = max(utt.interim_len, at - utt.start)
        return self._submit(utt, DecodeKind.FINAL, at, speculative=True)

    def _interim_due(self, utt: _Utterance) -> int:
        """Milliseconds of new audio the next interim of ``utt`` waits for: ``interim_ms``, or
        ``SENTENCE_RESUME_MS`` after a pause decode whose cut at a sentence end was asked for (see
        :meth:`_sentence_pause`) and declined."""
        declined = self._pause_cut_declined(utt) and utt.pause_cut == utt.start + utt.interim_len
        return min(self.interim_ms, SENTENCE_RESUME_MS) if declined else self.interim_ms

    @staticmethod
    def _pause_cut_declined(utt: _Utterance) -> bool:
        """Whether the chunker declined the cut :meth:`_sentence_pause` asked for at the end of the
        newest pause decode of ``utt`` (still open: a cut it made would have ended it)."""
        return utt.spec is not None and utt.pause_cut == utt.spec[0]

    def _submit(self, utt: _Utterance, kind: DecodeKind, end: int, *, speculative: bool, start: int | None = None) -> SubmitJob:
        """A decode of ``utt``'s audio up to ``end`` (from ``start``: a final's continuation, with no
        text before it as the prompt)."""
        final = kind is DecodeKind.FINAL
        request = DecodeRequest(
            audio=utt.audio.copy(0 if start is None else start - utt.start, end - utt.start),
            kind=kind,
            language=self.options.language,
            prompt="" if utt.unprompted or start is not None else self._prompt,
            vocabulary=self.options.prompt,
            prefix="" if final or utt.free else utt.agreement.stable_text,
            # Finals are always aligned: the guards use word timing even when the client did not ask for it;
            # interims of a long utterance too, to find where a sentence in it ends.
            word_timestamps=final or self._may_split(utt, end) or self._pause_cut_declined(utt),
            model="interim" if self.interim_model and not final else "",
            short_window=self.quick_finals if final else self.interim_short_window,
            busy=final and not utt.careful and self.quick_finals and self.lean_context and self.context.busy_finals,
            careful=final and utt.careful,
            gain_db=self.gain_db,
        )
        job = DecodeJob(self.channel, utt.index, request, speculative, end)
        self._in_flight = job
        return SubmitJob(job)

    # -- results --------------------------------------------------------------------

    def _redo(self, utt: _Utterance, hyp: Hypothesis, prompt: str) -> bool:
        """Whether ``hyp``, a final of ``utt`` decoded with ``prompt``, is to be decoded again, each
        way at most once, and what that decode hears is the final, words or none:

        * never cut back (``careful``), where a cut-back (greedy) decode has no words left, none
          heard or what was heard dropped by the guards, in ``EMPTY_REDO_VOICED_S`` of speech the
          VAD heard: under load a greedy decode of a call's "That is great news, thank you very
          much." gave "Thank you very much.", a stock phrase the guards drop; the beam heard it all;
        * without the prompt (``unprompted``), where it only repeats the end of ``prompt`` (the one
          its decode was given: a revision may have changed the channel's since; Whisper copies the
          prompt when the audio is a fragment: measured live, a continuation holding "of the" came
          back as the whole sentence before it), or is empty (nothing dropped) in that much speech
          although the prompt held text said before: a prompted decode can end at once.

        An empty final with words dropped is lost for good: the context pass re-hears finals
        with text, and empty ones whose decode heard no words at all."""
        if utt.head is not None:
            return False
        heard = normalized_text(hyp.text).split()
        lost = not heard and utt.voiced >= EMPTY_REDO_VOICED_S * MODEL_RATE
        if not utt.careful and hyp.cut_back and lost:
            utt.careful = True
        elif not utt.unprompted and self._echo_or_cut_off(hyp, heard, prompt, lost):
            utt.unprompted = True
        else:
            return False
        utt.spec = None
        return True

    def _echo_or_cut_off(self, hyp: Hypothesis, heard: list[str], prompt: str, lost: bool) -> bool:
        """Whether the prompt is to blame for ``hyp`` (see :meth:`_redo`)."""
        said_before = normalized_text(prompt) != normalized_text(self.options.prompt)
        if lost and not hyp.dropped and said_before:
            return True
        return len(heard) >= ECHO_MIN_WORDS and normalized_text(prompt).split()[-len(heard) :] == heard

    def _final(self, utt: _Utterance, hyp: Hypothesis, end: int) -> list[PipelineEvent]:
        """``hyp``, a final decode of ``utt``'s audio up to ``end``: the final, or first a decode
        of the rest of the audio if its words end more than ``SHORT_STOP_S`` before it. Whisper can
        end a decode early, as offline transcription's next window would pick up after (a fast
        narration under noise, bench/heldout.py: an utterance held two sentences and its final gave
        the first alone). The rest is decoded once, from the last word's end, without a prompt (a
        fragment prompted with the text before it can echo that text), and the two are joined, unless
        the rest is other people's talk after the talker stopped (:mod:`.background`)."""
        if utt.head is not None:
            head, cut = utt.head
            if hyp.text and self._background and not self._background.heard(utt.audio.copy(cut - utt.start, end - utt.start), end, 0.0, hyp):
                hyp = replace(hyp, text="", words=(), dropped=hyp.dropped + ("background",))
            shift = (cut - utt.start) / MODEL_RATE
            words = head.words + tuple(replace(w, start=w.start + shift, end=w.end + shift) for w in hyp.words)
            text = " ".join(t for t in (head.text.strip(), hyp.text.strip()) if t)
            return self._finalize(utt, replace(head, text=text, words=words, sampled=head.sampled or hyp.sampled, dropped=head.dropped + hyp.dropped))
        cut = utt.start + int(hyp.words[-1].end * MODEL_RATE) if hyp.words else end
        if end - cut <= SHORT_STOP_S * MODEL_RATE:
            return self._finalize(utt, hyp)
        utt.head = (hyp, cut)
        return [self._submit(utt, DecodeKind.FINAL, end, speculative=False, start=cut)]

    def _next_offset(self) -> int:
        return self._transcript_len + 1 if self._transcript_len else 0

    def _interim(self, utt: _Utterance, hyp: Hypothesis, audio_end: int) -> list[PipelineEvent]:
        utt.decoded_end = max(utt.decoded_end, audio_end)
        if not self.options.interim_results or not hyp.text:
            return []
        text, stable = utt.agreement.update(hyp.text.split())
        utt.free = utt.free or unmarked(utt.agreement.committed)
        if utt.last_interim == (text, stable) or self._background and self._background.unheard(utt.audio.copy(0, audio_end - utt.start), audio_end, hyp):
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

    def _may_split(self, utt: _Utterance, end: int, sooner_s: float = 0.0) -> bool:
        """Whether ``utt``, heard up to ``end``, may be split at a sentence end: once the talking
        it belongs to (across earlier splits and short pauses) has run ``split_after_s`` (less
        ``sooner_s``)."""
        after = self.options.split_after_s
        return after > 0 and end - utt.talk_start >= (after - sooner_s) * MODEL_RATE

    def _split(self, utt: _Utterance, hyp: Hypothesis, job: DecodeJob) -> list[PipelineEvent]:
        """Ask for ``utt`` to end where the last sentence in this interim ends, if there is one:
        anywhere quiet around it when the interim before heard it end too and the next word
        starts with a capital, else only at a pause the VAD heard there, or a dip where two
        interims heard the sentence end (one interim alone may put a full stop where the speaker
        only slowed; see :func:`sentence_gap` for the lower case).

        Where the context pass will refine the final and the main model heard ``hyp``, the split
        keeps it (:meth:`_split_heard`)."""
        audio_end = job.audio_end
        heard_before, utt.heard_ends = utt.heard_ends, sentences_ended(hyp)
        clauses_before, utt.heard_clauses = utt.heard_clauses, clauses_ended(hyp)
        if utt.ended is not None or utt.paused_at is not None:
            return []
        if not self._may_split(utt, audio_end):
            return self._clause_at_pause(utt, hyp)
        min_s = SPLIT_MIN_S if utt.talk_start == utt.start else SPLIT_MIN_CONTINUED_S
        voiced_s = (min(utt.last_voiced_end, audio_end) - utt.start) / MODEL_RATE
        gap = sentence_gap(hyp.words, heard_before, min_s) or unheard_tail(hyp.words, heard_before, voiced_s, min_s)
        if audio_end - utt.start >= LONG_CLAUSE_S * MODEL_RATE:
            gap = long_clause(hyp.words, clauses_before) if gap is None else _long_sentence(gap)
        if gap is None:
            return self._clause_at_pause(utt, hyp)
        utt.splitting = True
        utt.split_from = (hyp, audio_end) if self.quick_finals and not job.request.model else None
        lo_s, hi_s, needs_pause, agreed = gap
        lo, hi = (utt.start + int(t * MODEL_RATE) for t in (lo_s, hi_s))
        pause_ms = SPLIT_SOLO_PAUSE_MS if needs_pause else 0
        return [SplitUtterance(self.channel, utt.index, lo, hi, pause_ms, self._spec_cut(utt, lo, hi), dips=agreed)]

    def _sentence_pause(self, utt: _Utterance) -> list[PipelineEvent]:
        """Ask for ``utt`` to end exactly where its pause decode's audio ends, once: that decode's
        words end a sentence ``SPLIT_MIN_S`` or more into the audio, the talking has run
        ``split_after_s`` less ``SENTENCE_PAUSE_SOONER_S`` there, and the speaker has talked on.
        The chunker cuts only if the VAD heard ``SENTENCE_PAUSE_MS`` of pause there; the pause
        decode is then the final.

        The split rules wait for an interim that hears the next sentence begin with a capital
        (Whisper ends most decodes with a full stop, commas included), which comes 0.8-1.5 s after
        the pause; a pause this long and a decode that heard the sentence end are evidence enough."""
        if utt.spec is None:
            return []
        at, hyp, _ = utt.spec
        if not self._may_cut_at_pause(utt, at) or not hyp.words:
            return []
        last = hyp.words[-1]
        if not ends_sentence(last.word) or last.end < SPLIT_MIN_S:
            return []
        utt.pause_cut = at
        utt.splitting = True
        reach = int(SPLIT_TIGHT_S * MODEL_RATE)
        return [SplitUtterance(self.channel, utt.index, at - reach, at + reach, SENTENCE_PAUSE_MS, at)]

    def _clause_at_pause(self, utt: _Utterance, hyp: Hypothesis) -> list[PipelineEvent]:
        """Ask once more for the cut :meth:`_sentence_pause` asked for where its pause decode ended,
        which the chunker declined (the VAD heard less than ``SENTENCE_PAUSE_MS`` of pause), now
        that ``hyp``, an interim heard past it, marks a boundary after the same word
        (:func:`clause_at`): at ``CLAUSE_PAUSE_MS`` of pause, and the pause decode is the final.

        Whisper's interims of run-on speech write a comma where a sentence ended, and their
        forced prefix keeps it, so no split finds that sentence end; a decode of the audio up to
        the pause heard it. A pause inside a sentence (the speaker hesitated, and the pause
        decode put a full stop there as Whisper does at the end of most decodes) is told apart
        by the interim, which runs the words on with no mark between them."""
        if not self._pause_cut_declined(utt) or utt.clause_cut == utt.pause_cut:
            return []
        assert utt.spec is not None
        at, heard, _ = utt.spec
        if not clause_at(hyp.words, heard.words):
            return []
        utt.clause_cut = at
        utt.splitting = True
        reach = int(SPLIT_TIGHT_S * MODEL_RATE)
        return [SplitUtterance(self.channel, utt.index, at - reach, at + reach, CLAUSE_PAUSE_MS, at)]

    def _may_cut_at_pause(self, utt: _Utterance, at: int) -> bool:
        """Whether a cut where a pause decode of ``utt`` ended at ``at`` may still be asked for: the
        speaker talks on, no split or continuation is under way, none was asked there before, and
        the talking has run ``split_after_s`` less ``SENTENCE_PAUSE_SOONER_S`` there."""
        return (utt.ended is None and utt.paused_at is None and not utt.splitting and utt.head is None and utt.pause_cut != at
                and self._may_split(utt, at, SENTENCE_PAUSE_SOONER_S))

    @staticmethod
    def _split_heard(utt: _Utterance, end: int) -> Hypothesis | None:
        """The final of ``utt``, cut at ``end`` by a sentence split, as the interim that asked for
        the split heard it: its words before the cut, where they end a sentence and none runs
        across the cut (that interim heard past it). None otherwise: the cut is decoded."""
        if utt.ended is None or utt.ended.reason is not EndReason.SENTENCE or utt.split_from is None:
            return None
        hyp, heard_to = utt.split_from
        cut = (end - utt.start) / MODEL_RATE
        before = tuple(w for w in hyp.words if w.end <= cut + SPLIT_MARGIN_S)
        after = hyp.words[len(before) :]
        if heard_to < end or not before or not ends_sentence(before[-1].word) or any(w.start < cut for w in after):
            return None
        return replace(hyp, text="".join(w.word for w in before).strip(), words=before)

    @staticmethod
    def _spec_cut(utt: _Utterance, lo: int, hi: int) -> int | None:
        """Where the pause decode ended, if it did in ``[lo, hi]`` and heard a sentence through to
        its end (its last word ends one): cut there, and it is the final. One that heard nothing,
        or stopped inside the sentence, is no final for it: the cut's own decode is."""
        if utt.spec is None or not lo <= utt.spec[0] <= hi:
            return None
        words = utt.spec[1].text.split()
        return utt.spec[0] if words and ends_sentence(words[-1]) else None

    def _finalize(self, utt: _Utterance, hyp: Hypothesis) -> list[PipelineEvent]:
        assert utt.ended is not None
        del self._utterances[utt.index]
        offset = self._next_offset()
        base = utt.start / MODEL_RATE
        words = tuple(Word(w.word, round(base + w.start, 3), round(base + w.end, 3), w.probability) for w in hyp.words)
        text = hyp.text
        if text and self._background and not self._background.heard(utt.audio.copy(0, utt.ended.end - utt.start), utt.ended.end, utt.voiced / MODEL_RATE, hyp):
            text, words, hyp = "", (), replace(hyp, dropped=hyp.dropped + ("background",))
        if ends_sentence(_last_word(self._last_text)):
            # A decode that stopped at the prompt's sentence end can start the next in lower case
            # ("It is all that remains. the second."): the transcript reads as sentences.
            text, words = _capitalized(text, words)
        shown = retimed(words)
        sent_words = shown if self.options.word_timestamps else ()
        start, end = _heard_span(shown, utt.speech_at / MODEL_RATE, utt.ended.end / MODEL_RATE)
        if text:
            self._transcript_len = offset + len(text)
            self._last_text = text
            # Only a confidently heard final becomes context: a doubtful word in the
            # prompt is copied into the next final (measured: "old-sposed" twice).
            # Nor does a sampled one (its beam decode failed Whisper's checks), a loop, or one with
            # more words than its audio can hold.
            doubtful = garbled(text, (utt.ended.end - utt.start) / MODEL_RATE, hyp.sampled)
            self._prompt = _tail_words(text, PROMPT_CHARS) if _confident(hyp.words) and not doubtful else ""
            self._remember(utt, offset, text, words, hyp.sampled)
        elif _heard_nothing(hyp) and self._background is None:  # not under --talker-final-db: see _remember
            self._remember(utt, offset, "", (), hyp.sampled, unheard=True)
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
        ] + self._newly_settled()


    # -- the context pass -----------------------------------------------------------

    def _remember(self, utt: _Utterance, offset: int, text: str, words: tuple[Word, ...], sampled: bool, unheard: bool = False) -> None:
        """Keep a final for the context pass: one with text, or an empty one whose first pass
        heard no words (``unheard``; not one whose words the guards dropped: a stock phrase on
        noise, other people's talk), nor any empty one where --talker-final-db guards against
        other people's talk: there it is as likely babble, and a pass has no such guard (its words
        in the babble made the LibriVox reading under babble 0.070 -> 0.113)."""
        assert utt.ended is not None
        if not self.context.enabled:
            return
        keep = utt.ended.end - utt.start
        audio, trail = utt.audio.copy(0, keep), utt.audio.copy(keep, keep + int(self.context.real_gap_s * MODEL_RATE))
        self._done.append(Finalized(utt.index, utt.start, audio, offset, text, words, trail, sampled, unheard=unheard))
        self._unrevised += 1
        self._last_final_end = utt.ended.end
        self._trim()

    def _trim(self) -> None:
        """Keep only the records a window (and its prompt) can use: bounded memory however long
        passes wait (a pass in flight over a dropped record is not applied). The pauses kept
        to join records count too."""
        keep = _trim_at_s(self.context) * MODEL_RATE
        while len(self._done) > 1 and sum(len(r.audio) + len(r.trail) for r in self._done[1:]) >= keep:
            dropped = self._done.pop(0)
            self._trimmed = (dropped.index, _text_end(dropped))
            if self.context.settle_window_s:  # kept for settle prompts only
                self._history = _tail_words(f"{self._history} {dropped.text}".strip(), SETTLE_PROMPT_CHARS)
        self._unrevised = min(self._unrevised, len(self._done))

    def _dispatch_context(self) -> list[PipelineEvent]:
        """The next context pass or settle decode, if one is due. Where planning it raises (a bug),
        it is tried again only once another final has come (planning the same again would raise
        again, at every piece of audio), and after ``PLAN_FAULTS_MAX`` such faults, or once the
        stream is closing, passes are given up for the rest of the channel's stream, as at a close
        whose time bound ran out (:meth:`close_context`). The finals keep the text the client
        holds; the session goes on."""
        if not self.context.enabled or self._context_closed or self._context_job is not None:
            return []
        newest = self._done[-1].index if self._done else -1
        if self._plan_failed_at == newest:
            self._context_closed = self._draining  # no final to wait for: the close would wait for passes
            return []
        try:
            return self._dispatch_pass() or self._dispatch_settle()
        except Exception as error:  # noqa: BLE001 - contained, as the docstring says; the transport logs its traceback
            # Planning changes only the pass's own attributes (records change once a pass answers).
            self._context_job, self._settling = None, False
            self._plan_faults, self._plan_failed_at = self._plan_faults + 1, newest
            self._context_closed = self._draining or self._plan_faults >= PLAN_FAULTS_MAX
            return [AnswerFailed(self.channel, newest, "plan", error)]

    def _dispatch_pass(self) -> list[PipelineEvent]:
        if not self._unrevised:
            return []
        fresh = self._done[-self._unrevised :]
        ahead = self._ahead()
        decidable = fresh if self._settled() or ahead is not None else fresh[:-1]
        quiet = not self._utterances and self._position - self._last_final_end >= self.context.idle_s * MODEL_RATE
        heard = (ahead.end - ahead.speech_at) / MODEL_RATE if ahead is not None else 0.0
        enough = sum(r.seconds for r in fresh) + heard >= self.context.min_new_s
        if not decidable or not (enough or quiet or (self._draining and not self._utterances)):
            return []
        job = self._context_job = self._context_window()
        heard = self._heard_windows.get(_window_key(job.request, self._context_spans))
        if heard is not None and heard[0] >= self._context_decide_to:
            # The same window as a pass before, which left its last utterances undecided (its
            # words stopped short of them): heard again, it would stop there again. The window
            # starts at the first of them instead, as offline transcription goes on from where a
            # window's words end.
            job = self._context_job = self._context_window(back=False)
            heard = self._heard_windows.get(_window_key(job.request, self._context_spans))
        if heard is not None:
            # The same decode as before (the speaker stopped after it, and now its newest utterance
            # may be decided; or nothing was left to put before the rest): its result serves again,
            # at no cost, and decides at least one more utterance (:func:`reached`).
            return self._context_ended(job, heard[1], repeat=True)
        return [SubmitJob(job)]

    def _dispatch_settle(self) -> list[PipelineEvent]:
        """A settle decode, once a stretch is due (:func:`settle_window`), while the server has time to
        spare: under load it waits, and catches up when the load falls (at the close only if it has)."""
        ending = self._draining and not self._utterances
        if not self.spare_time:
            return []
        decided_to = self._done[-self._unrevised - 1].index if len(self._done) > self._unrevised else -1
        records = settle_window(self._done, decided_to, self.context, ending)
        if not records:
            return []
        # All the text before, as offline transcription conditions a window on its text before.
        before = " ".join(t for t in [self._history, *(r.text for r in self._done[: self._done.index(records[0])])] if t)
        request, self._context_spans = window_request(records, self.context, self.options.language, _tail_words(before, SETTLE_PROMPT_CHARS), gain_db=self.gain_db)
        request = replace(request, long_prompt=True, settle=True, vocabulary=self.options.prompt)
        self._context_ahead, self._settling = None, True
        # Its last record is heard with nothing after it, so it is left to the next window, which
        # starts with it (as offline transcription goes on from its last whole segment), unless the
        # stream ended or the record fills the window alone.
        self._settle_to = records[-1].index if ending or len(records) < 2 else records[-2].index
        last = records[-1]
        self._context_job = DecodeJob(self.channel, last.index, request, False, last.start + len(last.audio))
        return [SubmitJob(self._context_job)]

    def _settle_ended(self, job: DecodeJob, hypothesis: Hypothesis | None) -> list[PipelineEvent]:
        """A settle decode came back: its words decide each record it reached, where :func:`trusted`
        and not heard less surely than the record's own (:func:`surer_texts`), and each record it
        reached up to the one it may decide is settled for good (the first at least;
        all of them, keeping their words, where ``hypothesis`` is None: skipped or failed)."""
        self._context_job, self._settling = None, False
        spans = self._context_spans
        covered = self._covered()
        out: list[PipelineEvent] = []
        if [r.index for r in covered] == [s.index for s in spans]:
            first, decide_to = spans[0].index, self._settle_to
            texts = None
            if hypothesis is not None:
                hyp = guard(hypothesis, job.request.duration, sum(r.seconds for r in covered))
                groups = self._pass_groups(hyp.words, spans, covered)
                decide_to = reached(covered, groups, spans, first, decide_to)
                if trusted(covered, groups, first, decide_to):
                    texts = _mended_seams(covered, groups, spans, surer_texts(covered, groups, revised_texts(covered, groups, spans, first, decide_to)))
            if texts is not None:
                out.extend(self._revise(covered, spans, texts, settle=True))
            for record in covered:
                record.settled = record.settled or record.index <= decide_to
        self._trim()
        return out + self._newly_settled() + self._dispatch_context()

    def _pass_shape(self) -> tuple[float, bool]:
        """The decided audio (s) a pass holds before its new utterances, and whether it is on the
        runner's lean window: none under load; at most ``late_back_s`` while passes wait their turn
        behind others' (so that they cost less and catch up); else ``back_s``."""
        if self.lean_context:
            return 0.0, True
        if self.late_context:
            return min(self.context.back_s, self.context.late_back_s), True
        return self.context.back_s, False

    def _context_window(self, back: bool = True) -> DecodeJob:
        """The next pass's window (``back``: with decided audio before its first undecided utterance)."""
        back_s, lean = self._pass_shape()
        back_s = back_s if back else 0.0
        self._context_late = self.late_context
        options = replace(self.context, back_s=back_s)
        ahead = self._lookahead()
        records = plan_window(self._done if ahead is None else [*self._done, ahead], options, self._unrevised + int(ahead is not None), self.in_order_passes)
        if ahead is not None and records[-1] is not ahead:  # in order, the window ends short of it
            ahead = None
        elif ahead is not None and len(records) < 2:  # the newest final fills the window alone
            ahead, records = None, plan_window(self._done, options, self._unrevised, self.in_order_passes)
        elif ahead is not None:
            records.pop()
        late = (self.late_context and not self.lean_context) or not back  # the late shape (_pass_shape), not the loaded one; or no decided audio
        prompt = self._pass_prompt([r for r in self._done if r.index < records[0].index], late)
        window = records if ahead is None else [*records, ahead]
        request, spans = window_request(window, self.context, self.options.language, prompt, lean, self.gain_db)
        request = replace(request, long_prompt=late, vocabulary=self.options.prompt)
        self._context_spans = spans[: len(records)]
        self._context_ahead = None if ahead is None else spans[-1]
        self._context_ahead_text = self._ahead_text() if ahead is not None else ""
        self._context_fresh = self._done[-self._unrevised].index if self._unrevised else records[-1].index + 1
        # A window ending short of the newest final (in order) leaves its last utterance to the next.
        settled = records[-1] is self._done[-1] and (self._settled() or ahead is not None)
        self._context_decide_to = records[-1].index if settled or len(records) < 2 else records[-2].index
        if ahead is not None:  # its words are dropped: a decode that stops in it need not go on (the runner's rule)
            request = replace(request, needed_s=spans[-1].start)
        last = records[-1]
        return DecodeJob(self.channel, last.index, request, False, last.start + len(last.audio))

    def _pass_prompt(self, before: list[Finalized], late: bool) -> str:
        """A pass's prompt: the text before its window. A late pass (``late_back_s``: little or none
        of the decided audio in its window) takes all of it, up to the last 128 tokens as a settle
        decode does: the text is the only context it has left. Any other takes the text after the
        last final holding a doubtful word (:func:`_trusted_tail`), up to ``PROMPT_CHARS``. Replayed
        with every pass late (bench/replay_bench.py --late), the unseen held-out sets 3 and 4 went
        0.275 / 0.263 -> 0.229 / 0.263 after revisions, the fixtures 0.064 either way, and
        load_bench's streams, where the rule against doubtful text was found, 0.100 -> 0.109. Live,
        8 streams of sets 3 and 4 on 2 cores with ``--context-late-s 3``: 0.239-0.269 (mean 0.256)
        against 0.243-0.276 (0.266) with the trusted tail, and 0.245-0.266 (0.252) with no late
        passes at all (docs/benchmarks.md, fifty-seventh session)."""
        if late:
            return _tail_words(" ".join(t for t in [self._history, *(r.text for r in before)] if t), SETTLE_PROMPT_CHARS)
        return _tail_words(" ".join(r.text for r in _trusted_tail(before) if r.text), PROMPT_CHARS)

    def _ahead(self) -> _Utterance | None:
        """The utterance after the newest final, once it holds ``ahead_s`` of audio from where its
        speech began (None before that, or with no final before it, or with ``ahead_s`` 0)."""
        utt = next(iter(self._utterances.values()), None)
        if utt is None or not self.context.ahead_s or not self._done or utt.index <= self._done[-1].index:
            return None
        return utt if utt.end - utt.speech_at >= self.context.ahead_s * MODEL_RATE else None

    def _lookahead(self) -> Finalized | None:
        """:meth:`_ahead`'s audio up to ``ahead_max_s`` after its speech began, as a record that a pass
        holds after the newest final as lookahead (never decided: its words are dropped)."""
        utt = self._ahead()
        if utt is None:
            return None
        audio = utt.audio.copy(0, utt.speech_at - utt.start + int(self.context.ahead_max_s * MODEL_RATE))
        return Finalized(utt.index, utt.start, audio, 0, "", ())

    def _ahead_text(self) -> str:
        """The text of the lookahead utterance's latest interim decode ("" before one)."""
        utt = self._ahead()
        return utt.last_interim[0] if utt is not None and utt.last_interim is not None else ""

    def _settled(self) -> bool:
        """Whether the newest final may be decided without a later one (the speaker stopped, or the stream ended)."""
        if self._utterances:
            return False
        return self._draining or self._position - self._last_final_end >= self.context.settle_s * MODEL_RATE

    def _refresh_context(self, job: DecodeJob) -> DecodeJob | None:
        """A waiting pass takes the newest finals when its turn comes (pull model, as interims)."""
        if job is not self._context_job or self._context_closed:
            return None
        if self._settling:
            return job
        if job.utterance == self._done[-1].index and self._context_ahead is None and self._ahead() is None and self._context_late == self.late_context:
            return job  # no newer final, no lookahead to take or to grow, and as late as it was
        fresh = self._context_job = self._context_window()
        return fresh

    def _context_ended(self, job: DecodeJob, hypothesis: Hypothesis | None, repeat: bool = False) -> list[PipelineEvent]:
        """A context pass or a settle decode came back (None: skipped or failed): :meth:`_pass_ended`.

        A fault in handling its answer costs that answer only: the channel goes back to where it
        was before it (:class:`_Saved`), an :class:`AnswerFailed` tells the transport, and the pass
        ends as a skipped one does (its finals keep the text the client holds). A pass refines
        what the client already has; such a fault used to end the whole session with
        ``internal_error`` (a pass that heard only its lookahead ended a 13-minute stream at
        652 s, docs/benchmarks.md, eighty-sixth session). A fault in the skipped ending itself
        still ends the session: there is no simpler way on."""
        if job is not self._context_job:
            raise ValueError("context result for a job that is not in flight on this channel")
        if hypothesis is None:
            return self._pass_ended(job, None)
        decode = "settle" if self._settling else "context"
        return self._contained(
            lambda: self._pass_ended(job, hypothesis, repeat),
            lambda error: [AnswerFailed(self.channel, job.utterance, decode, error), *self._pass_ended(job, None)],
        )

    def _pass_ended(self, job: DecodeJob, hypothesis: Hypothesis | None, repeat: bool = False) -> list[PipelineEvent]:
        """A context pass came back (None: skipped or failed); a revision where its words differ.

        ``repeat``: ``hypothesis`` is the last pass's, whose window was the same (its
        words are not counted as votes again)."""
        if self._settling:
            return self._settle_ended(job, hypothesis)
        self._context_job = None
        spans = self._context_spans
        covered = self._covered()
        groups = None
        if hypothesis is not None and [r.index for r in covered] == [s.index for s in spans]:
            ahead_s = self._context_ahead.end - self._context_ahead.start if self._context_ahead else 0.0
            hyp = guard(hypothesis, job.request.duration, sum(r.seconds for r in covered) + ahead_s)
            groups = self._pass_groups(hyp.words, spans, covered)
            intended, self._context_decide_to = self._context_decide_to, reached(covered, groups, spans, self._context_fresh, self._context_decide_to)
            self._heard(_window_key(job.request, spans), intended, hypothesis)
        waiting = self._done[-self._unrevised :] if self._unrevised else []
        self._unrevised = sum(1 for r in self._done if r.index > self._context_decide_to)
        out = self._decided(waiting, spans[0].index if groups is not None else None)
        if groups is not None and trusted(covered, groups, self._context_fresh, self._context_decide_to):
            if not repeat:
                count_votes(covered, groups, spans, self._context_decide_to, ahead=self._context_ahead is not None)
            texts = revised_texts(covered, groups, spans, self._context_fresh, self._context_decide_to)
            mark_heard(covered, groups, spans, self._context_decide_to)
            out.extend(self._revise(covered, spans, _mended_seams(covered, groups, spans, texts)))
        self._trim()
        return out + self._newly_settled() + self._dispatch_context()

    def _heard(self, key: tuple, intended: int, hypothesis: Hypothesis) -> None:
        """Keep a pass's window and result (:meth:`_dispatch_pass`), the latest ``HEARD_WINDOWS_KEPT``."""
        self._heard_windows[key] = (intended, hypothesis)
        self._heard_windows.move_to_end(key)
        while len(self._heard_windows) > HEARD_WINDOWS_KEPT:
            self._heard_windows.popitem(last=False)

    def _decided(self, waiting: list[Finalized], heard_from: int | None) -> list[PipelineEvent]:
        """:class:`ContextDecided` for the ``waiting`` finals a pass has now decided: heard, from
        ``heard_from`` on (None: it heard none), or passed over (before its window)."""
        decided = [r.index for r in waiting if r.index <= self._context_decide_to]
        if not decided:
            return []
        heard = tuple(i for i in decided if heard_from is not None and i >= heard_from)
        return [ContextDecided(self.channel, heard, tuple(i for i in decided if i not in heard))]

    def _newly_settled(self) -> list[PipelineEvent]:
        """A :class:`Settled` event where more of the channel's finals are final for good than the
        last one said: settled by a settle decode (those are the first records kept, in order), or
        trimmed away (no decode holds them any more). None while what is final ends at offset 0
        (only empty finals): it would tell the client nothing, and the first text may still be
        revised, at offset 0, where every revision after a settled message starts after it."""
        last = next((r for r in reversed(self._done) if r.settled), None)
        fixed = (last.index, _text_end(last)) if last is not None else self._trimmed
        if fixed is None or fixed[0] <= self._settled_sent or fixed[1] == 0:
            return []
        self._settled_sent = fixed[0]
        return [Settled(self.channel, *fixed)]

    def _covered(self) -> list[Finalized]:
        """The records still kept from those the context job in flight holds (all of them, unless trimmed)."""
        spans = self._context_spans
        return [r for r in self._done if spans[0].index <= r.index <= spans[-1].index]

    def _pass_groups(self, words: tuple[Word, ...], spans: list[Span], covered: list[Finalized]) -> list[list[Word]]:
        """:func:`split_words` over the pass's records; the words of its lookahead, if any, are dropped first
        (:func:`before_ahead`)."""
        if self._context_ahead is not None:
            words = before_ahead(words, self._context_ahead.start, self._context_ahead_text)
        return split_words(words, spans, [r.text for r in covered])

    def _revise(self, covered: list[Finalized], spans: list[Span], texts: list[tuple[str, tuple[Word, ...]]], settle: bool = False) -> list[PipelineEvent]:
        placed, starts = self._placed(covered, texts)
        # A settled record keeps its text (a seam mend or a capital could touch it): the client was told it is final.
        changed = next((k for k, (r, t) in enumerate(zip(covered, placed)) if t != r.text and not r.settled), None)
        if changed is None:
            return []
        differ: list[int] = []
        for record, span, (text, words), upper in list(zip(covered, spans, texts, starts))[changed:]:
            shift = record.start / MODEL_RATE - span.start
            held, record.text = record.text, text
            if words or not text:  # no text: its audio lay under a neighbour's word (context.heard_in)
                record.words = tuple(Word(w.word, round(w.start + shift, 3), round(w.end + shift, 3), w.probability) for w in words)
            if upper:
                _capitalize(record)
            if not differ or record.text != held:
                differ.append(record.index)
        first = self._done.index(covered[changed])
        offset = self._done[first].offset
        position = offset
        for record in self._done[first:]:
            record.offset = position
            if record.text:  # one left with none takes no room, as an empty final (docs/protocol.md)
                position += len(record.text) + 1
        self._transcript_len = max(0, position - 1)
        self._last_text = _last_said(self._done)
        self._prompt = _tail_words(self._last_text, PROMPT_CHARS)
        revised = self._done[first:]
        said = [r for r in revised if r.text]
        shown = [retimed(r.words) for r in said]
        words = tuple(w for ws in shown for w in ws) if self.options.word_timestamps else ()
        spans = (_heard_span(ws, r.start / MODEL_RATE, (r.start + len(r.audio)) / MODEL_RATE) for r, ws in zip(said, shown))
        parts = tuple(RevisedSegment(r.index, r.offset, round(a, 3), round(b, 3)) for r, (a, b) in zip(said, spans))
        text = " ".join(r.text for r in said)
        out: list[PipelineEvent] = [Revision(self.channel, revised[0].index, revised[-1].index, offset, text, words, tuple(differ), settle, parts)]
        return out + self._moved_interim()

    def _placed(self, covered: list[Finalized], texts: list[tuple[str, tuple[Word, ...]]]) -> tuple[list[str], list[bool]]:
        """Each of ``texts`` as :meth:`_revise` places it, and whether it starts a sentence (then with a
        capital: :meth:`_starts_a_sentence` for the first, the placed text before it for the rest). So
        a pass that heard a sentence's first word in lower case ("unless to be" after "young man," in
        its window) changes nothing the client holds and sends no revision (one went out, the same
        text again, counted as a change of the utterance)."""
        placed: list[str] = []
        starts: list[bool] = []
        for record, (text, _) in zip(covered, texts):
            before = next((t for t in reversed(placed) if t), None)
            starts.append(ends_sentence(_last_word(before)) if before is not None else self._starts_a_sentence(record))
            placed.append(_capitalized(text, ())[0] if starts[-1] else text)
        return placed, starts

    def _starts_a_sentence(self, record: Finalized) -> bool:
        """Whether ``record`` starts a sentence: the record before it ends one, or it starts the
        transcript and its text (as it stands before a revision) with a capital."""
        k = self._done.index(record)
        before = _last_said(self._done[:k])
        if before:
            return ends_sentence(_last_word(before))
        return record.offset == 0 and record.text[:1].isupper()

    def _moved_interim(self) -> list[PipelineEvent]:
        """The live interim again, at its new offset (the revision changed the text before it)."""
        utt = next(iter(self._utterances.values()), None)
        if utt is None or utt.last_interim is None or not self.options.interim_results:
            return []
        text, stable = utt.last_interim
        return [Interim(self.channel, utt.index, self._next_offset(), text, stable, round(utt.speech_at / MODEL_RATE, 3), round(utt.end / MODEL_RATE, 3))]


@dataclass(frozen=True)
class _Saved:
    """A channel decoder's state, to go back to where handling a decode's answer raised
    (:meth:`ChannelDecoder.job_done`, :meth:`ChannelDecoder._context_ended`, and
    :meth:`ChannelDecoder.feed` taking an earlier answer as a final): its attributes, its
    lists of records, utterances and abandoned jobs, and the fields of each record and utterance
    (an answer changes them in place: a record's text, words, offset, votes; an utterance's
    agreement, interim, cuts asked for), and the length of each utterance's audio (audio fed
    appends to it: :meth:`ChannelDecoder.feed_contained`). Its other attributes are replaced,
    never changed in place."""

    attributes: dict[str, object]
    kept: tuple[tuple[Finalized | _Utterance, dict[str, object]], ...]
    lengths: tuple[tuple[AudioBuffer, int], ...]

    @classmethod
    def of(cls, decoder: ChannelDecoder) -> _Saved:
        attributes = dict(vars(decoder))
        attributes.update(
            _done=list(decoder._done), _utterances=OrderedDict(decoder._utterances), _abandoned=list(decoder._abandoned),
            _background=copy.deepcopy(decoder._background),
        )
        kept = tuple((o, _fields(o)) for o in [*decoder._done, *decoder._utterances.values()])
        return cls(attributes, kept, tuple((u.audio, len(u.audio)) for u in decoder._utterances.values()))

    def restore(self, decoder: ChannelDecoder) -> None:
        state = vars(decoder)
        state.clear()
        state.update(self.attributes)
        for kept, values in self.kept:
            vars(kept).update(values)
        for audio, length in self.lengths:
            audio.truncate(length)


def _fields(kept: Finalized | _Utterance) -> dict[str, object]:
    """The fields of a record or an utterance, with copies of those an answer changes in place."""
    values = dict(vars(kept))
    if isinstance(kept, Finalized):
        values["votes"] = dict(kept.votes)
    else:
        values["agreement"] = kept.agreement.copy()
    return values


def _trusted_tail(records: list[Finalized]) -> list[Finalized]:
    """The records after the last one holding a doubtful word: the text a context window's prompt
    may come from. As for first-pass finals, a doubtful word in the prompt gets copied: replaying
    load_bench's streams with lean passes (no decided audio in the window, as under load), the
    prompt of the text before turned "four queen of clubs" into "clothes" and carried it on
    (pooled WER after revisions 0.120 with it, 0.108 without doubtful text; docs/benchmarks.md)."""
    cut = max((k + 1 for k, r in enumerate(records) if not _confident(r.words)), default=0)
    return records[cut:]


def _confident(words: tuple[Word, ...]) -> bool:
    """Whether every word was heard with probability at least ``PROMPT_MIN_WORD_PROBABILITY``: text fit to be a prompt."""
    return all(w.probability >= PROMPT_MIN_WORD_PROBABILITY for w in words)


def _capitalize(record: Finalized) -> None:
    """A revised utterance starts with a capital where a sentence starts: after one that ended,
    or at the start of the transcript where its first pass had one. A pass's words at a seam
    come from a window that may have joined the two sentences ("Babylon, even in the days"),
    while the utterance before kept its own first pass ("Babylon."): the transcript read
    "Babylon. even in the days", and the reading's first words "your journey"."""
    record.text, record.words = _capitalized(record.text, record.words)


def _capitalized(text: str, words: tuple[Word, ...]) -> tuple[str, tuple[Word, ...]]:
    """``text`` and its ``words`` with the first letter a capital."""
    text = text.lstrip()
    if not text[:1].islower():
        return text, words
    if words:
        first = words[0]
        lead = len(first.word) - len(first.word.lstrip())
        words = (replace(first, word=first.word[:lead] + first.word[lead : lead + 1].upper() + first.word[lead + 1 :]), *words[1:])
    return text[:1].upper() + text[1:], words


def _mended_seams(
    records: list[Finalized], groups: list[list[Word]], spans: list[Span], texts: list[tuple[str, tuple[Word, ...]]]
) -> list[tuple[str, tuple[Word, ...]]]:
    """``texts`` (see :func:`revised_texts`) with each seam that reads as neither one sentence
    going on nor a new one starting ("young man, Unless to be") read as this pass heard it,
    where the pass heard the same two words there and heard them as one or the other.

    Each utterance's text can come from another hearing: a pass decides one utterance and keeps
    the next's first pass as lookahead, or a later pass decides the next while the one before
    keeps an earlier pass's comma (the LibriVox reading in the room, replayed). Only the
    punctuation of the word before the seam or the case of the word after it changes, never a
    word; a capital the pass heard after a comma ("name is, Mary") is left as it is."""
    out = list(texts)
    for k in range(len(records) - 1):
        if not groups[k] or not groups[k + 1]:
            continue
        last, first = _last_word(out[k][0]), _first_word(out[k + 1][0])
        if ends_sentence(last) or not _starts_sentence(first):
            continue  # it reads right
        heard_last, heard_first = _last_word("".join(w.word for w in groups[k])), _first_word("".join(w.word for w in groups[k + 1]))
        if not last or not first or normalize_word(heard_last) != normalize_word(last) or normalize_word(heard_first) != normalize_word(first):
            continue
        if ends_sentence(heard_last) and _starts_sentence(heard_first):
            out[k] = _respelled(records[k], spans[k], out[k], -1, heard_last)
        elif not ends_sentence(heard_last) and _first_letter(heard_first).islower():
            out[k + 1] = _respelled(records[k + 1], spans[k + 1], out[k + 1], 0, heard_first)
    return out


def _respelled(record: Finalized, span: Span, proposed: tuple[str, tuple[Word, ...]], at: int, spelling: str) -> tuple[str, tuple[Word, ...]]:
    """A proposed text and its words (window times; none: the record's own) with the word at
    ``at`` (0 or -1) spelled as ``spelling`` (left as it is where the model wrote that word in pieces)."""
    text, words = proposed
    words = words or window_words(record, span)
    tokens = text.split()
    if words:
        word = words[at]
        if word.word.strip() != tokens[at]:
            return proposed
        lead = word.word[: len(word.word) - len(word.word.lstrip())]
        changed = replace(word, word=lead + spelling)
        words = (changed, *words[1:]) if at == 0 else (*words[:-1], changed)
    tokens[at] = spelling
    return " ".join(tokens), words


def _text_end(record: Finalized) -> int:
    """Where ``record``'s text ends in the transcript; for one a revision left with none, which sits
    where the next one starts, the end of the text before it."""
    return record.offset + len(record.text) if record.text else max(0, record.offset - 1)


def _last_said(records: Sequence[Finalized]) -> str:
    """The text of the last of ``records`` that holds any ("" if none): a revision can leave a record
    with none, where its audio lay under a word the pass gave the one before (context.heard_in)."""
    return next((r.text for r in reversed(records) if r.text), "")


def _first_word(text: str) -> str:
    return (text.split() or [""])[0]


def _last_word(text: str) -> str:
    return (text.split() or [""])[-1]


def _window_key(request: DecodeRequest, spans: list[Span]) -> tuple:
    """What makes two context decodes the same: the utterances in the window, where they sit, the
    prompt, and the encoder window (lean or whole)."""
    return tuple(spans), len(request.audio), request.prompt, request.long_prompt, request.short_window, request.language


def _starts_sentence(word: str) -> bool:
    """A capital letter: the model writes one after a full stop that ends a sentence, and
    not after one it put inside a number ("as early as 3000. 800 BC")."""
    return _first_letter(word).isupper()


def _first_letter(word: str) -> str:
    """The word's first character after any opening quote or bracket ("" if none)."""
    return word.strip().lstrip("\"'(\u201c\u2018")[:1]


def _sentence_key(words: list[str]) -> tuple[str, ...]:
    """What two hypotheses must share to agree on where a sentence ends: its last
    ``SENTENCE_KEY_WORDS`` words (normalized), not all of them."""
    return tuple(normalize_word(w) for w in words[-SENTENCE_KEY_WORDS:])


def sentences_ended(hyp: Hypothesis) -> frozenset[tuple[str, ...]]:
    """The words up to each sentence end in ``hyp`` (normalized), to recognise it in the next hypothesis."""
    words = [w.word for w in hyp.words] if hyp.words else hyp.text.split()
    return frozenset(_sentence_key(words[: i + 1]) for i, w in enumerate(words) if ends_sentence(w))


def sentence_gap(
    words: tuple[Word, ...], heard_before: frozenset[tuple[str, ...]], min_s: float = SPLIT_MIN_S
) -> tuple[float, float, bool, bool] | None:
    """Where to look for the end of the last complete sentence in ``words`` (seconds from their
    audio's start), whether the cut needs a pause the VAD heard there, and whether
    ``heard_before`` has the sentence end too: around the gap between its last word and the
    first word after it; no pause is needed where ``heard_before`` has it and that next word
    starts with a capital. None when no sentence
    ending ``min_s`` or more into the audio has a word after it that starts with a capital, or
    with a lower-case letter where ``heard_before`` has the sentence end too.

    Where the words leave no gap (under ``SPLIT_MIN_GAP_S``) Whisper's timing has often
    stretched the sentence's last word over the pause after it (measured on a telephone
    recording: "nine." stamped to 0.4 s after the speech ended, "Can" 0.05 s after that, so
    that sentence waited 3.7 s for a long pause): a sentence end with a capital after it then
    splits still, if no sentence end with a gap came after it, but only at a pause the VAD
    heard within ``SPLIT_TIGHT_S`` of the two words' meeting point.

    Whisper writes lower case after a full stop it put inside a sentence ("of the second. of
    the seven wonders"), but also, in interims whose forced prefix holds the full stop, after
    one that ends a sentence ("gave it its name. but in those"): the prefix keeps that lower
    case in every later interim, and that sentence waited 5-15 s for a pause (a fast reader,
    clean and under noise). So a lower-case word counts when two interims in a row heard the
    sentence end, and the caller then cuts only at a pause the VAD heard, or a dip (the fourth
    item: the sentence end was heard twice). A digit never does
    ("as early as 3000. 800 BC")."""
    tight = None
    for i in range(len(words) - 2, -1, -1):
        end, following = words[i].end, words[i + 1].start
        if end < min_s:
            break
        if not ends_sentence(words[i].word):
            continue
        agreed = _sentence_key([w.word for w in words[: i + 1]]) in heard_before
        capital = _starts_sentence(words[i + 1].word)
        if following - end >= SPLIT_MIN_GAP_S and (capital or (agreed and _first_letter(words[i + 1].word).islower())):
            return max(0.0, end - SPLIT_MARGIN_S), following + SPLIT_MARGIN_S, not (agreed and capital), agreed
        if capital and tight is None:
            meet = (end + following) / 2
            tight = max(words[i].start, meet - SPLIT_TIGHT_S), min(words[i + 1].end, meet + SPLIT_TIGHT_S), True, agreed
    return tight


def clauses_ended(hyp: Hypothesis) -> frozenset[tuple[str, ...]]:
    """The words in ``hyp`` that end a clause (a comma, semicolon or colon after them), normalized."""
    return frozenset(_sentence_key([w.word]) for w in hyp.words if w.word.strip()[-1:] in CLAUSE_ENDS)


def long_clause(words: tuple[Word, ...], heard_before: frozenset[tuple[str, ...]]) -> tuple[float, float, bool, bool] | None:
    """Where to split an utterance that has run ``LONG_CLAUSE_S`` with no sentence end found in
    it: around the last word ``LONG_CLAUSE_MIN_S`` or more into it that ``words`` end a clause with
    and ``heard_before`` (the interim before) has too, with a word after it; any quiet stretch
    there will do (as :func:`sentence_gap`'s answer). None where there is none."""
    for i in range(len(words) - 2, -1, -1):
        word = words[i]
        if word.end < LONG_CLAUSE_MIN_S:
            return None
        if word.word.strip()[-1:] in CLAUSE_ENDS and _sentence_key([word.word]) in heard_before:
            return max(0.0, word.end - SPLIT_MARGIN_S), words[i + 1].start + SPLIT_MARGIN_S, False, True
    return None


def _long_sentence(gap: tuple[float, float, bool, bool]) -> tuple[float, float, bool, bool]:
    """``gap`` (as :func:`sentence_gap` answers) in an utterance that has run ``LONG_CLAUSE_S``:
    a sentence end the interim before heard too needs no pause there, as an agreed comma needs
    none (:func:`long_clause`). Under other people talking the VAD hears no pause and no dip
    between a fast reader's sentences, and Whisper's lower case after a full stop kept such a
    sentence waiting for max_utterance_s (docs/benchmarks.md, seventy-fifth session)."""
    lo, hi, _, agreed = gap
    return (lo, hi, False, True) if agreed else gap


def unmarked(committed: list[str]) -> bool:
    """Whether ``committed`` (an utterance's committed interim words) holds ``UNMARKED_PREFIX_WORDS``
    or more with no mark (``, ; :`` or a sentence's end) after any of them."""
    return len(committed) >= UNMARKED_PREFIX_WORDS and not any(w[-1:] in MARKS for w in committed)


def clause_at(words: tuple[Word, ...], heard: tuple[Word, ...]) -> bool:
    """Whether ``words`` (an interim) end a word with a mark (``,`` ``;`` ``:`` or a sentence's
    end) where ``heard`` (a pause decode that ended its last sentence with that word) ended, within
    ``SPLIT_TIGHT_S`` of it, and go on past it."""
    if not heard:
        return False
    last = _sentence_key([heard[-1].word])
    return any(w.word.strip()[-1:] in MARKS and _sentence_key([w.word]) == last
               and abs(w.end - heard[-1].end) <= SPLIT_TIGHT_S for w in words[:-1])


def unheard_tail(
    words: tuple[Word, ...], heard_before: frozenset[tuple[str, ...]], voiced_s: float, min_s: float = SPLIT_MIN_S
) -> tuple[float, float, bool, bool] | None:
    """Where to look for the end of the sentence that ``words`` end with, when the speaker has
    begun another that they leave out: the last word ends a sentence ``min_s`` or more into the
    audio and speech the VAD heard runs ``SPLIT_UNHEARD_S`` or more past it (to ``voiced_s``).
    The cut needs a pause; a dip will do where the interim before heard that sentence end too
    (``heard_before``; the fourth item), else an energy valley (the chunker checks).

    Greedy interims often stop at a sentence end and leave out the start of the next sentence
    for a second or more (a narration under pink noise 20 dB down: two interims in a row ended
    "...the windows of the tower." with 1.1 and 1.7 s of the next sentence heard, and that
    sentence waited 2.7 s for the one that wrote it). One interim alone can be the only one
    that hears a sentence end there: in the room one ended "...of the hardware." with 0.7 s of
    the next sentence unheard, the one before had ended "...of the cargo." and every one after
    ran the two sentences together ("hardware, and really the keeper" with int8 on the CPU,
    "hardo and really link the keeper" with float32), and that sentence waited 4.6-4.9 s for the
    pause after the next one (so with float16 on a GPU as well). None otherwise."""
    if not words or not ends_sentence(words[-1].word) or words[-1].end < min_s or voiced_s - words[-1].end < SPLIT_UNHEARD_S:
        return None
    end = words[-1].end
    return max(0.0, end - SPLIT_MARGIN_S), min(voiced_s, end + SPLIT_TIGHT_S), True, _sentence_key([w.word for w in words]) in heard_before


def _heard_span(words: tuple[Word, ...], start: float, end: float) -> tuple[float, float]:
    """Where an utterance heard as ``words`` (as clients get them, :func:`retimed`) is heard, in
    stream seconds: from its first word to its last, within ``end``; ``start`` to ``end`` where
    it has no words. A final's ``start``/``end`` and a revision's segments' both. Never ending
    before it starts: a pass can time an utterance's first word after its audio ends (a word
    said in the pause after it, matched to it by its first pass), and a subtitle cue or a
    turn whose end came before its start is what a client got then (random hypotheses,
    tests/decoding/test_pass_robustness.py)."""
    if not words:
        return start, end
    first = min(words[0].start, end)
    return first, min(end, max(words[-1].end, first))


def _tail_words(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    space = cut.find(" ")
    return cut[space + 1 :] if space >= 0 else cut


def _full_prompt(request: DecodeRequest) -> str:
    """What a decode was prompted with: the stream's vocabulary (its words first), then the text
    before its audio (the runner keeps the vocabulary whole, :attr:`DecodeRequest.vocabulary`)."""
    return f"{request.vocabulary} {request.prompt}".strip() if request.vocabulary else request.prompt
