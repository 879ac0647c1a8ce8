"""A deliberately naive store: the conformance suite must fail it, and say why.

It is the reference model with three mistakes real outboxes make, and nothing else changed,
so every failure the suite reports traces back to one of them:

1. **Timeouts are retried.** An unknown outcome is treated as retryable: the table it runs
   lets ``retry`` leave ``indeterminate``, so the runtime's retry policy sends the request again.
2. **No fencing.** Whoever presents a lease for the intent is taken to be the current worker:
   the attempt token and fencing generation it presents are replaced by the current ones
   before any guard looks at them (sweepers' snapshots too).
3. **Approval by row id.** Authorization does not compare the digest of the bytes about to be
   sent: the digest presented is replaced by the intent's own; so does a claim reservation, so an
   approval of the row covers whatever bytes a worker presents.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from atmostonce.conformance import Implementation, ManualClock
from atmostonce.model import MemoryStore
from atmostonce.records import Intent
from atmostonce.table import Table, table

__all__ = ["NaiveStore", "factory", "naive_table"]


def naive_table(t: Table) -> Table:
    """Mistake 1: ``retry`` may leave ``indeterminate``."""
    events = dict(t.events)
    events["retry"] = dataclasses.replace(events["retry"], sources=(*events["retry"].sources, "indeterminate"))
    return dataclasses.replace(t, events=MappingProxyType(events))


class NaiveStore(MemoryStore):
    def __init__(self, clock: Callable[[], float] | None = None):
        super().__init__(clock=clock, table=naive_table(table()))

    def _apply(self, event: str, key: str, args: Mapping[str, Any]) -> Intent:
        with self._lock:
            row = self._rows.get(key)
            if row is not None:
                args = dict(args)
                if "attempt_token" in args and row["attempt_token"] is not None:
                    # mistake 2: no fencing on the attempt token or the generation
                    args["attempt_token"], args["generation"] = row["attempt_token"], row["generation"]
                if "request_digest" in args:
                    # mistake 3: the row was approved, so whatever bytes come are fine
                    args["request_digest"] = row["request_digest"]
            return super()._apply(event, key, args)

    def _claim_move(self, event, target, args):
        with self._lock:
            it = self._rows.get(args.get("key"))
            if it is not None and "request_digest" in args:
                args = dict(args) | {"request_digest": it["request_digest"]}  # mistake 3 again
            return super()._claim_move(event, target, args)


def factory() -> Implementation:
    """``--impl tests.conformance.naive_store:factory``."""
    clock = ManualClock()
    return Implementation(NaiveStore(clock=clock), clock.advance)
