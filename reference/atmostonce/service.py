"""The outbox service: one object that runs the whole loop (docs/design.md#the-outbox-service).

:class:`Outbox` owns what a deployment would otherwise wire by hand: ``workers`` dispatch threads
(:class:`~atmostonce.runtime.Worker` over ``store.claimable``), the :class:`~atmostonce.runtime.Sweeper`
and the :class:`~atmostonce.runtime.Reconciler` on their intervals, a graceful stop, backoff through
database outages, and a report of what it did. :func:`open_outbox` (``atmostonce.open``) opens a store by
URL and returns an outbox over it::

    outbox = atmostonce.open("sqlite:///outbox.sqlite3", transport=my_transport)
    outbox.submit("my-account", "post", "room-42", {"text": "hello"})  # idempotent
    outbox.run(until_idle=True)  # or outbox.start() ... outbox.stop()

Nothing here adds a move: every write is the runtime's, under the table's guards.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import Rejected
from .names import STATE
from .plugins import open_store
from .protocols import OutboxStore
from .records import Intent
from .runtime import (
    Dispatcher,
    Reconciler,
    RoundRobin,
    RuntimeConfig,
    SimulatedCrash,
    Sweeper,
    Worker,
    backoff_delay,
)
from .table import Table
from .transport import Transport

__all__ = ["Outbox", "OutboxReport", "held_outcomes", "open_outbox", "outcome_name"]


def held_outcomes(t: Table) -> frozenset[str]:
    """Dispatch outcomes that wait for someone (an approval, a released kill switch, a new source capture): the
    table's ``waiting`` outcomes that are not ``timed``. An intent whose last dispatch gave one of these does
    not keep :meth:`Outbox.run` from being idle."""
    return t.waiting_outcomes - t.timed_outcomes


def outcome_name(result: Any) -> str:
    """The report's name for what one dispatch returned or raised: the table's outcome name (``read_back.match``),
    ``refused:<event>:<guard>`` for a refusal, ``crash:<point>`` for a simulated crash, ``error:<type>`` for
    any other exception."""
    if isinstance(result, str):
        return result
    if isinstance(result, Rejected):
        return f"refused:{result.event}:{result.guard}"
    if isinstance(result, SimulatedCrash):
        return f"crash:{result}"
    return f"error:{type(result).__name__}"


@dataclass
class OutboxReport:
    """What an outbox did since it was made (counts), and how its last run ended.

    ``dispatched``: dispatch outcomes that began or settled something, by :func:`outcome_name`;
    ``waited``: dispatches that began nothing (the table's ``waiting`` outcomes);
    ``swept``: the sweeper's counts summed (``expired``, ``abandoned``, ``retried``, ``exhausted``,
    ``approvals_expired``, ``skipped``; its ``waiting`` retries left out); ``reconciled``: the reconciler's outcomes summed (its ``deferred``
    passes left out); ``errors``: failed polls and maintenance passes by where they failed (``poll``,
    ``sweep``, ``reconcile``), each waited out with backoff; ``seconds``: wall time of the last run or
    start..stop; ``idle``: the last :meth:`Outbox.run` ended because nothing was left to do (not at its
    timeout or a stop); ``still_running``: dispatch threads still inside a dispatch when :meth:`Outbox.stop`'s
    timeout ran out (their sends keep their leases: the sweeper of a later run settles them).
    """

    dispatched: Counter[str] = field(default_factory=Counter)
    waited: Counter[str] = field(default_factory=Counter)
    swept: Counter[str] = field(default_factory=Counter)
    reconciled: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    idle: bool = False
    still_running: int = 0

    def copy(self) -> OutboxReport:
        return OutboxReport(
            Counter(self.dispatched),
            Counter(self.waited),
            Counter(self.swept),
            Counter(self.reconciled),
            Counter(self.errors),
            self.seconds,
            self.idle,
            self.still_running,
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain dicts and numbers (for ``json.dumps``)."""
        return {
            "dispatched": dict(sorted(self.dispatched.items())),
            "waited": dict(sorted(self.waited.items())),
            "swept": {k: v for k, v in sorted(self.swept.items()) if v},
            "reconciled": dict(sorted(self.reconciled.items())),
            "errors": dict(sorted(self.errors.items())),
            "seconds": round(self.seconds, 3),
            "idle": self.idle,
            "still_running": self.still_running,
        }

    def __str__(self) -> str:
        parts = [f"{k} {v}" for k, v in sorted((self.dispatched + self.reconciled).items())]
        parts += [f"{k} {v}" for k, v in sorted(self.swept.items()) if v and k != "skipped"]
        parts += [f"errors:{k} {v}" for k, v in sorted(self.errors.items())]
        end = "idle" if self.idle else "stopped"
        return f"{'  '.join(parts) or 'nothing done'}  ({end} after {self.seconds:.1f} s)"


class Outbox:
    """The outbox service over one store and one transport.

    ``workers`` (>= 1) dispatch threads poll ``store.claimable(poll_batch)`` and dispatch each key through a
    :class:`~atmostonce.runtime.Dispatcher` (owner ``f"{owner}-{i}"`` on target claims); a worker that saw only
    waiting outcomes waits ``poll_every`` seconds before it polls again. The sweeper runs every ``sweep_every``
    seconds and the reconciler every ``reconcile_every`` seconds (wall clock; their leases and spacing are the
    store clock's, in ``config``). ``work``, ``crash`` and ``credential_version`` go to every dispatcher.

    Database errors never end the service: a failed poll, sweep or reconcile pass is counted in
    :attr:`OutboxReport.errors`, passed to ``on_error``, and retried after a jittered exponential backoff
    (``backoff_base`` doubling up to ``backoff_max`` seconds, :func:`~atmostonce.runtime.backoff_delay`).
    Stopping is graceful: a worker finishes the dispatch it is in (an authorized send is sent and its
    outcome recorded, never left without its lease) and takes no new key.

    ``close_store`` / ``close_transport``: whether :meth:`close` closes them (:func:`open_outbox` sets both).
    Raises ``ValueError`` for a bad argument.
    """

    def __init__(
        self,
        store: OutboxStore,
        transport: Transport,
        *,
        workers: int = 1,
        config: RuntimeConfig | None = None,
        sweep_every: float = 1.0,
        reconcile_every: float = 1.0,
        poll_every: float = 0.05,
        poll_batch: int = 32,
        owner: str = "outbox",
        seed: int | None = None,
        work: Callable[[Intent], None] | None = None,
        crash: Callable[[str], None] | None = None,
        credential_version: Callable[[str], str | None] | None = None,
        on_result: Callable[[str, Any], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        backoff_base: float = 0.05,
        backoff_max: float = 5.0,
        close_store: bool = False,
        close_transport: bool = False,
    ):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        if isinstance(poll_batch, bool) or not isinstance(poll_batch, int) or poll_batch < 1:
            raise ValueError(f"poll_batch must be a positive integer, got {poll_batch!r}")
        for name, v in (("sweep_every", sweep_every), ("reconcile_every", reconcile_every), ("poll_every", poll_every)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf:
                raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
        if not 0 < backoff_base <= backoff_max:
            raise ValueError(f"need 0 < backoff_base <= backoff_max, got {backoff_base!r}, {backoff_max!r}")
        self.store, self.transport = store, transport
        self.config = config if config is not None else RuntimeConfig()
        self.workers, self.poll_batch, self.owner, self.seed = workers, poll_batch, owner, seed
        self.sweep_every, self.reconcile_every, self.poll_every = float(sweep_every), float(reconcile_every), poll_every
        self.work, self.crash, self.credential_version = work, crash, credential_version
        self.on_result, self.on_error = on_result, on_error
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.close_store, self.close_transport = close_store, close_transport
        self.sweeper = Sweeper(store, self.config)
        self.reconciler = Reconciler(store, transport, self.config)
        self._lock = threading.Lock()
        self._report = OutboxReport()
        self._last: dict[str, tuple[str, float]] = {}
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._threads: list[Worker] = []
        self._wakes: list[threading.Event] = []
        self._maintainer: threading.Thread | None = None
        self._started = 0.0
        self._closed = False

    # -- intake -------------------------------------------------------------------------------
    def submit(self, account: str, action_kind: str, target: str, request: Mapping[str, Any], **options: Any) -> Intent:
        """Queue one delivery: ``Store.submit`` (same arguments and options, e.g. ``requires_approval=True``).

        Idempotent: the same account, kind, target and request give the same delivery key, and submitting it
        again returns the existing intent, in whatever state it has reached. Raises ``IntakeError`` for bad
        input, ``StoreError`` when the store fails.
        """
        return self.store.submit(account, action_kind, target, request, **options)

    # -- running --------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether dispatch threads are running (between :meth:`start` and :meth:`stop`, or inside :meth:`run`)."""
        return bool(self._threads)

    def report(self) -> OutboxReport:
        """A copy of the counts so far (thread-safe)."""
        with self._lock:
            out = self._report.copy()
        if self.running:
            out.seconds = time.monotonic() - self._started
        return out

    def start(self) -> Outbox:
        """Start the dispatch workers and a maintenance thread (sweeper, reconciler) in the background; returns
        ``self``. Raises ``RuntimeError`` when already running or closed."""
        self._start_workers()
        self._maintainer = threading.Thread(target=self._maintain_until_stopped, name="outbox-maintenance", daemon=True)
        self._maintainer.start()
        return self

    def stop(self, timeout: float | None = None) -> OutboxReport:
        """Stop gracefully and return the report: no worker takes a new key; each finishes the dispatch it is in.
        ``timeout`` (seconds, ``None``: wait as long as it takes) bounds the wait for all of them; threads still
        in a dispatch then are counted in ``still_running``. Calling it when not running returns the report."""
        self._stop.set()
        self.wake()  # idle workers wait on their wake event: end the wait now
        deadline = None if timeout is None else time.monotonic() + timeout
        threads = list(self._threads) + ([self._maintainer] if self._maintainer is not None else [])
        for t in threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        still = sum(1 for t in self._threads if t.is_alive())
        with self._lock:
            if self._threads:
                self._report.seconds = time.monotonic() - self._started
            self._report.still_running = still
        self._threads, self._maintainer = [], None
        return self.report()

    def request_stop(self) -> None:
        """Ask the running service to stop, from any thread, without waiting: no worker takes a new key, and
        :meth:`run` returns after its graceful stop (:meth:`stop` also waits for the threads)."""
        self._stop.set()

    def run(
        self,
        until_idle: bool = True,
        *,
        timeout: float | None = None,
        on_tick: Callable[[OutboxReport], None] | None = None,
    ) -> OutboxReport:
        """Run the service in this thread (workers in their own) and return the report.

        ``until_idle=True``: until nothing is left to do: no intent in flight, unknown or retryable, and every
        queued intent either dispatched or waiting for someone (its last dispatch gave one of
        :func:`held_outcomes`), seen so twice in a row; ``report.idle`` is then true. ``until_idle=False``: until
        :meth:`stop` is called from another thread. Either way at most ``timeout`` seconds (``None``: no bound),
        then a graceful stop. ``on_tick(report)`` is called after each maintenance round (about every
        ``min(sweep_every, reconcile_every, 0.1)`` seconds). A ``KeyboardInterrupt`` stops gracefully, then
        propagates. Raises ``RuntimeError`` when already running or closed.
        """
        self._start_workers()
        deadline = None if timeout is None else self._started + timeout
        step = min(self.sweep_every, self.reconcile_every, 0.1)
        idle, quiet_since = False, None
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                healthy = self._maintain(now)
                if on_tick is not None:
                    on_tick(self.report())
                if until_idle and healthy:
                    seen = self._quiet(-math.inf if quiet_since is None else quiet_since)
                    if seen is None:  # work left to do
                        quiet_since = None
                    elif quiet_since is None:  # quiet once: every waiting intent must be offered again since
                        quiet_since = now
                    elif seen:  # ... and it was, and waited again: nothing is left to do
                        idle = True
                        break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                self._stop.wait(step)
        finally:
            self.stop()
            with self._lock:
                self._report.idle = idle
        return self.report()

    def close(self) -> None:
        """Stop (gracefully) if running, then close the store and the transport if this outbox owns them
        (``close_store``, ``close_transport``). Idempotent."""
        if self._closed:
            return
        self.stop()
        self._closed = True
        if self.close_transport:
            self.transport.close()
        if self.close_store:
            self.store.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wake(self) -> None:
        """Cut the idle wait of every dispatch worker short: they poll now (called when the database
        notifies that an intent was submitted or became due, docs/operations.md). Thread-safe."""
        for w in list(self._wakes):
            w.set()

    # -- internals ------------------------------------------------------------------------------
    def _start_workers(self) -> None:
        if self._closed:
            raise RuntimeError("this outbox is closed")
        if self._threads:
            raise RuntimeError("this outbox is already running")
        self._stop = threading.Event()
        self._next = {"sweep": 0.0, "reconcile": 0.0}
        self._failures = {"sweep": 0, "reconcile": 0}
        self._started = time.monotonic()
        with self._lock:
            self._report.idle, self._report.still_running = False, 0
        batch = self.poll_batch
        # the workers read the queue in turn, together: intents that only wait at its head (a paused account,
        # drafts awaiting approval) cannot keep the ones behind them from being dispatched
        queue: RoundRobin[str] = RoundRobin(lambda n, after: self.store.claimable(n, after=after), lambda k: k)
        self._wakes = [threading.Event() for _ in range(self.workers)]
        self._threads = [
            Worker(
                Dispatcher(
                    self.store,
                    self.transport,
                    self.config,
                    work=self.work,
                    crash=self.crash,
                    credential_version=self.credential_version,
                    owner=f"{self.owner}-{i}",
                ),
                lambda: queue(batch),
                stop=self._stop,
                on_result=self._on_result,
                on_error=lambda exc: self._on_failure("poll", exc),
                seed=None if self.seed is None else self.seed + i,
                idle_sleep=self.poll_every,
                backoff_base=self.backoff_base,
                backoff_max=self.backoff_max,
                wake=self._wakes[i],
            )
            for i in range(self.workers)
        ]
        for t in self._threads:
            t.start()

    def _on_result(self, key: str, result: Any) -> None:
        name = outcome_name(result)
        with self._lock:
            self._last[key] = (name, time.monotonic())
            (self._report.waited if name in self.store.table.waiting_outcomes else self._report.dispatched)[name] += 1
        if self.on_result is not None:
            self.on_result(key, result)

    def _on_failure(self, where: str, exc: BaseException) -> None:
        with self._lock:
            self._report.errors[where] += 1
        if self.on_error is not None:
            self.on_error(exc)

    def _maintain_until_stopped(self) -> None:
        step = min(self.sweep_every, self.reconcile_every)
        while not self._stop.is_set():
            # this thread's own: nothing signals it but the stop event, so a BaseException that is no Exception
            # (a transport's cancellation in a lookup) came out of a pass; it is a failed pass, not the thread's end
            self._maintain(time.monotonic(), failures=BaseException)
            self._stop.wait(step)

    def _maintain(self, now: float, failures: type[BaseException] = Exception) -> bool:
        """One maintenance round: each pass that is due; returns whether every pass it made succeeded. A pass that
        raises one of ``failures`` is reported (``errors``) and waited out with backoff."""
        ok = True
        for where, every, run in (
            ("sweep", self.sweep_every, self.sweeper.tick),
            ("reconcile", self.reconcile_every, self.reconciler.run),
        ):
            if now < self._next[where]:
                continue
            try:
                counts = run()
            except failures as exc:  # the database is down or a connection broke: back off, never die
                ok = False
                self._failures[where] += 1
                self._on_failure(where, exc)
                self._next[where] = now + backoff_delay(
                    self._failures[where], self.backoff_base, self.backoff_max, self._rng
                )
                continue
            self._failures[where] = 0
            self._next[where] = now + every
            # passes that only waited (a lookup spaced, a retry not due yet) are left out: they repeat every pass
            counts = {
                k: v
                for k, v in counts.items()
                if v and (where, k) not in (("reconcile", "deferred"), ("sweep", "waiting"))
            }
            with self._lock:
                (self._report.swept if where == "sweep" else self._report.reconciled).update(counts)
        return ok

    def _quiet(self, since: float) -> bool | None:
        """``None`` while there is work: an intent in flight, unknown or retryable, a begun attempt, or a claimable
        intent whose last dispatch did not give a :func:`held_outcomes` outcome (or that was never offered), and
        on a store error. Otherwise whether every claimable intent was last offered at or after ``since``
        (monotonic seconds): ``False`` while some still wait to be offered again."""
        t = self.store.table
        try:
            counts = self.store.count_by_state()
            if any(counts.get(s, 0) for s in (STATE.authorized, STATE.indeterminate, STATE.failed)):
                return None
            pending = counts.get(STATE.pending, 0)
            if not pending:
                return True
            claimable = self.store.claimable(pending)
            if len(claimable) < pending:  # begun (a lease runs) or held by the freshness fence
                listed = self.store.list_intents(state=STATE.pending, limit=pending)
                if any(it.attempt_token is not None for it in listed):
                    return None
        except Exception as exc:
            self._on_failure("poll", exc)
            return None
        with self._lock:
            last = [self._last.get(k) for k in claimable]
        held = held_outcomes(t)
        if any(x is None or x[0] not in held for x in last):
            return None
        return all(x is not None and x[1] >= since for x in last)


def open_outbox(
    url: str | None = None,
    *,
    transport: Transport,
    store_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> Outbox:
    """``atmostonce.open``: open the store at ``url`` (:func:`atmostonce.open_store`, with ``store_options``) and
    return an :class:`Outbox` over it and ``transport``; ``options`` are the outbox's (``workers=``,
    ``config=``, ...). The outbox owns both: :meth:`Outbox.close` (or leaving ``with``) closes the store and
    the transport. Raises what ``open_store`` raises, and ``ValueError`` for a bad option (the store is then
    closed again).
    """
    store = open_store(url, **dict(store_options or {}))
    try:
        return Outbox(store, transport, close_store=True, close_transport=True, **options)
    except BaseException:
        store.close()
        raise
