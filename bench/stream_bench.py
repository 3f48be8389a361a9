"""Single-stream benchmark: replay fixtures at real-time pace through a real server.

    python bench/stream_bench.py [--runs 2] [--fixtures a,b,...] [--compute-type auto]

Starts ``asr-server`` as a subprocess on a free loopback port with the embedded
model, streams each fixture at real-time pace (one stream at a time), and
reports per fixture and overall:

* time to first interim: first interim's arrival minus the start of the first sentence;
* final latency: each sentence's final arrival minus the end of that sentence (p50/p95);
* word error rate of the finals, and of faster-whisper's offline transcription of the
  same file with the same model and compute type;
* compute per audio second: the server process's CPU seconds, and the model's own
  decode seconds (from /metrics), divided by the audio seconds streamed.

Sentence times come from tests/audio_fixtures/manifest.json. Not a test: no
assertion, it prints a table (and --json writes the raw figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness import MANIFEST, load_channels, replay  # noqa: E402
from tests.wer import edit_distance, normalize  # noqa: E402

DEFAULT_FIXTURES = "librivox_16k.s16le,espeak_8k.mulaw,call_8k_stereo.s16le,cards_44k.f32le"


def start_server(compute_type: str, *extra: str) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "asr_server", "--port", "0", "--compute-type", compute_type, "--log-level", "WARNING", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    assert proc.stdout is not None
    port = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if m := re.search(r"127\.0\.0\.1:(\d+)", line):
            port = int(m.group(1))
        if "ready" in line:
            break
    if port is None:
        proc.kill()
        raise SystemExit("server did not start")
    return proc, port


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + "{") or l.startswith(name + " "))


def offline_errors(name: str, channel: int, compute_type: str) -> tuple[int, int]:
    from faster_whisper import WhisperModel

    from asr_server.inference.whisper import resolve_model

    global _MODEL
    if "_MODEL" not in globals():
        _MODEL = WhisperModel(resolve_model("tiny.en"), device="cpu", compute_type=compute_type, cpu_threads=os.cpu_count() or 1)
    entry = MANIFEST[name]
    segments, _ = _MODEL.transcribe(load_channels(name)[channel], language="en")
    ref = normalize(" ".join(entry["references"][channel]))
    return edit_distance(ref, normalize(" ".join(s.text for s in segments))), len(ref)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--fixtures", default=DEFAULT_FIXTURES)
    ap.add_argument("--compute-type", default="auto")
    ap.add_argument("--json", help="write raw figures here")
    ap.add_argument("--server-arg", action="append", default=[], help="more arguments for the server (repeatable), e.g. --server-arg=--final-encoder-pad-s=15")
    args = ap.parse_args()
    names = args.fixtures.split(",")

    proc, port = start_server(args.compute_type, *args.server_arg)
    url = f"ws://127.0.0.1:{port}"
    rows, latencies, first_interims = [], [], []
    errors = ref_words = off_errors = 0
    audio_s = 0.0
    cpu0, decode0 = cpu_seconds(proc.pid), metric(port, "asr_decode_seconds_sum")
    try:
        for name in names:
            entry = MANIFEST[name]
            for run in range(args.runs):
                r = asyncio.run(replay(url, name, realtime=True))
                audio_s += r.of_type("closed")[0].message["audio_received_s"]
                fixture_lat = []
                for ch in range(entry["channels"]):
                    finals = [t for t in r.of_type("final") if t.message["channel"] == ch and t.message["text"]]
                    for span in entry["spans"][ch]:
                        # The first final that covers the end of this sentence.
                        match = next((f for f in finals if f.message["end"] >= span[1] - 0.6 and f.message["start"] <= span[1]), None)
                        if match is not None:
                            fixture_lat.append(match.at - span[1])
                    ref = normalize(" ".join(entry["references"][ch]))
                    e = edit_distance(ref, normalize(r.final_text(ch)))
                    if run == 0:
                        oe, _ = offline_errors(name, ch, args.compute_type)
                        errors, ref_words, off_errors = errors + e, ref_words + len(ref), off_errors + oe
                        rows.append((f"{name} ch{ch}", e / len(ref), oe / len(ref)))
                interims = r.of_type("interim")
                first_speech = min(s for spans in entry["spans"] for s, _ in spans)
                if interims:
                    first_interims.append(interims[0].at - first_speech)
                latencies.extend(fixture_lat)
        cpu = cpu_seconds(proc.pid) - cpu0
        decode = metric(port, "asr_decode_seconds_sum") - decode0
    finally:
        proc.terminate()
        proc.wait(10)

    print(f"# single stream, real-time pace, {args.runs} run(s) per fixture, tiny.en {args.compute_type}, {os.cpu_count()} cores")
    print("| fixture | WER streamed | WER offline |")
    print("|---|---|---|")
    for label, w, o in rows:
        print(f"| {label} | {w:.3f} | {o:.3f} |")
    print(f"| **pooled** | **{errors / ref_words:.3f}** | **{off_errors / ref_words:.3f}** |")
    print()
    print(f"time to first interim (s): median {statistics.median(first_interims):.2f}, max {max(first_interims):.2f} (n={len(first_interims)})")
    print(f"final latency, end of sentence to final (s): p50 {pct(latencies, 0.5):.2f}, p95 {pct(latencies, 0.95):.2f}, max {max(latencies):.2f} (n={len(latencies)})")
    print(f"compute per audio second: server CPU {cpu / audio_s:.3f} s/s, model decode time {decode / audio_s:.3f} s/s ({audio_s:.0f} s of audio)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "latencies": latencies, "first_interims": first_interims,
                                                "cpu_per_audio_s": cpu / audio_s, "decode_per_audio_s": decode / audio_s}, indent=1))


if __name__ == "__main__":
    main()
