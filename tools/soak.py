"""Soak run: many short sessions against one in-process server; memory and queues per session.

    python tools/soak.py [--sessions 400] [--concurrency 4] [--seconds 2.0] [--mix]

Each session streams the first ``--seconds`` of a real fixture as fast as the
server takes it, closes, and reads its results to ``closed``. Every
``--every`` sessions the run reports the process's resident memory, the
Python heap (tracemalloc, when ``--trace``), the scheduler's live jobs and
the fair queues' heap sizes. At the end it fits RSS against sessions and
prints the growth per session after the first tenth (warm-up). A server that
keeps nothing per finished session shows a slope near 0 and queues that hold
only live jobs.

With ``--mix`` the sessions take turns at every kind in :mod:`tools.soak_kinds`
(each dialect, a container stream, a follower, a resume, bad input, a refusal,
dropped connections), and each sample also counts the process's threads, open
files and asyncio tasks, taken once every session of the round has ended.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@dataclass
class Sample:
    sessions: int
    rss_mib: float
    heap_mib: float
    live_jobs: int
    queue_held: int
    connections: int
    threads: int = 0  # but the event loop's executor's, which it keeps (up to a bound) for later calls
    open_files: int = 0
    tasks: int = 0


def snapshot(server, done: int) -> Sample:
    from asr_server.scheduler.budget import process_rss

    core = server.scheduler.core
    heap = tracemalloc.get_traced_memory()[0] / 2**20 if tracemalloc.is_tracing() else 0.0
    fds = Path("/proc/self/fd")
    return Sample(done, process_rss() / 2**20, heap, core.live, sum(q.held for q in core.queues), len(server._connections),
                  sum(not t.name.startswith("asyncio_") for t in threading.enumerate()), len(list(fds.iterdir())) if fds.is_dir() else 0,
                  len(asyncio.all_tasks()))


async def one_session(url: str, pcm: bytes) -> bool:
    from asr_client import connect

    async with connect(url, encoding="pcm_s16le", sample_rate=16000, channels=1) as stream:
        await stream.send_audio(pcm)
        await stream.close_stream()
        last = None
        async for message in stream:
            last = message
    return last is not None and last["type"] == "closed"


async def soak(server, url: str, pcm: bytes, sessions: int, concurrency: int, every: int) -> tuple[list[Sample], int]:
    samples = [snapshot(server, 0)]
    started = done = failed = 0

    async def worker() -> None:
        nonlocal started, done, failed
        while started < sessions:
            started += 1
            ok = await one_session(url, pcm)
            done += 1
            failed += not ok
            if done % every == 0:
                samples.append(snapshot(server, done))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, failed


async def soak_mix(server, url: str, rounds: int, concurrency: int, seconds: float) -> tuple[list[Sample], dict[str, int]]:
    """``rounds`` rounds of one session of every kind (``concurrency`` at a time); a sample after
    each, once the server holds no connection and cyclic garbage is collected. Returns the samples
    and, per kind, the sessions that did not end as expected."""
    import gc

    from tools.soak_kinds import Audio, kinds, run_kind

    every = kinds(Audio(seconds))
    failed = dict.fromkeys((k.__name__ for k in every), 0)
    gate = asyncio.Semaphore(concurrency)

    async def one(kind) -> None:
        async with gate:
            if not await run_kind(kind, url):
                failed[kind.__name__] += 1

    def busy() -> bool:
        """Sessions the server still holds (dropped connections and held sessions take a moment to
        go), or a container stream's decoding thread not yet gone (it ends just after its session)."""
        return bool(server._connections or len(server.resumes) or any(t.name.startswith("decode-") for t in threading.enumerate()))

    async def settled(done: int) -> Sample:
        for _ in range(1000):
            if not busy():
                break
            await asyncio.sleep(0.05)
        gc.collect()
        return snapshot(server, done)

    samples = [await settled(0)]
    for r in range(rounds):
        await asyncio.gather(*(one(kind) for kind in every))
        samples.append(await settled((r + 1) * len(every)))
    return samples, failed


def slope(samples: list[Sample], warm: int) -> float:
    xs = [s.sessions for s in samples if s.sessions >= warm]
    ys = [s.rss_mib for s in samples if s.sessions >= warm]
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(1e-9, sum((x - mx) ** 2 for x in xs))


async def run(sessions: int, concurrency: int, seconds: float, every: int, fixture: str,
              mix: bool = False) -> tuple[list[Sample], dict[str, int], float]:
    from asr_server.inference.whisper import WhisperRunner, resolve_model
    from asr_server.options import Limits
    from asr_server.scheduler.governor import GovernorOptions, Level
    from asr_server.server import AsrServer
    from asr_client import read_pcm

    pcm, _ = read_pcm(str(ROOT / "tests" / "audio_fixtures" / fixture))
    pcm = pcm[: int(seconds * 16000) * 2]
    runner = await asyncio.to_thread(WhisperRunner, resolve_model("tiny.en"), workers=2, cpu_threads=1)
    await asyncio.to_thread(runner.warm_up)
    # --mix: ended sessions' logs are not kept for late followers (bounded, but they would read as
    # growth), and a busy machine's load level does not refuse the kinds it is about.
    server = (AsrServer("127.0.0.1", 0, Limits(ended_session_ttl_s=0), workers=2, governor=GovernorOptions(max_level=Level.INTERIM_MODEL))
              if mix else AsrServer("127.0.0.1", 0, workers=2))
    await server.start()
    server.set_runner(runner)
    url = f"ws://127.0.0.1:{server.port}"
    try:
        if mix:
            from tools.soak_kinds import kinds, Audio

            rounds = max(1, sessions // len(kinds(Audio(seconds))))
            samples, failed = await soak_mix(server, url, rounds, concurrency, seconds)
            return samples, failed, slope(samples, samples[1].sessions if len(samples) > 2 else 0)
        samples, count = await soak(server, url, pcm, sessions, concurrency, every)
    finally:
        await server.stop(grace_s=5)
    return samples, {"native": count}, slope(samples, max(every, sessions // 10))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seconds", type=float, default=2.0, help="audio per session")
    p.add_argument("--every", type=int, default=25, help="sessions between samples")
    p.add_argument("--fixture", default="librivox_16k.wav")
    p.add_argument("--trace", action="store_true", help="also track the Python heap (slower)")
    p.add_argument("--mix", action="store_true", help="every kind of session in turn (tools/soak_kinds.py), sampled after each round")
    args = p.parse_args()
    if args.trace:
        tracemalloc.start()
    t0 = time.monotonic()
    samples, failed, per_session = asyncio.run(run(args.sessions, args.concurrency, args.seconds, args.every, args.fixture, args.mix))
    print("sessions  rss_mib  heap_mib  live_jobs  queue_held  connections  threads  open_files  tasks")
    for s in samples:
        print(f"{s.sessions:8d}  {s.rss_mib:7.1f}  {s.heap_mib:8.1f}  {s.live_jobs:9d}  {s.queue_held:10d}  {s.connections:11d}"
              f"  {s.threads:7d}  {s.open_files:10d}  {s.tasks:5d}")
    not_ended = sum(failed.values())
    print(f"{samples[-1].sessions} sessions in {time.monotonic() - t0:.0f}s, {not_ended} did not end as expected"
          f"{' ' + str({k: n for k, n in failed.items() if n}) if not_ended else ''}; "
          f"RSS growth after warm-up: {per_session * 1024:.1f} KiB per session")
    return 1 if not_ended else 0


if __name__ == "__main__":
    raise SystemExit(main())
