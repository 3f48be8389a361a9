import numpy as np
import pytest

from asr_server.inference import whisper as W
from asr_server.inference.whisper import DecodeKind, DecodeRequest, ModelNotFound, resolve_model


def test_short_encoder_window_only_inside_our_interim_decodes():
    import faster_whisper.transcribe as fw

    W._install_short_padding()
    W._install_short_padding()  # idempotent
    features = np.zeros((80, 500), np.float32)
    assert fw.pad_or_trim(features).shape[-1] == 3000  # anyone else: Whisper's 30 s window
    W._pad_margin.frames = 1000
    try:
        assert fw.pad_or_trim(features).shape[-1] == 1500
        assert fw.pad_or_trim(np.zeros((80, 2500), np.float32)).shape[-1] == 3000  # never past 30 s
    finally:
        W._pad_margin.frames = None


def test_real_model_interim_and_final(whisper_runner):
    from ..harness import MANIFEST, load_mono

    start, end = MANIFEST["espeak_16k.wav"]["spans"][0][1]
    audio = load_mono("espeak_16k.wav")[int((start - 0.3) * 16000) : int((end + 0.2) * 16000)]
    interim = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.INTERIM))
    final = whisper_runner.transcribe(DecodeRequest(audio, DecodeKind.FINAL, word_timestamps=True))
    for hyp in (interim, final):
        assert "call me back" in hyp.text.lower()
    assert final.words and all(0 <= w.start <= w.end <= len(audio) / 16000 + 0.01 for w in final.words)
    assert W._pad_margin.frames is None


def test_model_resolution(tmp_path):
    assert resolve_model("tiny.en").endswith("model")
    with pytest.raises(ModelNotFound, match="model.bin"):
        resolve_model(str(tmp_path))
    with pytest.raises(ModelNotFound, match="neither"):
        resolve_model("huge-v9")
