"""Endpointing benchmark: where each voice-activity detector says speech ended.

    python bench/vad_bench.py [--fixtures a,b,...] [--endpoint-ms 500] [--phone] [--detectors webrtc,silero,both] [--talker-floor-db 20] [--talker-hold-ms 150] [--talker-silence-db 30] [--gain-db -30]

Runs the server's own VAD gate and chunker (no model, no server) over each
fixture channel as recorded, in a reverberant room with room tone, and under
continuous pink noise 20 and 10 dB below the speech, and with three other
people talking 20 and 15 dB below it (``--voices-db``; the conditions of
``stream_bench.py``), for each detector (``webrtc``, ``silero``, ``both``); with
``--phone``, every condition as a telephone line delivers it (``stream_bench.py
--phone``: 300-3400 Hz, 8 kHz mu-law). ``--gain-db`` turns every condition down (or up)
that much, as a quiet microphone or a far talker delivers it (the fixtures' speech is at
-19 to -25 dBFS), carried in 16-bit samples at 16 kHz as ``stream_bench.py --gain-db``
sends it (so an 8 kHz recording takes the wideband thresholds there).
Per detector and condition it reports:

* endpoint delay: when the endpoint fired (the moment the final can be sent)
  minus where the sentence's speech ends in the dry recording, p50/p95; the
  ideal is the endpoint wait itself;
* sentences that got an endpoint of their own (the rest merged with the next
  one or were missed), and sentences whose utterance ends before their speech
  does (clipped words);
* utterances in all (more than sentences: some ended at a pause inside a
  sentence, or hold no sentence);
* false starts: utterances that hold no sentence;
* speech found in 60 s of noise alone at each condition's level (what a
  model would be asked to transcribe in an empty room; not for other voices,
  which are speech);
* CPU time of the gate per audio second.

Not a test: it prints a table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
from stream_bench import DEFAULT_FIXTURES, ROOM_TONE_DB, fixture_names, noisy_pcm, pct, pink_noise, speech_ends, speech_level, use_fixture_dir, wire_rate, with_gain  # noqa: E402

from asr_server.audio.chunker import Chunker, ChunkerOptions, EndReason, UtteranceEnded, UtteranceStarted  # noqa: E402
from asr_server.audio.silero import SileroModel  # noqa: E402
from asr_server.audio.vad import DETECTORS, VadGate, VadOptions  # noqa: E402
from asr_server.inference.fw import silero_vad_path  # noqa: E402
from tests.harness import MANIFEST, load_channels, phone_line  # noqa: E402

# (pink noise dB below the speech, reverberant room, other voices dB below the speech)
CONDITIONS = {"clean": (None, False, None), "room": (None, True, None), "noise 20 dB": (20.0, False, None), "noise 10 dB": (10.0, False, None),
              "voices 20 dB": (None, False, 20.0), "voices 15 dB": (None, False, 15.0)}
PIECE = 320  # 20 ms pieces, as a browser sends


def utterances(audio: np.ndarray, options: VadOptions, endpoint_ms: int, model: SileroModel) -> tuple[list[tuple[int, int, int, str]], float]:
    """(start, end, sample at which it was decided, reason) of each utterance, and the gate's CPU seconds."""
    gate, chunker = VadGate(options, silero=model), Chunker(ChunkerOptions(endpoint_ms=endpoint_ms))
    out, starts, cpu = [], {}, 0.0
    for i in range(0, len(audio), PIECE):
        t = time.process_time()
        frames = gate.feed(audio[i : i + PIECE])
        cpu += time.process_time() - t
        for event in chunker.feed(frames):
            if isinstance(event, UtteranceStarted):
                starts[event.utterance] = event.start
            elif isinstance(event, UtteranceEnded):
                out.append((starts[event.utterance], event.end, i + PIECE, event.reason.value))
    for event in chunker.end(EndReason.END_OF_STREAM):
        if isinstance(event, UtteranceEnded):
            out.append((starts[event.utterance], event.end, len(audio), event.reason.value))
    return out, cpu


def score(utts, spans, ends) -> dict:
    """Per sentence, the last utterance overlapping it: its own if it ended on an endpoint
    before the next sentence began."""
    delays, own, clipped = [], 0, 0
    for i, ((a, b), end) in enumerate(zip(spans, ends)):
        following = spans[i + 1][0] if i + 1 < len(spans) else float("inf")
        over = [u for u in utts if u[0] < b * 16000 and u[1] > a * 16000]
        if not over:
            continue
        last = max(over, key=lambda u: u[0])
        if last[3] == EndReason.ENDPOINT.value and last[1] < following * 16000:
            own += 1
            delays.append(last[2] / 16000 - end)
            clipped += last[1] / 16000 < end - 0.05
    false = sum(1 for u in utts if not any(u[0] < b * 16000 and u[1] > a * 16000 for a, b in spans))
    return {"delays": delays, "own": own, "clipped": clipped, "false": false, "utterances": len(utts)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=DEFAULT_FIXTURES, help="comma-separated names in the manifest, or all")
    ap.add_argument("--fixture-dir", type=Path, default=None, help="recordings and manifest.json from this folder (bench/heldout.py writes one)")
    ap.add_argument("--endpoint-ms", type=int, default=500)
    ap.add_argument("--phone", action="store_true", help="every condition as a phone line carries it (300-3400 Hz, 8 kHz mu-law)")
    ap.add_argument("--detectors", default=",".join(DETECTORS), help="detectors to compare, comma-separated")
    ap.add_argument("--talker-floor-db", type=float, default=VadOptions.talker_floor_db, help="the gate's option (0: off)")
    ap.add_argument("--talker-hold-ms", type=int, default=VadOptions.talker_hold_ms, help="the gate's option")
    ap.add_argument("--talker-silence-db", type=float, default=VadOptions.talker_silence_db, help="the gate's option (0: off)")
    ap.add_argument("--gain-db", type=float, default=0.0, help="turn every condition down (negative) or up this much, in 16-bit samples")
    args = ap.parse_args()
    use_fixture_dir(args.fixture_dir)
    model = SileroModel(silero_vad_path())
    gained = f"; gain {args.gain_db:g} dB" if args.gain_db else ""
    print(f"# endpoint {args.endpoint_ms} ms; fixtures {args.fixtures}{'; over a phone line' if args.phone else ''}{gained}")
    print("| condition | detector | endpoint delay p50 / p95 (s) | own endpoint | utterances | clipped | false starts | speech in 60 s of noise alone (s) | gate CPU s/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cond, (snr, room, voices_db) in CONDITIONS.items():
        for detector in args.detectors.split(","):
            options = VadOptions(detector=detector, talker_floor_db=args.talker_floor_db, talker_hold_ms=args.talker_hold_ms, talker_silence_db=args.talker_silence_db)
            total = {"delays": [], "own": 0, "clipped": 0, "false": 0, "utterances": 0, "n": 0}
            cpu = audio_s = 0.0
            for name in fixture_names(args.fixtures):
                plain = snr is None and not room and voices_db is None and not args.phone
                heard = load_channels(name) if plain else noisy_pcm(name, snr, room, args.phone, voices_db)[1]
                dry = load_channels(name)
                as_sent = options.for_rate(wire_rate(name, snr, room, args.phone, voices_db, args.gain_db))  # as the server takes the stream
                for ch, audio in enumerate(heard):
                    spans = MANIFEST[name]["spans"][ch]
                    utts, spent = utterances(with_gain(audio, args.gain_db), as_sent, args.endpoint_ms, model)
                    s = score(utts, spans, speech_ends(dry[ch], spans))
                    for k in ("own", "clipped", "false", "utterances"):
                        total[k] += s[k]
                    total["delays"] += s["delays"]
                    total["n"] += len(spans)
                    cpu, audio_s = cpu + spent, audio_s + len(audio) / 16000
            # Other voices alone are speech, rightly found: nothing to report for them.
            idle = "-" if voices_db is not None else f"{noise_alone(snr, room, options.for_rate(8000 if args.phone else 16000), args.endpoint_ms, model, args.phone, args.gain_db):.1f}"
            d = total["delays"]
            print(f"| {cond} | {detector} | {pct(d, 0.5):.2f} / {pct(d, 0.95):.2f} | {total['own']}/{total['n']} | {total['utterances']} | {total['clipped']} | {total['false']} | {idle} | {cpu / audio_s:.4f} |")


def noise_alone(snr: float | None, room: bool, options: VadOptions, endpoint_ms: int, model: SileroModel, phone: bool = False, gain_db: float = 0.0) -> float:
    """Seconds held in utterances over 60 s of the condition's background alone (LibriVox's speech level)."""
    if snr is None and not room:
        return 0.0
    audio = load_channels("librivox_16k.s16le")[0]
    level = speech_level(audio, MANIFEST["librivox_16k.s16le"]["spans"][0])
    db = snr if snr is not None else ROOM_TONE_DB
    noise = pink_noise(60 * 16000, 99) * level * 10 ** (-db / 20)
    if phone:
        noise = phone_line([noise])[1][0]
    utts, _ = utterances(with_gain(noise, gain_db), options, endpoint_ms, model)
    return sum(u[1] - u[0] for u in utts) / 16000


if __name__ == "__main__":
    main()
