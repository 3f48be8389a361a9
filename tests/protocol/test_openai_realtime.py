"""The OpenAI Realtime transcription dialect's translation, without a server."""

from __future__ import annotations

import base64
import json

from asr_server.protocol.openai_realtime import OpenAiDialect, Reconfigure, default_realtime_options


def dialect() -> OpenAiDialect:
    d = OpenAiDialect(default_realtime_options(), "tiny.en", ("en",))
    (created,) = d.outgoing({"type": "session", "session_id": "s1", "seq": 1})
    assert created["type"] == "session.created" and created["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    return d


def event(kind: str, **body: object) -> str:
    return json.dumps({"type": kind, "event_id": "c1", **body})


def test_session_updates_in_both_shapes_reconfigure_the_stream():
    d = dialect()
    reconfigure, updated = d.incoming(event("session.update", session={"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcmu"}, "transcription": {"model": "x", "language": "en-GB"}, "turn_detection": None}}}))
    assert isinstance(reconfigure, Reconfigure)
    assert (reconfigure.options.encoding, reconfigure.options.sample_rate, reconfigure.options.endpoint_ms) == ("mulaw", 8000, 5000)
    assert updated["type"] == "session.updated" and updated["session"]["audio"]["input"]["turn_detection"] is None
    legacy = dialect()
    reconfigure, updated = legacy.incoming(event("transcription_session.update", session={
        "input_audio_format": "g711_alaw", "turn_detection": {"type": "server_vad", "silence_duration_ms": 700},
        "input_audio_transcription": {"language": "en", "prompt": "cards"}}))
    assert (reconfigure.options.encoding, reconfigure.options.endpoint_ms, reconfigure.options.prompt) == ("alaw", 700, "cards")
    assert updated["type"] == "transcription_session.updated" and updated["session"]["input_audio_format"] == "g711_alaw"
    (error,) = dialect().incoming(event("session.update", session={"type": "transcription", "audio": {"input": {"format": {"type": "audio/opus"}}}}))
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error" and error["error"]["event_id"] == "c1"


def test_session_updates_of_the_wrong_shape_are_error_events_not_a_crash():
    """What JSON allows where objects and strings belong: an invalid_request_error event each, and
    the session keeps its options."""
    shapes = [
        event("session.update", session="transcription"), event("session.update", session={"audio": "pcm"}),
        event("session.update", session={"audio": {"input": [1]}}), event("session.update", session={"audio": {"input": {"format": "audio/pcm"}}}),
        event("session.update", session={"audio": {"input": {"format": {"type": {"a": 1}}}}}),
        event("session.update", session={"audio": {"input": {"format": {"type": ["audio/pcm"]}}}}),
        event("session.update", session={"audio": {"input": {"transcription": "en"}}}),
        event("transcription_session.update", session={"input_audio_format": {"x": 1}}),
        event("transcription_session.update", session={"input_audio_transcription": "whisper-1"}),
    ]
    d = dialect()
    for shape in shapes:
        (error,) = d.incoming(shape)
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error" and error["error"]["code"] == "invalid_message", shape
    assert (d.options.encoding, d.options.sample_rate) == ("pcm_s16le", 24000)


def test_audio_commits_clears_and_unknown_events():
    d = dialect()
    assert d.incoming(event("input_audio_buffer.append", audio=base64.b64encode(b"\x01\x02").decode())) == [b"\x01\x02"]
    (bad,) = d.incoming(event("input_audio_buffer.append", audio="%%%"))
    assert bad["type"] == "error"
    (empty,) = d.incoming(event("input_audio_buffer.commit"))
    assert empty["error"]["code"] == "input_audio_buffer_commit_empty"
    d.outgoing({"type": "speech_start", "channel": 0, "utterance": 0, "at": 1.0})
    assert d.incoming(event("input_audio_buffer.commit")) == ['{"type": "finalize"}']
    d.outgoing({"type": "speech_start", "channel": 0, "utterance": 1, "at": 3.0})
    finalize, cleared = d.incoming(event("input_audio_buffer.clear"))
    assert finalize == '{"type": "finalize"}' and cleared["type"] == "input_audio_buffer.cleared"
    assert d.outgoing({"type": "final", "channel": 0, "utterance": 1, "text": "gone", "start": 3.0, "end": 4.0, "reason": "finalize"}) == []
    (unknown,) = d.incoming(event("response.create"))
    assert unknown["type"] == "error"
    # OpenAI's audio comes base64 in append events: a binary frame is an error event, not audio.
    (binary,) = d.incoming_binary(b"\x01\x02")
    assert binary["type"] == "error" and binary["error"]["code"] == "invalid_message" and "input_audio_buffer.append" in binary["error"]["message"]


def test_results_become_speech_events_append_only_deltas_and_completed_items():
    d = dialect()
    (started,) = d.outgoing({"type": "speech_start", "channel": 0, "utterance": 0, "at": 0.25})
    assert started == {**started, "type": "input_audio_buffer.speech_started", "audio_start_ms": 250, "item_id": "item_s1_0"}
    assert d.outgoing({"type": "interim", "channel": 0, "utterance": 0, "text": "Ten of", "stable": 0, "start": 0.2, "end": 1.0}) == []
    (delta,) = d.outgoing({"type": "interim", "channel": 0, "utterance": 0, "text": "Ten of clubs", "stable": 7, "start": 0.2, "end": 1.5})
    assert delta["delta"] == "Ten of "
    assert d.outgoing({"type": "interim", "channel": 0, "utterance": 0, "text": "Ten of clubs", "stable": 7, "start": 0.2, "end": 1.6}) == []
    stopped, committed, last, completed = d.outgoing({"type": "final", "channel": 0, "utterance": 0, "text": "Ten of clubs.", "start": 0.2,
                                                      "end": 1.8, "reason": "endpoint"})
    assert stopped["type"] == "input_audio_buffer.speech_stopped" and stopped["audio_end_ms"] == 1800
    assert committed["type"] == "input_audio_buffer.committed" and committed["previous_item_id"] is None
    assert last["delta"] == "clubs."
    assert completed["type"] == "conversation.item.input_audio_transcription.completed" and completed["transcript"] == "Ten of clubs."
    assert completed["usage"] == {"type": "duration", "seconds": 1.6}
    # A final that does not go on from what the deltas said: no delta, the completed text stands.
    d.outgoing({"type": "interim", "channel": 0, "utterance": 1, "text": "Four of", "stable": 5, "start": 2.0, "end": 3.0})
    out = d.outgoing({"type": "final", "channel": 0, "utterance": 1, "text": "4 of hearts.", "start": 2.0, "end": 3.5, "reason": "endpoint"})
    assert [e["type"] for e in out][-1] == "conversation.item.input_audio_transcription.completed"
    assert not any(e["type"].endswith(".delta") for e in out) and out[1]["previous_item_id"] == "item_s1_0"
    (error,) = d.outgoing({"type": "error", "code": "overloaded", "message": "busy", "retryable": True, "retry_after": 5.0})
    assert error["error"] == {"type": "server_error", "code": "overloaded", "message": "busy", "param": None, "event_id": None, "retry_after": 5.0}
    assert d.outgoing({"type": "revision"}) == [] and d.outgoing({"type": "closed", "audio_received_s": 1.0}) == []


def test_an_utterance_that_continues_a_cut_gets_an_item_of_its_own_that_a_commit_finalizes():
    """Our session sends no speech_start when an utterance goes on from a sentence or max_length cut:
    its item is started at the cut, so that every item a client sees opens with speech_started, and
    a commit while it is being said finalizes it (it answered input_audio_buffer_commit_empty, and
    the last sentence of a turn came only at its endpoint)."""
    d = dialect()
    d.outgoing({"type": "speech_start", "channel": 0, "utterance": 0, "at": 0.25})
    out = d.outgoing({"type": "final", "channel": 0, "utterance": 0, "text": "Eight of spades.", "start": 0.3, "end": 2.0, "reason": "sentence"})
    assert [e["type"] for e in out][-2:] == ["conversation.item.input_audio_transcription.completed", "input_audio_buffer.speech_started"]
    assert out[-1]["item_id"] == "item_s1_1" and out[-1]["audio_start_ms"] == 2000
    assert d.incoming(event("input_audio_buffer.commit")) == ['{"type": "finalize"}']
    out = d.outgoing({"type": "final", "channel": 0, "utterance": 1, "text": "Seven of hearts.", "start": 2.0, "end": 3.0, "reason": "finalize"})
    assert [e["type"] for e in out][-1] == "conversation.item.input_audio_transcription.completed" and out[-1]["item_id"] == "item_s1_1"
    assert not any(e["type"] == "input_audio_buffer.speech_started" for e in out)
    (empty,) = d.incoming(event("input_audio_buffer.commit"))
    assert empty["error"]["code"] == "input_audio_buffer_commit_empty"
