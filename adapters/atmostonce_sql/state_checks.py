"""``CHECK (state IN (...))`` on every column that holds a state, generated from the tables (docs/design.md,
"One table, read by everything"): a write of a state ``spec/table.toml`` (or ``spec/claim.toml``,
``spec/approval.toml``) does not declare is refused by the database, whoever writes it.

PostgreSQL gets named ``CHECK`` constraints (``ALTER TABLE ... ADD CONSTRAINT``); SQLite cannot add a
constraint to an existing table, so it gets ``BEFORE INSERT`` / ``BEFORE UPDATE OF`` triggers that abort with
the same name, the way the append-only rules are kept there (:mod:`atmostonce_sql.append_only`).

Migration 0013 applies what :func:`state_check_statements` gives for the tables as they were then; a table
change that adds or renames a state needs a migration that drops and re-adds these (a test compares the
database's constraints with what the current tables give, so a forgotten one fails).
"""

from __future__ import annotations

from dataclasses import dataclass

from atmostonce.table import Table, machine, table

__all__ = ["STATE_COLUMNS", "StateCheck", "state_check_statements", "state_checks"]


@dataclass(frozen=True)
class StateCheck:
    """One state column's rule: ``name`` (the constraint, or the SQLite triggers' prefix), the SQL ``table`` and
    ``column``, the ``machine`` whose states it holds (``intent``, ``claim``, ``approval``, or ``None``: the row's
    ``machine`` column says), and the ``condition`` every row must meet (true or NULL passes, as for any
    ``CHECK``)."""

    name: str
    table: str
    column: str
    machine: str | None
    condition: str


STATE_COLUMNS: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("aom_intents", ("state", "prev_state"), "intent"),
    ("aom_history", ("from_state", "to_state"), "intent"),
    ("aom_claims", ("state",), "claim"),
    ("aom_approvals", ("state",), "approval"),
    ("aom_claim_history", ("from_state", "to_state"), None),  # a row per machine: its ``machine`` column says which
)
"""``(SQL table, state columns, machine)``: ``intent`` is ``spec/table.toml``; ``None`` holds either auxiliary
machine's states, selected by the row's ``machine`` column."""


def _in(column: str, t: Table) -> str:
    return f"{column} IN ({', '.join(_quote(s) for s in t.states)})"


def _condition(column: str, which: str | None, row: str = "") -> str:
    if which is None:
        return " OR ".join(
            f"({row}machine = {_quote(m)} AND {_in(row + column, machine(m))})" for m in ("claim", "approval")
        )
    return _in(row + column, table() if which == "intent" else machine(which))


def _quote(name: str) -> str:
    if not name.replace("_", "").isalnum():  # the table schema allows [a-z][a-z0-9_]* only
        raise ValueError(f"not a state name: {name!r}")
    return f"'{name}'"


def state_checks() -> tuple[StateCheck, ...]:
    """Every state column's rule, from the tables this process loads."""
    return tuple(
        StateCheck(f"{sql_table}_{column}_declared", sql_table, column, which, _condition(column, which))
        for sql_table, columns, which in STATE_COLUMNS
        for column in columns
    )


def state_check_statements(dialect: str) -> list[str]:
    """The DDL that adds every :func:`state_checks` rule on ``dialect`` (``postgresql`` or ``sqlite``)."""
    out = []
    for c in state_checks():
        if dialect == "postgresql":
            out.append(f"ALTER TABLE {c.table} ADD CONSTRAINT {c.name} CHECK ({c.condition})")
            continue
        refuse = f"SELECT RAISE(ABORT, 'CHECK constraint failed: {c.name}')"
        allowed = _condition(c.column, c.machine, row="NEW.")
        for when, what in (("INSERT", "insert"), (f"UPDATE OF {c.column}", "update")):
            out.append(
                f"CREATE TRIGGER {c.name}_{what} BEFORE {when} ON {c.table} "
                f"WHEN NOT (NEW.{c.column} IS NULL OR {allowed}) BEGIN {refuse}; END"
            )
    return out
