"""Packing finals: several utterances in one 30 s encoder window, words dealt back by Whisper's segments.

Plain functions: which requests share a window (:func:`plan_packs`), what
share of a window one takes (:func:`packed_frames`), and whose words are
whose (:func:`split_pack`). The engine runs the decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .fallback import COMPRESSION_RATIO_THRESHOLD, LOG_PROB_THRESHOLD
from .windows import FULL_WINDOW_FRAMES

__all__ = ["PACK_GAP_S", "PACK_CONTENT_S", "PACK_MAX_ITEM_S", "packed_frames", "plan_packs", "split_pack", "usable_pack", "text_tokens"]

# Finals waiting together share one 30 s window.
PACK_GAP_S = 3.0  # silence between packed utterances (with 1 s Whisper skipped some)
PACK_CONTENT_S = 28.0  # utterances plus gaps in one window
PACK_MAX_ITEM_S = 12.0  # longer utterances are decoded alone


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
    segments, segment_of = _segments(tokenizer, tokens)
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


def _segments(tokenizer: Any, tokens: list[int]) -> tuple[list[list[float | None]], list[int]]:
    """Whisper's segments as ``[start, end]`` seconds (None where a timestamp is missing), and each text token's segment."""
    begin, eot = tokenizer.timestamp_begin, tokenizer.eot
    segments: list[list[float | None]] = []
    segment_of: list[int] = []
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
    return segments, segment_of


def _member_at(time: float, spans: list[tuple[float, float]]) -> int:
    """The member whose audio holds ``time``; in a gap, the member with the nearer edge."""
    for j, (a, b) in enumerate(spans):
        if time < a:
            return j if j == 0 or a - time < time - spans[j - 1][1] else j - 1
        if time < b:
            return j
    return len(spans) - 1


def usable_pack(tokenizer: Any, tokens: list[int], avg_logprob: float, ratio: float, max_new: int) -> bool:
    """A pack's decode is trusted only if Whisper's own checks pass and it was not cut short."""
    return bool(text_tokens(tokenizer, tokens)) and ratio <= COMPRESSION_RATIO_THRESHOLD and avg_logprob >= LOG_PROB_THRESHOLD and len(tokens) < max_new


def text_tokens(tokenizer: Any, tokens: list[int]) -> list[int]:
    """The text of a token sequence, without timestamps and special tokens."""
    return [t for t in tokens if t < tokenizer.eot]
