"""All inference goes through the scheduler: sessions submit jobs, never call the model."""

from .scheduler import Scheduler

__all__ = ["Scheduler"]
