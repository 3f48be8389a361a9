"""The deterministic replay over many takes at once, pooled: is a decoding rule better, or lucky?

    python bench/replay_matrix.py [--sets fixtures,heldout1,heldout2[,heldout3][,heldout4][,heldout5][,heldout6][,heldout7]] [--conditions clean,noise,room]
                                  [--speeds 0.9,1.0,1.1] [--jobs 2] [--out DIR] [--against DIR] [--chunked-offline]
                                  [-- replay_bench.py options]

One run of ``replay_bench.py --offline`` per set of recordings, listening condition and
speed (27 by default), ``--jobs`` at a time, then one table: per run, per condition, per
set and over all of them, the word error rate of the first-pass finals, of the transcript
after revisions and of offline transcription of the same audio (faster-whisper, same model,
beam 5, VAD filter), and the gap after revisions minus offline in points. The pooled figures
count every word of every run, not a mean of rates. ``--chunked-offline`` adds two columns:
offline transcription of the audio the server's chunker kept, joined as a pass joins it
(``replay_bench.py --chunked-offline``), and after revisions minus that: what the passes'
windows and votes cost against one sequential decode of the same audio (one more offline
decode of each channel).

Why: one replay holds three to five recordings, and a change to a rule of the two passes
moves single words in them by chance (one word is 1-3 points of a recording). Judged on one
replay per condition, nine changes in a row looked better on some and worse on others
(docs/benchmarks.md, thirty-first session). The three default sets are different voices,
texts and pauses; ``--speed`` (0.9, 1.1) makes other takes of the same people (see
``replay_bench.py``), so a rule is judged on 27 replays of some 100 channels.

``fixtures`` are ``replay_bench.py``'s default recordings; ``heldout1`` to ``heldout7`` are
the recordings ``bench/heldout.py`` writes (into a temporary folder unless ``--heldout-dir``
names a folder holding ``set1`` to ``set7`` from an earlier run). ``heldout3`` to ``heldout7``
run only when ``--sets`` names them: they were made to check the
rules chosen on the other 27 replays (each judged one change, not kept, in the session that
made it: set 3 in the forty-first, set 4 in the forty-second). ``heldout5`` is a human voice
(an Asterisk PBX's prompts at 8 kHz, ``bench/heldout.py --set 5``), made in the eightieth session
after every rule had been chosen; ``heldout6`` is flite's voices (built from three real
speakers' recordings), made in the ninety-second session; ``heldout7`` is real recordings
(a lecture, a news report, a phone call, meetings) whose references are offline
transcription's own words, so its WER columns are distances from offline transcription
(ninety-third session). Options
after ``--`` go to every replay (``-- --context-ahead-s 2``: a rule's option). ``--against``
names an earlier run's ``--out`` folder (the code before a change): each replay's WER after
revisions is then set beside it, with a count of replays that got better and worse. The replays
are deterministic: the same code gives the same table on every machine of a kind. With two
jobs on two cores it takes about 17 minutes (about 55 on a slower kind without AVX-512).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.wer import errors as word_errors, normalize  # noqa: E402

SETS = ("fixtures", "heldout1", "heldout2", "heldout3", "heldout4", "heldout5", "heldout6", "heldout7")
# heldout3 to heldout6 on request: kept apart to check rules chosen on the others (heldout5, a human
# voice, needs Debian's asterisk-core-sounds-en-wav; heldout6 needs flite; heldout7 fetches two
# source archives from PyPI: see bench/heldout.py)
DEFAULT_SETS = SETS[:3]
CONDITIONS = {"clean": [], "noise": ["--noise-db", "20"], "room": ["--room"]}
COLUMNS = ("first", "revised", "offline", "chunked")  # chunked: with --chunked-offline only


@dataclass(frozen=True)
class Cell:
    recordings: str  # one of SETS
    condition: str  # a key of CONDITIONS
    speed: float

    @property
    def name(self) -> str:
        return f"{self.recordings}_{self.condition}_{self.speed:.2g}"


@dataclass
class Tally:
    """Word errors per column and reference words, summed over channels."""

    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COLUMNS, 0))
    words: int = 0

    def add(self, other: Tally) -> None:
        for k in COLUMNS:
            self.errors[k] += other.errors[k]
        self.words += other.words

    def rate(self, column: str) -> float:
        return self.errors[column] / max(1, self.words)


def tally(texts: dict[str, dict[str, str]]) -> Tally:
    """The errors of one replay's ``--json`` texts (every channel it replayed)."""
    out = Tally()
    for said in texts.values():
        for column in COLUMNS:
            if column in said:
                out.errors[column] += word_errors(said["reference"], said[column])[0]
        out.words += len(normalize(said["reference"]))
    return out


def replay_command(cell: Cell, heldout: Path, json_out: Path, extra: list[str]) -> list[str]:
    recordings = [] if cell.recordings == "fixtures" else ["--fixture-dir", str(set_folder(heldout, cell.recordings)), "--fixtures", "all"]
    return [sys.executable, str(ROOT / "bench" / "replay_bench.py"), "--offline", "--speed", str(cell.speed),
            *recordings, *CONDITIONS[cell.condition], "--json", str(json_out), *extra]


def run_cell(cell: Cell, heldout: Path, out: Path, extra: list[str]) -> Tally:
    json_out = out / f"{cell.name}.json"
    with open(out / f"{cell.name}.txt", "w") as log:
        done = subprocess.run(replay_command(cell, heldout, json_out, extra), stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"replay_matrix.py: the replay {cell.name} failed (exit {done.returncode}); its output is in {out / (cell.name + '.txt')}")
    result = tally(json.loads(json_out.read_text()))
    print(f"  {cell.name}: after revisions {result.rate('revised'):.3f}, offline {result.rate('offline'):.3f}", file=sys.stderr, flush=True)
    return result


def set_folder(heldout: Path, name: str) -> Path:
    """Where held-out set ``name`` (heldout1 to heldout7) is: ``heldout``/set1 and so on."""
    return heldout / f"set{name.removeprefix('heldout')}"


def write_heldout(folder: Path, sets: list[str]) -> None:
    """The held-out sets among ``sets`` into ``folder``/set1 to set7, unless they are there."""
    for name in sorted(s for s in sets if s != "fixtures"):
        target = set_folder(folder, name)
        if not (target / "manifest.json").exists():
            subprocess.run([sys.executable, str(ROOT / "bench" / "heldout.py"), "--set", name.removeprefix("heldout"), str(target)],
                           check=True, stdout=subprocess.DEVNULL)


def row(label: str, t: Tally, before: Tally | None = None, chunked: bool = False) -> str:
    gap = (t.rate("revised") - t.rate("offline")) * 100
    line = f"| {label} | {t.words} | {t.rate('first'):.3f} | {t.rate('revised'):.3f} | {t.rate('offline'):.3f} | {gap:+.1f} |"
    if chunked:
        line += f" {t.rate('chunked'):.3f} | {(t.rate('revised') - t.rate('chunked')) * 100:+.1f} |"
    if before is not None:
        line += f" {before.rate('revised'):.3f} | {(t.rate('revised') - before.rate('revised')) * 100:+.1f} |"
    return line


def report(results: dict[Cell, Tally], against: dict[Cell, Tally] | None = None, chunked: bool = False) -> str:
    """The table; with ``chunked`` two more columns (offline on the chunker's audio, and after revisions
    against it); with ``against`` (the same replays of other code) two more, and a count of the
    replays each way."""
    head = "| replay | words | WER first-pass finals | WER after revisions | WER offline | after revisions - offline (points) |"
    head += " WER offline, the chunker's audio | after revisions - that (points) |" if chunked else ""
    lines = [head + (" after revisions, --against | change (points) |" if against else ""), "|---" * (6 + 2 * chunked + 2 * bool(against)) + "|"]
    lines += [row(cell.name, t, against and against[cell], chunked) for cell, t in results.items()]
    for label in (lambda c: c.condition, lambda c: c.recordings, lambda c: f"speed {c.speed:.2g}", lambda c: "all"):
        groups: dict[str, tuple[Tally, Tally]] = {}
        for cell, t in results.items():
            now, before = groups.setdefault(f"**{label(cell)}**", (Tally(), Tally()))
            now.add(t)
            if against:
                before.add(against[cell])
        lines += [row(key, now, before if against else None, chunked) for key, (now, before) in groups.items()]
    within = sum(1 for t in results.values() if t.rate("revised") - t.rate("offline") <= 0.005)
    lines.append(f"\nreplays within 0.5 points of offline (or better): {within} of {len(results)}")
    if against:
        changes = [t.errors["revised"] - against[cell].errors["revised"] for cell, t in results.items()]
        words = sum(t.words for t in results.values())
        lines.append(f"against --against: fewer errors after revisions in {sum(c < 0 for c in changes)}, more in "
                     f"{sum(c > 0 for c in changes)}, as many in {sum(c == 0 for c in changes)} (errors {sum(changes):+d} of {words} words)")
    return "\n".join(lines)


def earlier(folder: Path, cells: list[Cell]) -> dict[Cell, Tally]:
    """The tallies of an earlier run's ``--out`` folder, for the same replays."""
    missing = [c.name for c in cells if not (folder / f"{c.name}.json").exists()]
    if missing:
        raise SystemExit(f"replay_matrix.py: --against {folder} lacks {', '.join(missing)}")
    return {c: tally(json.loads((folder / f"{c.name}.json").read_text())) for c in cells}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(DEFAULT_SETS), help=f"comma-separated, of {', '.join(SETS)} (default: fixtures, heldout1 and heldout2)")
    ap.add_argument("--conditions", default=",".join(CONDITIONS), help=f"comma-separated, of {', '.join(CONDITIONS)}")
    ap.add_argument("--speeds", default="0.9,1.0,1.1", help="comma-separated factors from 0.5 to 2")
    ap.add_argument("--jobs", type=int, default=2, help="replays at once (each uses about a core)")
    ap.add_argument("--heldout-dir", type=Path, default=None, help="where set1 to set7 of bench/heldout.py are (written there if missing)")
    ap.add_argument("--out", type=Path, default=None, help="keep each replay's table and texts here")
    ap.add_argument("--against", type=Path, default=None, help="an earlier run's --out folder: compare after revisions with it, replay by replay")
    ap.add_argument("--chunked-offline", action="store_true", help="and offline on the chunker's audio (replay_bench.py --chunked-offline): two more columns")
    ap.add_argument("--count", type=Path, default=None, help="an earlier run's --out folder: count its texts again (tests/wer.py as it is now) instead of replaying")
    ap.add_argument("replay_args", nargs="*", help="after --: options for every replay_bench.py run")
    args = ap.parse_args()
    sets, conditions = args.sets.split(","), args.conditions.split(",")
    if bad := [s for s in sets if s not in SETS] + [c for c in conditions if c not in CONDITIONS]:
        ap.error(f"unknown set or condition: {', '.join(bad)}")
    try:
        speeds = [float(s) for s in args.speeds.split(",")]
    except ValueError:
        ap.error("--speeds is a comma-separated list of numbers")
    if not all(0.5 <= s <= 2.0 for s in speeds) or args.jobs < 1:
        ap.error("--speeds are factors from 0.5 to 2, --jobs at least 1")
    cells = [Cell(s, c, v) for s in sets for c in conditions for v in speeds]
    extra = [*args.replay_args, *(["--chunked-offline"] if args.chunked_offline else [])]
    against = earlier(args.against, cells) if args.against else None
    if args.count:
        print(report(earlier(args.count, cells), against, args.chunked_offline))
        return
    with tempfile.TemporaryDirectory(prefix="replay-matrix-") as scratch:
        heldout = args.heldout_dir or Path(scratch)
        if any(s != "fixtures" for s in sets):
            write_heldout(heldout, sets)
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            tallies = list(pool.map(lambda c: run_cell(c, heldout, out, extra), cells))
    print(report(dict(zip(cells, tallies, strict=True)), against, args.chunked_offline))


if __name__ == "__main__":
    main()
