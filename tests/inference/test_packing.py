"""Final packing: several utterances in one encoder window, words dealt back by Whisper's segments.

The planning and dealing are plain functions, driven here with made-up
token streams; the last tests run the real model on fixture sentences.
"""

from dataclasses import dataclass

import numpy as np

from asr_server.inference.whisper import (
    PACK_CONTENT_S,
    PACK_GAP_S,
    PACK_MAX_ITEM_S,
    DecodeKind,
    DecodeRequest,
    packed_frames,
    plan_packs,
    split_pack,
)


@dataclass
class Tok:
    """The two token ids split_pack reads: text is below eot, timestamps from timestamp_begin (0.02 s steps)."""

    eot: int = 1000
    timestamp_begin: int = 2000


TOK = Tok()


def ts(seconds: float) -> int:
    return TOK.timestamp_begin + round(seconds / 0.02)


def stream(*parts):
    """Tokens and aligned words from (start, [words], end) segments; a word is one token, timed nonsensically."""
    tokens, words, next_id = [], [], 1
    for start, texts, end in parts:
        if start is not None:
            tokens.append(ts(start))
        for text in texts:
            tokens.append(next_id)
            # Cross-attention timing is deliberately wrong (always 29 s): dealing must not use it.
            words.append({"word": " " + text, "tokens": [next_id], "start": 29.0, "end": 29.5, "probability": 0.9})
            next_id += 1
        if end is not None:
            tokens.append(ts(end))
    return tokens, words


def texts(members):
    return [None if m is None else " ".join(w["word"].strip() for w in m) for m in members]


def test_plan_packs_fills_windows_in_order_and_leaves_long_utterances_alone():
    assert plan_packs([3.0]) == [[0]]
    assert plan_packs([3.0, 4.0, 5.0]) == [[0, 1, 2]]
    # First fit: the fourth no longer fits the first window (3+3+4+3+5+3+9 > 28) and opens a second.
    assert plan_packs([3.0, 4.0, 5.0, 9.0, 2.0]) == [[0, 1, 2, 4], [3]]
    assert plan_packs([PACK_MAX_ITEM_S + 1, 2.0, 2.0]) == [[0], [1, 2]]
    for durations in ([3.0] * 20, [11.0, 1.0, 7.0, 12.0, 0.5, 6.0, 9.0]):
        packs = plan_packs(durations)
        assert sorted(i for p in packs for i in p) == list(range(len(durations)))
        for p in packs:
            assert p == sorted(p)
            if len(p) > 1:
                assert sum(durations[i] for i in p) + PACK_GAP_S * (len(p) - 1) <= PACK_CONTENT_S


def test_a_packable_final_counts_its_share_of_a_window_so_one_windows_budget_takes_what_one_window_holds():
    window = 3000
    for durations in ([3.0] * 5, [2.0, 5.0, 1.0, 4.0], [12.0, 10.0], [0.5] * 8):
        fits = sum(packed_frames(d) for d in durations) <= window
        one_window = sum(durations) + PACK_GAP_S * (len(durations) - 1) <= PACK_CONTENT_S
        assert fits == one_window, durations
        if fits:
            assert plan_packs(durations) == [list(range(len(durations)))]


def test_segments_go_whole_to_the_member_they_cover_even_with_edges_in_the_gaps():
    spans = [(0.0, 3.5), (6.5, 10.1), (13.1, 16.5)]
    # Whisper put both edges of the first segment in gaps (0.6 s into the second member's audio).
    tokens, words = stream((0.0, ["thank", "you"], 7.0), (7.0, ["he", "might"], 13.0), (13.0, ["the", "fox"], 19.0))
    assert texts(split_pack(TOK, tokens, words, spans)) == ["thank you", "he might", "the fox"]


def test_a_long_utterance_split_over_segments_stays_whole_although_one_segment_spills_into_the_gap():
    # As decoded from three LibriVox sentences: the first sentence's second segment
    # ends at the next one's onset, 0.56 s into its audio, and covers only 22% of its own.
    spans = [(0.0, 7.4), (10.4, 13.7), (16.7, 22.0)]
    tokens, words = stream((0.0, ["and", "mister"], 5.76), (5.76, ["his", "power"], 10.96), (10.96, ["he", "was"], 16.96), (16.96, ["unless"], 25.56))
    assert texts(split_pack(TOK, tokens, words, spans)) == ["and mister his power", "he was", "unless"]
    # A segment wholly inside a gap goes to the member nearer its middle.
    tokens, words = stream((0.0, ["one"], 7.5), (7.6, ["two"], 8.0), (10.5, ["three"], 13.7), (16.7, ["four"], 22.0))
    assert texts(split_pack(TOK, tokens, words, spans)) == ["one two", "three", "four"]


def test_a_skipped_member_gets_no_words_and_a_run_together_pair_is_decoded_alone():
    spans = [(0.0, 3.3), (6.3, 9.6), (12.6, 15.0)]
    skipped = stream((0.0, ["our", "meeting"], 5.0), (12.0, ["hello"], 15.0))
    assert texts(split_pack(TOK, *skipped, spans)) == ["our meeting", "", "hello"]
    # One segment covering the first two members' audio: which words are whose is unknown.
    together = stream((0.0, ["five", "five", "and", "mister"], 10.0), (12.5, ["hello"], 15.0))
    assert texts(split_pack(TOK, *together, spans)) == [None, None, "hello"]


def test_a_segment_without_an_end_time_makes_every_member_after_its_start_doubtful():
    spans = [(0.0, 3.0), (6.0, 9.0), (12.0, 15.0)]
    tokens, words = stream((0.0, ["one"], 4.5), (4.5, ["two", "three"], None))
    assert texts(split_pack(TOK, tokens, words, spans)) == ["one", None, None]
    tokens, words = stream((None, ["one", "two"], None))
    assert texts(split_pack(TOK, tokens, words, spans)) == [None, None, None]


def _sentences(names):
    from ..harness import MANIFEST, load_mono

    out = []
    for name in names:
        audio = load_mono(name)
        for ref, (start, end) in zip(MANIFEST[name]["references"][0], MANIFEST[name]["spans"][0]):
            out.append((audio[int(max(0.0, start - 0.3) * 16000) : int((end + 0.1) * 16000)], ref))
    return out


def test_packed_finals_keep_their_words_apart_and_as_accurate_as_alone(whisper_runner):
    """Three sources interleaved, as finals of several streams waiting together."""
    from ..wer import edit_distance, normalize

    by_source = [_sentences([n]) for n in ("cards_16k.wav", "librivox_16k.wav", "espeak_16k.wav")]
    sentences = [s for group in zip(*by_source) for s in group]
    requests = [DecodeRequest(a, DecodeKind.FINAL, word_timestamps=True) for a, _ in sentences]
    assert any(len(p) >= 3 for p in plan_packs([r.duration for r in requests]))  # real packs
    assert whisper_runner.pack_finals
    packed = whisper_runner.transcribe_batch(requests)
    assert sum(h.packed for h in packed) >= len(requests) // 2
    try:
        whisper_runner.pack_finals = False
        alone = [whisper_runner.transcribe(r) for r in requests]
    finally:
        whisper_runner.pack_finals = True

    def wer(hyps):
        errors = words = 0
        for h, (_, ref) in zip(hyps, sentences):
            errors += edit_distance(normalize(ref), normalize(h.text))
            words += len(normalize(ref))
        return errors / words

    assert wer(packed) <= wer(alone) + 0.05, (wer(packed), wer(alone))
    refs = [normalize(ref) for _, ref in sentences]
    for i, (h, r) in enumerate(zip(packed, requests)):
        assert h.text, refs[i]
        assert all(0.0 <= w.start <= w.end <= r.duration for w in h.words)
        assert "".join(w.word for w in h.words).split() == h.text.split()
        # Each sentence got its own words: nearer its own reference than any other, and not longer.
        own = edit_distance(refs[i], normalize(h.text))
        assert all(own < edit_distance(other, normalize(h.text)) for j, other in enumerate(refs) if other != refs[i]), (h.text, refs[i])
        assert len(normalize(h.text)) <= len(refs[i]) + 1, (h.text, refs[i])


def test_a_silent_member_does_not_take_words_from_its_neighbours(whisper_runner):
    speech, _ref = _sentences(["espeak_16k.wav"])[1]  # "Please call me back when you have a moment to talk."
    rng = np.random.default_rng(3)
    quiet = (rng.standard_normal(16000 * 2) * 0.002).astype(np.float32)
    hyps = whisper_runner.transcribe_batch([DecodeRequest(a, DecodeKind.FINAL, word_timestamps=True) for a in (speech, quiet, speech)])
    for h in (hyps[0], hyps[2]):
        assert "moment to talk" in h.text.lower()
    assert not {"call", "moment", "talk"} & set(hyps[1].text.lower().split())


def test_a_batch_of_finals_needing_more_windows_than_allowed_runs_in_several_calls(whisper_runner):
    """The working memory of one call stays that of ``max_windows`` windows, measured at start-up."""
    sentences = _sentences(["librivox_16k.wav"])
    # Sentences followed by silence, over PACK_MAX_ITEM_S in all: never packed, one window each.
    long = [np.concatenate([a, np.zeros(int((PACK_MAX_ITEM_S + 1) * 16000), np.float32)]) for a, _ in sentences[:3]]
    assert all(len(a) / 16000 > PACK_MAX_ITEM_S for a in long)
    requests = [DecodeRequest(a, DecodeKind.FINAL) for a in long]
    calls = []
    decode_group = whisper_runner._decode_group
    try:
        whisper_runner.max_windows = 2
        whisper_runner._decode_group = lambda tok, reqs, *rest: calls.append(len(reqs)) or decode_group(tok, reqs, *rest)
        hyps = whisper_runner.transcribe_batch(requests)
    finally:
        whisper_runner.max_windows = 0
        del whisper_runner._decode_group
    assert calls == [2, 1]
    assert all(len(h.text.split()) >= 5 for h in hyps), [h.text for h in hyps]


def test_with_retry_later_a_member_the_pack_missed_comes_back_none_for_the_caller_to_decode_alone(whisper_runner):
    from dataclasses import replace

    speech, _ref = _sentences(["espeak_16k.wav"])[1]
    rng = np.random.default_rng(3)
    quiet = (rng.standard_normal(16000 * 2) * 0.002).astype(np.float32)
    requests = [DecodeRequest(a, DecodeKind.FINAL, word_timestamps=True) for a in (speech, quiet, speech)]
    hyps = whisper_runner.transcribe_batch(requests, retry_later=True)
    assert hyps[1] is None
    assert all(h.packed and "moment to talk" in h.text.lower() for h in (hyps[0], hyps[2]))
    alone = replace(requests[1], pack=False)
    assert whisper_runner.window_frames(alone) == 3000 and whisper_runner.window_frames(requests[1]) < 3000


def test_quick_and_burst_finals_take_their_audio_plus_their_pad_and_are_never_packed():
    from asr_server.inference.types import DecodeKind, DecodeRequest
    from asr_server.inference.windows import Pads, window_frames

    pads = Pads.from_seconds(10.0, 2.0, 30.0, True, quick_final_s=10.0, burst_final_s=5.0)
    three_s = np.zeros(3 * 16000, np.float32)
    full = DecodeRequest(three_s, DecodeKind.FINAL)
    quick = DecodeRequest(three_s, DecodeKind.FINAL, short_window=True)
    assert window_frames(full, pads) == packed_frames(3.0)  # a packable final: its share of a window
    assert window_frames(quick, pads) == 1500  # 3 s + 10 s, up to the next 5 s step
    burst = DecodeRequest(three_s, DecodeKind.FINAL, short_window=True, burst=True)
    assert window_frames(burst, pads) == 1000  # 3 s + 5 s
    long_quick = DecodeRequest(np.zeros(28 * 16000, np.float32), DecodeKind.FINAL, short_window=True)
    assert window_frames(long_quick, pads) == 3000


def test_a_context_pass_takes_the_full_window_unless_it_is_lean():
    from asr_server.inference.types import DecodeKind, DecodeRequest
    from asr_server.inference.windows import Pads, window_frames

    pads = Pads.from_seconds(10.0, 2.0, 30.0, True, lean_context_s=10.0)
    seven_s = np.zeros(7 * 16000, np.float32)
    assert window_frames(DecodeRequest(seven_s, DecodeKind.CONTEXT), pads) == 3000  # as offline transcription
    assert window_frames(DecodeRequest(seven_s, DecodeKind.CONTEXT, short_window=True), pads) == 2000  # 7 s + 10 s, to the next 5 s step
    assert window_frames(DecodeRequest(seven_s, DecodeKind.CONTEXT, short_window=True), Pads.from_seconds(10.0, 2.0, 30.0, True, lean_context_s=30.0)) == 3000
