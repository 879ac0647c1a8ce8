"""A standalone JSON-lines conformance driver backed by the reference model.

Run as its own process: ``python tests/conformance/jsonl_driver.py``. It reads one request per
line on stdin, ``{"op": ..., "args": {...}}``, and writes one response per line on stdout:
``{"ok": {...}}``, ``{"refused": {"guard": ...}}`` or ``{"error": {"type": ..., "message": ...}}``.

This is the shape a driver in any language takes: decode the JSON arguments into the
implementation's own types, call it, encode the result. The store operations are decoded and
encoded here by hand; the runtime operations reuse the package's harness (the runtime and the
scripted platform).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from atmostonce.conformance.drivers import RuntimeHarness
from atmostonce.errors import IntakeError, Rejected
from atmostonce.model import MemoryStore
from atmostonce.records import Intent, Lease, Plan


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def intent_json(it: Intent) -> dict[str, Any]:
    out = {name: getattr(it, name) for name in Intent.__dataclass_fields__}
    out["request"] = dict(it.request)
    out["descriptor"] = None if it.descriptor is None else dict(it.descriptor)
    out["plan"] = {
        "key": it.key,
        "generation": it.generation,
        "reconcile_count": it.reconcile_count,
        "epoch": it.store_epoch,
    }
    return out


def lease(a: dict[str, Any]) -> Lease:
    d = a["lease"]
    return Lease(d["key"], d["attempt_token"], d["generation"], d["expires_at"], d.get("epoch", 1))


def plan(a: dict[str, Any]) -> Plan:
    d = a["plan"]
    return Plan(d["key"], d["generation"], d["reconcile_count"], d.get("epoch"))


def snapshot(a: dict[str, Any]) -> Intent:
    d = a["intent"]
    return Intent(**{name: d.get(name) for name in Intent.__dataclass_fields__})


def only(a: dict[str, Any], *names: str) -> dict[str, Any]:
    return {n: a[n] for n in names if n in a}


class Server:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> dict[str, Any]:
        self.clock = Clock()
        self.store = MemoryStore(clock=self.clock)
        self.runtime = RuntimeHarness(self.store)
        return {}

    def handle(self, op: str, a: dict[str, Any]) -> Any:
        s = self.store
        if op == "hello":
            return {"name": "jsonl model driver", "features": ["store", "runtime"]}
        if op == "reset":
            return self.reset()
        if op == "advance":
            self.clock.t += float(a["seconds"])
            return {}
        if op in ("configure_platform", "dispatch", "dispatch_pending", "sweep", "reconcile", "platform"):
            return self.runtime.call(op, a)
        if op == "submit":
            opts = only(a, "max_attempts", "max_reconciles")
            if a.get("source") is not None:
                opts["source"] = tuple(a["source"])
            return intent_json(s.submit(a["account"], a["action_kind"], a["target"], a["request"], **opts))
        if op == "begin":
            le = s.begin(a["key"], **only(a, "lease_seconds"))
            return {"key": le.key, "attempt_token": le.attempt_token, "generation": le.generation,
                    "expires_at": le.expires_at, "epoch": le.epoch}  # fmt: skip
        if op == "authorize_dispatch":
            opts = only(a, "send_lease_seconds", "descriptor", "credential_version", "platform", "contract_version")
            return intent_json(s.authorize_dispatch(lease(a), request_digest=a["request_digest"], **opts))
        if op == "record_success":
            return intent_json(s.record_success(lease(a), remote_id=a["remote_id"]))
        if op == "confirm_read_back":
            return intent_json(s.confirm_read_back(lease(a)))
        if op in ("block_at_gate", "read_back_failed", "record_not_sent", "record_unknown"):
            return intent_json(getattr(s, op)(lease(a), reason=a.get("reason", op)))
        if op in ("expire_lease", "abandon_attempt"):
            return intent_json(getattr(s, op)(snapshot(a)))
        if op == "reconcile_found":
            return intent_json(s.reconcile_found(plan(a), remote_id=a["remote_id"]))
        if op == "reconcile_not_found":
            return intent_json(s.reconcile_not_found(plan(a)))
        if op == "reconcile_unproven":
            return intent_json(s.reconcile_unproven(plan(a)))
        if op == "reconcile_absent":
            return intent_json(s.reconcile_absent(plan(a), fenced=a["fenced"]))
        if op == "park_unreconcilable":
            return intent_json(s.park_unreconcilable(plan(a), reason=a.get("reason", "unreconcilable")))
        if op in ("retry", "exhaust"):
            return intent_json(getattr(s, op)(a["key"]))
        person_plan = {} if a.get("plan") is None else {"plan": plan(a)}  # a person's move: the read decided on
        if op == "park":
            return intent_json(s.park(a["key"], operator=a["operator"], **only(a, "reason")))
        if op == "resolve_not_sent":
            return intent_json(s.resolve_not_sent(a["key"], operator=a["operator"], **only(a, "reason"), **person_plan))
        if op == "resolve_published":
            return intent_json(s.resolve_published(a["key"], operator=a["operator"], remote_id=a["remote_id"]))
        if op == "resend":
            return intent_json(s.resend(a["key"], operator=a["operator"], **person_plan))
        if op == "get":
            return intent_json(s.get(a["key"]))
        if op == "history":
            return {"items": [h.__dict__ | {"detail": dict(h.detail)} for h in s.history(a["key"])]}
        if op == "attempts":
            return {"items": [x.__dict__ | {"outcomes": list(x.outcomes)} for x in s.attempts(a["key"])]}
        if op == "refusals":
            return {"items": [r.__dict__ | {"presented": dict(r.presented), "current": dict(r.current)}
                              for r in s.refusals(a["key"])]}  # fmt: skip
        if op == "capture_source":
            return s.capture_source(a["source_id"], a["body"]).__dict__
        if op == "source_head":
            return {"head": s.source_head(a["source_id"])}
        if op == "reconciliations":
            return {"items": [r.__dict__ for r in s.reconciliations(a["key"])]}
        if op == "due_leases":
            return {"items": [intent_json(it) for it in s.due_leases(a.get("limit", 1000))]}
        if op == "claimable":
            return {"items": s.claimable(a.get("limit", 1000))}
        if op == "count_by_state":
            return s.count_by_state()
        if op == "settings":
            return {"text_window_seconds": s.text_window_seconds}
        if op == "set_kill_switch":
            return s.set_kill_switch(a["scope"], a["engaged"], operator=a["operator"]) or {}
        if op == "set_credential_version":
            return s.set_credential_version(a["account"], a["version"]) or {}
        if op == "set_contract_version":
            return s.set_contract_version(a["platform"], a["version"]) or {}
        if op == "set_rate_limit":
            return s.set_rate_limit(a["account"], a["max_sends"], **only(a, "window_seconds")) or {}
        if op == "declare_restore":
            epoch, fenced = s.declare_restore(operator=a["operator"])
            return {"epoch": epoch, "fenced": fenced}
        if op == "current_epoch":
            return {"epoch": s.current_epoch()}
        raise LookupError(f"unknown operation {op!r}")


def respond(server: Server, line: str) -> dict[str, Any]:
    try:
        msg = json.loads(line)
        return {"ok": server.handle(msg["op"], msg.get("args") or {})}
    except Rejected as exc:
        return {"refused": {"guard": exc.guard, "event": exc.event, "state": exc.state}}
    except IntakeError as exc:
        return {"error": {"type": "intake", "message": str(exc)}}
    except LookupError as exc:
        return {"error": {"type": "unsupported", "message": str(exc)}}
    except Exception as exc:  # a driver answers every line, whatever went wrong
        return {"error": {"type": "crash", "message": f"{type(exc).__name__}: {exc}"}}


def main() -> int:
    server = Server()
    for line in sys.stdin:
        if line.strip():
            sys.stdout.write(json.dumps(respond(server, line)) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
