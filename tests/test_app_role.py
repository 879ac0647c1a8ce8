"""The application's PostgreSQL role (issue 5): real store operations succeed as that role, and every
append-only table refuses UPDATE, DELETE and TRUNCATE by privilege, before any trigger runs."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from atmostonce import GuardRefused
from atmostonce.audit import verify_store
from atmostonce_cli.main import main
from atmostonce_sql import grant_app_role, open_store
from atmostonce_sql.schema import APPEND_ONLY_TABLES, metadata
from tests.helpers import to_state

pytestmark = pytest.mark.postgres


@pytest.fixture
def app(pg_databases, capsys):
    """A fresh database, a new login role granted through the CLI, and a store connected as that role."""
    url = pg_databases.fresh()
    role = f"aom_app_{uuid.uuid4().hex[:8]}"
    with pg_databases.admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN PASSWORD 'app-secret'")
    rc = main(["--json", "db", "grant-app-role", role, "--database-url", url])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["role"] == role
    app_url = make_url(url).set(username=role, password="app-secret").render_as_string(hide_password=False)
    store = open_store(app_url, pool_size=2)  # migrate=True: at head already, it only reads alembic_version
    yield store, role, url, app_url
    store.close()
    pg_databases.drop(url)
    with pg_databases.admin.connect() as conn:
        conn.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")


def test_the_application_role_runs_the_store(app):
    store, role, _, _ = app
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT current_user").scalar_one() == role
    published, _ = to_state(store, "published", text="one")
    failed, _ = to_state(store, "failed", text="two")
    store.retry(failed.key)
    unknown, _ = to_state(store, "indeterminate", text="three")
    plan = store.get(unknown.key).plan
    store.reconcile_not_found(plan)
    with pytest.raises(GuardRefused):  # a stale plan is refused, and the refusal row is written
        store.reconcile_not_found(plan)
    assert [r.guard for r in store.refusals(unknown.key)] == ["plan_unchanged"]
    store.reconcile_found(store.get(unknown.key).plan, remote_id="r-3")
    parked, _ = to_state(store, "parked", text="four")
    store.resolve_not_sent(parked.key, operator="alice")
    store.set_kill_switch("account:acct", True, operator="alice")
    store.set_kill_switch("account:acct", False, operator="alice")
    store.set_credential_version("acct", "v2")
    store.capture_source("https://example.org/a", "body")
    assert store.declare_restore(operator="alice")[0] == 2
    assert store.get(published.key).state == "published"
    assert verify_store(store).intact


def _as_app(app_url: str, sql: str) -> psycopg.errors.Error:
    dsn = make_url(app_url).set(drivername="postgresql")
    with psycopg.connect(dsn.render_as_string(hide_password=False), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
            conn.execute(sql)
    return e.value


@pytest.mark.parametrize("table", APPEND_ONLY_TABLES)
def test_every_append_only_table_refuses_update_delete_truncate_by_privilege(app, table):
    store, role, _, app_url = app
    to_state(store, "published")
    column = next(iter(metadata.tables[table].c)).name
    for sql in (f"UPDATE {table} SET {column} = {column}", f"DELETE FROM {table}", f"TRUNCATE {table}"):
        err = _as_app(app_url, sql)
        assert f"permission denied for table {table}" in str(err), (sql, str(err))  # the grant, not the trigger


def test_the_role_has_exactly_the_granted_table_privileges(app, pg_databases):
    _, role, url, _ = app
    engine = sa.create_engine(make_url(url).set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT table_name, privilege_type FROM information_schema.role_table_grants WHERE grantee = :r"
                ),
                {"r": role},
            ).all()
    finally:
        engine.dispose()
    got: dict[str, set[str]] = {}
    for t, p in rows:
        got.setdefault(t, set()).add(p)
    for t in APPEND_ONLY_TABLES:
        assert got[t] == {"SELECT", "INSERT"}
    assert got["aom_intents"] == {"SELECT", "INSERT", "UPDATE", "DELETE"}
    assert got["alembic_version"] == {"SELECT"}
    assert not any("TRUNCATE" in p for p in got.values())


def test_grant_refuses_sqlite_and_unknown_roles(sqlite_store, pg_store):
    with pytest.raises(ValueError, match="PostgreSQL"):
        grant_app_role(sqlite_store.engine, "app")
    with pytest.raises(ValueError, match="no role"):
        grant_app_role(pg_store.engine, "aom_nobody_here")
    with pytest.raises(ValueError, match="plain role name"):
        grant_app_role(pg_store.engine, "x; DROP TABLE aom_intents")
