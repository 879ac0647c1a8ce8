"""Drivers: how the runner talks to an implementation.

A driver has three operations (see :class:`Driver`):

* ``reset()``: a fresh, empty implementation (a new database, a new model, a new platform);
* ``call(op, args)``: one operation with JSON arguments; returns the JSON result (a dict), or
  ``{"refused": "<guard>"}`` when the implementation refused the move, or
  ``{"error": {"type": ..., "message": ...}}`` for anything else (bad input, a failing store,
  an operation the driver does not know);
* ``advance(seconds)``: move the implementation's clock forward, as far as every lease and
  window judgement goes.

Results never carry a top-level ``refused`` or ``error`` key, so the three shapes cannot be
confused; list results are wrapped as ``{"items": [...]}``.

:class:`StoreDriver` wraps any Python store (the model, the SQL stores, your own) given a
factory; :class:`SubprocessDriver` speaks the JSON-lines protocol with a program written in
any language (``docs/conformance.md``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import shlex
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from ..errors import AtMostOnceError, IntakeError, Rejected
from ..records import Approval, ClaimLease, Intent, Lease, Plan
from ..runtime import CRASH_POINTS, Dispatcher, Reconciler, RuntimeConfig, SimulatedCrash, Sweeper
from .platform import PLATFORM_FAULTS, ScriptedPlatform

_T = TypeVar("_T")

__all__ = [
    "CLAIM_OPS",
    "EVIDENCE_OPS",
    "FEATURES",
    "RUNTIME_OPS",
    "STORE_OPS",
    "Driver",
    "DriverError",
    "Implementation",
    "ManualClock",
    "RuntimeHarness",
    "StoreDriver",
    "SubprocessDriver",
    "encode",
    "features_of",
]

TRANSITION_OPS = (
    "submit",
    "begin",
    "authorize_dispatch",
    "block_at_gate",
    "record_success",
    "confirm_read_back",
    "read_back_failed",
    "record_not_sent",
    "record_unknown",
    "expire_lease",
    "abandon_attempt",
    "reconcile_found",
    "reconcile_not_found",
    "reconcile_unproven",
    "reconcile_absent",
    "park_unreconcilable",
    "retry",
    "exhaust",
    "park",
    "resolve_published",
    "resolve_not_sent",
    "resend",
)
READ_OPS = (
    "get",
    "history",
    "attempts",
    "reconciliations",
    "refusals",
    "due_leases",
    "claimable",
    "count_by_state",
    "settings",
)
WORLD_OPS = (
    "set_kill_switch",
    "set_credential_version",
    "set_contract_version",
    "set_rate_limit",
    "declare_restore",
    "current_epoch",
    "capture_source",
    "source_head",
)
STORE_OPS = TRANSITION_OPS + READ_OPS + WORLD_OPS
"""Operations every driver answers (feature ``store``)."""

RUNTIME_OPS = ("configure_platform", "dispatch", "dispatch_pending", "sweep", "reconcile", "platform")
"""Operations of drivers with the ``runtime`` feature: the runtime against a scripted platform."""

CLAIM_OPS = (
    "approve",
    "set_signing_required",
    "reserve_claim",
    "release_claim",
    "withdraw_approval",
    "expire_approval",
    "claim",
    "approval",
    "approvals",
    "claim_history",
    "due_approvals",
)
"""Operations of drivers with the ``claims`` feature (approvals and per-target claims, docs/design.md#approvals-and-per-target-dispatch-claims);
with it, ``submit`` takes ``requires_approval`` and ``authorize_dispatch`` a ``claim``."""


EVIDENCE_OPS = ("record_late_outcome", "evidence")
"""Operations of drivers with the ``evidence`` feature: a refused outcome kept on its attempt, and the
intent's late outcomes (docs/design.md#late-outcomes-are-evidence). ``record_late_outcome`` takes the
``lease``, the ``outcome``, the refusal as ``refused_event`` / ``refused_by``, and optional ``remote_id``,
``response_digest``, ``reason`` and ``worker_time``."""


FEATURES = ("store", "runtime", "claims", "evidence")
"""The features a case may require (docs/conformance.md): ``store`` is the core every driver has."""

_FEATURE_OPS = {"claims": CLAIM_OPS, "evidence": EVIDENCE_OPS}
_METHOD_OF = {"settings": "text_window_seconds"}
"""Operations answered by a store member of another name (the rest call the method named like the operation)."""


def features_of(impl: Any) -> frozenset[str]:
    """The features an implementation (an :class:`Implementation`, a ``StoreUnderTest``, ...) declares,
    else those its store has every method for: ``store`` and ``runtime`` always, ``claims`` and
    ``evidence`` when the store has each of their operations."""
    declared = getattr(impl, "features", None)
    if declared is not None:
        unknown = set(declared) - set(FEATURES)
        if unknown:
            raise DriverError(f"unknown features {sorted(unknown)}; known: {', '.join(FEATURES)}")
        return frozenset(declared) | {"store"}
    store = getattr(impl, "store", None)
    found = {"store", "runtime"}
    for feature, ops in _FEATURE_OPS.items():
        if all(callable(getattr(store, _METHOD_OF.get(op, op), None)) for op in ops):
            found.add(feature)
    return frozenset(found)


class DriverError(AtMostOnceError):
    """The driver itself failed: the process died, answered garbage, or timed out."""


class Driver:
    """The Python driver protocol. Subclass it, or give any object these members.

    ``name``: shown in reports. ``features``: what the implementation supports; ``store`` is the
    core, ``runtime`` adds the runtime operations, and a case whose ``requires`` names a feature
    the driver lacks is reported *not applicable* (never passed).
    """

    name: str = "driver"
    features: frozenset[str] = frozenset({"store"})

    def reset(self) -> None:
        raise NotImplementedError

    def call(self, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def advance(self, seconds: float) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release everything the driver holds (called once, after the last case)."""


# ------------------------------------------------------------------------------ JSON codec
def encode(value: Any) -> Any:
    """Store values as JSON: dataclasses become objects (an intent also carries its ``plan``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Intent):
            out["plan"] = encode(value.plan)
        return out
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


def _decode(cls: type[_T], value: Any, what: str) -> _T:
    """A dataclass from its JSON object; missing fields take their default (or ``None``)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise IntakeError(f"{what} must be a JSON object, got {type(value).__name__}")
    kw = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # only dataclasses are decoded
        if f.name in value:
            kw[f.name] = value[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kw[f.name] = None
    return cls(**kw)


def _lease(args: Mapping[str, Any]) -> Lease:
    return _decode(Lease, args.get("lease"), "lease")


def _plan(args: Mapping[str, Any]) -> Plan:
    return _decode(Plan, args.get("plan"), "plan")


def _intent(args: Mapping[str, Any]) -> Intent:
    return _decode(Intent, args.get("intent"), "intent")


def _claim_lease(args: Mapping[str, Any]) -> ClaimLease | None:
    return None if args.get("claim") is None else _decode(ClaimLease, args.get("claim"), "claim")


def _person_plan(args: Mapping[str, Any]) -> dict[str, Any]:
    """A person's move's optional ``plan``: absent or null, the store reads the row as it is when the move runs."""
    return {} if args.get("plan") is None else {"plan": _plan(args)}


def _opt(args: Mapping[str, Any], *names: str) -> dict[str, Any]:
    return {n: args[n] for n in names if n in args}


def _items(values: Sequence[Any]) -> dict[str, Any]:
    return {"items": encode(list(values))}


# ------------------------------------------------------------------------------ store operations
_STORE_CALLS: dict[str, Callable[[Any, Mapping[str, Any]], Any]] = {
    "submit": lambda s, a: s.submit(
        a.get("account"),
        a.get("action_kind"),
        a.get("target"),
        a.get("request"),
        **_opt(a, "max_attempts", "max_reconciles", "requires_approval"),
        **({"source": tuple(a["source"])} if a.get("source") is not None else {}),
    ),
    "begin": lambda s, a: s.begin(a.get("key"), **_opt(a, "lease_seconds")),
    "authorize_dispatch": lambda s, a: s.authorize_dispatch(
        _lease(a),
        request_digest=a.get("request_digest"),
        **_opt(a, "send_lease_seconds", "descriptor", "credential_version", "platform", "contract_version"),
        **({"claim": _claim_lease(a)} if a.get("claim") is not None else {}),
    ),
    "block_at_gate": lambda s, a: s.block_at_gate(_lease(a), reason=a.get("reason", "gate.blocked")),
    "record_success": lambda s, a: s.record_success(
        _lease(a), remote_id=a.get("remote_id"), **_opt(a, "response_digest")
    ),
    "confirm_read_back": lambda s, a: s.confirm_read_back(_lease(a)),
    "read_back_failed": lambda s, a: s.read_back_failed(_lease(a), reason=a.get("reason", "read_back.not_found")),
    "record_not_sent": lambda s, a: s.record_not_sent(_lease(a), reason=a.get("reason", "connect refused")),
    "record_unknown": lambda s, a: s.record_unknown(_lease(a), reason=a.get("reason", "read timeout")),
    "expire_lease": lambda s, a: s.expire_lease(_intent(a)),
    "abandon_attempt": lambda s, a: s.abandon_attempt(_intent(a)),
    "reconcile_found": lambda s, a: s.reconcile_found(_plan(a), remote_id=a.get("remote_id")),
    "reconcile_not_found": lambda s, a: s.reconcile_not_found(_plan(a)),
    "reconcile_unproven": lambda s, a: s.reconcile_unproven(_plan(a)),
    "reconcile_absent": lambda s, a: s.reconcile_absent(_plan(a), fenced=a.get("fenced")),
    "park_unreconcilable": lambda s, a: s.park_unreconcilable(_plan(a), reason=a.get("reason", "lookup.unsupported")),
    "retry": lambda s, a: s.retry(a.get("key")),
    "exhaust": lambda s, a: s.exhaust(a.get("key")),
    "park": lambda s, a: s.park(a.get("key"), operator=a.get("operator"), **_opt(a, "reason")),
    "resolve_published": lambda s, a: s.resolve_published(
        a.get("key"), operator=a.get("operator"), remote_id=a.get("remote_id")
    ),
    "resolve_not_sent": lambda s, a: s.resolve_not_sent(
        a.get("key"), operator=a.get("operator"), **_opt(a, "reason"), **_person_plan(a)
    ),
    "resend": lambda s, a: s.resend(a.get("key"), operator=a.get("operator"), **_person_plan(a)),
    "get": lambda s, a: s.get(a.get("key")),
    "history": lambda s, a: _items(s.history(a.get("key"))),
    "attempts": lambda s, a: _items(s.attempts(a.get("key"))),
    "reconciliations": lambda s, a: _items(s.reconciliations(a.get("key"))),
    "refusals": lambda s, a: _items(s.refusals(a.get("key"))),
    "due_leases": lambda s, a: _items(s.due_leases(a.get("limit", 1000))),
    "claimable": lambda s, a: _items(s.claimable(a.get("limit", 1000))),
    "count_by_state": lambda s, a: dict(s.count_by_state()),
    "settings": lambda s, a: _settings(s),
    "set_kill_switch": lambda s, a: _none(
        s.set_kill_switch(a.get("scope"), a.get("engaged"), operator=a.get("operator"))
    ),
    "set_credential_version": lambda s, a: _none(s.set_credential_version(a.get("account"), a.get("version"))),
    "set_contract_version": lambda s, a: _none(s.set_contract_version(a.get("platform"), a.get("version"))),
    "set_rate_limit": lambda s, a: _none(
        s.set_rate_limit(a.get("account"), a.get("max_sends"), **_opt(a, "window_seconds"))
    ),
    "declare_restore": lambda s, a: dict(
        zip(("epoch", "fenced"), s.declare_restore(operator=a.get("operator")), strict=True)
    ),
    "current_epoch": lambda s, a: {"epoch": s.current_epoch()},
    "capture_source": lambda s, a: s.capture_source(a.get("source_id"), a.get("body")),
    "source_head": lambda s, a: {"head": s.source_head(a.get("source_id"))},
    # feature "claims"
    "approve": lambda s, a: s.approve(
        a.get("key"),
        approver=a.get("approver"),
        expires_in=a.get("expires_in", 600),
        **_opt(a, "request_digest", "target_version"),
    ),
    "reserve_claim": lambda s, a: s.reserve_claim(
        a.get("key"),
        approval_id=a.get("approval_id"),
        request_digest=a.get("request_digest"),
        owner=a.get("owner"),
        **_opt(a, "lease_seconds"),
    ),
    "release_claim": lambda s, a: s.release_claim(_decode(ClaimLease, a.get("claim"), "claim")),
    "set_signing_required": lambda s, a: _none(s.set_signing_required(a.get("account"), a.get("required"))),
    "withdraw_approval": lambda s, a: s.withdraw_approval(
        a.get("approval_id"), operator=a.get("operator"), **_opt(a, "reason")
    ),
    "expire_approval": lambda s, a: s.expire_approval(_decode(Approval, a.get("approval"), "approval")),
    "claim": lambda s, a: s.claim(a.get("target")) or {},
    "approval": lambda s, a: s.approval(a.get("approval_id")),
    "approvals": lambda s, a: _items(s.approvals(a.get("key"))),
    "claim_history": lambda s, a: _items(s.claim_history(a.get("target"))),
    "due_approvals": lambda s, a: _items(s.due_approvals(a.get("limit", 1000))),
    # feature "evidence"
    "record_late_outcome": lambda s, a: s.record_late_outcome(
        _lease(a),
        outcome=a.get("outcome"),
        # a case that leaves one out fails as a store would fail it
        refused=Rejected(a.get("refused_event"), _lease(a).key, a.get("refused_by"), None),  # type: ignore[arg-type]
        **_opt(a, "remote_id", "response_digest", "reason", "worker_time"),
    ),
    "evidence": lambda s, a: _items(s.evidence(a.get("key"))),
}


def _none(_: Any) -> dict[str, Any]:
    return {}


def _settings(store: Any) -> dict[str, Any]:
    window = getattr(store, "text_window_seconds", None)
    if window is None:
        raise _Unsupported("the store does not expose text_window_seconds")
    return {"text_window_seconds": float(window)}


class _Unsupported(Exception):
    pass


@dataclass
class Implementation:
    """A store plus the hook that moves its clock, and what to run when done with it.

    The same three members as :class:`atmostonce.testing.stateful.StoreUnderTest` (either works).
    """

    store: Any
    advance: Callable[[float], None]
    close: Callable[[], None] = lambda: None
    features: frozenset[str] | None = None
    """What the implementation has, of :data:`FEATURES` (``store`` always); ``None``: found from the
    store's methods (:func:`features_of`). A case needing a feature not declared is not applicable."""


class ManualClock:
    """A clock moved by hand, in seconds (for the model: ``MemoryStore(clock=ManualClock())``)."""

    def __init__(self, start: float = 1_000_000.0):
        self.t = float(start)

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class RuntimeHarness:
    """The runtime operations for one store: ``atmostonce.runtime`` against a :class:`ScriptedPlatform`.

    Runtime settings: ``lease_seconds`` 10 and ``send_lease_seconds`` 10 unless the dispatch
    says otherwise, ``retries_per_tick`` 100, lookups not spaced (``reconcile_interval`` 0), retries not
    spaced (``retry_backoff`` 0).
    """

    CONFIG = RuntimeConfig(
        lease_seconds=10, send_lease_seconds=10, retries_per_tick=100, reconcile_interval=0, retry_backoff=0
    )  # a case's tick retries a proven not-sent at once: the cases have no clock of their own
    dispatcher_cls: type[Dispatcher] = Dispatcher
    """The dispatcher class the ``dispatch`` operations run (a subclass, to test a runtime change)."""
    reconciler_cls: type[Reconciler] = Reconciler
    """The reconciler class the ``reconcile`` operation runs (likewise)."""

    def __init__(self, store: Any):
        self.store = store
        self.platform = ScriptedPlatform()

    def _dispatcher(self, args: Mapping[str, Any], crash_at: str | None) -> Dispatcher:
        cfg = dataclasses.replace(
            self.CONFIG,
            lease_seconds=args.get("lease_seconds", self.CONFIG.lease_seconds),
            send_lease_seconds=args.get("send_lease_seconds", self.CONFIG.send_lease_seconds),
        )

        def crash(point: str) -> None:
            if point == crash_at:
                raise SimulatedCrash(point)

        return self.dispatcher_cls(self.store, self.platform, cfg, crash=crash if crash_at else None)

    def call(self, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        if op == "configure_platform":
            self.platform.configure(args.get("lookup", "none"))
            return {}
        if op == "platform":
            return dict(self.platform.counts(args.get("key")))
        if op == "sweep":
            return Sweeper(self.store, self.CONFIG).tick()
        if op == "reconcile":
            return self.reconciler_cls(self.store, self.platform, self.CONFIG).run()
        if op == "dispatch":
            fault = args.get("fault") or {}
            kind = fault.get("kind")
            crash_at = None
            if kind == "worker_dies":
                crash_at = fault.get("at")
                if crash_at not in CRASH_POINTS:
                    raise IntakeError(f"worker_dies needs 'at' in {CRASH_POINTS}, got {crash_at!r}")
            elif kind is not None:
                if kind not in PLATFORM_FAULTS:
                    raise IntakeError(f"unknown fault {kind!r}")
                self.platform.next_fault = kind
            try:
                return {"outcome": self._dispatcher(args, crash_at).dispatch(args.get("key"))}  # type: ignore[arg-type]  # as above
            except SimulatedCrash as exc:
                return {"crashed": str(exc)}
            finally:
                self.platform.next_fault = None
        if op == "dispatch_pending":
            outcomes: dict[str, int] = {}
            d = self._dispatcher(args, None)
            for key in self.store.claimable(1000):
                try:
                    name = d.dispatch(key)
                except Rejected as exc:
                    name = f"refused:{exc.guard}"
                outcomes[name] = outcomes.get(name, 0) + 1
            return {"outcomes": outcomes}
        raise _Unsupported(f"unknown operation {op!r}")


def _refusal_or_error(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        out = fn()
    except Rejected as exc:
        return {"refused": exc.guard}
    except IntakeError as exc:
        return {"error": {"type": "intake", "message": str(exc)}}
    except _Unsupported as exc:
        return {"error": {"type": "unsupported", "message": str(exc)}}
    except AtMostOnceError as exc:
        return {"error": {"type": "store", "message": str(exc)}}
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        return {"error": {"type": "crash", "message": f"{type(exc).__name__}: {exc}"}}
    encoded: dict[str, Any] = encode(out)  # a mapping encodes as a mapping
    return encoded


class StoreDriver(Driver):
    """Runs cases against a Python store. ``factory()`` returns a fresh :class:`Implementation`
    (or a ``StoreUnderTest``): an empty store, its clock hook and its cleanup. ``first``: an
    implementation already built by that factory, used by the first ``reset()``.

    ``features``: what to run. By default, what the implementation declares (``Implementation(...,
    features=...)``), else what its store has the methods for (:func:`features_of`; the factory is called
    once here to see it, and that implementation serves the first case). The runtime operations run
    ``atmostonce.runtime`` against a scripted platform over the same store; the claims operations are the
    store's approval and claim methods; the evidence ones its late outcomes. An operation whose store
    method is missing is answered ``unsupported``, and the runner reports its case not applicable.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        name: str | None = None,
        features: frozenset[str] | set[str] | None = None,
        first: Any = None,
    ):
        self.factory = factory
        self.name = name or str(getattr(factory, "__qualname__", "store"))
        if features is None:
            if first is None:
                first = factory()
            features = features_of(first)
        self.features = frozenset(features)
        self._impl: Any = None
        self._runtime: RuntimeHarness | None = None
        self._first = first  # an implementation the caller already built: used by the first reset()

    @property
    def store(self) -> Any:
        if self._impl is None:
            raise DriverError("reset() was not called")
        return self._impl.store

    def reset(self) -> None:
        self._release()
        impl, self._first = (self._first if self._first is not None else self.factory()), None
        if not (hasattr(impl, "store") and callable(getattr(impl, "advance", None))):
            raise DriverError(
                f"the factory returned {type(impl).__name__}; it must return an Implementation "
                "(or StoreUnderTest) with .store, .advance(seconds) and .close()"
            )
        self._impl = impl
        self._runtime = RuntimeHarness(impl.store)

    def call(self, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        store = self.store
        if op in RUNTIME_OPS:
            if "runtime" not in self.features:
                return {"error": {"type": "unsupported", "message": f"{op}: no runtime feature"}}
            assert self._runtime is not None
            runtime = self._runtime
            return _refusal_or_error(lambda: runtime.call(op, args))
        if op in CLAIM_OPS and "claims" not in self.features:
            return {"error": {"type": "unsupported", "message": f"{op}: no claims feature"}}
        if op in EVIDENCE_OPS and "evidence" not in self.features:
            return {"error": {"type": "unsupported", "message": f"{op}: no evidence feature"}}
        fn = _STORE_CALLS.get(op)
        if fn is None:
            return {"error": {"type": "unsupported", "message": f"unknown operation {op!r}"}}
        member = _METHOD_OF.get(op, op)
        if not hasattr(store, member):
            return {"error": {"type": "unsupported", "message": f"{op}: the store has no {member}"}}
        return _refusal_or_error(lambda: fn(store, args))

    def advance(self, seconds: float) -> None:
        if self._impl is None:
            raise DriverError("reset() was not called")
        self._impl.advance(seconds)

    def _release(self) -> None:
        if self._impl is not None:
            impl, self._impl, self._runtime = self._impl, None, None
            close = getattr(impl, "close", None)
            if callable(close):
                close()

    def close(self) -> None:
        self._release()
        if self._first is not None:
            first, self._first = self._first, None
            if callable(getattr(first, "close", None)):
                first.close()


# ------------------------------------------------------------------------------ JSON lines
class SubprocessDriver(Driver):
    """Talks to a program over JSON lines: one request per line on its stdin, one response per
    line on its stdout (stderr is kept for error messages).

    Request: ``{"op": "...", "args": {...}}``. Response: ``{"ok": {...}}``,
    ``{"refused": {"guard": "..."}}`` or ``{"error": {"type": "...", "message": "..."}}``.
    Control operations: ``hello`` (answers ``{"ok": {"name": ..., "features": [...]}}``),
    ``reset`` and ``advance`` (``{"seconds": n}``).
    """

    def __init__(
        self,
        command: str | Sequence[str],
        *,
        timeout: float = 30.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ):
        self.argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not self.argv:
            raise DriverError("empty driver command")
        self.timeout = timeout
        self.cwd, self.env = cwd, env
        self.name = " ".join(self.argv)
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: deque[str] = deque(maxlen=40)
        self.features = frozenset({"store"})
        self._start()

    def _start(self) -> None:
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                encoding="utf-8",
                bufsize=1,
                cwd=self.cwd,
                env=None if self.env is None else {**os.environ, **self.env},
            )
        except OSError as exc:
            raise DriverError(f"cannot start {self.name!r}: {exc}") from exc
        threading.Thread(target=self._pump, args=(self._proc.stdout, self._lines.put, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self._proc.stderr, self._stderr.append, False), daemon=True).start()
        hello = self._request({"op": "hello", "args": {}})
        if "ok" in hello:
            info = hello["ok"]
            self.name = str(info.get("name") or self.name)
            self.features = frozenset(info.get("features") or ["store"])

    @staticmethod
    def _pump(stream: IO[str], sink: Callable[[Any], object], mark_end: bool) -> None:
        for line in stream:
            sink(line.rstrip("\n"))
        if mark_end:
            sink(None)

    def _died(self, what: str) -> DriverError:
        tail = "\n".join(self._stderr)
        return DriverError(f"driver {self.name!r} {what}" + (f"; its stderr ends:\n{tail}" if tail else ""))

    def _request(self, message: Mapping[str, Any]) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise DriverError("the driver process is closed")
        try:
            proc.stdin.write(json.dumps(message, separators=(",", ":")) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise self._died(f"stopped reading ({exc})") from exc
        try:
            line = self._lines.get(timeout=self.timeout)
        except queue.Empty as exc:
            raise self._died(f"did not answer {message.get('op')!r} within {self.timeout} s") from exc
        if line is None:
            raise self._died(f"exited (code {proc.poll()}) while answering {message.get('op')!r}")
        try:
            response = json.loads(line)
        except json.JSONDecodeError as exc:
            raise self._died(f"answered a line that is not JSON: {line[:200]!r}") from exc
        if not isinstance(response, dict) or len(response.keys() & {"ok", "refused", "error"}) != 1:
            raise self._died(f"answered {line[:200]!r}; expected exactly one of ok, refused, error")
        return response

    def reset(self) -> None:
        self._control({"op": "reset", "args": {}})

    def advance(self, seconds: float) -> None:
        self._control({"op": "advance", "args": {"seconds": seconds}})

    def _control(self, message: Mapping[str, Any]) -> None:
        response = self._request(message)
        if "ok" not in response:
            raise self._died(f"refused the control operation {message['op']!r}: {response}")

    def call(self, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        response = self._request({"op": op, "args": dict(args)})
        if "ok" in response:
            ok = response["ok"]
            return ok if isinstance(ok, dict) else {"value": ok}
        if "refused" in response:
            refused = response["refused"]
            return {"refused": refused.get("guard") if isinstance(refused, dict) else refused}
        err = response["error"]
        return {"error": err if isinstance(err, dict) else {"type": "error", "message": str(err)}}

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(timeout=5)
