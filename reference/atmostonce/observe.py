"""Observability: structured logs, metrics and spans (docs/operations.md; docs/design.md#the-runtime).

* **Logging** through the standard :mod:`logging` module, logger ``atmostonce.moves``: one record per
  move a store makes (and per refused move), with ``extra`` fields ``key``, ``event``, ``state``,
  ``outcome``, ``attempt``, ``generation`` (and ``guard`` for a refusal). Nothing secret is logged: no
  request body, no payload text, no token (attempt tokens are fencing secrets; the attempt *number* is
  logged instead).
* **Metrics and spans** through the OpenTelemetry API (the optional extra ``atmostonce[otel]``). Without
  ``opentelemetry-api`` installed, or without an SDK configured by the application, every call here is a
  no-op. Instruments (meter ``atmostonce``):

  - ``atmostonce.intents`` (observable gauge, attribute ``state``): intents per state of the table;
  - ``atmostonce.oldest_age_seconds`` (observable gauge, ``state``): age by the store clock of the intent
    that has waited longest in each state a person or the platform's evidence must settle (the table's
    ``unknown`` and ``human_owned`` kinds);
  - ``atmostonce.sends`` (counter, ``outcome``): sends by the outcome the table gives them;
  - ``atmostonce.reconcile.lookups`` (counter, ``outcome``): reconciler looks at the platform, by outcome;
  - ``atmostonce.refusals`` (counter, ``event``, ``guard``): refused moves by the guard that refused;
  - ``atmostonce.moves`` (counter, ``event``): moves made.

  Spans (tracer ``atmostonce``): ``atmostonce.authorize``, ``atmostonce.send``, ``atmostonce.read_back``
  (the dispatcher's) and ``atmostonce.lookup`` (the reconciler's), with the delivery key and outcome.

The gauges are registered by :func:`observe_store` (the worker does it); the counters and spans are
always live. :func:`figures` computes the same figures from the store for ``atmostonce status``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .names import STATE

if TYPE_CHECKING:
    from .table import Table

__all__ = [
    "LOGGER",
    "configure",
    "figures",
    "human_owned_states",
    "log_move",
    "log_refusal",
    "observe_store",
    "record_lookup",
    "record_send",
    "span",
]

LOGGER = logging.getLogger("atmostonce.moves")

try:  # the optional extra: the API alone is a no-op until an application installs an SDK
    from opentelemetry import metrics as _otel_metrics
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover - exercised by installs without [otel]
    _otel_metrics = _otel_trace = None  # type: ignore[assignment]  # the extra is not installed: no-op

_lock = threading.Lock()
_instruments: dict[str, Any] | None = None
_providers: dict[str, Any] = {"meter": None, "tracer": None}


def configure(*, meter_provider: Any = None, tracer_provider: Any = None) -> None:
    """Use these OpenTelemetry providers instead of the global ones (``None``: back to the global ones);
    for an application that keeps its own providers, and for tests with the SDK's in-memory reader."""
    global _instruments
    with _lock:
        _providers["meter"], _providers["tracer"] = meter_provider, tracer_provider
        _instruments = None


def _meter_provider() -> Any:
    return _providers["meter"] or _otel_metrics.get_meter_provider()


def _meter_instruments() -> dict[str, Any] | None:
    """The counters, made once: on the provider :func:`configure` gave, else on the global one. The global
    provider is set at most once (OpenTelemetry refuses a second), and counters made before it was set are
    the API's proxies, which count on it from the moment it is set; so they are never remade, and a move
    pays no lookup of the provider (:func:`configure` starts again)."""
    global _instruments
    made = _instruments
    if made is not None or _otel_metrics is None:
        return made
    provider = _meter_provider()
    with _lock:
        if _instruments is None:
            meter = provider.get_meter("atmostonce")
            _instruments = {
                "sends": meter.create_counter("atmostonce.sends", description="sends by outcome"),
                "lookups": meter.create_counter(
                    "atmostonce.reconcile.lookups", description="reconciler lookups by outcome"
                ),
                "refusals": meter.create_counter("atmostonce.refusals", description="refused moves by guard"),
                "moves": meter.create_counter("atmostonce.moves", description="moves made, by event"),
            }
        return _instruments


def _count(name: str, attributes: Mapping[str, str]) -> None:
    inst = _meter_instruments()
    if inst is not None:
        inst[name].add(1, dict(attributes))


def record_send(outcome: str) -> None:
    """Count one send by the table's outcome name (``send.unknown``, ``read_back.match``, ...)."""
    _count("sends", {"outcome": outcome})


def record_lookup(outcome: str) -> None:
    """Count one reconciler look at the platform by its outcome (``lookup.found``, ...)."""
    _count("lookups", {"outcome": outcome})


_tracer_seen: tuple[Any, Any] = (None, None)


def _tracer(provider: Any) -> Any:
    """The ``atmostonce`` tracer of ``provider``, made once per provider (a provider installed later is
    another object and gets its own; the global proxy's tracer follows the provider set behind it)."""
    global _tracer_seen
    seen, tracer = _tracer_seen
    if provider is not seen:
        tracer = provider.get_tracer("atmostonce")
        _tracer_seen = (provider, tracer)
    return tracer


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[Any]:
    """A span ``atmostonce.<name>`` around a step (no-op without OpenTelemetry); yields the span (or
    ``None``) so the caller can set its ``outcome`` attribute."""
    if _otel_trace is None:
        yield None
        return
    provider = _providers["tracer"] or _otel_trace.get_tracer_provider()
    if isinstance(provider, _otel_trace.ProxyTracerProvider):  # no SDK installed yet: every span is a no-op
        yield None
        return
    tracer = _tracer(provider)
    attrs = {f"atmostonce.{k}": v for k, v in attributes.items() if v is not None}
    with tracer.start_as_current_span(f"atmostonce.{name}", attributes=attrs) as s:
        yield s


def set_outcome(s: Any, outcome: str) -> None:
    if s is not None:
        s.set_attribute("atmostonce.outcome", outcome)


def move_outcome(table: Any, event: str, args: Mapping[str, Any]) -> str | None:
    """The outcome a move records: its ``reason`` when it carries one, else the one outcome of the table
    that maps to ``event`` (``confirm_read_back``: ``read_back.match``), else ``None``."""
    reason = args.get("reason")
    if isinstance(reason, str):
        return reason
    names = [name for name, o in getattr(table, "outcomes", {}).items() if o.event == event]
    return names[0] if len(names) == 1 else None


def log_move(event: str, it: Any, args: Mapping[str, Any], table: Any = None) -> None:
    """One record per move: the intent's key, the event, the state it reached, the outcome the move
    records (:func:`move_outcome`), the attempt number and the generation. Never the request, a token or
    any payload text."""
    _count("moves", {"event": event})
    if not LOGGER.isEnabledFor(logging.INFO):
        return
    outcome = move_outcome(table, event, args)
    LOGGER.info(
        "%s %s -> %s",
        event,
        it.key[:16],
        it.state,
        extra={
            "key": it.key,
            "event": event,
            "state": it.state,
            "outcome": outcome,
            "attempt": it.attempt_count,
            "generation": it.generation,
        },
    )


def log_refusal(exc: Any) -> None:
    """One record per refused move (a typed refusal naming its guard), and the ``atmostonce.refusals`` count."""
    event, guard = getattr(exc, "event", None), getattr(exc, "guard", None)
    _count("refusals", {"event": str(event), "guard": str(guard)})
    if LOGGER.isEnabledFor(logging.INFO):
        LOGGER.info(
            "%s %s refused by %s",
            event,
            (getattr(exc, "key", None) or "")[:16],
            guard,
            extra={
                "key": getattr(exc, "key", None),
                "event": event,
                "state": getattr(exc, "state", None),
                "outcome": f"refused:{guard}",
                "guard": guard,
                "attempt": None,
                "generation": None,
            },
        )


def human_owned_states(table: Table) -> tuple[str, ...]:
    """The states whose intents wait for evidence or a person: the table's ``unknown`` and ``human_owned`` kinds."""
    return (STATE.indeterminate, STATE.parked)


def _oldest(store: Any) -> dict[str, float | None]:
    """Seconds (store clock) the longest-waiting intent has been in each human-owned state (``None``: empty)."""
    oldest_updates = getattr(store, "oldest_updates", None)
    states = human_owned_states(store.table)
    if oldest_updates is not None:
        since = oldest_updates(states)
    else:
        since = {}
        for s in states:
            rows = store.list_intents(state=s, limit=1_000_000)
            since[s] = min((it.updated_at for it in rows), default=None)
    now = store.now()
    return {s: (None if since.get(s) is None else max(0.0, now - since[s])) for s in states}


def figures(store: Any) -> dict[str, Any]:
    """What ``atmostonce status`` prints, from the store alone: intents per state, the age of the oldest
    intent in each human-owned state, and (from the append-only records) sends by outcome, reconcile
    lookups by result (the reconciler's lookups only: not the record a send's unknown outcome opens, nor a
    person's settlement) and recorded refusals by guard."""
    totals = getattr(store, "record_totals", None)
    records = totals() if totals is not None else _memory_totals(store)
    return {
        "states": dict(store.count_by_state()),
        "oldest_age_seconds": _oldest(store),
        **records,
    }


def _memory_totals(store: Any) -> dict[str, dict[str, int]]:
    from .audit import lookup_events

    looked = lookup_events(store.table)
    sends: dict[str, int] = {}
    lookups: dict[str, int] = {}
    refused: dict[str, int] = {}
    for it in store.list_intents(limit=1_000_000):
        for a in store.attempts(it.key):
            for o in a.outcomes:
                sends[o] = sends.get(o, 0) + 1
        for r in store.reconciliations(it.key):
            if r.event in looked:
                lookups[r.result] = lookups.get(r.result, 0) + 1
        for r in store.refusals(it.key):
            refused[r.guard] = refused.get(r.guard, 0) + 1
    return {"sends": _sorted(sends), "reconcile_lookups": _sorted(lookups), "refusals": _sorted(refused)}


def _sorted(d: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(d.items()))


def observe_store(store: Any) -> Any:
    """Register the observable gauges (``atmostonce.intents``, ``atmostonce.oldest_age_seconds``) over
    ``store`` on the current meter provider; returns the gauges (``None`` without OpenTelemetry). A store
    that cannot be read when the SDK collects gives no observation (logged at DEBUG), never an error."""
    if _otel_metrics is None:
        return None
    from opentelemetry.metrics import Observation

    meter = _meter_provider().get_meter("atmostonce")

    def states(_options: Any) -> list[Any]:
        try:
            return [Observation(n, {"state": s}) for s, n in store.count_by_state().items()]
        except Exception as exc:  # the database is down: no figure this round
            LOGGER.debug("atmostonce.intents not observed: %s", exc)
            return []

    def ages(_options: Any) -> list[Any]:
        try:
            return [Observation(a, {"state": s}) for s, a in _oldest(store).items() if a is not None]
        except Exception as exc:
            LOGGER.debug("atmostonce.oldest_age_seconds not observed: %s", exc)
            return []

    return (
        meter.create_observable_gauge("atmostonce.intents", callbacks=[states], description="intents per state"),
        meter.create_observable_gauge(
            "atmostonce.oldest_age_seconds",
            callbacks=[ages],
            unit="s",
            description="age of the longest-waiting intent in each human-owned state",
        ),
    )
