"""The reference model: a pure, deterministic, in-memory store driven by the table.

No I/O. The clock is injected (``clock() -> float`` seconds) and stands for the
database clock. Every move looks the event up in the table, checks the source
state, evaluates the table's named guards in order, and only then changes
anything; a refused move raises :class:`~atmostonce.errors.Rejected` and leaves
the model exactly as it was (h11-style). The state is a column of the intent's
row, moved by the same write as every other column (docs/design.md#the-model).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .audit import (
    INTENT_BOUND_FIELDS,
    AuditChain,
    AuditRow,
    field_texts,
    history_hash,
    model_detail_text,
    reconciliation_step,
)
from .claims import MemoryClaims
from .effects import EFFECTS, Append
from .errors import INTENT_EXISTS, SOURCE_STATE, GuardRefused, IllegalMove, Rejected, UnknownIntent
from .guards import GUARDS
from .identity import DeliveryKey
from .names import EFFECT, EVENT
from .records import (
    HISTORY_DETAIL,
    Attempt,
    Evidence,
    HistoryEntry,
    Intent,
    PolicyChange,
    Reconciliation,
    Refusal,
    SourceCapture,
    Submission,
    check_limit,
    check_text,
)
from .store import Operations, policy_log_row, step_args, superseding_move
from .table import Table
from .table import table as default_table

__all__ = ["MemoryStore", "open_memory_store"]


def _chain_fields(h: HistoryEntry) -> tuple[Any, ...]:
    """A history row's fields in ``atmostonce.audit.HISTORY_FIELDS`` order, detail in the model's text form."""
    return (
        h.seq,
        h.key,
        h.event,
        h.actor,
        h.from_state,
        h.to_state,
        h.attempt_token,
        h.generation,
        model_detail_text(h.detail),
        h.recorded_at,
    )


class MemoryStore(MemoryClaims, Operations):
    """In-memory store implementing the full operation set; thread-safe by one lock.

    ``clock``: the store clock in seconds (default ``time.time``). ``table``: the
    transition table (default: the shipped one).
    """

    def __init__(
        self,
        clock: Callable[[], float] | None = None,
        table: Table | None = None,
        *,
        text_window_seconds: float = 86_400.0,
    ):
        self.table = table or default_table()
        self.core = self  # the model is its own StoreCore: Operations composes every operation over it
        self.default_text_window_seconds = float(text_window_seconds)
        """The duplicate-text window until one is stored (``set_text_window``)."""
        self._clock = clock or time.time
        self._lock = threading.RLock()
        self._disabled_guards: frozenset[str] = frozenset()
        self.reset()

    # -- lifecycle ------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything (the stateful suite's ``@initialize``)."""
        with getattr(self, "_lock", threading.RLock()):
            self._rows: dict[str, dict[str, Any]] = {}
            self._attempts: list[dict[str, Any]] = []
            self._attempt_outcomes: list[tuple[int, str, str]] = []
            self._history: list[HistoryEntry] = []
            self._chain: dict[int, tuple[str | None, str]] = {}  # seq -> (prev_hash, row_hash)
            self._heads: dict[str, str] = {}  # key -> newest row_hash
            self._history_count: dict[str, int] = {}
            self._reconciliations: list[Reconciliation] = []
            self._generation = itertools.count(1)
            self._seq = itertools.count(1)
            # the World a guard may read (see atmostonce.guards.World)
            self.epoch = 1
            self.kill_switches: dict[str, bool] = {}
            self.credentials: dict[str, str] = {}
            self.contracts: dict[str, str] = {}
            self.text_claims: list[dict[str, Any]] = []
            self.settings: dict[str, float] = {}  # store-wide policy values (the text window)
            self._policy_log: list[PolicyChange] = []
            self.rate_limits: dict[str, dict[str, Any]] = {}
            self._refusals: list[Refusal] = []
            self._evidence: list[Evidence] = []
            self.source_heads: dict[str, str] = {}
            self._source_versions: set[str] = set()  # every version captured (only membership is read)
            self._reset_claims()

    def close(self) -> None:
        pass

    def __enter__(self) -> MemoryStore:
        """A context manager as the database stores are (``with open_store(url) as store:``); closing holds nothing."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def text_window_seconds(self) -> float:
        """The duplicate-text window the ``text_window_clear`` guard reads: the stored one, else the default."""
        return self.settings.get("text_window_seconds", self.default_text_window_seconds)

    def now(self) -> float:
        return float(self._clock())

    # -- primitives -----------------------------------------------------------------------
    def _create(self, sub: Submission) -> tuple[Intent, bool]:
        with self._lock:
            for key in (sub.key, *sub.earlier_keys):
                if key in self._rows:
                    return self._intent(self._rows[key]), False
            now = self.now()
            row = {
                "key": sub.key,
                "account": sub.account,
                "action_kind": sub.action_kind,
                "target": sub.target,
                "request": copy.deepcopy(dict(sub.request)),
                "request_digest": sub.request_digest,
                "state": self.table.initial,
                "attempt_count": 0,
                "max_attempts": sub.max_attempts,
                "attempt_token": None,
                "generation": None,
                "lease_expires_at": None,
                "remote_id": None,
                "reconcile_count": 0,
                "max_reconciles": sub.max_reconciles,
                "resend_epoch": 0,
                "fence_epoch": 0,
                "descriptor": None,
                "normalizer_version": sub.normalizer_version,
                "created_at": now,
                "updated_at": now,
                "epoch": None,
                "text_hash": sub.text_hash,
                "source_id": sub.source_id,
                "source_version": sub.source_version,
                "requires_approval": sub.requires_approval,
            }
            self._rows[sub.key] = row
            creator = next(e for e in self.table.events.values() if e.creates)
            self._append_history(self._history_entry(sub.key, creator.name, creator.actor, None, row, {}, now))
            return self._intent(row), True

    def _apply(self, event: str, key: str, args: Mapping[str, Any]) -> Intent:
        ev = self.table.event(event)
        with self._lock:
            row = self._rows.get(key)
            if row is None:
                raise UnknownIntent(event, key, INTENT_EXISTS, None)
            if row["state"] not in ev.sources:
                raise IllegalMove(event, key, SOURCE_STATE, row["state"])
            now = self.now()
            refused = self._refusing_guard(row, args, now, ev.guards)
            if refused is not None:
                raise GuardRefused(event, key, refused, row["state"])
            # compute everything first; commit only when nothing else can fail
            new = copy.deepcopy(row)
            appends: list[Append] = []
            for eff in ev.effects:
                self._run_effect(eff, new, args, now, event, appends)
            new["state"] = ev.target
            new["updated_at"] = now
            coupled = self._coupled(ev, row, new, args, now)  # the claim's (and approval's) moves, checked
            opens = EFFECT.open_attempt in ev.effects
            token, gen = (
                (new["attempt_token"], new["generation"]) if opens else (row["attempt_token"], row["generation"])
            )
            actor = ev.actor if not args.get("operator") else f"operator:{args['operator']}"
            # the row exists under ``key``, so it is a delivery key
            entry = self._history_entry(key, event, actor, row["state"], new, args, now, token, gen)  # type: ignore[arg-type]
            rec = self._reconciliation(key, event, new, args, entry.seq, now)  # type: ignore[arg-type]
            self._rows[key] = new
            for target, item in appends:
                target.append(item)
            self._append_history(entry)
            if rec is not None:
                self._reconciliations.append(rec)
            self._commit_coupled(coupled, now)
            return self._intent(new)

    def _apply_batch(self, event: str, items: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Intent | Rejected]:
        """``event`` for every ``(key, args)`` of ``items`` (distinct keys) under the one lock: each row moved as
        :meth:`_apply` moves it, or refused without changing it or any other row of the batch. Returns, in the
        order of ``items``, the moved intent or the refusal. Anything else raised part way (a crash) puts back
        what the batch moved, as the SQL stores' rolled-back transaction does: nothing of it stays written."""
        out: list[Intent | Rejected] = []
        with self._lock:
            saved = copy.deepcopy({k: v for k, v in vars(self).items() if k not in self._NOT_DATA})
            try:
                for key, args in items:
                    try:
                        out.append(self._apply(event, key, args))
                    except Rejected as exc:
                        out.append(exc)
            except BaseException:
                vars(self).update(saved)
                raise
        return out

    def _refusing_guard(
        self, row: Mapping[str, Any], args: Mapping[str, Any], now: float, guards: tuple[str, ...]
    ) -> str | None:
        """The first of ``guards`` whose predicate refuses (the registry ``atmostonce.guards.GUARDS``)."""
        for g in guards:
            if g not in self._disabled_guards and not GUARDS[g](row, args, now, self):
                return g
        return None

    def _check(self, event: str, key: str, args: Mapping[str, Any], guards: tuple[str, ...]) -> str | None:
        ev = self.table.event(event)
        with self._lock:
            row = self._rows.get(key)
            if row is None:
                raise UnknownIntent(event, key, INTENT_EXISTS, None)
            if row["state"] not in ev.sources:
                return SOURCE_STATE
            return self._refusing_guard(row, args, self.now(), guards)

    def _run_effect(
        self, eff: str, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
    ) -> None:
        """One effect of the move on the copied ``row``, from the effect registry (``atmostonce.effects``)."""
        EFFECTS[eff](self, row, args, now, event, appends)

    _NOT_DATA = frozenset({"_lock", "table", "_clock", "_generation", "_seq", "core"})

    def _apply_sequence(self, key: str, steps: list[tuple[str, Any]]) -> list[Intent]:
        """Several moves as one transaction: on a refusal, everything the earlier moves wrote is put
        back (the generation and sequence counters are not: like a database sequence, a rolled-back
        transaction leaves a gap)."""
        with self._lock:
            saved = copy.deepcopy({k: v for k, v in vars(self).items() if k not in self._NOT_DATA})
            out: list[Intent] = []
            try:
                for event, args in steps:
                    out.append(self._apply(event, key, step_args(args, out[-1] if out else None)))
            except BaseException:
                vars(self).update(saved)
                raise
            return out

    def _reconciliation(
        self,
        key: DeliveryKey,
        event: str,
        row: Mapping[str, Any],
        args: Mapping[str, Any],
        history_seq: int,
        now: float,
    ) -> Reconciliation | None:
        """The reconciliation record this move appends (``atmostonce.audit.reconciliation_step``)."""
        step = reconciliation_step(self.table, event)
        if step is None:
            return None
        kind, result = step
        if kind == "open":
            return Reconciliation(next(self._seq), key, result, row["remote_id"], now, history_seq, event)
        mine = [r for r in self._reconciliations if r.key == key and r.send_seq is not None]
        latest = mine[-1] if mine else None
        if kind == "settle" and (latest is None or latest.result != "unknown"):
            return None  # nothing open: a resolution of work that was never unknown records no reconciliation
        send_seq = None if latest is None else latest.send_seq
        return Reconciliation(next(self._seq), key, result, args.get("remote_id"), now, send_seq, event)

    # -- history --------------------------------------------------------------------------
    def _history_entry(
        self,
        key: DeliveryKey,
        event: str,
        actor: str,
        from_state: str | None,
        row: Mapping[str, Any],
        args: Mapping[str, Any],
        now: float,
        token: str | None = None,
        gen: int | None = None,
    ) -> HistoryEntry:
        detail = copy.deepcopy({k: args[k] for k in HISTORY_DETAIL if args.get(k) not in (None, {}, "")})
        return HistoryEntry(next(self._seq), key, event, actor, from_state, row["state"], token, gen, detail, now)

    def _append_history(self, h: HistoryEntry) -> None:
        """Append a history row and chain it to the intent's newest one (``atmostonce.audit``)."""
        prev = self._heads.get(h.key)
        digest = history_hash(prev, *_chain_fields(h))
        self._history.append(h)
        self._chain[h.seq] = (prev, digest)
        self._heads[h.key] = digest
        self._history_count[h.key] = self._history_count.get(h.key, 0) + 1

    def audit_keys(self) -> list[str]:
        with self._lock:
            return list(self._rows)

    def audit_chain(self, key: str) -> AuditChain:
        """The intent's history rows with their hashes, fields in the model's text forms."""
        with self._lock:
            rows = []
            for h in self._history:
                if h.key != key:
                    continue
                prev, digest = self._chain.get(h.seq, (None, None))
                texts = field_texts(*_chain_fields(h))
                rows.append(AuditRow(h.seq, texts, prev, digest))
            row = self._rows.get(key)
            intent = None if row is None else {f: row[f] for f in INTENT_BOUND_FIELDS}
            return AuditChain(key, tuple(rows), self._history_count.get(key), intent)

    def audit_orphans(self) -> list[str]:
        """Keys with history rows but no intent row (sorted)."""
        with self._lock:
            return sorted({h.key for h in self._history} - set(self._rows))

    @staticmethod
    def _copy_entry(h: HistoryEntry) -> HistoryEntry:
        return dataclasses.replace(h, detail=copy.deepcopy(dict(h.detail)))

    def _record_refusal(self, exc: Rejected, presented: Mapping[str, Any]) -> None:
        with self._lock:
            row = self._rows.get(exc.key)
            if row is None:
                return
            current = {
                "state": row["state"],
                "attempt_token": row["attempt_token"],
                "generation": row["generation"],
                "epoch": self.epoch,
                "reconcile_count": row["reconcile_count"],
            }
            moves = [(h.seq, h.event, h.attempt_token, h.generation) for h in self._history if h.key == exc.key]
            self._refusals.append(
                Refusal(
                    next(self._seq),
                    exc.key,
                    exc.event,
                    exc.guard,
                    copy.deepcopy(dict(presented)),
                    current,
                    superseding_move(self.table, moves, presented),
                    self.now(),
                )
            )

    def _record_evidence(self, args: Mapping[str, Any]) -> Evidence:
        with self._lock:
            known = any(
                a["key"] == args["key"]
                and a["attempt_token"] == args["attempt_token"]
                and a["generation"] == args["generation"]
                for a in self._attempts
            )
            if not known:
                raise UnknownIntent("record_late_outcome", args["key"], "attempt_exists", None)
            ev = Evidence(
                next(self._seq),
                args["key"],
                args["attempt_token"],
                args["generation"],
                args["epoch"],
                args["outcome"],
                args["refused_event"],
                args["refused_by"],
                args["remote_id"],
                args["response_digest"],
                args["reason"],
                args["worker_time"],
                self.now(),
            )
            self._evidence.append(ev)
            return ev

    def evidence(self, key: str) -> list[Evidence]:
        check_text("key", key, max_chars=256)
        with self._lock:
            return [e for e in self._evidence if e.key == key]

    def _store_capture(self, source_id: str, version: str, raw_hash: str | None) -> SourceCapture:
        with self._lock:
            head = self.source_heads.get(source_id)
            if head == version:
                return SourceCapture(source_id, version, False, None, raw_hash)
            new = version not in self._source_versions
            self._source_versions.add(version)
            self.source_heads[source_id] = version
            return SourceCapture(source_id, version, new, head, raw_hash)

    def source_head(self, source_id: str) -> str | None:
        with self._lock:
            return self.source_heads.get(source_id)

    def refusals(self, key: str) -> list[Refusal]:
        with self._lock:
            return [copy.deepcopy(r) for r in self._refusals if r.key == key]

    # -- policy and restores ----------------------------------------------------------------
    def _write_policy(self, kind: str, name: str, value: Any, operator: str | None) -> None:
        with self._lock:
            table: dict[str, Any] = self.settings if kind == "text_window_seconds" else getattr(self, kind)
            key = "text_window_seconds" if kind == "text_window_seconds" else name
            if value is None or value is False:
                table.pop(key, None)
            else:
                table[key] = value
            self._log_policy(kind, name, value, operator)

    def _log_policy(self, kind: str, name: str, value: Any, operator: str | None) -> None:
        log_kind, log_value = policy_log_row(kind, value)
        self._policy_log.append(PolicyChange(next(self._seq), log_kind, name, log_value, operator, self.now()))

    def _write_rate_limit(
        self, account: str, max_sends: int | None, window_seconds: float, operator: str | None
    ) -> None:
        with self._lock:
            if max_sends is None:
                self.rate_limits.pop(account, None)
                self._log_policy("rate_limits", account, None, operator)
                return
            r = self.rate_limits.setdefault(account, {"window_start": None, "used": 0})
            r.update(max_sends=max_sends, window_seconds=window_seconds)
            self._log_policy(
                "rate_limits", account, {"max_sends": max_sends, "window_seconds": window_seconds}, operator
            )

    def policy_changes(self, limit: int = 100) -> list[PolicyChange]:
        """The newest ``limit`` rows of the policy log, newest first."""
        n = check_limit(limit)
        with self._lock:
            return list(reversed(self._policy_log))[:n]

    def rate_limited(self, account: str) -> bool:
        from .guards import rate_limit_clear

        with self._lock:
            return not rate_limit_clear({"account": account}, {}, self.now(), self)

    def policies(self) -> dict[str, Any]:
        """Every policy the gates read, in one snapshot (``Operations.policies`` describes the shape)."""
        with self._lock:
            return {
                "kill_switches": dict(sorted((k, bool(v)) for k, v in self.kill_switches.items())),
                "rate_limits": {
                    a: {k: r.get(k) for k in ("max_sends", "window_seconds", "window_start", "used")}
                    for a, r in sorted(self.rate_limits.items())
                },
                "credentials": dict(sorted(self.credentials.items())),
                "contracts": dict(sorted(self.contracts.items())),
                "signing": dict(sorted((a, bool(v)) for a, v in self.signing_policies.items() if v)),
                "text_window_seconds": self.text_window_seconds,
            }

    def has_account(self, account: str) -> bool:
        """Whether any intent of ``account`` is stored."""
        check_text("account", account)
        with self._lock:
            return any(r["account"] == account for r in self._rows.values())

    def kill_switch_engaged(self, account: str) -> bool:
        from .guards import kill_switch_off

        with self._lock:
            return not kill_switch_off({"account": account}, {}, self.now(), self)

    def current_epoch(self) -> int:
        return self.epoch

    def _bump_epoch(self) -> int:
        with self._lock:
            self.epoch += 1
            return self.epoch

    def _declare_restore(self, who: str) -> tuple[int, int]:
        """The restore protocol under the store's one lock: no other operation sees it half done. The
        model has no sequences to resync (its counters never go back). The epoch is advanced only once
        every move is known to pass its source state; a move refused by a guard leaves that intent as
        it is, as the SQL stores' conditional writes do."""
        ev = self.table.event(EVENT.restore_fence)
        with self._lock:
            keys = [it.key for state in ev.sources for it in self.list_intents(state=state, limit=10**9)]
            self.epoch += 1
            fenced = 0
            args = {"operator": who, "reason": f"restore epoch {self.epoch}"}
            for key in sorted(keys, key=lambda k: (self._rows[k]["created_at"], k)):
                try:
                    self._move(EVENT.restore_fence, key, args)
                    fenced += 1
                except Rejected:
                    pass
            return self.epoch, fenced

    # -- reads ----------------------------------------------------------------------------
    def _intent(self, row: Mapping[str, Any]) -> Intent:
        """A snapshot the caller may change freely: nested values are copied; it carries the store's
        restore epoch at the moment it was read."""
        fields = {k: copy.deepcopy(row[k]) for k in Intent.__dataclass_fields__ if k != "store_epoch"}
        return Intent(**fields, store_epoch=self.epoch)

    def get(self, key: str) -> Intent:
        it = self.find(key)
        if it is None:
            raise UnknownIntent("get", key, INTENT_EXISTS, None)
        return it

    def find(self, key: str) -> Intent | None:
        check_text("key", key, max_chars=256)
        with self._lock:
            row = self._rows.get(key)
            return None if row is None else self._intent(row)

    def list_intents(self, state: str | None = None, limit: int = 1000, *, after: str | None = None) -> list[Intent]:
        check_limit(limit)
        with self._lock:
            rows = [r for r in self._rows.values() if state is None or r["state"] == state]
            rows.sort(key=lambda r: (r["created_at"], r["key"]))
            return [self._intent(r) for r in self._after(rows, after)[:limit]]

    def _after(self, rows: list[dict[str, Any]], after: str | None) -> list[dict[str, Any]]:
        """The rows (sorted by creation time, then key) that come after the intent ``after`` in that order; none
        when no intent has that key (as the SQL stores' comparison with a missing row selects none)."""
        if after is None:
            return rows
        ref = self._rows.get(after)
        if ref is None:
            return []
        mark = (ref["created_at"], after)
        return [r for r in rows if (r["created_at"], r["key"]) > mark]

    def count_by_state(self) -> dict[str, int]:
        with self._lock:
            out = dict.fromkeys(self.table.states, 0)
            for r in self._rows.values():
                out[r["state"]] += 1
            return out

    def history(self, key: str) -> list[HistoryEntry]:
        with self._lock:
            return [self._copy_entry(h) for h in self._history if h.key == key]

    def attempts(self, key: str) -> list[Attempt]:
        with self._lock:
            outs: dict[str, list[str]] = {}
            for _, tok, outcome in self._attempt_outcomes:
                outs.setdefault(tok, []).append(outcome)
            return [
                Attempt(
                    a["attempt_token"],
                    a["key"],
                    a["number"],
                    a["generation"],
                    a["opened_at"],
                    tuple(outs.get(a["attempt_token"], ())),
                    a["resend_epoch"],
                    a["fence_epoch"],
                )
                for a in self._attempts
                if a["key"] == key
            ]

    def reconciliations(self, key: str) -> list[Reconciliation]:
        with self._lock:
            return [r for r in self._reconciliations if r.key == key]

    def due_leases(self, limit: int = 100) -> list[Intent]:
        """Intents whose lease has expired by the store clock, oldest deadline first."""
        with self._lock:
            now = self.now()
            rows = [
                r for r in self._rows.values() if r["lease_expires_at"] is not None and r["lease_expires_at"] <= now
            ]
            rows.sort(key=lambda r: r["lease_expires_at"])
            return [self._intent(r) for r in rows[:limit]]

    def claimable(self, limit: int = 100, *, after: str | None = None) -> list[str]:
        """Keys of intents in the initial state with no open attempt (candidates for ``begin``), oldest first;
        ``after``: only those after that intent (creation time, then key)."""
        check_limit(limit)
        with self._lock:
            rows = [
                r
                for r in self._rows.values()
                if r["state"] == self.table.initial
                and r["attempt_token"] is None
                and (r["source_version"] is None or self.source_heads.get(r["source_id"]) == r["source_version"])
            ]
            rows.sort(key=lambda r: (r["created_at"], r["key"]))
            return [r["key"] for r in self._after(rows, after)[:limit]]

    def total_attempts(self) -> int:
        with self._lock:
            return len(self._attempts)


def open_memory_store(url: str | None = None, **kw: Any) -> MemoryStore:
    """Entry point for ``memory://`` URLs."""
    return MemoryStore(**kw)
