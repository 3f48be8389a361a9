"""``asr-server``: load the model, listen, serve until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import logging
import math
import os
import re
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

# Before numpy loads: its OpenBLAS would start a thread per core that spins
# between the small matrix products of feature extraction (measured at 16
# streams on 2 cores: 0.23 cores busy for nothing). The model workers are
# where the parallelism is.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Bound the Hugging Face hub's requests (read when huggingface_hub loads), so that
# a size name not in the cache fails fast on a closed network instead of hanging.
# The program sets its environment here, at its entry point; library code never does.
os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")

from . import __version__
from .audio.vad import DETECTORS, VadOptions
from .decoding.context import ContextOptions
from .inference.priority import BACKGROUND_NICE
from .inference.whisper import (DEFAULT_MODEL, FINAL_BEAM_SIZE, SETTLE_BEAM_SIZE, FINAL_ENCODER_PAD_S, FULL_WINDOW_FRAMES, INTERIM_ENCODER_PAD_S, QUICK_FINAL_PAD_S, BURST_FINAL_PAD_S, SHORT_INTERIM_PAD_S,
                                LEAN_CONTEXT_PAD_S, ModelNotFound, WhisperRunner, resolve_model)
from .options import IceServer, Limits, RtcOptions
from .scheduler.capacity import CapacityModel
from .scheduler.governor import GovernorOptions
from .scheduler.budget import MemoryBudget, available_host_memory, cuda_free_memory, peak_rss, process_rss
from .scheduler.policy import CONTEXT_MAX_WAIT_S, CONTEXT_SHARE, BatchLimits
from .access import AccessOptions, ApiKey, is_loopback, parse_keys
from .server import AsrServer, Measure
from .tracing import tracing_from_environment
from .transport.gate import MAX_AUTO_CONNECTIONS, RESERVED_DESCRIPTORS, GateOptions, connections_for
from .webhooks import EVENTS, WebhookOptions

log = logging.getLogger("asr_server")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="asr-server", description="Real-time speech recognition over WebSocket.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8765, help="port to listen on; 0 picks a free one (default 8765)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="tiny.en (embedded, default), a CTranslate2 model directory, or a faster-whisper size name")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--compute-type", default="auto", help="CTranslate2 compute type: auto, int8, float16, float32, ... (default auto)")
    p.add_argument("--cpu-threads", type=_count_or_default, default=0, help="threads per model worker on CPU (default: cores / workers)")
    p.add_argument("--workers", type=_count_or_default, default=0, help="model calls run at once (default: on CPU one per core, plus one kept for finals on 2+ cores; on CUDA 6 for models of up to 200 MB of weights, such as tiny.en, else 3)")
    _decoding_options(p)
    p.add_argument("--idle-timeout", type=_positive, default=Limits.idle_timeout_s, help="seconds without any client message before the session is closed")
    p.add_argument("--max-frame-bytes", type=_count, default=Limits.max_frame_bytes, help="largest binary frame accepted")
    p.add_argument("--ended-session-ttl", type=_seconds, default=Limits.ended_session_ttl_s,
                   help="seconds an ended session's messages stay readable at /v1/sessions/{id}/events (0: not kept)")
    p.add_argument("--resume-ttl", type=_seconds, default=Limits.resume_ttl_s,
                   help="seconds a session whose connection dropped is held for its client to resume (0: sessions end with their connection)")
    p.add_argument("--max-channels", type=_count_or_zero, default=None,
                   help="channels transcribed at once; more streams are refused with 'overloaded' (default: measured: as many as "
                        "can all get a final within 1.5 s of speaking in step, from the model time of a final in a burst; 0: no limit)")
    _connection_options(p)
    p.add_argument("--max-batch", type=_count, default=None, help="decodes per model call (default 8 on CPU, 32 on CUDA)")
    p.add_argument("--max-batch-seconds", type=_positive, default=None,
                   help="padded encoder seconds per model call, which bounds how long one call takes (default 60 on CPU: two 30 s finals or four 15 s interims; 30 x max-batch on CUDA)")
    p.add_argument("--final-batch-seconds", type=_positive, default=None,
                   help="the same for calls of finals, where packed finals count their share of a shared window "
                        "(default 30 on CPU: one window, so finals waiting together spread over the workers; --max-batch-seconds on CUDA)")
    p.add_argument("--memory-limit", type=_count, default=None, metavar="MIB",
                   help="memory budget in MiB on CPU (default: half of the memory available at start); on CUDA the device's free memory is used (needs torch)")
    p.add_argument("--interim-model", default=None,
                   help="a smaller model for interim results under load (degradation step 2); same forms as --model (default: none)")
    p.add_argument("--ice-server", action="append", type=_ice_url, default=[], metavar="URL",
                   help="a STUN or TURN server for WebRTC (stun:host:port, turn:host:port?transport=udp); repeatable; "
                        "also sent to browsers. Default: none (host candidates: same host or LAN)")
    p.add_argument("--ice-username", default=None, help="username for the TURN servers given with --ice-server")
    p.add_argument("--ice-credential", default=None, help="credential for the TURN servers given with --ice-server")
    p.add_argument("--webrtc-host", action="append", type=_ip_address, default=[], metavar="ADDR",
                   help="offer only these local addresses as WebRTC host candidates (repeatable; 127.0.0.1 allowed). Default: every interface except loopback")
    p.add_argument("--webrtc-connect-timeout", type=_positive, default=Limits.webrtc_connect_timeout_s,
                   help="seconds for a WebRTC connection to come up after the answer (default %(default)s)")
    _access_options(p)
    p.add_argument("--certfile", default=None, help="TLS certificate (PEM): serve https and wss, which browsers on other machines need for the microphone")
    p.add_argument("--keyfile", default=None, help="TLS private key (PEM) for --certfile")
    _webhook_options(p)
    p.add_argument("--trace-ratio", type=_ratio, default=0.01,
                   help="share of streams traced whole with OpenTelemetry (needs the otel extra and an exporter in the standard "
                        "OTEL_* variables, e.g. OTEL_EXPORTER_OTLP_ENDPOINT; default %(default)s; 1 traces every stream)")
    p.add_argument("--log-level", default="INFO")
    return p


def _webhook_options(p: argparse.ArgumentParser) -> None:
    """Where finals, revisions and transcripts are POSTed, and which."""
    p.add_argument("--webhook", type=_http_url, default=None, metavar="URL", help="POST every final, revision and settled message, and each session's transcript, here (signed with --webhook-secret)")
    p.add_argument("--webhook-secret", default=None, help="secret for the webhooks' HMAC-SHA256 signature (Asr-Signature)")
    p.add_argument("--webhook-events", type=_webhook_events, default=EVENTS, metavar="LIST",
                   help=f"the events the webhooks get, comma-separated, of {','.join(EVENTS)} (default: all; "
                        "final,transcript: first-pass finals and the revised transcript at the end)")
    p.add_argument("--webhook-allow", action="append", type=_http_url, default=[], metavar="PREFIX",
                   help="a session's own callback URL (a call's customParameters) is used when it lies under this: the same scheme, host and port, and a path at or below (repeatable)")


def _connection_options(p: argparse.ArgumentParser) -> None:
    """How many connections the server holds at once (:mod:`asr_server.transport.gate`)."""
    p.add_argument("--max-connections", type=_count_or_zero, default=None,
                   help="TCP connections held at once (streams, followers, page and health requests); more are answered 503 'overloaded' "
                        f"and closed (default: the open-files limit, which the server raises to its hard limit, less {RESERVED_DESCRIPTORS}, "
                        f"at most {MAX_AUTO_CONNECTIONS}; 0: no limit)")
    p.add_argument("--max-opening-per-address", type=_count_or_zero, default=GateOptions.max_opening_per_address,
                   help="connections from one address that have not sent their request yet; more are refused the same way "
                        "(a client that opens connections and says nothing; 0: no limit)")


def _decoding_options(p: argparse.ArgumentParser) -> None:
    """How speech is found and decoded: windows, beams, quick finals, packing, the VAD."""
    p.add_argument("--final-cpu-threads", type=_count_or_default, default=0,
                   help="threads of a call of finals on CPU (default: every core, where the start-up timing finds a lone final clearly "
                        "faster on them than on one thread, else one thread per call; the model is loaded twice when this is more than "
                        "--cpu-threads, so that a final has the cores other calls leave idle)")
    p.add_argument("--background-nice", type=int, default=BACKGROUND_NICE,
                   help="with that second copy, how much lower in CPU priority (Linux nice) the other calls compute: interims and "
                        "context passes then take the cores a final leaves (default %(default)s; 0: the same priority)")
    p.add_argument("--burst-copy", action=argparse.BooleanOptionalAction, default=True,
                   help="with that second copy and a --background-nice above 0, load the weights a third time, at the finals' priority "
                        "with --cpu-threads each, for finals in a burst (a call on each core at once, with a worker kept for each) "
                        "and for a call of finals that finds the finals' copy taken (default on; --no-burst-copy: the first call "
                        "of a burst on the finals' copy, the rest beside interims, and other finals wait for that copy)")
    p.add_argument("--interim-encoder-pad-s", type=_seconds, default=INTERIM_ENCODER_PAD_S,
                   help="seconds of silence after the audio in interim decodes (30: Whisper's full window; less is faster)")
    p.add_argument("--busy-interim-encoder-pad-s", type=_seconds, default=SHORT_INTERIM_PAD_S,
                   help="the same while the server is loaded (load level 1 and up; default 2: cheaper, less accurate interims)")
    p.add_argument("--final-encoder-pad-s", type=_seconds, default=FINAL_ENCODER_PAD_S,
                   help="seconds of silence after the audio in final decodes (default 30: Whisper's full window, most accurate)")
    p.add_argument("--final-beam-size", type=_beam_size, default=FINAL_BEAM_SIZE,
                   help=f"beam width of full finals, 1 for greedy (default {FINAL_BEAM_SIZE}); context passes always use {FINAL_BEAM_SIZE}")
    p.add_argument("--quick-finals", action=argparse.BooleanOptionalAction, default=True,
                   help="first-pass finals of streams with revisions decode on the audio plus --quick-final-encoder-pad-s (half the "
                        "model time; the context pass refines them); with --no-quick-finals they use the full window (default on)")
    p.add_argument("--quick-final-encoder-pad-s", type=_seconds, default=QUICK_FINAL_PAD_S,
                   help=f"seconds of silence after the audio in a quick final's window (default {QUICK_FINAL_PAD_S:g})")
    p.add_argument("--quick-final-beam-size", type=_beam_size, default=FINAL_BEAM_SIZE, help=f"beam width of quick finals (default {FINAL_BEAM_SIZE})")
    p.add_argument("--settle-beam-size", type=_beam_size, default=SETTLE_BEAM_SIZE,
                   help=f"beam width of settle decodes, which run only while the server has time to spare (default {SETTLE_BEAM_SIZE})")
    p.add_argument("--burst-final-encoder-pad-s", type=_seconds, default=BURST_FINAL_PAD_S,
                   help=f"the same for finals in a burst (more finals waiting than workers), decoded greedily (default {BURST_FINAL_PAD_S:g})")
    p.add_argument("--lean-context-encoder-pad-s", type=_seconds, default=LEAN_CONTEXT_PAD_S,
                   help="under load a context pass decodes only the utterances it decides, on their audio plus this many seconds "
                        f"(default {LEAN_CONTEXT_PAD_S:g}; 30: the full window, as at rest)")
    _context_options(p)
    p.add_argument("--pack-finals", action=argparse.BooleanOptionalAction, default=True,
                   help="finals waiting together share one 30 s encoder window (default on; needs --final-encoder-pad-s 30)")
    p.add_argument("--vad", default=VadOptions.detector, choices=DETECTORS,
                   help="what decides where speech ends: silero (a learned model, default), webrtc (cheaper, fooled by noise and reverberation), or both")
    p.add_argument("--talker-floor-db", type=_decibels, default=VadOptions.talker_floor_db,
                   help="sound this many dB below the talker's level over the last 10 s is not speech: other voices, a television, "
                        "line echo, a room's echo do not hold a pause open (default %(default)g; 0: off)")
    p.add_argument("--talker-final-db", type=_decibels, default=VadOptions.talker_final_db,
                   help="a final this many dB below the loudest of the channel's finals in the last minute, that the model was unsure of, "
                        "is other people's talk and is sent empty: voices nearer than --talker-floor-db, written where the talker "
                        "is silent; 12 for channels that carry one talker over an open floor; it also drops a far participant's "
                        "words Whisper heard badly (default %(default)g: off)")


def _context_options(p: argparse.ArgumentParser) -> None:
    """The context pass (second pass), and the first-pass finals it refines under load."""
    defaults = ContextOptions()
    p.add_argument("--context-window-s", type=_seconds, default=defaults.window_s,
                   help=f"audio one context pass decodes at most, utterances and gaps (default {defaults.window_s:g}; at most 30)")
    p.add_argument("--context-back-s", type=_seconds, default=defaults.back_s,
                   help=f"of it, audio of utterances a pass already decided, as context before the new ones (default {defaults.back_s:g}; "
                        "0 while the server is loaded, load level 1 and up)")
    _context_load_options(p, defaults)
    p.add_argument("--context-min-new-s", type=_seconds, default=defaults.min_new_s,
                   help=f"new speech (finalized, or in the utterance under way) since the last pass before the next one runs, unless the speaker pauses (default {defaults.min_new_s:g})")
    p.add_argument("--context-ahead-s", type=_seconds, default=defaults.ahead_s,
                   help=f"a pass may decide the newest final once the next utterance holds this much audio, its first "
                        f"{defaults.ahead_max_s:g} s in the window as lookahead (default {defaults.ahead_s:g}; 0: wait for the next final)")
    p.add_argument("--context-settle-window-s", type=_seconds, default=defaults.settle_window_s,
                   help=f"then each stretch of this much audio is decoded once more, whole, as offline transcription decodes a "
                        f"recording, once passes decided it and speech went on past it, and its words stay: closer to offline, "
                        f"revisions later; only while the server has time to spare (default {defaults.settle_window_s:g}; 0: off; at most 30)")
    p.add_argument("--busy-side-by-side", type=_count, default=None,
                   help="background calls (interims, context passes) that count as the server fully busy when judging whether it has "
                        "time to spare for settle decodes (default: 1 on CPU, where calls share the cores; on CUDA the workers "
                        "background work may take, since their calls overlap; 1 on a GPU shared with other work)")
    p.add_argument("--context-max-wait-s", type=_seconds, default=CONTEXT_MAX_WAIT_S,
                   help=f"a context pass that has waited this long goes before interims, never before finals (default {CONTEXT_MAX_WAIT_S:g}), "
                        "while passes took less than --context-share of the recent model time of interims and passes")
    p.add_argument("--context-share", type=_fraction, default=CONTEXT_SHARE,
                   help=f"that share, 0 to 1 (default {CONTEXT_SHARE:g}): past it, overloaded streams get interims before overdue passes")
    p.add_argument("--context-workers", type=_count_or_zero, default=0, metavar="N",
                   help="model calls of context passes running at once (default 0: as many as background work may take); 1 on a "
                        "loaded 2-core server keeps a worker for interims: a sentence's first text comes sooner, revisions later")
    p.add_argument("--max-context-batch", type=_count, default=8,
                   help="context passes per model call (default 8: beam search over whole windows costs no less per pass in larger batches)")
    p.add_argument("--busy-finals", action=argparse.BooleanOptionalAction, default=True,
                   help="while the server is loaded (a final was late), quick finals decode as finals in a burst do: greedily on the "
                        "audio plus --burst-final-encoder-pad-s, a third of the model time; the context pass refines them (default on)")


def _context_load_options(p: argparse.ArgumentParser, defaults: ContextOptions) -> None:
    """How context passes change shape under load: late, lean, or given the time of interims."""
    p.add_argument("--context-late-s", type=_seconds, default=GovernorOptions.late_context_s,
                   help=f"while some context pass has waited this long for its turn, passes hold at most --context-late-back-s of "
                        f"decided audio, prompted with all the text before them, and catch up: revisions sooner, a little less accurate "
                        f"(default {GovernorOptions.late_context_s:g}: never)")
    p.add_argument("--context-late-back-s", type=_seconds, default=defaults.late_back_s,
                   help=f"see --context-late-s (default {defaults.late_back_s:g})")
    p.add_argument("--context-lean-wait-s", type=_seconds, default=GovernorOptions.lean_context_wait_s,
                   help=f"once some context pass has waited this long for its turn on a loaded server (load level 1 and up), passes are "
                        f"lean (none of the decided audio, on the lean window) and quick finals greedy, as after a late final, "
                        f"until the load level is back at 0 (default {GovernorOptions.lean_context_wait_s:g}; 0: only late finals do)")
    p.add_argument("--context-lean-channels", type=_channels_or_zero, default=GovernorOptions.lean_channels,
                   help=f"while more than this many channels are open, passes are lean and quick finals greedy at any load level: "
                        f"revisions sooner and less model time, a transcript 1-4 points less accurate on most audio (default {GovernorOptions.lean_channels}: never by count)")
    p.add_argument("--context-high-wait-s", type=_seconds, default=GovernorOptions.context_high_wait_s,
                   help=f"a context pass waiting this long for its turn raises the load level to 1 (interims half as often, on the short "
                        f"window), no further, until no pass has waited {GovernorOptions.context_low_wait_s:g} s (or half this, if less): "
                        f"passes get the time interims would take: revisions a little sooner at 8 streams on 2 cores, a little less "
                        f"accurate (default {GovernorOptions.context_high_wait_s:g}: never)")


def _access_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key", action="append", default=[], metavar="[NAME:]KEY",
                   help="an API key streams and API routes (all but /healthz and the page) must present as 'Authorization: Bearer KEY' "
                        "(or 'Token KEY'); repeatable; NAME is what logs and metrics show (default key1, key2, ...)")
    p.add_argument("--api-keys-file", default=None, metavar="FILE",
                   help="API keys, one 'name:key' per line, optionally followed by channels=N and per_minute=N; re-read on SIGHUP")
    p.add_argument("--key-max-channels", type=_count_or_zero, default=0, help="channels one key may stream at once, for keys without their own (default 0: no limit)")
    p.add_argument("--key-streams-per-minute", type=_count_or_zero, default=0, help="new streams one key may start per minute, for keys without their own (default 0: no limit)")
    p.add_argument("--allowed-origin", action="append", type=_origin, default=[], metavar="ORIGIN",
                   help="a browser origin (https://app.example.com) whose pages may use the server besides its own page; repeatable; * for any")
    p.add_argument("--token-ttl", type=_seconds, default=AccessOptions.token_ttl_s,
                   help="lifetime of a browser token from POST /v1/tokens, in seconds (default %(default)s); each is good for one stream")
    p.add_argument("--turn-secret", default=None,
                   help="shared secret of the TURN servers (coturn use-auth-secret): each WebRTC session gets its own credentials "
                        "valid for an hour, instead of --ice-username/--ice-credential")
    p.add_argument("--insecure-public", action="store_true",
                   help="listen on a non-loopback --host without API keys: anyone who can reach the port may use the server")


def _api_keys(args: argparse.Namespace) -> tuple[ApiKey, ...]:
    """Keys from --api-key and --api-keys-file, with the default limits where a key has none (ValueError if invalid)."""
    keys = []
    for n, value in enumerate(args.api_key, 1):
        name, sep, secret = value.partition(":")
        keys.append(ApiKey(name, secret) if sep and name and secret else ApiKey(f"key{n}", value))
    if args.api_keys_file:
        with open(args.api_keys_file, encoding="utf-8") as f:
            keys.extend(parse_keys(f.read(), args.api_keys_file))
    if any(not k.secret for k in keys):
        raise ValueError("an API key may not be empty")
    if len({k.name for k in keys}) != len(keys):
        raise ValueError("two API keys have the same name")
    return tuple(
        replace(k, max_channels=k.max_channels or args.key_max_channels, streams_per_minute=k.streams_per_minute or args.key_streams_per_minute)
        for k in keys
    )


def _access(args: argparse.Namespace) -> AccessOptions:
    return AccessOptions(keys=_api_keys(args), allowed_origins=tuple(args.allowed_origin), token_ttl_s=args.token_ttl, turn_secret=args.turn_secret)


def _exposed(args: argparse.Namespace, access: AccessOptions) -> str | None:
    """Why the server must not start as asked, or None: no keys on a public address needs --insecure-public."""
    if access.keys or args.insecure_public or is_loopback(args.host):
        return None
    return (f"refusing to listen on {args.host} without API keys: anyone who can reach it could use the server. "
            "Give --api-key or --api-keys-file, or --insecure-public to accept that")


def _public_model_name(model: str) -> str:
    """What clients are told the model is: a path's last part only (paths are not echoed)."""
    return os.path.basename(model.rstrip("/\\")) or model


def _webhook_events(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in EVENTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"events are some of {','.join(EVENTS)}, not {text!r}")
    return names


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("a port from 1 to 65535 (0: a free one)")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError("more than 0")
    return value


def _http_url(text: str) -> str:
    """A receiver's URL (``--webhook``, ``--webhook-allow``): it is POSTed to, so http(s) with a host."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL with a host")
    return text


def _origin(text: str) -> str:
    """``--allowed-origin``: ``scheme://host[:port]`` as a browser sends it, or ``*``; a path or a
    missing scheme would never match any page, silently."""
    if text == "*":
        return text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query or "@" in parts.netloc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an origin: scheme://host[:port] as a browser sends it (https://app.example.com), or *")
    return text.rstrip("/")


def _ice_url(text: str) -> str:
    if not re.fullmatch(r"(stuns?|turns?):[^\s/?#][^\s]*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a STUN or TURN URL: stun:host[:port] or turn:host[:port][?transport=udp|tcp]")
    return text


def _ip_address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IP address (one of this machine's)") from None


def _ratio(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError("a ratio from 0 to 1")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError("seconds must be 0 or more")
    return value


def _decibels(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError("decibels must be 0 or more")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("a share is from 0 to 1")
    return value


def _at_least_zero(meaning: str) -> Callable[[str], int]:
    """An argparse type for a whole number of 0 or more, where 0 means ``meaning``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"0 or more (0: {meaning})")
        return value

    return parse


_count_or_zero = _at_least_zero("no limit")
_channels_or_zero = _at_least_zero("never")
_count_or_default = _at_least_zero("the default")


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return value


def _beam_size(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("a beam holds at least 1 hypothesis")
    return value


def _measure_budget(args: argparse.Namespace, runner: WhisperRunner, baseline: int, loaded: int, max_batch: int) -> MemoryBudget | None:
    """Weights and batch working memory as measured while loading; the total from the device."""
    weights = max(0, loaded - baseline)
    before = process_rss()
    runner.warm_up_batch(max_batch)
    batch_working = max(0, peak_rss() - before)
    if args.device == "cuda":
        info = cuda_free_memory()
        if info is None:
            log.warning("no memory budget on CUDA: install the 'gpu' extra (torch) to read the device's free memory")
            return None
        free, _total = info
        # CUDA: what is still free after the model and one full batch is what streams may use;
        # their audio lives in host memory, so per-stream state is counted there too.
        return MemoryBudget(total=free + weights + batch_working, weights=weights, baseline=0, batch_working=batch_working)
    total = (args.memory_limit << 20) if args.memory_limit else available_host_memory() // 2
    return MemoryBudget(total=total, weights=weights, baseline=baseline, batch_working=batch_working)


def _rtc_options(args: argparse.Namespace) -> RtcOptions:
    servers = tuple(
        IceServer((url,), args.ice_username, args.ice_credential) if url.startswith("turn") else IceServer((url,))
        for url in args.ice_server
    )
    return RtcOptions(ice_servers=servers, host_addresses=tuple(args.webrtc_host))


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context of ``--certfile``/``--keyfile``; raises ValueError saying what is wrong with them."""
    if not args.certfile:
        if args.keyfile:
            raise ValueError("--keyfile needs --certfile")
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(args.certfile, args.keyfile)
    except OSError as exc:  # ssl.SSLError included
        files = f"--certfile {args.certfile}" + (f" and --keyfile {args.keyfile}" if args.keyfile else " (holding the key too)")
        reason = "not a PEM certificate chain and its private key" if isinstance(exc, ssl.SSLError) else (exc.strerror or str(exc))
        raise ValueError(f"cannot load {files}: {reason}") from None
    return context


@dataclass(frozen=True)
class _Plan:
    """Sizes derived from the command line and the machine."""

    limits: Limits
    batch: BatchLimits
    max_windows: int  # the most 30 s windows one model call may encode
    workers: int
    threads: int
    burst_copy: bool = False  # the runner loads a burst copy, and a worker per core is kept for finals


# Model calls at once on CUDA. A small model's decode is bound by the steps of its search, not by
# the GPU: calls on separate replicas of the weights overlap where a larger batch would not (on an
# H200, tiny.en's passes took 0.13 s each alone or in batches of up to 9). With one worker finals waited
# behind context passes and interim batches (32 streams in step on an H100: finals p95 7.3 s; two:
# 0.7 s), with two interims waited behind passes (16 in step on an H200: lag p95 3.0 s; three: 0.3 s),
# and with three behind passes of 8 (32 in step: 1.5 s; six: 0.3 s). Background work never takes the
# last worker, so a final always finds one (docs/benchmarks.md, GPU). A larger model (weights over
# SMALL_MODEL_BYTES) keeps three: its replicas cost memory, and nothing was measured on one.
CUDA_WORKERS_SMALL = 6
CUDA_WORKERS = 3
SMALL_MODEL_BYTES = 200 * 1024 * 1024


def _cuda_workers(model_path: str | None) -> int:
    """Default workers on CUDA for the model at ``model_path`` (by the size of its weights)."""
    try:
        size = os.path.getsize(os.path.join(model_path or "", "model.bin"))
    except OSError:
        return CUDA_WORKERS
    return CUDA_WORKERS_SMALL if size <= SMALL_MODEL_BYTES else CUDA_WORKERS


def _cpu_workers(cores: int, burst_copy: bool) -> int:
    """Default workers on CPU: one per core for interims and context passes, and on two cores or
    more the workers kept for finals (:func:`_final_workers`), which background work never takes.
    With a worker per core only, two cores left interims one worker, and a context pass (1.5-3 s
    on a slow core) held it: a new sentence's first text came p95 4.0 s after its speech began,
    against 0.95 s with a worker more (docs/benchmarks.md, thirteenth session). Background
    calls compute at a lower priority than finals (``--background-nice``), so the extra threads
    cost finals little."""
    return cores + _final_workers(cores, burst_copy) if cores >= 2 else cores


def _final_workers(cores: int, burst_copy: bool) -> int:
    """Workers kept for finals on CPU: one, or with a burst copy one per core, so that a burst's
    finals decode on every core at once while the background calls already running go on at their
    lower priority (16 streams in step on 2 cores with one kept: one call of finals at a time while
    two calls of interims held the other workers; docs/benchmarks.md)."""
    return cores if burst_copy and cores >= 2 else 1


def _plan(args: argparse.Namespace, model_path: str | None = None) -> _Plan:
    cores = os.cpu_count() or 1
    max_channels = args.max_channels or 0  # None: measured (see _capacity)
    max_batch = args.max_batch or (32 if args.device == "cuda" else 8)
    batch_seconds = args.max_batch_seconds or (30.0 * max_batch if args.device == "cuda" else 60.0)
    max_frames = max(1, int(batch_seconds * 100))
    final_frames = max(1, int((args.final_batch_seconds or (batch_seconds if args.device == "cuda" else 30.0)) * 100))
    # The runner loads one only beside a wide finals' copy whose peer computes lowered (_load_copies):
    # decided once here, so that the workers kept for it and the copy come and go together.
    burst_copy = (args.device == "cpu" and args.burst_copy and args.background_nice > 0
                  and (args.final_cpu_threads or cores) > (args.cpu_threads or 1))
    workers = args.workers or (_cuda_workers(model_path) if args.device == "cuda" else _cpu_workers(cores, burst_copy))
    limits = Limits(idle_timeout_s=args.idle_timeout, max_frame_bytes=args.max_frame_bytes, max_channels=max_channels,
                    webrtc_connect_timeout_s=args.webrtc_connect_timeout, resume_ttl_s=args.resume_ttl,
                    ended_session_ttl_s=args.ended_session_ttl)
    final_workers = min(workers, _final_workers(cores, burst_copy))
    side_by_side = args.busy_side_by_side or (max(1, workers - final_workers) if args.device == "cuda" else 1)
    return _Plan(
        limits, BatchLimits(max_batch=max_batch, max_frames=max_frames, final_frames=final_frames, context_max_wait_s=args.context_max_wait_s,
                            context_share=args.context_share, context_batch=args.max_context_batch,
                            final_workers=final_workers, busy_side_by_side=side_by_side, context_workers=args.context_workers),
        max(1, min(max_batch, max(max_frames, final_frames) // FULL_WINDOW_FRAMES)), workers, args.cpu_threads or max(1, cores // workers),
        burst_copy,
    )


class StartupStopped(Exception):
    """The server was told to stop while it was still loading: the start-up steps left were not run."""


def _unless_stopped(stop: Callable[[], bool], step: str) -> None:
    if stop():
        raise StartupStopped(f"stopped before {step}")


def _load(
    args: argparse.Namespace, plan: _Plan, model_path: str, interim_path: str | None, stop: Callable[[], bool] = lambda: False,
) -> tuple[WhisperRunner, WhisperRunner | None, MemoryBudget | None, CapacityModel | None]:
    """Load and warm the model(s), then measure the memory budget and the capacity (runs in a thread).

    ``stop`` is asked between the steps and between the capacity measure's decodes; once it says
    yes the rest is not run (:class:`StartupStopped`), so a stop during start-up waits for the step
    under way at most (the longest: one full batch, to size the memory budget)."""
    _unless_stopped(stop, "loading the model")
    common = dict(device=args.device, compute_type=args.compute_type, cpu_threads=plan.threads, interim_encoder_pad_s=args.interim_encoder_pad_s,
                  short_interim_pad_s=args.busy_interim_encoder_pad_s, final_encoder_pad_s=args.final_encoder_pad_s, workers=plan.workers)
    baseline = process_rss()
    runner = WhisperRunner(model_path, pack_finals=args.pack_finals, max_windows=plan.max_windows, final_beam_size=args.final_beam_size,
                           final_threads=args.final_cpu_threads or (os.cpu_count() or 1), background_nice=args.background_nice, burst_copy=plan.burst_copy,
                           quick_final_pad_s=args.quick_final_encoder_pad_s, quick_final_beam_size=args.quick_final_beam_size, settle_beam_size=args.settle_beam_size,
                           burst_final_pad_s=args.burst_final_encoder_pad_s, lean_context_pad_s=args.lean_context_encoder_pad_s, **common)
    interim = None
    if interim_path is not None:
        _unless_stopped(stop, "loading the interim model")
        interim = WhisperRunner(interim_path, **common)
        interim.warm_up()
    loaded = process_rss()
    _unless_stopped(stop, "warming the model up")
    runner.warm_up()
    if not args.final_cpu_threads:
        _unless_stopped(stop, "timing the finals' copies")
        loaded -= _choose_final_copy(runner, stop)
    _unless_stopped(stop, "sizing the memory budget")
    # The largest batch the limits allow, in 30 s finals: its working memory is the most a call needs.
    budget = _measure_budget(args, runner, baseline, loaded, plan.max_windows)
    if budget is not None:
        log.info("memory budget %s", budget.to_wire())
    _unless_stopped(stop, "measuring the capacity")
    return runner, interim, budget, _capacity(args, runner, plan, stop)


def _choose_final_copy(runner: WhisperRunner, stop: Callable[[], bool]) -> int:
    """Finals on a thread per core only where that is faster on this machine (the default
    ``--final-cpu-threads``; a number given keeps its copy whatever it measures). Returns the bytes
    of resident memory that letting the wide copy go gave back (0 where it is kept), which the
    memory budget's weights then do not count."""
    timed = runner.measure_final_copies(stop=stop)
    if timed is None:
        return 0
    before = process_rss()
    wide = runner.choose_final_copy(*timed)
    freed = max(0, before - process_rss())
    log.info("finals decode %s: a lone final took %.3f s on %d threads, %.3f s on one",
             f"with {runner.final_threads} threads" if wide else "on one thread each", timed[0], runner.wide_threads, timed[1])
    return freed


def _capacity(args: argparse.Namespace, runner: WhisperRunner, plan: _Plan, stop: Callable[[], bool] = lambda: False) -> CapacityModel | None:
    """Admission from the measured cost of a final in a burst, unless --max-channels was given."""
    if args.max_channels is not None:
        return None
    final_s, pass_s = _measure(runner, plan)(stop)
    if math.isnan(final_s) or math.isnan(pass_s):
        raise StartupStopped("stopped while measuring the capacity")
    capacity = CapacityModel(plan.workers, final_s, pass_s=pass_s)
    log.info("capacity %s", capacity.to_wire())
    return capacity


def _measure(runner: WhisperRunner, plan: _Plan) -> Measure:
    """Times a burst final and a context pass: at start-up, and again while the server is idle."""
    # Timed with every worker busy, as in the burst it stands for: a lone decode on CPU would
    # have all the cores to itself and look cheaper than it is then.
    def measure(stop: Callable[[], bool] = lambda: False) -> tuple[float, float]:
        final_s = runner.measure_burst_final(concurrent=plan.workers, stop=stop)
        return final_s, runner.measure_context_pass(stop=stop)

    return measure


def _context(args: argparse.Namespace) -> ContextOptions:
    return ContextOptions(window_s=min(30.0, args.context_window_s), back_s=args.context_back_s, late_back_s=args.context_late_back_s, settle_window_s=min(30.0, args.context_settle_window_s),
                          min_new_s=args.context_min_new_s, ahead_s=args.context_ahead_s, quick_finals=args.quick_finals, busy_finals=args.busy_finals)


def _governor(args: argparse.Namespace) -> GovernorOptions:
    high = args.context_high_wait_s
    return GovernorOptions(late_context_s=args.context_late_s, lean_context_wait_s=args.context_lean_wait_s, lean_channels=args.context_lean_channels,
                           context_high_wait_s=high, context_low_wait_s=min(GovernorOptions.context_low_wait_s, high / 2))


def _vad(args: argparse.Namespace) -> VadOptions:
    return VadOptions(detector=args.vad, talker_floor_db=args.talker_floor_db, talker_final_db=args.talker_final_db)


def raise_open_files() -> int:
    """The soft limit on open files raised to the hard one, as Go's runtime does (services often get
    1024 against a hard limit of half a million, and every connection takes one); the limit now
    (0 where there is none to read)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if soft != unlimited and (hard == unlimited or soft < hard):
        for want in ((hard,) if hard != unlimited else ()) + (1 << 20, 10240):  # 10240: macOS's most without a hard limit
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                soft = want
                break
            except (ValueError, OSError):
                continue
    return 1 << 20 if soft == unlimited else soft


def _gate(args: argparse.Namespace) -> GateOptions:
    open_files = raise_open_files()
    if args.max_connections is not None:
        connections = args.max_connections
    else:
        connections = connections_for(open_files) if open_files else GateOptions.max_connections
    log.info("open files limit %s: up to %s connections at once", open_files or "unknown", connections or "any number of")
    return GateOptions(connections, args.max_opening_per_address)


class AcceptErrorsEvery(logging.Filter):
    """asyncio logs a traceback for each accept that fails for want of descriptors, hundreds a second
    while they last: let one through every ``every_s`` seconds, with how many were left out."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s, self.clock = every_s, clock
        self._last: float | None = None
        self._left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("socket.accept() out of system resource"):
            return True
        now = self.clock()
        if self._last is not None and now - self._last < self.every_s:
            self._left_out += 1
            return False
        if self._left_out:
            record.msg = f"{record.msg} ({self._left_out} more like it in the last {now - self._last:.0f} s not logged)"
        self._last, self._left_out = now, 0
        return True


async def _serve(args: argparse.Namespace, model_path: str, interim_path: str | None, access: AccessOptions, tls: ssl.SSLContext | None = None) -> int:
    plan = _plan(args, model_path)
    server = AsrServer(args.host, args.port, plan.limits, model_name=_public_model_name(args.model), batch=plan.batch,
                       workers=plan.workers, rtc=_rtc_options(args), ssl=tls, vad=_vad(args),
                       context=_context(args), governor=_governor(args), access=access, tracing=tracing_from_environment(args.trace_ratio),
                       webhooks=WebhookOptions(args.webhook, args.webhook_secret, tuple(args.webhook_allow),
                                                        events=frozenset(args.webhook_events)), gate=_gate(args))
    if server.tracing.enabled:
        log.info("tracing %g of streams with OpenTelemetry", args.trace_ratio)
    # Before anything is printed: a stop sent as soon as the server says it listens is a stop, not a kill.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_stop_signal, stop, sig)
    # SIGHUP (a service manager's reload, log rotation) never ends the server: with no keys file
    # there is nothing to read again, and its default action would have killed every stream.
    loop.add_signal_handler(signal.SIGHUP, _reload_keys, args, server)
    if not await _listen(server):
        return 2
    scheme = "https" if server.ssl else "http"
    print(f"asr-server listening on {'wss' if server.ssl else 'ws'}://{server.host}:{server.port}/v1/listen (loading model {args.model})", flush=True)
    print(f"captions page: {scheme}://{'localhost' if server.host in ('127.0.0.1', '::1') else server.host}:{server.port}/", flush=True)
    if access.keys:
        print(f"access: {len(access.keys)} API key(s): {', '.join(k.name for k in access.keys)}", flush=True)
    else:
        print("access: no API keys: anyone who can reach this address may stream to it", flush=True)
    halt = threading.Event()  # the load's stop predicate: set when a stop comes before it is done
    loading = asyncio.ensure_future(asyncio.to_thread(_load, args, plan, model_path, interim_path, halt.is_set))
    waiting = asyncio.ensure_future(stop.wait())
    await asyncio.wait([loading, waiting], return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if not loading.done():
        log.info("shutting down during start-up")
        halt.set()
        await server.stop()
        await _load_ended(loading)
        return 0
    try:
        runner, interim, budget, capacity = loading.result()
        server.set_runner(runner, interim, budget, capacity, measure=_measure(runner, plan) if capacity is not None else None)
    except Exception as exc:
        log.error("could not load model %s: %s", model_path, exc)
        await server.stop(grace_s=0)
        return 2
    print(f"asr-server ready: model {args.model} on {args.device}", flush=True)
    await stop.wait()
    log.info("shutting down")
    await server.stop()
    return 0


async def _listen(server: AsrServer) -> bool:
    """Start listening; False, with what went wrong said on stderr, when the address cannot be had
    (a port in use, most often by another asr-server; an address not on this machine)."""
    try:
        await server.start()
    except OSError as exc:
        print(f"asr-server: cannot listen on {server.host}:{server.port}: {exc.strerror or exc}"
              f"{' (another asr-server? choose another --port)' if exc.errno == errno.EADDRINUSE else ''}", file=sys.stderr)
        await server.stop(grace_s=0)
        return False
    return True


def on_stop_signal(stop: asyncio.Event, sig: int, die: Callable[[int], None] | None = None) -> None:
    """SIGINT or SIGTERM: the first stops the server as it should (sessions are told and their
    finals finished, a load under way ends after its current step); a second, while that is
    under way, ends the process at once (:func:`die_by`)."""
    if not stop.is_set():
        stop.set()
        return
    log.warning("second %s while stopping: exiting at once", signal.Signals(sig).name)
    (die or die_by)(sig)


def die_by(sig: int) -> None:
    """End the process by ``sig``, as if it had no handler for it: no clean-up, no waiting for
    threads (a model call under way is not waited for), the exit status a process manager expects."""
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)


async def _load_ended(loading: asyncio.Future) -> None:
    """Wait for a load told to stop (it ends after the step under way), and say how it ended."""
    try:
        await loading
    except StartupStopped as exc:
        log.info("start-up %s", exc)
    except Exception:
        log.exception("loading failed while stopping")
    else:
        log.info("start-up ended before the stop reached it")


def _reload_keys(args: argparse.Namespace, server: AsrServer) -> None:
    """SIGHUP: read the keys again; a file that does not parse leaves the keys as they were."""
    if not args.api_keys_file:
        log.info("SIGHUP: nothing to reload (no --api-keys-file); the server goes on")
        return
    try:
        keys = _api_keys(args)
    except (OSError, ValueError) as exc:
        log.error("keys not reloaded, the old ones stay: %s", exc)
        return
    server.access.set_keys(keys)
    log.info("keys reloaded: %s", ", ".join(k.name for k in keys) or "none")


def resolved_device(device: str) -> str:
    """``auto`` as the device it means: CUDA where CTranslate2 sees one, else the CPU. Resolved
    before anything is sized, since the defaults differ (workers, batch sizes, the memory budget):
    left as ``auto``, a GPU server ran with the CPU's sizes (a worker per host core)."""
    if device != "auto":
        return device
    import ctranslate2

    return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("faster_whisper").setLevel(logging.WARNING)
    logging.getLogger("websockets").setLevel(logging.WARNING)
    logging.getLogger("asyncio").addFilter(AcceptErrorsEvery())
    args.device = resolved_device(args.device)
    try:
        model_path = resolve_model(args.model)
        interim_path = resolve_model(args.interim_model) if args.interim_model else None
    except ModelNotFound as exc:
        print(f"asr-server: {exc}", file=sys.stderr)
        return 2
    try:
        access = _access(args)
    except (OSError, ValueError) as exc:
        print(f"asr-server: {exc}", file=sys.stderr)
        return 2
    try:
        tls = _tls(args)
    except ValueError as exc:
        print(f"asr-server: {exc}", file=sys.stderr)
        return 2
    refusal = _exposed(args, access)
    if refusal is not None:
        print(f"asr-server: {refusal}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing past this point may fetch anything
    return asyncio.run(_serve(args, model_path, interim_path, access, tls))


if __name__ == "__main__":
    sys.exit(main())
