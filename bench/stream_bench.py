"""Single-stream benchmark: replay fixtures at real-time pace through a real server.

    python bench/stream_bench.py [--runs 1] [--fixtures a,b,...] [--noise-db 20] [--room] [--phone] [--gain-db -30] [--revisions false] [--split-after-s 0]
                                 [--fast-reader] [--interim-results false]

Starts ``asr-server`` as a subprocess on a free loopback port with the embedded
model, streams each fixture at real-time pace (one stream at a time), and
reports per fixture and overall:

* final latency: each sentence's first final's arrival minus where its speech ends in the
  audio itself (the last frame within 30 dB of the sentence's loudest: room tone and
  breaths after it are not speech), p50/p95;
* word error rate of the first-pass finals, of the transcript after revisions (the
  context pass), and of faster-whisper's offline transcription of the same file with
  the same model and compute type (beam 5, computed in the same run);
* revisions per final, and the revision delay: how long the first utterance a revision
  changed had shown its first-pass text;
* the settled delay: from each final to the ``settled`` message that covered it (its text
  final for good), and how many finals only ``closed`` made final;
* time to first interim, from the start of the first sentence, and for every utterance
  begun with speech the time from where the server heard it begin to its first text (an
  interim, or its final if none came before);
* compute per audio second: the server process's CPU seconds, and the model's decode
  seconds by kind (interim, final, context; from /metrics);
* the five sentences whose finals came latest, with their text (``--json`` holds every
  sentence's latency under ``sentences``): which ones miss, not only how many.

``--noise-db N`` replays the audio with continuous pink noise N dB below its speech
level, so that pauses are not digital silence (on an 8 kHz recording, noise up to 4 kHz
only, as a phone line carries it); ``--room`` reverberates it (RT60 0.5 s,
as much reverberant as direct energy) over room tone 35 dB below the speech; ``--phone``
sends it as a telephone line delivers it (300-3400 Hz, 8 kHz G.711 mu-law, after the
noise or room, which are at the caller's end): the human recordings become telephone
speech, where the project's own 8 kHz recordings are synthetic voices; ``--gain-db -30``
turns all of it down 30 dB (16-bit samples, sent at 16 kHz), as a quiet microphone or a
far talker sends it (the recordings' speech is at -19 to -25 dBFS);
``--fast-reader`` cuts every pause in one-channel recordings to 0.12 s (it leaves the
others out), as a reader who hardly stops between sentences leaves them (only sentence
splits can then end a sentence before the reading stops; ``--interim-results false`` as
Deepgram's clients ask). Either way, the end of speech is found in the dry recording, so
a reverberant tail or noise counts as latency, as a user would feel it. Sentence spans
come from tests/audio_fixtures/manifest.json. Not a test: it prints a table (--json
writes the raw figures).
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

import numpy as np  # noqa: E402
from asr_client import stream_bytes  # noqa: E402

from tests.harness import MANIFEST, Replay, fast_reader, phone_line, replay  # noqa: E402
from tests.harness import load_channels as _load_channels  # noqa: E402
from tests.wer import errors as word_errors, normalize  # noqa: E402

DEFAULT_FIXTURES = "librivox_16k.s16le,espeak_8k.mulaw,call_8k_stereo.s16le,cards_44k.f32le,ljspeech_babylon_16k.s16le"


def start_server(compute_type: str, *extra: str) -> tuple[subprocess.Popen, int]:
    """The server on a free loopback port; its log goes to the file named by $BENCH_SERVER_LOG
    (for instance with ``--server-arg=--log-level=DEBUG``: each decode's text), else nowhere."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    log_path = os.environ.get("BENCH_SERVER_LOG")
    proc = subprocess.Popen(
        [sys.executable, "-m", "asr_server", "--port", "0", "--compute-type", compute_type, "--log-level", "WARNING", *extra],
        stdout=subprocess.PIPE, stderr=open(log_path, "w") if log_path else subprocess.DEVNULL, text=True, env=env,  # noqa: SIM115
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


def health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
        return json.loads(resp.read())


def machine_line(port: int) -> str:
    """What machine the figures come from: its processor, and the server's own measure of its speed (the
    model time of a final in a burst, timed at start-up, and the channels it admits from it). Figures of
    runs on machines whose burst final differs are not comparable."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "?")
    # /healthz, not the metrics: the gauges are set on the server's first tick, which may not have come yet.
    capacity = health(port).get("capacity")
    if capacity:
        return (f"machine: {cpu}, {os.cpu_count()} cores; a burst final takes {capacity['final_s']:.3f} model s, a context pass"
                f" {capacity['pass_s']:.3f} (the server's start-up measure: capacity {capacity['channels']} channels)")
    # A fixed --max-channels: the server measured nothing, so time one here, as the server did before it had
    # a burst copy (one call on the finals' copy beside one on the other, at the same priority): the yardstick
    # every session's figures were printed with, kept so that they stay comparable.
    from asr_server.inference.whisper import DEFAULT_MODEL, WhisperRunner, resolve_model

    cores = os.cpu_count() or 1
    runner = WhisperRunner(resolve_model(DEFAULT_MODEL), cpu_threads=1, workers=cores, final_threads=cores)
    final_s = runner.measure_burst_final(concurrent=cores)
    return f"machine: {cpu}, {os.cpu_count()} cores; a burst final takes {final_s:.3f} model s (timed by the bench as the server times it at start-up)"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then wait as long as a clean stop may take (its sessions get up to 10 s, then the
    model calls under way finish: docs/operations.md); one that takes longer is killed."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + "{") or l.startswith(name + " "))


def offline_text(audio: np.ndarray, compute_type: str, vad_filter: bool = True) -> str:
    """faster-whisper's own transcription of a whole recording (16 kHz float): beam 5, its VAD filter
    (``vad_filter=False``: every sample of ``audio`` is decoded, for audio that is speech already)."""
    from faster_whisper import WhisperModel

    from asr_server.inference.whisper import resolve_model

    global _MODEL
    if "_MODEL" not in globals():
        import ctranslate2

        # float16 runs on a GPU only: a bench of a CUDA server computes offline there too
        device = "cpu" if compute_type in {"auto", "default", *ctranslate2.get_supported_compute_types("cpu")} else "cuda"
        _MODEL = WhisperModel(resolve_model("tiny.en"), device=device, compute_type=compute_type, cpu_threads=os.cpu_count() or 1)
    segments, _ = _MODEL.transcribe(audio, language="en", beam_size=5, vad_filter=vad_filter)
    return " ".join(s.text for s in segments)


def offline_errors(name: str, channel: int, compute_type: str, audio: np.ndarray | None = None) -> tuple[int, str]:
    """Word errors of :func:`offline_text` on a fixture channel (``audio``: as streamed, noise
    included), and the text."""
    text = offline_text(load_channels(name)[channel] if audio is None else audio, compute_type)
    return word_errors(" ".join(MANIFEST[name]["references"][channel]), text)[0], text


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# speech_ends in a real recording: a frame is speech this much above the pause's median level, and the
# search for the end stops at the first run this long of quiet frames from this far before the manifest's end.
PAUSE_MARGIN_DB = 10.0
QUIET_RUN_S = 0.3
QUIET_FROM_S = 0.3


def speech_ends(audio: np.ndarray, spans: list[list[float]], floor_db: float = 30.0) -> list[float]:
    """Where each sentence's speech really ends, found in the audio itself: the end of its last
    30 ms frame within ``floor_db`` of the sentence's loudest frame (room tone and breaths after
    it are not speech), searched up to 0.6 s past the manifest's end but never into the next sentence.

    In a real recording the pause is not silence: a frame counts only if it is also
    ``PAUSE_MARGIN_DB`` above the pause's median level (a crowd, an air conditioner), and the
    search stops at the first ``QUIET_RUN_S`` of quiet from ``QUIET_FROM_S`` before the
    manifest's end on (a cut to the next scene of a news report, its background 28 dB down,
    otherwise ran the end into the next speaker). Neither moves an end of the fixtures or of
    held-out sets 1-6 (738 spans compared, ninety-third session); on set 7's real recordings
    they moved 13 of 35, by up to 2 s earlier."""
    frame = 480
    ends = []
    for k, (start, end) in enumerate(spans):
        following = spans[k + 1][0] if k + 1 < len(spans) else len(audio) / 16000
        limit = min(end + 0.6, following)
        a, b = int(start * 16000), min(len(audio), int(limit * 16000))
        db = frame_db(audio[a:b], frame)
        if not len(db):
            ends.append(end)
            continue
        pause = frame_db(audio[int(end * 16000) : int(following * 16000)], frame)
        background = float(np.median(pause)) + PAUSE_MARGIN_DB if len(pause) >= 5 else -np.inf
        loud = db > max(db.max() - floor_db, background)
        stop = first_quiet_run(loud, max(0, int((end - QUIET_FROM_S - start) * 16000) // frame), int(QUIET_RUN_S * 16000) // frame)
        heard = np.nonzero(loud[:stop])[0]
        ends.append((a + (heard[-1] + 1) * frame) / 16000 if len(heard) else end)
    return ends


def frame_db(audio: np.ndarray, frame: int) -> np.ndarray:
    """The level of each whole ``frame`` of ``audio`` in dB (full scale 1.0)."""
    n = len(audio) // frame
    rms = np.sqrt(np.mean(audio[: n * frame].reshape(n, frame).astype(np.float64) ** 2, axis=1)) + 1e-9
    return 20 * np.log10(rms)


def first_quiet_run(loud: np.ndarray, since: int, run: int) -> int:
    """The index where the first ``run`` frames in a row that are not ``loud`` begin, at ``since`` or
    later (the length of ``loud`` where there are none)."""
    quiet = 0
    for i in range(since, len(loud)):
        quiet = 0 if loud[i] else quiet + 1
        if quiet >= run:
            return i - run + 1
    return len(loud)


def pink_noise(n: int, seed: int, band_hz: float | None = None) -> np.ndarray:
    """Pink (1/f) noise at 16 kHz, unit RMS (Voss-McCartney-like sum of held random rows); with
    ``band_hz``, nothing above that frequency, as a channel sampled at twice it carries noise."""
    rng = np.random.default_rng(seed)
    rows = 16
    out = np.zeros(n)
    for k in range(rows):
        step = 2 ** k
        held = np.repeat(rng.standard_normal(n // step + 2), step)[:n]
        out += held
    out += rng.standard_normal(n)
    out = band_limited(out, band_hz)
    return (out / np.sqrt(np.mean(out**2))).astype(np.float32)


def band_limited(audio: np.ndarray, band_hz: float | None) -> np.ndarray:
    """``audio`` (16 kHz) with nothing above ``band_hz`` (None: as it is)."""
    if band_hz is None or band_hz >= 8000:
        return audio
    return band_passed(audio, 0.0, band_hz)


def band_passed(audio: np.ndarray, low_hz: float, high_hz: float) -> np.ndarray:
    """``audio`` (16 kHz) with only ``low_hz`` to ``high_hz`` left."""
    spectrum = np.fft.rfft(audio)
    freqs = np.fft.rfftfreq(len(audio), 1 / 16000)
    spectrum[(freqs < low_hz) | (freqs > high_hz)] = 0
    return np.fft.irfft(spectrum, len(audio))


def _decaying(n: int, tau_s: float, rng: np.random.Generator, low_hz: float, high_hz: float) -> np.ndarray:
    """A struck sound: band-passed noise with a 2 ms attack and an exponential decay."""
    t = np.arange(n) / 16000
    return band_passed(rng.standard_normal(n), low_hz, high_hz) * np.minimum(t / 0.002, 1) * np.exp(-t / tau_s)


def _at(n: int, pieces: list[tuple[float, np.ndarray]]) -> np.ndarray:
    out = np.zeros(n)
    for at_s, piece in pieces:
        i = int(at_s * 16000)
        out[i : i + len(piece)] += piece[: n - i]
    return out


def sound_event(kind: int, rng: np.random.Generator) -> np.ndarray:
    """One of the sounds a room makes between sentences, at 16 kHz, unit RMS over its length:
    0 a cough (two bursts), 1 typing (a dozen key clicks), 2 a phone's ringback tone, 3 a knock
    on a door (three thumps), 4 a chair scraping, 5 a notification beep."""
    t = np.arange(16000) / 16000
    if kind == 0:
        burst = lambda: _decaying(4800, 0.07, rng, 250, 3500)  # noqa: E731
        out = _at(9600, [(0.0, burst()), (0.3, burst())])
    elif kind == 1:
        out = _at(16000, [(at, _decaying(400, 0.004, rng, 1000, 7000)) for at in np.sort(rng.uniform(0, 0.97, 12))])
    elif kind == 2:
        out = (np.sin(2 * np.pi * 440 * t) + np.sin(2 * np.pi * 480 * t)) * np.minimum(np.minimum(t, t[::-1]) / 0.02, 1)
    elif kind == 3:
        out = _at(8000, [(at, _decaying(1600, 0.03, rng, 60, 600)) for at in (0.0, 0.17, 0.34)])
    elif kind == 4:
        n = 9600
        out = band_passed(rng.standard_normal(n), 800, 4000) * (0.6 + 0.4 * np.sin(2 * np.pi * 23 * t[:n])) * np.hanning(n)
    else:
        n = 4800
        out = np.sin(2 * np.pi * 1000 * t[:n]) * np.minimum(np.minimum(t[:n], t[:n][::-1]) / 0.01, 1)
    return (out / np.sqrt(np.mean(out**2))).astype(np.float32)


EVENT_KINDS = 6
EVENT_GAP_S = 1.8  # silence put after a sentence to hold a sound (with_events)
EVENT_AFTER_S = 0.65  # where the sound starts after the sentence's end


def with_events(audio: np.ndarray, spans: list[list[float]], dbfs: float, seed: int) -> tuple[np.ndarray, list[list[float]]]:
    """The recording (16 kHz, one channel) with a sound that is not speech after every other
    sentence (the first, third, ...; :func:`sound_event`, the kinds in turn) at ``dbfs`` (its RMS):
    ``EVENT_GAP_S`` of silence holding the sound is put in the pause after the sentence, the
    sound starting ``EVENT_AFTER_S`` after the sentence's end (beyond where :func:`speech_ends`
    looks for the end of its speech); and the sentences' spans where they now lie. Nothing is
    said there, so any word written there is one the talker never said."""
    rng, pieces, moved, at, shift = np.random.default_rng(seed), [], [], 0, 0.0
    for i, (start, end) in enumerate(spans):
        moved.append([start + shift, end + shift])
        if i % 2:
            continue
        following = spans[i + 1][0] if i + 1 < len(spans) else len(audio) / 16000
        cut = end + min(following - end, 0.6) / 2
        event = sound_event((i // 2) % EVENT_KINDS, rng) * np.float32(10 ** (dbfs / 20))
        inserted = np.zeros(int(EVENT_GAP_S * 16000), np.float32)
        lead = int((EVENT_AFTER_S - (cut - end)) * 16000)
        inserted[lead : lead + len(event)] = event
        pieces += [audio[at : int(cut * 16000)], inserted]
        at, shift = int(cut * 16000), shift + EVENT_GAP_S
    pieces.append(audio[at:])
    return np.clip(np.concatenate(pieces), -1, 1).astype(np.float32), moved


def use_events(name: str, dbfs: float) -> None:
    """From here on, ``name`` (one channel: :func:`one_channel`) is its :func:`with_events` version
    in this process."""
    entry = MANIFEST[name]
    audio, spans = with_events(load_channels(name)[0], entry["spans"][0], dbfs, seed=11)
    MANIFEST[name] = {**entry, "spans": [spans]}
    _DERIVED[name] = [audio]


def reverberate(audio: np.ndarray, rt60_s: float, seed: int) -> np.ndarray:
    """A room's reverberation: the dry signal plus a tail of exponentially decaying noise
    (60 dB down after ``rt60_s``) carrying as much energy as the direct sound, as at 1-2 m
    from a talker in a meeting room."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rt60_s * 16000)) / 16000
    tail = rng.standard_normal(len(t)) * np.exp(-6.9 * t / rt60_s)
    tail[: 16 * 5] = 0  # the first reflections arrive after ~5 ms
    ir = np.concatenate([[1.0], tail[1:] / np.sqrt(np.sum(tail**2))])
    size = 1 << int(np.ceil(np.log2(len(audio) + len(ir))))
    wet = np.fft.irfft(np.fft.rfft(audio, size) * np.fft.rfft(ir, size), size)[: len(audio)]
    return (wet / np.sqrt(2)).astype(np.float32)


def voices(n: int, seed: int, band_hz: float | None = None, talkers: int = 3) -> np.ndarray:
    """Other people talking in the background, unit RMS at 16 kHz: ``talkers`` voices, each one of
    the project's two human recordings (LibriVox, LJ Speech) played backwards from a random point
    and looped; with ``band_hz``, nothing above it (see :func:`pink_noise`). Backwards speech keeps
    what a voice-activity detector hears as speech (Silero gives it about what it gives forwards:
    in a speaker's pauses, with one voice 20 dB under them, a median of 0.64-0.83 backwards and
    0.66-0.91 forwards) and carries no words a model could transcribe, so the WER still measures
    the speaker's words."""
    rng = np.random.default_rng(seed)
    out = np.zeros(n)
    for k in range(talkers):
        source = _load_channels(("librivox_16k.s16le", "ljspeech_babylon_16k.s16le")[k % 2])[0][::-1].astype(np.float64)
        looped = np.tile(np.roll(source, int(rng.integers(len(source)))), n // len(source) + 1)[:n]
        out += looped / np.sqrt(np.mean(looped**2))
    out = band_limited(out, band_hz)
    return (out / np.sqrt(np.mean(out**2))).astype(np.float32)


def speech_level(audio: np.ndarray, spans: list[list[float]]) -> float:
    speech = np.concatenate([audio[int(a * 16000) : int(b * 16000)] for a, b in spans])
    return float(np.sqrt(np.mean(speech.astype(np.float64) ** 2)))


_DERIVED: dict[str, list[np.ndarray]] = {}  # recordings replaced in this process (--fast-reader)


_ADDED: list[str] = []  # the recordings use_fixture_dir added


def use_fixture_dir(folder: Path | None) -> None:
    """From here on, the recordings in ``folder`` and its manifest.json (of the form of
    tests/audio_fixtures/manifest.json; ``bench/heldout.py`` writes one) are fixtures too."""
    if folder is None:
        return
    entries = json.loads((folder / "manifest.json").read_text())
    MANIFEST.update({name: {**entry, "path": str(folder / name)} for name, entry in entries.items()})
    _ADDED.extend(entries)


def fixture_names(arg: str) -> list[str]:
    """The ``--fixtures`` list; ``all``: every recording ``--fixture-dir`` added."""
    return list(_ADDED) if arg == "all" else arg.split(",")


def one_channel(names: list[str], flag: str = "--fast-reader") -> list[str]:
    """``--fast-reader``'s (or ``flag``'s) recordings: those of one channel (a call's channels would
    fall out of step); the others are left out, and said so."""
    kept = [n for n in names if MANIFEST[n]["channels"] == 1]
    if len(kept) < len(names):
        left = ", ".join(n for n in names if n not in kept)
        print(f"{flag}: one-channel recordings only; left out {left}", file=sys.stderr)
    if not kept:
        raise SystemExit(f"{flag} needs one-channel recordings")
    return kept


def use_fast_reader(name: str) -> None:
    """From here on, ``name`` (one channel: :func:`one_channel`) is its :func:`fast_reader` version in
    this process."""
    entry = MANIFEST[name]
    audio, spans = fast_reader(load_channels(name)[0], entry["spans"][0])
    MANIFEST[name] = {**entry, "spans": [spans]}
    _DERIVED[name] = [audio]


def load_channels(name: str) -> list[np.ndarray]:
    return _DERIVED[name] if name in _DERIVED else _load_channels(name)


ROOM_TONE_DB = 35.0  # a quiet meeting room's hum and air, below the talker's speech level


def with_gain(audio: np.ndarray, gain_db: float) -> np.ndarray:
    """``audio`` turned up or down by ``gain_db``, in the steps of 16-bit samples (0: as it is)."""
    if not gain_db:
        return np.asarray(audio, np.float32)
    return (np.round(np.clip(audio * 10 ** (gain_db / 20), -1, 1) * 32767) / 32767).astype(np.float32)


def far_sentences(audio: np.ndarray, spans: list[list[float]], far_db: float) -> np.ndarray:
    """``audio`` with every other sentence (the second, fourth, ...) turned down ``far_db``: a second
    talker that far from the microphone, as in a meeting room. Each such sentence is turned down from
    halfway through the pause before it to halfway through the pause after it."""
    out = audio.astype(np.float32).copy()
    edges = [0.0] + [(a[1] + b[0]) / 2 for a, b in zip(spans, spans[1:])] + [len(audio) / 16000]
    for i in range(1, len(spans), 2):
        out[int(edges[i] * 16000) : int(edges[i + 1] * 16000)] *= np.float32(10 ** (-far_db / 20))
    return out


def noisy_pcm(name: str, snr_db: float | None, room: bool = False, phone: bool = False,
              voices_db: float | None = None, gain_db: float = 0.0, far_db: float | None = None) -> tuple[bytes, list[np.ndarray]]:
    """The fixture at 16 kHz as s16le: with ``far_db``, every other sentence that far down first
    (:func:`far_sentences`); with ``room``, reverberated (RT60 0.5 s) over room tone
    ``ROOM_TONE_DB`` below its speech level; with ``snr_db``, continuous pink noise that far below it;
    with ``voices_db``, other people talking (:func:`voices`) that far below it; then all of it
    turned down (or up) by ``gain_db``, as a quiet microphone or a far talker delivers it.
    With ``phone``, the bytes are what a telephone line delivers instead
    (:func:`tests.harness.phone_line`: 8 kHz G.711 mu-law), and the arrays that audio as the
    server decodes it, at 16 kHz.

    The noise and room tone of a recording sampled below 16 kHz (the 8 kHz telephone ones) stop
    at half its rate, as its speech does: a caller's noise reaches the server through the same
    line. (Until 2026-11-24 they were full band: noise at 4-8 kHz that no phone line carries.)"""
    mixed = []
    band = MANIFEST[name]["sample_rate"] / 2
    for ch, audio in enumerate(load_channels(name)):
        level = speech_level(audio, MANIFEST[name]["spans"][ch])
        if far_db is not None:
            audio = far_sentences(audio, MANIFEST[name]["spans"][ch], far_db)
        if room:
            audio = reverberate(audio, 0.5, 5 + ch) + pink_noise(len(audio), 21 + ch, band) * level * 10 ** (-ROOM_TONE_DB / 20)
        if snr_db is not None:
            audio = audio + pink_noise(len(audio), 11 + ch, band) * level * 10 ** (-snr_db / 20)
        if voices_db is not None:
            audio = audio + voices(len(audio), 31 + ch, band) * level * 10 ** (-voices_db / 20)
        mixed.append(with_gain(np.clip(audio, -1, 1), gain_db))
    if phone:
        return phone_line(mixed)
    planar = np.stack(mixed)
    return (planar.T.reshape(-1) * 32767).astype("<i2").tobytes(), mixed


def wire_rate(name: str, snr_db: float | None, room: bool = False, phone: bool = False, voices_db: float | None = None, gain_db: float = 0.0,
              far_db: float | None = None) -> int:
    """The sample rate the benches stream a recording at (the server's VAD treats 8 kHz streams
    as telephone audio): its own clean, 16 kHz with noise, room, gain or a far talker, 8 kHz over a phone line."""
    if phone:
        return 8000
    return 16000 if snr_db is not None or room or voices_db is not None or gain_db or far_db is not None else MANIFEST[name]["sample_rate"]


async def replay_noisy(url: str, name: str, snr_db: float | None, room: bool = False, phone: bool = False,
                       voices_db: float | None = None, gain_db: float = 0.0, **options) -> tuple[Replay, list[np.ndarray]]:
    data, mixed = noisy_pcm(name, snr_db, room, phone, voices_db, gain_db)
    n = len(mixed)
    result = Replay(name)
    wire = {"encoding": "mulaw", "sample_rate": 8000} if phone else {"encoding": "pcm_s16le", "sample_rate": 16000}
    async for item in stream_bytes(url, data, bytes_per_second=(8000 if phone else 32000) * n, realtime=True, channels=n, **wire, **options):
        result.messages.append(item)
    return result, mixed


def final_latencies(r: Replay, ch: int, ends: list[float]) -> list[float | None]:
    """Per sentence: the first final covering its end, minus where its speech ended (None where
    no final covered it; see :func:`sentence_latencies`)."""
    finals = [(t.at, t.message["start"], t.message["end"]) for t in r.of_type("final") if t.message["channel"] == ch and t.message["text"]]
    return sentence_latencies(finals, ends)


def covering_latencies(finals: list[tuple[float, float, float]], ends: list[float]) -> list[float]:
    """The latencies of :func:`sentence_latencies` that a final covered."""
    return [lat for lat in sentence_latencies(finals, ends) if lat is not None]


def sentence_latencies(finals: list[tuple[float, float, float]], ends: list[float]) -> list[float | None]:
    """Per sentence end: when the first final (came at, its start, its end; seconds) that covers
    it came, minus that end (a final covers it if it starts before it and ends at most 0.6 s
    short of it: word timing is rough); None where no final covers it."""
    out: list[float | None] = []
    for end in ends:
        match = next((at for at, start, stop in finals if stop >= end - 0.6 and start <= end), None)
        out.append(None if match is None else match - end)
    return out


def first_changes(r: Replay, ch: int) -> list[tuple[float, float]]:
    """Per utterance of channel ``ch`` that a revision changed (the revision's ``changed`` names
    them): when its final came (seconds into the stream) and how long until the first revision
    that changed it."""
    shown = {t.message["utterance"]: t.at for t in r.of_type("final") if t.message["channel"] == ch}
    seen: dict[int, tuple[float, float]] = {}
    for t in r.of_type("revision"):
        if t.message["channel"] == ch:
            for u in t.message.get("changed", [t.message["utterances"][0]]):
                seen.setdefault(u, (shown[u], t.at - shown[u]))
    return list(seen.values())


def revision_delays(r: Replay, ch: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """How long finals showed words a revision then changed: per utterance, from its final to
    the first revision that changed it (how far the second pass lags); apart, from its final to
    each later revision that changed it again (a later pass outvoted an earlier one). The
    revision's ``changed`` names the utterances it changed. Third, as measured before the
    server named them (2026-11-27): per revision, from the final of its first utterance, counted
    as "again" only where that was another revision's first (so a later change of an utterance
    an earlier revision had changed in its middle counted as a first revision). Fourth, the
    first of those (per utterance) that a context pass sent (``pass``: not a settle decode, which
    by design comes 15-40 s later, and only while the server has time to spare)."""
    shown = {t.message["utterance"]: t.at for t in r.of_type("final") if t.message["channel"] == ch}
    again: list[float] = []
    per_revision: list[float] = []
    by_passes: list[float] = []
    revised: set[int] = set()
    firsts: set[int] = set()
    for t in r.of_type("revision"):
        if t.message["channel"] != ch:
            continue
        lo = t.message["utterances"][0]
        if lo not in firsts:
            per_revision.append(t.at - shown[lo])
        firsts.add(lo)
        for u in t.message.get("changed", [lo]):
            if u not in revised and t.message.get("pass", "context") == "context":
                by_passes.append(t.at - shown[u])
            if u in revised:
                again.append(t.at - shown[u])
            revised.add(u)
    return [delay for _at, delay in first_changes(r, ch)], again, per_revision, by_passes


def settled_delays(r: Replay, ch: int) -> tuple[list[float], int]:
    """Per non-empty final: seconds from it to the ``settled`` message that covers it (its text
    final for good); and how many finals no such message covered before ``closed`` (made final
    by the close)."""
    pending = [(t.message["utterance"], t.at) for t in r.of_type("final") if t.message["channel"] == ch and t.message["text"]]
    delays: list[float] = []
    for t in r.of_type("settled"):
        if t.message["channel"] == ch:
            delays += [t.at - at for u, at in pending if u <= t.message["utterance"]]
            pending = [(u, at) for u, at in pending if u > t.message["utterance"]]
    return delays, len(pending)


def text_lags(r: Replay) -> list[float]:
    """Per utterance that began with speech (a ``speech_start``; not one that a sentence split or a
    length cut continued, whose words were on screen already): seconds from where the server
    heard the speech begin to the first text of it the client got, an interim or its final."""
    began = {(t.message["channel"], t.message["utterance"]): t.message["at"] for t in r.of_type("speech_start")}
    shown: dict[tuple[int, int], float] = {}
    for t in r.messages:
        if t.message.get("type") in ("interim", "final") and t.message.get("text"):
            shown.setdefault((t.message["channel"], t.message["utterance"]), t.at)
    return [shown[k] - at for k, at in began.items() if k in shown]


def lag_buckets(port: int) -> dict[float, float]:
    """The server's asr_context_lag_seconds histogram so far: upper bound -> cumulative count."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {float(m.group(1)): float(m.group(2)) for m in re.finditer(r'^asr_context_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)}


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """Quantile ``q`` of what a histogram counted between two reads, interpolated within a
    bucket as Prometheus's histogram_quantile does (nan when it counted nothing)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return float("nan")
    rank, low, below = q * counts[-1], 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank:
            if bound == float("inf"):
                return low
            return low + (bound - low) * (rank - below) / (count - below) if count > below else bound
        low, below = bound, count
    return low  # (not reached: the +Inf bucket holds every count)


def model_seconds(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if m := re.match(r'asr_decode_seconds_sum\{kind="(\w+)"\} (\S+)', line):
            out[m.group(1)] = float(m.group(2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--fixtures", default=DEFAULT_FIXTURES, help="comma-separated names in the manifest, or all")
    ap.add_argument("--fixture-dir", type=Path, default=None, help="recordings and manifest.json from this folder (bench/heldout.py writes one)")
    ap.add_argument("--compute-type", default="auto")
    ap.add_argument("--noise-db", type=float, default=None, help="add continuous pink noise this many dB below the speech (raw 16 kHz replay)")
    ap.add_argument("--events-dbfs", type=float, default=None, help="one-channel recordings with a sound that is not speech (a cough, typing, a ringback tone, a knock, "
                    "a chair, a beep) at this level (dBFS) in 1.8 s put after every other sentence (raw 16 kHz replay)")
    ap.add_argument("--room", action="store_true", help="reverberate the audio (RT60 0.5 s) over room tone 35 dB below the speech")
    ap.add_argument("--phone", action="store_true", help="send the audio as a phone line carries it: 300-3400 Hz, 8 kHz mu-law")
    ap.add_argument("--voices-db", type=float, default=None, help="add three other people talking (backwards: no words) this many dB below the speech")
    ap.add_argument("--gain-db", type=float, default=0.0, help="turn the audio down (negative) or up this much, as a quiet microphone or a far talker sends it (raw 16 kHz replay)")
    ap.add_argument("--revisions", default="true", help="the stream option (true/false)")
    ap.add_argument("--split-after-s", default=None, help="the stream option (default: the server's)")
    ap.add_argument("--fast-reader", action="store_true", help="every pause in the (one-channel) recordings cut to 0.12 s, as a fast reader leaves")
    ap.add_argument("--interim-results", default="true", help="the stream option (true/false; Deepgram's clients ask for false)")
    ap.add_argument("--json", help="write raw figures here")
    ap.add_argument("--messages", default=None, help="append every stream's messages to this file (JSON lines, with the seconds into the stream each came)")
    ap.add_argument("--server-arg", action="append", default=[], help="more arguments for the server (repeatable), e.g. --server-arg=--final-encoder-pad-s=15")
    args = ap.parse_args()
    use_fixture_dir(args.fixture_dir)
    names = fixture_names(args.fixtures)
    stream_options = {"revisions": args.revisions, "interim_results": args.interim_results}
    if args.split_after_s is not None:
        stream_options["split_after_s"] = args.split_after_s

    if args.fast_reader:
        names = one_channel(names)
        for name in names:
            use_fast_reader(name)
    if args.events_dbfs is not None:
        names = one_channel(names, "--events-dbfs")
        for name in names:
            use_events(name, args.events_dbfs)
    proc, port = start_server(args.compute_type, *args.server_arg)
    try:
        print(machine_line(port), flush=True)
    except BaseException:  # stop the server: a crash here left one running
        stop_server(proc)
        raise
    url = f"ws://127.0.0.1:{port}"
    rows, latencies, first_interims, delays, again, per_revision, by_passes = [], [], [], [], [], [], []
    settled: tuple[list[float], list[int]] = ([], [])  # delays to each final's settled message; finals only the close made final
    slow: list[tuple[float, str]] = []  # per sentence a final covered: (latency, which)
    text_lag: list[float] = []  # per utterance begun with speech: to its first text (see text_lags)
    by_fixture: dict[str, list[float]] = {}
    texts: dict[str, dict[str, str]] = {}  # per fixture channel: the reference, what the client held, and offline's text
    totals = {"first": 0, "refined": 0, "offline": 0, "words": 0, "finals": 0, "revisions": 0}
    audio_s = 0.0
    cpu0, model0, lag0 = cpu_seconds(proc.pid), model_seconds(port), lag_buckets(port)
    try:
        for name in names:
            entry = MANIFEST[name]
            for run in range(args.runs):
                dry = list(load_channels(name))
                if args.noise_db is None and args.voices_db is None and not args.room and not args.phone and not args.fast_reader and args.events_dbfs is None and not args.gain_db:
                    r = asyncio.run(replay(url, name, realtime=True, **stream_options))
                    heard = dry
                else:
                    r, heard = asyncio.run(replay_noisy(url, name, args.noise_db, args.room, args.phone, args.voices_db, args.gain_db, **stream_options))
                if args.messages:
                    with open(args.messages, "a", encoding="utf-8") as out:
                        out.writelines(json.dumps({"fixture": name, "run": run, "at": round(t.at, 3), "message": t.message}) + "\n" for t in r.messages)
                audio_s += r.of_type("closed")[0].message["audio_received_s"]
                refined = r.transcript()
                for ch in range(entry["channels"]):
                    per_sentence = final_latencies(r, ch, speech_ends(dry[ch], entry["spans"][ch]))
                    found = [lat for lat in per_sentence if lat is not None]
                    latencies.extend(found)
                    slow.extend((lat, f"{name} ch{ch} #{k + 1}: {sentence}")
                                for k, (lat, sentence) in enumerate(zip(per_sentence, entry["references"][ch])) if lat is not None)
                    by_fixture.setdefault(f"{name} ch{ch}", []).extend(found)
                    first_delays, again_delays, revision_firsts, pass_delays = revision_delays(r, ch)
                    by_passes.extend(pass_delays)
                    delays.extend(first_delays)
                    again.extend(again_delays)
                    per_revision.extend(revision_firsts)
                    settle_delays, unsettled = settled_delays(r, ch)
                    settled[0].extend(settle_delays)
                    settled[1].append(unsettled)
                    if run:
                        continue
                    said = " ".join(entry["references"][ch])
                    ref = normalize(said)
                    first, better = word_errors(said, r.final_text(ch))[0], word_errors(said, refined.final_text(ch))[0]
                    offline, offline_said = offline_errors(name, ch, args.compute_type, heard[ch])
                    rows.append((f"{name} ch{ch}", first / len(ref), better / len(ref), offline / len(ref)))
                    texts[f"{name} ch{ch}"] = {"reference": " ".join(ref), "first": r.final_text(ch), "revised": refined.final_text(ch), "offline": offline_said}
                    for key, value in (("first", first), ("refined", better), ("offline", offline), ("words", len(ref))):
                        totals[key] += value
                totals["finals"] += sum(1 for t in r.of_type("final") if t.message["text"])
                totals["revisions"] += len(r.of_type("revision"))
                interims = r.of_type("interim")
                if interims:
                    first_interims.append(interims[0].at - min(s for spans in entry["spans"] for s, _ in spans))
                text_lag += text_lags(r)
        cpu = cpu_seconds(proc.pid) - cpu0
        model1, lag1 = model_seconds(port), lag_buckets(port)
    finally:
        stop_server(proc)
    rows = [(*row, by_fixture.get(row[0], [])) for row in rows]
    lag = (bucket_quantile(lag0, lag1, 0.5), bucket_quantile(lag0, lag1, 0.95))
    report(args, rows, totals, latencies, (first_interims, text_lag), (delays, again, per_revision, by_passes, settled), lag, cpu, audio_s, {k: model1.get(k, 0.0) - model0.get(k, 0.0) for k in model1}, texts, slow)


def report(args, rows, totals, latencies, interim_figures, revision_delays, context_lag, cpu, audio_s, model, texts, slow) -> None:
    first_interims, text_lag = interim_figures
    delays, again, per_revision, by_passes, (settle_delays, unsettled) = revision_delays
    noise = f", pink noise {args.noise_db:g} dB below speech" if args.noise_db is not None else ""
    noise += ", reverberant room (RT60 0.5 s) with room tone 35 dB below speech" if args.room else ""
    noise += f", three voices talking backwards {args.voices_db:g} dB below speech" if args.voices_db is not None else ""
    noise += ", over a phone line (300-3400 Hz, 8 kHz mu-law)" if args.phone else ""
    noise += f", turned {'down' if args.gain_db < 0 else 'up'} {abs(args.gain_db):g} dB" if args.gain_db else ""
    print(f"# single stream, real-time pace{noise}, revisions={args.revisions}, {args.runs} run(s) per fixture, tiny.en {args.compute_type}, {os.cpu_count()} cores")
    print("| fixture | WER first-pass finals | WER after revisions | WER offline | final latency p50 / p95 (s), sentences matched |")
    print("|---|---|---|---|---|")
    for label, first, refined, offline, lat in rows:
        n = len(MANIFEST[label.rsplit(" ", 1)[0]]["spans"][int(label.rsplit("ch", 1)[1])]) * args.runs
        print(f"| {label} | {first:.3f} | {refined:.3f} | {offline:.3f} | {pct(lat, 0.5):.2f} / {pct(lat, 0.95):.2f}, {len(lat)} of {n} |")
    w = totals["words"]
    print(f"| **pooled** | **{totals['first'] / w:.3f}** | **{totals['refined'] / w:.3f}** | **{totals['offline'] / w:.3f}** | {pct(latencies, 0.5):.2f} / {pct(latencies, 0.95):.2f} |")
    print()
    print(f"final latency from the end of speech found in the audio (s): p50 {pct(latencies, 0.5):.2f}, p95 {pct(latencies, 0.95):.2f}, max {max(latencies):.2f} (n={len(latencies)})")
    if first_interims:
        print(f"time to first interim (s): median {statistics.median(first_interims):.2f}, max {max(first_interims):.2f} (n={len(first_interims)})")
    if text_lag:
        print(f"first text of each utterance, from where its speech began (s): p50 {pct(text_lag, 0.5):.2f}, p95 {pct(text_lag, 0.95):.2f}, max {max(text_lag):.2f} (n={len(text_lag)})")
    print(f"revisions: {totals['revisions']} for {totals['finals']} finals; revision delay, from a final to the first revision that changed it (s): "
          f"p50 {pct(delays, 0.5):.2f}, p95 {pct(delays, 0.95):.2f} (n={len(delays)}); changed again (outvoted): p50 {pct(again, 0.5):.2f} (n={len(again)}); "
          f"per revision from its first utterance's final (the measure before 2026-11-27's changed): p95 {pct(per_revision, 0.95):.2f} (n={len(per_revision)}); "
          f"first changes sent by context passes (not settle decodes): p50 {pct(by_passes, 0.5):.2f}, p95 {pct(by_passes, 0.95):.2f} (n={len(by_passes)})")
    if settle_delays or sum(unsettled):
        print(f"settled, from a final to the settled message that covered it (s): p50 {pct(settle_delays, 0.5) if settle_delays else float('nan'):.1f}, "
              f"p95 {pct(settle_delays, 0.95) if settle_delays else float('nan'):.1f} (n={len(settle_delays)}); made final only by the close: {sum(unsettled)}")
    print(f"context lag, from a final to the pass that decided it, changed or not (server histogram, s): p50 {context_lag[0]:.1f}, p95 {context_lag[1]:.1f}")
    kinds = ", ".join(f"{k} {v / audio_s:.3f}" for k, v in sorted(model.items()))
    print(f"compute per audio second: server CPU {cpu / audio_s:.3f} s/s; model time by kind: {kinds} ({audio_s:.0f} s of audio)")
    print("slowest sentences (s after the end of their speech): " + "; ".join(f"{lat:.2f} {which}" for lat, which in sorted(slow, reverse=True)[:5]))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "totals": totals, "latencies": latencies, "delays": delays, "again": again, "per_revision": per_revision, "settled": settle_delays, "unsettled": sum(unsettled),
                                                "first_interims": first_interims, "text_lags": text_lag, "cpu_per_audio_s": cpu / audio_s,
                                                "model_per_audio_s": {k: v / audio_s for k, v in model.items()}, "texts": texts,
                                                "sentences": [[which, lat] for lat, which in slow]}, indent=1))


if __name__ == "__main__":
    main()
