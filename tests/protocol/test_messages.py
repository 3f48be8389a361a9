import pytest

from asr_server.errors import WIRE_TABLE, AsrError, InvalidMessage, InvalidOption, UnknownMessageType, UnsupportedLanguage
from asr_server.options import IceServer, Limits, RtcOptions, parse_stream_options
from asr_server.protocol.messages import (
    MAX_SDP_CHARS,
    CloseStream,
    Finalize,
    KeepAlive,
    MessageWriter,
    WebRtcOffer,
    parse_client_message,
)


def q(**kw):
    return {k: [str(v)] for k, v in kw.items()}


def test_defaults():
    o = parse_stream_options({}, ["en"])
    assert (o.encoding, o.sample_rate, o.channels, o.interim_ms, o.endpoint_ms, o.max_utterance_s) == ("pcm_s16le", 16000, 1, 500, 500, 20.0)
    assert parse_stream_options(q(encoding="mulaw"), ["en"]).sample_rate == 8000
    assert parse_stream_options(q(encoding="ogg"), ["en"]).sample_rate is None
    assert parse_stream_options({}, ["en"]).priority == "interactive"
    assert parse_stream_options(q(priority="batch"), ["en"]).priority == "batch"
    assert parse_stream_options({}, ["en"]).split_after_s == 3.0
    assert [parse_stream_options(q(split_after_s=v), ["en"]).split_after_s for v in ("0", "1", "12.5")] == [0.0, 1.0, 12.5]
    assert parse_stream_options({}, ["en"]).heartbeat_s == 0.0
    assert [parse_stream_options(q(heartbeat_s=v), ["en"]).heartbeat_s for v in ("0", "1", "5", "60")] == [0.0, 1.0, 5.0, 60.0]


@pytest.mark.parametrize(
    "query",
    [
        q(encoding="aiff"), q(sample_rate=1234), q(sample_rate=96000), q(sample_rate="fast"), q(channels=0),
        q(channels=9), q(interim_ms=10), q(endpoint_ms="x"), q(max_utterance_s=31), q(max_utterance_s="nan"),
        q(interim_results="maybe"), q(word_timestamps=2), q(bogus=1), {"channels": ["1", "2"]}, q(priority="urgent"),
        q(split_after_s=0.5), q(split_after_s=31), q(split_after_s=-1),
        q(heartbeat_s=0.5), q(heartbeat_s=61), q(heartbeat_s=-1), q(heartbeat_s="often"),
    ],
)
def test_bad_options_are_refused(query):
    with pytest.raises(InvalidOption):
        parse_stream_options(query, ["en"])


def test_a_vocabulary_prompt_is_one_bounded_line():
    assert parse_stream_options(q(prompt="Dashwood,\n  Norland\x00 Park"), ["en"]).prompt == "Dashwood, Norland Park"
    assert parse_stream_options({}, ["en"]).prompt == ""
    with pytest.raises(InvalidOption, match="at most 200"):
        parse_stream_options(q(prompt="x" * 201), ["en"])


def test_unsupported_language():
    with pytest.raises(UnsupportedLanguage):
        parse_stream_options(q(language="de"), ["en"])


@pytest.mark.parametrize("text, error", [("not json", InvalidMessage), ("[1,2]", InvalidMessage), ('{"type": 3}', InvalidMessage),
                                         ('{"type": "dance"}', UnknownMessageType), ("[" * 100000, InvalidMessage)])
def test_bad_client_messages(text, error):
    with pytest.raises(error):
        parse_client_message(text)


def test_client_commands():
    assert parse_client_message('{"type":"finalize"}') == Finalize()
    assert parse_client_message('{"type":"close"}') == CloseStream()
    assert parse_client_message('{"type":"keepalive"}') == KeepAlive()


def test_every_error_code_is_in_the_wire_table():
    def walk(cls):
        yield cls
        for sub in cls.__subclasses__():
            yield from walk(sub)

    for cls in walk(AsrError):
        assert cls.code in WIRE_TABLE, cls


def test_seq_counts_every_message():
    w = MessageWriter("abc")
    msgs = [w.error(InvalidMessage("x")), w.closed(1.0, 0.5), w.error(InvalidMessage("y"))]
    assert [m["seq"] for m in msgs] == [1, 2, 3] and all(m["session_id"] == "abc" for m in msgs)
    assert msgs[0]["retryable"] is False and "retry_after" not in msgs[0]


def test_a_settled_event_is_the_documented_message():
    from asr_server.events import Settled

    w = MessageWriter("abc")
    assert w.event(Settled(channel=1, utterance=6, offset=412)) == {
        "type": "settled", "session_id": "abc", "seq": 1, "channel": 1, "utterance": 6, "offset": 412,
    }


def test_docs_table_lists_every_code():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    for code, info in WIRE_TABLE.items():
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{code}`")), None)
        assert row is not None, f"{code} missing from docs/protocol.md"
        assert str(info.close_code or "-") in row


def test_both_clients_go_on_after_exactly_the_errors_the_server_goes_on_after():
    """A client that took a code the session continues after for the end of the stream would stop
    reading results the server still sends (and the reverse would wait for a close that never comes)."""
    import re
    from pathlib import Path

    from asr_client.client import CONTINUING_ERRORS

    continuing = {code for code, info in WIRE_TABLE.items() if info.close_code is None}
    assert CONTINUING_ERRORS == continuing
    js = (Path(__file__).resolve().parents[2] / "clients" / "js" / "src" / "client.js").read_text()
    listed = re.search(r"NON_FATAL_CODES = new Set\(\[([^\]]*)\]\)", js)
    assert listed is not None and set(re.findall(r'"([a-z_]+)"', listed.group(1))) == continuing


def test_webrtc_options_and_offer_messages():
    o = parse_stream_options(q(encoding="webrtc"), ["en"])
    assert o.is_webrtc and not o.is_container and o.sample_rate is None
    assert parse_stream_options(q(encoding="webrtc", channels=2), ["en"]).channels == 2
    with pytest.raises(InvalidOption):
        parse_stream_options(q(encoding="webrtc", channels=3), ["en"])
    assert parse_client_message('{"type":"webrtc_offer","sdp":"v=0\\r\\n"}') == WebRtcOffer("v=0\r\n")
    for bad in ('{"type":"webrtc_offer"}', '{"type":"webrtc_offer","sdp":""}', '{"type":"webrtc_offer","sdp":5}',
                '{"type":"webrtc_offer","sdp":"' + "a" * (MAX_SDP_CHARS + 1) + '"}'):
        with pytest.raises(InvalidMessage):
            parse_client_message(bad)
    w = MessageWriter("s")
    session = w.session(o, Limits(), "tiny.en", RtcOptions(ice_servers=(IceServer(("turn:h:3478",), "u", "p"),)).to_wire())
    assert session["webrtc"] == {"ice_servers": [{"urls": ["turn:h:3478"], "username": "u", "credential": "p"}]}
    assert "webrtc" not in w.session(parse_stream_options({}, ["en"]), Limits(), "tiny.en")
    assert w.webrtc_answer("v=0") == {"type": "webrtc_answer", "session_id": "s", "seq": 3, "sdp": "v=0"}
