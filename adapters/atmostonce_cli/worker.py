"""``atmostonce worker``, ``atmostonce submit`` and ``atmostonce status`` (docs/operations.md).

The worker runs the outbox service (``atmostonce.service.Outbox``, docs/design.md#the-outbox-service) until
SIGTERM or SIGINT, then drains: no new key is taken, each dispatch in progress finishes and records its
outcome, and the store and transport are closed. On PostgreSQL it LISTENs for the notifications of
migration 0009 (``atmostonce_sql.notify``) and polls every ``intervals.poll_seconds`` otherwise; on SQLite it
polls. Database errors never end it: opening the store, polling, sweeping, reconciling and listening are
retried with a jittered backoff.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import sys
import threading
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atmostonce.errors import IntakeError, SchemaNewer, SequenceBehind, StoreError, StoreNotFound
from atmostonce.runtime import RuntimeConfig, backoff_delay

from .urls import display_url, resolve_url

__all__ = ["WorkerConfig", "add_commands", "load_worker_config"]

LOG = logging.getLogger("atmostonce.worker")

TOP_FIELDS = {
    "database_url": str,
    "platform": str,
    "workers": int,
    "owner": str,
    "contract_version": str,
    "drain_seconds": float,
    "credentials": dict,
    "intervals": dict,
    "runtime": dict,
    "platform_overrides": dict,
    "logging": dict,
}
INTERVAL_FIELDS = ("poll_seconds", "sweep_seconds", "reconcile_seconds")
RUNTIME_FIELDS = tuple(RuntimeConfig.__dataclass_fields__)
LOGGING_FIELDS = {"level": ("DEBUG", "INFO", "WARNING", "ERROR"), "format": ("json", "text")}


@dataclass(frozen=True)
class WorkerConfig:
    """A worker's TOML file, checked (:func:`load_worker_config`)."""

    path: str
    platform: str
    database_url: str | None = None
    workers: int = 1
    owner: str = field(default_factory=lambda: f"worker-{os.uname().nodename}-{os.getpid()}")
    contract_version: str | None = None
    drain_seconds: float = 60.0
    credentials: Mapping[str, str] = field(default_factory=dict)
    poll_seconds: float = 5.0
    sweep_seconds: float = 1.0
    reconcile_seconds: float = 1.0
    runtime: Mapping[str, Any] = field(default_factory=dict)
    platform_overrides: Mapping[str, Any] = field(default_factory=dict)
    log_level: str = "INFO"
    log_format: str = "json"

    def platform_path(self) -> str:
        """``platform`` as given: a shipped profile's name, or a file (relative to the config file's folder)."""
        if not self.platform.endswith((".toml", ".json")):
            return self.platform
        p = Path(self.platform)
        return str(p if p.is_absolute() else Path(self.path).parent / p)


def _bad(path: str, name: str, why: str) -> IntakeError:
    return IntakeError(f"--config {path}: field {name}: {why}")


def _positive(path: str, name: str, v: Any, *, whole: bool = False, zero: bool = False) -> float | int:
    if isinstance(v, bool) or not isinstance(v, int if whole else (int, float)):
        raise _bad(path, name, f"must be a {'whole number' if whole else 'number'}, got {v!r}")
    if not whole and not math.isfinite(v):
        raise _bad(path, name, f"must be a finite number, got {v!r}")
    if not (v >= 0 if zero else v > 0):
        raise _bad(path, name, f"must be {'0 or more' if zero else 'positive'}, got {v!r}")
    return v


def load_worker_config(path: str) -> WorkerConfig:
    """Read and check a worker config file. Raises :class:`IntakeError` (exit 2) naming the file and the field:
    a file that cannot be read or is not TOML, an unknown field, a value of the wrong type or range."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        raise IntakeError(f"--config {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise IntakeError(f"--config {path}: not TOML: {exc}") from exc
    for name, v in raw.items():
        want = TOP_FIELDS.get(name)
        if want is None:
            raise _bad(path, name, f"unknown field; known: {', '.join(TOP_FIELDS)}")
        if want is float:
            continue  # checked below as a number
        if not isinstance(v, want) or isinstance(v, bool):
            kind = {str: "a string", int: "a whole number", dict: "a table"}[want]
            raise _bad(path, name, f"must be {kind}, got {v!r}")
    if "platform" not in raw:
        raise _bad(path, "platform", "required: a platform profile file (spec/platforms/*.toml) or a shipped name")
    kw: dict[str, Any] = {"path": path, "platform": raw["platform"]}
    for name in ("database_url", "owner", "contract_version"):
        if name in raw:
            if not raw[name].strip():
                raise _bad(path, name, "must not be empty")
            kw[name] = raw[name]
    if "workers" in raw:
        kw["workers"] = _positive(path, "workers", raw["workers"], whole=True)
    if "drain_seconds" in raw:
        kw["drain_seconds"] = float(_positive(path, "drain_seconds", raw["drain_seconds"], zero=True))
    creds = raw.get("credentials", {})
    for account, version in creds.items():
        if not isinstance(version, str) or not version.strip():
            raise _bad(path, f"credentials.{account}", f"must be a non-empty version string, got {version!r}")
    kw["credentials"] = dict(creds)
    for name, v in raw.get("intervals", {}).items():
        if name not in INTERVAL_FIELDS:
            raise _bad(path, f"intervals.{name}", f"unknown field; known: {', '.join(INTERVAL_FIELDS)}")
        kw[name] = float(_positive(path, f"intervals.{name}", v))
    runtime = raw.get("runtime", {})
    for name, v in runtime.items():
        if name not in RUNTIME_FIELDS:
            raise _bad(path, f"runtime.{name}", f"unknown field; known: {', '.join(RUNTIME_FIELDS)}")
        whole = isinstance(RuntimeConfig.__dataclass_fields__[name].default, int)
        zero = name in (
            "first_look_after",
            "reconcile_interval",
            "retry_backoff",
            "retry_backoff_max",
            "retry_after_max",
        )
        _positive(path, f"runtime.{name}", v, whole=whole, zero=zero)
    kw["runtime"] = dict(runtime)
    kw["platform_overrides"] = dict(raw.get("platform_overrides", {}))
    for name, v in raw.get("logging", {}).items():
        allowed = LOGGING_FIELDS.get(name)
        if allowed is None:
            raise _bad(path, f"logging.{name}", f"unknown field; known: {', '.join(LOGGING_FIELDS)}")
        if v not in allowed:
            raise _bad(path, f"logging.{name}", f"must be one of {', '.join(allowed)}, got {v!r}")
        kw[f"log_{name}"] = v
    cfg = WorkerConfig(**kw)
    _load_profile(cfg)  # a profile that cannot be read or is not an HTTP profile is a bad config too
    return cfg


def _load_profile(cfg: WorkerConfig):
    from atmostonce_http.profile import load_platform_file, load_profile

    where = cfg.platform_path()
    try:
        if cfg.platform_overrides:
            profile = load_profile(where, **cfg.platform_overrides)
        else:
            profile = load_platform_file(where) if where.endswith((".toml", ".json")) else load_profile(where)
    except ValueError as exc:
        raise _bad(cfg.path, "platform", str(exc)) from exc
    if profile.config is None:
        raise _bad(cfg.path, "platform", f"a {profile.transport} profile; the worker drives an HTTP platform")
    return profile


# ---------------------------------------------------------------- logging
_RECORD_FIELDS = (
    "key",
    "event",
    "state",
    "outcome",
    "attempt",
    "generation",
    "guard",
    "channel",
    "payload",
    "send_lease_seconds",
    "send_timeout_seconds",
)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the structured fields a record carries."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _RECORD_FIELDS:
            if hasattr(record, name):
                doc[name] = getattr(record, name)
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, sort_keys=True, default=str)


def setup_logging(level: str, fmt: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if fmt == "json" else logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    )
    root = logging.getLogger("atmostonce")
    root.addHandler(handler)
    root.setLevel(level)
    return handler


# ---------------------------------------------------------------- worker
def _open_store_patiently(url: str, stop: threading.Event):
    """Open the store, waiting out an unreachable database (jittered backoff, logged) until ``stop``; a
    sequence behind its data (a partial restore), a SQLite file that does not exist (a mistyped path) and a schema
    a newer atmostonce migrated are not waited out: they need an operator, and the worker exits with the store
    error (exit 3)."""
    from atmostonce.plugins import open_store, scheme_of

    rng, failures = random.Random(), 0
    kw = {"create": False} if scheme_of(url) in ("sqlite", "postgresql") else {}
    while True:
        try:
            return open_store(url, **kw)
        except (SchemaNewer, SequenceBehind, StoreNotFound):
            raise
        except StoreError as exc:
            failures += 1
            LOG.warning("cannot open the store yet: %s", exc, extra={"event": "worker.store_unreachable"})
            if stop.wait(backoff_delay(failures, 0.2, 5.0, rng)):
                return None


def cmd_worker(args) -> int:
    from atmostonce.observe import observe_store
    from atmostonce.service import Outbox

    cfg = load_worker_config(args.config)
    handler = setup_logging(cfg.log_level, cfg.log_format)
    url = resolve_url(cfg.database_url if args.database_url is None else args.database_url)
    profile = _load_profile(cfg)
    stop = threading.Event()

    def on_signal(signum, _frame):
        LOG.info("signal %s: draining", signal.Signals(signum).name, extra={"event": "worker.drain"})
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    listener = None
    try:
        store = _open_store_patiently(url, stop)
        if store is None:
            # stopped before the database ever answered: nothing ran. The (empty) report is printed as for any
            # run, and the exit code says the store was never reached
            from atmostonce.service import OutboxReport

            LOG.warning(
                "worker stopped before its database answered: nothing was run",
                extra={"event": "worker.stop", "outcome": "store_unreachable"},
            )
            empty = OutboxReport()
            print(json.dumps(empty.as_dict(), sort_keys=True) if args.json else str(empty))
            return 3
        try:
            transport = profile.http_transport()
        except BaseException:
            store.close()
            raise
        if cfg.contract_version is not None:
            transport.contract_version = cfg.contract_version
        creds = dict(cfg.credentials)
        outbox = Outbox(
            store,
            transport,
            workers=cfg.workers,
            config=profile.runtime_config(**cfg.runtime),
            sweep_every=cfg.sweep_seconds,
            reconcile_every=cfg.reconcile_seconds,
            poll_every=cfg.poll_seconds,
            owner=cfg.owner,
            credential_version=(lambda account: creds.get(account)) if creds else None,
            on_error=lambda exc: LOG.warning(
                "database error, backing off: %s", type(exc).__name__, extra={"event": "worker.backoff"}
            ),
            close_store=True,
            close_transport=True,
        )
        observe_store(store)
        outbox.start()
        if getattr(store, "dialect", None) == "postgresql":  # a SqlStore on PostgreSQL: LISTEN as well
            from atmostonce_sql.notify import DueListener

            listener = DueListener(store, outbox.wake, stop=stop)
            listener.start()
        LOG.info(
            "worker started on %s: %d dispatch threads, %s",
            display_url(url),
            cfg.workers,
            "LISTEN/NOTIFY and polling" if listener else "polling",
            extra={"event": "worker.start"},
        )
        while not stop.wait(0.5):
            pass
        report = outbox.stop(timeout=cfg.drain_seconds)
        if listener is not None:
            listener.join(10)
        outbox.close()
        LOG.info(
            "worker stopped: %s",
            report,
            extra={"event": "worker.stop", "outcome": "drained" if not report.still_running else "timeout"},
        )
        doc = report.as_dict()
        if listener is not None:
            doc["notified_wakes"] = listener.wakes
        print(json.dumps(doc, sort_keys=True) if args.json else str(report))
        return 0
    finally:
        stop.set()
        for s, h in previous.items():
            signal.signal(s, h)
        logging.getLogger("atmostonce").removeHandler(handler)


# ---------------------------------------------------------------- submit and status
def cmd_submit(args) -> int:
    from .main import _intent_dict, _store

    text = sys.stdin.read() if args.payload in (None, "-") else args.payload
    try:
        request = json.loads(text)
    except ValueError as exc:
        raise IntakeError(f"the payload is not JSON: {exc}") from exc
    if not isinstance(request, dict):
        raise IntakeError(f"the payload must be a JSON object, got {type(request).__name__}")
    store = _store(args)
    try:
        it = store.submit(
            args.account,
            args.kind,
            args.target,
            request,
            requires_approval=args.requires_approval,
            **({} if args.max_attempts is None else {"max_attempts": args.max_attempts}),
            **({} if args.max_reconciles is None else {"max_reconciles": args.max_reconciles}),
        )
    finally:
        store.close()
    if args.json:
        print(json.dumps(_intent_dict(it), indent=2, sort_keys=True, default=str))
    else:
        print(it.key)
    return 0


def cmd_status(args) -> int:
    from atmostonce.observe import figures

    from .main import _store

    store = _store(args)
    try:
        fig = figures(store)
    finally:
        store.close()
    if args.json:
        print(json.dumps(fig, indent=2, sort_keys=True))
        return 0
    lines = ["intents by state:"]
    lines += [f"  {s:<16}{n}" for s, n in fig["states"].items()]
    lines.append("oldest waiting for evidence or a person:")
    for s, age in fig["oldest_age_seconds"].items():
        lines.append(f"  {s:<16}{'-' if age is None else _age(age)}")
    for title, name in (
        ("attempt outcomes recorded:", "sends"),
        ("reconcile lookups:", "reconcile_lookups"),
        ("recorded refusals by guard:", "refusals"),
    ):
        lines.append(title)
        lines += [f"  {k:<28}{n}" for k, n in fig[name].items()] or ["  (none)"]
    print("\n".join(lines))
    return 0


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def add_commands(sub, db) -> None:
    """Add ``worker``, ``submit`` and ``status`` to the CLI's subparsers (``db`` adds ``--database-url``, ``--json``)."""
    w = db(sub.add_parser("worker", help="run the outbox service until SIGTERM or SIGINT, then drain"))
    w.add_argument("--config", required=True, metavar="FILE", help="the worker's TOML file (docs/operations.md)")
    w.set_defaults(func=cmd_worker)
    s = db(sub.add_parser("submit", help="queue an intent (idempotent: the same request gives the same key)"))
    s.add_argument("account")
    s.add_argument("kind")
    s.add_argument("target")
    s.add_argument("payload", nargs="?", help="the request as a JSON object; '-' or nothing: read it from stdin")
    s.add_argument("--requires-approval", action="store_true")
    s.add_argument("--max-attempts", type=int, help="sends allowed before it is parked (default 3)")
    s.add_argument(
        "--max-reconciles",
        type=int,
        help="lookups of an unknown send before it is parked for a person (default 3; more for a platform "
        "that creates objects some seconds after it answers)",
    )
    s.set_defaults(func=cmd_submit)
    st = db(sub.add_parser("status", help="intents per state, the oldest waiting for a person, send and lookup counts"))
    st.set_defaults(func=cmd_status)
