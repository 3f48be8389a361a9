"""Access control as plain objects: keys, tokens, origins and quotas with hand-written times."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from asr_server.access import ANONYMOUS, Access, AccessOptions, ApiKey, parse_keys, turn_credentials
from asr_server.errors import OriginNotAllowed, QuotaExceeded, Unauthorized, wire_info

KEYS = (ApiKey("alice", "s3cret-a"), ApiKey("bob", "s3cret-b", max_channels=2, streams_per_minute=3))


def test_without_keys_everyone_is_let_in_anonymously():
    access = Access()
    assert not access.enabled
    assert access.authenticate(None, None, 0.0) is ANONYMOUS
    access.start(ANONYMOUS, 8, 0.0)  # no quotas without keys


@pytest.mark.parametrize("header", ["Bearer s3cret-b", "Token s3cret-b", "bearer  s3cret-b "])
def test_a_good_key_in_either_scheme_names_its_principal(header):
    principal = Access(AccessOptions(keys=KEYS)).authenticate(header, None, 0.0)
    assert (principal.name, principal.max_channels, principal.streams_per_minute) == ("bob", 2, 3)


@pytest.mark.parametrize("header", [None, "", "Bearer wrong", "Basic s3cret-a", "s3cret-a", "Bearer s3cret-a-more"])
def test_a_missing_or_wrong_key_is_unauthorized(header):
    with pytest.raises(Unauthorized):
        Access(AccessOptions(keys=KEYS)).authenticate(header, None, 0.0)
    assert wire_info(Unauthorized("x")).http_status == 401


def test_a_removed_key_is_refused_from_the_next_request_and_its_tokens_stop_working():
    access = Access(AccessOptions(keys=KEYS))
    token, _ = access.mint_token(access.authenticate("Bearer s3cret-a", None, 0.0), 0.0)
    access.set_keys(KEYS[1:])
    with pytest.raises(Unauthorized):
        access.authenticate("Bearer s3cret-a", None, 1.0)
    with pytest.raises(Unauthorized):
        access.authenticate(None, token, 1.0)


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "Token"])
def test_a_token_may_stand_where_a_key_goes_on_a_handshake_only_and_once(scheme):
    """Deepgram's clients send a temporary token as ``Authorization: bearer TOKEN``."""
    access = Access(AccessOptions(keys=KEYS))
    bob = access.authenticate("Bearer s3cret-b", None, 0.0)
    token, _ = access.mint_token(bob, 0.0)
    with pytest.raises(Unauthorized):
        access.authenticate(f"{scheme} {token}", None, 1.0)  # not a key: minting or metrics
    assert access.authenticate(f"{scheme} {token}", None, 1.0, tokens=True) == bob
    with pytest.raises(Unauthorized, match="already used"):
        access.authenticate(f"{scheme} {token}", None, 2.0, tokens=True)
    assert access.authenticate("Token s3cret-a", None, 2.0, tokens=True).name == "alice"  # keys as before


def test_a_token_is_good_once_and_only_within_its_lifetime():
    access = Access(AccessOptions(keys=KEYS, token_ttl_s=60.0))
    bob = access.authenticate("Bearer s3cret-b", None, 0.0)
    token, ttl = access.mint_token(bob, 100.0)
    assert ttl == 60.0
    assert access.authenticate(None, token, 159.0) == bob  # carries the key's quotas
    with pytest.raises(Unauthorized, match="already used"):
        access.authenticate(None, token, 159.5)
    late, _ = access.mint_token(bob, 200.0, ttl_s=10.0)  # a shorter life may be asked for
    with pytest.raises(Unauthorized):
        access.authenticate(None, late, 210.0)
    longer, ttl = access.mint_token(bob, 300.0, ttl_s=600.0)
    assert ttl == 60.0  # never longer than the server's
    with pytest.raises(Unauthorized):
        access.authenticate(None, "made-up", 300.0)


def test_a_header_with_a_wrong_key_is_refused_even_with_a_good_token():
    access = Access(AccessOptions(keys=KEYS))
    token, _ = access.mint_token(access.authenticate("Bearer s3cret-a", None, 0.0), 0.0)
    with pytest.raises(Unauthorized):
        access.authenticate("Bearer wrong", token, 0.0)


def test_browser_origins_other_than_ours_or_allowed_are_refused():
    access = Access(AccessOptions(allowed_origins=("https://app.example.com",)))
    own = ("http://localhost:8765",)
    access.check_origin(None, own)  # not a browser
    access.check_origin("http://localhost:8765", own)
    access.check_origin("https://APP.example.com/", own)
    with pytest.raises(OriginNotAllowed):
        access.check_origin("https://evil.example", own)
    with pytest.raises(OriginNotAllowed):
        access.check_origin("null", own)  # sandboxed frames and file:// pages
    Access(AccessOptions(allowed_origins=("*",))).check_origin("https://evil.example", own)
    assert wire_info(OriginNotAllowed("x")).http_status == 403


def test_a_keys_channels_at_once_are_limited_and_freed_when_its_streams_end():
    access = Access(AccessOptions(keys=KEYS))
    bob = access.authenticate("Bearer s3cret-b", None, 0.0)
    access.start(bob, 2, 0.0)
    with pytest.raises(QuotaExceeded) as refused:
        access.start(bob, 1, 1.0)
    assert refused.value.retry_after and wire_info(refused.value).retryable
    access.end(bob, 2)
    assert access.channels("bob") == 0
    access.start(bob, 1, 2.0)


def test_a_keys_streams_finishing_after_their_close_leave_their_channels_to_its_next_stream():
    access = Access(AccessOptions(keys=KEYS))
    bob = access.authenticate("Bearer s3cret-b", None, 0.0)
    access.start(bob, 2, 0.0)
    access.start(bob, 2, 1.0, finishing=2)  # both closed by their client, still finishing
    with pytest.raises(QuotaExceeded) as refused:
        access.start(bob, 1, 2.0, finishing=2)  # two streaming, two finishing
    assert "2 of its 2 channels streaming" in refused.value.message
    with pytest.raises(QuotaExceeded):
        access.start(bob, 1, 2.0, finishing=3)  # ... and one finishing past as many again as the quota
    assert access.channels("bob") == 4


def test_a_keys_new_streams_per_minute_are_limited_with_the_wait_until_one_leaves_the_minute():
    access = Access(AccessOptions(keys=KEYS))
    bob = access.authenticate("Bearer s3cret-b", None, 0.0)
    for t in (0.0, 10.0, 20.0):
        access.start(bob, 1, t)
        access.end(bob, 1)
    with pytest.raises(QuotaExceeded) as refused:
        access.start(bob, 1, 30.0)
    assert refused.value.retry_after == pytest.approx(30.0)
    access.start(bob, 1, 60.5)  # the first start has left the minute
    alice = access.authenticate("Bearer s3cret-a", None, 0.0)
    for t in range(20):
        access.start(alice, 1, float(t))  # no limits of her own


def test_keys_file_lines_with_limits_comments_and_mistakes():
    keys = parse_keys("# team keys\nalice:abc\n\nbob:def channels=4 per_minute=10  # the call centre\n")
    assert keys == (ApiKey("alice", "abc"), ApiKey("bob", "def", 4, 10))
    assert "abc" not in repr(keys[0])  # secrets stay out of logs
    for bad in ("alice", ":abc", "alice:", "alice:abc channels=x", "alice:abc seats=3", "a:x\na:y"):
        with pytest.raises(ValueError):
            parse_keys(bad)
    with pytest.raises(ValueError, match="line 1: unknown limit"):  # int() refused it without saying where
        parse_keys("alice:abc channels=\u00b2")


def test_turn_credentials_follow_the_turn_rest_scheme():
    username, credential = turn_credentials("shared", "alice", 1000.0, ttl_s=3600.0)
    assert username == "4600:alice"
    assert credential == base64.b64encode(hmac.new(b"shared", b"4600:alice", hashlib.sha1).digest()).decode()


def test_a_webrtc_session_gets_turn_credentials_of_its_own_and_stun_servers_stay_as_they_are():
    from asr_server.access import Principal
    from asr_server.options import IceServer, RtcOptions
    from asr_server.server import AsrServer

    rtc = RtcOptions(ice_servers=(IceServer(("turn:turn.example:3478",), "static", "pass"), IceServer(("stun:stun.example:3478",))))
    shared = AsrServer(rtc=rtc)._rtc_wire(Principal("alice"))
    assert shared["ice_servers"][0]["username"] == "static"  # no secret: the configured pair
    wire = AsrServer(rtc=rtc, access=AccessOptions(turn_secret="s3"))._rtc_wire(Principal("alice"))
    turn, stun = wire["ice_servers"]
    assert turn["username"].endswith(":alice") and turn["credential"] != "pass"
    assert turn["credential"] == turn_credentials("s3", "alice", int(turn["username"].split(":")[0]) - 3600.0)[1]
    assert stun == {"urls": ["stun:stun.example:3478"]}
