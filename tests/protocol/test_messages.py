import pytest

from asr_server.errors import WIRE_TABLE, AsrError, InvalidMessage, InvalidOption, UnknownMessageType, UnsupportedLanguage
from asr_server.options import parse_stream_options
from asr_server.protocol.messages import CloseStream, Finalize, KeepAlive, MessageWriter, parse_client_message


def q(**kw):
    return {k: [str(v)] for k, v in kw.items()}


def test_defaults():
    o = parse_stream_options({}, ["en"])
    assert (o.encoding, o.sample_rate, o.channels, o.interim_ms, o.endpoint_ms, o.max_utterance_s) == ("pcm_s16le", 16000, 1, 500, 500, 20.0)
    assert parse_stream_options(q(encoding="mulaw"), ["en"]).sample_rate == 8000
    assert parse_stream_options(q(encoding="ogg"), ["en"]).sample_rate is None
    assert parse_stream_options({}, ["en"]).priority == "interactive"
    assert parse_stream_options(q(priority="batch"), ["en"]).priority == "batch"


@pytest.mark.parametrize(
    "query",
    [
        q(encoding="aiff"), q(sample_rate=1234), q(sample_rate=96000), q(sample_rate="fast"), q(channels=0),
        q(channels=9), q(interim_ms=10), q(endpoint_ms="x"), q(max_utterance_s=31), q(max_utterance_s="nan"),
        q(interim_results="maybe"), q(word_timestamps=2), q(bogus=1), {"channels": ["1", "2"]}, q(priority="urgent"),
    ],
)
def test_bad_options_are_refused(query):
    with pytest.raises(InvalidOption):
        parse_stream_options(query, ["en"])


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


def test_docs_table_lists_every_code():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    for code, info in WIRE_TABLE.items():
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{code}`")), None)
        assert row is not None, f"{code} missing from docs/protocol.md"
        assert str(info.close_code or "-") in row
