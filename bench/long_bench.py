"""One long session: does anything creep? Every chosen one-channel recording, back to back, as one stream.

    python bench/long_bench.py [--fixture-dir /tmp/ho/set1 ...] [--fixtures all] [--noise-db 20 | --room]
                               [--streams 1] [--stretch-s 180] [--offline] [--server-arg=...]

Streams the recordings one after the other as a single real-time stream (a meeting that goes on for
a quarter of an hour rather than a recording of a minute), and reports the figures a user would
see drift if something grew with the session (a re-decoded buffer, a queue, per-stream state):
per stretch of ``--stretch-s`` seconds of audio, the final latency (from where each sentence's speech
ends in the dry recording, found by its energy, as ``stream_bench.py`` measures it), the delay of
the revisions that changed a final, the server's resident memory and its CPU; then the whole
session's word error rate of the first-pass finals and of the transcript after revisions (with
``--offline``, faster-whisper's own transcription of the same audio beside them, computed in the
same run). The stream asks for what the captioning page asks for (interims, revisions, word
times). ``--streams N`` runs N such sessions at once, started together, each taking the recordings
in its own order (a room of long meetings on one server: the stretches' figures are all the
streams' together, the WER their words together). The server is started by the bench without
admission control (``--max-channels 0``). With ``$BENCH_MESSAGES`` set, every message received
is written there as a JSON line (the stream's index, seconds into it, the message), to look into
a run afterwards (with ``$BENCH_SERVER_LOG``, the server's log).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from asr_client import Transcript, connect  # noqa: E402
from stream_bench import MANIFEST, cpu_seconds, fixture_names, load_channels, machine_line, noisy_pcm, offline_text, one_channel, sentence_latencies, speech_ends, start_server, stop_server, use_fixture_dir  # noqa: E402

from tests.wer import errors  # noqa: E402

RATE = 16000
DEFAULT_FIXTURES = "librivox_16k.s16le,cards_44k.f32le,espeak_8k.mulaw,ljspeech_babylon_16k.s16le"


@dataclass
class Session:
    """The stream as sent: its 16 kHz s16le bytes, the sentences' references and where their speech ends."""

    pcm: bytearray = field(default_factory=bytearray)
    references: list[str] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 2 / RATE

    def add(self, name: str, noise_db: float | None, room: bool) -> None:
        data, ends = recording(name, noise_db, room)
        self.ends += [self.seconds + end for end in ends]
        self.references += MANIFEST[name]["references"][0]
        self.pcm += data


@functools.cache
def recording(name: str, noise_db: float | None, room: bool) -> tuple[bytes, tuple[float, ...]]:
    """One recording as streamed (16 kHz s16le, noise or room applied) and where its sentences'
    speech ends in the dry recording; made once however many streams send it."""
    return noisy_pcm(name, noise_db, room)[0], tuple(speech_ends(load_channels(name)[0], MANIFEST[name]["spans"][0]))


def sample_server(pid: int, into: list[tuple[float, int, float]], done: threading.Event, every_s: float = 5.0) -> None:
    """(monotonic time, resident MiB, CPU seconds) of the server every ``every_s`` until ``done``."""
    while not done.is_set():
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        rss = int(next(line for line in status if line.startswith("VmRSS")).split()[1]) // 1024
        into.append((time.monotonic(), rss, cpu_seconds(pid)))
        done.wait(every_s)


async def stream(url: str, pcm: bytes) -> tuple[float, list[tuple[float, dict]], str]:
    """Send ``pcm`` at real-time pace in 100 ms pieces, then close; (monotonic time streaming
    began, [(seconds into the stream, message)], how the connection ended: its close code and the
    client's reconnects, for a stream that ends before ``closed``)."""
    messages: list[tuple[float, dict]] = []
    piece = RATE * 2 // 10
    async with connect(url, encoding="pcm_s16le", sample_rate=RATE, channels=1) as s:
        began = time.monotonic()

        async def send() -> None:
            for k in range(0, len(pcm), piece):
                await asyncio.sleep(max(0.0, began + k / (RATE * 2) - time.monotonic()))
                await s.send_audio(pcm[k : k + piece])
            await s.close_stream()

        sender = asyncio.create_task(send())
        try:
            async for message in s:
                messages.append((time.monotonic() - began, message))
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        return began, messages, f"close code {s.close_code}, {s.reconnects} reconnects"


def revision_delays(messages: list[tuple[float, dict]]) -> list[tuple[float, float]]:
    """Per final a revision changed: (when the final came, seconds until the first revision that changed it)."""
    shown: dict[int, float] = {}
    first: dict[int, tuple[float, float]] = {}
    for at, m in messages:
        if m["type"] == "final":
            shown[m["utterance"]] = at
        elif m["type"] == "revision":
            for u in m.get("changed", [m["utterances"][0]]):
                if u in shown:
                    first.setdefault(u, (shown[u], at - shown[u]))
    return list(first.values())


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def stretch_rows(runs: list[tuple[Session, list[tuple[float, dict]]]], samples: list[tuple[float, int, float]], began: float, stretch_s: float) -> list[str]:
    """One row per ``stretch_s`` of the session: every stream's sentences and revisions in it together."""
    lat: list[tuple[float, float | None]] = []  # (sentence end, latency or None)
    delays: list[tuple[float, float]] = []
    for session, messages in runs:
        finals = [(at, m["start"], m["end"]) for at, m in messages if m["type"] == "final" and m["text"]]
        lat += list(zip(session.ends, sentence_latencies(finals, session.ends)))
        delays += revision_delays(messages)
    rows = []
    seconds = max(session.seconds for session, _ in runs)
    for lo in np.arange(0.0, seconds, stretch_s):
        hi = lo + stretch_s
        got = [x for end, x in lat if x is not None and lo <= end < hi]
        missed = sum(x is None for end, x in lat if lo <= end < hi)
        rev = [d for at, d in delays if lo <= at < hi]
        inside = [(rss, cpu) for t, rss, cpu in samples if lo <= t - began < hi]
        cpu = (inside[-1][1] - inside[0][1]) / (len(inside) - 1) / 5.0 if len(inside) > 1 else float("nan")
        rows.append(f"| {lo / 60:.1f}-{min(hi, seconds) / 60:.1f} | {len(got)} ({missed} without a final) | {pct(got, 50):.2f} / {pct(got, 95):.2f} / {max(got, default=float('nan')):.2f} "
                    f"| {len(rev)} | {pct(rev, 50):.1f} / {pct(rev, 95):.1f} | {max((r for r, _ in inside), default=0)} | {cpu:.2f} |")
    return rows


def rotated(names: list[str], k: int, streams: int) -> list[str]:
    """Stream ``k``'s order of the recordings: each stream starts ``k / streams`` of the way along, so
    streams started together say different things at once (a room of talkers, not one echoed)."""
    at = k * len(names) // streams
    return names[at:] + names[:at]


def report(runs: list[tuple[Session, list[tuple[float, dict]], str]], samples: list[tuple[float, int, float]], began: float, args: argparse.Namespace) -> None:
    """Print any stream that ended before ``closed``, the stretches' rows, and the WER of all the streams' words."""
    for k, (_session, messages, how) in enumerate(runs):
        ended = [m for _at, m in messages if m["type"] in ("error", "closed")]
        if not ended or ended[-1]["type"] != "closed":
            last = f"{messages[-1][0]:.1f} s" if messages else "no message"
            print(f"stream {k} ended early, after {last} ({how}): {ended[-1] if ended else messages[-1][1] if messages else '-'}", flush=True)
    print("| minutes | sentences | finals p50 / p95 / max (s) | finals revised | revision delay p50 / p95 (s) | server RSS max (MiB) | server CPU (cores) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(stretch_rows([(session, messages) for session, messages, _how in runs], samples, began, args.stretch_s)))
    counts = np.zeros(4, int)  # errors first pass, after revisions, offline; words
    for session, messages, _how in runs:
        transcript = Transcript()
        for _at, m in messages:
            transcript.apply(m)
        reference = " ".join(session.references)
        first = " ".join(m["text"] for _at, m in messages if m["type"] == "final" and m["text"])
        (e1, n), (e2, _n) = errors(reference, first), errors(reference, transcript.final_text(0))
        e3 = errors(reference, offline_text(np.frombuffer(bytes(session.pcm), np.int16).astype(np.float32) / 32768, "auto"))[0] if args.offline else 0
        counts += (e1, e2, e3, n)
    line = f"WER first pass {counts[0] / counts[3]:.3f}, after revisions {counts[1] / counts[3]:.3f}"
    line += f", offline {counts[2] / counts[3]:.3f}" if args.offline else ""
    closes = ", ".join(sorted({how for _s, _m, how in runs}))
    print(f"{line} ({counts[3]} words); {'the connection' if len(runs) == 1 else 'the connections'}: {closes}")


async def stream_all(url: str, sessions: list[Session]) -> tuple[float, list[tuple[list[tuple[float, dict]], str]]]:
    """Every session as its own stream, all started together; (when the first began, per stream its messages and how it ended)."""
    done = await asyncio.gather(*(stream(url, bytes(session.pcm)) for session in sessions))
    return min(began for began, _m, _h in done), [(messages, how) for _b, messages, how in done]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture-dir", type=Path, action="append", default=[], help="more recordings (bench/heldout.py writes them); repeatable")
    ap.add_argument("--fixtures", default=DEFAULT_FIXTURES, help="comma-separated names, or all (every one-channel recording the --fixture-dirs add)")
    ap.add_argument("--noise-db", type=float, default=None, help="continuous pink noise this many dB below the speech")
    ap.add_argument("--room", action="store_true", help="reverberate (RT60 0.5 s) over room tone")
    ap.add_argument("--streams", type=int, default=1, help="this many long sessions at once, started together, each with the recordings in its own order")
    ap.add_argument("--stretch-s", type=float, default=180.0, help="report per this many seconds of the session")
    ap.add_argument("--offline", action="store_true", help="also transcribe each session offline (faster-whisper, beam 5, its VAD filter)")
    ap.add_argument("--server-arg", action="append", default=[], help="more arguments for the server (repeatable)")
    args = ap.parse_args()
    for folder in args.fixture_dir:
        use_fixture_dir(folder)
    names = one_channel(DEFAULT_FIXTURES.split(",") + fixture_names("all") if args.fixtures == "all" else fixture_names(args.fixtures), "long_bench.py")
    sessions = [Session() for _ in range(args.streams)]
    for k, session in enumerate(sessions):
        for name in rotated(names, k, args.streams):
            session.add(name, args.noise_db, args.room)
    print(f"{len(sessions[0].ends)} sentences, {sessions[0].seconds / 60:.1f} min of audio as one stream, {args.streams} such stream(s) at once", flush=True)
    proc, port = start_server("auto", "--max-channels", "0", *args.server_arg)
    samples: list[tuple[float, int, float]] = []
    done = threading.Event()
    try:
        print(machine_line(port), flush=True)
        threading.Thread(target=sample_server, args=(proc.pid, samples, done), daemon=True).start()
        began, streamed = asyncio.run(stream_all(f"ws://127.0.0.1:{port}", sessions))
    finally:
        done.set()
        stop_server(proc)
    if os.environ.get("BENCH_MESSAGES"):
        Path(os.environ["BENCH_MESSAGES"]).write_text("".join(json.dumps([k, round(at, 3), m]) + "\n" for k, (messages, _how) in enumerate(streamed) for at, m in messages))
    report([(session, messages, how) for session, (messages, how) in zip(sessions, streamed)], samples, began, args)


if __name__ == "__main__":
    main()
