"""All inference goes through the scheduler: sessions submit jobs, never call the model.

:mod:`.policy` orders waiting jobs (weighted fair queues, batch forming),
:mod:`.core` decides what runs next and applies results (no clock, no
threads), :mod:`.engine` runs the decisions on the model's threads,
:mod:`.governor` turns queue waits into a load level, :mod:`.admission`
decides whether a new stream is taken, and :mod:`.budget` sizes memory.
"""

from .engine import Scheduler

__all__ = ["Scheduler"]
