"""With the real model: continuous reading gets a final per sentence as it goes, not one per
pause the endpoint sees (sentence splits, ``split_after_s``), and nothing is lost at the cuts.

The session core is driven directly, every decode run as soon as it is asked for (as
``bench/replay_bench.py`` does), so which interims run does not depend on how busy the
machine is; real-time figures are in the README (``bench/stream_bench.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from asr_client import Transcript

from asr_server.options import StreamOptions
from asr_server.session import Session

from ..fakes import SyncDriver
from ..harness import FIXTURES, MANIFEST, fast_reader
from ..wer import wer
from .test_streaming import WER_FILE_MARGIN

pytestmark = pytest.mark.e2e

NAME = "ljspeech_babylon_16k.s16le"  # LJ Speech clips read on end, 0.2-0.6 s apart
CLIPS = 2  # 13.6 s: "Your journey is at an end. Before you is Babylon, ... means." then two more sentences


def _audio() -> np.ndarray:
    """The clips as a faster reader says them: every pause cut to 0.12 s (shorter than the
    200 ms that ends an utterance in continuous speech, so only a split can end a sentence)."""
    end_s = MANIFEST[NAME]["spans"][0][CLIPS - 1][1] + 0.8
    data = (FIXTURES / NAME).read_bytes()[: int(end_s * 16000) * 2]
    audio = np.frombuffer(data, "<i2").astype(np.float32) / 32768
    return fast_reader(audio, [])[0]


# A stream that asked for no interims (Deepgram's clients, by default) is split all the same.
@pytest.mark.parametrize(("split_after_s", "interim_results"), [(3.0, True), (3.0, False), (0.0, True)])
def test_continuous_reading_is_finalized_sentence_by_sentence(whisper_runner, split_after_s, interim_results):
    audio = _audio()
    d = SyncDriver(Session("sentences", StreamOptions(split_after_s=split_after_s, interim_results=interim_results)), whisper_runner)
    d.feed(audio.reshape(1, -1))
    d.apply(d.session.end_of_stream())
    d.run_jobs()
    assert [m["seq"] for m in d.messages] == list(range(1, len(d.messages) + 1)) and d.messages[-1]["type"] == "closed"
    assert bool(d.of_type("interim")) == interim_results
    finals = [m for m in d.of_type("final") if m["text"]]
    split = [f for f in finals if f["reason"] == "sentence"]
    if not split_after_s:
        assert not split
        return
    assert split, [(f["reason"], f["text"]) for f in finals]
    # A split is no new speech: the next utterance continues from the cut, with no speech_start.
    started = {m["utterance"] for m in d.of_type("speech_start")}
    assert all(f["utterance"] + 1 not in started for f in split)
    # Nothing is lost or doubled at the cuts: the transcript at close is as close to the
    # reference as faster-whisper's offline transcription of the same audio.
    transcript = Transcript()
    for m in d.messages:
        transcript.apply(m)
    reference = " ".join(MANIFEST[NAME]["references"][0][:CLIPS])
    segments, _ = whisper_runner.model.transcribe(audio, language="en")
    offline = wer(reference, " ".join(s.text for s in segments))
    assert wer(reference, transcript.final_text()) <= offline + WER_FILE_MARGIN, transcript.final_text()
