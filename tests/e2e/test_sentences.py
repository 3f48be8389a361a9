"""End to end: continuous reading gets a final per sentence as it goes, not one per pause the
endpoint sees (sentence splits, ``split_after_s``), and nothing is lost at the cuts."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from asr_client import stream_bytes

from ..harness import FIXTURES, MANIFEST, Replay
from ..wer import wer
from .test_streaming import WER_FILE_MARGIN, check_protocol

pytestmark = pytest.mark.e2e

NAME = "ljspeech_babylon_16k.s16le"  # LJ Speech clips read on end, 0.2-0.6 s apart
CLIPS = 2  # 13.6 s: "Your journey is at an end. Before you is Babylon, ... means." then two more sentences


def _audio() -> bytes:
    end_s = MANIFEST[NAME]["spans"][0][CLIPS - 1][1] + 0.8
    return (FIXTURES / NAME).read_bytes()[: int(end_s * 16000) * 2]


async def _stream(url: str, data: bytes, **options) -> Replay:
    r = Replay(NAME)
    async for item in stream_bytes(url, data, bytes_per_second=32000, realtime=True, encoding="pcm_s16le", sample_rate=16000, **options):
        r.messages.append(item)
    return r


def test_continuous_reading_is_finalized_sentence_by_sentence(live_server, whisper_runner):
    data = _audio()
    r = asyncio.run(_stream(live_server.url, data))
    check_protocol(r)
    finals = [f.message for f in r.of_type("final") if f.message["text"]]
    split = [f for f in finals if f["reason"] == "sentence"]
    assert split, [(f["reason"], f["text"]) for f in finals]
    # A split is no new speech: the next utterance continues from the cut, with no speech_start.
    started = {m.message["utterance"] for m in r.of_type("speech_start")}
    assert all(f["utterance"] + 1 not in started for f in split)
    # Nothing is lost or doubled at the cuts: the transcript at close is as close to the
    # reference as faster-whisper's offline transcription of the same audio.
    reference = " ".join(MANIFEST[NAME]["references"][0][:CLIPS])
    audio = np.frombuffer(data, "<i2").astype(np.float32) / 32768
    segments, _ = whisper_runner.model.transcribe(audio, language="en")
    offline = wer(reference, " ".join(s.text for s in segments))
    assert wer(reference, r.transcript().final_text()) <= offline + WER_FILE_MARGIN, r.transcript().final_text()
