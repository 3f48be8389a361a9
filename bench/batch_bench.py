"""Model time per decode by kind and batch size: what batching across streams buys.

    python bench/batch_bench.py [--device cpu|cuda] [--compute-type int8] [--sizes 1,4,8,16,32]
                                [--kinds interim,burst,final,context] [--repeats 2]

Loads the embedded model in one worker (no server) and times the runner's
own ``transcribe_batch`` on batches of LibriVox audio as the scheduler sends
them:

* ``interim``: 3 s, greedy, no word timing, on the interim window;
* ``burst``: a final in a burst, 4 s, greedy, on the burst window;
* ``final``: a full final, 4 s on the whole 30 s window, beam 5;
* ``context``: a context pass, 24 s on the whole window, beam 5, word timing.

Each with a 15-word prompt. Per kind and batch size it prints the call's
time, the time per decode, and how that call's time split between feature
extraction, the encoder, ``generate`` and word alignment (the fastest of
``--repeats`` calls, after one warm-up call per kind). Where the time per decode does not fall as the batch
grows, batching buys nothing (on an H200, tiny.en's context passes:
docs/benchmarks.md, eleventh session).

Not a test: it prints a table.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from asr_server.inference.types import DecodeKind, DecodeRequest  # noqa: E402
from asr_server.inference.whisper import WhisperRunner, resolve_model  # noqa: E402

PROMPT = "It was a bright cold day in April, and the clocks were striking thirteen."
STAGES = ("features", "encode", "generate", "align")


def load_audio() -> np.ndarray:
    pcm = np.fromfile(ROOT / "tests" / "audio_fixtures" / "librivox_16k.s16le", dtype="<i2")
    return pcm.astype(np.float32) / 32768


def request(audio: np.ndarray, kind: str, i: int) -> DecodeRequest:
    """The ``i``-th decode of a batch: each starts a second later in the recording."""
    start = (i % 4) * 16000
    if kind == "context":
        return DecodeRequest(audio[start : start + 16000 * 24], DecodeKind.CONTEXT, prompt=PROMPT, word_timestamps=True, pack=False)
    if kind in ("burst", "final"):
        return DecodeRequest(audio[start : start + 16000 * 4], DecodeKind.FINAL, prompt=PROMPT, word_timestamps=True, burst=kind == "burst", pack=False)
    return DecodeRequest(audio[start : start + 16000 * 3], DecodeKind.INTERIM, prompt=PROMPT)


class StageClock:
    """Wraps the runner's stages so that each call's time is split by stage."""

    def __init__(self, runner: WhisperRunner) -> None:
        self.spent: collections.Counter[str] = collections.Counter()
        runner._item = self._timed(runner._item, "features")  # features and prompt of one request
        runner._attempt = self._timed(runner._attempt, "generate")
        runner._align = self._timed(runner._align, "align")
        model = runner.model.model
        clock = self

        class Timed:  # CTranslate2's model object cannot take attributes: a proxy times its encoder
            def __getattr__(self, name: str) -> Any:
                return clock._timed(model.encode, "encode") if name == "encode" else getattr(model, name)

        runner.model.model = Timed()

    def _timed(self, fn: Callable[..., Any], stage: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[stage] += time.perf_counter() - t0

        return timed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compute-type", default="auto")
    ap.add_argument("--sizes", default="1,4,8,16,32")
    ap.add_argument("--kinds", default="interim,burst,final,context")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    audio = load_audio()
    runner = WhisperRunner(resolve_model("tiny.en"), device=args.device, compute_type=args.compute_type, workers=1)
    clock = StageClock(runner)
    print(f"device {args.device}, compute type {args.compute_type}; seconds")
    print("| kind | batch | call | per decode | " + " | ".join(STAGES) + " |")
    print("|---|---|---|---|" + "---|" * len(STAGES))
    for kind in args.kinds.split(","):
        runner.transcribe_batch([request(audio, kind, 0)])  # warm-up
        for n in (int(x) for x in args.sizes.split(",")):
            best: tuple[float, dict[str, float]] | None = None
            for _ in range(max(1, args.repeats)):
                clock.spent.clear()
                t0 = time.perf_counter()
                runner.transcribe_batch([request(audio, kind, i) for i in range(n)])
                took = time.perf_counter() - t0
                if best is None or took < best[0]:
                    best = (took, dict(clock.spent))
            assert best is not None
            took, spent = best
            print(f"| {kind} | {n} | {took:.3f} | {took / n:.4f} | " + " | ".join(f"{spent.get(s, 0.0):.3f}" for s in STAGES) + " |", flush=True)


if __name__ == "__main__":
    main()
