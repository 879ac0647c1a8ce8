"""``atmostonce``: the demo, operator commands, migrations and table checks.

Exit codes: 0 success; 1 a refused move (the table or a guard said no) or a
demo that found duplicates; 2 bad usage or input; 3 a store or platform error,
or a ``work`` pass that ended with a send whose outcome is unknown.
``--json`` prints machine-readable output on stdout; errors go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from atmostonce.errors import (
    AtMostOnceError,
    FoundOnPlatform,
    GuardRefused,
    IllegalMove,
    IntakeError,
    NotVerified,
    ObjectOnRecord,
    Rejected,
    RetractionUnsupported,
    SchemaNewer,
    SequenceBehind,
    StoreError,
)
from atmostonce.names import ACTOR, EFFECT, EVENT, GUARD, STATE
from atmostonce.plugins import DEFAULT_URL, scheme_of
from atmostonce.plugins import open_store as open_store_url
from atmostonce.protocols import OperatorStore, Store
from atmostonce.records import Intent, Plan, Refusal, check_text

from .urls import display_url, resolve_url

__all__ = ["main"]

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_STORE = 0, 1, 2, 3


def _ts(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _table(rows: list[dict[str, Any]], cols: Sequence[str]) -> str:
    if not rows:
        return "(none)"
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    head = "  ".join(c.upper().ljust(widths[c]) for c in cols)
    body = ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join([head, *body])


def _intent_dict(it: Intent) -> dict[str, Any]:
    d = {k: getattr(it, k) for k in Intent.__dataclass_fields__}
    d["request"] = dict(it.request)
    d["descriptor"] = dict(it.descriptor) if it.descriptor else None
    return d


def _emit(args, data: Any, text: str) -> None:
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(text)


def _url(args) -> str:
    """``--database-url``, else ``$ATMOSTONCE_DATABASE_URL``, else the default SQLite file (every command)."""
    return resolve_url(args.database_url)


def _store(args, *, create: bool = False, **kw: Any) -> Store:
    """Open the command's store. Only commands that write configuration (``db upgrade``, ``policy`` setters,
    ``operator-key add``) pass ``create=True``: any other command on a SQLite path that does not exist is
    refused (``StoreError``, exit 3) instead of leaving an empty database behind a typo."""
    url = _url(args)
    if scheme_of(url) in ("sqlite", "postgresql"):
        kw["create"] = create
    new_file = _new_sqlite_file(url) if create else None
    store = open_store_url(url, **kw)
    if new_file is not None:  # a policy set on a mistyped path would stop nothing a worker reads: say so
        print(f"note: created a new, empty database at {new_file}", file=sys.stderr)
    opened = getattr(args, "opened_stores", None)
    if opened is not None:  # closed by main() when the command returns
        opened.append(store)
    return store


def _new_sqlite_file(url: str) -> str | None:
    """The path of the SQLite file ``url`` names when that file does not exist yet, else ``None``."""
    if scheme_of(url) != "sqlite":
        return None
    import sqlalchemy as sa

    try:
        path = sa.engine.make_url(url).database
    except sa.exc.ArgumentError:
        return None
    if not path or path == ":memory:" or os.path.exists(path):
        return None
    return os.path.abspath(path)


def _resolve_key(store: OperatorStore, key: str) -> str:
    """Accept a full delivery key or a unique prefix of at least 8 characters (case-insensitive)."""
    key = key.strip().lower()
    if store.find(key) is not None:
        return key
    if len(key) < 8:
        raise IntakeError(f"no intent has the key {key!r}; give the full key or a prefix of at least 8 characters")
    matches = [it.key for it in store.list_intents(limit=1_000_000) if it.key.startswith(key)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise IntakeError(f"key prefix {key!r} matches {len(matches)} intents; give more characters")
    raise IntakeError(f"no intent has a key starting with {key!r}")


# ---------------------------------------------------------------- commands
def _platform_demo(args, run, fmt, errors, why, suffix=lambda exc: "") -> int:
    """The demo against a real platform: the same arguments, a platform that cannot start is a platform
    error (exit 3), a duplicate or an unfinished run exits 1."""
    try:
        result = run(
            n=args.intents,
            workers=args.workers,
            database_url=args.database_url,
            seed=args.seed,
            crash_rate=args.crash_rate,
            timeout=args.timeout,
            progress=None if args.json else sys.stderr,
        )
    except errors as exc:
        msg = f"platform error: {why(exc)}{exc}{suffix(exc)}"
        return _fail(args, msg, {"platform_error": str(exc)}, EXIT_STORE)
    _emit(args, result.as_dict(), fmt(result))
    return EXIT_OK if result.ok and result.finished else EXIT_REFUSED


def cmd_demo(args) -> int:
    from .demo import format_result, run_demo

    if not 0.0 <= args.crash_rate <= 1.0:
        raise IntakeError("--crash-rate is a probability between 0 and 1")
    if args.timeout <= 0:
        raise IntakeError("--timeout must be a positive number of seconds")
    if args.platform == "matrix":
        from atmostonce_matrix.demo import format_matrix_result, run_matrix_demo
        from atmostonce_matrix.synapse import SynapseError

        return _platform_demo(args, run_matrix_demo, format_matrix_result, (SynapseError,), lambda exc: "")
    if args.platform == "email":
        from atmostonce_email.demo import format_email_result, run_email_demo
        from atmostonce_email.servers import MailServersUnavailable

        def email_why(exc: BaseException) -> str:  # not root, or postfix / dovecot not installed
            if isinstance(exc, MailServersUnavailable):
                return "the email demo cannot start Postfix and Dovecot here: "
            return ""  # a server did not start or answer

        errors: tuple[type[BaseException], ...] = (MailServersUnavailable, RuntimeError, OSError)
        return _platform_demo(args, run_email_demo, format_email_result, errors, email_why)
    if args.platform == "json-server":
        import subprocess

        from atmostonce_http.jsonserver import INSTALL_HINT

        from .demo_rest import format_rest_result, run_rest_demo

        errors = (RuntimeError, OSError, subprocess.SubprocessError)  # node/npm missing, install or start failed
        return _platform_demo(
            args,
            run_rest_demo,
            format_rest_result,
            errors,
            lambda exc: "",
            suffix=lambda exc: "" if INSTALL_HINT in str(exc) else f" ({INSTALL_HINT})",
        )
    result = run_demo(
        n=args.intents,
        workers=args.workers,
        database_url=args.database_url,
        seed=args.seed,
        crash_rate=args.crash_rate,
        timeout=args.timeout,
        progress=None if args.json else sys.stderr,
    )
    _emit(args, result.as_dict(), format_result(result))
    return EXIT_OK if result.ok and result.finished else EXIT_REFUSED


def cmd_intents_list(args) -> int:
    store = _store(args)
    if args.state is not None and args.state not in store.table.states:
        raise IntakeError(f"unknown state {args.state!r}; states: {', '.join(store.table.states)}")
    items = store.list_intents(state=args.state, limit=args.limit + 1)  # one more: was the list cut?
    truncated = len(items) > args.limit
    items = items[: args.limit]
    rows = [
        {
            "key": it.key[:16],
            "state": it.state,
            "account": it.account,
            "kind": it.action_kind,
            "target": it.target,
            "attempts": f"{it.attempt_count}/{it.max_attempts}",
            "remote_id": it.remote_id or "-",
            "updated": _ts(it.updated_at),
        }
        for it in items
    ]
    _emit(
        args,
        {"intents": [_intent_dict(it) for it in items], "limit": args.limit, "truncated": truncated},
        _table(rows, ["key", "state", "account", "kind", "target", "attempts", "remote_id", "updated"]),
    )
    if truncated and not args.json:
        print(f"(the first {args.limit} shown; more match: raise --limit)", file=sys.stderr)
    return EXIT_OK


def cmd_intents_show(args) -> int:
    from atmostonce.identity import platform_idempotency_key
    from atmostonce.runtime import wire_request

    store = _store(args)
    key = _resolve_key(store, args.key)
    it = store.get(key)
    hist = store.history(key)
    atts = store.attempts(key)
    recs = store.reconciliations(key)
    late = store.evidence(key)
    idem = platform_idempotency_key(it.key, it.resend_epoch, it.fence_epoch)
    sent_under = list(dict.fromkeys(a.idempotency_key for a in atts if a.idempotency_key is not None))
    body = dict(wire_request(it).body)
    data: dict[str, Any] = {
        "intent": _intent_dict(it),
        "idempotency_key": idem,
        "sent_under": sent_under,
        "request_body": body,
        "history": [h.__dict__ | {"detail": dict(h.detail)} for h in hist],
        "attempts": [a.__dict__ for a in atts],
        "reconciliations": [r.__dict__ for r in recs],
        "late_outcomes": [e.__dict__ for e in late],
    }
    rows = [
        {
            "seq": h.seq,
            "event": h.event,
            "actor": h.actor,
            "from": h.from_state or "-",
            "to": h.to_state,
            "generation": h.generation if h.generation is not None else "-",
            "wall_time": _ts(h.recorded_at),
            "detail": ", ".join(f"{k}={v}" for k, v in h.detail.items() if k != "descriptor"),
        }
        for h in hist
    ]
    gate = []
    if it.requires_approval:
        apvs = store.approvals(key)
        claim = store.claim(it.target)
        data["approvals"] = [a.__dict__ for a in apvs]
        data["claim"] = None if claim is None else claim.__dict__ | {"owner_token": None}
        bound = claim is not None and claim.key == key
        gate = [
            f"  approval required: {len(apvs)} approval(s) "
            + (", ".join(f"{a.approval_id} {a.state} by {a.approver}" for a in apvs) or "(none yet)"),
            f"  target claim: {claim.state if claim else 'none'}" + (" (bound to this intent)" if bound else ""),
        ]
    # "sent under" only once an attempt was opened: an intent with none has sent nothing, under no key
    if not atts and it.remote_id is not None:  # found on the platform after a restore fenced it
        sent_line = f"  no attempt recorded in this store; the platform holds it as {it.remote_id}"
    elif not atts and any(h.event == EVENT.restore_fence for h in hist):
        sent_line = (
            "  no attempt recorded in this store, which was restored from a backup: it may have been sent after the "
            "backup (reconciliation looks on the platform)"
        )
    elif not atts:
        sent_line = "  not sent yet: no attempt has been opened"
    elif not sent_under:  # attempts begun before migration 0005 did not record their epochs
        sent_line = f"  sent under (not recorded for its {len(atts)} attempt(s))"
    else:
        sent_line = f"  sent under {', '.join(sent_under)}"
    text = "\n".join(
        [
            f"intent {it.key}",
            f"  state {it.state}  account {it.account}  kind {it.action_kind}  target {it.target}",
            *gate,
            f"  attempts {it.attempt_count}/{it.max_attempts}  reconciles {it.reconcile_count}/{it.max_reconciles}"
            f"  resend epoch {it.resend_epoch}  fence epoch {it.fence_epoch}  remote id {it.remote_id or '-'}",
            f"  idempotency key (the next send's) {idem}",
            sent_line,
            f"  request body {json.dumps(body, sort_keys=True, ensure_ascii=False)}",
            "history (ordered by store sequence; wall time is context only):",
            _table(rows, ["seq", "event", "actor", "from", "to", "generation", "wall_time", "detail"]),
            "reconciliation of unknown sends (send = the history seq that made the outcome unknown):",
            _table(
                [
                    {
                        "seq": r.seq,
                        "send": r.send_seq if r.send_seq is not None else "-",
                        "event": r.event or "-",
                        "result": r.result,
                        "remote_id": r.remote_id or "-",
                        "wall_time": _ts(r.recorded_at),
                    }
                    for r in recs
                ],
                ["seq", "send", "event", "result", "remote_id", "wall_time"],
            ),
            "late outcomes (refused moves kept as evidence; they moved nothing):",
            _table(
                [
                    {
                        "seq": e.seq,
                        "generation": e.generation,
                        "outcome": e.outcome,
                        "refused": f"{e.refused_event}:{e.refused_by}",
                        "remote_id": e.remote_id or "-",
                        "worker_time": _ts(e.worker_time),
                        "db_time": _ts(e.recorded_at),
                    }
                    for e in late
                ],
                ["seq", "generation", "outcome", "refused", "remote_id", "worker_time", "db_time"],
            ),
        ]
    )
    _emit(args, data, text)
    return EXIT_OK


def _profile_error(exc: BaseException) -> Any:
    """The :class:`atmostonce_http.profile.ProfileError` behind ``exc`` (itself or what it was raised from), or
    ``None``."""
    from atmostonce_http.profile import ProfileError

    for e in (exc, exc.__cause__):
        if isinstance(e, ProfileError):
            return e
    return None


def _profile(args):
    """The platform profile of ``--platform-config FILE``: a profile (TOML, spec/platforms/ has examples) or a
    JSON object of HttpPlatformConfig fields. Only an HTTP profile can drive these commands."""
    from atmostonce_http.profile import load_platform_file

    if not args.platform_config:
        raise IntakeError(
            "this command needs --platform-config FILE (a platform profile in TOML, or JSON for HttpPlatformConfig)"
        )
    try:
        profile = load_platform_file(args.platform_config)
    except ValueError as exc:  # unreadable, not TOML/JSON, wrong fields or types: bad input, exit 2
        raise IntakeError(f"--platform-config {exc}") from exc  # the message starts with the file name
    if profile.config is None:
        raise IntakeError(
            f"--platform-config {args.platform_config}: a {profile.transport} profile; "
            "work and reconcile drive an HTTP platform ([http] table)"
        )
    return profile


def _platform(args):
    return _profile(args).http_transport()


def _all_intents(store: Store, states: Sequence[str], page: int = 1000) -> list[Intent]:
    """Every intent in ``states``, read in pages of ``page`` (creation order)."""
    found: list[Intent] = []
    for state in states:
        after: str | None = None
        while batch := store.list_intents(state=state, limit=page, after=after):
            found += batch
            after = batch[-1].key
    return found


def cmd_work(args) -> int:
    from atmostonce.names import OUTCOME
    from atmostonce.runtime import Dispatcher, Reconciler, Sweeper

    profile = _profile(args)
    store, transport, runtime = _store(args), profile.http_transport(), profile.runtime_config()
    counts: dict[str, Any] = {}
    unknown = (STATE.indeterminate,)
    left_unknown: dict[str, str] = {}  # key -> the outcome of its send that left it unknown
    cannot_retract: list[str] = []  # retractions this transport cannot carry: they would wait for ever
    try:
        d = Dispatcher(store, transport, runtime)
        Sweeper(store, runtime).tick()
        for key in store.claimable(args.limit):
            try:
                name = d.dispatch(key)
            except Rejected as exc:
                name = f"refused:{exc.event}:{exc.guard}"
            counts[name] = counts.get(name, 0) + 1
            if name == OUTCOME.retract_unsupported:
                cannot_retract.append(key)
            outcome = store.table.outcomes.get(name)
            if outcome is not None and outcome.state in unknown:
                left_unknown[key] = name
        # every send still unknown before reconciliation runs: the ones it settles drop out below, and one it parks
        # (its lookups spent, or evidence that needs a person) is named with the ones left unknown
        unknown_before = [it.key for it in _all_intents(store, unknown) if it.key not in left_unknown]
        for name, n in Reconciler(store, transport, runtime).run().items():
            counts[f"reconcile:{name}"] = counts.get(f"reconcile:{name}", 0) + n
    finally:
        transport.close()
    # a send whose outcome is still unknown after this pass's reconciliation needs looking at: name it, exit 3.
    # First this pass's own sends (with the outcome that left them unknown), then every other send that was
    # unknown when reconciliation began: sent before this pass, by an earlier run or a worker whose send lease
    # the sweep found lapsed (outcome None: this pass sent nothing for it), still unknown or now parked for a person
    settled = (STATE.published, STATE.failed, STATE.pending)
    unsettled: list[dict[str, Any]] = [
        {"key": key, "outcome": name, "state": st}
        for key, name in left_unknown.items()
        if (st := store.get(key).state) not in settled
    ]
    unsettled += [
        {"key": key, "outcome": None, "state": st}
        for key in unknown_before
        if (st := store.get(key).state) not in settled
    ]
    text = "  ".join(f"{k} {v}" for k, v in counts.items()) or "nothing to do"
    if unsettled:
        counts["unsettled"] = unsettled
        text += "".join(
            f"\n{u['key']}  {u['outcome'] or 'sent before this pass, outcome still unknown'}: now {u['state']} "
            f"(not resent; see atmostonce intents show {u['key'][:16]})"
            for u in unsettled
        )
    if cannot_retract:
        counts["cannot_retract"] = [{"key": k, "outcome": OUTCOME.retract_unsupported} for k in cannot_retract]
        text += "".join(
            f"\n{k}  {OUTCOME.retract_unsupported}: this platform config cannot delete or update; it stays queued "
            f"(atmostonce park {k[:16]} --operator NAME to stop it)"
            for k in cannot_retract
        )
    _emit(args, counts, text)
    return EXIT_STORE if unsettled else EXIT_OK


def cmd_sweep(args) -> int:
    from atmostonce.runtime import Sweeper

    counts = Sweeper(_store(args)).sweep_leases()
    _emit(args, counts, "  ".join(f"{k} {v}" for k, v in counts.items()))
    return EXIT_OK


def cmd_reconcile(args) -> int:
    from atmostonce.runtime import Reconciler

    profile = _profile(args)
    store, transport = _store(args), profile.http_transport()
    try:
        unknown_before = [it.key for it in _all_intents(store, (STATE.indeterminate,))]
        reconciler = Reconciler(store, transport, profile.runtime_config())
        counts: dict[str, Any] = dict(reconciler.run(limit=args.limit))
    finally:
        transport.close()
    # a send this pass parked (its lookups spent, or evidence that needs a person) is named, and the pass exits 3
    # as `work` does, so that a scheduled reconcile does not leave it unnoticed; so is one whose lookup failed
    # (the platform gave no usable answer: nothing was learnt, its lookup budget is untouched)
    parked = [key for key in unknown_before if store.get(key).state == STATE.parked]
    failed = [
        {"key": key, "state": store.get(key).state, "error": said}
        for key, (_, _, said) in reconciler.lookup_errors.items()
    ]
    text = "  ".join(f"{k} {v}" for k, v in counts.items()) or "nothing to reconcile"
    if parked:
        counts["parked"] = [{"key": key, "state": STATE.parked} for key in parked]
        text += "".join(
            f"\n{key}  outcome still unknown: now parked (not resent; see atmostonce intents show {key[:16]})"
            for key in parked
        )
    if failed:
        counts["lookup_failed"] = failed
        text += "".join(
            f"\n{f['key']}  the lookup failed, outcome still unknown: {f['error']} (nothing written; run "
            "reconcile again once the platform answers)"
            for f in failed
        )
    _emit(args, counts, text)
    return EXIT_STORE if parked or failed else EXIT_OK


def _moved(args, it: Intent) -> int:
    _emit(args, _intent_dict(it), f"{it.key[:16]}  now {it.state}")
    return EXIT_OK


def cmd_park(args) -> int:
    store = _store(args)
    return _moved(args, store.park(_resolve_key(store, args.key), operator=args.operator, reason=args.reason))


def cmd_retry(args) -> int:
    store = _store(args)
    return _moved(args, store.retry(_resolve_key(store, args.key), operator=_operator(args)))


def cmd_resend(args) -> int:
    store = _store(args)
    key = _resolve_key(store, args.key)
    plan, looked = _look_before_sending_again(args, store, key, EVENT.resend)
    return _moved_after_looking(args, store.resend(key, operator=args.operator, plan=plan), looked)


def _look_before_sending_again(args, store: OperatorStore, key: str, event: str) -> tuple[Plan, dict[str, Any]]:
    """What the store and the platform's lookup by key said before a person sends ``key`` again (``resend``,
    ``resolve --not-sent``): the plan of the read they were about, for the move to present, and what was looked
    up (:func:`atmostonce.runtime.check_before_sending_again`, through the ``--platform-config`` transport when
    given). ``ObjectOnRecord`` and ``FoundOnPlatform`` exit 1 with nothing written."""
    from atmostonce.runtime import check_before_sending_again

    if not args.platform_config:
        plan, _ = check_before_sending_again(store, None, key, event, args.despite_object)
        return plan, {"looked_up": [], "why": "no --platform-config to look it up"}
    transport = _platform(args)
    try:
        plan, looked = check_before_sending_again(store, transport, key, event, args.despite_object)
    finally:
        transport.close()
    assert looked is not None  # a transport was given
    return plan, looked


def _moved_after_looking(args, it: Intent, looked: dict[str, Any]) -> int:
    if looked["why"] is None:
        note = f"looked up on the platform first, nothing found under {', '.join(looked['looked_up'])}"
    else:
        note = f"NOT looked up on the platform first: {looked['why']}"
    if "despite_found" in looked:  # --despite-object: the named object is there, and another copy will be sent
        named = looked["despite_found"]
        note = (
            f"looked up on the platform first: only the object you named, {named['remote_id']}, under "
            f"{named['platform_key']}; another copy will be sent"
        )
    _emit(args, _intent_dict(it) | {"lookup": looked}, f"{it.key[:16]}  now {it.state}; {note}")
    return EXIT_OK


def cmd_resolve(args) -> int:
    store = _store(args)
    key = _resolve_key(store, args.key)
    if args.published is None:
        if args.unverified:
            raise IntakeError("--unverified goes with --published REMOTE_ID")
        plan, looked = _look_before_sending_again(args, store, key, EVENT.resolve_not_sent)
        it = store.resolve_not_sent(key, operator=args.operator, reason=args.reason, plan=plan)
        return _moved_after_looking(args, it, looked)
    evidence = _published_evidence(args, store, key)
    it = store.resolve_published(key, operator=args.operator, remote_id=args.published, evidence=evidence or None)
    verified = evidence.get("verified") is True
    note = (
        f"verified: the platform holds {args.published} as approved ({evidence['read_back']})"
        if verified
        else f"NOT verified: {args.published} asserted by operator {args.operator} ({evidence['why']})"
    )
    data = _intent_dict(it) | {
        "verified": verified,
        "read_back": evidence.get("read_back"),
        "asserted_by": None if verified else args.operator,
        "why_unverified": evidence.get("why"),
    }
    _emit(args, data, f"{it.key[:16]}  now {it.state}; {note}")
    return EXIT_OK


def _published_evidence(args, store: OperatorStore, key: str) -> dict[str, Any]:
    """How the operator's remote id for ``key`` is known, kept with the resolution: read back through the
    ``--platform-config`` transport and compared as the dispatcher compares (``verify_remote_object``;
    ``NotVerified`` when it does not confirm, exit 1); or, with ``--unverified`` or without a platform
    config, recorded as asserted by the operator, not verified."""
    from atmostonce.runtime import verify_remote_object

    asserted = {"verified": False, "asserted_by": args.operator, "remote_id": args.published}
    if args.unverified:
        return asserted | {"why": "the operator passed --unverified"}
    if not args.platform_config:
        return asserted | {"why": "no --platform-config to read it back"}
    if store.get(key).state not in store.table.sources(EVENT.resolve_published):
        return {}  # the move will be refused by its source state (with its hint): read nothing back
    transport = _platform(args)
    try:
        return verify_remote_object(store, transport, key, args.published)
    finally:
        transport.close()


def cmd_db_upgrade(args) -> int:
    from atmostonce_sql import open_store
    from atmostonce_sql.migrate import current_revision

    url = _url(args)
    new_file = _new_sqlite_file(url)
    store = open_store(url, migrate=True, check_sequences=False)
    if new_file is not None:  # as every command that creates one says (README): a mistyped path shows at once
        print(f"note: created a new, empty database at {new_file}", file=sys.stderr)
    try:
        rev = current_revision(store.engine)
    finally:
        store.close()
    shown = display_url(url)
    _emit(args, {"revision": rev, "database": shown}, f"database {shown} at revision {rev}")
    return EXIT_OK


def cmd_grant_app_role(args) -> int:
    from atmostonce_sql import grant_app_role, open_store

    url = _url(args)
    store = open_store(url, migrate=False, check_sequences=False, create=False)
    try:
        granted = grant_app_role(store.engine, args.role)
    finally:
        store.close()
    shown = display_url(url)
    lines = [f"{t}: {', '.join(p)}" for t, p in granted.items()]
    _emit(
        args,
        {"role": args.role, "tables": granted, "database": shown},
        "\n".join([f"granted to {args.role} on {shown}:", *lines]),
    )
    return EXIT_OK


def cmd_declare_restore(args) -> int:
    # the one command that opens a store whose sequences are behind: it is what repairs them
    sql = scheme_of(_url(args)) in ("sqlite", "postgresql")
    store = _store(args, **({"check_sequences": False} if sql else {}))
    epoch, fenced = store.declare_restore(operator=args.operator)
    _emit(
        args,
        {"restore_epoch": epoch, "fenced": fenced},
        f"restore epoch now {epoch}; {fenced} open or parked intents moved to indeterminate for reconciliation",
    )
    return EXIT_OK


def cmd_audit_verify(args) -> int:
    from atmostonce.audit import verify_store

    store = _store(args)
    keys = None if args.key is None else [_resolve_key(store, args.key)]
    report = verify_store(store, keys)
    if report.intact:
        text = f"audit: {report.intents} intents, {report.rows} history rows, every chain intact"
    else:
        lines = [
            f"{b.key}  first break at seq {b.seq if b.seq is not None else '(after the last row)'}: {b.message}"
            for b in report.breaks
        ]
        text = "\n".join([f"audit: {len(report.breaks)} of {report.intents} chains broken", *lines])
    _emit(args, report.as_dict(), text)
    return EXIT_OK if report.intact else EXIT_REFUSED


def _account_warning(store: OperatorStore, account: str) -> dict[str, Any] | None:
    """A warning when ``account`` is one the store has never seen: no intent of it and no policy naming it
    (a misspelled account would otherwise be accepted silently, and the real one left as it was). The policy
    is still written: an account may be configured before its first intent."""
    pol = store.policies()
    named = {*pol["rate_limits"], *pol["credentials"], *pol["signing"]}
    named |= {s.split(":", 1)[1] for s in pol["kill_switches"] if s.startswith("account:")}
    if account in named or store.has_account(account):
        return None
    return {
        "unknown_account": account,
        "message": f"the store has no intent of account {account!r} and no policy naming it: is it misspelled?",
    }


def _platform_warning(store: OperatorStore, platform: str) -> dict[str, Any] | None:
    """A warning when ``platform`` names no installed transport (the contract gate compares the transport's
    name) and no contract already set."""
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="atmostonce.transports")} | set(store.policies()["contracts"])
    if platform in names:
        return None
    return {
        "unknown_platform": platform,
        "message": f"no installed transport is named {platform!r} ({', '.join(sorted(names)) or 'none'}) and "
        "no contract names it: is it misspelled?",
    }


def _emit_policy(args, data: dict[str, Any], text: str, warning: dict[str, Any] | None) -> int:
    if warning is not None:
        data["warning"] = warning
        print(f"warning: {warning['message']}", file=sys.stderr)
    _emit(args, data, text)
    return EXIT_OK


def cmd_kill_switch(args) -> int:
    store = _store(args, create=True)
    scope = "global" if args.scope == "global" else f"account:{args.scope}"
    warning = None if args.scope == "global" else _account_warning(store, args.scope)
    store.set_kill_switch(scope, args.state == "on", operator=args.operator)
    data = {"scope": scope, "engaged": args.state == "on", "operator": args.operator}
    return _emit_policy(args, data, f"kill switch {scope}: {args.state}", warning)


def cmd_policy_show(args) -> int:
    store = _store(args)
    pol = store.policies()
    a = args.account
    if a is not None:
        check_text("account", a)
        pol["kill_switches"] = {k: v for k, v in pol["kill_switches"].items() if k in ("global", f"account:{a}")}
        for kind in ("rate_limits", "credentials", "signing"):
            pol[kind] = {k: v for k, v in pol[kind].items() if k == a}
    shown = display_url(_url(args))
    data = {"database": shown, "account": a, **pol}
    ks = pol["kill_switches"]

    def listed(items: dict[str, Any], fmt) -> str:
        return "; ".join(fmt(k, v) for k, v in items.items()) or "(none)"

    lines = [
        f"policies in {shown}" + (f" for account {a} (and global ones)" if a is not None else ""),
        f"  kill switches: global {'on' if ks.get('global') else 'off'}"
        + "".join(f"; {k} {'on' if v else 'off'}" for k, v in ks.items() if k != "global"),
        "  rate limits: "
        + listed(
            pol["rate_limits"],
            lambda k, r: (
                f"{k} {r['max_sends']} sends per {r['window_seconds']:g} s ({r['used']} used in the window "
                f"started {_ts(r['window_start'])})"
            ),
        ),
        "  credential versions (the worker must prepare with this one): "
        + listed(pol["credentials"], lambda k, v: f"{k} {v}"),
        "  contract versions (per platform): " + listed(pol["contracts"], lambda k, v: f"{k} {v}"),
        "  signed approvals required: " + listed(pol["signing"], lambda k, v: k),
        f"  duplicate-text window: {pol['text_window_seconds']:g} s (the same account's same normalized text, any "
        "target, is parked while an earlier send of it holds the window)",
    ]
    return _emit_policy(args, data, "\n".join(lines), None if a is None else _account_warning(store, a))


def _operator(args) -> str:
    """``--operator``: a named person (not blank), as park and resolve require (``IntakeError``: exit 2)."""
    return check_text("operator", args.operator)


def cmd_credential(args) -> int:
    operator, version = _operator(args), None if args.clear else args.version
    store = _store(args, create=True)
    warning = _account_warning(store, check_text("account", args.account))
    store.set_credential_version(args.account, version, operator=operator)
    text = f"credential version {args.account}: " + ("cleared (no check)" if version is None else f"{version} set")
    data = {"account": args.account, "version": version, "operator": operator}
    return _emit_policy(args, data, f"{text} by {operator}", warning)


def cmd_contract(args) -> int:
    operator, version = _operator(args), None if args.clear else args.version
    store = _store(args, create=True)
    warning = _platform_warning(store, check_text("platform", args.platform))
    store.set_contract_version(args.platform, version, operator=operator)
    text = f"contract version {args.platform}: " + ("cleared (no check)" if version is None else f"{version} set")
    data = {"platform": args.platform, "version": version, "operator": operator}
    return _emit_policy(args, data, f"{text} by {operator}", warning)


def cmd_rate_limit(args) -> int:
    operator, limit = _operator(args), None if args.clear else args.max_sends
    store = _store(args, create=True)
    warning = _account_warning(store, check_text("account", args.account))
    store.set_rate_limit(args.account, limit, window_seconds=args.window, operator=operator)
    text = f"rate limit {args.account}: " + (
        "cleared (no limit)" if limit is None else f"{limit} sends per {args.window:g} s"
    )
    data = {
        "account": args.account,
        "max_sends": limit,
        "window_seconds": args.window,
        "cleared": limit is None,
        "operator": operator,
    }
    return _emit_policy(args, data, f"{text} by {operator}", warning)


def cmd_text_window(args) -> int:
    operator = _operator(args)
    store = _store(args, create=True)
    store.set_text_window(args.seconds, operator=operator)
    data = {"text_window_seconds": float(args.seconds), "operator": operator}
    return _emit_policy(args, data, f"duplicate-text window: {args.seconds:g} s set by {operator}", None)


def cmd_policy_log(args) -> int:
    store = _store(args)
    rows = store.policy_changes(limit=args.limit)
    data = {"database": display_url(_url(args)), "changes": [dataclasses.asdict(r) for r in rows]}
    lines = [
        f"{r.seq:>6}  {_ts(r.recorded_at)}  {r.kind} {r.name} = {json.dumps(r.value)}  by {r.operator or '(no operator)'}"
        for r in rows
    ]
    _emit(args, data, "\n".join(lines) or "(no policy changes)")
    return EXIT_OK


def cmd_approve(args) -> int:
    store = _store(args)
    if args.key_file is not None:
        from atmostonce.signing import load_private_key

        if args.request_digest is not None:
            raise IntakeError("--key signs the intent's own digest: leave out --request-digest")
        a = store.approve_signed(
            _resolve_key(store, args.key),
            approver=args.approver,
            expires_in=args.expires_in,
            private_key=load_private_key(args.key_file),
            target_version=args.target_version,
        )
    else:
        a = store.approve(
            _resolve_key(store, args.key),
            approver=args.approver,
            expires_in=args.expires_in,
            request_digest=args.request_digest,
            target_version=args.target_version,
        )
    _emit(
        args,
        a.__dict__,
        f"{a.approval_id}  approves {a.key[:16]} (digest {a.request_digest[:12]}) on {a.target} at version "
        f"{a.target_version} until {_ts(a.expires_at)} by {a.approver}",
    )
    return EXIT_OK


def cmd_retract(args) -> int:
    operator = _operator(args)
    store = _store(args)
    correction = None
    if args.correct is not None:
        try:
            correction = json.loads(args.correct)
        except ValueError as exc:
            raise IntakeError(f"--correct must be a JSON object: {exc}") from exc
    key = _resolve_key(store, args.key)
    checked = args.platform_config is not None
    if checked:  # a transport that cannot retract would leave the retraction queued for ever: refuse it now
        from atmostonce.runtime import check_retraction

        transport = _platform(args)
        try:
            check_retraction(transport, key, "delete" if correction is None else "correct")
        finally:
            transport.close()
    it = store.submit_retraction(key, correction=correction)
    note = "" if checked else " (the platform's retract capability was not checked: no --platform-config)"
    _emit(
        args,
        _intent_dict(it) | {"operator": operator, "capability_checked": checked},
        f"{it.key[:16]}  {it.action_kind} of {it.request['remote_id']} queued ({it.state}) by {operator}{note}",
    )
    return EXIT_OK


def cmd_operator_key_new(args) -> int:
    from atmostonce.signing import key_id, new_private_key, public_key_hex, public_key_pem, write_private_key

    k = new_private_key()
    write_private_key(k, args.out)  # mode 0600, never overwrites
    pem = public_key_pem(k)
    _emit(args, {"key_id": key_id(public_key_hex(k)), "public_key": pem, "private_key_file": args.out}, pem.rstrip())
    return EXIT_OK


def cmd_operator_key_add(args) -> int:
    from pathlib import Path

    store = _store(args, create=True)
    k = store.add_operator_key(args.name, Path(args.public_key).read_text("utf-8"), added_by=args.added_by)
    _emit(args, k.__dict__, f"{k.key_id}  registered for {k.operator} by {k.added_by}")
    return EXIT_OK


def cmd_signing(args) -> int:
    operator = _operator(args)
    store = _store(args, create=True)
    warning = _account_warning(store, check_text("account", args.account))
    store.set_signing_required(args.account, args.state == "on", operator=operator)
    data = {"account": args.account, "signing_required": args.state == "on", "operator": operator}
    return _emit_policy(args, data, f"signing {args.state} for {args.account} by {operator}", warning)


def cmd_withdraw(args) -> int:
    a = _store(args).withdraw_approval(args.approval_id, operator=args.operator, reason=args.reason)
    _emit(args, a.__dict__, f"{a.approval_id}  now {a.state}")
    return EXIT_OK


def cmd_approvals(args) -> int:
    store = _store(args)
    items = store.approvals(_resolve_key(store, args.key))
    rows = [
        {
            "approval": a.approval_id,
            "state": a.state,
            "approver": a.approver,
            "version": a.target_version,
            "digest": a.request_digest[:12],
            "expires": _ts(a.expires_at),
        }
        for a in items
    ]
    _emit(
        args,
        [a.__dict__ for a in items],
        _table(rows, ["approval", "state", "approver", "version", "digest", "expires"]),
    )
    return EXIT_OK


def _claim_row(e) -> dict[str, Any]:
    """One line of a target's claim timeline: a move (``ClaimEntry``) or a refused stale claim write (``Refusal``),
    with the acting owner: the worker's name for a worker's move or a stale worker's refusal."""
    if isinstance(e, Refusal):
        owner = e.presented.get("owner")
        return {
            "seq": e.seq,
            "kind": "refused",
            "event": f"{e.event} ({e.guard})",
            "actor": f"{ACTOR.worker}:{owner}" if owner else ACTOR.worker,
            "from": e.current.get("state", "-"),
            "to": "-",
            "epoch": f"{e.presented.get('claim_epoch')} (current {e.current.get('epoch')})",
            "superseded_by": e.superseded_by_seq if e.superseded_by_seq is not None else "-",
            "wall_time": _ts(e.recorded_at),
        }
    owner = e.detail.get("owner")
    return {
        "seq": e.seq,
        "kind": e.machine,
        "event": e.event,
        "actor": f"{e.actor}:{owner}" if owner and e.actor == ACTOR.worker else e.actor,
        "from": e.from_state or "-",
        "to": e.to_state,
        "epoch": e.epoch if e.epoch is not None else "-",
        "superseded_by": "",
        "wall_time": _ts(e.recorded_at),
    }


def cmd_claim_show(args) -> int:
    store = _store(args)
    c = store.claim(args.target)
    log = store.claim_log(args.target)
    data: dict[str, Any] = {
        "claim": None if c is None else c.__dict__ | {"owner_token": None},
        "history": [e.__dict__ for e in log if not isinstance(e, Refusal)],
        "refusals": [e.__dict__ for e in log if isinstance(e, Refusal)],
        "timeline": [_claim_row(e) for e in log],
    }
    rows = data["timeline"]
    head = (
        f"target {args.target}: no claim yet"
        if c is None
        else f"target {c.target}  claim {c.state}  epoch {c.epoch}  version {c.target_version}  "
        f"owner {c.owner or '-'}  intent {(c.key or '-')[:16]}  lease until {_ts(c.lease_expires_at)}"
    )
    text = "\n".join(
        [
            head,
            "moves and refused stale writes (ordered by store sequence; wall time is context only):",
            _table(rows, list(rows[0]) if rows else []),
        ]
    )
    _emit(args, data, text)
    return EXIT_OK


def cmd_settle(args) -> int:
    from atmostonce_console.settle import SETTLE_MOVES, select, sends_again, settle, would

    operator = _operator(args)
    check_text("reason", args.reason)
    store = _store(args)
    picked = select(store, state=args.state, account=args.account, kind=args.kind, target=args.target, limit=args.limit)
    plan = would(store, picked, args.as_)
    if not args.yes:
        rows = [
            {
                "key": p["key"][:16],
                "state": p["state"],
                "account": p["account"],
                "kind": p["kind"],
                "target": p["target"],
                "move": (
                    f"none: object {p['on_record'][-1]} on record (resolve --published it)"
                    if p["on_record"]
                    else f"{p['event']} -> {p['to']}"
                    if p["to"]
                    else f"no {p['event']} from {p['state']}"
                ),
            }
            for p in plan
        ]
        text = _table(rows, ["key", "state", "account", "kind", "target", "move"])
        movable = sum(1 for p in plan if p["to"] and not p["on_record"])
        on_record = sum(1 for p in plan if p["to"] and p["on_record"])
        counts = f"{movable} would move" + (f", {on_record} would be left (object on record)" if on_record else "")
        if len(plan) - movable - on_record:
            counts += f", {len(plan) - movable - on_record} would be refused (no {args.as_} from their state)"
        looks = (
            " after a look at the platform"
            if args.platform_config and sends_again(store.table, SETTLE_MOVES[args.as_])
            else ""
        )
        text += (
            f"\n{len(plan)} intent(s) selected: {counts}; nothing settled (dry run): add --yes to settle them{looks}"
        )
        _emit(args, {"dry_run": True, "selected": plan}, text)
        return EXIT_OK
    transport = _platform(args) if args.platform_config else None
    try:
        from atmostonce.runtime import check_before_sending_again

        look = None if transport is None else functools.partial(check_before_sending_again, store, transport)
        results: list[Any] = []
        try:
            settle(
                store,
                [it.key for it in picked],
                as_=args.as_,
                operator=operator,
                reason=args.reason,
                look=look,
                on_result=results.append,
            )
        except BaseException:  # an interrupt part-way: say what was moved before it, then let it end the command
            doc: dict[str, Any] = {"dry_run": False, "interrupted": True, "results": [r.as_dict() for r in results]}
            text = "\n".join(f"{r.key[:16]}  {r.result} {r.state_after or ''}".rstrip() for r in results)
            if len(results) < len(picked):  # the key it stopped at: its move may have committed before the interrupt
                at = picked[len(results)]
                with contextlib.suppress(Exception):
                    now = store.find(at.key)
                    doc["stopped_at"] = {"key": at.key, "state_before": at.state, "state_now": now and now.state}
                    text += f"\n{at.key[:16]}  stopped at: was {at.state}, now {now and now.state}"
            _emit(
                args, doc, text + f"\ninterrupted at {len(results) + 1} of {len(picked)}: those after were not settled"
            )
            raise
    finally:
        if transport is not None:
            transport.close()
    lines = []
    for r in results:
        if r.result == "moved":
            lines.append(f"{r.key[:16]}  {r.state_before} -> {r.state_after}")
        elif r.found:
            where = (
                f"found on the platform: object {r.found['remote_id']} under key {r.found['platform_key']}"
                if "platform_key" in r.found
                else f"a send of it made object {r.found['remote_id']} (recorded as its "
                f"{r.found['recorded_as'].replace('_', ' ')})"
            )
            lines.append(
                f"{r.key[:16]}  {where}; nothing written "
                f"(record it: resolve --published {r.found['remote_id']} --platform-config FILE)"
            )
        elif r.refused:
            lines.append(f"{r.key[:16]}  refused by {r.refused['guard']} (state {r.refused['state']})")
        else:
            lines.append(f"{r.key[:16]}  error: {r.error}")
    moved = sum(r.result == "moved" for r in results)
    lines.append(f"{moved} of {len(results)} settled as {args.as_} by {operator}")
    unlooked = [r for r in results if r.result == "moved" and r.lookup is not None and r.lookup["why"] is not None]
    if unlooked and transport is None:
        lines.append(f"{len(unlooked)} to be sent again NOT looked up on the platform first: no --platform-config")
    elif unlooked:
        lines.append(
            f"{len(unlooked)} to be sent again with a key NOT looked up on the platform first (--json: lookup.why)"
        )
    unanswered = sum(r.lookup_failed for r in results)
    if unanswered:
        lines.append(f"{unanswered} left as they were: the platform gave no usable answer to their lookup (exit 3)")
    store_failed = sum(r.store_failed for r in results)
    if store_failed:
        lines.append(f"{store_failed} not settled: the store gave no answer (exit 3)")
    unanswered += store_failed
    _emit(args, {"dry_run": False, "results": [r.as_dict() for r in results]}, "\n".join(lines))
    # as single resend and resolve: a platform or a store that did not answer is exit 3 (run it again later)
    return EXIT_STORE if unanswered else EXIT_OK if moved == len(results) else EXIT_REFUSED


def cmd_console(args) -> int:
    import secrets

    from atmostonce_console import SECRET_ENV, create_app, credentials_from, is_loopback, serve
    from atmostonce_console.audit import ActionLog

    credentials = credentials_from(args.token_file)
    platform = projection = None
    if args.platform_config:
        profile = _profile(args)
        platform, projection = profile.http_transport, profile.config.projection
    store = _store(args)
    if not is_loopback(args.host):
        print(f"warning: the console listens on {args.host}, not only on loopback", file=sys.stderr)
    app = create_app(
        store,
        credentials=credentials,
        action_log=ActionLog(args.audit_log),
        session_secret=os.environ.get(SECRET_ENV) or secrets.token_urlsafe(32),
        platform=platform,
        projection=projection,
        database=display_url(_url(args)),
    )
    print(f"atmostonce console on http://{args.host}:{args.port}/ (audit log {args.audit_log})", file=sys.stderr)
    try:
        serve(app, host=args.host, port=args.port)
    finally:
        store.close()
    return EXIT_OK


def cmd_spec_check(args) -> int:
    from atmostonce.checks import check_table
    from atmostonce.table import load_table

    problems = check_table(load_table(args.table) if args.table else __import__("atmostonce").table())
    if not args.table:  # the shipped table also couples the approval and claim machines (spec/*.toml)
        from atmostonce.checks import check_machines
        from atmostonce.table import MACHINES, machine, table

        problems |= check_machines(table(), {m: machine(m) for m in MACHINES})
    _emit(args, problems, "\n".join(f"{k}: {p}" for k, ps in problems.items() for p in ps) or "table: all checks pass")
    return EXIT_REFUSED if problems else EXIT_OK


def cmd_conformance(args) -> int:
    from atmostonce.conformance import run_cli

    return run_cli(args)


# ---------------------------------------------------------------- parser
def _limit(text: str) -> int:
    """A ``--limit``: a whole number, 0 or more (refused alike whatever the database, exit 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a limit is a whole number, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"a limit cannot be negative, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="atmostonce", description="Publish side effects at most once.")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    sub = p.add_subparsers(dest="command", required=True)

    def db(sp):
        sp.add_argument("--database-url", help=f"store URL (default $ATMOSTONCE_DATABASE_URL or {DEFAULT_URL})")
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
        return sp

    d = sub.add_parser("demo", help="the main job: N intents through a faulty platform, crashing workers")
    d.add_argument("--intents", "-n", type=int, default=200)
    d.add_argument("--workers", type=int, default=4)
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--crash-rate", type=float, default=0.03, help="probability of a crash at each step boundary")
    d.add_argument("--timeout", type=float, default=180.0, help="seconds before giving up on open intents")
    d.add_argument("--database-url", help="run on this (empty) database instead of a fresh SQLite file")
    d.add_argument(
        "--platform",
        choices=["sink", "json-server", "matrix", "email"],
        default="sink",
        help="sink: the in-process HTTP sink; json-server: the npm REST server behind a fault proxy (needs node and "
        "npm; installed into build/npm on first use); matrix: a local Synapse behind a fault proxy (needs the test "
        "extras); email: a throwaway Postfix and Dovecot on loopback behind the SMTP fault relay (needs root and the "
        "postfix and dovecot-imapd packages). Duplicates are counted from the platform's own records",
    )
    d.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    d.set_defaults(func=cmd_demo)

    it = sub.add_parser("intents", help="inspect intents").add_subparsers(dest="sub", required=True)
    ls = db(it.add_parser("list", help="list intents"))
    ls.add_argument("--state")
    ls.add_argument("--limit", type=_limit, default=100, help="show at most this many (default 100)")
    ls.set_defaults(func=cmd_intents_list)
    sh = db(it.add_parser("show", help="one intent and its history timeline"))
    sh.add_argument("key")
    sh.set_defaults(func=cmd_intents_show)

    wk = db(
        sub.add_parser(
            "work",
            help="one worker pass: sweep, dispatch pending intents, reconcile unknown ones",
            description="One worker pass: sweep, dispatch pending intents, reconcile unknown ones. Exits 3 when "
            "the pass ends with a send whose outcome is unknown (a send of this pass left unknown, or an intent "
            "indeterminate from before the pass, still unknown or parked by this pass's reconciliation), each named "
            "(--json: unsettled); nothing is resent, a "
            "person settles them (intents show, resolve, park). Otherwise the usual codes: 0 done, 2 bad input, "
            "3 database error.",
        )
    )
    wk.add_argument(
        "--platform-config",
        help="required: platform profile, TOML (spec/platforms/*.toml) or JSON of HttpPlatformConfig fields",
    )
    wk.add_argument("--limit", type=_limit, default=100, help="dispatch at most this many intents")
    wk.set_defaults(func=cmd_work)
    sw = db(sub.add_parser("sweep", help="act on expired leases once"))
    sw.set_defaults(func=cmd_sweep)
    rc = db(sub.add_parser("reconcile", help="look indeterminate intents up on the platform (one lookup each)"))
    rc.add_argument(
        "--platform-config",
        help="required: platform profile, TOML (spec/platforms/*.toml) or JSON of HttpPlatformConfig fields",
    )
    rc.add_argument("--limit", type=_limit, default=50, help="look up at most this many intents (0: none)")
    rc.epilog = (
        "exit 3 when a send this pass looked up was parked for a person (--json: parked) or its lookup failed "
        "(--json: lookup_failed, with the error); nothing is resent either way"
    )
    rc.set_defaults(func=cmd_reconcile)

    pk = db(sub.add_parser("park", help="stop the machine working on an intent (operator)"))
    pk.add_argument("key")
    pk.add_argument("--operator", required=True)
    pk.add_argument("--reason", default="operator stop")
    pk.set_defaults(func=cmd_park)
    rt = db(sub.add_parser("retry", help="re-queue a failed intent (refused from any other state)"))
    rt.add_argument("key")
    rt.add_argument("--operator", required=True, help="who re-queues it (kept in the history row)")
    rt.set_defaults(func=cmd_retry)
    rs = db(sub.add_parser("resend", help="deliberately send a parked intent again under a new resend epoch"))
    rs.add_argument("key")
    rs.add_argument("--operator", required=True)
    rs.add_argument(
        "--platform-config",
        help="platform profile (TOML, or JSON of HttpPlatformConfig fields): the intent is looked up by key "
        "first, under every key it was sent under, and an object found refuses the resend (exit 1)",
    )
    rs.add_argument(
        "--despite-object",
        metavar="REMOTE_ID",
        help="send again although the store records this object as made by a send of it (it is wrong, or "
        "was deleted); without it a recorded object refuses the resend (exit 1)",
    )
    rs.set_defaults(func=cmd_resend)
    rv = db(sub.add_parser("resolve", help="settle a parked intent by what a human saw on the platform"))
    rv.add_argument("key")
    rv.add_argument("--operator", required=True)
    g = rv.add_mutually_exclusive_group(required=True)
    g.add_argument("--published", metavar="REMOTE_ID", help="the object exists with this remote id")
    g.add_argument("--not-sent", action="store_true", help="nothing was sent (makes it retryable)")
    rv.add_argument(
        "--platform-config",
        help="platform profile (TOML, or JSON of HttpPlatformConfig fields): --published REMOTE_ID is read back and compared "
        "with what was approved before it is accepted; --not-sent looks the intent up by key first, and an "
        "object found refuses it (exit 1)",
    )
    rv.add_argument(
        "--unverified",
        action="store_true",
        help="accept --published REMOTE_ID without a read-back; recorded as asserted by the operator, not verified",
    )
    rv.add_argument(
        "--despite-object",
        metavar="REMOTE_ID",
        help="with --not-sent: although the store records this object as made by a send of it (it was deleted); "
        "without it a recorded object refuses --not-sent (exit 1)",
    )
    rv.add_argument("--reason", default="operator: not sent")
    rv.set_defaults(func=cmd_resolve)

    dbp = sub.add_parser("db", help="database administration").add_subparsers(dest="sub", required=True)
    up = db(dbp.add_parser("upgrade", help="apply migrations"))
    up.set_defaults(func=cmd_db_upgrade)
    gr = db(dbp.add_parser("grant-app-role", help="PostgreSQL: give the application's role what the store needs"))
    gr.add_argument("role", help="an existing role; INSERT and SELECT only on append-only tables")
    gr.set_defaults(func=cmd_grant_app_role)
    dr = db(
        dbp.add_parser(
            "declare-restore",
            help="after restoring a backup (old send leases run out, nothing reconnected yet): fence old leases and plans",
        )
    )
    dr.add_argument("--operator", required=True)
    dr.set_defaults(func=cmd_declare_restore)

    au = sub.add_parser("audit", help="the tamper-evident history").add_subparsers(dest="sub", required=True)
    av = db(au.add_parser("verify", help="walk every intent's hash chain; report the first break of each"))
    av.add_argument("--key", help="verify only this intent (full key or a unique prefix)")
    av.set_defaults(func=cmd_audit_verify)

    pol = sub.add_parser("policy", help="the policy layer every path reads").add_subparsers(dest="sub", required=True)
    ps = db(
        pol.add_parser(
            "show",
            help="every policy in one place: kill switches, rate limits, credential and contract versions, "
            "signing, the duplicate-text window",
        )
    )
    ps.add_argument("--account", help="only this account's policies (and the global and per-platform ones)")
    ps.set_defaults(func=cmd_policy_show)
    ks = db(pol.add_parser("kill-switch", help="engage or release a kill switch"))
    ks.add_argument("scope", help="'global' or an account id")
    ks.add_argument("state", choices=["on", "off"])
    ks.add_argument("--operator", required=True)
    ks.set_defaults(func=cmd_kill_switch)
    cr = db(pol.add_parser("credential", help="set an account's current credential version"))
    cr.add_argument("account")
    crg = cr.add_mutually_exclusive_group(required=True)
    crg.add_argument("version", nargs="?")
    crg.add_argument("--clear", action="store_true")
    cr.add_argument("--operator", required=True)
    cr.set_defaults(func=cmd_credential)
    ct = db(pol.add_parser("contract", help="set the platform contract version workers must have prepared for"))
    ct.add_argument("platform")
    ctg = ct.add_mutually_exclusive_group(required=True)
    ctg.add_argument("version", nargs="?")
    ctg.add_argument("--clear", action="store_true")
    ct.add_argument("--operator", required=True)
    ct.set_defaults(func=cmd_contract)

    rl = db(pol.add_parser("rate-limit", help="at most N sends per window for an account (database clock)"))
    rl.add_argument("account")
    rlg = rl.add_mutually_exclusive_group(required=True)
    rlg.add_argument("max_sends", nargs="?", type=int)
    rlg.add_argument("--clear", action="store_true")
    rl.add_argument("--window", type=float, default=60.0, metavar="SECONDS")
    rl.add_argument("--operator", required=True)
    rl.set_defaults(func=cmd_rate_limit)
    sg = db(pol.add_parser("signing", help="require approvals signed by a registered operator key for an account"))
    sg.add_argument("account")
    sg.add_argument("state", choices=["on", "off"])
    sg.add_argument("--operator", required=True)
    sg.set_defaults(func=cmd_signing)
    tw = db(
        pol.add_parser(
            "text-window",
            help="the duplicate-text window: the same account's same normalized text is parked for SECONDS",
        )
    )
    tw.add_argument("seconds", type=float, metavar="SECONDS")
    tw.add_argument("--operator", required=True)
    tw.set_defaults(func=cmd_text_window)
    pl = db(pol.add_parser("log", help="the policy changes on record, newest first, with who made them"))
    pl.add_argument("--limit", type=int, default=100)
    pl.set_defaults(func=cmd_policy_log)

    ap = db(sub.add_parser("approve", help="approve an approval-gated intent's exact bytes (a named approver)"))
    ap.add_argument("key")
    ap.add_argument("--approver", required=True)
    ap.add_argument("--expires-in", type=float, required=True, metavar="SECONDS", help="database-clock seconds")
    ap.add_argument("--request-digest", help="the digest the approver saw (default: the intent's)")
    ap.add_argument("--target-version", type=int, help="the target version the draft was written against")
    ap.add_argument("--key", dest="key_file", metavar="FILE", help="sign the approval with this private key file")
    ap.set_defaults(func=cmd_approve)
    ok = sub.add_parser("operator-key", help="operators' approval-signing keys").add_subparsers(
        dest="sub", required=True
    )
    okn = ok.add_parser("new", help="make a key pair: the private key to FILE (mode 0600), the public key printed")
    okn.add_argument("--out", required=True, metavar="FILE")
    okn.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    okn.set_defaults(func=cmd_operator_key_new)
    oka = db(ok.add_parser("add", help="register an operator's public key (an administrator)"))
    oka.add_argument("name", help="the operator (approver) name the key signs for")
    oka.add_argument("--public-key", required=True, metavar="FILE", help="PEM or 64 hex digits")
    oka.add_argument("--added-by", default=os.environ.get("USER") or "administrator", help="the administrator")
    oka.set_defaults(func=cmd_operator_key_add)
    rx = db(sub.add_parser("retract", help="queue a retraction (delete, or --correct) of a published intent's object"))
    rx.add_argument("key")
    rx.add_argument("--correct", metavar="JSON", help="replace the object's body with this JSON object instead")
    rx.add_argument("--operator", required=True)
    rx.add_argument(
        "--platform-config",
        help="platform profile (TOML, or JSON of HttpPlatformConfig fields): a platform that cannot delete (or update) is "
        "refused before anything is queued",
    )
    rx.set_defaults(func=cmd_retract)
    wd = db(sub.add_parser("withdraw", help="withdraw an approval before its send started (operator)"))
    wd.add_argument("approval_id")
    wd.add_argument("--operator", required=True)
    wd.add_argument("--reason", help="required when the operator is not the approval's approver")
    wd.set_defaults(func=cmd_withdraw)
    al = db(sub.add_parser("approvals", help="the approvals of one intent"))
    al.add_argument("key")
    al.set_defaults(func=cmd_approvals)
    cl = sub.add_parser("claim", help="per-target dispatch claims").add_subparsers(dest="sub", required=True)
    cs = db(cl.add_parser("show", help="a target's claim and the history of it and its approvals"))
    cs.add_argument("target")
    cs.set_defaults(func=cmd_claim_show)

    from atmostonce_console.settle import SETTLE_MOVES

    st = db(sub.add_parser("settle", help="bulk settle: one guarded operator move per selected intent"))
    st.add_argument("--state", required=True, help="the state to select from (a table state)")
    st.add_argument("--account")
    st.add_argument("--kind")
    st.add_argument("--target")
    st.add_argument("--as", dest="as_", required=True, choices=list(SETTLE_MOVES), help="the move for each intent")
    st.add_argument("--operator", required=True)
    st.add_argument("--reason", required=True)
    st.add_argument("--limit", type=_limit, default=1000, help="select at most this many")
    st.add_argument("--yes", action="store_true", help="settle them (without it: list the selection, change nothing)")
    st.add_argument(
        "--platform-config",
        metavar="FILE",
        help="with --as not-sent or resend: look each intent up on this platform (a profile in TOML, or JSON) "
        "under every key it was sent under first; one found there is not moved (exit 1)",
    )
    st.set_defaults(func=cmd_settle)
    co = db(sub.add_parser("console", help="the web console for the states a person owns (docs/console.md)"))
    co.add_argument("--host", default="127.0.0.1", help="listen address (default loopback only)")
    co.add_argument("--port", type=int, default=8080)
    co.add_argument(
        "--token-file",
        help="sign-in tokens, one a line: NAME:TOKEN or a shared TOKEN (default $ATMOSTONCE_CONSOLE_TOKEN)",
    )
    co.add_argument(
        "--audit-log", default="atmostonce-console-audit.jsonl", help="the console's action log (JSON lines)"
    )
    co.add_argument(
        "--platform-config",
        help="platform profile: a remote id is read back before it is accepted, a retraction checked before it is queued",
    )
    co.set_defaults(func=cmd_console)

    sp = sub.add_parser("spec", help="the transition table").add_subparsers(dest="sub", required=True)
    ck = sp.add_parser("check", help="run the table's static checks")
    ck.add_argument("--table", help="a table file other than the shipped one")
    ck.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    ck.set_defaults(func=cmd_spec_check)

    from .worker import add_commands

    add_commands(sub, db)  # worker, submit, status (docs/operations.md)

    from atmostonce.conformance.cli import add_arguments

    cf = add_arguments(sub.add_parser("conformance", help="run the conformance cases against an implementation"))
    cf.set_defaults(func=cmd_conformance)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "json"):
        args.json = False
    args.opened_stores = []
    try:
        return _run(args, parser)
    finally:
        _close_stores(args.opened_stores)


def _close_stores(stores: list[Any]) -> None:
    """Close every store the command opened: a SQLite store's last connection, closed, checkpoints its WAL and
    removes the ``-wal`` file, so the database is the one file a backup copied over it replaces
    (docs/operations.md)."""
    for store in reversed(stores):
        close = getattr(store, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        return args.func(args)
    except Rejected as exc:
        doc: dict[str, Any] = {"refused": exc.as_dict()}
        message = f"refused: {exc}"
        steps = _next_moves(exc, _commands(parser))
        if steps:
            doc["next"] = steps
            doc["hint"] = _hint(exc, steps)
            message += f"\nhint: {doc['hint']}"
        elif isinstance(exc, IllegalMove) and exc.state is not None and _machine_holds(exc.state):
            doc["hint"] = (
                f"{exc.event} is not a move from {exc.state}: the machine is working on it (a send in flight); "
                "wait for its outcome, or for its lease to lapse (the sweeper then makes it indeterminate), and run "
                "this command again"
            )
            message += f"\nhint: {doc['hint']}"
        elif isinstance(exc, GuardRefused) and exc.guard == GUARD.plan_unchanged:
            doc["hint"] = (
                f"the intent had another attempt or lookup (or a restore came) after it was read for this "
                f"{exc.event}: what was checked and looked up is out of date; see `atmostonce intents show "
                f"{exc.key[:16]}` and run this command again (with --platform-config it looks again, under every key sent so far)"
            )
            message += f"\nhint: {doc['hint']}"
        return _fail(args, message, doc, EXIT_REFUSED)
    except (IntakeError, ValueError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            return _quiet_broken_pipe()
        doc = {"error": str(exc)}
        if isinstance(exc, IntakeError):  # which argument, why and the bound crossed, for a script to read
            doc.update(exc.as_dict())
        profile_error = _profile_error(exc)
        if profile_error is not None:  # a platform profile's fault: its code, the field and the file
            doc["profile"] = profile_error.as_dict()
        return _fail(args, f"error: {exc}", doc, EXIT_USAGE)
    except FoundOnPlatform as exc:
        hint = (
            f"the platform holds it: record that with atmostonce resolve {exc.key[:16]} --operator NAME "
            f"--published {exc.remote_id} --platform-config FILE"
        )
        return _fail(args, f"refused: {exc}\nhint: {hint}", {"found": exc.as_dict(), "hint": hint}, EXIT_REFUSED)
    except ObjectOnRecord as exc:
        named = getattr(args, "despite_object", None)
        hint = (
            (f"{named} is not the object on record; " if named else "")
            + f"a send of it made object {exc.remote_id}: record it with atmostonce resolve {exc.key[:16]} "
            f"--operator NAME --published {exc.remote_id} --platform-config FILE (it reads the object back first: "
            f"an object that differs from the request is refused); to send another copy anyway (the object is "
            f"wrong or was deleted), run the command again with --despite-object {exc.remote_id}"
        )
        doc = {"on_record": exc.as_dict(), "hint": hint}
        return _fail(args, f"refused: {exc}\nhint: {hint}", doc, EXIT_REFUSED)
    except NotVerified as exc:
        hint = (
            "check the id on the platform; to record it anyway as asserted by you, not verified, "
            "run the command again with --unverified"
        )
        return _fail(args, f"refused: {exc}\nhint: {hint}", {"not_verified": exc.as_dict(), "hint": hint}, EXIT_REFUSED)
    except RetractionUnsupported as exc:
        hint = (
            "the platform config has no way to delete or update an object (delete_path, update_path): add one, "
            "or remove the object on the platform by hand"
        )
        return _fail(args, f"refused: {exc}\nhint: {hint}", {"unsupported": exc.as_dict(), "hint": hint}, EXIT_REFUSED)
    except SequenceBehind as exc:
        return _fail(args, f"store error: {exc}", {"sequence_behind": exc.as_dict()}, EXIT_STORE)
    except SchemaNewer as exc:
        return _fail(args, f"store error: {exc}", {"schema_newer": exc.as_dict()}, EXIT_STORE)
    except StoreError as exc:
        return _fail(args, f"store error: {exc}", {"store_error": str(exc)}, EXIT_STORE)
    except AtMostOnceError as exc:  # e.g. a read-back with no usable answer from the platform: nothing decided
        return _fail(args, f"platform error: {exc}", {"platform_error": str(exc)}, EXIT_STORE)


def _commands(parser: argparse.ArgumentParser) -> frozenset[str]:
    """The top-level command names (``park``, ``resolve``, ...)."""
    return frozenset(name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices)


def _next_moves(exc: Rejected, commands: frozenset[str]) -> list[dict[str, Any]]:
    """For a move refused by its source state: the operator's moves, read from the loaded table, that take
    the intent from where it is to a state the refused move starts from (``park`` before ``resolve``)."""
    import atmostonce

    t = atmostonce.table()
    if not isinstance(exc, IllegalMove) or exc.state is None or exc.event not in t.events:
        return []
    wanted = t.sources(exc.event)
    return [
        {"event": e.name, "from": exc.state, "to": e.target, "command": e.name if e.name in commands else None}
        for e in t.events.values()
        if t.is_human(e.name)
        and exc.state in e.sources
        and e.target in wanted
        and e.target != exc.state
        # a restore's fence is a move for after a declared restore, never a way around a send in flight
        and EFFECT.fence_restore not in e.effects
    ]


def _machine_holds(state: str) -> bool:
    """Whether only the machine's moves leave ``state`` outside a declared restore (``authorized``: a send in
    flight, left by its outcome or the sweeper's lease expiry)."""
    import atmostonce

    t = atmostonce.table()
    out = [e for e in t.events.values() if state in e.sources and e.target != state]
    return bool(out) and all(not t.is_human(e.name) or EFFECT.fence_restore in e.effects for e in out)


def _hint(exc: Rejected, steps: list[dict[str, Any]]) -> str:
    """One line for a person: the moves that lead from where the intent is to where the refused move starts."""
    ways = " or ".join(
        f"{s['event']} (to {s['to']})"
        + (f": atmostonce {s['command']} {exc.key[:16]} --operator NAME" if s["command"] else "")
        for s in steps
    )
    return f"{exc.event} is not a move from {exc.state}; first {ways}, then run this command again"


def _fail(args, message: str, doc: dict, code: int) -> int:
    print(message, file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps(doc))
    return code


def _quiet_broken_pipe() -> int:
    """The reader went away (``| head``): stop quietly, as Unix tools do."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
