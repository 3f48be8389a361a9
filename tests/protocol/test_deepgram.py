"""The Deepgram dialect's translation, without a server."""

from __future__ import annotations

import json

import pytest

from asr_server.errors import InvalidOption
from asr_server.protocol.deepgram import DeepgramDialect, DeepgramOptions, is_deepgram, parse_deepgram_options

LANGS = ("en",)


def q(**params: str) -> dict[str, list[str]]:
    return {k: [v] for k, v in params.items()}


def test_deepgram_clients_are_told_apart_from_ours():
    assert is_deepgram({}, "Token abc")
    assert is_deepgram(q(model="nova-3"), None)
    assert is_deepgram(q(encoding="linear16"), "Bearer k")
    assert not is_deepgram(q(encoding="pcm_s16le", sample_rate="16000"), "Bearer k")
    assert not is_deepgram({}, None)


def test_deepgram_parameters_become_ours_and_unknown_ones_are_ignored():
    options, dialect = parse_deepgram_options(
        q(model="nova-3", encoding="linear16", sample_rate="8000", channels="2", language="en-US", interim_results="true",
          endpointing="300", utterance_end_ms="1000", vad_events="true", smart_format="true", some_future_flag="x"), LANGS)
    assert (options.encoding, options.sample_rate, options.channels, options.language) == ("pcm_s16le", 8000, 2, "en")
    assert options.interim_results and options.endpoint_ms == 300 and not options.revisions
    assert dialect == DeepgramOptions(model="nova-3", punctuate=True, vad_events=True, utterance_end_ms=1000, channels=2)
    defaults, dialect = parse_deepgram_options(q(model="nova-2"), LANGS)
    assert defaults.encoding == "auto" and not defaults.interim_results  # Deepgram's defaults: a container, finals only
    assert not dialect.punctuate and not dialect.vad_events and dialect.utterance_end_ms is None
    assert parse_deepgram_options(q(endpointing="false"), LANGS)[0].endpoint_ms == 5000
    assert parse_deepgram_options(q(endpointing="10"), LANGS)[0].endpoint_ms == 100  # our VAD's finest
    assert parse_deepgram_options(q(encoding="mulaw", sample_rate="8000"), LANGS)[0].encoding == "mulaw"
    terms = {"keyterm": ["Dashwood", "Norland Park", "Dashwood"], "keywords": ["Elinor:2"]}
    assert parse_deepgram_options(terms, LANGS)[0].prompt == "Dashwood, Norland Park, Elinor"  # key terms become the prompt
    with pytest.raises(InvalidOption):
        parse_deepgram_options(q(encoding="speex"), LANGS)


WORDS = [{"word": " Hello,", "start": 0.5, "end": 0.9, "probability": 0.91}, {"word": " World!", "start": 1.0, "end": 1.4, "probability": 0.5}]


def dialect(**options: object) -> DeepgramDialect:
    d = DeepgramDialect(DeepgramOptions(**options), "tiny.en")
    d.outgoing({"type": "session", "session_id": "s1", "seq": 1})
    return d


def test_interims_finals_and_utterance_ends_come_out_as_deepgram_results():
    d = dialect(punctuate=True, utterance_end_ms=1000, vad_events=True)
    (started,) = d.outgoing({"type": "speech_start", "channel": 0, "utterance": 0, "at": 0.42})
    assert started == {"type": "SpeechStarted", "channel": [0, 1], "timestamp": 0.42}
    (interim,) = d.outgoing({"type": "interim", "channel": 0, "utterance": 0, "offset": 0, "text": "Hello", "stable": "", "start": 0.4, "end": 1.0})
    assert interim["is_final"] is False and interim["channel"]["alternatives"][0]["transcript"] == "Hello"
    final, end = d.outgoing({"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "Hello, World!", "start": 0.4, "end": 1.5,
                             "reason": "endpoint", "words": WORDS})
    assert final["is_final"] and final["speech_final"] and not final["from_finalize"]
    assert (final["start"], final["duration"], final["channel_index"]) == (0.4, 1.1, [0, 1])
    alternative = final["channel"]["alternatives"][0]
    assert alternative["transcript"] == "Hello, World!" and alternative["confidence"] == pytest.approx(0.705)
    assert alternative["words"][0] == {"word": "hello", "start": 0.5, "end": 0.9, "confidence": 0.91, "punctuated_word": "Hello,"}
    assert final["metadata"]["request_id"] == "s1"
    assert end == {"type": "UtteranceEnd", "channel": [0, 1], "last_word_end": 1.4}
    (finalized,) = d.outgoing({"type": "final", "channel": 0, "utterance": 1, "offset": 14, "text": "Again.", "start": 2.0, "end": 2.5,
                               "reason": "finalize", "words": WORDS[:1]})
    assert finalized["from_finalize"] and not finalized["speech_final"]


def test_without_punctuate_transcripts_are_plain_and_deepgram_less_messages_are_dropped():
    d = dialect()
    (final,) = d.outgoing({"type": "final", "channel": 0, "utterance": 0, "offset": 0, "text": "Hello, World!", "start": 0.0, "end": 1.5,
                           "reason": "endpoint", "words": WORDS})
    assert final["channel"]["alternatives"][0]["transcript"] == "hello world"
    assert d.outgoing({"type": "speech_start", "channel": 0, "utterance": 0, "at": 0.1}) == []  # vad_events off
    assert d.outgoing({"type": "final", "channel": 0, "utterance": 1, "offset": 0, "text": "", "start": 0, "end": 1, "reason": "endpoint", "words": []}) == []
    for kind in ("revision", "load", "resumed", "webrtc_answer"):
        assert d.outgoing({"type": kind}) == []


def test_errors_metadata_and_client_messages_translate():
    d = dialect()
    (error,) = d.outgoing({"type": "error", "code": "overloaded", "message": "busy", "retryable": True, "retry_after": 5.0})
    assert error == {"type": "Error", "variant": "overloaded", "description": "busy", "code": "overloaded", "message": "busy", "retry_after": 5.0}
    (metadata,) = d.outgoing({"type": "closed", "audio_received_s": 12.5, "audio_transcribed_s": 10.0})
    assert metadata["type"] == "Metadata" and metadata["duration"] == 12.5 and metadata["request_id"] == "s1" and metadata["channels"] == 1
    assert [json.loads(t) for t in d.incoming('{"type": "Finalize"}')] == [{"type": "finalize"}]
    assert [json.loads(t) for t in d.incoming('{"type": "CloseStream"}')] == [{"type": "close"}]
    assert [json.loads(t) for t in d.incoming('{"type": "KeepAlive"}')] == [{"type": "keepalive"}]
    assert d.incoming("not json") == ["not json"]  # our parser reports it
