"""The main job: publish N intents through a faulty platform with crashing workers, and count duplicates.

On the embedded default (a SQLite file and the in-process platform sink) or on
PostgreSQL (``--database-url``). The sink runs *without* idempotency-key
dedupe, so any resend by the runtime would show up as a second object: the
duplicate count is a real measurement, not the platform covering for us. Its
lookup by key is fenced (docs/design.md#a-fence-is-a-tombstone), so an unknown outcome whose lookup
proves absence may be retried; every other unknown stays unknown.
"""

from __future__ import annotations

import random
import shlex
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

from atmostonce.identity import split_platform_idempotency_key
from atmostonce.names import STATE
from atmostonce.plugins import open_store as open_store_url
from atmostonce.records import Intent
from atmostonce.runtime import CRASH_POINTS, RuntimeConfig, SimulatedCrash
from atmostonce.service import Outbox, OutboxReport
from atmostonce.store import Store

from .urls import usable_url

__all__ = ["DEFAULT_FAULT_MIX", "DemoResult", "run_demo"]

DEFAULT_FAULT_MIX = {
    "delay": 0.04,  # longer than the client's read timeout: unknown, and it may still land
    "error_before_write": 0.05,
    "error_after_write": 0.05,
    "drop_before_write": 0.05,
    "drop_after_write": 0.05,
    "reset": 0.03,
    "read_lag": 0.08,
}


@dataclass
class DemoResult:
    intents: int
    by_state: dict[str, int]
    creates: int
    create_requests: int
    duplicates: int
    duplicate_keys: list[str]
    published_without_object: int
    crashes: int
    outcomes: dict[str, int]
    faults: dict[str, int]
    seconds: float
    database: str
    finished: bool
    parked_with_object: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    password_left_out: bool = False
    """``database`` is the URL the demo ran on, ready for ``--database-url``, but without its password."""

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.published_without_object == 0

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["ok"] = self.ok
        return d


class _Crasher:
    """Kills a dispatch at a random step boundary with probability ``rate`` per boundary."""

    def __init__(self, rate: float, seed: int):
        self.rate, self.rng, self.lock, self.count = rate, random.Random(seed), threading.Lock(), 0

    def __call__(self, point: str) -> None:
        assert point in CRASH_POINTS
        with self.lock:
            hit = self.rng.random() < self.rate
            if hit:
                self.count += 1
        if hit:
            raise SimulatedCrash(point)


def _progress(out: TextIO, counts: dict[str, int], elapsed: float, final: bool = False) -> None:
    line = "  ".join(f"{k} {v:>4}" for k, v in counts.items())
    if out.isatty():
        out.write(f"\r[{elapsed:6.1f}s] {line}" + ("\n" if final else ""))
    else:
        out.write(f"[{elapsed:6.1f}s] {line}\n")
    out.flush()


OPEN_STATES = (STATE.pending, STATE.authorized, STATE.indeterminate, STATE.failed)
"""The states a demo waits out; the others are settled (published, or parked for a person)."""


def check_arguments(n: int, workers: int, crash_rate: float) -> None:
    """The platform demos' argument check: ``ValueError`` for no intent, no worker or a crash rate outside [0, 1]."""
    if n < 1 or workers < 1:
        raise ValueError("need at least one intent and one worker")
    if not 0.0 <= crash_rate <= 1.0:
        raise ValueError("crash_rate is a probability between 0 and 1")


def open_empty_store(database_url: str) -> Store:
    """Open the demo's store; ``ValueError`` (the store closed again) when it already holds intents."""
    store = open_store_url(database_url)
    existing = sum(store.count_by_state().values())
    if existing:
        store.close()
        raise ValueError(f"the demo needs an empty database; this one holds {existing} intents")
    return store


@dataclass
class Settled:
    """What a demo's run left: ``outcomes`` (dispatch outcomes by name, ``reconcile:<name>`` for the
    reconciler's), and ``finished``: no intent is left in an :data:`OPEN_STATES` state."""

    outcomes: Counter[str]
    finished: bool


def run_outbox(
    outbox: Outbox, store: Store, *, started: float, timeout: float, progress: TextIO | None, progress_every: float
) -> Settled:
    """Run ``outbox`` until idle or ``timeout`` seconds, a progress line on ``progress`` every ``progress_every``
    seconds (elapsed counted from ``started``, a ``time.monotonic()``)."""
    last = [0.0]

    def on_tick(_report: OutboxReport) -> None:
        if progress is not None and time.monotonic() - last[0] >= progress_every:
            _progress(progress, store.count_by_state(), time.monotonic() - started)
            last[0] = time.monotonic()

    report = outbox.run(until_idle=True, timeout=timeout, on_tick=on_tick)
    outcomes = report.dispatched + report.waited + Counter({f"reconcile:{k}": v for k, v in report.reconciled.items()})
    counts = store.count_by_state()
    return Settled(outcomes, all(counts.get(s, 0) == 0 for s in OPEN_STATES))


R = TypeVar("R", bound="DemoResult")


def platform_result(
    cls: type[R],
    store: Store,
    keys: Iterable[str],
    by_key: Mapping[str, int],
    *,
    crasher: _Crasher,
    settled: Settled,
    started: float,
    holds: Callable[[Intent], bool] | None = None,
    **fields: Any,
) -> R:
    """The result of a demo whose duplicates are counted on the platform itself, never from our counters.

    ``by_key``: the objects the platform holds, by key; ``holds(intent)``: whether it holds that intent's
    object (default: ``by_key`` counts its delivery key). ``fields``: the rest of ``cls``'s fields
    (``create_requests``, ``faults`` and the platform's own).
    """
    finals = [store.get(k) for k in keys]
    if holds is None:
        holds = lambda it: by_key.get(it.key, 0) > 0  # noqa: E731
    return cls(
        intents=len(finals),
        by_state=store.count_by_state(),
        creates=sum(by_key.values()),
        duplicates=sum(c - 1 for c in by_key.values() if c > 1),
        duplicate_keys=sorted(k for k, c in by_key.items() if c > 1),
        published_without_object=sum(1 for it in finals if it.state == STATE.published and not holds(it)),
        parked_with_object=sum(1 for it in finals if it.state == STATE.parked and holds(it)),
        crashes=crasher.count,
        outcomes=dict(sorted(settled.outcomes.items())),
        seconds=round(time.monotonic() - started, 2),
        database="",
        finished=settled.finished,
        **fields,
    )


def run_demo(
    n: int = 200,
    workers: int = 4,
    database_url: str | None = None,
    seed: int = 1,
    fault_mix: dict[str, float] | None = None,
    crash_rate: float = 0.03,
    timeout: float = 180.0,
    progress: TextIO | None = sys.stderr,
    progress_every: float = 1.0,
) -> DemoResult:
    """Run the demo; returns a :class:`DemoResult`. Times are seconds.

    Raises ``ValueError`` for a bad argument, ``StoreError`` when the database fails.
    """
    from atmostonce_http import HttpTransport, PlatformSink, sink_config

    if n < 1 or workers < 1:
        raise ValueError("need at least one intent and one worker")
    tmp = None
    if database_url is None:
        tmp = tempfile.mkdtemp(prefix="atmostonce-demo-")
        database_url = f"sqlite:///{Path(tmp) / 'demo.sqlite3'}"
    store = open_store_url(database_url)
    existing = sum(store.count_by_state().values())
    if existing:
        store.close()
        raise ValueError(f"the demo needs an empty database; this one holds {existing} intents")
    run = uuid.uuid4().hex[:8]
    config = RuntimeConfig(
        lease_seconds=2.0, send_lease_seconds=3.0, retries_per_tick=25, reconcile_interval=0.5, retry_backoff=0.5
    )  # the demo's time, compressed
    crasher = _Crasher(crash_rate, seed)
    started = time.monotonic()
    with PlatformSink(dedupe=False, fenced_lookup=True, delay_seconds=1.2, read_lag_seconds=0.4) as sink:
        sink.set_fault_mix(fault_mix if fault_mix is not None else DEFAULT_FAULT_MIX, seed=seed)
        cfg = sink_config(
            sink.url,
            key_field="/delivery_key",
            lookup_fenced=True,
            # on loopback a connect or a write never takes long; the read times out on purpose (the sink's delay)
            # the send lease (3 s) outlasts a whole send, connects included, so no answer can outlive it
            connect_timeout=0.5,
            write_timeout=0.5,
            read_timeout=0.8,
        )
        transport = HttpTransport(cfg)
        keys = [
            store.submit(f"demo-account-{i % 3}", "post", "demo-room", {"text": f"demo post {i} of run {run}"}).key
            for i in range(n)
        ]
        outbox = Outbox(
            store, transport, workers=workers, config=config, crash=crasher, seed=seed,
            sweep_every=0.1, reconcile_every=0.1, poll_every=0.02,
        )  # fmt: skip
        settled = run_outbox(
            outbox, store, started=started, timeout=timeout, progress=progress, progress_every=progress_every
        )
        counts = store.count_by_state()
        if progress is not None:
            _progress(progress, counts, time.monotonic() - started, final=True)
        by_key = sink.creates_by_key
        dup_keys = sorted(k for k, c in by_key.items() if c > 1)
        # the body carries the platform key (key_field): the delivery key plus its epochs, if any
        on_platform = {
            split_platform_idempotency_key(dk)[0]
            for dk in (obj["body"].get("delivery_key") for obj in sink.objects.values())
            if isinstance(dk, str) and dk
        }
        finals = {k: store.get(k) for k in keys}
        missing = sum(1 for it in finals.values() if it.state == STATE.published and it.key not in on_platform)
        parked_on_platform = sum(1 for it in finals.values() if it.state == STATE.parked and it.key in on_platform)
        result = DemoResult(
            intents=len(keys),
            by_state=counts,
            creates=sink.creates,
            create_requests=sink.requests,
            duplicates=sum(c - 1 for c in by_key.values() if c > 1),
            duplicate_keys=dup_keys,
            published_without_object=missing,
            crashes=crasher.count,
            outcomes=dict(sorted(settled.outcomes.items())),
            faults=dict(sink.faults_applied),
            seconds=round(time.monotonic() - started, 2),
            database=usable_url(database_url)[0],
            password_left_out=usable_url(database_url)[1],
            finished=settled.finished,
            parked_with_object=parked_on_platform,
        )
        transport.close()
    store.close()
    return result


def format_result(r: DemoResult) -> str:
    rows: list[tuple[str, object]] = [("intents", r.intents)]
    rows += [(f"  {state}", count) for state, count in r.by_state.items()]
    rows += [
        ("create requests the platform received", r.create_requests),
        ("  (faults before the write, and writes fenced off by a lookup, create nothing)", ""),
        ("objects the platform created", r.creates),
        ("duplicates (must be 0)", r.duplicates),
        ("published intents with no object", r.published_without_object),
        ("parked intents whose object exists (a human resolves them)", r.parked_with_object),
        ("workers killed at a step boundary", r.crashes),
        ("faults injected", sum(r.faults.values())),
        ("time (s)", r.seconds),
        ("database", r.database),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if not r.finished:
        lines.append("NOT SETTLED: stopped at the timeout with intents still open")
    lines.append("OK: at most once" if r.ok else f"FAILED: duplicates for {r.duplicate_keys[:5]}")
    lines.append(f"database kept at {r.database}; inspect it with:")
    lines.append(f"  atmostonce intents list --database-url {shlex.quote(r.database)}")
    if r.password_left_out:
        lines.append("  (the password is left out: give it through PGPASSWORD or ~/.pgpass)")
    return "\n".join(lines)


def format_platform_result(r: DemoResult, extra: list[tuple[str, object]]) -> str:
    """:func:`format_result` for a platform whose lookup is not fenced, with ``extra`` rows after the count of
    objects the platform created."""
    # the sink's note on fenced writes does not apply: this lookup is not fenced
    lines = [line for line in format_result(r).splitlines() if not line.lstrip().startswith("(faults before the write")]
    pad = len(lines[0]) - len(str(r.intents))  # the value column of format_result's table
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith("objects the platform created")), len(lines))
    return "\n".join(lines[:at] + [f"{k:<{pad}}{v}" for k, v in extra] + lines[at:])
