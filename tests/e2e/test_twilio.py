"""End to end: a Twilio-shaped client replays a two-party call (8 kHz mu-law, the legs as the
inbound and outbound tracks, 20 ms media events in Twilio's JSON) while followers read the
session's results: a WebSocket follower from the start, an EventSource-style SSE follower, and a
late WebSocket follower after the call ended. Each ends with the same messages; both parties are
transcribed apart; Twilio itself is sent nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import websockets

from ..harness import FIXTURES, MANIFEST, ServerThread
from ..wer import wer

pytestmark = pytest.mark.e2e

FIXTURE = "call_8k_stereo.s16le"  # channel 0: the agent; channel 1: the caller
FRAME = 160  # 20 ms at 8 kHz


def mulaw(samples: np.ndarray) -> bytes:
    """G.711 mu-law of 16-bit samples (what a phone network sends)."""
    s = samples.astype(np.int32) >> 2  # G.711 works on 14 bits
    mask = np.where(s < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(s), 8159) + 33
    segment = np.searchsorted(np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF]), magnitude)
    return ((((segment << 4) | ((magnitude >> (segment + 1)) & 0xF)) ^ mask) & 0xFF).astype(np.uint8).tobytes()


def legs() -> tuple[bytes, bytes]:
    """(caller, agent) as mu-law."""
    stereo = np.frombuffer((FIXTURES / FIXTURE).read_bytes(), "<i2").reshape(-1, 2)
    return mulaw(stereo[:, 1]), mulaw(stereo[:, 0])


async def twilio_call(url: str, started: asyncio.Event, parameters: dict[str, str] | None = None) -> tuple[list[str], int | None]:
    """Twilio's events for the whole call (``parameters``: more custom parameters); what the server
    sent back (nothing) and its close code."""
    caller, agent = legs()
    received: list[str] = []
    async with websockets.connect(f"{url}/v1/twilio") as ws:
        await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await ws.send(json.dumps({"event": "start", "sequenceNumber": "1", "streamSid": "MZ0001", "start": {
            "accountSid": "AC0001", "streamSid": "MZ0001", "callSid": "CA0001", "tracks": ["inbound", "outbound"],
            "customParameters": {"language": "en", "interim_results": "true", **(parameters or {})},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}))
        started.set()
        await ws.send(b"\xff" * 320)  # not Twilio's: an error on the followers' channel, not audio
        sequence = 2
        for chunk, at in enumerate(range(0, len(caller), FRAME)):
            for track, audio in (("inbound", caller), ("outbound", agent)):
                payload = base64.b64encode(audio[at : at + FRAME]).decode()
                await ws.send(json.dumps({"event": "media", "sequenceNumber": str(sequence), "streamSid": "MZ0001", "media": {
                    "track": track, "chunk": str(chunk + 1), "timestamp": str(at // 8), "payload": payload}}))
                sequence += 1
            if chunk % 50 == 0:
                await ws.send(json.dumps({"event": "mark", "sequenceNumber": str(sequence), "streamSid": "MZ0001", "mark": {"name": "m"}}))
                sequence += 1
        await ws.send(json.dumps({"event": "stop", "sequenceNumber": str(sequence), "streamSid": "MZ0001",
                                  "stop": {"accountSid": "AC0001", "callSid": "CA0001"}}))
        try:
            async for message in ws:
                received.append(message)
        except websockets.ConnectionClosed:
            pass
        return received, ws.close_code


async def ws_follow(url: str, session_id: str, from_seq: int = 0) -> list[dict[str, Any]]:
    async with websockets.connect(f"{url}/v1/sessions/{session_id}/events?from_seq={from_seq}") as ws:
        return [json.loads(m) async for m in ws]


def sse_follow(http: str, session_id: str) -> list[dict[str, Any]]:
    """What a browser's EventSource does: ask, read the events, ask again with Last-Event-ID, until 204."""
    got: list[dict[str, Any]] = []
    last = None
    for _ in range(1000):  # bounded
        request = urllib.request.Request(f"{http}/v1/sessions/{session_id}/events", headers={"Accept": "text/event-stream"})
        if last is not None:
            request.add_header("Last-Event-ID", str(last))
        with urllib.request.urlopen(request, timeout=30) as answer:
            if answer.status == 204:
                return got
            assert answer.headers["Content-Type"].startswith("text/event-stream")
            for block in answer.read().decode().split("\n\n"):
                fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
                if "data" in fields:
                    got.append(json.loads(fields["data"]))
                    last = int(fields["id"])
    raise AssertionError("the SSE follower never saw the end")


def test_a_twilio_call_is_transcribed_per_party_and_followed_live_and_after(whisper_runner):
    server = ServerThread(whisper_runner).start()
    try:
        async def main() -> dict[str, Any]:
            started = asyncio.Event()
            call = asyncio.create_task(twilio_call(server.url, started))
            await started.wait()
            listing: list[dict[str, Any]] = []
            for _ in range(500):  # polls, bounded: the call's session is listed once its start is taken
                with urllib.request.urlopen(f"{server.http}/v1/sessions", timeout=30) as answer:
                    listing = json.loads(answer.read())["sessions"]
                if listing and listing[0].get("call"):
                    break
                await asyncio.sleep(0.01)
            session_id = listing[0]["session_id"]
            live = asyncio.create_task(ws_follow(server.url, session_id))
            sse = asyncio.create_task(asyncio.to_thread(sse_follow, server.http, session_id))
            sent_back, code = await call
            out = {"listing": listing, "live": await live, "sse": await sse, "sent_back": sent_back, "code": code}
            out["late"] = await ws_follow(server.url, session_id)  # after the end: the kept log
            out["late_sse"] = await asyncio.to_thread(sse_follow, server.http, session_id)
            out["late_from"] = await ws_follow(server.url, session_id, from_seq=5)
            async with websockets.connect(f"{server.url}/v1/sessions/{session_id}/events?from_seq=5th") as refused:
                out["bad_from"] = [json.loads(await refused.recv())]
                await refused.wait_closed()
                out["bad_from_code"] = refused.close_code
            return out

        out = asyncio.run(main())
        transcript = {}
        for fmt in ("json", "srt", "vtt"):
            with urllib.request.urlopen(f"{server.http}/v1/sessions/{out['listing'][0]['session_id']}/transcript?format={fmt}", timeout=30) as answer:
                transcript[fmt] = answer.read().decode()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{server.http}/v1/sessions/nope/events", timeout=30)
        with pytest.raises(urllib.error.HTTPError) as bad_from:
            urllib.request.urlopen(f"{server.http}/v1/sessions/{out['listing'][0]['session_id']}/events?from_seq=-1", timeout=30)
    finally:
        server.stop()
    assert missing.value.code == 404
    # A from_seq that is not a whole number is refused, not read as 0 (everything again).
    assert bad_from.value.code == 400 and json.loads(bad_from.value.read())["code"] == "invalid_option"
    assert [(m["type"], m.get("code")) for m in out["bad_from"]] == [("error", "invalid_option")] and out["bad_from_code"] == 1008
    assert out["sent_back"] == [] and out["code"] == 1000  # Twilio gets nothing, and a clean close after stop
    call = out["listing"][0]["call"]
    assert call["call_sid"] == "CA0001" and call["channel_names"] == ["caller", "agent"] and out["listing"][0]["dialect"] == "twilio"
    live, sse, late = out["live"], out["sse"], out["late"]
    assert [m["seq"] for m in live] == list(range(1, len(live) + 1)) and live[-1]["type"] == "closed"
    assert sse == live and late == live and out["late_sse"] == live  # every follower ends with the same messages
    assert [m["code"] for m in live if m["type"] == "error"] == ["invalid_message"]  # the stray binary frame, and the call went on
    assert out["late_from"] == live[5:]
    session = [m for m in live if m["type"] == "session"][-1]
    assert session["call"]["stream_sid"] == "MZ0001" and session["config"]["channels"] == 2
    texts = {c: " ".join(m["text"] for m in live if m["type"] == "final" and m["channel"] == c and m["text"]) for c in (0, 1)}
    agent_ref, caller_ref = (" ".join(r) for r in MANIFEST[FIXTURE]["references"])
    assert wer(caller_ref, texts[0]) < 0.35, texts[0]
    assert wer(agent_ref, texts[1]) < 0.35, texts[1]
    assert "support" not in texts[0].lower() and "lost my credit card" not in texts[1].lower()  # no crosstalk
    # The whole call's transcript, speaker by speaker, with revisions applied.
    whole = json.loads(transcript["json"])
    assert whole["complete"] and not whole["truncated"] and [c["speaker"] for c in whole["channels"]] == ["caller", "agent"]
    assert wer(caller_ref, whole["channels"][0]["text"]) < 0.35 and wer(agent_ref, whole["channels"][1]["text"]) < 0.35
    for c, channel in enumerate(whole["channels"]):  # a segment (a cue) per turn, whether or not a revision covered it
        turns = [m["utterance"] for m in live if m["type"] == "final" and m["channel"] == c and m["text"]]
        assert [s["utterances"] for s in channel["segments"]] == [[u, u] for u in turns]
        assert " ".join(s["text"] for s in channel["segments"]) == channel["text"]
    # A client that followed the call live holds the same turns, times included (asr_client's Transcript.turns).
    from asr_client import Transcript

    client = Transcript()
    for m in live:
        client.apply(m)
    for c, channel in enumerate(whole["channels"]):
        assert [(t.utterance, t.start, t.end, t.text) for t in client.turns(c)] == [(s["utterances"][0], s["start"], s["end"], s["text"]) for s in channel["segments"]]
    # A cue per turn of the call at least (a party's utterances between the other's may share one; a
    # turn longer than two lines of 42 characters has more), in spoken order.
    spoken = [c for _, c in sorted((s["start"], c) for c, channel in enumerate(whole["channels"]) for s in channel["segments"])]
    cues = [block.split("\n") for block in transcript["srt"].strip().split("\n\n")]
    assert len(cues) >= sum(1 for i, c in enumerate(spoken) if i == 0 or spoken[i - 1] != c) >= 4
    assert all(len(line) <= 42 for cue in cues for line in cue[2:])  # the speaker's label counted
    assert [cue[1] for cue in cues] == sorted(cue[1] for cue in cues)
    assert transcript["srt"].startswith("1\n00:00:0") and "[caller] " in transcript["srt"] and "[agent] " in transcript["srt"]
    assert transcript["vtt"].startswith("WEBVTT\n\n") and "<v caller>" in transcript["vtt"] and " --> " in transcript["vtt"]
