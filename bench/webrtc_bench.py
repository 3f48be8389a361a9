"""WebRTC against WebSocket: the same fixtures, live, through one real server.

    python bench/webrtc_bench.py [--fixtures cards_16k.wav,librivox_16k.wav,espeak_16k.wav]

Starts ``asr-server`` (embedded model) on a free loopback port with
``--webrtc-host 127.0.0.1``. Each fixture is streamed in real time twice,
one stream at a time: over WebSocket (PCM, tests/harness.py) and over WebRTC
(an aiortc peer sending the file as a 48 kHz Opus microphone track,
tests/rtc_client.py). Reported per transport: final latency (arrival minus the
end of the sentence in the file, p50/p95) and the word error rate of the
finals. Not a test: it prints a table (--json writes the raw figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.stream_bench import pct, start_server, stop_server  # noqa: E402
from asr_server.transport.webrtc import restrict_host_addresses  # noqa: E402
from tests.harness import MANIFEST, load_mono, replay  # noqa: E402
from tests.rtc_client import ArrayTrack, run_rtc, to_48k  # noqa: E402
from tests.wer import errors as word_errors  # noqa: E402


def latencies(finals: list[tuple[float, str]], spans: list[list[float]]) -> list[float]:
    """Final arrival (s since the audio started) minus its sentence's end; finals matched to sentences in order."""
    return [at - end for (at, _), (_, end) in zip(finals, spans)]


def errors(name: str, text: str) -> tuple[int, int]:
    return word_errors(" ".join(MANIFEST[name]["references"][0]), text)


async def over_websocket(url: str, name: str) -> tuple[list[tuple[float, str]], str]:
    r = await replay(url, name, realtime=True)
    finals = [(m.at, m.message["text"]) for m in r.messages if m.message["type"] == "final" and m.message["text"]]
    return finals, r.final_text()


async def over_webrtc(url: str, name: str) -> tuple[list[tuple[float, str]], str]:
    run = await run_rtc(url, ArrayTrack(to_48k(load_mono(name))))
    assert run.audio_started_at is not None
    finals = [(at - run.audio_started_at, m["text"]) for m, at in zip(run.messages, run.arrivals) if m["type"] == "final" and m["text"]]
    return finals, run.final_text()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", default="cards_16k.wav,librivox_16k.wav,espeak_16k.wav")
    ap.add_argument("--json", default=None, help="write the raw figures here")
    args = ap.parse_args()
    restrict_host_addresses(["127.0.0.1"])  # the client peer, like the server, on loopback
    proc, port = start_server("auto", "--webrtc-host", "127.0.0.1")
    url = f"ws://127.0.0.1:{port}"
    figures: dict[str, dict[str, list]] = {"websocket": {"lat": [], "err": []}, "webrtc": {"lat": [], "err": []}}
    try:
        for name in args.fixtures.split(","):
            spans = MANIFEST[name]["spans"][0]
            for transport, run in (("websocket", over_websocket), ("webrtc", over_webrtc)):
                finals, text = asyncio.run(run(url, name))
                lat = latencies(finals, spans)
                e, n = errors(name, text)
                figures[transport]["lat"] += lat
                figures[transport]["err"].append((e, n))
                print(f"{name:22s} {transport:9s} finals {len(finals)}/{len(spans)}  latency p50 {pct(lat, 0.5):.2f} s  "
                      f"max {max(lat):.2f} s  WER {e / n:.3f}", flush=True)
    finally:
        stop_server(proc)
    print()
    print("| transport | final latency p50 | p95 | pooled WER |")
    print("|---|---|---|---|")
    for transport, f in figures.items():
        e = sum(x for x, _ in f["err"])
        n = sum(y for _, y in f["err"])
        print(f"| {transport} | {pct(f['lat'], 0.5):.2f} s | {pct(f['lat'], 0.95):.2f} s | {e / n:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
