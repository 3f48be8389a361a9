"""Replay harness: stream a fixture through a real server and record every message.

Used by the end-to-end tests and by bench/. Every message is kept with its
arrival time (seconds since the first byte was sent).
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
from asr_client import Timed, Transcript, stream_bytes

from asr_server.audio.decode import PcmDecoder, mulaw_to_float

from asr_server.inference.types import Runner
from asr_server.options import Limits
from asr_server.scheduler.capacity import CapacityModel
from asr_server.scheduler.governor import GovernorOptions, Level
from asr_server.server import AsrServer

FIXTURES = Path(__file__).resolve().parent / "audio_fixtures"
MANIFEST: dict[str, dict[str, Any]] = json.loads((FIXTURES / "manifest.json").read_text())


def fixture_path(name: str) -> Path:
    """Where a recording in :data:`MANIFEST` lies: in this folder, unless its entry says (``path``:
    the benches add recordings from elsewhere, bench/heldout.py)."""
    return Path(MANIFEST[name].get("path", FIXTURES / name))

_BYTES_PER_SAMPLE = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1, "alaw": 1}


@dataclass
class Replay:
    fixture: str
    messages: list[Timed] = field(default_factory=list)
    sent_until: float = 0.0  # when the client sent "close"

    def of_type(self, kind: str) -> list[Timed]:
        return [m for m in self.messages if m.message["type"] == kind]

    def transcript(self, before_settle: bool = False) -> Transcript:
        """The client's transcript after every message (``before_settle``: up to the first
        revision a settle decode sent, what the context passes made of the finals)."""
        t = Transcript()
        for m in self.messages:
            if before_settle and m.message["type"] == "revision" and m.message["pass"] == "settle":
                break
            t.apply(m.message)
        return t

    def final_text(self, channel: int = 0) -> str:
        return " ".join(m.message["text"] for m in self.of_type("final") if m.message["channel"] == channel and m.message["text"])


# Final reasons that come from the audio: its endpoint, or a sentence end the interims heard where a
# long sentence split (not the client's close).
FROM_AUDIO = ("endpoint", "sentence")


def assert_each_sentence_finalized(finals: list[dict[str, Any]], spans: list[list[float]]) -> None:
    """Every sentence (``spans``: start, end in stream seconds) overlaps a final with text, and there
    are at most two finals per sentence: a long sentence may split once at a breath, which depends on
    timing (fresh-clone CI runs on a busy machine got 6 finals for LibriVox's 5 sentences)."""
    texts = [f["text"] for f in finals]
    assert all(any(f["start"] < end and f["end"] > start for f in finals) for start, end in spans), texts
    assert len(spans) <= len(finals) <= 2 * len(spans), texts


def load_channels(name: str) -> np.ndarray:
    """A fixture decoded to 16 kHz float, one row per channel (containers mixed to mono)."""
    entry = MANIFEST[name]
    if entry["encoding"] in _BYTES_PER_SAMPLE:
        dec = PcmDecoder(entry["encoding"], entry["sample_rate"], entry["channels"])
        return np.concatenate([dec.feed(fixture_path(name).read_bytes()), dec.flush()], axis=1)
    parts = []
    with av.open(str(fixture_path(name))) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=16000)
        for frame in container.decode(audio=0):
            parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
        parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(parts).astype(np.float32).reshape(1, -1)


PHONE_BAND_HZ = (300.0, 3400.0)  # G.712's passband: what a telephone line carries of a voice


def phone_line(channels: list[np.ndarray]) -> tuple[bytes, list[np.ndarray]]:
    """16 kHz audio as it reaches a server from a phone call: cut to ``PHONE_BAND_HZ``, sampled at
    8 kHz, G.711 mu-law (interleaved channels), and the same decoded back to 16 kHz by the
    server's own decoder (for the offline baseline, which must hear what the server hears)."""
    # A windowed-sinc band-pass (a cut in the spectrum of the whole file instead rings across
    # its pauses), then every other sample: nothing above 4 kHz is left to alias.
    taps = np.arange(-128, 129)
    low, high = (f / 16000 for f in PHONE_BAND_HZ)
    band = (2 * high * np.sinc(2 * high * taps) - 2 * low * np.sinc(2 * low * taps)) * np.hamming(len(taps))
    narrow = [np.convolve(audio, band, mode="same")[::2] for audio in channels]
    data = mulaw_bytes(np.stack(narrow).T.reshape(-1))
    decoder = PcmDecoder("mulaw", 8000, len(channels))
    heard = np.concatenate([decoder.feed(data), decoder.flush()], axis=1)
    return data, list(heard)


def fast_reader(audio: np.ndarray, spans: list[list[float]], keep_s: float = 0.12) -> tuple[np.ndarray, list[list[float]]]:
    """The recording as a faster reader says it: every pause (30 ms frames 35 dB below its
    loudest) cut to ``keep_s``, shorter than the 200 ms that ends an utterance in continuous
    speech, so that only a sentence split can end a sentence before the reading stops; and
    its sentences' spans where they now lie."""
    frame = 480
    n = len(audio) // frame
    rms = np.sqrt(np.mean(audio[: n * frame].reshape(n, frame).astype(np.float64) ** 2, axis=1)) + 1e-9
    quiet = 20 * np.log10(rms / rms.max()) < -35
    keep = np.ones(n, bool)
    kept = int(round(keep_s * 16000 / frame))
    i = 0
    while i < n:
        j = i
        while j < n and quiet[j]:
            j += 1
        if j - i > kept:
            keep[i + kept : j] = False
        i = max(j, i + 1)
    before = np.concatenate([[0], np.cumsum(keep)]) * frame  # samples kept before each frame

    def moved(t: float) -> float:
        k = min(n, int(t * 16000) // frame)
        return float(before[k] + (min(int(t * 16000) - k * frame, frame) if k < n and keep[k] else 0)) / 16000

    cut = audio[: n * frame].reshape(n, frame)[keep].reshape(-1)
    return cut.astype(np.float32), [[moved(a), moved(b)] for a, b in spans]


def mulaw_bytes(samples: np.ndarray) -> bytes:
    """G.711 mu-law codes of float samples: each the code whose level (as the server's decoder
    reads it) lies nearest."""
    table = mulaw_to_float(bytes(range(256)))
    order = np.argsort(table, kind="stable")
    levels = table[order]
    x = np.clip(samples, levels[0], levels[-1])
    above = np.clip(np.searchsorted(levels, x), 1, len(levels) - 1)
    nearest = np.where(x - levels[above - 1] < levels[above] - x, above - 1, above)
    return order[nearest].astype(np.uint8).tobytes()


def load_mono(name: str) -> np.ndarray:
    """Channel 0 of a fixture at 16 kHz."""
    return load_channels(name)[0]


def bytes_per_second(name: str) -> float:
    entry = MANIFEST[name]
    if entry["encoding"] in _BYTES_PER_SAMPLE:
        return entry["sample_rate"] * entry["channels"] * _BYTES_PER_SAMPLE[entry["encoding"]]
    size = fixture_path(name).stat().st_size
    duration = max(end for spans in entry["spans"] for _, end in spans) + 1.0
    return size / duration  # containers: pace by average bitrate


def container_schedule(name: str) -> list[tuple[int, float]] | None:
    """For a container fixture, when its bytes are due as a live encoder would give them: the bytes
    up to where the next packet (or Ogg page) begins, once this one's audio has ended
    (:func:`asr_client.stream_bytes`'s ``schedule``). None for raw encodings (a steady rate)."""
    if MANIFEST[name]["encoding"] in _BYTES_PER_SAMPLE:
        return None
    path = fixture_path(name)
    ends: dict[int, float] = {}  # packet (or page) start -> when its audio has all been said
    with av.open(str(path)) as container:
        for packet in container.demux(container.streams.audio[0]):
            if packet.pos is not None and packet.pts is not None and packet.duration is not None:
                end = float((packet.pts + packet.duration) * packet.time_base)
                ends[packet.pos] = max(end, ends.get(packet.pos, 0.0))
    starts = sorted(ends)
    size = path.stat().st_size
    schedule, latest = [], 0.0
    for start, following in zip(starts, [*starts[1:], size]):
        latest = max(latest, ends[start])
        schedule.append((following, latest))
    return schedule


async def replay(url: str, name: str, *, realtime: bool = False, chunk_ms: int = 100, **options: Any) -> Replay:
    entry = MANIFEST[name]
    data = fixture_path(name).read_bytes()
    opts: dict[str, Any] = {"encoding": entry["encoding"], "channels": entry["channels"]}
    if entry["encoding"] in _BYTES_PER_SAMPLE:
        opts["sample_rate"] = entry["sample_rate"]
    opts.update(options)
    result = Replay(name)
    schedule = container_schedule(name) if realtime else None
    async for item in stream_bytes(url, data, bytes_per_second=bytes_per_second(name), realtime=realtime, chunk_ms=chunk_ms, schedule=schedule, **opts):
        result.messages.append(item)
    return result


class ServerThread:
    """A real :class:`AsrServer` on 127.0.0.1 and a free port, in its own thread and loop.

    Unless a test passes its own ``governor``, load may degrade interims but never
    refuse streams: on a busy machine a test's own finals can wait long enough to
    raise the level, and a test that is not about refusals must not meet one (tests
    of refusals set the level themselves or pass a governor).
    """

    def __init__(self, runner: Runner | None, limits: Limits = Limits(), capacity: CapacityModel | None = None, **server_options: Any) -> None:
        server_options.setdefault("governor", GovernorOptions(max_level=Level.INTERIM_MODEL))
        self.runner = runner
        self.capacity = capacity
        self.limits = limits
        self.server_options = server_options
        self.server: AsrServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="test-server", daemon=True)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"ws://127.0.0.1:{self.server.port}"

    @property
    def http(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.port}"

    def start(self) -> "ServerThread":
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("test server did not start")
        return self

    def call(self, fn, *args):  # run fn in the server's loop and wait for it
        assert self._loop is not None
        done = threading.Event()
        box: list[Any] = []
        self._loop.call_soon_threadsafe(lambda: (box.append(fn(*args)), done.set()))
        done.wait(10)
        return box[0] if box else None

    def run(self, coro_fn, *args):  # run a coroutine in the server's loop and wait for it
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro_fn(*args), self._loop).result(30)

    def set_runner(self, runner: Runner) -> None:
        assert self.server is not None
        self.call(self.server.set_runner, runner)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return  # already stopped (stopping twice is fine)
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.server = AsrServer("127.0.0.1", 0, self.limits, model_name="tiny.en", **self.server_options)
        await self.server.start()
        if self.runner is not None:
            self.server.set_runner(self.runner, capacity=self.capacity)
        self._ready.set()
        await self._stop.wait()
        await self.server.stop(grace_s=5)


def wav_bytes(fmt=1, channels=1, rate=16000, bits=16, data=None, ext=b""):
    """A WAV file with whatever header fields a hostile client likes."""
    import struct

    if data is None:
        data = np.zeros(channels * rate // 2, "<i2").tobytes()
    block = channels * max(bits, 8) // 8
    fmt_body = struct.pack("<HHIIHH", fmt, channels, rate, rate * block, block, bits) + ext
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt_body)) + fmt_body + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body
