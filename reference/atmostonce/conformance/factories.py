"""Ready-made implementation factories: ``--impl atmostonce.conformance.factories:memory``.

A factory takes no arguments and returns a fresh, empty :class:`~.drivers.Implementation`
(store, clock hook, cleanup). The SQL stores' factories live with their tests, since the core
imports no adapter.
"""

from __future__ import annotations

from ..model import MemoryStore
from .drivers import Implementation, ManualClock

__all__ = ["memory"]


def memory() -> Implementation:
    """The reference model on a hand-moved clock."""
    clock = ManualClock()
    return Implementation(MemoryStore(clock=clock), clock.advance)
