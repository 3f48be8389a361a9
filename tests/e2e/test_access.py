"""Access control on a real server with the real model: keys, tokens, origins and quotas at the handshake."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from asr_client import ServerError, connect, fetch_transcript

from asr_server.access import AccessOptions, ApiKey

from ..harness import ServerThread, replay
from .test_bad_input import until

pytestmark = pytest.mark.e2e

ALICE, BOB = "alice-key-0123", "bob-key-4567"


@pytest.fixture(scope="module")
def keyed_server(whisper_runner):
    keys = (ApiKey("alice", ALICE), ApiKey("bob", BOB, max_channels=1))
    server = ServerThread(whisper_runner, access=AccessOptions(keys=keys, allowed_origins=("https://app.example.com",))).start()
    yield server
    server.stop()


def http(
    server: ServerThread, path: str, *, method: str = "GET", headers: dict[str, str] | None = None, data: bytes | None = None,
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(server.http + path, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read()


def refused_with(server: ServerThread, **options) -> ServerError:
    async def attempt():
        async with connect(server.url, **options):
            raise AssertionError("the handshake was accepted")

    with pytest.raises(ServerError) as caught:
        asyncio.run(attempt())
    return caught.value


def test_a_handshake_without_a_valid_key_gets_401_with_a_stable_code_before_any_websocket(keyed_server):
    status, headers, body = http(keyed_server, "/v1/listen")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert json.loads(body)["code"] == "unauthorized"
    assert refused_with(keyed_server).code == "unauthorized"
    assert refused_with(keyed_server, api_key="not-a-key").code == "unauthorized"
    assert refused_with(keyed_server, token="made-up").code == "unauthorized"
    assert keyed_server.server.active_channels == 0


def test_health_is_open_metrics_and_tokens_need_a_key(keyed_server):
    import asr_server

    status, _, body = http(keyed_server, "/healthz")
    assert status == 200 and json.loads(body)["version"] == asr_server.__version__
    assert json.loads(body)["api_keys"] is True  # what the page reads to say why its handshake was refused
    assert http(keyed_server, "/")[0] == 200  # the page itself; its streams need a token
    assert http(keyed_server, "/metrics")[0] == 401
    assert http(keyed_server, "/metrics", headers={"Authorization": f"Bearer {ALICE}"})[0] == 200
    assert http(keyed_server, "/v1/tokens", method="POST")[0] == 401
    assert http(keyed_server, "/v1/tokens", headers={"Authorization": f"Bearer {ALICE}"})[0] == 405  # GET


def test_head_asks_the_health_check_and_the_page_as_uptime_monitors_do(keyed_server):
    """HEAD gets GET's status and headers without the body, for the health check and the page's
    files; the other routes say what they take."""
    for path in ("/healthz", "/", "/client/client.js"):
        status, headers, body = http(keyed_server, path, method="HEAD")
        got, got_headers, got_body = http(keyed_server, path)
        assert status == got == 200 and body == b"" and got_body
        assert headers["Content-Type"] == got_headers["Content-Type"] and int(headers["Content-Length"]) > 0
    status, headers, _ = http(keyed_server, "/healthz", method="POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, headers, _ = http(keyed_server, "/metrics", method="HEAD", headers={"Authorization": f"Bearer {ALICE}"})
    assert status == 405 and headers["Allow"] == "GET"


def test_pages_from_other_origins_are_refused_even_with_a_good_key(keyed_server):
    good = {"Authorization": f"Token {ALICE}"}
    status, _, body = http(keyed_server, "/v1/listen", headers={**good, "Origin": "https://evil.example"})
    assert status == 403 and json.loads(body)["code"] == "origin_not_allowed"
    # A name that resolves to this machine is not the server's own page (DNS rebinding).
    port = keyed_server.server.port
    assert http(keyed_server, "/v1/listen", headers={**good, "Origin": f"http://rebind.example:{port}", "Host": f"rebind.example:{port}"})[0] == 403
    # Its own page and the allowed origin go on to the handshake (426: this was no WebSocket request).
    assert http(keyed_server, "/v1/listen", headers={**good, "Origin": f"http://127.0.0.1:{port}"})[0] == 426
    assert http(keyed_server, "/v1/listen", headers={**good, "Origin": "https://app.example.com"})[0] == 426


def test_the_browser_client_is_importable_by_allowed_origins_pages_only(keyed_server):
    """The client's modules (``/client/``) carry CORS headers for an allowed origin's page, which
    imports them across origins; no key is needed for them, and nobody is refused them (a page of
    another origin gets the file without the header, and its browser refuses the import)."""
    for path in ("/client/client.js", "/client/pcm-worklet.js"):
        status, headers, body = http(keyed_server, path, headers={"Origin": "https://app.example.com"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "https://app.example.com" and body
        assert headers["Content-Type"].startswith("text/javascript") and headers["Vary"] == "Origin"
        status, headers, body = http(keyed_server, path, headers={"Origin": "https://evil.example"})
        assert status == 200 and "Access-Control-Allow-Origin" not in headers and headers["Vary"] == "Origin" and body
        assert "Access-Control-Allow-Origin" not in http(keyed_server, path)[1]
    # The page's own files are for its own origin only.
    assert "Access-Control-Allow-Origin" not in http(keyed_server, "/app.js", headers={"Origin": "https://app.example.com"})[1]


def test_a_page_file_the_browser_holds_is_not_sent_again(keyed_server):
    """Each page file carries an ETag; asked again with it (If-None-Match, as a browser revalidates
    its ``no-cache`` copy), the answer is 304 without the body; another tag gets the file."""
    for path in ("/", "/app.js", "/client/client.js"):
        status, headers, body = http(keyed_server, path)
        tag = headers["ETag"]
        assert status == 200 and headers["Cache-Control"] == "no-cache" and tag.startswith('"') and body
        status, again, body = http(keyed_server, path, headers={"If-None-Match": tag})
        assert status == 304 and body == b"" and again["ETag"] == tag and "Content-Length" not in again
        assert http(keyed_server, path, headers={"If-None-Match": '"another"'})[0] == 200
    assert http(keyed_server, "/")[1]["ETag"] != http(keyed_server, "/app.js")[1]["ETag"]


def test_a_minted_token_streams_once_under_its_keys_name(keyed_server):
    status, _, body = http(keyed_server, "/v1/tokens?ttl_s=30", method="POST", headers={"Authorization": f"Bearer {ALICE}"})
    minted = json.loads(body)
    assert status == 200 and minted["key"] == "alice" and minted["expires_in"] == 30
    result = asyncio.run(replay(keyed_server.url, "cards_16k.wav", token=minted["token"]))
    messages = [m.message for m in result.messages]
    assert messages[0]["type"] == "session" and messages[0]["key"] == "alice"
    assert ALICE not in json.dumps(messages)
    assert "clubs" in " ".join(m["text"] for m in messages if m["type"] == "final").lower()
    assert messages[-1]["type"] == "closed"
    # A life that is not a positive number of seconds is refused, not quietly the server's default.
    for ttl in ("soon", "-5", "0", "nan", "inf"):
        status, _, body = http(keyed_server, f"/v1/tokens?ttl_s={ttl}", method="POST", headers={"Authorization": f"Bearer {ALICE}"})
        assert status == 400 and json.loads(body)["code"] == "invalid_option", ttl
    assert refused_with(keyed_server, token=minted["token"]).code == "unauthorized"  # used up


def test_a_token_request_may_ask_its_life_in_a_json_body(keyed_server):
    """What a backend's fetch() or requests.post(json=...) sends; websockets closed any request
    with a body unanswered, and then this server refused every body."""
    import socket

    def mint(path: str, body: bytes) -> tuple[int, dict]:
        status, _, answer = http(keyed_server, path, method="POST", data=body,
                                 headers={"Authorization": f"Bearer {ALICE}", "Content-Type": "application/json"})
        return status, json.loads(answer)

    for path, body, expires in (("/v1/tokens", b'{"ttl_s": 12}', 12), ("/v1/tokens", b"{}", 60), ("/v1/tokens", b"", 60),
                                ("/v1/tokens?ttl_s=5", b'{"ttl_s": 12}', 5), ("/v1/auth/grant", b'{"ttl_seconds": 7}', 7),
                                ("/v1/auth/grant", b'{"ttl_seconds": null}', 60)):
        status, minted = mint(path, body)
        assert status == 200 and minted["expires_in"] == expires, (path, body, minted)
        assert set(minted) == ({"access_token", "expires_in"} if "grant" in path else {"token", "expires_in", "key"})
    for body, code in ((b'{"ttl_s": "soon"}', "invalid_option"), (b'{"ttl_s": true}', "invalid_option"), (b'{"ttl_s": -1}', "invalid_option"),
                       (b"[30]", "bad_request"), (b"{", "bad_request"), (b"\xff\xfe", "bad_request")):
        status, error = mint("/v1/tokens", body)
        assert status == 400 and error["code"] == code, (body, error)
    # The body may come after its head, in another packet: the answer waits for it. A client that
    # says it waits for "100 Continue" before its body (curl, for a larger one) is told to go on.
    body = b'{"ttl_s": 9}'
    for expect in (b"", b"Expect: 100-continue\r\n"):
        with socket.create_connection(("127.0.0.1", keyed_server.server.port), timeout=30) as sock:
            sock.sendall(f"POST /v1/tokens HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\nContent-Length: {len(body)}\r\n".encode()
                         + expect + b"\r\n")
            if expect:
                told = b""
                while not told.endswith(b"\r\n\r\n"):
                    told += sock.recv(1)
                assert told == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.settimeout(0.2)
            with pytest.raises(socket.timeout):
                sock.recv(1)  # nothing (more) before the body: the request is not judged on its head alone
            sock.settimeout(30)
            sock.sendall(body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head, _, text = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and json.loads(text)["expires_in"] == 9, answer


def test_a_session_s_own_resume_token_reads_its_transcript_and_nothing_else(keyed_server):
    """A page streams with a single-use token, spent at its handshake: the session's resume token
    (in its ``session`` message) still lets it read the session's transcript and subtitles."""
    _, _, body = http(keyed_server, "/v1/tokens", method="POST", headers={"Authorization": f"Bearer {ALICE}"})
    result = asyncio.run(replay(keyed_server.url, "cards_16k.wav", token=json.loads(body)["token"]))
    session = result.messages[0].message
    own, path = session["resume_token"], f"/v1/sessions/{session['session_id']}/transcript"
    status, _, body = http(keyed_server, path, headers={"Asr-Resume-Token": own})
    assert status == 200 and json.loads(body)["channels"][0]["text"] == result.transcript().final_text(0)
    srt = fetch_transcript(keyed_server.url, session["session_id"], "srt", resume_token=own)  # the Python client's way
    assert srt.startswith("1\n") and " --> " in srt
    assert http(keyed_server, path)[0] == 401  # nothing shown: as before
    for token in ("made-up", own[:-1], ""):  # another, a near miss, empty
        status, _, body = http(keyed_server, path, headers={"Asr-Resume-Token": token})
        assert status == 404 and json.loads(body)["code"] == "session_not_found"
    # The token is this session's only: not another (here one of Bob's), nor any other route.
    other = asyncio.run(replay(keyed_server.url, "cards_16k.wav", api_key=BOB)).messages[0].message["session_id"]
    assert http(keyed_server, f"/v1/sessions/{other}/transcript", headers={"Asr-Resume-Token": own})[0] == 404
    assert http(keyed_server, f"/v1/sessions/{session['session_id']}/events", headers={"Asr-Resume-Token": own})[0] == 401
    assert http(keyed_server, "/v1/sessions", headers={"Asr-Resume-Token": own})[0] == 401
    refused = http(keyed_server, path, headers={"Asr-Resume-Token": own, "Origin": "https://evil.example"})
    assert refused[0] == 403 and json.loads(refused[2])["code"] == "origin_not_allowed"
    # A page of an allowed origin may read it too (CORS): the preflight its header needs, then the answer.
    site = "https://app.example.com"
    status, headers, _ = http(keyed_server, path, method="OPTIONS", headers={
        "Origin": site, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "asr-resume-token"})
    assert status == 204 and headers["Access-Control-Allow-Origin"] == site
    assert "Asr-Resume-Token" in headers["Access-Control-Allow-Headers"] and headers["Access-Control-Allow-Methods"] == "GET"
    status, headers, _ = http(keyed_server, path, headers={"Asr-Resume-Token": own, "Origin": site})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == site and headers["Vary"] == "Origin"
    assert http(keyed_server, path, method="OPTIONS", headers={"Origin": "https://evil.example"})[0] == 403
    assert "Access-Control-Allow-Origin" not in http(keyed_server, path, headers={"Asr-Resume-Token": own})[1]  # no Origin: not asked


def test_a_key_past_its_channels_is_refused_while_its_open_stream_goes_on(keyed_server):
    async def main():
        first = asyncio.create_task(replay(keyed_server.url, "librivox_16k.s16le", realtime=True, api_key=BOB))
        await until(lambda: keyed_server.server.access.channels("bob") == 1)
        async with connect(keyed_server.url, api_key=BOB) as second:
            refused = [m async for m in second]
            code = second.close_code
        other = await replay(keyed_server.url, "cards_16k.wav", api_key=ALICE)  # another key is not affected
        return await first, refused, code, other

    first, refused, code, other = asyncio.run(main())
    assert [m["type"] for m in refused] == ["error"] and code == 1013
    assert refused[0]["code"] == "quota_exceeded" and refused[0]["retryable"] and refused[0]["retry_after"]
    messages = [m.message for m in first.messages]
    assert messages[-1]["type"] == "closed" and not [m for m in messages if m["type"] == "error"]
    assert "dashwood" in " ".join(m["text"] for m in messages if m["type"] == "final").lower()
    assert [m.message["type"] for m in other.messages][-1] == "closed"
    # The slot is given back when the server's handler ends, just after the client saw "closed".
    asyncio.run(until(lambda: keyed_server.server.access.channels("bob") == 0))
    metrics = http(keyed_server, "/metrics", headers={"Authorization": f"Bearer {ALICE}"})[2].decode()
    assert 'asr_key_refusals_total{code="quota_exceeded",key="bob"} 1.0' in metrics
    assert 'asr_access_refusals_total{code="unauthorized"}' in metrics


def test_without_keys_programs_need_nothing_but_other_origins_are_still_refused(live_server):
    assert http(live_server, "/v1/listen", headers={"Origin": "https://evil.example"})[0] == 403
    status, _, body = http(live_server, "/v1/tokens", method="POST")
    assert status == 404 and json.loads(body)["code"] == "tokens_disabled"
    result = asyncio.run(replay(live_server.url, "cards_16k.wav"))
    assert "key" not in result.messages[0].message
