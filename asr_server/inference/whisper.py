"""The Whisper engine: batches of decode requests through CTranslate2 (via faster-whisper).

:class:`WhisperRunner` loads a Whisper model once and turns a batch of
:class:`DecodeRequest` into one :class:`Hypothesis` each, with one encoder
and one generate call per group of equal windows. It blocks for the whole
decode, so it is only ever called from the scheduler's worker threads.
Tests of everything above this seam use a fake runner with the same
members (:class:`~asr_server.inference.types.Runner`).

The arithmetic lives beside it: windows and keys (:mod:`.windows`), final
packing (:mod:`.packing`), the temperature-fallback rule (:mod:`.fallback`);
faster-whisper's internals are reached only through :mod:`.fw`. The names
those modules define are re-exported here for older imports.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from . import fw
from .fallback import FINAL_TEMPERATURES, Attempt, best_attempt, compression_ratio, needs_fallback, nothing_said
from .level import raised
from .models import DEFAULT_MODEL, ModelNotFound, resolve_model
from .packing import PACK_CONTENT_S, PACK_GAP_S, PACK_MAX_ITEM_S, packed_frames, plan_packs, split_pack, text_tokens, usable_pack
from .priority import call_lowered
from .types import SAMPLE_RATE, BatchKey, DecodeKind, DecodeRequest, Hypothesis, Runner, Word
from .windows import (
    FINAL_ENCODER_PAD_S, FULL_WINDOW_FRAMES, INTERIM_ENCODER_PAD_S, MAX_INITIAL_TIMESTAMP_INDEX, BURST_FINAL_PAD_S, QUICK_FINAL_PAD_S, SHORT_INTERIM_PAD_S, LEAN_CONTEXT_PAD_S,
    LONG_PROMPT_TOKEN_LIMIT, PROMPT_TOKEN_LIMIT, VOCABULARY_TOKEN_LIMIT, Pads, max_new_tokens, prompt_bucket, window_frames,
)

__all__ = [
    "DecodeKind", "DecodeRequest", "Word", "Hypothesis", "Runner", "WhisperRunner", "ModelNotFound", "resolve_model",
    "DEFAULT_MODEL", "BatchKey", "INTERIM_ENCODER_PAD_S", "SHORT_INTERIM_PAD_S", "FINAL_ENCODER_PAD_S", "FULL_WINDOW_FRAMES",
    "PACK_GAP_S", "PACK_CONTENT_S", "PACK_MAX_ITEM_S", "packed_frames", "plan_packs", "split_pack", "max_new_tokens",
]

log = logging.getLogger("asr_server.inference")
T = TypeVar("T")

BEST_OF = 5
FINAL_BEAM_SIZE = 5
# A settle decode (DecodeRequest.settle) runs only while the server has time to spare, and its
# words decide a stretch for good, so it searches wider: 10 hypotheses against a pass's 5. Over 27
# replays WER after revisions 0.171 -> 0.167 (32 errors fewer in 8226 words; under noise 0.170 ->
# 0.163), on the unseen held-out sets 3 and 4 10 fewer in 1740, for about 5% more context model
# time in the replays (docs/benchmarks.md, forty-fourth session).
SETTLE_BEAM_SIZE = 10
# Whisper's text context: prompt and output share these positions.
TEXT_CONTEXT = 448
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
# A context pass whose decode ends on a pair of timestamps (a segment closed, the next one begun,
# then end of text) at least this long before its audio does stopped early, with speech left
# unheard: the rest is decoded again from that timestamp, with the text so far as its prompt, as
# offline transcription seeks to the last timestamp and decodes on. Seen on a fast recipe
# reading under noise: the pass over its last five sentences ended "...mix it with the sauce,
# serve it with fresh<14.44><14.44>" in a 16.8 s window, the last sentence's words were too few
# to trust, and it kept its first pass's "it with fresh metal and plenty upgraded cheese" for good.
CONTINUE_REST_S = 1.0
# ... at most this many times per pass (each takes a lean window: the rest plus its pad).
CONTINUE_TIMES = 2
# Finals decode on the wide copy (a thread per core) only where a lone quick final takes at most
# this share of its time on one thread (:meth:`WhisperRunner.choose_final_copy`, at start-up): a
# call that has every core must be clearly faster, since it holds the cores the other calls would
# use. On a slow first-generation EPYC two threads took 0.58 s against 0.87 s on one; on a 2-core
# Intel Xeon (AVX-512) 0.19 s against 0.13 s, and one stream's finals on one thread came p50 0.49
# -> 0.44 s for 40% less final model time, 8 staggered streams' p95 0.73-0.77 -> 0.63-0.69 s
# (docs/benchmarks.md, eighty-fourth session).
WIDE_FINALS_SHARE = 0.85


@dataclass
class _Item:
    request: DecodeRequest
    features: np.ndarray  # [n_mels, window]
    content_frames: int
    prompt: list[int]
    prefix_len: int
    max_new: int


class WhisperRunner(Runner):
    """A loaded Whisper model (CTranslate2 via faster-whisper). Construct once; share across sessions.

    ``transcribe_batch`` decodes several requests with one encoder call and one
    generate call; a single request is a batch of one, so both paths are the
    same code. It blocks, so it is only ever called from the scheduler's worker
    thread (CTranslate2 releases the GIL while it computes).
    """

    def __init__(
        self,
        model_path: str,
        device: str = "cpu",
        compute_type: str = "auto",
        cpu_threads: int = 0,
        interim_encoder_pad_s: float = INTERIM_ENCODER_PAD_S,
        final_encoder_pad_s: float = FINAL_ENCODER_PAD_S,
        workers: int = 1,
        short_interim_pad_s: float = SHORT_INTERIM_PAD_S,
        pack_finals: bool = True,
        max_windows: int = 0,
        final_beam_size: int = FINAL_BEAM_SIZE,
        quick_final_pad_s: float = QUICK_FINAL_PAD_S,
        quick_final_beam_size: int = FINAL_BEAM_SIZE,
        burst_final_pad_s: float = BURST_FINAL_PAD_S,
        lean_context_pad_s: float = LEAN_CONTEXT_PAD_S,
        final_threads: int = 0,
        background_nice: int = 0,
        burst_copy: bool = True, settle_beam_size: int = SETTLE_BEAM_SIZE,
    ) -> None:
        """``*_encoder_pad_s``: seconds of silence after the audio in the encoder window (30: Whisper's full window).

        ``short_interim_pad_s``: the same for interims asking for the short window (under load).
        ``pack_finals``: finals decoded in one batch share 30 s windows (see :func:`plan_packs`).
        ``max_windows``: encoder windows per model call (0: no limit); a batch of finals that
        needs more (packs, and members decoded alone after all) runs in several calls, so
        working memory stays that of ``max_windows`` windows. ``final_beam_size``: beam width
        of full first-pass finals (1: greedy); the context pass always uses ``FINAL_BEAM_SIZE``,
        a settle decode (``settle``) ``settle_beam_size``.
        ``quick_final_pad_s``: the padding of quick finals (``short_window``),
        ``quick_final_beam_size`` their beam; ``burst_final_pad_s``: the padding of finals in a
        burst (``burst``), which decode greedily; ``lean_context_pad_s``: the padding of lean
        context passes (``short_window``; 30: the full window, as every other pass).
        ``final_threads``: on CPU, threads of a call of finals (0: ``cpu_threads``), and
        ``background_nice``: how much lower in CPU priority the other calls compute, and
        ``burst_copy``: burst finals then decode on a third copy (see :meth:`_load_copies`)."""
        if min(final_beam_size, quick_final_beam_size, settle_beam_size) < 1:
            raise ValueError("beam sizes must be at least 1")
        self.quick_final_beam_size, self.final_beam_size, self.settle_beam_size = quick_final_beam_size, final_beam_size, settle_beam_size
        self.pads = Pads.from_seconds(interim_encoder_pad_s, short_interim_pad_s, final_encoder_pad_s, pack_finals, quick_final_pad_s, burst_final_pad_s, lean_context_pad_s)
        self.max_windows = max(0, max_windows)
        threads = cpu_threads or (os.cpu_count() or 1)
        t0 = time.monotonic()
        self._load_copies(model_path, device, compute_type, threads, workers, final_threads, background_nice, burst_copy)
        self.model_path, self.device = model_path, device
        self.languages: tuple[str, ...] = tuple(self.model.supported_languages)
        self._tokens: dict[str, fw.Tokens] = {}
        self._prompt_cache: dict[tuple[int, str], list[int]] = {}  # shared by threads: dict operations are atomic; a lost entry is recomputed
        log.info("model loaded path=%s device=%s compute_type=%s threads=%d workers=%d in %.2fs", model_path, device, compute_type, threads, workers, time.monotonic() - t0)

    def _load_copies(self, model_path: str, device: str, compute_type: str, threads: int, workers: int, final_threads: int, nice: int,
                     burst_copy: bool) -> None:
        """The weights for ``workers`` calls at once with ``threads`` each, and on CPU with more
        threads for finals than for the rest, the weights again with that many: one call of finals
        at a time decodes on this copy (in a burst, the first call), so that a final, what a user waits on,
        has every core while no other call runs. Beside another call it shares them: equally at
        the same priority (a quick final 0.96 s beside a context pass against 0.58 s alone, on 2
        slow cores), mostly its own when the shared copy computes ``nice`` lower (0.74 s at 10,
        0.61 at 19). Two such calls at once would oversubscribe the cores (4 streams' finals p95
        3.3 -> 4.0 s; docs/benchmarks.md).

        In a burst, what counts is how fast the finals drain, not how fast one is: there calls of
        ``threads`` each, one per core at once, decode a third more finals a second than one call
        with every core (2 cores: 16 burst finals in 2.2-2.5 s against 3.5-3.7 s). With
        ``burst_copy`` (and a lowered shared copy, whose threads would give way to the wide call)
        they decode on a third copy at the finals' priority, as many calls at once as workers."""
        wide = device == "cpu" and final_threads > threads
        self.background_nice = max(0, nice) if wide else 0
        # num_workers: how many transcribe_batch calls may run at once (one per scheduler worker).
        self._base_model = call_lowered(self.background_nice, lambda: fw.load_model(
            model_path, device=device, compute_type=compute_type, cpu_threads=threads, num_workers=max(1, workers)))
        self._wide_model = fw.load_model(model_path, device=device, compute_type=compute_type, cpu_threads=final_threads, num_workers=1) if wide else None
        self._burst_model = fw.load_model(model_path, device=device, compute_type=compute_type, cpu_threads=threads,
                                          num_workers=max(1, workers)) if burst_copy and self.background_nice > 0 else None
        self._threads, self.wide_threads = threads, final_threads
        self.wide_finals = wide  # calls of finals take the wide copy (choose_final_copy may say no)
        self._wide_free = threading.Lock()  # held by the call of finals on the wide copy
        self._local = threading.local()  # the model the calling worker's batch runs on

    @property
    def final_threads(self) -> int:
        """Threads of a call of finals: the wide copy's while finals take it, else one worker's."""
        return self.wide_threads if self.wide_finals else self._threads

    @property
    def model(self) -> Any:
        """The faster-whisper model the calling thread decodes with now (finals' own, in a batch of finals)."""
        return getattr(self._local, "model", None) or self._base_model

    @contextmanager
    def _using(self, kind: DecodeKind, burst: bool = False) -> Iterator[bool]:
        """Decode on the wide copy if this is a call of finals. A second such call waits for the
        first if the shared copy computes at a lower priority (there it would get little of the
        cores until the first ended, then run on fewer threads); else it goes there. A call of
        burst finals takes the wide copy only if it is free, and else the shared one: the other
        workers are on finals of the burst too, or finish an interim or a pass that cannot be
        stopped, and the first call of the burst then has the cores at the finals' priority.
        With a burst copy, every call of burst finals decodes there instead, and so does a call
        of other finals that finds the wide copy taken, rather than wait for it: under load two
        such calls then decode at once (16 streams on 2 cores: finals p95 1.10-1.38 s against
        1.30-1.64 s waiting, revisions later; docs/benchmarks.md). Where the wide copy is no
        faster than one thread (:meth:`choose_final_copy`), every call of finals decodes on the
        burst copy.
        Yields whether the call is on the wide copy."""
        spill = kind is DecodeKind.FINAL and self._burst_model is not None
        wide = (kind is DecodeKind.FINAL and self.wide_finals and not (burst and spill)
                and self._wide_free.acquire(blocking=self.background_nice > 0 and not burst and not spill))
        self._local.model = self._wide_model if wide else self._burst_model if spill else self._base_model
        try:
            yield wide
        finally:
            self._local.model = None
            if wide:
                self._wide_free.release()

    @property
    def pack_finals(self) -> bool:
        return self.pads.pack_finals

    @pack_finals.setter
    def pack_finals(self, value: bool) -> None:
        self.pads = replace(self.pads, pack_finals=value and self.pads.final >= FULL_WINDOW_FRAMES)

    # -- public -------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Run both kinds of decode once so the first real request is not slow."""
        rng = np.random.default_rng(0)
        noise = (rng.standard_normal(SAMPLE_RATE * 2) * 0.01).astype(np.float32)
        language = "en" if "en" in self.languages else self.languages[0]
        for kind in DecodeKind:
            self.transcribe(DecodeRequest(noise, kind, language=language, word_timestamps=kind.final_quality))

    def measure_burst_final(self, seconds: float = 6.0, tokens: int = 16, repeats: int = 3, concurrent: int = 1,
                            stop: Callable[[], bool] = lambda: False) -> float:
        """Model seconds one final in a burst of ``seconds`` of speech takes, measured (median of ``repeats``).

        Everything such a final does: the features, the encoder on the audio plus the burst
        pad, ``tokens`` greedy steps (end of text is suppressed, so noise costs what about
        ``seconds`` of speech does at 150 words a minute, timestamps aside) and the word-timing
        pass. (Until CTranslate2's halving was known, 32 was asked for and 16 decoded; 16 keeps
        the measure, and the admission and figures built on it, as they were.)
        ``concurrent``: run that many at once (one per worker, as in a burst, where every
        worker is busy: on CPU a worker's threads then share the cores with the others'), and
        count the time until every one has done its ``repeats``, per repeat: how fast a burst
        drains. (A mean of each worker's time would not be: the call on the finals' copy ends
        sooner than the rest, and they take the cores it leaves.)

        ``stop`` is asked before each decode; once it says yes the measure ends without one more
        and gives NaN (the server's re-measure stops so when a session starts: its decodes
        would wait for the measure's, or share the cores with them).
        """
        if concurrent > 1:
            t0 = time.monotonic()
            with ThreadPoolExecutor(concurrent) as pool:
                runs = [pool.submit(self.measure_burst_final, seconds, tokens, repeats, 1, stop) for _ in range(concurrent)]
                stopped = any(math.isnan(run.result()) for run in runs)
            return math.nan if stopped else (time.monotonic() - t0) / repeats
        with self._using(DecodeKind.FINAL, burst=True):
            return self._time_decode(DecodeKind.FINAL, seconds, tokens, repeats, stop)

    def measure_final_copies(self, seconds: float = 4.0, tokens: int = 16, repeats: int = 3,
                             stop: Callable[[], bool] = lambda: False) -> tuple[float, float] | None:
        """Model seconds of a lone quick final of ``seconds`` of speech (beam search, ``tokens``
        steps, word timing) on the wide copy and on a one-thread copy at the finals' priority (the
        burst copy): medians of ``repeats``, the two taken in turn, so that a machine that slows
        meanwhile slows both. None without both copies, or once ``stop`` says so."""
        if self._wide_model is None or self._burst_model is None:
            return None
        wide: list[float] = []
        narrow: list[float] = []
        for _ in range(repeats):
            for burst, times in ((False, wide), (True, narrow)):
                with self._using(DecodeKind.FINAL, burst=burst):
                    times.append(self._time_decode(DecodeKind.FINAL, seconds, tokens, 1, stop, quick=True))
        if any(math.isnan(t) for t in wide + narrow):
            return None
        return sorted(wide)[len(wide) // 2], sorted(narrow)[len(narrow) // 2]

    def choose_final_copy(self, wide_s: float, narrow_s: float) -> bool:
        """Whether calls of finals go on taking the wide copy, given a lone final's model seconds on
        it and on one thread (:meth:`measure_final_copies`): only where it is at most
        :data:`WIDE_FINALS_SHARE` of the one-thread time. Else they decode on the burst copy, one
        thread at the finals' priority, as finals in a burst do, and the wide copy is let go (about
        80 MiB of tiny.en's): once it says no, nothing goes back to it. Call it before any decode
        but its own timing runs (the server does, at start-up)."""
        if self._wide_model is None or self._burst_model is None:
            return self.wide_finals
        self.wide_finals = wide_s <= WIDE_FINALS_SHARE * narrow_s
        if not self.wide_finals:
            self._wide_model = None
        return self.wide_finals

    def measure_context_pass(self, seconds: float = 24.0, tokens: int = 36, repeats: int = 1,
                             stop: Callable[[], bool] = lambda: False) -> float:
        """Model seconds of one context pass over ``seconds`` of speech on the full window, as passes
        decode (beam search, ``tokens`` steps, word timing), on one worker's threads: how long a pass
        can keep a worker from a burst of finals (see :class:`~asr_server.scheduler.capacity.CapacityModel`).
        ``stop``: as for :meth:`measure_burst_final`."""
        with self._using(DecodeKind.CONTEXT):
            return self._time_decode(DecodeKind.CONTEXT, seconds, tokens, repeats, stop)

    def _time_decode(self, kind: DecodeKind, seconds: float, tokens: int, repeats: int, stop: Callable[[], bool], quick: bool = False) -> float:
        """Median model seconds of ``repeats`` decodes of noise on the calling thread's copy (``quick``:
        a quick final; else a final is a burst final)."""
        language = "en" if "en" in self.languages else self.languages[0]
        tokenizer = self._tokenizer(language)
        noise = (np.random.default_rng(1).standard_normal(int(seconds * SAMPLE_RATE)) * 0.01).astype(np.float32)
        final = kind is DecodeKind.FINAL
        request = DecodeRequest(noise, kind, language=language, word_timestamps=True, burst=final and not quick, short_window=final and quick)
        times = []
        for _ in range(repeats):
            if stop():
                return math.nan
            t0 = time.monotonic()
            item = self._item(tokenizer, request, self.window_frames(request))
            features = item.features[None]
            encoded = self.model.model.encode(_storage(features))
            [result] = self.model.model.generate(
                encoded, [item.prompt], max_length=generate_length(tokens, len(item.prompt)), beam_size=self._beam(kind, request),
                suppress_tokens=[*self._suppress(tokenizer), tokenizer.eot], return_scores=True, return_no_speech_prob=True,
            )
            text = [t for t in result.sequences_ids[0] if t < tokenizer.eot]
            if text:
                self._align(tokenizer, [item], [text], encoded)
            times.append(time.monotonic() - t0)
        return sorted(times)[len(times) // 2]

    def window_frames(self, request: DecodeRequest) -> int:
        """Encoder frames the request takes in a batch (a packed final: its share of a shared window)."""
        return window_frames(request, self.pads)

    def _packs(self, request: DecodeRequest) -> bool:
        """Whether finals like ``request`` are decoded in shared windows (full finals only)."""
        return request.kind is DecodeKind.FINAL and self.pack_finals and not (request.short_window or request.burst)

    def batch_key(self, request: DecodeRequest) -> BatchKey:
        if self._packs(request):
            # Packs carry no prompt, and the rest are regrouped by prompt length inside the batch.
            return BatchKey(request.kind, request.language, FULL_WINDOW_FRAMES, -1)
        tokens = self._prompt_tokens(self._tokenizer(request.language), request.prompt, request.long_prompt, request.vocabulary)
        final = request.kind is DecodeKind.FINAL
        return BatchKey(request.kind, request.language, self.window_frames(request), len(tokens), final and request.short_window, final and request.burst,
                        final and request.busy and not request.burst, _settles(request))

    def transcribe(self, request: DecodeRequest) -> Hypothesis:
        [hyp] = self.transcribe_batch([request])
        assert hyp is not None
        return hyp

    def transcribe_batch(self, requests: Sequence[DecodeRequest], retry_later: bool = False) -> list[Hypothesis | None]:
        if not requests:
            return []
        keys = {self.batch_key(r) for r in requests}
        if len(keys) != 1:
            raise ValueError(f"requests in one batch must share a batch key, got {keys}")
        key = keys.pop()
        tokenizer = self._tokenizer(key.language)
        out: list[Hypothesis | None] = [None] * len(requests)
        retry: set[int] = set()
        with self._using(key.kind, key.burst) as wide:
            t0 = time.monotonic()  # model time: not the wait for the wide copy
            if self._packs(requests[0]):  # one batch key: alike in this
                retry = self._decode_packed(tokenizer, requests, out, retry_later)
            self._decode_alone(tokenizer, requests, [i for i, h in enumerate(out) if h is None and i not in retry], key, out)
        share = (time.monotonic() - t0) / len(requests)
        return [None if h is None else replace(h, decode_s=share, finals_copy=wide) for h in out]

    # -- batches ------------------------------------------------------------------------

    def _decode_packed(self, tokenizer: Any, requests: Sequence[DecodeRequest], out: list[Hypothesis | None], retry_later: bool) -> set[int]:
        """Decode the packable finals in shared windows into ``out``; the members to retry later."""
        packable = [i for i, r in enumerate(requests) if r.pack]
        packs = [[packable[j] for j in p] for p in plan_packs([requests[i].duration for i in packable]) if len(p) > 1]
        retry: set[int] = set()
        for packs_call in self._calls(packs):
            for pack, hyps in zip(packs_call, self._decode_packs(tokenizer, [[requests[i] for i in p] for p in packs_call]), strict=True):
                for i, h in zip(pack, hyps, strict=True):
                    out[i] = h  # None: not clearly heard in the pack, decoded alone
                    if h is None and retry_later:
                        retry.add(i)
        return retry

    def _decode_alone(self, tokenizer: Any, requests: Sequence[DecodeRequest], alone: list[int], key: BatchKey, out: list[Hypothesis | None]) -> None:
        """Decode ``alone`` (indexes) each in its own window, grouped by prompt length, into ``out``."""
        by_prompt: dict[int, list[int]] = {}
        for i in alone:
            by_prompt.setdefault(len(self._prompt_tokens(tokenizer, requests[i].prompt, requests[i].long_prompt, requests[i].vocabulary)), []).append(i)
        for group in by_prompt.values():
            # Only full windows are capped per call; shorter ones are bounded by the scheduler's frame budget.
            for call in self._calls(group) if key.frames >= FULL_WINDOW_FRAMES else [group]:
                for i, h in zip(call, self._decode_group(tokenizer, [requests[i] for i in call], key.frames, key.kind), strict=True):
                    out[i] = h

    def _decode_group(self, tokenizer: Any, requests: list[DecodeRequest], frames: int, kind: DecodeKind, follow: int = CONTINUE_TIMES) -> list[Hypothesis]:
        """One encoder and one generate call for requests of one window and prompt length (and for a
        context pass that stopped early, up to ``follow`` decodes of the rest: :meth:`_continued`)."""
        items = [self._item(tokenizer, r, frames) for r in requests]
        features = np.stack([it.features for it in items])
        encoded = self.model.model.encode(_storage(features))
        final = kind.final_quality
        beam = self._beam(kind, requests[0])
        # A quick final (the context pass refines it) keeps its beam attempt: a retry re-encodes and samples.
        quick = kind is DecodeKind.FINAL and requests[0].short_window
        results = self._generate(tokenizer, items, features, encoded, temperatures=FINAL_TEMPERATURES if final else (0.0,), beam_size=beam, fallback=not quick)
        texts = [text_tokens(tokenizer, r.tokens) for r in results]
        words = self._words(tokenizer, items, texts, features, encoded)
        out = []
        for it, attempt, tokens, w in zip(items, results, texts, words, strict=True):
            text = " ".join(tokenizer.decode(tokens).split())
            doubtful = (quick and needs_fallback(attempt)) or _doubtful(attempt, it)
            out.append(Hypothesis(text, w, attempt.avg_logprob, attempt.no_speech_prob, attempt.compression_ratio, sampled=doubtful, cut_back=it.request.cut_back))
            log.debug("decode kind=%s audio_s=%.2f prompt=%r prefix=%r -> %r", kind.value, it.request.duration, it.request.prompt, it.request.prefix, text)
        if kind is DecodeKind.CONTEXT and follow:
            out = [self._continued(tokenizer, it.request, a.tokens, h, follow) for it, a, h in zip(items, results, out, strict=True)]
        return out

    def _continued(self, tokenizer: Any, request: DecodeRequest, tokens: list[int], hyp: Hypothesis, follow: int) -> Hypothesis:
        """``hyp`` with the rest of the audio decoded after it where its decode stopped early
        (:func:`early_stop`): the rest on a lean window, the text so far added to its prompt, and
        itself followed so up to ``follow`` times in all."""
        at = early_stop(tokenizer, tokens, request.duration if request.needed_s is None else request.needed_s)
        if at is None:
            return hyp
        rest = replace(request, audio=request.audio[int(at * SAMPLE_RATE) :], prompt=f"{request.prompt} {hyp.text}".strip(), short_window=True,
                       needed_s=None if request.needed_s is None else request.needed_s - at)
        [more] = self._decode_group(tokenizer, [rest], self.window_frames(rest), DecodeKind.CONTEXT, follow - 1)
        if not more.text:
            return hyp
        words = tuple(replace(w, start=round(w.start + at, 3), end=round(w.end + at, 3)) for w in more.words)
        return replace(hyp, text=f"{hyp.text} {more.text}".strip(), words=hyp.words + words, sampled=hyp.sampled or more.sampled)

    def _beam(self, kind: DecodeKind, request: DecodeRequest) -> int:
        if kind is DecodeKind.FINAL:
            return 1 if request.cut_back else self.quick_final_beam_size if request.short_window else self.final_beam_size
        if _settles(request):
            return self.settle_beam_size
        return FINAL_BEAM_SIZE if kind.final_quality else 1

    def _words(self, tokenizer: Any, items: list[_Item], texts: list[list[int]], features: np.ndarray, encoded: Any) -> list[tuple[Word, ...]]:
        """Word timing for the items that asked for it (and said something)."""
        words: list[tuple[Word, ...]] = [()] * len(items)
        wanted = [i for i, it in enumerate(items) if it.request.word_timestamps and texts[i]]
        if wanted:
            # The encoder output is reused when every item is aligned; a subset is re-encoded.
            source = encoded if len(wanted) == len(items) else _storage(features[wanted])
            for i, aligned in zip(wanted, self._align(tokenizer, [items[i] for i in wanted], [texts[i] for i in wanted], source), strict=True):
                words[i] = tuple(_to_word(a, items[i].content_frames / 100) for a in aligned)
        return words

    def _decode_packs(self, tokenizer: Any, packs: list[list[DecodeRequest]]) -> list[list[Hypothesis | None]]:
        """Decode each pack of finals as one window and give every member its own words.

        A member comes back None when the pack did not clearly transcribe it
        (no words of its own, a failed decode, output cut short): the caller
        then decodes it alone, so packing can cost time but not words.
        """
        items, spans = zip(*(self._pack_item(tokenizer, pack) for pack in packs))
        features = np.stack([it.features for it in items])
        encoded = self.model.model.encode(_storage(features))
        results = self._generate(tokenizer, list(items), features, encoded, temperatures=(0.0,), beam_size=self.final_beam_size, fallback=False)
        ok = [i for i, r in enumerate(results) if usable_pack(tokenizer, r.tokens, r.avg_logprob, r.compression_ratio, items[i].max_new)]
        aligned: dict[int, list[dict]] = {}
        if ok:
            source = encoded if len(ok) == len(items) else _storage(features[ok])
            texts = [text_tokens(tokenizer, results[i].tokens) for i in ok]
            aligned = dict(zip(ok, self._align(tokenizer, [items[i] for i in ok], texts, source), strict=True))
        return [
            self._deal(tokenizer, pack, spans[i], results[i], aligned[i]) if i in aligned else [None] * len(pack)
            for i, pack in enumerate(packs)
        ]

    def _pack_item(self, tokenizer: Any, pack: list[DecodeRequest]) -> tuple[_Item, list[tuple[float, float]]]:
        """One window holding the pack's utterances with PACK_GAP_S between them, and each one's span (s)."""
        gap = np.zeros(int(PACK_GAP_S * SAMPLE_RATE), np.float32)
        pieces: list[np.ndarray] = []
        spans, position = [], 0
        for r in pack:
            if pieces:
                pieces.append(gap)
                position += len(gap)
            spans.append((position / SAMPLE_RATE, position / SAMPLE_RATE + r.duration))
            pieces.append(raised(r.audio, r.gain_db))  # each at its own talker's gain
            position += len(r.audio)
        audio = np.concatenate(pieces).astype(np.float32, copy=False)
        item = self._item(tokenizer, DecodeRequest(audio, DecodeKind.FINAL, language=pack[0].language), FULL_WINDOW_FRAMES)
        item.max_new = min(TEXT_CONTEXT - len(item.prompt) - 1, sum(max_new_tokens(r.duration) + 2 for r in pack))
        return item, spans

    def _deal(self, tokenizer: Any, pack: list[DecodeRequest], spans: list[tuple[float, float]], result: Attempt, aligned: list[dict]) -> list[Hypothesis | None]:
        """The pack's words dealt to its members (None: a member to decode alone)."""
        hyps: list[Hypothesis | None] = []
        for n, (r, (start, _end), words) in enumerate(zip(pack, spans, split_pack(tokenizer, result.tokens, aligned, spans), strict=True)):
            if not words:
                hyps.append(None)
                continue
            own = tuple(_to_word(a, r.duration, shift=start) for a in words)
            text = " ".join("".join(w.word for w in own).split())
            n_tokens = sum(len(a["tokens"]) for a in words)
            logprob = sum(len(a["tokens"]) * float(np.log(max(float(a["probability"]), 1e-10))) for a in words) / (n_tokens + 1)
            hyps.append(Hypothesis(text, own, logprob, result.no_speech_prob if n == 0 else 0.0, compression_ratio(text), packed=True))
        log.debug("pack of %d: %r", len(pack), [h.text if h else None for h in hyps])
        return hyps

    # -- pieces -------------------------------------------------------------------------

    def _calls(self, windows: list[T]) -> list[list[T]]:
        """Full windows split into model calls of at most ``max_windows``."""
        step = self.max_windows or max(1, len(windows))
        return [windows[i : i + step] for i in range(0, len(windows), step)]

    def _tokenizer(self, language: str) -> Any:
        tokens = self._tokens.get(language)
        if tokens is None:
            # Two workers may meet a language first at once: the first entry stored stays, so the
            # tokenizer each gets is the one its suppress list is looked up by (a second store had
            # replaced it, and the first caller's lookup found nothing).
            tokens = self._tokens.setdefault(language, fw.tokens_for(self.model, language))
        return tokens.tokenizer

    def _suppress(self, tokenizer: Any) -> list[int]:
        return next(list(t.suppress) for t in self._tokens.values() if t.tokenizer is tokenizer)

    def _prompt_tokens(self, tokenizer: Any, prompt: str, long: bool = False, vocabulary: str = "") -> list[int]:
        """The vocabulary's tokens, whole (up to ``VOCABULARY_TOKEN_LIMIT``), then the prompt's (the
        text said before) last power-of-two tokens, up to 32, or 128 where ``long``: the same text
        as without a vocabulary (prompts of one length share a call). Cached, since the scheduler
        asks for each waiting job's key."""
        if not prompt.strip() and not vocabulary.strip():
            return []
        key = (id(tokenizer), prompt, long, vocabulary)
        tokens = self._prompt_cache.get(key)
        if tokens is None:
            head, text = (tokenizer.encode(" " + s.strip()) if s.strip() else [] for s in (vocabulary, prompt))
            kept = prompt_bucket(len(text), LONG_PROMPT_TOKEN_LIMIT if long else PROMPT_TOKEN_LIMIT)
            tokens = head[:VOCABULARY_TOKEN_LIMIT] + text[len(text) - kept :]
            if len(self._prompt_cache) >= 4096:
                self._prompt_cache.clear()
            self._prompt_cache[key] = tokens
        return tokens

    def _item(self, tokenizer: Any, request: DecodeRequest, frames: int) -> _Item:
        feats = self.model.feature_extractor(raised(request.audio, request.gain_db))
        content = min(frames, feats.shape[-1] - 1)
        window = np.zeros((feats.shape[0], frames), np.float32)
        window[:, :content] = feats[:, :content]
        final = request.kind.final_quality
        prompt: list[int] = []
        previous = self._prompt_tokens(tokenizer, request.prompt, request.long_prompt, request.vocabulary)
        if previous:
            prompt = [tokenizer.sot_prev, *previous]
        prompt.extend(tokenizer.sot_sequence)
        if not final:
            prompt.append(tokenizer.no_timestamps)
        prefix: list[int] = []
        if request.prefix.strip():
            prefix = tokenizer.encode(" " + request.prefix.strip())[: 448 // 2 - 1]
            if final:
                prompt.append(tokenizer.timestamp_begin)
            prompt.extend(prefix)
        return _Item(request, window, content, prompt, len(prefix), max_new_tokens(request.duration))

    def _generate(
        self, tokenizer: Any, items: list[_Item], features: np.ndarray, encoded: Any, *, temperatures: Sequence[float], beam_size: int, fallback: bool = True
    ) -> list[Attempt]:
        """Decode with Whisper's temperature fallback (:mod:`.fallback`), failed items retried together.

        Returns per item the kept attempt: tokens up to end of text (timestamp
        tokens kept), cleared when Whisper's no-speech rule says nothing was
        said. Without ``fallback`` every item keeps its first attempt.
        """
        kept: list[Attempt | None] = [None] * len(items)
        attempts: list[list[Attempt]] = [[] for _ in items]
        todo = list(range(len(items)))
        for n, temperature in enumerate(temperatures):
            if not todo:
                break
            # The first pass uses the batch's encoder output; retries pass their features (re-encoded).
            source = encoded if n == 0 else _storage(features[todo])
            for i, attempt in zip(todo, self._attempt(tokenizer, [items[i] for i in todo], source, temperature, beam_size), strict=True):
                attempts[i].append(attempt)
            last = n == len(temperatures) - 1
            retry = [i for i in todo if fallback and not last and needs_fallback(attempts[i][-1])]
            for i in todo:
                if i not in retry:
                    failed = fallback and needs_fallback(attempts[i][-1])
                    kept[i] = best_attempt(attempts[i]) if failed else attempts[i][-1]
            todo = retry
        return [_finished(tokenizer, a) for a in kept if a is not None]

    def _attempt(self, tokenizer: Any, items: list[_Item], source: Any, temperature: float, beam_size: int) -> list[Attempt]:
        """One generate call at one temperature: an attempt per item."""
        if temperature > 0:
            kwargs: dict[str, Any] = {"beam_size": 1, "num_hypotheses": BEST_OF, "sampling_topk": 0, "sampling_temperature": temperature}
        else:
            kwargs = {"beam_size": beam_size, "patience": 1.0}
        generated = self.model.model.generate(
            source,
            [it.prompt for it in items],
            max_length=generate_length(max(it.prefix_len + it.max_new for it in items), max(len(it.prompt) - it.prefix_len for it in items)),
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self._suppress(tokenizer),
            max_initial_timestamp_index=MAX_INITIAL_TIMESTAMP_INDEX,
            **kwargs,
        )
        out = []
        for it, res in zip(items, generated, strict=True):
            tokens = list(res.sequences_ids[0])[: it.prefix_len + it.max_new]
            avg_logprob = res.scores[0] * len(tokens) / (len(tokens) + 1)
            out.append(Attempt(tokens, avg_logprob, res.no_speech_prob, compression_ratio(tokenizer.decode(tokens).strip()), temperature))
        return out

    def _align(self, tokenizer: Any, items: list[_Item], tokens: list[list[int]], encoded: Any) -> list[list[dict]]:
        """Word timing from cross-attention, for a batch: per item, word dicts with
        punctuation merged into the words and empty words dropped."""
        alignments = fw.align(self.model, tokenizer, tokens, encoded, [it.content_frames for it in items])
        out = []
        for alignment in alignments:
            fw.merge_punctuation(alignment, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
            out.append([a for a in alignment if a["word"].strip()])
        return out


def _settles(request: DecodeRequest) -> bool:
    """Whether ``request`` is a settle decode (its own beam, so its own batches)."""
    return request.kind is DecodeKind.CONTEXT and request.settle


def generate_length(tokens: int, start: int) -> int:
    """CTranslate2's ``max_length`` for a Whisper decode of at most ``tokens`` (a forced prefix
    included) after ``start`` prompt tokens. Its Whisper model decodes at most half the
    ``max_length`` it is given (OpenAI's ``sample_len``: 448 gives 224), so the count is
    doubled; without that the runaway guard (:func:`max_new_tokens`) was half what it says, and
    a 21 s context pass of a fast reader (180 words a minute) stopped at 96 tokens, mid-word,
    with the last sentence unheard. It also decodes at most ``max_length`` less the prompt
    (measured: a 132-token prompt and 140 gave 9 tokens), and one shorter than the prompt
    crashed the process (a 130-token settle prompt and 128, on a 5 s continuation). Capped
    where prompt and output fill the text context."""
    count = max(1, min(tokens, TEXT_CONTEXT - start))
    return max(2 * count, start + count)


def early_stop(tokenizer: Any, tokens: list[int], duration: float) -> float | None:
    """Where a decode stopped early, or None: its tokens (end of text cut off) end on two timestamps,
    the last at least :data:`CONTINUE_REST_S` before ``duration`` (the seconds of audio whose words
    it needs). Whisper's own rule: a decode that ends on one timestamp closed its last segment at
    the end of what it heard; one that ends on two had begun another."""
    if len(tokens) < 3 or not all(t >= tokenizer.timestamp_begin for t in tokens[-2:]):
        return None
    at = (tokens[-1] - tokenizer.timestamp_begin) * 0.02
    return at if 0.0 < at <= duration - CONTINUE_REST_S else None


def _doubtful(a: Attempt, item: _Item) -> bool:
    """Whether a kept attempt's text is doubtful (:attr:`Hypothesis.sampled`): sampled, or run to its
    token budget (a loop Whisper's checks let through)."""
    return a.temperature > 0 or len(a.tokens) >= item.prefix_len + item.max_new


def _finished(tokenizer: Any, a: Attempt) -> Attempt:
    """The kept attempt cut at end of text; empty when nothing was said."""
    tokens = [] if nothing_said(a) else a.tokens
    end = tokens.index(tokenizer.eot) if tokenizer.eot in tokens else len(tokens)
    return a._replace(tokens=tokens[:end])


def _to_word(a: dict, limit: float, shift: float = 0.0) -> Word:
    """An aligned word dict as a :class:`Word`, ``shift`` seconds earlier, times within [0, limit]."""
    start = min(max(float(a["start"]) - shift, 0.0), limit)
    end = min(max(float(a["end"]) - shift, start), limit)
    return Word(a["word"], round(start, 3), round(end, 3), round(float(a["probability"]), 4))


def _storage(array: np.ndarray) -> Any:
    import ctranslate2

    return ctranslate2.StorageView.from_array(np.ascontiguousarray(array, dtype=np.float32))
