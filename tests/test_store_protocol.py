"""Each caller of a store is typed against the small protocol of its role, and that protocol lists exactly what
the role calls (docs/conformance.md, "Writing a store"): a third-party store written to the protocols must not
fail at its first approval-gated dispatch because the runtime calls a method it never heard of, and a role's
protocol must not ask an implementer for what no caller of that role uses.

The test reads the sources (ast) of the runtime, the service (and its asyncio front), the CLI, the web console,
the audit and the conformance machines (the stateful machines and the JSON-case drivers) and collects, per
top-level function or class, each attribute taken on a store: ``store.<name>``, ``self.store.<name>``,
``<anything>.store.<name>``, ``st_.<name>``, ``getattr(store, "<name>", ...)`` (a feature probe) and the
store parameter of the lambdas the machines run on both stores (``self.both(lambda s, ...: s.<name>(...))``).
The moves the callers reach by an event name from the table (an outcome's event, the sweeper's events, the
console's settle moves) count as calls of the role that reaches them."""

from __future__ import annotations

import ast
from pathlib import Path

from atmostonce import MemoryStore, table
from atmostonce.claims import ClaimOperations
from atmostonce.protocols import (
    AuditStore,
    IntakeStore,
    MaintenanceStore,
    OperatorStore,
    OutboxStore,
    Store,
    StoreCore,
    WorkerStore,
)
from atmostonce.store import Operations

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "reference" / "atmostonce"
CLI = ROOT / "adapters" / "atmostonce_cli"
CONSOLE = ROOT / "adapters" / "atmostonce_console"
MACHINES = [*sorted((CORE / "testing").glob("*.py")), *sorted((CORE / "conformance").glob("*.py"))]
SOURCES = [
    CORE / "runtime.py",
    CORE / "service.py",
    CORE / "aio.py",
    CORE / "audit.py",
    *sorted(CLI.glob("*.py")),
    *sorted(CONSOLE.glob("*.py")),
    *MACHINES,
]
ROLES = (WorkerStore, MaintenanceStore, IntakeStore, OperatorStore, AuditStore)

# the protocol each caller is typed against: (file, top-level function or class), "*" for the rest of the file
CALLERS: dict[tuple[str, str], type] = {
    ("runtime.py", "Dispatcher"): WorkerStore,
    ("runtime.py", "Worker"): WorkerStore,
    ("runtime.py", "Sweeper"): MaintenanceStore,
    ("runtime.py", "Reconciler"): MaintenanceStore,
    ("runtime.py", "late_remote_id"): MaintenanceStore,  # the reconciler's probe for late evidence
    ("runtime.py", "late_remote_ids"): MaintenanceStore,  # its probe, also for a person's look-first
    ("runtime.py", "verify_remote_object"): OperatorStore,  # `resolve --published` in the CLI and the console
    ("runtime.py", "look_before_sending_again"): OperatorStore,  # `resend`, `resolve --not-sent`: CLI, console
    ("runtime.py", "_look_under_every_key"): OperatorStore,  # its helper
    ("runtime.py", "check_before_sending_again"): OperatorStore,  # both of the above, for the same moves
    ("runtime.py", "objects_on_record"): MaintenanceStore,  # late outcomes and the intent's id, for those moves
    ("runtime.py", "refuse_if_object_on_record"): OperatorStore,  # the same moves: an object already on record
    ("service.py", "*"): IntakeStore,
    ("aio.py", "*"): IntakeStore,
    ("audit.py", "*"): AuditStore,
    ("demo.py", "*"): IntakeStore,
    ("demo_rest.py", "*"): IntakeStore,
    ("worker.py", "*"): IntakeStore,
    ("main.py", "cmd_work"): IntakeStore,  # and it hands the store to the runtime, typed there
    ("main.py", "*"): OperatorStore,
    ("app.py", "*"): OperatorStore,
    ("queue.py", "*"): OperatorStore,
    ("settle.py", "*"): OperatorStore,
    **{(p.name, "*"): Store for p in MACHINES},
}

# (file, name): used on a store that is not any Store but a specific implementation, with the reason
NOT_PROTOCOL = {
    # `db upgrade` and `db grant-app-role` open an atmostonce_sql store themselves: SQL-only commands
    ("main.py", "engine"): "atmostonce_sql.SqlStore.engine",
    # the long-running worker LISTENs for due intents when its store is a SqlStore on PostgreSQL
    ("worker.py", "dialect"): "atmostonce_sql.SqlStore.dialect",
}

# members of a role's protocol that no shipped caller of that role takes, only the conformance machines, which
# drive every role: what an application's own code calls there (with why it belongs to that role)
MACHINES_ONLY: dict[type, dict[str, str]] = {
    IntakeStore: {
        "capture_source": "an application captures a source before it submits an intent resting on it",
        "source_head": "the version of a source captured last, which a new intent on it rests on",
    },
    OperatorStore: {
        "approval": "one approval by id, as the claim log names it",
        "claim_history": "the claim's own moves, without the refusals claim_log interleaves",
        "text_window_seconds": "the duplicate-text window in force: the stored one, else the store's default",
    },
    MaintenanceStore: {
        # the reconciler records its lookups in batches (reconcile_many); one lookup's record is its own move
        "reconcile_found": "one lookup that found the object, recorded alone",
        "reconcile_not_found": "one lookup that found nothing, recorded alone",
        "reconcile_unproven": "one fenced not-found that proves nothing after a restore, recorded alone",
        "reconcile_absent": "one fenced not-found that proves absence, recorded alone",
        "park_unreconcilable": "one intent no lookup can settle, parked alone",
    },
    AuditStore: {
        "total_attempts": "no move but begin creates an attempt",
        "current_epoch": "the restore epoch every lease and plan is fenced against",
    },
}

STORE_NAMES = {"store", "st_"}  # local names that always hold a store in these sources


def members(proto: type) -> set[str]:
    """Every member a protocol declares, its bases' included (methods and annotated attributes)."""
    names: set[str] = set()
    for cls in proto.__mro__:
        if cls is object or not getattr(cls, "_is_protocol", False) or cls.__module__ == "typing":
            continue
        names |= {n for n, v in vars(cls).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
        names |= {n for n in getattr(cls, "__annotations__", {}) if not n.startswith("_")}
    return names


def _is_store(node: ast.expr, lambda_stores: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in STORE_NAMES or node.id in lambda_stores
    return isinstance(node, ast.Attribute) and node.attr == "store"


def store_uses(path: Path) -> list[tuple[str, int, str]]:
    """``(top-level scope, line, member)`` of every store member the file takes."""
    tree = ast.parse(path.read_text("utf-8"))
    # the first parameter of a lambda handed to both(...): the machines run it on the model and the store
    lambda_stores: set[str] = set()
    out = []
    for lam in ast.walk(tree):
        # the JSON-case drivers: each operation is a `lambda s, a: s.<name>(...)` over the store under test
        if path.name == "drivers.py" and isinstance(lam, ast.Lambda) and [a.arg for a in lam.args.args] == ["s", "a"]:
            out += [
                ("<drivers>", n.lineno, n.attr)
                for n in ast.walk(lam.body)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "s"
            ]
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", getattr(call.func, "id", None)) == "both":
            for arg in call.args:
                if isinstance(arg, ast.Lambda) and arg.args.args:
                    lambda_stores.add(arg.args.args[0].arg)
    for top in tree.body:
        scope = getattr(top, "name", "*")
        for node in ast.walk(top):
            if (
                isinstance(node, ast.Attribute)
                and _is_store(node.value, lambda_stores)
                and not (node.attr.startswith("__") and node.attr.endswith("__"))
            ):
                out.append((scope, node.lineno, node.attr))
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "getattr"
                and len(node.args) >= 2
                and _is_store(node.args[0], lambda_stores)
                and isinstance(node.args[1], ast.Constant)
            ):
                out.append((scope, node.lineno, node.args[1].value))
    return out


def role_of(path: Path, scope: str) -> type | None:
    return CALLERS.get((path.name, scope), CALLERS.get((path.name, "*")))


def by_name() -> dict[type, set[str]]:
    """The moves each role reaches by an event name from the table, not by a written call."""
    from atmostonce_console.settle import SETTLE_MOVES

    t = table()
    return {
        # the dispatcher records a send's and a read-back's outcome with the event the table maps it to
        WorkerStore: {t.outcomes[o].event for o in t.late_outcomes},
        # the sweeper makes the lease-expiry move the table names for the intent's state
        MaintenanceStore: {e.name for e in t.events.values() if e.actor == "sweeper"},
        # the console's bulk settle makes the operator move it names
        OperatorStore: set(SETTLE_MOVES.values()),
    }


def uses_by_role() -> dict[type, set[str]]:
    out: dict[type, set[str]] = {r: set(names) for r, names in by_name().items()}
    for p in SOURCES:
        for scope, _line, name in store_uses(p):
            role = role_of(p, scope)
            if role is not None and (p.name, name) not in NOT_PROTOCOL:
                out.setdefault(role, set()).add(name)
    return out


def test_the_walk_finds_the_calls_it_is_meant_to_find():
    uses = {(scope, name) for p in SOURCES for scope, _, name in store_uses(p)}
    # the runtime (self.store), the approval-gated dispatch, a feature probe, the CLI (store), a machine's both()
    assert {
        ("Dispatcher", "begin"),
        ("Dispatcher", "reserve_claim"),
        ("Sweeper", "due_approvals"),
        ("cmd_approvals", "approvals"),
        ("create_app", "withdraw_approval"),
        ("make_claims_machine", "claim_log"),
        ("<drivers>", "current_epoch"),
    } <= uses


def test_every_caller_is_assigned_a_role():
    unassigned = sorted(
        f"{p.relative_to(ROOT)}:{line}: {scope} takes store.{name}"
        for p in SOURCES
        for scope, line, name in store_uses(p)
        if role_of(p, scope) is None
    )
    assert unassigned == []


def test_every_store_member_a_caller_uses_is_declared_on_the_protocol_of_its_role():
    missing = sorted(
        f"{p.relative_to(ROOT)}:{line}: {scope} takes store.{name}, not on {role.__name__}"
        for p in SOURCES
        for scope, line, name in store_uses(p)
        if (role := role_of(p, scope)) is not None and name not in members(role) and (p.name, name) not in NOT_PROTOCOL
    )
    assert missing == [], "declare these on the role's protocol (atmostonce.protocols):\n" + "\n".join(missing)


def test_every_move_a_role_reaches_by_name_is_declared_on_its_protocol():
    model = MemoryStore()
    for role, events in by_name().items():
        assert events and all(callable(getattr(model, e, None)) for e in events)
        assert sorted(events - members(role)) == [], role.__name__


def test_a_role_protocol_declares_nothing_its_callers_do_not_use():
    used = uses_by_role()
    unused = {
        role.__name__: sorted(members(role) - used.get(role, set()) - set(MACHINES_ONLY.get(role, {})))
        for role in ROLES
    }
    assert unused == {r.__name__: [] for r in ROLES}


def test_the_members_only_the_machines_take_are_taken_by_them():
    machine_uses = {name for p in MACHINES for _, _, name in store_uses(p)}
    for role, names in MACHINES_ONLY.items():
        assert set(names) <= members(role) and set(names) <= machine_uses, role.__name__


def test_store_is_the_union_of_the_role_protocols():
    assert members(Store) == set().union(*(members(r) for r in ROLES))
    assert members(OutboxStore) == members(IntakeStore) | members(WorkerStore) | members(MaintenanceStore)
    # neither declares a member of its own: each member belongs to a role that calls it
    for proto in (Store, OutboxStore):
        own = {n for n in vars(proto) if not n.startswith("_")} | set(vars(proto).get("__annotations__", {}))
        assert own == set(), proto.__name__


def test_the_implementations_provide_every_declared_member_and_their_core():
    from atmostonce_sql import SqlStore

    core = {n for n in vars(StoreCore) if not n.startswith("__") and callable(vars(StoreCore)[n])}
    assert {"_apply", "_create", "find"} <= core
    for impl in (MemoryStore, SqlStore):
        absent = sorted(
            n
            for n in members(Store) | core
            if not hasattr(impl, n) and n not in ("table", "approval_table", "claim_table")
        )
        assert absent == [], f"{impl.__name__} lacks {absent}"


def test_the_operations_define_no_primitive_for_a_store_to_override():
    # the operations call self.core; a hook defined on them (a stub raising NotImplementedError) would let a
    # store override it by name again
    core = {n for n in vars(StoreCore) if not n.startswith("__") and callable(vars(StoreCore)[n])}
    assert sorted(core & (set(vars(Operations)) | set(vars(ClaimOperations)))) == []


def test_the_operations_compose_over_a_core_object_they_do_not_inherit_from():
    import dataclasses

    import pytest

    from atmostonce.errors import GuardRefused

    model = MemoryStore()
    ops = Operations(model, model.table)
    it = ops.submit("acct", "post", "target", {"text": "hello"})
    lease = ops.begin(it.key)
    assert model.get(it.key).attempt_token == lease.attempt_token
    # a stale writer is refused by the core's guard, and the refusal lands in the core's log
    with pytest.raises(GuardRefused) as refused:
        ops.authorize_dispatch(
            dataclasses.replace(lease, attempt_token="forged-token"), request_digest=it.request_digest
        )
    assert refused.value.guard == "lease_holder"
    assert [r.guard for r in model.refusals(it.key)] == ["lease_holder"]


def test_a_core_that_does_not_batch_still_gets_the_sweepers_batch_moved_one_by_one():
    import dataclasses

    from atmostonce.names import EVENT, STATE
    from atmostonce.testing.stateful import FakeClock

    class Unbatched:  # the model's core with no _apply_batch, as a first store's core may be
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            if name == "_apply_batch":
                raise AttributeError(name)
            return getattr(self._inner, name)

    clock = FakeClock()
    model = MemoryStore(clock=clock)
    ops = Operations(Unbatched(model), model.table)
    keys = [ops.submit("acct", "post", f"target-{i}", {"text": f"t{i}"}).key for i in range(2)]
    leases = [ops.begin(k, lease_seconds=5) for k in keys]
    clock.advance(10)
    stale = dataclasses.replace(model.get(keys[1]), attempt_token="forged")
    got = ops.expire_leases([(EVENT.abandon_attempt, model.get(keys[0])), (EVENT.abandon_attempt, stale)])
    assert model.get(keys[0]).state == STATE.pending and got[0].key == keys[0]
    assert got[1].guard == "lease_holder" and model.get(keys[1]).attempt_token == leases[1].attempt_token
