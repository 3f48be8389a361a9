"""Load benchmark: N concurrent real-time streams against one server.

    python bench/load_bench.py [--streams 1,2,4,8] [--rounds 3] [--equal] [--sync] [--noise-db 20] [--voices-db 20] [--gain-db -30] [--max-channels N] [--server-arg=--max-batch=4] [--fixture-dir DIR]

For each N, starts N clients at once (start times spread over one second,
seeded), each replaying a real fixture at real-time pace (fixtures are dealt
round-robin; the copies of one fixture start at different sentences, the
recording rotated at a pause, so that streams carry different speech at any
moment, as independent callers do), and reports per N: final latency p50/p95 (from where each
sentence's speech ends, found in the recording's energy, to its final), time to first interim, interim lag (per
utterance begun with speech, from where the server heard it begin to its first text, an interim or its
final; utterances that a sentence split continued are left out, their words were shown already) p50/p95, interims per stream-second, word error rate of
the finals, server CPU (cores busy), the share of the run the server spent at load
level 1 or higher (where context passes are lean), peak memory, refused streams and how
long the slowest refusal took from connecting; on stderr, by recording and channel, the WER of
the first pass and after revisions and the final latency p50 / p95 / max, and the settled delay (from each
final to the ``settled`` message covering it; finals only ``closed`` made final). The revision delay
(per utterance, from its final to the first revision that changed it) is given as well for the first
changes context passes sent alone (each revision names its ``pass``): settle decodes, which run
only while the server has time to spare, come later by design; and apart for the finals made while
every stream was still speaking (until the shortest recording ended) and those made after, when
fewer streams were left. Between levels it waits for the
server's load level to return to 0. ``--metrics FILE`` keeps the server's
metrics after each level (where finals waited, how long their calls took).
With ``--noise-db N`` every stream carries continuous pink noise N dB below its
speech (sent as raw 16 kHz), so pauses are not digital silence; with
``--voices-db N``, three other people talking N dB below it (``stream_bench.voices``);
with ``--gain-db -30`` every stream is turned down 30 dB (16-bit, 16 kHz), as quiet microphones send it.
With ``--equal`` every stream talks as long as the longest (``rounds`` plays of the longest recording
dealt: the shorter ones looped, rotation after rotation, and cut at the first pause from there), so the
full load lasts the whole run; without it a level's figures mix the full load with a lighter tail after
the shortest recording ends (the phase line above shows how much).
With ``--sync`` every stream starts at the same instant with the same recording
(LibriVox, not rotated), so their finals come due together: the burst case.
With ``--churn S`` each of the N streams is a line of a call center for S seconds: a call plays
its recording once (from its next pause on), hangs up (``close``), and the next caller dials as soon
as the last has its ``closed``; a refused caller is counted and the next dials a second later (a
caller that never retries, as Twilio's media streams do not). Run it at the server's limit
(``--max-channels``: the streams' channels, the call fixture's two counted) to see whether callers
are refused while the last call finishes; stderr gives the calls made and refused and how long each
close took (from the end of its audio to ``closed``).
With ``--fixture-dir DIR`` (repeatable; ``bench/heldout.py`` writes one) the streams replay
the recordings there instead, dealt round-robin as the fixtures are (``--sync``: the first),
so the load figures can come from recordings the decoding rules were never tuned on.
It stops the sweep once p95 final latency exceeds --limit (default 1.5 s) and
names the largest N that held it. Not a test: it prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import random
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from stream_bench import bucket_quantile, cpu_seconds, first_changes, fixture_names, health, lag_buckets, machine_line, noisy_pcm, pct, revision_delays, settled_delays, speech_ends, start_server, stop_server, text_lags, use_fixture_dir  # noqa: E402

from asr_client import stream_bytes  # noqa: E402

from tests.harness import MANIFEST, Replay, bytes_per_second, fixture_path, load_channels  # noqa: E402
from tests.wer import errors as word_errors  # noqa: E402

REVISIONS = ["true"]  # the streams' option, set from the command line
EXTRA_OPTIONS: dict[str, str] = {}  # more stream options from the command line (--split-after-s)
NOISE_DB: list[float | None] = [None]  # continuous pink noise this far below the speech (None: as recorded)
VOICES_DB: list[float | None] = [None]  # other people talking this far below the speech (None: nobody)
GAIN_DB: list[float] = [0.0]  # every stream turned down (negative) or up this much
MESSAGES_TO: list[str | None] = [None]  # a file for every stream's messages as received (JSON lines; None: not kept)
METRICS_TO: list[str | None] = [None]  # a file for the server's metrics after each level (None: not kept)
FIXTURES = ["librivox_16k.s16le", "espeak_8k.mulaw", "cards_44k.f32le", "call_8k_stereo.s16le"]
RAW = ("pcm_s16le", "pcm_f32le", "mulaw", "alaw")  # encodings whose bytes can be cut at a pause (no container)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@functools.lru_cache(maxsize=None)
def source(name: str) -> tuple[bytes, dict, float]:
    """What a client streams: the fixture's bytes, the stream options, and bytes per second.
    With noise, voices or a gain, the recording decoded to 16 kHz with them mixed in (raw s16le); so is a
    recording in a container (a held-out WAV), which could not be cut at a pause as it is."""
    entry = MANIFEST[name]
    if NOISE_DB[0] is None and VOICES_DB[0] is None and not GAIN_DB[0] and entry["encoding"] in RAW:
        return fixture_path(name).read_bytes(), entry, bytes_per_second(name)
    data, _ = noisy_pcm(name, NOISE_DB[0], voices_db=VOICES_DB[0], gain_db=GAIN_DB[0])
    return data, dict(entry, encoding="pcm_s16le", sample_rate=16000), 16000 * 2 * entry["channels"]


def play_seconds(name: str) -> float:
    """How long one play of the recording lasts, as streamed (s)."""
    data, _, rate = source(name)
    return len(data) / rate


@functools.lru_cache(maxsize=None)
def speech_end_shifts(name: str) -> list[list[float]]:
    """Per channel and sentence: where its speech ends in the recording (energy) minus the manifest's end."""
    entry = MANIFEST[name]
    dry = load_channels(name)
    return [[e - b for e, (_, b) in zip(speech_ends(dry[ch], spans), spans)] for ch, spans in enumerate(entry["spans"])]


def pause_cuts(entry: dict) -> list[float]:
    """The middles of the pauses where no channel speaks (s), in order."""
    spans = sorted(span for channel in entry["spans"] for span in channel)
    cuts, reach = [], spans[0][1]
    for start, end in spans[1:]:
        if start > reach:
            cuts.append((reach + start) / 2)
        reach = max(reach, end)
    return cuts


def rotation_cut(entry: dict, turn: int) -> float:
    """Where the ``turn``-th rotation of a recording starts (s): 0, or the middle of one of its pauses
    (the gaps where no channel speaks), in turn."""
    gaps = pause_cuts(entry)
    return 0.0 if turn % (len(gaps) + 1) == 0 else gaps[turn % (len(gaps) + 1) - 1]


def rotated(name: str, turn: int) -> tuple[bytes, dict]:
    """The fixture's bytes starting at its ``turn``-th pause (0: as recorded), and its manifest entry to match
    (``ends``: where each sentence's speech ends, found in the audio).

    Pauses are the gaps where no channel speaks; the audio before the cut
    moves to the end, and the sentences' times and order follow.
    """
    data, entry, rate = source(name)
    frame = int(rate // entry["sample_rate"])
    cut = rotation_cut(entry, turn)
    at = int(cut * rate) // frame * frame
    length = len(data) / rate
    out = dict(entry, spans=[], references=[], ends=[])
    for ch_spans, ch_refs, shifts in zip(entry["spans"], entry["references"], speech_end_shifts(name)):
        moved = sorted((((a - cut) % length, (b - cut) % length), ref, shift) for (a, b), ref, shift in zip(ch_spans, ch_refs, shifts))
        out["spans"].append([list(span) for span, _, _ in moved])
        out["references"].append([ref for _, ref, _ in moved])
        out["ends"].append([span[1] + shift for span, _, shift in moved])
    return data[at:] + data[:at], out


def round_turns(turn: int, rounds: int) -> list[int]:
    """The rotation each round of a copy starts at (each from another pause)."""
    return [turn + 5 * k for k in range(rounds)]


def replayed(name: str, turn: int, rounds: int) -> tuple[bytes, dict]:
    """``rounds`` rotations of the fixture one after another (each starting at another pause), and their manifest."""
    parts = [rotated(name, t) for t in round_turns(turn, rounds)]
    length = play_seconds(name)
    channels = range(len(parts[0][1]["spans"]))
    out = dict(parts[0][1], spans=[[] for _ in channels], references=[[] for _ in channels], ends=[[] for _ in channels])
    for k, (_, entry) in enumerate(parts):
        for ch, (spans, refs, ends) in enumerate(zip(entry["spans"], entry["references"], entry["ends"])):
            out["spans"][ch] += [[a + k * length, b + k * length] for a, b in spans]
            out["references"][ch] += refs
            out["ends"][ch] += [e + k * length for e in ends]
    return b"".join(data for data, _ in parts), out


def looped(name: str, turn: int, seconds: float) -> tuple[bytes, dict]:
    """Rotations of the fixture one after another (as :func:`replayed`) until ``seconds`` of audio, cut at
    the first pause from there on: every stream of a level talks as long as the longest, so no stream's
    end lightens the load before the others' (``--equal``)."""
    rate = source(name)[2]
    data, entry = replayed(name, turn, max(1, math.ceil(seconds / play_seconds(name))))
    cut = next((c for c in pause_cuts(entry) if c >= seconds), len(data) / rate)
    frame = int(rate // entry["sample_rate"])
    at = min(len(data), int(cut * rate) // frame * frame)
    out = dict(entry, spans=[], references=[], ends=[])
    for spans, refs, ends in zip(entry["spans"], entry["references"], entry["ends"]):
        kept = [k for k, (_, b) in enumerate(spans) if b <= cut]
        out["spans"].append([spans[k] for k in kept])
        out["references"].append([refs[k] for k in kept])
        out["ends"].append([ends[k] for k in kept])
    return data[:at], out


async def one_client(url: str, name: str, turn: int, delay: float, rounds: int = 1, seconds: float | None = None) -> tuple[dict, Replay | None, str | None, float | None]:
    """(manifest entry as streamed, replay, first error code, seconds from connecting to a refusal).
    With ``seconds``, the recording looped to that length (:func:`looped`), else ``rounds`` rotations."""
    data, entry = replayed(name, turn, rounds) if seconds is None else looped(name, turn, seconds)
    await asyncio.sleep(delay)
    t0 = time.monotonic()
    r = Replay(name)
    options = {"encoding": entry["encoding"], "channels": entry["channels"], "sample_rate": entry["sample_rate"], "revisions": REVISIONS[0], **EXTRA_OPTIONS}
    try:
        async for item in stream_bytes(url, data, bytes_per_second=source(name)[2], realtime=True, **options):
            r.messages.append(item)
    except Exception as exc:  # a broken stream
        return entry, None, type(exc).__name__, None
    errors = r.of_type("error")
    code = errors[0].message["code"] if errors else None
    # Connect, handshake, error and close handshake: an upper bound on the time to refusal.
    refused_after = time.monotonic() - t0 if errors and r.messages[0].message["type"] == "error" else None
    return entry, r, code, refused_after


async def caller_line(url: str, name: str, turn: int, delay: float, seconds: float) -> list[tuple[dict, Replay | None, str | None, float | None]]:
    """``--churn``: calls one after another for ``seconds``, each a play of the recording from its
    next pause; after a refusal the next caller dials a second later."""
    await asyncio.sleep(delay)
    end, calls = time.monotonic() + seconds, []
    while time.monotonic() < end:
        calls.append(await one_client(url, name, turn, 0.0))
        turn += 1
        if calls[-1][3] is not None or calls[-1][1] is None:
            await asyncio.sleep(1.0)
    return calls


def print_churn(n: int, results: list) -> None:
    """Calls made and refused, and how long each close took (from the end of its audio to ``closed``)."""
    closes = [r.of_type("closed")[0].at - play_seconds(r.fixture) for _, r, _, _ in results if r is not None and r.of_type("closed")]
    refused = sum(1 for *_, after in results if after is not None)
    print(f"N={n} churn: {len(results) - refused} calls served, {refused} refused ({refused / len(results):.0%} of the callers); close to closed p50 / p95 / max (s): "
          f"{pct(closes, 0.5):.2f} / {pct(closes, 0.95):.2f} / {max(closes):.2f} (n={len(closes)})", file=sys.stderr, flush=True)


def model_seconds(port: int) -> dict[str, float]:
    """Model time spent so far by decode kind (asr_decode_seconds_sum), decodes run ("decodes_<kind>") and model calls ("calls_<kind>")."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('asr_decode_seconds_sum{kind="'):
            out[line.split('"')[1]] = float(line.split()[-1])
        elif line.startswith('asr_batch_size_sum{kind="'):
            out["decodes_" + line.split('"')[1]] = float(line.split()[-1])
        elif line.startswith('asr_batch_size_count{kind="'):
            out["calls_" + line.split('"')[1]] = float(line.split()[-1])
        elif line.startswith("asr_finals_packed_total "):
            out["packed"] = float(line.split()[-1])
    return out


def spare_gauges(port: int) -> tuple[float, float]:
    """The server's spare time for settle decodes (1: on) and the background busy share it is judged on."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {line.split()[0]: float(line.split()[-1]) for line in text.splitlines() if line.startswith(("asr_spare_time ", "asr_background_busy_ratio "))}
    return values.get("asr_spare_time", float("nan")), values.get("asr_background_busy_ratio", float("nan"))


def print_phases(n: int, changes: list[tuple[float, float]], all_on_s: float) -> None:
    """The revision delay of finals made while every stream was speaking (the load the level
    names), apart from those made after the shortest stream ended (fewer streams left)."""
    full = [d for at, d in changes if at < all_on_s]
    rest = [d for at, d in changes if at >= all_on_s]
    figures = [f"{pct(v, 0.5):.1f} / {pct(v, 0.95):.1f} (n={len(v)})" if v else "- (n=0)" for v in (full, rest)]
    print(f"N={n} revision delay p50 / p95 (s) of finals made while all {n} streams spoke (the first {all_on_s:.0f} s): "
          f"{figures[0]}; after the shortest ended: {figures[1]}", file=sys.stderr, flush=True)


def keep_messages(path: str, n: int, results: list) -> None:
    """Append each stream's messages, with the seconds into the stream each came, to ``path``."""
    with open(path, "a", encoding="utf-8") as out:
        for stream, (_entry, r, _code, _refused) in enumerate(results):
            for t in r.messages if r is not None else []:
                out.write(json.dumps({"streams": n, "stream": stream, "fixture": r.fixture, "at": round(t.at, 3), "message": t.message}) + "\n")


def keep_metrics(path: str, n: int, port: int) -> None:
    """Append the server's metrics as they stand after the level of ``n`` streams (cumulative since
    it started: its histograms show where finals waited, ``asr_queue_wait_seconds``, and how long
    their calls took, ``asr_decode_seconds``)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"# load_bench: after the level of N={n}\n{text}")


def wait_calm(port: int, limit_s: float = 60.0) -> None:
    """Let the server's load level fall back to 0 between sweep levels."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and health(port).get("load_level", 0) != 0:
        time.sleep(1.0)


def equal_seconds(names: list[str], rounds: int) -> float:
    """How long every stream talks with ``--equal``: ``rounds`` plays of the longest recording dealt."""
    return rounds * max(play_seconds(name) for name in names)


async def run_level(url: str, n: int, seed: int, pid: int, port: int, rounds: int = 1, sync: bool = False, equal: bool = False, churn: float = 0.0) -> dict:
    rng = random.Random(seed)
    peak = [rss_mib(pid)]
    levels: list[int] = []  # the server's load level, sampled every half second
    spare: list[tuple[float, float]] = []  # ... its spare time and background busy share (spare_gauges)

    async def watch() -> None:
        while True:
            peak.append(rss_mib(pid))
            levels.append(int((await asyncio.to_thread(health, port)).get("load_level", 0)))
            spare.append(await asyncio.to_thread(spare_gauges, port))
            await asyncio.sleep(0.5)

    watcher = asyncio.create_task(watch())
    cpu0, t0, model0, lag0 = cpu_seconds(pid), time.monotonic(), model_seconds(port), lag_buckets(port)
    if churn:
        lines = [caller_line(url, FIXTURES[i % len(FIXTURES)], i // len(FIXTURES), rng.random(), churn) for i in range(n)]
        results = [call for calls in await asyncio.gather(*lines) for call in calls]
        print_churn(n, results)
    else:
        if sync:  # every stream at once with the same recording: their finals come due together
            clients = [one_client(url, FIXTURES[0], 0, 0.0, rounds) for _ in range(n)]
        else:
            names = [FIXTURES[i % len(FIXTURES)] for i in range(n)]
            seconds = equal_seconds(names, rounds) if equal else None
            clients = [one_client(url, name, i // len(FIXTURES), rng.random(), rounds, seconds) for i, name in enumerate(names)]
        results = await asyncio.gather(*clients)
    if MESSAGES_TO[0]:
        keep_messages(MESSAGES_TO[0], n, results)
    wall, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0
    model1, lag1 = model_seconds(port), lag_buckets(port)
    if METRICS_TO[0]:
        keep_metrics(METRICS_TO[0], n, port)
    model = {k: model1[k] - model0.get(k, 0.0) for k in model1}
    watcher.cancel()
    latencies, first, interims, errors, words, refused = [], [], 0, 0, 0, 0
    lags: list[float] = []  # per utterance begun with speech: from where the server heard it begin to its first text
    finals_sent = 0
    refined_errors = 0
    delays: list[float] = []  # per utterance a revision changed: from its final to the first such revision
    per_revision: list[float] = []  # per revision, from its first utterance's final (the measure before 2026-11-27)
    redone: list[float] = []  # revisions of one a revision had changed (an earlier pass outvoted)
    by_passes: list[float] = []  # per utterance, as ``delays`` but only first changes a context pass sent (not a settle decode)
    settled: list[float] = []  # per final: from it to the settled message that covered it
    changes: list[tuple[float, float]] = []  # per utterance a revision changed: when its final came (s into the run), and the delay
    spoken: list[float] = []  # per stream: how long it sent audio
    closed_only = 0  # finals no settled message covered before closed
    refusal_s: list[float] = []
    broken = 0
    per_fixture: dict[str, list[int]] = {}
    per_fixture_latency: dict[str, list[float]] = {}  # final latencies by recording and channel
    per_fixture_revision: dict[str, list[float]] = {}  # revision delays (first change of each utterance) by recording and channel
    per_sentence: dict[tuple[str, int, str], list[float]] = {}  # ... and by sentence (its reference), over streams and rounds
    for entry, r, _code, refused_after in results:
        if refused_after is not None:
            refused += 1
            refusal_s.append(refused_after)
            continue
        if r is None:
            broken += 1
            continue
        spoken += [r.of_type("closed")[0].message["audio_received_s"]] if r.of_type("closed") else []
        interims += len(r.of_type("interim"))
        finals_sent += len(r.of_type("final"))
        starts = [s for spans in entry["spans"] for s, _ in spans]
        if r.of_type("interim"):
            first.append(r.of_type("interim")[0].at - min(starts))
        lags += text_lags(r)
        for ch in range(entry["channels"]):
            finals = [t for t in r.of_type("final") if t.message["channel"] == ch and t.message["text"]]
            late = per_fixture_latency.setdefault(f"{r.fixture} ch{ch}", [])
            for end, ref in zip(entry["ends"][ch], entry["references"][ch]):
                match = next((f for f in finals if f.message["end"] >= end - 0.6 and f.message["start"] <= end), None)
                if match is not None:
                    latencies.append(match.at - end)
                    late.append(match.at - end)
                    per_sentence.setdefault((r.fixture, ch, ref), []).append(match.at - end)
            ref = " ".join(entry["references"][ch])
            (e1, said), (e2, _) = word_errors(ref, r.final_text(ch)), word_errors(ref, r.transcript().final_text(ch))
            errors, refined_errors, words = errors + e1, refined_errors + e2, words + said
            tally = per_fixture.setdefault(f"{r.fixture} ch{ch}", [0, 0, 0])
            tally[0], tally[1], tally[2] = tally[0] + e1, tally[1] + e2, tally[2] + said
            first_delays, again, revision_firsts, pass_delays = revision_delays(r, ch)
            by_passes += pass_delays
            settle_delays, unsettled = settled_delays(r, ch)
            settled, closed_only = settled + settle_delays, closed_only + unsettled
            delays += first_delays
            changes += first_changes(r, ch)
            per_fixture_revision.setdefault(f"{r.fixture} ch{ch}", []).extend(first_delays)
            per_revision += revision_firsts
            redone += again
    print(f"N={n} WER first pass / after revisions by fixture: "
          + ", ".join(f"{k} {a / w:.3f} / {b / w:.3f}" for k, (a, b, w) in sorted(per_fixture.items())), file=sys.stderr, flush=True)
    print(f"N={n} settled, from a final to the settled message that covered it (s): p50 {pct(settled, 0.5) if settled else float('nan'):.1f}, "
          f"p95 {pct(settled, 0.95) if settled else float('nan'):.1f} (n={len(settled)}); made final only by the close: {closed_only}", file=sys.stderr, flush=True)
    if spare:
        busy = [b for _, b in spare]
        print(f"N={n} spare time for settle decodes on {sum(1 for on, _ in spare if on >= 1) / len(spare):.0%} of the run; "
              f"background busy share p50 / p95 {pct(busy, 0.5):.2f} / {pct(busy, 0.95):.2f}", file=sys.stderr, flush=True)
    print(f"N={n} final latency p50 / p95 / max (s) by fixture: "
          + ", ".join(f"{k} {pct(v, 0.5):.2f} / {pct(v, 0.95):.2f} / {max(v):.2f} ({len(v)})" for k, v in sorted(per_fixture_latency.items()) if v), file=sys.stderr, flush=True)
    print(f"N={n} revision delay p50 / p95 / max (s) by fixture: "
          + ", ".join(f"{k} {pct(v, 0.5):.1f} / {pct(v, 0.95):.1f} / {max(v):.1f} ({len(v)})" for k, v in sorted(per_fixture_revision.items()) if v), file=sys.stderr, flush=True)
    if by_passes:
        print(f"N={n} revision delay, first changes sent by context passes (not settle decodes), p50 / p95 (s): "
              f"{pct(by_passes, 0.5):.1f} / {pct(by_passes, 0.95):.1f} ({len(by_passes)} of {len(delays)})", file=sys.stderr, flush=True)
    stream_s = sum(spoken)
    if changes and spoken and not churn:  # a call's finals are timed from its own start
        print_phases(n, changes, min(spoken))
    slowest = sorted(per_sentence.items(), key=lambda kv: -max(kv[1]))[:3]
    print(f"N={n} sentences with the latest finals, median / max over streams and rounds (s): "
          + "; ".join(f"{f} ch{ch} \"{ref[:40]}\" {pct(v, 0.5):.2f} / {max(v):.2f} ({len(v)})" for (f, ch, ref), v in slowest), file=sys.stderr, flush=True)
    return {
        "refined_wer": refined_errors / words if words else float("nan"),
        "revision_p95": pct(delays, 0.95) if delays else float("nan"), "revisions": len(delays),
        "per_revision_p95": pct(per_revision, 0.95) if per_revision else float("nan"),
        "passes_p95": pct(by_passes, 0.95) if by_passes else float("nan"),
        "redone": len(redone), "redone_p50": pct(redone, 0.5) if redone else float("nan"),
        # From a final to the pass that decided it, changed or not (the server's histogram).
        "context_lag50": bucket_quantile(lag0, lag1, 0.5), "context_lag95": bucket_quantile(lag0, lag1, 0.95),
        "model_context": model.get("context", 0.0) / stream_s if stream_s else 0.0,
        "n": n, "finals": len(latencies), "p50": pct(latencies, 0.5) if latencies else float("nan"), "p95": pct(latencies, 0.95) if latencies else float("nan"),
        "first": pct(first, 0.5) if first else float("nan"),
        "lag50": pct(lags, 0.5) if lags else float("nan"), "lag95": pct(lags, 0.95) if lags else float("nan"), "interim_rate": interims / stream_s if stream_s else 0.0,
        "wer": errors / words if words else float("nan"), "cpu": cpu / wall, "rss": max(peak), "refused": refused,
        # Share of the run at load level 1 or higher (fewer interims, lean context passes).
        "degraded": sum(1 for v in levels if v >= 1) / len(levels) if levels else 0.0,
        "refusal": max(refusal_s) if refusal_s else float("nan"), "broken": broken,
        # Model seconds per second of audio streamed, by decode kind.
        "model_interim": model.get("interim", 0.0) / stream_s if stream_s else 0.0,
        "model_final": model.get("final", 0.0) / stream_s if stream_s else 0.0,
        # Final-quality decodes (pause decodes included) per final sent.
        "final_decodes": model.get("decodes_final", 0.0) / finals_sent if finals_sent else float("nan"),
        "packed": model.get("packed", 0.0) / model["decodes_final"] if model.get("decodes_final") else 0.0,
        # Decodes per model call, by kind: how well streams' work shares a call.
        "per_call": {k: model.get(f"decodes_{k}", 0.0) / model[f"calls_{k}"] if model.get(f"calls_{k}") else 0.0 for k in ("interim", "final", "context")},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", default="1,2,3,4,6,8")
    ap.add_argument("--limit", type=float, default=1.5, help="p95 final latency to hold (s)")
    ap.add_argument("--compute-type", default="auto")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=1, help="each client replays its fixture this many times (each from another pause): more finals per level, a steadier p95")
    ap.add_argument("--revisions", default="true", help="the streams' revisions option (true/false)")
    ap.add_argument("--split-after-s", default=None, help="the streams' split_after_s option (default: the server's)")
    ap.add_argument("--noise-db", type=float, default=None, help="mix continuous pink noise this many dB below the speech into every stream (sent as raw 16 kHz)")
    ap.add_argument("--gain-db", type=float, default=0.0, help="turn every stream down (negative) or up this much, as quiet microphones send it (raw 16 kHz)")
    ap.add_argument("--voices-db", type=float, default=None, help="mix three other people talking (backwards: no words) this many dB below the speech into every stream")
    ap.add_argument("--sync", action="store_true", help="all streams start together with the same recording (finals come due at once)")
    ap.add_argument("--equal", action="store_true", help="every stream talks as long as the longest (its recording looped, cut at a pause): the level's load lasts the whole run")
    ap.add_argument("--churn", type=float, default=0.0, help="each stream is a line of calls for this many seconds: a call plays its recording once, hangs up, and the next dials (see above)")
    ap.add_argument("--max-channels", default="0", help="passed to the server; 0 (default) measures without admission control; auto: the server's measured capacity")
    ap.add_argument("--server-arg", action="append", default=[], help="more arguments for the server (repeatable), e.g. --server-arg=--max-batch=4")
    ap.add_argument("--metrics", default=None, help="append the server's metrics (Prometheus text) after each level to this file")
    ap.add_argument("--messages", default=None, help="append every stream's messages to this file (JSON lines, with the seconds into the stream each came)")
    ap.add_argument("--fixture-dir", type=Path, action="append", default=[], help="replay the recordings in this folder (its manifest.json; bench/heldout.py writes one) instead of the fixtures; repeatable")
    args = ap.parse_args()
    for folder in args.fixture_dir:
        use_fixture_dir(folder)
    if args.fixture_dir:
        FIXTURES[:] = fixture_names("all")
    MESSAGES_TO[0] = args.messages
    METRICS_TO[0] = args.metrics
    REVISIONS[0] = args.revisions
    if args.split_after_s is not None:
        EXTRA_OPTIONS["split_after_s"] = args.split_after_s
    NOISE_DB[0] = args.noise_db
    VOICES_DB[0] = args.voices_db
    GAIN_DB[0] = args.gain_db
    admission = [] if args.max_channels in ("", "auto") else ["--max-channels", args.max_channels]
    proc, port = start_server(args.compute_type, *admission, *args.server_arg)
    url = f"ws://127.0.0.1:{port}"
    rows, best = [], 0
    try:  # the server is stopped whatever fails, the machine line included (a crash there left one running)
        print(machine_line(port), flush=True)
        for n in (int(x) for x in args.streams.split(",")):
            wait_calm(port)
            row = asyncio.run(run_level(url, n, args.seed + n, proc.pid, port, args.rounds, args.sync, args.equal, args.churn))
            rows.append(row)
            print(f"N={n}: p50 {row['p50']:.2f}s p95 {row['p95']:.2f}s over {row['finals']} finals", file=sys.stderr, flush=True)
            if row["p95"] <= args.limit and row["refused"] == 0:
                best = n
            elif row["refused"] == 0:
                break  # over the latency limit with everyone admitted: no point going higher
    finally:
        stop_server(proc)
    print("| streams | final p50 (s) | final p95 (s) | first interim (s) | interim lag p50 / p95 (s) | interims/stream-s | WER finals | WER after revisions | revised utterances (delay p95, s; per revision as before; by context passes alone), again (delay p50, s) | context lag p50 / p95 (s) | server CPU (cores) | time at load level 1+ | model s/audio s (interim + final + context) | final decodes per final | decodes per call (interim / final / context) | finals packed | peak RSS (MiB) | refused | slowest refusal (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        refusal = f"{r['refusal']:.3f}" if r["refused"] else "-"
        broken = f" ({r['broken']} broken)" if r["broken"] else ""
        print(f"| {r['n']} | {r['p50']:.2f} | {r['p95']:.2f} | {r['first']:.2f} | {r['lag50']:.2f} / {r['lag95']:.2f} | {r['interim_rate']:.2f} | {r['wer']:.3f} | {r['refined_wer']:.3f} | {r['revisions']} ({r['revision_p95']:.1f}; {r['per_revision_p95']:.1f}; passes {r['passes_p95']:.1f}), {r['redone']} ({r['redone_p50']:.1f}) | {r['context_lag50']:.1f} / {r['context_lag95']:.1f} | {r['cpu']:.2f} | {r['degraded']:.0%} | {r['model_interim']:.2f} + {r['model_final']:.2f} + {r['model_context']:.2f} | {r['final_decodes']:.2f} | {r['per_call']['interim']:.1f} / {r['per_call']['final']:.1f} / {r['per_call']['context']:.1f} | {r['packed']:.0%} | {r['rss']:.0f} | {r['refused']}{broken} | {refusal} |")
    print(f"\nlargest N holding p95 final latency <= {args.limit:g} s: {best}")


if __name__ == "__main__":
    main()
