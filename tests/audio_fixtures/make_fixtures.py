"""Rebuild the audio fixtures in this folder from their sources.

Needs Debian's ``pocketsphinx-testdata``, ``espeak-ng`` and PyAV. The output
is committed, so tests never run this; it documents exactly how each file was
made (see README.md beside it for provenance and licences).

    python tests/audio_fixtures/make_fixtures.py
    python tests/audio_fixtures/make_fixtures.py --longform linda_johnson_02.flac

The second form (re)builds only the long-form recording, from the file named
in README.md, and merges it into the manifest: its sentence spans come from
the embedded model's word timings aligned to the reference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

HERE = Path(__file__).resolve().parent
SPHINX = Path("/usr/share/pocketsphinx/test/data")

LIBRIVOX = [
    ("sense_and_sensibility_01_austen_64kb-0870", "and mister john dashwood had then leisure to consider how much there might be prudently in his power to do for them"),
    ("sense_and_sensibility_01_austen_64kb-0880", "he was not an ill disposed young man"),
    ("sense_and_sensibility_01_austen_64kb-0890", "unless to be rather cold hearted and rather selfish is to be ill disposed"),
    ("sense_and_sensibility_01_austen_64kb-0920", "had he married a more a amiable woman he might have been made still more respectable than he was"),
    ("sense_and_sensibility_01_austen_64kb-0930", "he might even have been made amiable himself"),
]
CARDS = [
    ("001", "ten of clubs"),
    ("002", "four queen of clubs"),
    ("003", "seven of clubs"),
    ("004", "five five"),
    ("005", "eight of spades four of clubs seven of hearts"),
]
ESPEAK = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back when you have a moment to talk.",
    "The weather today is sunny with a light breeze from the west.",
    "Our meeting has been moved to Thursday afternoon.",
    "Thank you for your patience while we look into the problem.",
]
CALL_AGENT = [
    "Hello, thank you for calling customer support. How can I help you today?",
    "I can help you with that. Could you please tell me your full name?",
    "Thank you. Your new card will arrive by mail next week.",
]
CALL_CUSTOMER = [
    "Hi, I lost my credit card yesterday and I need a new one.",
    "Sure, my name is Mary Johnson.",
    "That is great news, thank you very much.",
]


def read_mono(path: Path, rate: int) -> np.ndarray:
    """Decode any file to float32 mono at ``rate``."""
    out = []
    with av.open(str(path)) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        for frame in container.decode(audio=0):
            for f in resampler.resample(frame):
                out.append(f.to_ndarray().reshape(-1))
        for f in resampler.resample(None):
            out.append(f.to_ndarray().reshape(-1))
    return np.concatenate(out).astype(np.float32)


def read_raw_s16(path: Path) -> np.ndarray:
    return np.frombuffer(path.read_bytes(), dtype="<i2").astype(np.float32) / 32768.0


def espeak(text: str, rate: int, voice: str = "en-us", wpm: int = 155) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "s.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(wav), text], check=True)
        return read_mono(wav, rate)


def trim(audio: np.ndarray, rate: int, floor_db: float = -45.0) -> np.ndarray:
    """Cut leading and trailing silence (10 ms frames under ``floor_db`` dBFS)."""
    hop = rate // 100
    frames = len(audio) // hop
    rms = np.sqrt(np.mean(audio[: frames * hop].reshape(frames, hop) ** 2, axis=1) + 1e-12)
    loud = np.nonzero(20 * np.log10(rms) > floor_db)[0]
    if len(loud) == 0:
        return audio[:0]
    return audio[loud[0] * hop : (loud[-1] + 1) * hop]


def assemble(clips: list[np.ndarray], rate: int, gap_s: float | list[float], lead_s: float = 0.5):
    """Join clips with silence between them (``gap_s``: after every clip, or one per clip);
    return audio and (start, end) of each."""
    gaps = [gap_s] * len(clips) if isinstance(gap_s, int | float) else gap_s
    parts = [np.zeros(int(lead_s * rate), np.float32)]
    spans = []
    pos = len(parts[0])
    for clip, gap_after in zip(clips, gaps, strict=True):
        spans.append((round(pos / rate, 3), round((pos + len(clip)) / rate, 3)))
        parts.append(clip)
        gap = np.zeros(int(gap_after * rate), np.float32)
        parts.append(gap)
        pos += len(clip) + len(gap)
    return np.concatenate(parts), spans


def write_pcm(path: Path, audio: np.ndarray, rate: int, codec: str, fmt: str, layout: str = "mono", **opts) -> None:
    """Encode ``audio`` (samples,) or (channels, samples) float to a container."""
    planar = audio.reshape(1, -1) if audio.ndim == 1 else audio
    channels = planar.shape[0]
    s16 = (np.clip(planar, -1, 1) * 32767).astype("<i2")
    with av.open(str(path), "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        for key, value in opts.items():
            setattr(stream, key, value)
        packed = s16.T.reshape(1, -1)
        step = 960
        for i in range(0, s16.shape[1], step):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(packed[:, i * channels : (i + step) * channels]), format="s16", layout=layout)
            frame.sample_rate = rate
            frame.pts = i
            frame.time_base = Fraction(1, rate)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


def g711(audio: np.ndarray, codec: str) -> bytes:
    """Encode to raw G.711 with PyAV (``pcm_mulaw`` or ``pcm_alaw``)."""
    s16 = (np.clip(audio, -1, 1) * 32767).astype("<i2").reshape(1, -1)
    ctx = av.CodecContext.create(codec, "w")
    ctx.sample_rate = 8000
    ctx.layout = "mono"
    ctx.format = "s16"
    frame = av.AudioFrame.from_ndarray(s16, format="s16", layout="mono")
    frame.sample_rate = 8000
    return b"".join(bytes(p) for p in ctx.encode(frame)) + b"".join(bytes(p) for p in ctx.encode(None))


# LJ Speech clips LJ028-0030 to LJ028-0039 (Linda Johnson's LibriVox reading of E. J. Banks,
# "The Seven Wonders of the Ancient World", 1916; public domain), numbers as digits.
LONGFORM = [
    'Your journey is at an end. Before you is Babylon, the "Gate of God," as the old name means.',
    "About you is all that remains of the second of the Seven Wonders of the World.",
    "Babylon, even in the days of Nebuchadnezzar, was an old, old city.",
    "There is a Hebrew tradition that it was the oldest of all cities, but now we know that great empires flourished and passed away before Babylon was built.",
    "Old King Sargon I, who may have lived as early as 3800 BC,",
    "seems to have been the first to mention Babylon, and one of his inscriptions seems to say that he built the city and gave it its name.",
    "But in those very early days Babylon was little more than a shrine, surrounded with mud huts and date palms.",
    "It was about 2250 BC, when the great Hammurabi made it his capital, that it became the chief city of Babylonia.",
    "Its history for the next 1500 years or more is obscure.",
    "We know the names of its kings, and the records speak of long wars with the Assyrians.",
]


def sentence_spans(audio: np.ndarray, sentences: list[str]) -> list[tuple[float, float]]:
    """Each sentence's (start, end) in seconds. The recording is cut at its pauses (120 ms or
    more, 35 dB under its loudest frame), each piece is transcribed alone by the embedded
    model, and the pieces' words are aligned to the reference: a sentence spans the pieces
    holding its words (LJ Speech clips end at pauses, so sentences do too)."""
    sys.path.insert(0, str(HERE.parents[1]))
    from faster_whisper import WhisperModel

    from asr_server.inference.models import DEFAULT_MODEL, resolve_model
    from tests.wer import normalize

    model = WhisperModel(resolve_model(DEFAULT_MODEL), cpu_threads=2)
    pieces = _between_pauses(audio)
    words: list[tuple[str, int]] = []  # (word, piece)
    for p, (a, b) in enumerate(pieces):
        segments, _ = model.transcribe(audio[a:b], language="en", beam_size=5, condition_on_previous_text=False)
        words += [(w, p) for s in segments for w in normalize(s.text)]
    ref = [(k, w) for k, sentence in enumerate(sentences) for w in normalize(sentence)]
    pairs = _align([w for _, w in ref], [w for w, _ in words])
    spans = []
    for k in range(len(sentences)):
        held = [words[j][1] for i, j in pairs if ref[i][0] == k and j is not None]
        spans.append((round(pieces[min(held)][0] / 16000, 3), round(pieces[max(held)][1] / 16000, 3)))
    return spans


def _between_pauses(audio: np.ndarray, frame: int = 480, floor_db: float = 35.0, pause_frames: int = 4) -> list[tuple[int, int]]:
    """(start, end) samples of the stretches of sound between pauses of ``pause_frames`` quiet frames."""
    n = len(audio) // frame
    rms = np.sqrt(np.mean(audio[: n * frame].reshape(n, frame).astype(np.float64) ** 2, axis=1)) + 1e-9
    loud = 20 * np.log10(rms / rms.max()) > -floor_db
    out, start, quiet = [], None, 0
    for i, on in enumerate(loud):
        if on:
            start = i if start is None else start
            quiet = 0
        elif start is not None:
            quiet += 1
            if quiet >= pause_frames:
                out.append((start * frame, (i - quiet + 1) * frame))
                start, quiet = None, 0
    if start is not None:
        out.append((start * frame, n * frame))
    return out


def _align(ref: list[str], hyp: list[str]) -> list[tuple[int, int | None]]:
    """Levenshtein alignment: for each reference word, the hypothesis word matched or substituted (None: deleted)."""
    n, m = len(ref), len(hyp)
    cost = np.zeros((n + 1, m + 1), int)
    cost[:, 0], cost[0, :] = range(n + 1), range(m + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            cost[i, j] = min(cost[i - 1, j] + 1, cost[i, j - 1] + 1, cost[i - 1, j - 1] + (ref[i - 1] != hyp[j - 1]))
    out, i, j = [], n, m
    while i > 0:
        if j > 0 and cost[i, j] == cost[i - 1, j - 1] + (ref[i - 1] != hyp[j - 1]):
            out.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif j > 0 and cost[i, j] == cost[i, j - 1] + 1:
            j -= 1
        else:
            out.append((i - 1, None))
            i -= 1
    return out[::-1]


def longform(source: Path) -> None:
    """ljspeech_babylon_16k.s16le: 72 s of continuous reading, raw 16 kHz so replay is paced exactly."""
    audio = read_mono(source, 16000)
    name = "ljspeech_babylon_16k.s16le"
    (HERE / name).write_bytes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    manifest = json.loads((HERE / "manifest.json").read_text())
    manifest[name] = dict(encoding="pcm_s16le", sample_rate=16000, channels=1, references=[LONGFORM],
                          spans=[sentence_spans(audio, LONGFORM)], source="ljspeech")
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(name, manifest[name]["spans"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--longform", type=Path, help="only (re)build the long-form recording from this file")
    args = ap.parse_args()
    if args.longform:
        longform(args.longform)
        return
    manifest: dict[str, dict] = {}

    def record(name: str, **entry) -> None:
        manifest[name] = entry

    # Real human speech: LibriVox (public domain) via pocketsphinx-testdata.
    clips = [trim(read_mono(SPHINX / "librivox" / f"{i}.wav", 16000), 16000) for i, _ in LIBRIVOX]
    audio, spans = assemble(clips, 16000, gap_s=1.2)
    ref = [t for _, t in LIBRIVOX]
    write_pcm(HERE / "librivox_16k.wav", audio, 16000, "pcm_s16le", "wav")
    common = dict(channels=1, references=[ref], spans=[spans], source="librivox")
    record("librivox_16k.wav", encoding="wav", sample_rate=16000, **common)
    (HERE / "librivox_16k.s16le").write_bytes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    record("librivox_16k.s16le", encoding="pcm_s16le", sample_rate=16000, **common)
    a48 = read_mono(HERE / "librivox_16k.wav", 48000)
    write_pcm(HERE / "librivox.ogg", a48, 48000, "libopus", "ogg", bit_rate=32000)
    record("librivox.ogg", encoding="ogg", sample_rate=48000, **common)
    write_pcm(HERE / "librivox.webm", a48, 48000, "libopus", "webm", bit_rate=32000)
    record("librivox.webm", encoding="webm", sample_rate=48000, **common)
    write_pcm(HERE / "librivox.mp3", audio, 16000, "libmp3lame", "mp3", bit_rate=48000)
    record("librivox.mp3", encoding="mp3", sample_rate=16000, **common)
    write_pcm(HERE / "librivox.flac", audio, 16000, "flac", "flac")
    record("librivox.flac", encoding="flac", sample_rate=16000, **common)

    # Real human speech: CMU "cards" recordings.
    clips = [trim(read_mono(SPHINX / "cards" / f"{i}.wav", 16000), 16000) for i, _ in CARDS]
    audio, spans = assemble(clips, 16000, gap_s=1.0)
    write_pcm(HERE / "cards_16k.wav", audio, 16000, "pcm_s16le", "wav")
    common = dict(channels=1, references=[[t for _, t in CARDS]], spans=[spans], source="cmu-cards")
    record("cards_16k.wav", encoding="wav", sample_rate=16000, **common)
    a44 = read_mono(HERE / "cards_16k.wav", 44100)
    (HERE / "cards_44k.f32le").write_bytes(a44.astype("<f4").tobytes())
    record("cards_44k.f32le", encoding="pcm_f32le", sample_rate=44100, **common)

    # Synthetic speech, 16 kHz and 8 kHz telephony (mu-law, A-law).
    clips = [trim(espeak(t, 16000), 16000) for t in ESPEAK]
    audio, spans = assemble(clips, 16000, gap_s=1.0)
    write_pcm(HERE / "espeak_16k.wav", audio, 16000, "pcm_s16le", "wav")
    common = dict(channels=1, references=[ESPEAK], spans=[spans], source="espeak-ng")
    record("espeak_16k.wav", encoding="wav", sample_rate=16000, **common)
    clips8 = [trim(espeak(t, 8000), 8000) for t in ESPEAK]
    audio8, spans8 = assemble(clips8, 8000, gap_s=1.0)
    common8 = dict(channels=1, references=[ESPEAK], spans=[spans8], source="espeak-ng")
    (HERE / "espeak_8k.mulaw").write_bytes(g711(audio8, "pcm_mulaw"))
    record("espeak_8k.mulaw", encoding="mulaw", sample_rate=8000, **common8)
    (HERE / "espeak_8k.alaw").write_bytes(g711(audio8, "pcm_alaw"))
    record("espeak_8k.alaw", encoding="alaw", sample_rate=8000, **common8)

    # A two-channel 8 kHz call: agent on channel 0, customer on channel 1, taking turns.
    agent = [trim(espeak(t, 8000, "en-us"), 8000) for t in CALL_AGENT]
    customer = [trim(espeak(t, 8000, "en-gb"), 8000) for t in CALL_CUSTOMER]
    rate, gap = 8000, int(0.9 * 8000)
    ch = [[np.zeros(4000, np.float32)], [np.zeros(4000, np.float32)]]
    spans_call: list[list[tuple[float, float]]] = [[], []]
    pos = 4000
    for a, c in zip(agent, customer):
        for who, clip in ((0, a), (1, c)):
            other = 1 - who
            spans_call[who].append((round(pos / rate, 3), round((pos + len(clip)) / rate, 3)))
            ch[who].append(clip)
            ch[other].append(np.zeros(len(clip), np.float32))
            ch[who].append(np.zeros(gap, np.float32))
            ch[other].append(np.zeros(gap, np.float32))
            pos += len(clip) + gap
    stereo = np.stack([np.concatenate(ch[0]), np.concatenate(ch[1])])
    (HERE / "call_8k_stereo.s16le").write_bytes((np.clip(stereo.T, -1, 1) * 32767).astype("<i2").tobytes())
    record("call_8k_stereo.s16le", encoding="pcm_s16le", sample_rate=8000, channels=2, references=[CALL_AGENT, CALL_CUSTOMER], spans=spans_call, source="espeak-ng")

    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print("\n".join(sorted(manifest)))


if __name__ == "__main__":
    main()
