"""``asr-client``: caption a file or the microphone from a terminal.

    asr-client file PATH [--fast] [--json | --transcript | --turns | --subtitles srt|vtt | --settled]
    asr-client mic [--device N] [--json | --transcript | --turns | --subtitles srt|vtt | --settled]

Options that apply to both (``--url``, ``--json``, ``--transcript``,
``--turns``, ``--subtitles``, ``--settled``, ``--no-interim``, ``--language``,
``--endpoint-ms``) may come before or after the command. ``--transcript``
prints the transcript as the stream left it (the server's revisions applied)
when it ends, and shows the live captions on stderr meanwhile: ``asr-client
file talk.wav --fast --transcript > talk.txt``. ``--turns`` prints the same
transcript a turn a line, in the order they were spoken, each with its time
(and channel): a call's turns, a party's utterances joined until the other
speaks or it pauses 2 s. ``--subtitles srt`` (or ``vtt``) prints
it as subtitles, cut for reading by the server: ``asr-client file talk.mp4
--fast --subtitles srt > talk.srt``. ``--settled`` prints the text as it goes:
each stretch once the server has settled it (it will not change again), the
rest when the stream ends: ``asr-client mic --settled >> notes.txt``.
Without any of these, a pipe or file gets the first-pass finals one a line as
they come, and at the end a line on stderr says how many of them the server
revised after they were printed (a terminal has them rewritten in place).
Exit status: 0 when the server finished the transcript (``closed``), 1 when
it ended the stream early or with an error, 2 when the file or the server
could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import ssl
import sys
from typing import Any, TextIO

from . import __version__
from .client import CONTINUING_ERRORS, MODEL_RATE, AudioFileError, ServerError, Transcript, Turn, connect, fetch_transcript, read_pcm, speaker_turns, stream_bytes, websocket_url

DEFAULT_URL = "ws://127.0.0.1:8765"


class Display:
    """Interims rewrite the current line in place; finals stay; revisions rewrite finals.

    On a terminal the live line is redrawn with a carriage return, and a
    ``revision`` (the server's second pass) redraws the final lines it
    changes, as far up as the screen still shows them. When the output is a
    pipe or file only first-pass finals are printed, one per line (``--json``
    gives every message, revisions included; ``--transcript`` the revised
    transcript when the stream ends); ``outdated`` counts the lines printed
    there that a revision changed afterwards, so that the CLI can say so.
    """

    def __init__(self, out: TextIO, channels: int = 1) -> None:
        self.out = out
        self.tty = out.isatty()
        self.channels = channels
        self._live = False
        # Final lines on screen: (channel, utterance, where the line's text starts in the channel's transcript, text).
        self._lines: list[tuple[int, int, int, str]] = []
        self._outdated: set[tuple[int, int]] = set()  # (channel, utterance) of printed lines revised since

    @property
    def outdated(self) -> int:
        """Lines printed to a pipe or file that a revision changed after they were written."""
        return len(self._outdated)

    def _label(self, message: dict[str, Any]) -> str:
        return f"[ch{message['channel']}] " if self.channels > 1 else ""

    def show(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "interim" and self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            line = fit_tail(self._label(message) + message["text"], width)
            self.out.write("\r\x1b[K\x1b[2m" + line + "\x1b[0m")
            self._live = True
        elif kind == "final":
            if self._live:
                self.out.write("\r\x1b[K")
                self._live = False
            if message["text"]:
                self.out.write(self._label(message) + message["text"] + "\n")
            # An empty final keeps its place, unseen: a revision can give it words.
            self._lines.append((message["channel"], message["utterance"], message["offset"], message["text"]))
        elif kind == "revision" and self.tty:
            self._revise(message)
        elif kind == "revision":
            printed = {(ch, u) for ch, u, _offset, text in self._lines if text}
            changed = message.get("changed", range(message["utterances"][0], message["utterances"][1] + 1))
            self._outdated |= {(message["channel"], u) for u in changed} & printed
        elif kind == "error":
            self.clear()
            print(f"error {message['code']}: {message['message']}", file=sys.stderr)
        elif kind == "reconnecting":
            self.clear()
            print("connection lost; reconnecting...", file=sys.stderr)
        elif kind == "resumed":
            print(f"reconnected: {message['replayed']} missed messages received", file=sys.stderr)
        self.out.flush()

    def _revise(self, message: dict[str, Any]) -> None:
        """Redraw the channel's final lines the revision covers, and every line below them. Each
        utterance keeps its own line where the revision says where its utterances start
        (``segments``), so a call's turns stay in the order they were spoken; from a server
        that does not, the lines from the one holding the revision's offset become one (that
        line keeps its words before the offset). A redraw taller than the screen shows its end
        (the cursor stops at the top); what scrolled away stays as it was."""
        channel = message["channel"]
        parts = _segment_texts(message)
        held = {utt for ch, utt, _, _ in self._lines if ch == channel}
        first = message["utterances"][0]
        if parts is not None and set(parts) <= held:
            at = next(i for i, (ch, utt, _, _) in enumerate(self._lines) if ch == channel and utt >= first)
            end = message["offset"] + len(message["text"]) + 1
            # An utterance the revision left with no text keeps its place, unseen, where the next one starts.
            lines = [line if line[0] != channel else (channel, line[1], *parts[line[1]]) if line[1] in parts else
                     (channel, line[1], min((parts[u][0] for u in parts if u > line[1]), default=end), "")
                     for line in self._lines[at:]]
        else:
            at, lines = self._joined(message)
        self.clear()
        rows = self._height(self._lines[at:])
        if rows:
            self.out.write(f"\x1b[{rows}F\x1b[J")
        self.out.write("".join(self._label({"channel": ch}) + text + "\n" for ch, _, _, text in lines if text))
        self._lines[at:] = lines

    def _joined(self, message: dict[str, Any]) -> tuple[int, list[tuple[int, int, int, str]]]:
        """Where to redraw from, and the lines from there, for a revision without ``segments``: the
        channel's lines from the one holding its offset become one, which keeps its words before
        the offset; other channels' lines follow it."""
        channel, offset = message["channel"], message["offset"]
        mine = [i for i, (ch, _, start, _) in enumerate(self._lines) if ch == channel]
        at = next((i for i in reversed(mine) if self._lines[i][2] <= offset), mine[0] if mine else len(self._lines))
        _, utt, start, text = self._lines[at] if at < len(self._lines) else (channel, message["utterances"][0], offset, "")
        before = text[: max(0, offset - 1 - start)].rstrip() if start < offset else ""
        revised = (before + " " + message["text"]) if before else message["text"]
        kept = [line for line in self._lines[at:] if line[0] != channel]
        return at, [(channel, utt, min(start, offset), revised), *kept]

    def _height(self, lines: list[tuple[int, int, int, str]]) -> int:
        """Terminal rows the lines take, wrapped at the terminal's width."""
        columns = max(1, shutil.get_terminal_size((100, 20)).columns)
        return sum(max(1, -(-len(self._label({"channel": ch}) + text) // columns)) for ch, _, _, text in lines if text)

    def clear(self) -> None:
        if self._live:
            self.out.write("\r\x1b[K")
            self._live = False
            self.out.flush()


def _segment_texts(message: dict[str, Any]) -> dict[int, tuple[int, str]] | None:
    """A revision's text per utterance, by its ``segments``: {utterance: (offset, text)}; None
    when it has none (a server from before they were sent)."""
    parts = message.get("segments")
    if not parts:
        return None
    base, text = message["offset"], message["text"]
    ends = [p["offset"] - 1 for p in parts[1:]] + [base + len(text)]
    return {p["utterance"]: (p["offset"], text[p["offset"] - base : end - base]) for p, end in zip(parts, ends)}


def fit_tail(line: str, width: int) -> str:
    """The end of ``line`` in ``width`` characters, cut at a word: that is where the words are arriving."""
    if len(line) <= width:
        return line
    tail = line[len(line) - (width - 1) :]
    space = tail.find(" ")
    if 0 <= space < len(tail) - 1:
        tail = tail[space + 1 :]
    return "…" + tail


class SettledLines:
    """``--settled``: each channel's transcript on ``out`` as the server settles it, one line per
    ``settled`` message (revisions applied; a line never changes once written), and at the end
    what was not settled yet, so that a channel's lines joined are its transcript."""

    def __init__(self, out: TextIO, transcript: Transcript) -> None:
        self.out = out
        self.transcript = transcript
        self._written: dict[int, int] = {}  # per channel, how much of its text is out

    def see(self, message: dict[str, Any], channels: int) -> None:
        """After ``transcript`` has applied ``message``."""
        if message["type"] == "settled":
            self._write(message["channel"], self.transcript.settled_text(message["channel"]), channels)

    def rest(self, channels: int) -> None:
        for ch in range(channels):
            self._write(ch, self.transcript.final_text(ch), channels)

    def _write(self, channel: int, text: str, channels: int) -> None:
        new = text[self._written.get(channel, 0) :].strip()
        self._written[channel] = max(self._written.get(channel, 0), len(text))
        if new:
            self.out.write((f"[ch{channel}] " if channels > 1 else "") + new + "\n")
            self.out.flush()


def _options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {"language": args.language, "endpoint_ms": args.endpoint_ms}
    if args.api_key:
        opts["api_key"] = args.api_key
    if args.no_interim:
        opts["interim_results"] = False
    if args.heartbeat > 0:
        opts["heartbeat_s"] = args.heartbeat
    if args.prompt:
        opts["prompt"] = args.prompt
    if args.priority:
        opts["priority"] = args.priority
    if args.no_revisions:
        opts["revisions"] = False
    return opts


async def run_file(args: argparse.Namespace) -> int:
    try:
        pcm, channels = read_pcm(args.path, MODEL_RATE, args.channels)
    except AudioFileError as exc:
        print(f"asr-client: {exc}", file=sys.stderr)
        return 2
    captions = Captions(args)
    async for item in stream_bytes(args.url, pcm, bytes_per_second=MODEL_RATE * 2 * channels, realtime=not args.fast,
                                   encoding="pcm_s16le", sample_rate=MODEL_RATE, channels=channels, **_options(args)):
        captions.see(item.message)
    return captions.finish()


class Captions:
    """What the CLI makes of the server's messages: the live display (or ``--json``), the
    transcript with revisions applied, ``--settled`` lines, and the outcome."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        text_at_end = args.transcript or args.turns or args.settled or args.subtitles  # the live captions go to stderr
        self.display = Display(sys.stderr if text_at_end else sys.stdout)
        self.finals_out = not (args.json or text_at_end)  # the first-pass finals are the output
        self.outcome, self.transcript = Outcome(), Transcript()
        self.settled = SettledLines(sys.stdout, self.transcript) if args.settled else None

    def see(self, message: dict[str, Any]) -> None:
        if message["type"] == "session":
            self.display.channels = message["config"]["channels"]
        if self.args.json:
            print(json.dumps(message), flush=True)
        else:
            self.display.show(message)
        self.transcript.apply(message)
        if self.settled is not None:
            self.settled.see(message, self.display.channels)
        self.outcome.see(message)

    def finish(self) -> int:
        """Once the stream has ended: what the options print then (:func:`finish`), and the exit status."""
        self.display.clear()
        if self.display.outdated and self.finals_out:
            n = self.display.outdated
            print(f"asr-client: the server revised {n} line{'s' if n > 1 else ''} after printing {'them' if n > 1 else 'it'} "
                  "(the output is not a terminal, so printed lines are not rewritten); --transcript prints the revised "
                  "transcript at the end, --settled each stretch once it will not change", file=sys.stderr)
        return finish(self.args, self.transcript, self.outcome, self.display.channels, self.settled)


def finish(args: argparse.Namespace, transcript: Transcript, outcome: Outcome, channels: int, settled: SettledLines | None = None) -> int:
    """With ``--transcript``, print each channel's transcript as the stream left it
    (revisions applied), one line per channel; with ``--turns``, one line per turn in spoken
    order; with ``--settled``, what is not out yet. Then the exit status."""
    if settled is not None:
        settled.rest(channels)
    if args.transcript:
        for ch in range(channels):
            label = f"[ch{ch}] " if channels > 1 else ""
            print(label + transcript.final_text(ch), flush=True)
    if args.turns:
        for turn in speaker_turns(transcript.turns()):
            print(turn_line(turn, channels), flush=True)
    status = outcome.status()
    if args.subtitles and outcome.session_id and status == 0:
        return print_subtitles(args, outcome.session_id)
    return status


def print_subtitles(args: argparse.Namespace, session_id: str) -> int:
    """``--subtitles``: the server's subtitles of the finished session, on stdout."""
    try:
        sys.stdout.write(fetch_transcript(args.url, session_id, args.subtitles, api_key=args.api_key))
    except ServerError as exc:
        print(f"asr-client: the server gave no subtitles ({exc}); it keeps a session's transcript for "
              f"--ended-session-ttl after its end", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"asr-client: cannot fetch the subtitles from {args.url}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    return 0


def turn_line(turn: Turn, channels: int) -> str:
    """``[00:03.2 ch1] text``: when the utterance starts (stream time), its channel when there
    are several, and its text."""
    label = f" ch{turn.channel}" if channels > 1 else ""
    return f"[{clock(turn.start)}{label}] {turn.text}"


def clock(seconds: float | None) -> str:
    """Stream seconds as ``MM:SS.s`` (``H:MM:SS.s`` from an hour on); ``--:--.-`` when unknown."""
    if seconds is None:
        return "--:--.-"
    tenths = round(seconds * 10)
    hours, rest = divmod(tenths, 36000)
    minutes, rest = divmod(rest, 600)
    stamp = f"{minutes:02d}:{rest // 10:02d}.{rest % 10}"
    return f"{hours}:{stamp}" if hours else stamp


class Outcome:
    """The exit status of a stream: 0 only if the server finished it (``closed``) with no fatal error."""

    def __init__(self) -> None:
        self.closed = False
        self.fatal: dict[str, Any] | None = None
        self.session_id: str | None = None

    def see(self, message: dict[str, Any]) -> None:
        if message["type"] == "session":
            self.session_id = message.get("session_id", self.session_id)
        elif message["type"] == "closed":
            self.closed = True
        elif message["type"] == "error" and message["code"] not in CONTINUING_ERRORS:
            self.fatal = message

    def status(self) -> int:
        if self.closed and self.fatal is None:
            return 0
        why = f" ({self.fatal['code']})" if self.fatal else ""
        print(f"asr-client: the server ended the stream before the transcript was finished{why}", file=sys.stderr)
        return 1


async def run_mic(args: argparse.Namespace) -> int:
    """Caption the microphone until Ctrl-C; then finish the last sentence and exit."""
    try:
        import sounddevice  # type: ignore[import-not-found]
    except (ImportError, OSError) as exc:
        print(f"asr-client mic needs the 'mic' extra (pip install 'asr-client[mic]') and PortAudio: {exc}", file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()
    audio: asyncio.Queue[bytes] = asyncio.Queue(maxsize=50)  # 5 s; while it is full (the network stalled) new blocks are dropped
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, stop.set)

    def enqueue(data: bytes) -> None:
        if not audio.full():
            audio.put_nowait(data)

    def on_audio(indata: Any, frames: int, time_info: Any, status: Any) -> None:  # PortAudio's thread
        loop.call_soon_threadsafe(enqueue, bytes(indata))

    captions = Captions(args)
    async with connect(args.url, encoding="pcm_s16le", sample_rate=MODEL_RATE, channels=1, **_options(args)) as stream:

        async def pump() -> None:
            with sounddevice.RawInputStream(samplerate=MODEL_RATE, channels=1, dtype="int16", blocksize=1600,
                                            device=args.device, callback=on_audio):
                print("listening; Ctrl-C to stop", file=sys.stderr)
                while not stop.is_set():
                    waiter = asyncio.ensure_future(audio.get())
                    stopper = asyncio.ensure_future(stop.wait())
                    await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
                    stopper.cancel()
                    if waiter.done():
                        await stream.send_audio(waiter.result())
                    else:
                        waiter.cancel()
            while not audio.empty():
                await stream.send_audio(audio.get_nowait())
            await stream.close_stream()  # the server finalizes the last sentence, then closes

        sender = asyncio.create_task(pump())
        async for message in stream:
            captions.see(message)
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
    return captions.finish()


def _add_common(p: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The options of every command; a subcommand's copy only overrides what is given after it."""

    def d(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    p.add_argument("--url", "--server", dest="url", default=d(os.environ.get("ASR_URL") or DEFAULT_URL),
                   help=f"server address, with a proxy's path if any (default: $ASR_URL, else {DEFAULT_URL})")
    p.add_argument("--language", default=d("en"))
    p.add_argument("--endpoint-ms", type=int, default=d(500))
    p.add_argument("--no-interim", action="store_true", default=d(False), help="finals only")
    p.add_argument("--prompt", default=d(None),
                   help="words the audio is likely to hold, for the model to prefer (names, jargon: 'Dashwood, Norland Park'; "
                        "up to 200 characters)")
    p.add_argument("--priority", choices=("interactive", "standard", "batch"), default=d(None),
                   help="the stream's share of the server when streams compete (default interactive; batch for a file "
                        "that need not keep up with live captions)")
    p.add_argument("--no-revisions", action="store_true", default=d(False),
                   help="no context pass: the first-pass finals are the transcript")
    p.add_argument("--json", action="store_true", default=d(False), help="print every server message as JSON")
    p.add_argument("--transcript", action="store_true", default=d(False),
                   help="when the stream ends, print the transcript with the server's revisions applied, one line per "
                        "channel (the live captions go to stderr meanwhile)")
    p.add_argument("--turns", action="store_true", default=d(False),
                   help="when the stream ends, print the transcript with the server's revisions applied, one line per "
                        "turn in the order they were spoken, each with its start time and channel: a call's turns (a "
                        "party's utterances until the other speaks or it pauses 2 s)")
    p.add_argument("--subtitles", choices=("srt", "vtt"), default=d(None),
                   help="when the stream ends, print the transcript as SubRip or WebVTT subtitles, revisions applied, "
                        "cut into cues by the server (the live captions go to stderr)")
    p.add_argument("--settled", action="store_true", default=d(False),
                   help="print the transcript as the server settles it: each stretch once it will not change again, "
                        "revisions applied, and the rest when the stream ends (the live captions go to stderr)")
    p.add_argument("--api-key", default=d(os.environ.get("ASR_API_KEY")), help="the server's API key (default: $ASR_API_KEY)")
    p.add_argument("--heartbeat", type=float, default=d(5.0),
                   help="ask the server for a heartbeat message after this many seconds without a message, and take a "
                        "connection that brings none for twice that plus 5 s as dropped, and resume it (default 5; 0: none)")


class _Parser(argparse.ArgumentParser):
    """argparse, except that an option it does not know, given before the command, is reported as
    such: argparse takes the option's value for the command and names that ("invalid choice: 'ws://...'")."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> Any:
        if message.startswith("argument command: invalid choice"):
            unknown = [a for a in getattr(self, "_argv", []) if a.startswith("--") and a.split("=")[0] not in self._option_string_actions]
            if unknown:
                message = f"unknown option {unknown[0].split('=')[0]} (see asr-client --help; the server's address is --url)"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="asr-client", description="Live captions from asr-server.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_common(p, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, defaults=False)
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("file", parents=[common], help="transcribe an audio file (any format PyAV reads)")
    f.add_argument("path")
    f.add_argument("--fast", action="store_true", help="send as fast as the server accepts instead of real-time pace")
    f.add_argument("--channels", type=int, default=None, help="1 mixes down; default keeps the file's channels")
    m = sub.add_parser("mic", parents=[common], help="caption the microphone live")
    m.add_argument("--device", default=None, help="input device name or number (see python -m sounddevice)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if sum((args.json, args.transcript, args.turns, bool(args.subtitles), args.settled)) > 1:
        parser.error("--json, --transcript, --turns, --subtitles and --settled all write to stdout: choose one")
    try:
        websocket_url(args.url)
    except ValueError as exc:
        parser.error(str(exc))
    runner = run_file if args.command == "file" else run_mic
    try:
        return asyncio.run(runner(args))
    except KeyboardInterrupt:
        return 130
    except ServerError as exc:
        print(f"asr-client: the server refused the stream: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"asr-client: cannot reach {args.url}: {str(exc) or type(exc).__name__}{_tls_hint(args.url, exc)}", file=sys.stderr)
        return 2


def _tls_hint(url: str, exc: OSError) -> str:
    """A TLS handshake with a server that serves plain ws:// is cut off: say so."""
    if websocket_url(url).startswith("wss://") and isinstance(exc, (ConnectionResetError, ssl.SSLError)):
        return " (is it serving TLS? a server started without --certfile is at ws://)"
    return ""


if __name__ == "__main__":
    sys.exit(main())
