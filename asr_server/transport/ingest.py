"""Audio that does not arrive as raw frames: compressed containers and live WebRTC tracks.

* :class:`ContainerPump` runs a :class:`~asr_server.audio.decode.ContainerDecoder`
  in a thread of its own (PyAV blocks on its input) and hands the audio to the
  event loop in order, through a queue of :data:`PUMP_QUEUE` items.
* :class:`LiveBacklog` is sans-I/O: live audio cannot be slowed, so while the
  session is backpressured it waits here, up to a bound; past the bound the
  stream is overrun (``audio_overrun``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable

import numpy as np

from ..audio.decode import MODEL_RATE, ContainerDecoder
from ..errors import AsrError, InternalError

__all__ = ["ContainerPump", "LiveBacklog", "PUMP_QUEUE"]

log = logging.getLogger("asr_server.session")

PUMP_QUEUE = 8  # decoded chunks waiting for the event loop

_Item = np.ndarray | AsrError | None  # audio, the decoder's error, or the end


class ContainerPump:
    """Decode one container stream in a thread; deliver its audio on the loop, in order."""

    def __init__(self, decoder: ContainerDecoder, label: str) -> None:
        self.decoder = decoder
        self.label = label

    async def run(self, deliver: Callable[[np.ndarray], Awaitable[None]], gone: asyncio.Event) -> AsrError | None:
        """Deliver every chunk until the stream ends; the decoder's error, if it raised one.

        ``gone``: set when the session ends; the thread then stops at its next hand-off.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=PUMP_QUEUE)
        finished: asyncio.Future[None] = loop.create_future()

        def mark_finished() -> None:
            if not finished.done():
                finished.set_result(None)

        def thread_main() -> None:
            try:
                self._work(loop, queue, gone)
            finally:
                loop.call_soon_threadsafe(mark_finished)

        threading.Thread(target=thread_main, name=f"decode-{self.label}", daemon=True).start()
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, AsrError):
                    return item
                await deliver(item)
            return None
        finally:
            self.decoder.close()
            await asyncio.shield(finished)

    def _work(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[_Item], gone: asyncio.Event) -> None:
        def put(item: _Item) -> bool:
            future = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
            while True:
                try:
                    future.result(timeout=0.5)
                    return True
                except TimeoutError:
                    if gone.is_set():
                        future.cancel()
                        return False

        try:
            for planar in self.decoder.frames():
                if not put(planar):
                    return
        except AsrError as error:
            put(error)
            return
        except Exception:
            log.exception("session=%s event=container_decoder_crash", self.label)
            put(InternalError("audio decoding failed"))
            return
        put(None)


class LiveBacklog:
    """Live audio held while the session is backpressured, at most ``max_s`` seconds of it."""

    def __init__(self, max_s: float) -> None:
        self.max_s = max_s
        self._chunks: deque[np.ndarray] = deque()
        self._samples = 0  # kept with the deque: checked on every live frame

    def __bool__(self) -> bool:
        return bool(self._chunks)

    @property
    def seconds(self) -> float:
        return self._samples / MODEL_RATE

    def push(self, planar: np.ndarray) -> bool:
        """Hold ``planar``; False (and the backlog dropped) when that goes past the bound."""
        self._chunks.append(planar)
        self._samples += planar.shape[1]
        if self._samples > self.max_s * MODEL_RATE:
            self.clear()
            return False
        return True

    def pop(self) -> np.ndarray:
        planar = self._chunks.popleft()
        self._samples -= planar.shape[1]
        return planar

    def clear(self) -> None:
        self._chunks.clear()
        self._samples = 0
