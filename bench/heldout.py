"""Recordings the decoding rules were never tuned on, for the benches' ``--fixture-dir``.

    python bench/heldout.py /tmp/heldout
    python bench/replay_bench.py --fixture-dir /tmp/heldout --fixtures all --offline [--noise-db 20 | --room]
    python bench/stream_bench.py --fixture-dir /tmp/heldout --fixtures all [--noise-db 20 | --room]

Every rule of the two passes (endpoints, splits, votes, the merge) was measured on the
fixtures in tests/audio_fixtures, so those figures flatter them. This writes three new
recordings into a folder, with a manifest of the same form as the fixtures': new
sentences (a meeting with figures and dates, a caller rebooking a flight, a fast
narration), other espeak-ng voices and rates, and pauses drawn from a fixed list that
includes the short ones of continuous speech. They are synthetic voices, so Whisper hears
them worse than people; compare the passes with offline transcription of the same audio
(``--offline``), not with the fixtures' figures. Needs ``espeak-ng`` (Debian: ``apt-get
install espeak-ng``); the same on every run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "audio_fixtures"))

from make_fixtures import assemble, espeak, g711, trim, write_pcm  # noqa: E402

MEETING = [
    "Good morning everyone, and welcome to the quarterly planning review.",
    "Before we begin, please make sure your microphones are muted.",
    "Last quarter we shipped three major releases and closed two hundred tickets.",
    "The new billing system went live on the fourteenth of March.",
    "Customer complaints dropped by almost forty percent after the change.",
    "However, the mobile application is still slower than we would like.",
    "Sarah will walk us through the performance numbers in a moment.",
    "Does anyone have questions before we move on?",
    "Our budget for the next six months is roughly one point two million dollars.",
    "Most of it goes to hiring engineers and upgrading the data center.",
    "We also plan to open a small office in Denver next spring.",
    "Thanks again for your hard work, and let's make this quarter count.",
]
CALLER = [
    "My flight was cancelled and I need to rebook for tomorrow.",
    "The confirmation number is seven four two nine.",
    "Can you put me on the earliest flight to Chicago?",
    "A window seat would be nice, but an aisle is fine too.",
    "Please send the new ticket to my email address.",
    "Thank you so much for your help today.",
]
NARRATION = [
    "The lighthouse stood on a narrow rock at the mouth of the harbor.",
    "Every evening the keeper climbed one hundred and twelve steps to light the lamp.",
    "In winter the storms came from the north and shook the windows of the tower.",
    "Ships that passed at night could see the beam from twenty miles away.",
    "Nobody in the village remembered a year without the light.",
    "When the keeper grew old, his daughter took over the work.",
    "She kept a logbook of every ship, every storm and every visitor.",
    "Today the tower is a museum, and the logbook lies open in a glass case.",
]
# (file, sentences, sample rate, espeak-ng voice, words per minute, pause after each sentence in seconds)
RECORDINGS = [
    ("heldout_meeting_16k.wav", MEETING, 16000, "en-us+m3", 170, [0.35, 0.9, 0.3, 1.4, 0.4, 0.6, 2.2, 0.3, 0.5, 1.0, 0.45]),
    ("heldout_call_8k.mulaw", CALLER, 8000, "en-gb-x-rp+f2", 150, [1.1, 0.4, 0.8, 0.3, 1.6]),
    ("heldout_narration_16k.s16le", NARRATION, 16000, "en-us+f3", 185, [0.25, 0.4, 0.2, 0.6, 0.3, 0.2, 0.5]),
]


def write(out: Path, name: str, audio: np.ndarray, rate: int) -> str:
    """Write ``audio`` as ``name``'s extension says; the manifest's encoding for it."""
    if name.endswith(".wav"):
        write_pcm(out / name, audio, rate, "pcm_s16le", "wav")
        return "wav"
    if name.endswith(".mulaw"):
        (out / name).write_bytes(g711(audio, "pcm_mulaw"))
        return "mulaw"
    (out / name).write_bytes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return "pcm_s16le"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="folder to write the recordings and their manifest.json into")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name, sentences, rate, voice, wpm, pauses in RECORDINGS:
        clips = [trim(espeak(sentence, rate, voice, wpm), rate) for sentence in sentences]
        audio, spans = assemble(clips, rate, [*pauses, 1.0], lead_s=0.6)
        encoding = write(args.out, name, audio, rate)
        manifest[name] = {"encoding": encoding, "sample_rate": rate, "channels": 1, "references": [sentences], "spans": [spans],
                          "source": f"espeak-ng {voice} {wpm} wpm (bench/heldout.py)"}
        print(f"{name}: {len(audio) / rate:.1f} s, {len(sentences)} sentences", flush=True)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
