"""``asr-server``: load the model, listen, serve until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from .inference.whisper import DEFAULT_MODEL, INTERIM_ENCODER_PAD_S, ModelNotFound, WhisperRunner, resolve_model
from .options import Limits
from .transport.websocket import AsrServer

log = logging.getLogger("asr_server")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="asr-server", description="Real-time speech recognition over WebSocket.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port to listen on; 0 picks a free one (default 8765)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="tiny.en (embedded, default), a CTranslate2 model directory, or a faster-whisper size name")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--compute-type", default="auto", help="CTranslate2 compute type: auto, int8, float16, float32, ... (default auto)")
    p.add_argument("--cpu-threads", type=int, default=0, help="threads for CPU inference (default: all cores)")
    p.add_argument("--interim-encoder-pad-s", type=float, default=INTERIM_ENCODER_PAD_S,
                   help="seconds of silence after the audio in interim decodes (30: Whisper's full window; less is faster); finals always use 30")
    p.add_argument("--idle-timeout", type=float, default=Limits.idle_timeout_s, help="seconds without any client message before the session is closed")
    p.add_argument("--max-frame-bytes", type=int, default=Limits.max_frame_bytes, help="largest binary frame accepted")
    p.add_argument("--max-channels", type=int, default=None,
                   help="channels transcribed at once; more streams are refused with 'overloaded' (default: 2 per core on CPU, no limit on CUDA; 0: no limit)")
    p.add_argument("--log-level", default="INFO")
    return p


async def _serve(args: argparse.Namespace, model_path: str) -> int:
    max_channels = args.max_channels
    if max_channels is None:
        # Measured on 2 cores with tiny.en (README, "Several streams at once"):
        # 4 real-time channels hold p95 final latency under 1.5 s, 6 do not.
        max_channels = 2 * (args.cpu_threads or os.cpu_count() or 1) if args.device == "cpu" else 0
    limits = Limits(idle_timeout_s=args.idle_timeout, max_frame_bytes=args.max_frame_bytes, max_channels=max_channels)
    server = AsrServer(args.host, args.port, limits, model_name=args.model)
    await server.start()
    print(f"asr-server listening on ws://{server.host}:{server.port}/v1/listen (loading model {args.model})", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def load() -> WhisperRunner:
        runner = WhisperRunner(model_path, device=args.device, compute_type=args.compute_type,
                               cpu_threads=args.cpu_threads, interim_encoder_pad_s=args.interim_encoder_pad_s)
        runner.warm_up()
        return runner

    loading = asyncio.ensure_future(asyncio.to_thread(load))
    waiting = asyncio.ensure_future(stop.wait())
    await asyncio.wait([loading, waiting], return_when=asyncio.FIRST_COMPLETED)
    if loading.done():
        try:
            server.set_runner(loading.result())
        except Exception as exc:
            log.error("could not load model %s: %s", model_path, exc)
            await server.stop(grace_s=0)
            return 2
        print(f"asr-server ready: model {args.model} on {args.device}", flush=True)
        await stop.wait()
    waiting.cancel()
    log.info("shutting down")
    await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("faster_whisper").setLevel(logging.WARNING)
    logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        model_path = resolve_model(args.model)
    except ModelNotFound as exc:
        print(f"asr-server: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing past this point may fetch anything
    return asyncio.run(_serve(args, model_path))


if __name__ == "__main__":
    sys.exit(main())
