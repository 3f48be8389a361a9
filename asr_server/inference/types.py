"""The types at the model seam: what a decode asks for and what it gives back.

Everything above :mod:`asr_server.inference` (events, sessions, the decoder,
the scheduler) speaks these types; only the engine modules import
faster-whisper. :class:`Runner` is the interface a fake model implements in
tests.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

__all__ = ["SAMPLE_RATE", "DecodeKind", "DecodeRequest", "Word", "Hypothesis", "Runner", "BatchKey"]

SAMPLE_RATE = 16000


class DecodeKind(str, enum.Enum):
    INTERIM = "interim"  # greedy, no word timing: cheap, re-run as the utterance grows
    FINAL = "final"  # beam search with fallback and word timing: the result that stays
    # A channel's recent finalized utterances decoded together, as offline transcription
    # would see them (second pass): beam search, word timing, full window, never packed.
    CONTEXT = "context"

    @property
    def final_quality(self) -> bool:
        """Beam search with fallback, timestamps and word timing (finals and context passes)."""
        return self is not DecodeKind.INTERIM


@dataclass(frozen=True)
class DecodeRequest:
    audio: np.ndarray  # float32 mono at 16 kHz
    kind: DecodeKind
    language: str = "en"
    prompt: str = ""  # previous final text of the channel, as context
    # The stream's vocabulary prompt (StreamOptions.prompt): its tokens go first, whole (up to
    # VOCABULARY_TOKEN_LIMIT), ahead of the prompt's own (the runner's _prompt_tokens).
    vocabulary: str = ""
    prefix: str = ""  # forced start of the output (the stable part of an interim)
    word_timestamps: bool = False
    model: str = ""  # "" for the main model, "interim" for the optional smaller interim model
    # An interim on the runner's short encoder window (under load); a final on its quick
    # window (a first pass that the context pass will refine); a lean context pass (under
    # load) on the audio plus the runner's lean-context pad.
    short_window: bool = False
    burst: bool = False  # a final in a burst: greedy, on the audio plus the runner's burst pad
    # A quick final while the server is loaded (a final was late): greedy on the burst window
    # too, but not in a burst (on CPU it keeps the finals' own copy of the weights).
    busy: bool = False
    pack: bool = True  # a final that may share a window with other finals (see plan_packs)
    # A final decoded again because its cut-back decode heard no words in speech the VAD heard:
    # never cut back (the decoder asks for no busy final, the scheduler makes it no burst final).
    careful: bool = False
    # A context pass: the seconds of its audio whose words it needs (None: all; a pass with a
    # lookahead: up to where that starts). A decode that stops early before their end decodes the
    # rest; one that stops in the lookahead, whose words are dropped, does not.
    needed_s: float | None = None
    # The prompt's last 128 tokens, not 32: a settle decode's, and a late pass's (see
    # ChannelDecoder._pass_prompt).
    long_prompt: bool = False
    # A settle decode (ContextOptions.settle_window_s): its own beam, so its own batches.
    settle: bool = False
    # The talker's gain: the audio is raised this much (dB) before the model (see level.py).
    gain_db: float = 0.0

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE

    @property
    def cut_back(self) -> bool:
        """Cut back for load, in a burst or busy: a final decoded greedily on the burst window."""
        return self.burst or self.busy


@dataclass(frozen=True)
class Word:
    word: str  # as the model wrote it, leading space included; strip for display
    start: float  # seconds from the start of the decoded audio
    end: float
    probability: float


@dataclass(frozen=True)
class Hypothesis:
    text: str
    words: tuple[Word, ...] = ()
    avg_logprob: float = 0.0
    no_speech_prob: float = 0.0
    compression_ratio: float = 1.0
    decode_s: float = 0.0
    dropped: tuple[str, ...] = field(default=())  # guards that removed text, for logs
    packed: bool = False  # decoded in a window shared with other finals (see plan_packs)
    # Kept from a sampled attempt (temperature above 0): the greedy or beam decode failed
    # Whisper's checks (too unlikely or too repetitive), and sampling can hallucinate. Also set
    # on a quick final that failed them: it keeps its beam attempt (no fallback), as doubtful;
    # and on a decode that ran to its token budget (``max_new_tokens``, far above any speaking
    # rate): a loop the checks let through, as a fast recipe's quick final under noise ended
    # "cookie tony, the tony, tony, tony, tony, ..." up to the budget (the words before it kept
    # the compression ratio under 2.4); its words are no yardstick for a pass's (the merge of
    # that time kept "tony, tony, tony, t" against one).
    sampled: bool = False
    # Decoded on the finals' own copy of the weights (CPU; see WhisperRunner._load_copies): in a
    # burst that call ends sooner than the others beside it, so its time says little of how fast
    # a burst drains (see Scheduler._observe_batch).
    finals_copy: bool = False
    # Decoded as a cut-back final (greedy, on the burst window): Whisper's greedy search can skip
    # speech a beam hears (a call's "That is great news, thank you very much." came back as
    # "Thank you very much.", which the guards drop as a stock phrase).
    cut_back: bool = False


class Runner(Protocol):
    """What the scheduler needs of a model: requests with equal keys may share one batch."""

    languages: tuple[str, ...]

    def batch_key(self, request: DecodeRequest) -> Hashable: ...

    def warm_up_batch(self, size: int) -> None:
        """Decode one full batch of 30 s finals: the largest working memory a batch can need."""
        rng = np.random.default_rng(1)
        language = "en" if "en" in self.languages else self.languages[0]
        audio = (rng.standard_normal(SAMPLE_RATE * 29) * 0.01).astype(np.float32)
        self.transcribe_batch([DecodeRequest(audio, DecodeKind.FINAL, language=language, word_timestamps=True)] * size)

    def window_frames(self, request: DecodeRequest) -> int: ...

    def transcribe_batch(self, requests: Sequence[DecodeRequest], retry_later: bool = False) -> list[Hypothesis | None]:
        """One hypothesis per request, in order.

        A final that a shared window did not clearly transcribe is decoded
        alone in the same call; with ``retry_later`` it comes back None
        instead, for the caller to decode again with ``pack=False``, so the
        finals that were heard need not wait for it.
        """
        ...


@dataclass(frozen=True)
class BatchKey:
    """Requests with equal keys are decoded together (same options, window and prompt position)."""

    kind: DecodeKind
    language: str
    frames: int
    prompt_tokens: int
    quick: bool = False  # quick finals: on the quick window
    burst: bool = False  # finals in a burst: greedy, on the burst window
    busy: bool = False  # quick finals under load: greedy, on the burst window, not in a burst
    settle: bool = False  # settle decodes: a wider beam than the passes'
