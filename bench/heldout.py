"""Recordings the decoding rules were never tuned on, for the benches' ``--fixture-dir``.

    python bench/heldout.py /tmp/heldout
    python bench/heldout.py --set 2 /tmp/heldout2
    python bench/heldout.py --set 3 /tmp/heldout3
    python bench/heldout.py --set 4 /tmp/heldout4
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
install espeak-ng``); the same on every run with the same espeak-ng, whose version each
recording's ``source`` in the manifest names (another build speaks the same sentences
differently: compare figures only on sets written by one).

``--set 2`` writes three more (a stand-up, a support call at 8 kHz, a recipe read fast), with
other voices again, made when the first three had been measured on for ten sessions.
``--set 3`` writes three more (a lecture, a clinic call at 8 kHz in A-law, a news bulletin),
made in the forty-first session to check the rules tuned on the first six: no rule or
option has been chosen by its figures (that session judged one change of the pass windows on
the 27 replays and on set 3's nine, and kept none: docs/benchmarks.md).
``--set 4`` writes three more (a podcast host, a depot's call at 8 kHz in mu-law, a museum tour
read at 200 words a minute), made in the forty-second session once set 3 had judged a change.
That session judged one change on its nine replays before any other (a pass window keeping a
noisy pause's audio; not kept: docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
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
STANDUP = [
    "Yesterday I finished the migration script for the orders table.",
    "It took longer than expected because of the old date formats.",
    "Today I want to review the pull request from Daniel.",
    "After lunch I will pair with Priya on the search feature.",
    "There is one blocker: the staging server ran out of disk space again.",
    "Could someone from operations take a look at it this morning?",
    "Also, the release notes for version four point one are due on Friday.",
    "That's all from me, back to you Michael.",
]
SUPPORT = [
    "Hello, I'm calling about a charge on my credit card.",
    "It says fifty nine dollars and ninety nine cents from your company.",
    "I never signed up for a monthly subscription.",
    "My account number is three three eight one five.",
    "I would like a full refund, please.",
    "Yes, I can hold while you check.",
    "Great, and how long will the refund take?",
]
RECIPE = [
    "First, heat two tablespoons of olive oil in a large pan.",
    "Add the chopped onion and cook it until it turns soft and golden.",
    "Then stir in the garlic, the tomatoes and a pinch of salt.",
    "Let the sauce simmer for about twenty minutes.",
    "Meanwhile, bring a big pot of water to the boil for the pasta.",
    "When the pasta is ready, drain it and mix it with the sauce.",
    "Serve it with fresh basil and plenty of grated cheese.",
]
LECTURE = [
    "Today we will look at how glaciers shape the valleys they move through.",
    "A glacier is a river of ice that flows downhill under its own weight.",
    "As it moves, it picks up rocks and drags them along the ground beneath it.",
    "Over thousands of years this grinding turns a narrow valley into a wide U shape.",
    "You can still see the scratches on bare rock in the mountains of Norway.",
    "When the climate warms, the ice melts back and leaves long ridges of gravel.",
    "These ridges are called moraines, and they mark where the glacier once ended.",
    "Some lakes in Scotland formed behind moraines after the last ice age.",
    "For next week, please read chapter seven and answer the first four questions.",
    "If anything is unclear, send me an email before Thursday evening.",
]
CLINIC = [
    "Good afternoon, this is the Riverside medical clinic.",
    "I'm calling to confirm your appointment with doctor Evans.",
    "It is booked for Monday the ninth at half past ten.",
    "Please bring your insurance card and a list of your medicines.",
    "If you need to cancel, call us at least one day before.",
    "Have a good day, and we will see you next week.",
]
BULLETIN = [
    "Heavy rain caused flooding in several northern towns overnight.",
    "Firefighters rescued a family of four from the roof of their house.",
    "The river is expected to reach its highest level by Wednesday morning.",
    "Meanwhile, the city council approved a new plan for cycle lanes.",
    "Work on the first section will start in April and cost eight million pounds.",
    "In sport, the local team won their third match in a row on Saturday.",
    "And finally, the weather will turn colder with snow on the hills.",
]
PODCAST = [
    "Welcome back to the show, where we talk about small businesses and the people who run them.",
    "My guest today opened a bicycle repair shop eleven years ago with two thousand dollars.",
    "She started in a garage behind her parents' house and fixed bikes for the neighbours.",
    "By the third year she had four employees and a waiting list of two weeks.",
    "The hardest part, she says, was learning to say no to work she could not finish on time.",
    "Last autumn the shop moved to a bigger building next to the railway station.",
    "It now sells used bikes too, and runs a free class on Saturday mornings.",
    "We will hear from her right after this short break.",
]
DISPATCH = [
    "Hi, this is Maria from the depot, calling about your delivery.",
    "The driver tried to drop off three boxes at your address this morning.",
    "Nobody answered the door, so the parcels went back to the warehouse.",
    "We can bring them again on Thursday between eight and noon.",
    "Or you can pick them up yourself at gate number sixteen.",
    "Please have your order number ready, it starts with K L nine.",
    "Call us back on this number if neither option works for you.",
]
TOUR = [
    "This hall holds paintings from the sixteenth and seventeenth centuries.",
    "The large picture on your left shows a harbour at sunset, painted in fifteen ninety.",
    "Look closely and you will see a small dog sleeping on the steps.",
    "The artist hid a dog in almost every picture he made.",
    "Nobody knows why, but visitors love to search for them.",
    "In the next room there are maps drawn by sailors who crossed the Atlantic.",
    "Please do not touch the glass, and keep your bags in front of you.",
    "We will stop for twenty minutes at the cafe on the second floor.",
]
# (file, sentences, sample rate, espeak-ng voice, words per minute, pause after each sentence in seconds)
RECORDINGS = [
    ("heldout_meeting_16k.wav", MEETING, 16000, "en-us+m3", 170, [0.35, 0.9, 0.3, 1.4, 0.4, 0.6, 2.2, 0.3, 0.5, 1.0, 0.45]),
    ("heldout_call_8k.mulaw", CALLER, 8000, "en-gb-x-rp+f2", 150, [1.1, 0.4, 0.8, 0.3, 1.6]),
    ("heldout_narration_16k.s16le", NARRATION, 16000, "en-us+f3", 185, [0.25, 0.4, 0.2, 0.6, 0.3, 0.2, 0.5]),
]
SECOND = [
    ("ho2_standup_16k.wav", STANDUP, 16000, "en-us+m7", 165, [0.5, 1.8, 0.35, 0.7, 0.3, 2.6, 0.45]),
    ("ho2_support_8k.mulaw", SUPPORT, 8000, "en-gb-scotland+f4", 155, [0.6, 1.2, 0.35, 2.0, 0.9, 0.4]),
    ("ho2_recipe_16k.s16le", RECIPE, 16000, "en-029+m2", 180, [0.3, 0.25, 0.8, 0.35, 0.5, 0.3]),
]
THIRD = [
    ("ho3_lecture_16k.wav", LECTURE, 16000, "en-gb-x-gbclan+m4", 160, [0.8, 0.3, 1.5, 0.4, 0.25, 0.9, 2.4, 0.5, 0.35]),
    ("ho3_clinic_8k.alaw", CLINIC, 8000, "en-us-nyc+f5", 160, [0.45, 0.7, 0.3, 1.3, 0.5]),
    ("ho3_bulletin_16k.s16le", BULLETIN, 16000, "en-gb-x-gbcwmd+m1", 190, [0.4, 0.3, 0.9, 0.25, 0.6, 0.35]),
]
FOURTH = [
    ("ho4_podcast_16k.wav", PODCAST, 16000, "en-gb+m5", 175, [0.5, 0.3, 1.2, 0.4, 2.0, 0.35, 0.7]),
    ("ho4_dispatch_8k.mulaw", DISPATCH, 8000, "en-029+f2", 145, [0.9, 0.35, 1.5, 0.5, 0.3, 0.8]),
    ("ho4_tour_16k.s16le", TOUR, 16000, "en-us+f4", 200, [0.3, 0.6, 0.25, 1.1, 0.4, 0.3, 0.7]),
]
SETS = {1: RECORDINGS, 2: SECOND, 3: THIRD, 4: FOURTH}


def write(out: Path, name: str, audio: np.ndarray, rate: int) -> str:
    """Write ``audio`` as ``name``'s extension says; the manifest's encoding for it."""
    if name.endswith(".wav"):
        write_pcm(out / name, audio, rate, "pcm_s16le", "wav")
        return "wav"
    if name.endswith((".mulaw", ".alaw")):
        encoding = name.rsplit(".", 1)[1]
        (out / name).write_bytes(g711(audio, f"pcm_{encoding}"))
        return encoding
    (out / name).write_bytes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return "pcm_s16le"


def espeak_version() -> str:
    """The installed espeak-ng's version ("1.51"), as its ``--version`` line gives it."""
    line = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"text-to-speech:\s*(\S+)", line)
    return found.group(1) if found else line.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="folder to write the recordings and their manifest.json into")
    ap.add_argument("--set", type=int, choices=sorted(SETS), default=1,
                    help="which three recordings (2, 3 and 4: made later, for more looks)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    version = espeak_version()
    for name, sentences, rate, voice, wpm, pauses in SETS[args.set]:
        clips = [trim(espeak(sentence, rate, voice, wpm), rate) for sentence in sentences]
        audio, spans = assemble(clips, rate, [*pauses, 1.0], lead_s=0.6)
        encoding = write(args.out, name, audio, rate)
        manifest[name] = {"encoding": encoding, "sample_rate": rate, "channels": 1, "references": [sentences], "spans": [spans],
                          "source": f"espeak-ng {version} {voice} {wpm} wpm (bench/heldout.py)"}
        print(f"{name}: {len(audio) / rate:.1f} s, {len(sentences)} sentences", flush=True)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
