"""Lower the CPU priority of the threads a model copy computes on.

On CPU the runner keeps a copy of the weights for calls of finals (every
core's threads) beside the copy that interims and context passes use. When a
final and a pass run at once, their threads share the cores, and a final,
what a user waits for, takes about as long as the pass lets it (on 2 slow
cores a quick final 0.58 s alone, 0.96 s beside a pass). Linux keeps a nice
value per thread, and a thread starts with its creator's: CTranslate2 starts
a model's compute threads while it loads, so a copy loaded from a thread
that first raised its own nice value computes at that lower priority for
good, and the finals' copy, loaded as usual, keeps the process's. Raising
one's own nice value needs no privilege; lowering it again would, which is
why each copy keeps one priority for its whole life.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["BACKGROUND_NICE", "MAX_NICE", "call_lowered", "thread_nice"]

log = logging.getLogger("asr_server.inference")
T = TypeVar("T")

MAX_NICE = 19  # the lowest priority Linux has
BACKGROUND_NICE = 10  # the server's default (--background-nice): chosen by measurement, docs/benchmarks.md


def thread_nice(tid: int) -> int:
    """The nice value of thread ``tid`` of this process (Linux)."""
    return os.getpriority(os.PRIO_PROCESS, tid)


def call_lowered(nice: int, load: Callable[[], T]) -> T:
    """``load()`` from a new thread whose nice value is ``nice`` above this one's (at most
    :data:`MAX_NICE`), so the threads it starts inherit that lower priority.

    ``nice`` 0, or a platform without per-thread nice values: ``load()`` as it is.
    """
    if nice <= 0 or not sys.platform.startswith("linux"):
        return load()
    lowered = min(MAX_NICE, thread_nice(threading.get_native_id()) + nice)
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), lowered)
        except OSError as exc:  # a sandbox that forbids it: load at the usual priority
            log.warning("could not lower the priority of background model threads: %s", exc)
        try:
            result.append(load())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(exc)

    loader = threading.Thread(target=run, name="asr-model-loader")
    loader.start()
    loader.join()
    if failure:
        raise failure[0]
    return result[0]
