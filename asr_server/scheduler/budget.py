"""How many streams and how large a batch fit in memory: the budget of one device.

The budget adds up what the server holds: the model's weights, a baseline
for the process (interpreter, libraries), the working memory of the largest
batch (measured at start-up by running one), and, per admitted channel, the
most audio it may hold (the open utterance plus the finals it may owe, each
at most ``max_utterance_s``) plus, per stream, the compressed-audio buffer.
Every per-stream figure is a worst case from :class:`~asr_server.options.Limits`
and the stream options, so admitted streams never run out of memory because
more were admitted.

On CPU the total is a configured limit (``--memory-limit``, by default half
of the memory available at start-up); on CUDA it is the device's free memory
at start-up (torch, an optional extra, reads it), and host memory is not the
constraint.

A plain object: the numbers come in, decisions go out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..audio.decode import MODEL_RATE

__all__ = ["MemoryBudget", "audio_bytes", "channel_bytes", "stream_bytes", "available_host_memory", "process_rss", "peak_rss", "cuda_free_memory"]

MiB = 1 << 20
_PER_CHANNEL_OVERHEAD = 256 * 1024  # VAD, chunker, resampler and decoder state, Python objects


def audio_bytes(seconds: float, channels: int = 1) -> int:
    """Memory of ``seconds`` of pipeline audio (16 kHz float32) per channel."""
    return int(seconds * MODEL_RATE * 4 * channels)


def channel_bytes(max_utterance_s: float, max_pending_finals: int, context_s: float = 0.0) -> int:
    """Worst-case memory of one channel: the open utterance plus every owed final, as float32,
    plus ``context_s`` of finalized audio kept for the context pass (and one window of it being decoded)."""
    return audio_bytes((max_pending_finals + 1) * max_utterance_s + 2 * context_s) + _PER_CHANNEL_OVERHEAD


def stream_bytes(channels: int, max_utterance_s: float, max_pending_finals: int, container_buffer: int, context_s: float = 0.0) -> int:
    """``container_buffer``: input held ahead of the pipeline (compressed bytes, or a WebRTC live backlog)."""
    return channels * channel_bytes(max_utterance_s, max_pending_finals, context_s) + container_buffer


@dataclass(frozen=True)
class MemoryBudget:
    total: int  # bytes the server may use on this device
    weights: int  # the model
    baseline: int  # the process before any stream (host) or the runtime's own (device)
    batch_working: int  # peak extra memory of one batch of the configured size

    @property
    def for_streams(self) -> int:
        return max(0, self.total - self.weights - self.baseline - self.batch_working)

    def fits(self, in_use: int, more: int) -> bool:
        """Whether a stream needing ``more`` bytes fits beside streams holding ``in_use``."""
        return in_use + more <= self.for_streams

    def max_streams(self, per_stream: int) -> int:
        return self.for_streams // max(1, per_stream)

    def to_wire(self) -> dict[str, int]:
        return {"total_mib": self.total // MiB, "weights_mib": self.weights // MiB, "baseline_mib": self.baseline // MiB,
                "batch_working_mib": self.batch_working // MiB, "for_streams_mib": self.for_streams // MiB}


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_host_memory() -> int:
    """MemAvailable (Linux), or physical memory elsewhere."""
    value = _meminfo("MemAvailable")
    if value is not None:
        return value
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def _status(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def process_rss() -> int:
    """Resident memory of this process now (0 where /proc is missing)."""
    return _status("VmRSS")


def peak_rss() -> int:
    """The process's resident high-water mark."""
    return _status("VmHWM")


def cuda_free_memory(device_index: int = 0) -> tuple[int, int] | None:
    """(free, total) bytes of a CUDA device, via torch (the optional ``gpu`` extra); None without it."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(device_index)
    return int(free), int(total)
