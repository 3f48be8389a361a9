"""End to end: a stream that asks for heartbeats gets one whenever the server has sent nothing
for that long, in sequence with its other messages and on after a resume; one that does not
ask gets none."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets

from asr_server.options import Limits

from ..harness import ServerThread

pytestmark = pytest.mark.e2e


async def until(ws: Any, kind: str) -> list[dict[str, Any]]:
    """Messages up to and including the first of ``kind``."""
    out = [json.loads(await ws.recv())]
    while out[-1]["type"] != kind:
        out.append(json.loads(await ws.recv()))
    return out


def test_heartbeats_come_while_nothing_else_is_sent_and_go_on_after_a_resume(whisper_runner):
    server = ServerThread(whisper_runner, Limits(idle_timeout_s=300.0)).start()  # quiet streams are not idle here
    listen = f"{server.url}/v1/listen"
    try:
        async def main() -> dict[str, Any]:
            out: dict[str, Any] = {}
            async with websockets.connect(listen) as plain, websockets.connect(f"{listen}?heartbeat_s=1") as beating:
                out["plain_session"] = json.loads(await plain.recv())
                out["session"] = json.loads(await beating.recv())
                out["beats"] = [json.loads(await beating.recv()) for _ in range(3)]
                # The plain stream has been as quiet for as long, and no message came for it.
                try:
                    out["plain_next"] = json.loads(await asyncio.wait_for(plain.recv(), 0.5))
                except TimeoutError:
                    out["plain_next"] = None
                # The client comes back on another connection (the old one looked dead to it).
                token, last = out["session"]["resume_token"], out["beats"][-1]["seq"]
                async with websockets.connect(f"{listen}?resume={token}&last_seq={last}") as second:
                    out["resumed"] = await until(second, "resumed")
                    out["after"] = json.loads(await second.recv())
                    await second.send(json.dumps({"type": "close"}))
                    out["end"] = await until(second, "closed")
            return out

        async def bounded() -> dict[str, Any]:
            async with asyncio.timeout(120):  # bounds the test, never reached when it passes
                return await main()

        out = asyncio.run(bounded())
    finally:
        server.stop()
    assert out["plain_session"]["config"]["heartbeat_s"] == 0.0 and out["session"]["config"]["heartbeat_s"] == 1.0
    assert [(b["type"], b["seq"], b["audio_received_s"]) for b in out["beats"]] == [("heartbeat", s, 0.0) for s in (2, 3, 4)]
    assert out["plain_next"] is None
    after_resume = out["resumed"] + [out["after"]] + out["end"]
    assert [m["seq"] for m in after_resume] == list(range(5, 5 + len(after_resume)))  # missed heartbeats replayed
    assert all(m["type"] == "heartbeat" for m in out["resumed"][:-1])
    assert out["after"]["type"] == "heartbeat"
