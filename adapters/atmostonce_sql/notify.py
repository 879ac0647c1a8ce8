"""LISTEN for the notifications migration 0009 sends, and wake a worker when an intent became due.

The triggers (``migrations/versions/0009_worker_notify.py``, narrowed by 0015 to intents that became
claimable) notify ``atmostonce_due`` with payloads ``intent:<state>``, ``approval:<state>`` and
``policy:<what>``; :func:`is_due` decides, from the loaded table, which of them can make an intent
dispatchable (an intent in the table's initial state, an approval in the approval table's initial state,
any policy change). :class:`DueListener` holds one dedicated autocommit connection (psycopg 3), calls
``on_due()`` for each such notification, and outlives the database: a broken connection is reported,
waited out with the runtime's jittered backoff and opened again, and after each (re)connection it calls
``on_due()`` once, since what was notified while it was away is lost (docs/operations.md). Polling stays on as the fallback either way.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from atmostonce.names import STATE
from atmostonce.runtime import backoff_delay

__all__ = ["CHANNEL", "DueListener", "is_due"]

CHANNEL = "atmostonce_due"
LOG = logging.getLogger("atmostonce.worker")


def is_due(store: Any, payload: str) -> bool:
    """Whether a notification payload can mean an intent is now dispatchable (by the store's tables)."""
    kind, _, state = payload.partition(":")
    if kind == "intent":
        return state in (STATE.pending,)
    if kind == "approval":
        return state == store.approval_table.initial
    return kind == "policy"


def conninfo(store: Any) -> str:
    """The libpq URI of a PostgreSQL store's engine (password included: it is only handed to psycopg)."""
    url = store.engine.url.set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


class DueListener(threading.Thread):
    """A thread that LISTENs on :data:`CHANNEL` for ``store`` (PostgreSQL) and calls ``on_due()``.

    ``stop``: an event that ends it (checked at least every ``check_every`` seconds). ``listening`` is set
    while a LISTEN is in place; ``wakes`` counts the notifications that called ``on_due``, ``outages`` the
    broken connections. ``on_error(exc)`` sees each failure to connect or listen."""

    def __init__(
        self,
        store: Any,
        on_due: Callable[[], None],
        *,
        stop: threading.Event,
        on_error: Callable[[BaseException], None] | None = None,
        check_every: float = 1.0,
        backoff_base: float = 0.1,
        backoff_max: float = 5.0,
        seed: int | None = None,
    ):
        super().__init__(name="atmostonce-listen", daemon=True)
        self.store, self.on_due, self.stop_event = store, on_due, stop
        self.on_error = on_error or (lambda exc: None)
        self.check_every, self.backoff_base, self.backoff_max = check_every, backoff_base, backoff_max
        self.rng = random.Random(seed)
        self.listening = threading.Event()
        self.wakes = 0
        self.outages = 0

    def run(self) -> None:
        import psycopg

        failures = 0
        while not self.stop_event.is_set():
            try:
                with psycopg.connect(conninfo(self.store), autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    failures = 0
                    LOG.info("listening for due intents", extra={"event": "worker.listen", "channel": CHANNEL})
                    self.on_due()  # whatever was notified while no one listened is lost: look once
                    while not self.stop_event.is_set():
                        for n in conn.notifies(timeout=self.check_every):
                            if is_due(self.store, n.payload):
                                self.wakes += 1
                                LOG.debug("woken", extra={"event": "worker.wake", "payload": n.payload})
                                self.on_due()
                            if self.stop_event.is_set():
                                break
            except Exception as exc:  # the database went away: back off, connect again, never die
                self.listening.clear()
                failures += 1
                self.outages += 1
                LOG.warning("listen connection lost: %s", type(exc).__name__, extra={"event": "worker.listen_lost"})
                try:
                    self.on_error(exc)
                finally:
                    self.stop_event.wait(backoff_delay(failures, self.backoff_base, self.backoff_max, self.rng))
        self.listening.clear()
