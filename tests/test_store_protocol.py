"""The ``Store`` protocol lists every store method a caller uses (docs/design.md#the-outbox-service): a third-party store written to the
protocol must not fail at its first approval-gated dispatch because the runtime calls a method it never heard of.

The test reads the sources (ast) of the runtime, the service (and its asyncio front), the CLI, the audit and the conformance machines
(the stateful machines and the JSON-case drivers) and collects each attribute taken on a store: ``store.<name>``,
``self.store.<name>``, ``<anything>.store.<name>``, ``st_.<name>`` and the store parameter of the lambdas the
machines run on both stores (``self.both(lambda s, ...: s.<name>(...))``). Every name must be declared on
:class:`atmostonce.store.Store`. It also checks the moves the runtime reaches by name from the table (an
outcome's event, the sweeper's events)."""

from __future__ import annotations

import ast
from pathlib import Path

from atmostonce import MemoryStore, Store, table

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "reference" / "atmostonce"
SOURCES = [
    CORE / "runtime.py",
    CORE / "service.py",
    CORE / "aio.py",
    CORE / "audit.py",
    *sorted((ROOT / "adapters" / "atmostonce_cli").glob("*.py")),
    *sorted((CORE / "testing").glob("*.py")),
    *sorted((CORE / "conformance").glob("*.py")),
]

# (file, name): used on a store that is not any Store but a specific implementation, with the reason
NOT_PROTOCOL = {
    # `db upgrade` and `db grant-app-role` open an atmostonce_sql store themselves: SQL-only commands
    ("main.py", "engine"): "atmostonce_sql.SqlStore.engine",
}
STORE_NAMES = {"store", "st_"}  # local names that always hold a store in these sources


def declared() -> set[str]:
    names = {n for n in dir(Store) if not n.startswith("__")}
    return names | set(getattr(Store, "__annotations__", {}))


def _is_store(node: ast.expr, lambda_stores: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in STORE_NAMES or node.id in lambda_stores
    return isinstance(node, ast.Attribute) and node.attr == "store"


def store_uses(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text("utf-8"))
    # the first parameter of a lambda handed to both(...): the machines run it on the model and the store
    lambda_stores: set[str] = set()
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", getattr(call.func, "id", None)) == "both":
            for arg in call.args:
                if isinstance(arg, ast.Lambda) and arg.args.args:
                    lambda_stores.add(arg.args.args[0].arg)
    return [
        (node.lineno, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and _is_store(node.value, lambda_stores)
        and not (node.attr.startswith("__") and node.attr.endswith("__"))
    ]


def test_the_walk_finds_the_calls_it_is_meant_to_find():
    uses = {name for p in SOURCES for _, name in store_uses(p)}
    # one each: the runtime (self.store), the approval-gated dispatch, the CLI (store), a machine's both() lambda
    assert {"begin", "reserve_claim", "approvals", "withdraw_approval", "claim_log"} <= uses


def test_every_store_method_a_caller_uses_is_declared_on_the_protocol():
    names = declared()
    missing = sorted(
        f"{p.relative_to(ROOT)}:{line}: store.{name}"
        for p in SOURCES
        for line, name in store_uses(p)
        if name not in names and (p.name, name) not in NOT_PROTOCOL
    )
    assert missing == [], "declare these on atmostonce.store.Store:\n" + "\n".join(missing)


def test_every_move_the_runtime_reaches_by_name_is_declared():
    t, names, model = table(), declared(), MemoryStore()
    by_name = {o.event for o in t.outcomes.values() if o.event} | {
        e.name for e in t.events.values() if e.actor == "sweeper"
    }
    # events the store carries out inside another method (the restore fence inside declare_restore) are no method
    methods = {e for e in by_name if callable(getattr(model, e, None))}
    assert methods and sorted(methods - names) == []


def test_the_implementations_provide_every_declared_method():
    from atmostonce_sql import SqlStore

    for impl in (MemoryStore, SqlStore):
        absent = sorted(n for n in declared() if not n.startswith("_") and n != "table" and not hasattr(impl, n))
        assert absent == [], f"{impl.__name__} lacks {absent}"
