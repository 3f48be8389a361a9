"""Encoder windows and batch keys: how much audio a decode feeds the encoder, as arithmetic.

Pure functions of a request and the runner's padding settings, so the
scheduler's frame budget and the engine agree on every window.
"""

from __future__ import annotations

from dataclasses import dataclass

from .types import DecodeKind, DecodeRequest

__all__ = [
    "INTERIM_ENCODER_PAD_S", "SHORT_INTERIM_PAD_S", "FINAL_ENCODER_PAD_S", "QUICK_FINAL_PAD_S", "BURST_FINAL_PAD_S", "LEAN_CONTEXT_PAD_S",
    "FULL_WINDOW_FRAMES", "WINDOW_STEP_FRAMES",
    "HOP_SAMPLES", "PROMPT_TOKEN_LIMIT", "LONG_PROMPT_TOKEN_LIMIT", "VOCABULARY_TOKEN_LIMIT", "MAX_INITIAL_TIMESTAMP_INDEX", "Pads", "window_frames", "max_new_tokens", "prompt_bucket",
]

# Whisper was trained on 30 s windows (3000 feature frames, zero-padded). The
# encoder accepts fewer frames and costs much less (measured: 0.044 s for 10 s,
# 0.26 s for 30 s), but with no padding at all the decoder runs away, and a
# window of the audio plus 10 s cost the finals 2.7 points of word error rate
# on the fixtures (docs/benchmarks.md, "Decoding choices, as measured"). So
# finals keep the full window and interims, most of the work, use the audio
# plus ``interim_pad_s``, rounded up to 5 s steps so that utterances of similar
# length share a batch. Finals that wait together fill their windows with each
# other instead of silence (:mod:`.packing`).
#
# CTranslate2 batches items whose <|startoftranscript|> sits at the same
# position, so the previous-text prompt is cut (from its start) to a power of
# two of tokens: prompts of similar length share batches. Measured on the
# fixture sentences: 0.116 vs 0.108 word error rate (2 words of 259).

INTERIM_ENCODER_PAD_S = 10.0
# Under load (level 1 and up) interims take the audio plus 2 s: 39% less model
# time per interim, for interims further from the final (docs/architecture.md, "Degradation").
SHORT_INTERIM_PAD_S = 2.0
FINAL_ENCODER_PAD_S = 30.0
# Quick finals (first-pass finals of streams with revisions) take the audio plus 10 s, beam 5:
# measured on the fixtures' utterances, half the model time of a full-window final (0.39 s
# against 0.72-0.80 s of a core) for WER 0.099 against 0.084; the context pass restores the
# rest. Finals in a burst (more waiting than workers) take the audio plus 5 s, greedy:
# 0.24-0.28 s, WER 0.107 (3 s of padding gave 0.194). At 8 streams, greedy 5 s finals for
# every first pass gave first-pass WER 0.17-0.18 against 0.14 for these (docs/benchmarks.md).
QUICK_FINAL_PAD_S = 10.0
BURST_FINAL_PAD_S = 5.0
# A context pass takes the full window, as offline transcription does, except a lean one
# (under load, only the utterances it decides: 5-10 s of audio): the audio plus 10 s. On the
# load bench's streams (replay_bench.py --load-streams --lean) the passes' model time went
# 0.105 -> 0.072 s per audio second for WER after revisions 0.108 -> 0.111 (under noise
# 20 dB: 0.110 -> 0.087, WER 0.142 -> 0.143), and at 8 streams revisions came p95 11-13 s
# after their final instead of 19-21 s (docs/benchmarks.md, 2026-11-25).
LEAN_CONTEXT_PAD_S = 10.0
FULL_WINDOW_FRAMES = 3000
WINDOW_STEP_FRAMES = 500
HOP_SAMPLES = 160  # one feature frame
PROMPT_TOKEN_LIMIT = 32
# A settle decode's prompt (DecodeRequest.long_prompt): offline transcription conditions each
# window on up to 223 tokens of its text before; 32 lost names the text before had spelled
# ("before battle on was built" for "Babylon", in the LibriVox-read history under noise).
LONG_PROMPT_TOKEN_LIMIT = 128
# A stream's vocabulary prompt goes ahead of the text before, whole: its words were cut first
# when the text before filled the 32 (a vocabulary alone was cut to a power of two too). 200
# characters of it are about 50 tokens of English; the cap keeps any prompt within the 223
# positions Whisper gives one (64 + 128).
VOCABULARY_TOKEN_LIMIT = 64
MAX_INITIAL_TIMESTAMP_INDEX = 50  # 1 s


@dataclass(frozen=True)
class Pads:
    """Silence after the audio in each kind of window, in encoder frames (3000: the full window)."""

    interim: int
    short_interim: int
    final: int
    pack_finals: bool  # packable finals count their share of a shared window
    quick_final: int = int(QUICK_FINAL_PAD_S * 100)
    burst_final: int = int(BURST_FINAL_PAD_S * 100)
    lean_context: int = int(LEAN_CONTEXT_PAD_S * 100)

    @staticmethod
    def from_seconds(
        interim_s: float, short_interim_s: float, final_s: float, pack_finals: bool,
        quick_final_s: float = QUICK_FINAL_PAD_S, burst_final_s: float = BURST_FINAL_PAD_S, lean_context_s: float = LEAN_CONTEXT_PAD_S,
    ) -> "Pads":
        def frames(seconds: float) -> int:
            return int(min(30.0, max(1.0, seconds)) * 100)

        final = frames(final_s)
        # Packing needs full windows: an item's words are told apart by where they sit in it.
        return Pads(frames(interim_s), frames(short_interim_s), final, pack_finals and final >= FULL_WINDOW_FRAMES,
                    frames(quick_final_s), frames(burst_final_s), frames(lean_context_s))


def window_frames(request: DecodeRequest, pads: Pads) -> int:
    """Encoder frames the request takes in a batch (a packed final: its share of a shared window)."""
    from .packing import PACK_MAX_ITEM_S, packed_frames

    if request.kind is DecodeKind.CONTEXT:
        if not request.short_window:
            return FULL_WINDOW_FRAMES  # as offline transcription: the whole 30 s window
        pad = pads.lean_context
    elif request.kind is DecodeKind.FINAL:
        if request.cut_back:
            pad = pads.burst_final
        elif request.short_window:
            pad = pads.quick_final
        elif pads.pack_finals and request.pack and request.duration <= PACK_MAX_ITEM_S:
            return packed_frames(request.duration)
        else:
            pad = pads.final
    else:
        pad = pads.short_interim if request.short_window else pads.interim
    if pad >= FULL_WINDOW_FRAMES:
        return FULL_WINDOW_FRAMES
    wanted = len(request.audio) // HOP_SAMPLES + pad
    return min(FULL_WINDOW_FRAMES, -(-wanted // WINDOW_STEP_FRAMES) * WINDOW_STEP_FRAMES)


def max_new_tokens(duration: float) -> int:
    """Runaway output guard: about 8 tokens a second is far above any speaking rate."""
    return int(min(200, 24 + 8 * duration))


def prompt_bucket(n: int, limit: int = PROMPT_TOKEN_LIMIT) -> int:
    """The largest power of two <= n (0 stays 0), capped at ``limit``."""
    return 0 if n <= 0 else min(limit, 1 << (n.bit_length() - 1))
