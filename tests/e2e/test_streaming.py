"""End to end: real server on loopback, real embedded model, real fixtures."""

from __future__ import annotations

import asyncio
import functools

import numpy as np
import pytest
from asr_client import stream_bytes

from asr_server.audio.vad import VadOptions

from ..harness import FIXTURES, FROM_AUDIO, MANIFEST, Replay, ServerThread, assert_each_sentence_finalized, load_channels, replay
from ..wer import normalize, wer

pytestmark = pytest.mark.e2e

# How much worse than faster-whisper's offline transcription of the whole file the
# streamed finals may be. Streaming decodes each utterance alone; offline decoding
# sees 30 s windows holding several sentences. Measured with tiny.en int8 (README,
# "Accuracy"): pooled over all fixtures the gap is about 0.05; per file it is 0 to
# 0.16 (8 kHz synthetic speech is the worst). The target is 0.02: not met yet.
WER_POOLED_MARGIN = 0.07
WER_FILE_MARGIN = 0.2


@functools.lru_cache(maxsize=None)
def _offline_text(runner, name: str, channel: int = 0) -> str:
    """faster-whisper's own transcription of the whole file with the same model."""
    segments, _ = runner.model.transcribe(load_channels(name)[channel], language="en")
    return " ".join(s.text for s in segments)


def reference(name: str, channel: int = 0) -> str:
    return " ".join(MANIFEST[name]["references"][channel])


def check_protocol(r: Replay) -> None:
    """The seq, offset and interim-before-final rules, on every message."""
    msgs = [m.message for m in r.messages]
    assert [m["seq"] for m in msgs] == list(range(1, len(msgs) + 1))
    assert msgs[0]["type"] == "session" and msgs[-1]["type"] == "closed"
    assert len({m["session_id"] for m in msgs}) == 1
    transcripts: dict[int, str] = {}
    seen_interim: set[tuple[int, int]] = set()
    finished: set[tuple[int, int]] = set()
    for m in msgs:
        if m["type"] == "revision":  # the finals from offset to their end are now text
            t = transcripts.get(m["channel"], "")
            first, last = m["utterances"]
            assert 0 <= m["offset"] <= len(t) and first <= last and (m["channel"], last) in finished
            transcripts[m["channel"]] = (t[: m["offset"] - 1] + " " + m["text"]) if m["offset"] else m["text"]
            continue
        if m["type"] not in ("interim", "final"):
            continue
        key = (m["channel"], m["utterance"])
        assert key not in finished, "a message after the utterance's final"
        t = transcripts.get(m["channel"], "")
        assert m["offset"] == (len(t) + 1 if t else 0)
        if m["type"] == "interim":
            assert 0 <= m["stable"] <= len(m["text"])
            seen_interim.add(key)
        else:
            finished.add(key)
            if m["text"]:
                assert key in seen_interim, f"final without an interim before it: {m}"
                transcripts[m["channel"]] = (t + " " + m["text"]).strip()
            assert m["start"] <= m["end"]
            for w in m["words"]:
                assert m["start"] - 0.01 <= w["start"] <= w["end"] <= m["end"] + 0.01
    # The client's transcript model rebuilds exactly the finals.
    client = r.transcript()
    for ch, text in transcripts.items():
        assert client.final_text(ch) == text


def check_stability(r: Replay) -> None:
    """Later interims of an utterance never change its stable prefix."""
    last: dict[tuple[int, int], tuple[str, int]] = {}
    for m in (t.message for t in r.messages if t.message["type"] == "interim"):
        key = (m["channel"], m["utterance"])
        if key in last:
            text, stable = last[key]
            assert m["text"][:stable] == text[:stable]
            assert m["stable"] >= stable
        last[key] = (m["text"], m["stable"])


def test_realtime_librivox_finals_arrive_at_each_sentence_end(live_server, whisper_runner):
    name = "librivox_16k.s16le"
    r = asyncio.run(replay(live_server.url, name, realtime=True))
    check_protocol(r)
    check_stability(r)
    finals = [f for f in r.of_type("final") if f.message["text"]]
    spans = MANIFEST[name]["spans"][0]
    assert_each_sentence_finalized([f.message for f in finals], spans)
    # Each final came from the audio (its endpoint, or a sentence end the interims heard where a long
    # sentence split: a fresh-clone CI run got one), not from the client's close.
    # (How soon after the end of speech is a benchmark's business: bench/stream_bench.py.)
    assert all(f.message["reason"] in FROM_AUDIO for f in finals), [f.message for f in finals]
    for f in finals:  # captions came while each sentence was spoken
        assert any(i.message["utterance"] == f.message["utterance"] for i in r.of_type("interim"))
    streamed = wer(reference(name), r.final_text())
    offline = wer(reference(name), _offline_text(whisper_runner, name))
    assert streamed <= offline + WER_FILE_MARGIN, (streamed, offline, r.final_text())


ENCODINGS = ["librivox.ogg", "librivox.webm", "librivox.mp3", "librivox.flac", "librivox_16k.wav", "cards_44k.f32le",
             "espeak_16k.wav", "espeak_8k.mulaw", "espeak_8k.alaw", "call_8k_stereo.s16le"]


def test_every_encoding_transcribes_close_to_offline(live_server, whisper_runner):
    """Each encoding end to end; the pooled word error rate stays near offline's.

    Per file the transcript the client holds at ``closed`` (the context pass's revisions
    applied) is checked: no lost sentence, no runaway hallucination. The first-pass finals are
    checked pooled: alone, a card of cards_44k is heard as "8. 8. 8." with AMD's int8 kernels
    (oneDNN; 0.238 for the file, 0.000 once revised), where Intel's hear it right."""
    errors = refined_errors = offline_errors = words = 0
    report = []
    for name in ENCODINGS:
        r = asyncio.run(replay(live_server.url, name, realtime=False))
        check_protocol(r)
        channels = MANIFEST[name]["channels"]
        # Every channel is transcribed on its own (the call's two speakers stay apart).
        assert {f.message["channel"] for f in r.of_type("final") if f.message["text"]} == set(range(channels))
        closed = r.of_type("closed")[0].message
        assert closed["audio_received_s"] >= max(e for spans in MANIFEST[name]["spans"] for _, e in spans)
        for ch in range(MANIFEST[name]["channels"]):
            ref = reference(name, ch)
            n = len(normalize(ref))
            streamed, refined = wer(ref, r.final_text(ch)), wer(ref, r.transcript().final_text(ch))
            offline = wer(ref, _offline_text(whisper_runner, name, ch))
            report.append(f"{name} ch{ch}: streamed {streamed:.3f} revised {refined:.3f} offline {offline:.3f}")
            # Per file: no lost sentence, no runaway hallucination (either costs > 0.2).
            assert refined <= offline + WER_FILE_MARGIN, report[-1] + " " + r.transcript().final_text(ch)
            errors += round(streamed * n)
            refined_errors += round(refined * n)
            offline_errors += round(offline * n)
            words += n
    assert errors / words <= offline_errors / words + WER_POOLED_MARGIN, "\n".join(report)
    assert refined_errors / words <= offline_errors / words + WER_POOLED_MARGIN, "\n".join(report)


def test_finalize_mid_sentence_gives_a_final_at_once(live_server):
    from asr_client import connect, read_pcm

    async def go():
        pcm, _ = read_pcm(str(FIXTURES / "librivox_16k.wav"))
        async with connect(live_server.url, encoding="pcm_s16le", sample_rate=16000) as s:
            await s.send_audio(pcm[: 16000 * 2 * 3])  # 3 s: inside the first sentence
            await s.finalize()
            msgs = []
            async for m in s:
                msgs.append(m)
                if m["type"] == "final":
                    break
            await s.close_stream()
            async for m in s:
                msgs.append(m)
            return msgs, s.close_code

    msgs, code = asyncio.run(go())
    final = next(m for m in msgs if m["type"] == "final")
    assert final["reason"] == "finalize" and "dashwood" in final["text"].lower()
    assert msgs[-1]["type"] == "closed" and code == 1000


def test_words_can_be_turned_off(live_server):
    r = asyncio.run(replay(live_server.url, "cards_16k.wav", word_timestamps=False, interim_results=False))
    assert not r.of_type("interim")
    finals = r.of_type("final")
    assert finals and all(f.message["words"] == [] for f in finals)


def test_the_debug_log_names_the_session_of_every_decode(live_server, caplog):
    """An operator reading why a caption came out as it did follows one session's decodes in the log."""
    import logging
    import re

    with caplog.at_level(logging.DEBUG, logger="asr_server.session"):
        r = asyncio.run(replay(live_server.url, "cards_16k.wav"))
    sid = r.messages[0].message["session_id"]
    line = re.compile(rf"session={re.escape(sid)} event=decoded kind=(\w+)\S* channel=0 utterance=(\d+) .* outcome=(\w+) text=(.*)$")
    decoded = [m.groups() for rec in caplog.records if (m := line.match(rec.getMessage()))]
    finals = [f.message for f in r.of_type("final") if f.message["text"]]
    assert finals and decoded
    # Every final with words came out of a decode of its utterance that the log shows, text and all.
    done = {(int(u), kind) for kind, u, outcome, text in decoded if outcome == "done" and text != "None"}
    assert all((f["utterance"], "final") in done or (f["utterance"], "interim") in done for f in finals)
    assert {kind for kind, *_ in decoded} >= {"interim", "final", "context"}


def test_speech_without_pauses_is_cut_at_max_length(live_server):
    # With a 3 s endpoint the 1.2 s gaps between sentences do not end an utterance
    # (until the talking has run 6 s: then a 200 ms pause does), so max_utterance_s
    # bounds them (sentence splits are off).
    name = "librivox_16k.s16le"
    r = asyncio.run(replay(live_server.url, name, endpoint_ms=3000, max_utterance_s=8, split_after_s=0))
    check_protocol(r)
    finals = [f.message for f in r.of_type("final")]
    assert any(f["reason"] == "max_length" for f in finals)
    assert all(f["end"] - f["start"] <= 8.0 + 0.01 for f in finals)
    assert not any(f["reason"] == "sentence" for f in finals)
    assert wer(reference(name), r.final_text()) < 0.25


def test_a_quiet_talker_is_transcribed_as_well_as_at_the_recordings_own_level(full_pass_server, whisper_runner):
    """A talker 40 dB quieter than recorded (speech at about -64 dBFS, in 16-bit samples), as a laptop's
    microphone at low gain or a far talker sends it: every utterance gets its final, and the transcript
    at close is as accurate as offline transcription of the recording at its own level. (A fixed
    -50 dBFS floor in the VAD heard one sentence in 31 at this level; Whisper, fed the quiet audio as it
    came, wrote more errors as the level fell: inference/level.py.)

    The card names, one human speaker: without the talker's gain they end with two words wrong in
    21 (first pass 4), with it none (1), against none offline, in 3 runs without and 5 with (one
    idle, the others with one core kept busy). The LibriVox reading, used before, swung on one
    word both ways ("ill-disposed" and "old-sposed" on processors without AVX-512, as the passes'
    votes or the settle decode fell), four errors, more than the talker's gain is worth there
    (docs/benchmarks.md, fiftieth session).
    On the full-pass server: passes at load level 0 and no settle decode (tests/conftest.py)."""
    name = "cards_16k.wav"
    quiet = np.round(load_channels(name)[0] * 10 ** (-40 / 20) * 32767).astype("<i2").tobytes()

    async def run() -> Replay:
        r = Replay(name)
        async for item in stream_bytes(full_pass_server.url, quiet, bytes_per_second=32000, encoding="pcm_s16le", sample_rate=16000, channels=1):
            r.messages.append(item)
        return r

    r = asyncio.run(run())
    check_protocol(r)
    assert_each_sentence_finalized([f.message for f in r.of_type("final") if f.message["text"]], MANIFEST[name]["spans"][0])
    refined, offline = wer(reference(name), r.transcript().final_text()), wer(reference(name), _offline_text(whisper_runner, name))
    assert refined <= offline + 0.05, (refined, offline, r.transcript().final_text())



def _loudness(audio: np.ndarray) -> float:
    """RMS of the samples that are not (near) silence."""
    return float(np.sqrt(np.mean(np.square(audio[np.abs(audio) > 1e-3]))))


def _with_babble(db: float) -> tuple[np.ndarray, tuple[float, float]]:
    """The LibriVox reading with 8 s of three other voices (played backwards: no words) ``db`` under
    it between its second and third sentences, where the reader is silent; and that stretch (s)."""
    talker = load_channels("librivox_16k.wav")[0]
    n, cut = 8 * 16000, int(12.2 * 16000)
    others = ("cards_16k.wav", "ljspeech_babylon_16k.s16le", "espeak_16k.wav")
    babble = sum(np.resize(load_channels(name)[0][::-1], n) for name in others)
    babble *= _loudness(talker) / _loudness(babble) * 10 ** (-db / 20)
    return np.concatenate([talker[:cut], babble, talker[cut:]]), (cut / 16000, (cut + n) / 16000)


def test_babble_well_under_the_talker_is_not_written_where_the_talker_is_silent(live_server, whisper_runner):
    """Other people talking under the talker (an open floor behind a call's agent, a café) pass the
    VAD's 20 dB floor as speech, and where the talker is silent Whisper wrote them as words: babble
    15 dB down made a replayed call's agent transcript "in a little bit. I'll see you all in a little
    bit..." (docs/benchmarks.md, seventy-sixth session). A final 12 dB or more under the channel's
    recent ones that the model was unsure of is dropped (``--talker-final-db 12``,
    asr_server/decoding/background.py; off by default, since it also drops a far participant's
    words Whisper heard badly).

    The LibriVox reading with 8 s of babble 15 dB down in a pause, on a server with the rule and one
    without: the first-pass finals that start in the babble hold at least 4 words fewer with it
    (measured twice: 1 against 12 and 9, "Yeah, I'll just move me fast and hit you."), the interims
    shown of those utterances too (measured: 2 words against 12), and the reading is transcribed
    no worse. (Other guards drop some babble too: its longest stretch comes
    back empty with the rule off as well.)"""
    mixed, (lo, hi) = _with_babble(15.0)
    data = np.round(np.clip(mixed, -1, 1) * 32767).astype("<i2").tobytes()
    guarded = ServerThread(whisper_runner, vad=VadOptions(talker_final_db=12.0)).start()
    try:
        runs = {}
        for label, server in (("on", guarded), ("off", live_server)):

            async def run(url: str = server.url) -> Replay:
                r = Replay("librivox_16k.wav")
                async for item in stream_bytes(url, data, bytes_per_second=32000, encoding="pcm_s16le", sample_rate=16000, channels=1):
                    r.messages.append(item)
                return r

            runs[label] = asyncio.run(run())
    finally:
        guarded.stop()
    for r in runs.values():
        check_protocol(r)

    def babble_words(r: Replay) -> list[str]:
        return [w for f in r.of_type("final") if lo + 0.3 <= f.message["start"] < hi for w in f.message["text"].split()]

    def babble_shown(r: Replay) -> dict[int, str]:
        """Per utterance starting in the babble, the last interim shown of it (what the page held)."""
        return {m.message["utterance"]: m.message["text"] for m in r.of_type("interim") if lo + 0.3 <= m.message["start"] < hi}

    on, off = babble_words(runs["on"]), babble_words(runs["off"])
    assert len(off) >= 6, off  # without the rule the babble is written as words
    assert len(on) <= len(off) - 4, (on, off)
    # Nor are its words shown as interims before the final comes out empty.
    shown = {k: babble_shown(r) for k, r in runs.items()}
    assert sum(len(t.split()) for t in shown["on"].values()) <= sum(len(t.split()) for t in shown["off"].values()) - 4, shown
    said = {k: r.transcript().final_text() for k, r in runs.items()}
    name = "librivox_16k.wav"
    assert wer(reference(name), said["on"]) <= wer(reference(name), said["off"]), said
