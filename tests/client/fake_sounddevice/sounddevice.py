"""Stand-in for the sounddevice package in tests: a 'microphone' that plays a file.

Only what asr-client uses: RawInputStream as a context manager that calls
``callback(indata, frames, time, status)`` from its own thread, in real time,
with 16 kHz int16 blocks read from the raw file named by $ASR_FAKE_MIC, then silence.
"""

import os
import threading
import time


class RawInputStream:
    def __init__(self, samplerate, channels, dtype, blocksize, device=None, callback=None):
        assert (samplerate, channels, dtype) == (16000, 1, "int16")
        self.blocksize, self.callback = blocksize, callback
        self._data = open(os.environ["ASR_FAKE_MIC"], "rb").read()
        self._running = False

    def __enter__(self):
        self._running = True
        self._thread = threading.Thread(target=self._play, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._running = False
        self._thread.join(2)

    def _play(self):
        step = self.blocksize * 2
        start, sent = time.monotonic(), 0
        while self._running:
            block = self._data[sent : sent + step].ljust(step, b"\0")
            self.callback(block, self.blocksize, None, None)
            sent += step
            time.sleep(max(0.0, start + sent / 32000 - time.monotonic()))
