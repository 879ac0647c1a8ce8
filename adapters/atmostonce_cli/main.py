"""``atmostonce``: the demo, operator commands, migrations and table checks.

Exit codes: 0 success; 1 a refused move (the table or a guard said no) or a
demo that found duplicates; 2 bad usage or input; 3 a store or platform error.
``--json`` prints machine-readable output on stdout; errors go to stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from typing import Any

from atmostonce.errors import IntakeError, Rejected, StoreError
from atmostonce.records import Intent

from .stores import DEFAULT_URL, open_store_url

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


def _store(args):
    return open_store_url(args.database_url)


def _resolve_key(store, key: str) -> str:
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
def cmd_demo(args) -> int:
    from .demo import format_result, run_demo

    if not 0.0 <= args.crash_rate <= 1.0:
        raise IntakeError("--crash-rate is a probability between 0 and 1")
    if args.timeout <= 0:
        raise IntakeError("--timeout must be a positive number of seconds")
    if args.platform == "matrix":
        from atmostonce_matrix.demo import format_matrix_result, run_matrix_demo
        from atmostonce_matrix.synapse import SynapseError

        try:
            mresult = run_matrix_demo(
                n=args.intents,
                workers=args.workers,
                database_url=args.database_url,
                seed=args.seed,
                crash_rate=args.crash_rate,
                timeout=args.timeout,
                progress=None if args.json else sys.stderr,
            )
        except SynapseError as exc:
            return _fail(args, f"platform error: {exc}", {"platform_error": str(exc)}, EXIT_STORE)
        _emit(args, mresult.as_dict(), format_matrix_result(mresult))
        return EXIT_OK if mresult.ok and mresult.finished else EXIT_REFUSED
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
    items = store.list_intents(state=args.state, limit=args.limit)
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
        [_intent_dict(it) for it in items],
        _table(rows, ["key", "state", "account", "kind", "target", "attempts", "remote_id", "updated"]),
    )
    return EXIT_OK


def cmd_intents_show(args) -> int:
    store = _store(args)
    key = _resolve_key(store, args.key)
    it = store.get(key)
    hist = store.history(key)
    atts = store.attempts(key)
    recs = store.reconciliations(key)
    data = {
        "intent": _intent_dict(it),
        "history": [h.__dict__ | {"detail": dict(h.detail)} for h in hist],
        "attempts": [a.__dict__ for a in atts],
        "reconciliations": [r.__dict__ for r in recs],
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
    text = "\n".join(
        [
            f"intent {it.key}",
            f"  state {it.state}  account {it.account}  kind {it.action_kind}  target {it.target}",
            *gate,
            f"  attempts {it.attempt_count}/{it.max_attempts}  reconciles {it.reconcile_count}/{it.max_reconciles}"
            f"  resend epoch {it.resend_epoch}  remote id {it.remote_id or '-'}",
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
        ]
    )
    _emit(args, data, text)
    return EXIT_OK


def _platform(args):
    from atmostonce_http import HttpPlatformConfig, HttpTransport

    if not args.platform_config:
        raise IntakeError("this command needs --platform-config FILE (JSON for HttpPlatformConfig)")
    with open(args.platform_config, encoding="utf-8") as f:
        return HttpTransport(HttpPlatformConfig.from_mapping(json.load(f)))


def cmd_work(args) -> int:
    from atmostonce.runtime import Dispatcher, Reconciler, Sweeper

    store, transport = _store(args), _platform(args)
    counts: dict[str, int] = {}
    try:
        d = Dispatcher(store, transport)
        Sweeper(store).tick()
        for key in store.claimable(args.limit):
            try:
                name = d.dispatch(key)
            except Rejected as exc:
                name = f"refused:{exc.event}:{exc.guard}"
            counts[name] = counts.get(name, 0) + 1
        for name, n in Reconciler(store, transport).run().items():
            counts[f"reconcile:{name}"] = counts.get(f"reconcile:{name}", 0) + n
    finally:
        transport.close()
    _emit(args, counts, "  ".join(f"{k} {v}" for k, v in counts.items()) or "nothing to do")
    return EXIT_OK


def cmd_sweep(args) -> int:
    from atmostonce.runtime import Sweeper

    counts = Sweeper(_store(args)).sweep_leases()
    _emit(args, counts, "  ".join(f"{k} {v}" for k, v in counts.items()))
    return EXIT_OK


def cmd_reconcile(args) -> int:
    from atmostonce.runtime import Reconciler

    transport = _platform(args)
    try:
        counts = Reconciler(_store(args), transport).run(limit=args.limit)
    finally:
        transport.close()
    _emit(args, counts, "  ".join(f"{k} {v}" for k, v in counts.items()) or "nothing to reconcile")
    return EXIT_OK


def _moved(args, it: Intent) -> int:
    _emit(args, _intent_dict(it), f"{it.key[:16]}  now {it.state}")
    return EXIT_OK


def cmd_park(args) -> int:
    store = _store(args)
    return _moved(args, store.park(_resolve_key(store, args.key), operator=args.operator, reason=args.reason))


def cmd_retry(args) -> int:
    store = _store(args)
    return _moved(args, store.retry(_resolve_key(store, args.key)))


def cmd_resend(args) -> int:
    store = _store(args)
    return _moved(args, store.resend(_resolve_key(store, args.key), operator=args.operator))


def cmd_resolve(args) -> int:
    store = _store(args)
    key = _resolve_key(store, args.key)
    if args.published is not None:
        return _moved(args, store.resolve_published(key, operator=args.operator, remote_id=args.published))
    return _moved(args, store.resolve_not_sent(key, operator=args.operator, reason=args.reason))


def cmd_db_upgrade(args) -> int:
    from atmostonce_sql import open_store
    from atmostonce_sql.migrate import current_revision

    store = open_store(args.database_url if args.database_url is not None else DEFAULT_URL, migrate=True)
    try:
        rev = current_revision(store.engine)
    finally:
        store.close()
    _emit(args, {"revision": rev}, f"database at revision {rev}")
    return EXIT_OK


def cmd_grant_app_role(args) -> int:
    from atmostonce_sql import grant_app_role, open_store

    store = open_store(args.database_url if args.database_url is not None else DEFAULT_URL, migrate=False)
    try:
        granted = grant_app_role(store.engine, args.role)
    finally:
        store.close()
    lines = [f"{t}: {', '.join(p)}" for t, p in granted.items()]
    _emit(args, {"role": args.role, "tables": granted}, "\n".join([f"granted to {args.role}:", *lines]))
    return EXIT_OK


def cmd_declare_restore(args) -> int:
    store = _store(args)
    epoch, fenced = store.declare_restore(operator=args.operator)
    _emit(
        args,
        {"restore_epoch": epoch, "fenced": fenced},
        f"restore epoch now {epoch}; {fenced} open intents moved to indeterminate for reconciliation",
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


def cmd_kill_switch(args) -> int:
    store = _store(args)
    scope = "global" if args.scope == "global" else f"account:{args.scope}"
    store.set_kill_switch(scope, args.state == "on", operator=args.operator)
    _emit(args, {"scope": scope, "engaged": args.state == "on"}, f"kill switch {scope}: {args.state}")
    return EXIT_OK


def cmd_credential(args) -> int:
    _store(args).set_credential_version(args.account, None if args.clear else args.version)
    _emit(args, {"account": args.account, "version": None if args.clear else args.version}, "credential version set")
    return EXIT_OK


def cmd_contract(args) -> int:
    _store(args).set_contract_version(args.platform, None if args.clear else args.version)
    _emit(args, {"platform": args.platform, "version": None if args.clear else args.version}, "contract version set")
    return EXIT_OK


def cmd_rate_limit(args) -> int:
    limit = None if args.clear else args.max_sends
    _store(args).set_rate_limit(args.account, limit, window_seconds=args.window)
    text = f"rate limit {args.account}: " + ("none" if limit is None else f"{limit} sends per {args.window:g} s")
    _emit(args, {"account": args.account, "max_sends": limit, "window_seconds": args.window}, text)
    return EXIT_OK


def cmd_approve(args) -> int:
    store = _store(args)
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
    store = _store(args)
    correction = None
    if args.correct is not None:
        try:
            correction = json.loads(args.correct)
        except ValueError as exc:
            raise IntakeError(f"--correct must be a JSON object: {exc}") from exc
    it = store.submit_retraction(_resolve_key(store, args.key), correction=correction)
    _emit(args, _intent_dict(it), f"{it.key[:16]}  {it.action_kind} of {it.request['remote_id']} queued ({it.state})")
    return EXIT_OK


def cmd_withdraw(args) -> int:
    a = _store(args).withdraw_approval(args.approval_id, operator=args.operator)
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


def cmd_claim_show(args) -> int:
    store = _store(args)
    c = store.claim(args.target)
    hist = store.claim_history(args.target)
    data = {"claim": None if c is None else c.__dict__ | {"owner_token": None}, "history": [h.__dict__ for h in hist]}
    rows = [
        {
            "seq": h.seq,
            "machine": h.machine,
            "event": h.event,
            "actor": h.actor,
            "from": h.from_state or "-",
            "to": h.to_state,
            "epoch": h.epoch if h.epoch is not None else "-",
            "wall_time": _ts(h.recorded_at),
        }
        for h in hist
    ]
    head = (
        f"target {args.target}: no claim yet"
        if c is None
        else f"target {c.target}  claim {c.state}  epoch {c.epoch}  version {c.target_version}  "
        f"owner {c.owner or '-'}  intent {(c.key or '-')[:16]}  lease until {_ts(c.lease_expires_at)}"
    )
    text = "\n".join([head, "history (ordered by store sequence):", _table(rows, list(rows[0]) if rows else [])])
    _emit(args, data, text)
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
        choices=["sink", "matrix"],
        default="sink",
        help="sink: the in-process HTTP sink; matrix: a local Synapse behind a fault proxy (needs the test extras)",
    )
    d.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    d.set_defaults(func=cmd_demo)

    it = sub.add_parser("intents", help="inspect intents").add_subparsers(dest="sub", required=True)
    ls = db(it.add_parser("list", help="list intents"))
    ls.add_argument("--state")
    ls.add_argument("--limit", type=int, default=100)
    ls.set_defaults(func=cmd_intents_list)
    sh = db(it.add_parser("show", help="one intent and its history timeline"))
    sh.add_argument("key")
    sh.set_defaults(func=cmd_intents_show)

    wk = db(sub.add_parser("work", help="one worker pass: sweep, dispatch pending intents, reconcile unknown ones"))
    wk.add_argument("--platform-config", help="JSON file with the HTTP platform configuration")
    wk.add_argument("--limit", type=int, default=100, help="dispatch at most this many intents")
    wk.set_defaults(func=cmd_work)
    sw = db(sub.add_parser("sweep", help="act on expired leases once"))
    sw.set_defaults(func=cmd_sweep)
    rc = db(sub.add_parser("reconcile", help="look indeterminate intents up on the platform (one lookup each)"))
    rc.add_argument("--platform-config", help="JSON file with the HTTP platform configuration")
    rc.add_argument("--limit", type=int, default=50)
    rc.set_defaults(func=cmd_reconcile)

    pk = db(sub.add_parser("park", help="stop the machine working on an intent (operator)"))
    pk.add_argument("key")
    pk.add_argument("--operator", required=True)
    pk.add_argument("--reason", default="operator stop")
    pk.set_defaults(func=cmd_park)
    rt = db(sub.add_parser("retry", help="re-queue a failed intent (refused from any other state)"))
    rt.add_argument("key")
    rt.set_defaults(func=cmd_retry)
    rs = db(sub.add_parser("resend", help="deliberately send a parked intent again under a new resend epoch"))
    rs.add_argument("key")
    rs.add_argument("--operator", required=True)
    rs.set_defaults(func=cmd_resend)
    rv = db(sub.add_parser("resolve", help="settle a parked intent by what a human saw on the platform"))
    rv.add_argument("key")
    rv.add_argument("--operator", required=True)
    g = rv.add_mutually_exclusive_group(required=True)
    g.add_argument("--published", metavar="REMOTE_ID", help="the object exists with this remote id")
    g.add_argument("--not-sent", action="store_true", help="nothing was sent (makes it retryable)")
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
    cr.set_defaults(func=cmd_credential)
    ct = db(pol.add_parser("contract", help="set the platform contract version workers must have prepared for"))
    ct.add_argument("platform")
    ctg = ct.add_mutually_exclusive_group(required=True)
    ctg.add_argument("version", nargs="?")
    ctg.add_argument("--clear", action="store_true")
    ct.set_defaults(func=cmd_contract)

    rl = db(pol.add_parser("rate-limit", help="at most N sends per window for an account (database clock)"))
    rl.add_argument("account")
    rlg = rl.add_mutually_exclusive_group(required=True)
    rlg.add_argument("max_sends", nargs="?", type=int)
    rlg.add_argument("--clear", action="store_true")
    rl.add_argument("--window", type=float, default=60.0, metavar="SECONDS")
    rl.set_defaults(func=cmd_rate_limit)

    ap = db(sub.add_parser("approve", help="approve an approval-gated intent's exact bytes (a named approver)"))
    ap.add_argument("key")
    ap.add_argument("--approver", required=True)
    ap.add_argument("--expires-in", type=float, required=True, metavar="SECONDS", help="database-clock seconds")
    ap.add_argument("--request-digest", help="the digest the approver saw (default: the intent's)")
    ap.add_argument("--target-version", type=int, help="the target version the draft was written against")
    ap.set_defaults(func=cmd_approve)
    rx = db(sub.add_parser("retract", help="queue a retraction (delete, or --correct) of a published intent's object"))
    rx.add_argument("key")
    rx.add_argument("--correct", metavar="JSON", help="replace the object's body with this JSON object instead")
    rx.set_defaults(func=cmd_retract)
    wd = db(sub.add_parser("withdraw", help="withdraw an approval before its send started (operator)"))
    wd.add_argument("approval_id")
    wd.add_argument("--operator", required=True)
    wd.set_defaults(func=cmd_withdraw)
    al = db(sub.add_parser("approvals", help="the approvals of one intent"))
    al.add_argument("key")
    al.set_defaults(func=cmd_approvals)
    cl = sub.add_parser("claim", help="per-target dispatch claims").add_subparsers(dest="sub", required=True)
    cs = db(cl.add_parser("show", help="a target's claim and the history of it and its approvals"))
    cs.add_argument("target")
    cs.set_defaults(func=cmd_claim_show)

    sp = sub.add_parser("spec", help="the transition table").add_subparsers(dest="sub", required=True)
    ck = sp.add_parser("check", help="run the table's static checks")
    ck.add_argument("--table", help="a table file other than the shipped one")
    ck.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    ck.set_defaults(func=cmd_spec_check)

    from atmostonce.conformance.cli import add_arguments

    cf = add_arguments(sub.add_parser("conformance", help="run the conformance cases against an implementation"))
    cf.set_defaults(func=cmd_conformance)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "json"):
        args.json = False
    try:
        return args.func(args)
    except Rejected as exc:
        return _fail(args, f"refused: {exc}", {"refused": exc.as_dict()}, EXIT_REFUSED)
    except (IntakeError, ValueError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            return _quiet_broken_pipe()
        return _fail(args, f"error: {exc}", {"error": str(exc)}, EXIT_USAGE)
    except StoreError as exc:
        return _fail(args, f"store error: {exc}", {"store_error": str(exc)}, EXIT_STORE)


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
