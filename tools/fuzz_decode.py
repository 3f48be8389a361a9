"""Mutation fuzzing of the container decoders with real files: python tools/fuzz_decode.py [--count N].

Each case is a fixture with bytes flipped near its header, a span zeroed or
duplicated, or its tail cut. A case passes when it decodes to audio of the
right shape or fails with a client error (InvalidAudio, AudioFormatMismatch);
anything else (another exception, a crash, a hang) is a bug. The test suite
runs a few dozen cases per format; this runs as many as you ask for.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORMATS = {"librivox.ogg": "ogg", "librivox.webm": "webm", "librivox.mp3": "mp3", "librivox.flac": "flac", "librivox_16k.wav": "wav"}


def mutations(data: bytes, *, seed: int, count: int) -> Iterator[bytes]:
    """``count`` mutated copies of ``data`` (deterministic for a seed)."""
    rng = random.Random(seed)
    for _ in range(count):
        case = bytearray(data)
        kind = rng.randrange(4)
        if kind == 0:  # flip bytes in the header region
            for _ in range(rng.randint(1, 8)):
                case[rng.randrange(min(len(case), 256))] = rng.randrange(256)
        elif kind == 1:  # flip bytes anywhere
            for _ in range(rng.randint(1, 32)):
                case[rng.randrange(len(case))] = rng.randrange(256)
        elif kind == 2:  # zero or duplicate a span
            a = rng.randrange(len(case))
            b = min(len(case), a + rng.randint(1, 4096))
            case[a:b] = bytes(b - a) if rng.random() < 0.5 else case[a:b] * 2
        else:  # cut the tail
            del case[rng.randint(1, len(case)) :]
        yield bytes(case)


def decode(data: bytes, encoding: str, timeout_s: float = 30.0) -> tuple[int, BaseException | None]:
    """Samples decoded and the exception raised (None), in a thread with a time limit."""
    from asr_server.audio.decode import ContainerDecoder

    decoder = ContainerDecoder(encoding, 1)
    decoder.feed(data)
    decoder.end()
    box: list = [0, None]

    def run() -> None:
        try:
            for chunk in decoder.frames():
                assert chunk.ndim == 2 and chunk.shape[0] == 1
                box[0] += chunk.shape[1]
        except BaseException as exc:  # noqa: BLE001 - reported, not swallowed
            box[1] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        decoder.close()
        return box[0], TimeoutError(f"decoding did not finish in {timeout_s} s")
    return box[0], box[1]


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from asr_server.errors import AudioFormatMismatch, InvalidAudio

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500, help="cases per format")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    bad = 0
    for name, encoding in FORMATS.items():
        data = (ROOT / "tests" / "audio_fixtures" / name).read_bytes()
        t0, outcomes = time.monotonic(), {"audio": 0, "client_error": 0}
        for n, case in enumerate(mutations(data, seed=args.seed, count=args.count)):
            _, error = decode(case, encoding)
            if error is None:
                outcomes["audio"] += 1
            elif isinstance(error, (InvalidAudio, AudioFormatMismatch)):
                outcomes["client_error"] += 1
            else:
                bad += 1
                print(f"{name} case {n}: {type(error).__name__}: {error}")
        print(f"{name}: {args.count} cases, {outcomes} in {time.monotonic() - t0:.1f}s")
    print(f"{bad} cases failed")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
