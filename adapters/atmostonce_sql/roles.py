"""The application's PostgreSQL role: what a running store may do, and nothing more.

:func:`grant_app_role` gives a role (created beforehand by the DBA, e.g. ``CREATE ROLE app LOGIN
PASSWORD ...``) exactly what the store's operations need: ``SELECT, INSERT, UPDATE, DELETE`` on the
mutable tables (intents, policy, text claims, sources, counters), only ``SELECT, INSERT`` on the
append-only tables (:data:`~atmostonce_sql.schema.APPEND_ONLY_TABLES` and the claim history), only
``SELECT`` on ``aom_meta`` (the restore epoch: ``db declare-restore`` runs as the tables' owner) and on the
operator keys and signing policy (registered and switched by the owner),
never ``TRUNCATE``, no DDL, ``USAGE`` on the generation sequence and ``SELECT`` on the identity
sequences (the open check reads their positions). The append-only triggers stay as a second line; with
this role an ``UPDATE`` of history is refused by the privilege check before any trigger runs. Run
it as the tables' owner, after ``atmostonce db upgrade`` and again after later migrations.
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .schema import APPEND_ONLY_TABLES, CLAIM_HISTORY_TABLES, metadata
from .sequences import identity_columns

__all__ = ["APP_ROLE_TABLE_PRIVILEGES", "READ_ONLY_TABLES", "app_role_privileges", "grant_app_role"]

APP_ROLE_TABLE_PRIVILEGES = {
    "append_only": ("SELECT", "INSERT"),
    "read_only": ("SELECT",),
    "mutable": ("SELECT", "INSERT", "UPDATE", "DELETE"),
}

# tables the application only reads: the restore epoch is moved by ``db declare-restore``, run as the owner
READ_ONLY_TABLES = ("aom_meta", "aom_operator_keys", "aom_signing_policies")
"""Tables only an administrator (the tables' owner) writes: the restore epoch, the operators' public keys and
the signing policy; a writer of the last two could register a key in someone's name or switch signing off."""


def _kind(name: str) -> str:
    if name in APPEND_ONLY_TABLES or name in CLAIM_HISTORY_TABLES:
        return "append_only"
    return "read_only" if name in READ_ONLY_TABLES else "mutable"


_ROLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$-]{0,62}$")


def app_role_privileges() -> dict[str, tuple[str, ...]]:
    """Table name -> the privileges the application role is granted on it."""
    return {t.name: APP_ROLE_TABLE_PRIVILEGES[_kind(t.name)] for t in metadata.sorted_tables}


def grant_app_role(engine: Engine, role: str) -> dict[str, tuple[str, ...]]:
    """Grant ``role`` the store's privileges (and revoke anything else on the store's tables).

    Returns the table privileges granted. Raises ``ValueError`` on SQLite (no roles), for a
    malformed or unknown role name, or when ``role`` owns the tables (an owner bypasses grants).
    """
    if engine.dialect.name != "postgresql":
        raise ValueError("database roles are a PostgreSQL feature; SQLite has none to grant")
    if not isinstance(role, str) or not _ROLE.match(role):
        raise ValueError(f"not a plain role name: {role!r}")
    q = engine.dialect.identifier_preparer.quote
    who = q(role)
    granted = app_role_privileges()
    with engine.begin() as conn:
        if conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first() is None:
            raise ValueError(f"no role {role!r} in this cluster: create it first (CREATE ROLE {role} LOGIN ...)")
        owners = set(
            conn.execute(
                sa.text("SELECT tableowner FROM pg_tables WHERE schemaname = current_schema() AND tablename = ANY(:t)"),
                {"t": list(granted)},
            ).scalars()
        )
        if role in owners:
            raise ValueError(f"role {role!r} owns the store's tables; the application must use a role that does not")
        schema = conn.execute(sa.text("SELECT current_schema()")).scalar_one()
        conn.exec_driver_sql(f"GRANT USAGE ON SCHEMA {q(schema)} TO {who}")
        for name, privileges in granted.items():
            conn.exec_driver_sql(f"REVOKE ALL ON TABLE {q(name)} FROM {who}")
            conn.exec_driver_sql(f"GRANT {', '.join(privileges)} ON TABLE {q(name)} TO {who}")
        conn.exec_driver_sql(f"REVOKE ALL ON TABLE alembic_version FROM {who}")
        conn.exec_driver_sql(f"GRANT SELECT ON TABLE alembic_version TO {who}")  # open_store checks the revision
        conn.exec_driver_sql(f"GRANT USAGE ON SEQUENCE aom_generation TO {who}")
        # claim refusals draw from the claim log's identity sequence (migration 0007)
        seq = conn.execute(sa.text("SELECT pg_get_serial_sequence('aom_claim_history', 'seq')")).scalar_one()
        conn.exec_driver_sql(f"GRANT USAGE ON SEQUENCE {seq} TO {who}")
        # open_store compares every sequence's position with the stored data (pg_sequences shows a
        # position only to a role with SELECT or USAGE on the sequence); SELECT does not let it move one
        for name, table, column in identity_columns():
            if name == "generation":
                continue
            seq = conn.execute(sa.text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": table, "c": column}).scalar_one()
            conn.exec_driver_sql(f"GRANT SELECT ON SEQUENCE {seq} TO {who}")
    return granted
