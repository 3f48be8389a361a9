"""Deterministic replay: fixtures through the session core and the real model, with no pacing and no queue.

    python bench/replay_bench.py [--fixtures a,b,...] [--noise-db 20] [--room] [--voices-db 20] [--far-db 14] [--gain-db -30 [--bursts-dbfs -6]] [--events-dbfs -30] [--phone] [--context-back-s 24] [--context-ahead-s 3] [--context-settle-window-s 30]
                                 [--lean [--lean-context-encoder-pad-s 10]] [--late [--context-late-back-s 0]] [--interims]
                                 [--split-after-s 3] [--prompt "Dashwood, Babylon"] [--fast-reader] [--load-streams] [--speed 1.1]
                                 [--offline] [--chunked-offline] [--json out.json]

Feeds each fixture channel, 100 ms at a time, into a :class:`~asr_server.session.Session`
(the server's own VAD, chunker and decoder) and runs every decode it asks for at once on
the embedded model, context passes included, then reports the word error rate of the
first-pass finals and of the transcript after revisions, per channel and pooled. The
streams ask for no interims, but as the server does for such a stream, an utterance longer
than ``--split-after-s`` (the stream option) is still decoded as it grows, to split it at
a sentence end. With ``--interims`` every interim is decoded too (not scored): slower, but
the finals are those a client with interims gets.

It also gives each sentence's final latency in audio time: how much audio had been fed
past the end of its speech (found in the audio, as ``stream_bench.py`` finds it) when its
final came. Decodes take no time here, so this is what the endpoint and split rules alone
cost, the same on every run; ``--fast-reader`` (every pause of the one-channel recordings
cut to 0.12 s, as ``stream_bench.py --fast-reader``) is where the split rules matter.

With ``--load-streams`` it replays, instead of the fixtures, the streams ``load_bench.py``
sends (its recordings, each as its first two copies get it: rotated at a pause, two rounds),
longer than the fixtures alone, so that the prompt and the decided audio before a window
matter; ``--lean`` then decodes them as passes run under load (only the utterances they
decide, on the audio plus ``--lean-context-encoder-pad-s``; ``--context-back-s 0`` leaves
the decided ones out too, but keeps the full window). ``--late`` decodes every pass as the
server does while passes wait their turn (``--context-late-s``): at most
``--context-late-back-s`` of decided audio, on the lean window, the finals as at rest, and no
settle decodes (the server has no time to spare then); compare it with
``--context-settle-window-s 0``, whole passes without settle decodes.

``--speed F`` plays every recording F times as fast (0.9: slower), pitch and all, as ASR
training's speed perturbation does: the recordings of real people among the fixtures
(LibriVox, LJSpeech, the card names) become other recordings the rules were never measured
on, and a change to a rule can be judged on more than one take of each (a single word that a
rule flips on one take by chance need not flip on the next).

``--bursts-dbfs X`` adds, after the gain, a 0.3 s burst of pink noise at X dBFS (a cough,
a knock near the microphone) every 5.3 s from 2.5 s on, several inside sentences: with
``--gain-db -30`` they are far louder than the talker (``-6``: about 40 dB over the speech).

``--events-dbfs X`` replays the one-channel recordings with 1.8 s put after every other
sentence, holding a sound that is not speech at X dBFS (``stream_bench.with_events``: a cough,
typing, a phone's ringback tone, a knock, a chair scraping, a beep, in turn): any word written
there is one the talker never said. The fixtures' speech is about -24 dBFS.

``--offline`` adds a column: faster-whisper's own transcription of each channel (beam 5, its
VAD filter). ``--chunked-offline`` adds another: the same transcription, without the VAD filter,
of the audio the server's VAD and chunker kept for the finals, each utterance joined to the next
as a context pass joins them (``window_request``), decoded in one go as offline decodes a
recording (30 s windows in turn, each prompted with the text before). It splits the gap after
revisions minus offline in two: offline minus this column is what the VAD and chunker cost
(speech they cut, pauses they shorten), and after revisions minus this column is what the
two passes' windows and votes cost against one sequential decode of the same audio.

It also prints how many context passes ran and their model time per audio second (the
runner's own decode times). Nothing waits, and Whisper's fallback samples with a fixed
seed, so the result is the same on every run and takes about two minutes on two cores: use
it to compare decoding rules (a revision rule, a window, a prompt) without the one-word
swings of real-time runs. It is not what a user sees: in a real-time run a
context pass waits its turn and takes in the finals that came meanwhile, so its windows
differ (measured under pink noise 20 dB down: 0.071 after revisions here against 0.059 in
``stream_bench.py``). Latency and capacity figures come from ``stream_bench.py`` and
``load_bench.py`` only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import ctranslate2  # noqa: E402
import numpy as np  # noqa: E402
from asr_client import Transcript  # noqa: E402
from load_bench import FIXTURES as LOAD_FIXTURES, replayed, rotation_cut, round_turns  # noqa: E402
from stream_bench import DEFAULT_FIXTURES, covering_latencies, fixture_names, load_channels, noisy_pcm, offline_text, pct, pink_noise, speech_ends, one_channel, use_events, use_fast_reader, use_fixture_dir, wire_rate  # noqa: E402

from asr_server.audio.vad import VadOptions  # noqa: E402
from asr_server.decoding.context import ContextOptions, Finalized, window_request  # noqa: E402
from asr_server.events import AnswerFailed, SubmitJob  # noqa: E402
from asr_server.inference.types import DecodeKind  # noqa: E402
from asr_server.inference.whisper import DEFAULT_MODEL, SETTLE_BEAM_SIZE, WhisperRunner, resolve_model  # noqa: E402
from asr_server.inference.windows import LEAN_CONTEXT_PAD_S  # noqa: E402
from asr_server.options import StreamOptions  # noqa: E402
from asr_server.scheduler.governor import LoadSettings  # noqa: E402
from asr_server.session import Send, Session  # noqa: E402
from tests.harness import MANIFEST  # noqa: E402
from tests.wer import errors as word_errors, normalize  # noqa: E402

PIECE = 1600  # 100 ms at 16 kHz


class Replayer:
    """One channel through a session; every decode runs as soon as it is asked for."""

    def __init__(self, runner: WhisperRunner, context: ContextOptions, options: StreamOptions, lean: bool = False,
                 vad: VadOptions = VadOptions(), late: bool = False) -> None:
        self.runner = runner
        self.session = Session("replay", options, vad_options=vad, context=context)
        self.transcript = Transcript()
        self.finals: list[str] = []
        self.final_at: list[tuple[float, float, float]] = []  # per non-empty final: (audio fed when it came, its start, its end), s
        self.reasons: dict[str, int] = {}
        self.empty = 0  # finals with no words
        self._shown: dict[int, int] = {}  # utterance -> audio fed when an interim first showed its words
        self.phantoms = 0  # utterances whose interims showed words and whose final came out empty
        self.unshown = 0  # non-empty finals whose words no interim showed before the final came
        self._fed = 0
        self._passes: list = []
        self.pass_count = 0
        self.pass_model_s = 0.0  # model time of the context passes (the runner's decode_s)
        self.kept: list[Finalized] = []  # each non-empty final's utterance as the decoder keeps it for the passes
        self._apply(self.session.start())
        if lean:  # as the governor sets it under load (level 1 and up)
            self._apply(self.session.set_load(LoadSettings(level=1, lean_context=True)))
        elif late:  # as the server sets it while passes wait their turn (--context-late-s): no settle decodes either
            self._apply(self.session.set_load(LoadSettings(late_context=True)))

    def run(self, audio: np.ndarray) -> tuple[str, str]:
        """(first-pass finals, transcript after revisions) of ``audio`` (16 kHz float)."""
        for i in range(0, len(audio), PIECE):
            self._fed = min(len(audio), i + PIECE)
            self._apply(self.session.receive_audio(audio[i : i + PIECE].reshape(1, -1)))
            self._run_passes()
        self._apply(self.session.end_of_stream())
        self._run_passes()
        return " ".join(self.finals), self.transcript.final_text()

    def _run_passes(self) -> None:
        while self._passes:
            job = self._passes.pop(0)
            job = self.session.refresh_job(job) or job
            hypothesis = self.runner.transcribe(job.request)
            self.pass_count += 1
            self.pass_model_s += hypothesis.decode_s
            self._apply(self.session.job_done(job, hypothesis))

    def _apply(self, outputs) -> None:
        for out in outputs:
            if isinstance(out, Send):
                self.transcript.apply(out.message)
                self._interims(out.message)
                self.empty += out.message["type"] == "final" and not out.message["text"]
                if out.message["type"] == "final" and out.message["text"]:
                    self._keep(out.message["utterance"])
                    self.finals.append(out.message["text"])
                    self.final_at.append((self._fed / 16000, out.message["start"], out.message["end"]))
                    self.reasons[out.message["reason"]] = self.reasons.get(out.message["reason"], 0) + 1
            elif isinstance(out, AnswerFailed):  # the server goes on without it; a replay stops to show it
                raise out.error
            elif isinstance(out, SubmitJob):
                if out.job.request.kind is DecodeKind.CONTEXT:
                    self._passes.append(out.job)
                else:
                    self._apply(self.session.job_done(out.job, self.runner.transcribe(out.job.request)))

    def _interims(self, message: dict) -> None:
        if message["type"] == "interim" and message["text"]:
            self._shown.setdefault(message["utterance"], self._fed)
        elif message["type"] == "final":
            # Decodes are instant here: an interim first shown with no more audio fed than its
            # final came with it (the one the server sends just before a final no interim preceded).
            shown = self._shown.get(message["utterance"], self._fed) < self._fed
            self.phantoms += message["utterance"] in self._shown and not message["text"]
            self.unshown += bool(message["text"]) and not shown

    def _keep(self, utterance: int) -> None:
        # The decoder's own record (a bench may look inside): its audio is what the chunker kept.
        self.kept += [r for r in self.session._decoders[0]._done if r.index == utterance]

    def kept_audio(self, context: ContextOptions) -> np.ndarray:
        """The audio of every final, joined as a context pass joins utterances (:func:`window_request`)."""
        if not self.kept:
            return np.zeros(0, np.float32)
        return window_request(self.kept, context, "en", "")[0].audio


def audio_latencies(replayer: Replayer, name: str, ch: int, speed: float = 1.0) -> list[float]:
    """Per sentence of a fixture channel: audio fed past the end of its speech when the first final
    covering that end came (``speed``: the recording as :func:`faster` played it)."""
    spans = [[start / speed, end / speed] for start, end in MANIFEST[name]["spans"][ch]]
    return covering_latencies(replayer.final_at, speech_ends(faster(load_channels(name)[ch], speed), spans))


def faster(audio: np.ndarray, speed: float) -> np.ndarray:
    """``audio`` (16 kHz) played ``speed`` times as fast, pitch and all: resampled by linear
    interpolation (speech has little above the 7 kHz that 1.1 folds back)."""
    if speed == 1.0:
        return audio
    at = np.arange(0.0, len(audio) - 1, speed)
    return np.interp(at, np.arange(len(audio)), audio).astype(np.float32)


def with_bursts(audio: np.ndarray, dbfs: float | None, seed: int) -> np.ndarray:
    """``audio`` (16 kHz) with a 0.3 s burst of pink noise at ``dbfs`` (its RMS, under a Hann
    window) every 5.3 s from 2.5 s on, clipped to full scale (None: as it is)."""
    if dbfs is None:
        return audio
    out, burst, rng = audio.astype(np.float32).copy(), int(0.3 * 16000), np.random.default_rng(seed)
    for at in range(int(2.5 * 16000), len(out) - burst, int(5.3 * 16000)):
        out[at : at + burst] += pink_noise(burst, int(rng.integers(1 << 30))) * np.hanning(burst).astype(np.float32) * np.float32(10 ** (dbfs / 20))
    return np.clip(out, -1, 1)


def streams(args: argparse.Namespace):
    """(label, each channel's 16 kHz audio, each channel's reference sentences, the stream's
    sample rate on the wire) per stream to replay."""
    if not args.load_streams:
        for name in fixture_names(args.fixtures):
            channels = [with_bursts(faster(a, args.speed), args.bursts_dbfs, 7 + ch)
                        for ch, a in enumerate(noisy_pcm(name, args.noise_db, args.room, args.phone, args.voices_db, args.gain_db, args.far_db)[1])]
            yield name, channels, MANIFEST[name]["references"], wire_rate(name, args.noise_db, args.room, args.phone, args.voices_db, args.gain_db, args.far_db)
        return
    rounds = 2
    for name in LOAD_FIXTURES:
        channels = [faster(a, args.speed) for a in noisy_pcm(name, args.noise_db, args.room, args.phone, args.voices_db, args.gain_db, args.far_db)[1]]
        for turn in (0, 1):  # as load_bench.py deals the first two copies of a recording
            cuts = [int(rotation_cut(MANIFEST[name], t) / args.speed * 16000) for t in round_turns(turn, rounds)]
            audio = [np.concatenate([np.concatenate([a[at:], a[:at]]) for at in cuts]) for a in channels]
            yield f"{name} turn {turn}", audio, replayed(name, turn, rounds)[1]["references"], wire_rate(name, args.noise_db, args.room, args.phone, args.voices_db, args.gain_db, args.far_db)



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", default=DEFAULT_FIXTURES, help="comma-separated names in the manifest, or all")
    ap.add_argument("--fixture-dir", type=Path, default=None, help="recordings and manifest.json from this folder (bench/heldout.py writes one)")
    ap.add_argument("--noise-db", type=float, default=None, help="continuous pink noise this many dB below the speech")
    ap.add_argument("--room", action="store_true", help="reverberate (RT60 0.5 s) over room tone")
    ap.add_argument("--talker-floor-db", type=float, default=VadOptions.talker_floor_db, help="the VAD gate's option (0: off)")
    ap.add_argument("--talker-final-db", type=float, default=VadOptions.talker_final_db, help="a final this far under the channel's recent ones, and unsure, is dropped (0, the default: off; the server's option)")
    ap.add_argument("--talker-silence-db", type=float, default=VadOptions.talker_silence_db, help="the VAD gate's energy floor under the talker's level (0: off)")
    ap.add_argument("--voices-db", type=float, default=None, help="three other people talking (backwards: no words) this many dB below the speech")
    ap.add_argument("--far-db", type=float, default=None, help="every other sentence this many dB down: a second talker far from the microphone (a meeting room)")
    ap.add_argument("--gain-db", type=float, default=0.0, help="turn the audio down (negative) or up this much, in 16-bit steps, as a quiet microphone delivers it")
    ap.add_argument("--bursts-dbfs", type=float, default=None, help="after the gain, a 0.3 s pink-noise burst at this level (dBFS) every 5.3 s: a cough or a knock near the microphone")
    ap.add_argument("--events-dbfs", type=float, default=None, help="one-channel recordings with a sound that is not speech (a cough, typing, a ringback tone, a knock, a chair, a beep) "
                    "at this level (dBFS) in 1.8 s put after every other sentence")
    ap.add_argument("--phone", action="store_true", help="as a phone line carries it: 300-3400 Hz, 8 kHz mu-law, decoded as the server does")
    ap.add_argument("--context-back-s", type=float, default=ContextOptions().back_s)
    ap.add_argument("--context-ahead-s", type=float, default=ContextOptions().ahead_s, help="a pass may decide the newest final once the next utterance holds this much (0: once the next final came)")
    ap.add_argument("--context-settle-window-s", type=float, default=ContextOptions().settle_window_s, help="the settle decodes' window (0: none)")
    ap.add_argument("--settle-beam-size", type=int, default=SETTLE_BEAM_SIZE, help="the settle decodes' beam (the server's --settle-beam-size)")
    ap.add_argument("--lean", action="store_true", help="passes as under load: only the utterances they decide, on the lean window")
    ap.add_argument("--late", action="store_true", help="passes as while they wait their turn (the server's --context-late-s): at most --context-late-back-s "
                    "of decided audio, on the lean window, the finals as at rest; no settle decodes")
    ap.add_argument("--context-late-back-s", type=float, default=ContextOptions().late_back_s)
    ap.add_argument("--lean-context-encoder-pad-s", type=float, default=LEAN_CONTEXT_PAD_S, help="the lean window: the audio plus this (30: the full window)")
    ap.add_argument("--interims", action="store_true", help="decode every interim too (without it, only long utterances are, for sentence splits)")
    ap.add_argument("--split-after-s", type=float, default=StreamOptions().split_after_s)
    ap.add_argument("--prompt", default="", help="the streams' vocabulary prompt (the stream option: names, jargon)")
    ap.add_argument("--compute-type", default="auto")
    ap.add_argument("--fast-reader", action="store_true", help="every pause in the (one-channel) recordings cut to 0.12 s, as a fast reader leaves")
    ap.add_argument("--load-streams", action="store_true", help="replay load_bench.py's rotated two-round streams instead of the fixtures")
    ap.add_argument("--speed", type=float, default=1.0, help="play every recording this many times as fast, pitch and all (0.9: slower)")
    ap.add_argument("--offline", action="store_true", help="also transcribe each channel offline (faster-whisper, beam 5, VAD filter) for a third column")
    ap.add_argument("--chunked-offline", action="store_true", help="and offline-style (beam 5, no VAD filter) on the audio the chunker kept for the finals, "
                    "joined as a pass joins it, for another column: what the VAD and chunker cost (against offline) and what the windowed passes cost (after revisions against it)")
    ap.add_argument("--json", help="write the texts here")
    args = ap.parse_args()
    if (args.fast_reader or args.fixture_dir) and args.load_streams:
        ap.error("--fast-reader and --fixture-dir replay recordings, not --load-streams")
    if args.lean and args.late:
        ap.error("--lean and --late are two shapes of a pass: choose one")
    if not 0.5 <= args.speed <= 2.0:
        ap.error("--speed is a factor from 0.5 to 2 (1: as recorded)")
    use_fixture_dir(args.fixture_dir)
    if args.fast_reader:
        for name in fixture_names(args.fixtures):
            use_fast_reader(name)
    if args.events_dbfs is not None:
        args.fixtures = ",".join(one_channel(fixture_names(args.fixtures), "--events-dbfs"))
        for name in fixture_names(args.fixtures):
            use_events(name, args.events_dbfs)
    # Whisper's fallback samples when a decode fails its checks: a fixed seed keeps the replay the same on every run.
    ctranslate2.set_random_seed(1)
    runner = WhisperRunner(resolve_model(DEFAULT_MODEL), compute_type=args.compute_type, lean_context_pad_s=args.lean_context_encoder_pad_s,
                           settle_beam_size=args.settle_beam_size)
    runner.warm_up()
    context = ContextOptions(back_s=args.context_back_s, late_back_s=args.context_late_back_s, ahead_s=args.context_ahead_s, settle_window_s=args.context_settle_window_s)
    errors = [0, 0]
    offline_errors = chunked_errors = 0
    words = 0
    passes = [0, 0.0, 0.0]  # context passes, their model seconds, audio seconds replayed
    empty = 0
    shown = [0, 0, 0]  # finals that came out empty after interims showed words, non-empty finals no interim showed, non-empty finals
    texts = {}
    latencies: list[float] = []
    extra_cols = (" WER offline |" if args.offline else "") + (" WER offline, the chunker's audio |" if args.chunked_offline else "")
    print(f"| fixture | WER first-pass finals | WER after revisions |{extra_cols} finals by reason | final latency in audio time p50 / max (s) |\n|---|---|---|{'---|' * extra_cols.count('|')}---|---|")
    for name, channels, references, rate in streams(args):
        # Fed decoded 16 kHz audio either way; the stream's rate decides its VAD thresholds.
        options = StreamOptions(encoding="pcm_s16le", sample_rate=rate, interim_results=args.interims, split_after_s=args.split_after_s, prompt=args.prompt)
        for ch, audio in enumerate(channels):
            reference = " ".join(references[ch])
            n = len(normalize(reference))
            replayer = Replayer(runner, context, options, args.lean, VadOptions(talker_floor_db=args.talker_floor_db, talker_silence_db=args.talker_silence_db, talker_final_db=args.talker_final_db), args.late)
            first, revised = replayer.run(audio)
            passes = [passes[0] + replayer.pass_count, passes[1] + replayer.pass_model_s, passes[2] + len(audio) / 16000]
            empty += replayer.empty
            shown = [shown[0] + replayer.phantoms, shown[1] + replayer.unshown, shown[2] + len(replayer.finals)]
            e = [word_errors(reference, first)[0], word_errors(reference, revised)[0]]
            errors = [errors[0] + e[0], errors[1] + e[1]]
            columns, offline_said = "", None
            if args.offline:
                offline_said = offline_text(audio, args.compute_type)
                off = word_errors(reference, offline_said)[0]
                offline_errors += off
                columns = f" {off / n:.3f} |"
            if args.chunked_offline:
                chunked_said = offline_text(replayer.kept_audio(context), args.compute_type, vad_filter=False)
                off = word_errors(reference, chunked_said)[0]
                chunked_errors += off
                columns += f" {off / n:.3f} |"
            words += n
            texts[f"{name} ch{ch}"] = {"reference": " ".join(references[ch]), "first": first, "revised": revised}
            if offline_said is not None:
                texts[f"{name} ch{ch}"]["offline"] = offline_said
            if args.chunked_offline:
                texts[f"{name} ch{ch}"]["chunked"] = chunked_said
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(replayer.reasons.items()))
            late = audio_latencies(replayer, name, ch, args.speed) if not args.load_streams else []
            latencies += late
            print(f"| {name} ch{ch} | {e[0] / n:.3f} | {e[1] / n:.3f} |{columns} {reasons} | {pct(late, 0.5):.2f} / {max(late, default=float('nan')):.2f} |", flush=True)
    pooled_offline = (f" **{offline_errors / words:.3f}** |" if args.offline else "") + (f" **{chunked_errors / words:.3f}** |" if args.chunked_offline else "")
    print(f"| **pooled** | **{errors[0] / words:.3f}** | **{errors[1] / words:.3f}** |{pooled_offline}")
    if latencies:
        print(f"\nfinal latency in audio time (decodes instant): p50 {pct(latencies, 0.5):.2f}, p95 {pct(latencies, 0.95):.2f}, max {max(latencies):.2f} s (n={len(latencies)})")
    if args.interims:
        print(f"\ninterims: {shown[0]} utterances showed words and then came out empty; {shown[1]} of {shown[2]} non-empty finals had no interim shown before they came")
    print(f"\nfinals with no words (the table's reasons count only those with words): {empty}")
    print(f"\ncontext passes: {passes[0]}, {passes[1]:.1f} model s, {passes[1] / passes[2]:.3f} model s per audio s")
    if args.json:
        Path(args.json).write_text(json.dumps(texts, indent=1))


if __name__ == "__main__":
    main()
