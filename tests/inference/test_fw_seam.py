"""The faster-whisper seam: every internal we rely on is where, and what, we expect.

When faster-whisper changes any of these, this fails first and says which,
instead of the server failing in a decode. Update asr_server/inference/fw.py
and the pin in pyproject.toml together.
"""

import inspect

import numpy as np

from asr_server.inference import fw


def test_the_installed_faster_whisper_is_the_pinned_minor_release():
    assert fw.version().startswith(fw.SUPPORTED_MINOR + "."), (
        f"faster-whisper {fw.version()} is installed; asr_server/inference/fw.py was checked against {fw.SUPPORTED_MINOR}.x"
    )


def test_the_internals_have_the_signatures_we_call():
    from faster_whisper.transcribe import WhisperModel, get_suppressed_tokens, merge_punctuations

    assert list(inspect.signature(get_suppressed_tokens).parameters) == ["tokenizer", "suppress_tokens"]
    assert list(inspect.signature(merge_punctuations).parameters) == ["alignment", "prepended", "appended"]
    params = list(inspect.signature(WhisperModel.find_alignment).parameters)
    assert params[:5] == ["self", "tokenizer", "text_tokens", "encoder_output", "num_frames"]


def test_tokens_alignment_and_punctuation_work_on_a_batch(whisper_runner):
    """What the engine does with them: a batch of two items aligned in one call, punctuation merged."""
    model = whisper_runner.model
    tokens = fw.tokens_for(model, "en")
    assert tokens.suppress and all(isinstance(t, int) for t in tokens.suppress)
    for name in ("sot_sequence", "sot_prev", "no_timestamps", "timestamp_begin", "eot"):
        assert hasattr(tokens.tokenizer, name)
    text = [tokens.tokenizer.encode(" Hello, world."), tokens.tokenizer.encode(" Good morning.")]
    audio = np.zeros(16000 * 2, np.float32)
    features = np.stack([model.feature_extractor(audio)[:, :3000]] * 2)
    features = np.pad(features, ((0, 0), (0, 0), (0, 3000 - features.shape[-1])))
    from asr_server.inference.whisper import _storage

    encoded = model.model.encode(_storage(features))
    aligned = fw.align(model, tokens.tokenizer, text, encoded, [200, 200])
    assert len(aligned) == 2 and all({"word", "tokens", "start", "end", "probability"} <= set(a[0]) for a in aligned)
    fw.merge_punctuation(aligned[0], "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
    assert [a["word"].strip() for a in aligned[0] if a["word"].strip()] == ["Hello,", "world."]
