"""Twilio Media Streams' translation and the tracks' alignment, without a server."""

from __future__ import annotations

import base64
import json

from asr_server.errors import AudioFormatMismatch, InvalidMessage, InvalidOption
from asr_server.protocol.openai_realtime import Reconfigure
from asr_server.protocol.twilio import SILENCE, TrackAligner, TwilioDialect, twilio_options


def media(track: str, timestamp: int, payload: bytes) -> str:
    return json.dumps({"event": "media", "media": {"track": track, "chunk": "1", "timestamp": str(timestamp),
                                                   "payload": base64.b64encode(payload).decode()}})


def start(tracks: list[str], custom: dict[str, str] | None = None, fmt: dict | None = None) -> str:
    return json.dumps({"event": "start", "start": {"streamSid": "MZ1", "callSid": "CA1", "accountSid": "AC1", "tracks": tracks,
                                                   "customParameters": custom or {},
                                                   "mediaFormat": fmt or {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}})


def test_two_tracks_are_interleaved_on_one_clock_with_gaps_filled_and_repeats_dropped():
    a = TrackAligner(2)
    assert a.add(0, 0, b"\x01" * 160) == b""  # the other track has nothing yet
    out = a.add(1, 0, b"\x02" * 160)
    assert out == b"\x01\x02" * 160
    assert a.add(1, 40, b"\x03" * 160) == b""  # outbound skipped 20 ms: silence there, then its audio
    out = a.add(0, 20, b"\x04" * 320)
    assert out == bytes([4, SILENCE]) * 160 + b"\x04\x03" * 160
    assert a.add(0, 50, b"\x05" * 80) == b""  # all of it repeats what the track had: dropped
    assert a.flush() == b""  # both tracks stand at 60 ms: nothing left


def test_a_silent_track_is_filled_so_the_other_flows():
    a = TrackAligner(2, max_skew_ms=100)
    out = b""
    for i in range(10):  # 200 ms of inbound, nothing outbound
        out += a.add(0, i * 20, b"\x01" * 160)
    assert len(out) == 2 * 800  # all but the last 100 ms went out, the outbound leg as silence
    assert out[1::2] == bytes([SILENCE]) * 800
    assert a.flush()[1::2] == bytes([SILENCE]) * 800


def test_a_clock_that_jumps_moves_its_track_and_asks_for_no_silence_to_fill_the_jump():
    """A timestamp 10**12 ms on asked the aligner for 8 * 10**12 bytes of silence (the server's
    memory); one reset to 0 dropped the rest of the call as repeats. Either way the audio now goes
    on where the track stands, and the clock the track moved to holds for the events after."""
    a = TrackAligner(1)
    assert a.add(0, 0, b"\x01" * 160) == b"\x01" * 160
    assert a.add(0, 10**12, b"\x02" * 160) == b"\x02" * 160
    assert a.add(0, 10**12 + 20, b"\x03" * 160) == b"\x03" * 160
    assert a.add(0, 10**12 + 100, b"\x04" * 160) == bytes([SILENCE]) * 480 + b"\x04" * 160  # a 60 ms gap on the moved clock
    assert a.add(0, 0, b"\x05" * 160) == b"\x05" * 160  # the clock went back to 0: not a repeat of 31 years ago
    assert a.add(0, 20, b"\x06" * 160) == b"\x06" * 160
    assert a.add(0, 10_000, b"\x07" * 160) == bytes([SILENCE]) * (80_000 - 320) + b"\x07" * 160  # 10 s is still a gap
    two = TrackAligner(2)
    assert two.add(0, 0, b"\x01" * 160) == b"" and two.add(1, 0, b"\x02" * 160) == b"\x01\x02" * 160
    assert two.add(0, 10**12, b"\x03" * 160) == b""  # one track's jump does not pull the other along
    assert two.add(1, 20, b"\x04" * 160) == b"\x03\x04" * 160


def test_a_call_start_sets_the_channels_and_options_and_nothing_goes_back_to_twilio():
    d = TwilioDialect(twilio_options(), ("en",))
    assert d.incoming(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})) == []
    (reconfigure,) = d.incoming(start(["inbound", "outbound"], {"interim_results": "false", "endpoint_ms": "700", "callback": "x"}))
    assert isinstance(reconfigure, Reconfigure) and reconfigure.announce
    options = reconfigure.options
    assert (options.encoding, options.sample_rate, options.channels, options.interim_results, options.endpoint_ms) == ("mulaw", 8000, 2, False, 700)
    assert reconfigure.info["call"]["channel_names"] == ["caller", "agent"] and reconfigure.info["call"]["call_sid"] == "CA1"
    assert d.incoming(media("inbound", 0, b"\x11" * 160)) == []
    assert d.incoming(media("outbound", 0, b"\x22" * 160)) == [b"\x11\x22" * 160]
    assert d.incoming(json.dumps({"event": "mark", "mark": {"name": "x"}})) == []
    assert d.incoming(json.dumps({"event": "dtmf", "dtmf": {"digit": "1"}})) == []
    assert d.incoming(json.dumps({"event": "stop", "stop": {}}))[-1] == '{"type": "close"}'
    assert d.outgoing({"type": "final", "text": "anything"}) == [] and d.outgoing({"type": "session"}) == []


def test_one_track_calls_bad_parameters_and_other_formats():
    d = TwilioDialect(twilio_options(), ("en",))
    (reconfigure,) = d.incoming(start(["inbound"]))
    assert reconfigure.options.channels == 1
    assert d.incoming(media("inbound", 0, b"\x11" * 160)) == [b"\x11" * 160]
    assert d.incoming(media("outbound", 0, b"\x22" * 160)) == []  # a track the call did not ask for
    (error,) = TwilioDialect(twilio_options(), ("en",)).incoming(start(["inbound"], {"language": "xx"}))
    assert error.code == "unsupported_language"
    (error,) = TwilioDialect(twilio_options(), ("en",)).incoming(start(["inbound"], {"endpoint_ms": "fast"}))
    assert isinstance(error, InvalidOption)
    (error,) = TwilioDialect(twilio_options(), ("en",)).incoming(start(["inbound"], fmt={"encoding": "audio/l16", "sampleRate": 16000}))
    assert isinstance(error, AudioFormatMismatch)


def test_events_of_the_wrong_shape_are_invalid_messages_not_a_crash():
    """A client posing as Twilio sends what JSON allows where objects, lists and numbers belong:
    each is an invalid_message (the call goes on), never an exception in the session."""
    bad_starts = [{"event": "start", "start": "MZ1"}, {"event": "start", "start": 7},
                  {"event": "start", "start": {"tracks": "inbound"}}, {"event": "start", "start": {"tracks": [{"a": 1}], "mediaFormat": [1]}},
                  {"event": "start", "start": {"customParameters": ["x"]}}, {"event": "media", "media": 12}, {"event": "media", "media": [1]}]
    for event in bad_starts:
        (error,) = TwilioDialect(twilio_options(), ("en",)).incoming(json.dumps(event))
        assert isinstance(error, InvalidMessage) and error.code == "invalid_message", event
    for fmt in ({"encoding": "audio/x-mulaw", "sampleRate": "fast"}, {"encoding": "audio/x-mulaw", "sampleRate": [8000]},
                {"encoding": "audio/x-mulaw", "sampleRate": float("inf")}):  # JSON's Infinity (or 1e999): int() overflowed
        (error,) = TwilioDialect(twilio_options(), ("en",)).incoming(start(["inbound"], fmt=fmt))
        assert isinstance(error, AudioFormatMismatch)
    d = TwilioDialect(twilio_options(), ("en",))
    d.incoming(start(["inbound"]))
    for media_body in ({"track": {"a": 1}, "payload": "AAAA"}, {"track": "inbound", "payload": {"b": 2}}, {"track": "inbound", "payload": "AAAA", "timestamp": [1]},
                       {"track": "inbound", "payload": "AAAA", "timestamp": float("inf")}, {"track": "inbound", "payload": "AAAA", "timestamp": float("nan")}):
        assert all(isinstance(out, InvalidMessage) for out in d.incoming(json.dumps({"event": "media", "media": media_body})))
    assert d.incoming(media("inbound", 0, b"\x11" * 160)) == [b"\x11" * 160]  # the call goes on


def test_a_binary_frame_is_an_invalid_message_not_audio():
    """Twilio sends audio only base64 in media events: a binary frame on the stream is a client
    that is not Twilio, and its bytes must not reach the call's transcript as mu-law."""
    d = TwilioDialect(twilio_options(), ("en",))
    d.incoming(start(["inbound"]))
    (error,) = d.incoming_binary(b"\x11" * 160)
    assert isinstance(error, InvalidMessage) and "media events" in error.message
    assert d.incoming(media("inbound", 0, b"\x11" * 160)) == [b"\x11" * 160]
