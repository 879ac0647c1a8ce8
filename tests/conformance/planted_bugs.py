"""The planted-bug catalogue: the reference model with one classic bug switched on by name.

Each entry of :data:`BUGS` is a mistake an independent implementation really made (the twelve an
implementation written from the docs slipped past the suite with), planted here in the reference
model and nothing else changed, so every failure the suite reports traces back to that one bug.
``tests/conformance/test_planted_bugs.py`` runs the whole suite against every entry and requires
each to be caught by at least two cases (different case ids) whose failure names the rule; the
score it checks is the table in docs/conformance.md ("The suite's own mutation score").

Use one from the command line with ``ATMOSTONCE_PLANTED_BUG=<name> atmostonce conformance --impl
tests.conformance.planted_bugs:factory``, or from Python with :func:`driver`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from atmostonce import identity
from atmostonce.audit import reconciliation_step
from atmostonce.conformance import Implementation, ManualClock, StoreDriver
from atmostonce.model import MemoryStore
from atmostonce.records import Intent, Submission
from atmostonce.runtime import Dispatcher, Reconciler
from atmostonce.table import table

__all__ = ["BUGS", "Bug", "PlantedStore", "driver", "factory"]


@dataclass(frozen=True)
class Bug:
    """``names``: words one of which every catching failure must show (in the case's rule or in the
    failure message): the guard, record or rule the bug breaks."""

    name: str
    what: str
    names: tuple[str, ...]


BUGS: dict[str, Bug] = {
    b.name: b
    for b in (
        Bug(
            "completion-ignores-generation",
            "completion checks the attempt token but not the generation",
            ("lease_holder",),
        ),
        Bug(
            "credential-checked-only-when-presented",
            "the credential check runs only when a credential is presented",
            ("credential_current",),
        ),
        Bug(
            "text-window-unnormalized",
            "text is not normalized before the duplicate-text window",
            ("text_window_clear", "text key", "text_hash"),
        ),
        Bug(
            "delivery-key-noncanonical",
            "the delivery key is computed over non-canonical JSON (keys in the order given)",
            ("delivery key", "Two rows, not one"),
        ),
        Bug(
            "source-version-raw-bytes",
            "source versions are hashed from the raw body, not the normalized one",
            ("source version", "normalize before you hash", "source_is_head"),
        ),
        Bug(
            "runtime-no-freshness-fence",
            "the runtime has no freshness fence before begin (a stale-source intent is begun, then blocked)",
            ("freshness", "gate.stale_source"),
        ),
        Bug(
            "reconciliation-starts-confirmed",
            "the first reconciliation record starts confirmed instead of unknown",
            ("reconciliation",),
        ),
        Bug(
            "reconciliation-rewritten-in-place",
            "a lookup rewrites the send's reconciliation record in place instead of appending one",
            ("reconciliation",),
        ),
        Bug(
            "generation-per-intent",
            "the fencing generation comes from a per-intent counter instead of one sequence",
            ("generation",),
        ),
        Bug(
            "withdrawn-approval-authorizes",
            "an approval withdrawn or expired after the reservation still authorizes the send",
            ("approval_usable",),
        ),
        Bug(
            "fenced-absence-keeps-claim-uncertain",
            "a fenced absence leaves the target's claim uncertain forever",
            ("uncertain",),
        ),
        Bug(
            "claim-release-ignores-epoch",
            "a claim release compares the owner token but not the epoch",
            ("claim_owner",),
        ),
        Bug(
            "refusal-record-overwritten",
            "a new refusal for the same intent replaces the earlier refusal record instead of appending one",
            ("refus", "append-only"),
        ),
        Bug(
            "approval-dropped-when-it-ends",
            "an approval that was withdrawn, expired or spent is no longer listed under its draft",
            ("approval", "append-only"),
        ),
        Bug(
            "unknown-outcome-releases-text-slot",
            "an unknown outcome (record_unknown, expire_lease) releases the duplicate-text slot",
            ("text_window_clear", "text"),
        ),
        Bug(
            "plan-refusal-not-recorded",
            "a refusal by plan_unchanged is not recorded",
            ("plan_unchanged", "refus"),
        ),
        Bug(
            "rate-window-restarts-at-each-send",
            "the rate window restarts at each send instead of running from its first authorization",
            ("rate_limit_clear", "rate"),
        ),
        Bug(
            "resend-keeps-remote-id",
            "an operator's resend keeps the remote id of the earlier send",
            ("resend", "remote_id"),
        ),
        Bug(
            "unproven-keeps-fence-epoch",
            "reconcile_unproven does not raise fence_epoch",
            ("fence_epoch", "bump_fence_epoch"),
        ),
        Bug(
            "claimable-offers-stale-sources",
            "claimable offers intents whose source is no longer the head",
            ("source_is_head", "claimable", "stale"),
        ),
        Bug(
            "due-leases-strict",
            "due_leases lists a lease only after its deadline (< instead of <=)",
            ("lease_expired", "deadline", "due_leases"),
        ),
        Bug(
            "operator-actor-unprefixed",
            "a person's history entries name the actor without the operator: prefix",
            ("operator:",),
        ),
        Bug(
            "reconciler-ignores-late-remote-id",
            "the reconciler ignores a remote id kept as late-outcome evidence",
            ("late remote id", "late evidence", "no_remote_object"),
        ),
    )
}

_T = table()
COMPLETIONS = frozenset(e.name for e in _T.events.values() if "lease_holder" in e.guards and e.actor == "worker") - {
    "authorize_dispatch"
}
"""The worker's completion moves: every lease-holder move after the authorization."""


def _noncanonical_key(account: str, action_kind: str, target: str, request: Any) -> str:
    """The delivery key over ``json.dumps`` in the order given (what bug 4 does)."""
    parts = ["atmostonce/delivery-key", 1, account, action_kind, target, identity.normalize_projection(request)]
    return identity.digest_bytes(json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


class PlantedStore(MemoryStore):
    """The reference model with the bug ``bug`` (a name of :data:`BUGS`, or ``None`` for none)."""

    def __init__(self, bug: str | None, clock: Callable[[], float] | None = None):
        if bug is not None and bug not in BUGS:
            raise ValueError(f"unknown planted bug {bug!r}; known: {', '.join(BUGS)}")
        self.bug = bug
        self._request_as_given: Mapping[str, Any] | None = None
        super().__init__(clock=clock)

    # -- intake ------------------------------------------------------------------------------
    def submit(self, account, action_kind, target, request, **kw):
        self._request_as_given = request  # the request as given (bug 4 hashes it in that order)
        try:
            return super().submit(account, action_kind, target, request, **kw)
        finally:
            self._request_as_given = None

    def _create(self, sub: Submission) -> tuple[Intent, bool]:
        if self.bug == "delivery-key-noncanonical" and isinstance(self._request_as_given, Mapping):
            sub = dataclasses.replace(
                sub, key=_noncanonical_key(sub.account, sub.action_kind, sub.target, dict(self._request_as_given))
            )
        if self.bug == "text-window-unnormalized" and sub.text_hash is not None:
            raw = sub.request["text"]
            sub = dataclasses.replace(sub, text_hash=identity._identity("atmostonce/text", 1, raw))
        return super()._create(sub)

    def capture_source(self, source_id, body, *, raw=None):
        if self.bug != "source-version-raw-bytes" or not isinstance(body, str) or not isinstance(source_id, str):
            return super().capture_source(source_id, body, raw=raw)
        version = identity._identity("atmostonce/source-version", 1, source_id, body)
        return self._store_capture(source_id, version, None)

    # -- moves -------------------------------------------------------------------------------
    def _apply(self, event: str, key: str, args: Mapping[str, Any]) -> Intent:
        with self._lock:
            row = self._rows.get(key)
            disabled: set[str] = set()
            if row is not None and self.bug == "completion-ignores-generation" and event in COMPLETIONS:
                if row["attempt_token"] is not None and args.get("attempt_token") == row["attempt_token"]:
                    args = dict(args) | {"generation": row["generation"]}
            if (
                self.bug == "credential-checked-only-when-presented"
                and event == "authorize_dispatch"
                and args.get("credential_version") is None
            ):
                disabled.add("credential_current")
            saved = self._disabled_guards
            self._disabled_guards = saved | disabled
            try:
                return super()._apply(event, key, args)
            finally:
                self._disabled_guards = saved

    def _reconciliation(self, key, event, row, args, history_seq, now):
        rec = super()._reconciliation(key, event, row, args, history_seq, now)
        if rec is None:
            return None
        kind = reconciliation_step(self.table, event)[0]  # type: ignore[index]
        if self.bug == "reconciliation-starts-confirmed" and kind == "open":
            return dataclasses.replace(rec, result="confirmed")
        if self.bug == "reconciliation-rewritten-in-place" and kind != "open":
            mine = [r for r in self._reconciliations if r.key == key and r.send_seq == rec.send_seq]
            if mine:
                self._reconciliations.remove(mine[-1])
                return dataclasses.replace(rec, seq=mine[-1].seq)
        return rec

    def _coupled(self, ev, intent_before, intent_after, args, now):
        if self.bug == "fenced-absence-keeps-claim-uncertain" and ev.name == "reconcile_absent":
            return []
        if (
            self.bug == "withdrawn-approval-authorizes"
            and ev.name == "authorize_dispatch"
            and intent_before.get("requires_approval")
        ):
            claim = self._claims.get(intent_before["target"])
            aid = claim["approval_id"] if claim else None
            real = self._approvals.get(aid) if aid else None
            if real is not None:  # checked at the reservation only: at dispatch it is taken as still approved
                self._approvals[aid] = dict(
                    real, state=self.approval_table.initial, expires_at=max(real["expires_at"], now + 1)
                )
                try:
                    moves = super()._coupled(ev, intent_before, intent_after, args, now)
                finally:
                    self._approvals[aid] = real
                for mname, _subject, _event, _old, new, _inputs in moves:
                    if mname == "approval":
                        new["expires_at"] = real["expires_at"]
                return moves
        return super()._coupled(ev, intent_before, intent_after, args, now)

    def _run_effect(self, eff, row, args, now, event, appends):
        if eff == "open_attempt" and self.bug == "generation-per-intent":
            self._generation = itertools.count(row["attempt_count"] + 1)
        if eff == "take_rate_slot" and self.bug == "rate-window-restarts-at-each-send":
            limits, account = self.rate_limits, row["account"]

            class _Restart:  # the window starts again at every send
                def append(self, _item: Any) -> None:
                    r = limits.get(account)
                    if r is None:
                        return
                    fresh = r["window_start"] is None or r["window_start"] + r["window_seconds"] <= now
                    r["window_start"], r["used"] = now, 1 if fresh else r["used"] + 1

            appends.append((_Restart(), None))
            return
        if eff == "bump_fence_epoch" and self.bug == "unproven-keeps-fence-epoch" and event == "reconcile_unproven":
            return
        kept = row["remote_id"]
        super()._run_effect(eff, row, args, now, event, appends)
        if (
            eff == "close_attempt"
            and self.bug == "unknown-outcome-releases-text-slot"
            and event in ("record_unknown", "expire_lease")
        ):
            super()._run_effect("release_text_slot", row, args, now, event, appends)
        if eff == "bump_resend_epoch" and self.bug == "resend-keeps-remote-id":
            row["remote_id"] = kept

    def _history_entry(self, key, event, actor, *rest, **kw):
        if self.bug == "operator-actor-unprefixed" and actor.startswith("operator:"):
            actor = actor.removeprefix("operator:")
        return super()._history_entry(key, event, actor, *rest, **kw)

    def _record_refusal(self, exc, presented):
        if self.bug == "plan-refusal-not-recorded" and getattr(exc, "guard", None) == "plan_unchanged":
            return
        super()._record_refusal(exc, presented)

    # -- reads -------------------------------------------------------------------------------
    def due_leases(self, limit=100):
        out = super().due_leases(limit)
        if self.bug == "due-leases-strict":
            now = self.now()
            out = [i for i in out if i.lease_expires_at is not None and i.lease_expires_at < now]
        return out

    def claimable(self, limit=100, *, after=None):
        if self.bug != "claimable-offers-stale-sources":
            return super().claimable(limit, after=after)
        with self._lock:
            rows = [r for r in self._rows.values() if r["state"] == self.table.initial and r["attempt_token"] is None]
            rows.sort(key=lambda r: (r["created_at"], r["key"]))
            return [r["key"] for r in self._after(rows, after)[:limit]]

    # -- records -----------------------------------------------------------------------------
    def refusals(self, key):
        out = super().refusals(key)
        return out[-1:] if self.bug == "refusal-record-overwritten" else out

    def approvals(self, key):
        out = super().approvals(key)
        if self.bug == "approval-dropped-when-it-ends":
            return [a for a in out if a.state == self.approval_table.initial]
        return out

    def _claim_move(self, event, target, args):
        if self.bug == "claim-release-ignores-epoch" and event == "release":
            with self._lock:
                row = self._claims.get(target)
                if row is not None and row["owner_token"] is not None and args.get("claim_token") == row["owner_token"]:
                    args = dict(args) | {"claim_epoch": row["epoch"]}
                return super()._claim_move(event, target, args)
        return super()._claim_move(event, target, args)


class _NoFreshnessFence(Dispatcher):
    """Bug 6: the runtime begins an intent without looking at its source's head first."""

    def _before_begin(self, intent: Intent) -> str | None:
        stop = super()._before_begin(intent)
        return None if stop == "gate.stale_source" else stop


class _HideEvidence:
    """The store as the reconciler of the late-remote-id bug sees it: without its late outcomes."""

    evidence = None

    def __init__(self, store: Any):
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class _IgnoresLateRemoteId(Reconciler):
    """The reconciler reads no late evidence, so an unknown send's late remote id is never read back."""

    def __init__(self, store: Any, *args: Any, **kw: Any):
        super().__init__(_HideEvidence(store), *args, **kw)  # type: ignore[arg-type]


class PlantedDriver(StoreDriver):
    """A :class:`StoreDriver` over :class:`PlantedStore`; the runtime bug swaps the dispatcher."""

    def __init__(self, bug: str | None):
        def make() -> Implementation:
            clock = ManualClock()
            return Implementation(PlantedStore(bug, clock=clock), clock.advance)

        super().__init__(make, name=f"planted bug: {bug}" if bug else "planted bugs: none")
        self.bug = bug

    def reset(self) -> None:
        super().reset()
        if self.bug == "runtime-no-freshness-fence":
            assert self._runtime is not None
            self._runtime.dispatcher_cls = _NoFreshnessFence
        if self.bug == "reconciler-ignores-late-remote-id":
            assert self._runtime is not None
            self._runtime.reconciler_cls = _IgnoresLateRemoteId


def driver(bug: str | None) -> PlantedDriver:
    """A driver running the suite against the model with ``bug`` planted (``None``: the clean model)."""
    return PlantedDriver(bug)


def factory() -> Implementation:
    """``--impl tests.conformance.planted_bugs:factory`` with ``ATMOSTONCE_PLANTED_BUG=<name>`` (store bugs only:
    the runtime bug needs :func:`driver`)."""
    clock = ManualClock()
    return Implementation(PlantedStore(os.environ.get("ATMOSTONCE_PLANTED_BUG") or None, clock=clock), clock.advance)


# ------------------------------------------------------------------------------ the score
SCORE_BEGIN, SCORE_END = "<!-- planted-bug-score:begin -->", "<!-- planted-bug-score:end -->"


def catches(cases: Any) -> dict[str, list[Any]]:
    """Each bug of :data:`BUGS` -> the failed (or errored) case results of the suite run against it."""
    from atmostonce.conformance import run_suite

    out: dict[str, list[Any]] = {}
    for name in BUGS:
        d = driver(name)
        try:
            out[name] = run_suite(d, cases).failed
        finally:
            d.close()
    return out


def score_markdown(caught: Mapping[str, list[Any]], n_cases: int) -> str:
    """The score block of docs/conformance.md (between :data:`SCORE_BEGIN` and :data:`SCORE_END`)."""
    hit = [b for b in BUGS if len(caught[b]) >= 2]
    least = min(len(caught[b]) for b in BUGS)
    lines = [
        SCORE_BEGIN,
        f"**{len([b for b in BUGS if caught[b]])} of {len(BUGS)} planted bugs caught, {len(hit)} of them by at least "
        f"two cases; the fewest catches of any bug: {least}** ({n_cases} cases).",
        "",
        "| planted bug | what it does | caught by |",
        "|---|---|---|",
    ]
    for name, bug in BUGS.items():
        ids = ", ".join(f"`{r.case.id}`" for r in caught[name])
        lines.append(f"| `{name}` | {bug.what} | {len(caught[name])}: {ids} |")
    lines.append(SCORE_END)
    return "\n".join(lines)


def _write_docs() -> None:  # python -m tests.conformance.planted_bugs
    from pathlib import Path

    from atmostonce.conformance import load_cases

    cases = load_cases()
    docs = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
    text = docs.read_text("utf-8")
    start, end = text.index(SCORE_BEGIN), text.index(SCORE_END) + len(SCORE_END)
    docs.write_text(text[:start] + score_markdown(catches(cases), len(cases)) + text[end:], "utf-8")


if __name__ == "__main__":
    _write_docs()
