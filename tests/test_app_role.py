"""The application's PostgreSQL role (docs/design.md#the-audit-order-tamper-evidence-the-role-reconciliation-records): real store operations succeed as that role, and every
append-only table refuses UPDATE, DELETE and TRUNCATE by privilege, before any trigger runs."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from atmostonce import AppendOnlyViolation, GuardRefused, StoreError
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
    store.set_credential_version("acct", "v2", operator="bob")
    store.set_text_window(600, operator="bob")  # the stored window (aom_settings) and the policy log
    assert [(c.kind, c.operator) for c in store.policy_changes()][:2] == [
        ("text_window_seconds", "bob"),
        ("credentials", "bob"),
    ]
    store.capture_source("https://example.org/a", "body")
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
    assert got["aom_claim_history"] == {"SELECT", "INSERT"}
    assert got["aom_meta"] == {"SELECT"}
    assert got["alembic_version"] == {"SELECT"}
    assert not any("TRUNCATE" in p for p in got.values())


def test_grant_refuses_sqlite_and_unknown_roles(sqlite_store, pg_store):
    with pytest.raises(ValueError, match="PostgreSQL"):
        grant_app_role(sqlite_store.engine, "app")
    with pytest.raises(ValueError, match="no role"):
        grant_app_role(pg_store.engine, "aom_nobody_here")
    with pytest.raises(ValueError, match="plain role name"):
        grant_app_role(pg_store.engine, "x; DROP TABLE aom_intents")


def _as_app_refused(app_url: str, sql: str) -> psycopg.errors.Error:
    dsn = make_url(app_url).set(drivername="postgresql")
    with psycopg.connect(dsn.render_as_string(hide_password=False), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.Error) as e:
            conn.execute(sql)
    return e.value


def test_the_application_role_cannot_move_an_intent_off_the_table_or_remove_it(app):
    store, _, _, app_url = app
    unknown, _ = to_state(store, "indeterminate")
    err = _as_app_refused(app_url, f"UPDATE aom_intents SET state = 'pending' WHERE key = '{unknown.key}'")
    assert isinstance(err, psycopg.errors.IntegrityConstraintViolation)  # the table's move guard
    err = _as_app_refused(app_url, f"DELETE FROM aom_intents WHERE key = '{unknown.key}'")
    assert isinstance(err, psycopg.errors.IntegrityConstraintViolation)
    assert store.get(unknown.key).state == "indeterminate"
    assert verify_store(store).intact


def test_the_application_role_cannot_change_the_restore_epoch_or_claim_history(app):
    store, _, url, app_url = app
    for sql in (
        "UPDATE aom_meta SET value = 7",
        "DELETE FROM aom_meta",
        "UPDATE aom_claim_history SET actor = 'x'",
        "DELETE FROM aom_claim_history",
    ):
        assert isinstance(_as_app_refused(app_url, sql), psycopg.errors.InsufficientPrivilege), sql
    with pytest.raises(StoreError):  # declare-restore is the owner's command
        store.declare_restore(operator="alice")
    assert store.current_epoch() == 1
    assert main(["db", "declare-restore", "--operator", "alice", "--database-url", url]) == 0  # as the owner
    assert store.current_epoch() == 2


def test_the_application_role_cannot_register_keys_or_switch_signing(app):
    """Signed approvals (docs/design.md#signed-approvals): a database writer with the application's
    role can neither add a key of its own nor switch an account's signing policy off."""
    from atmostonce.signing import key_id, new_private_key, public_key_hex

    store, _, url, app_url = app
    public = public_key_hex(new_private_key())
    owner = open_store(url)
    try:
        owner.add_operator_key("alice", public, added_by="admin")
        owner.set_signing_required("acct", True)
    finally:
        owner.close()
    for sql in (
        f"INSERT INTO aom_operator_keys VALUES ('k-forged', 'mallory', '{public}', 'mallory', 0)",
        "UPDATE aom_operator_keys SET operator = 'mallory'",
        "DELETE FROM aom_operator_keys",
        "INSERT INTO aom_signing_policies VALUES ('other', false)",
        "UPDATE aom_signing_policies SET required = false",
        "DELETE FROM aom_signing_policies",
    ):
        assert isinstance(_as_app_refused(app_url, sql), psycopg.errors.InsufficientPrivilege), sql
    with pytest.raises(StoreError):  # the store refuses too: registering keys is the owner's command
        store.add_operator_key("mallory", public_key_hex(new_private_key()), added_by="mallory")
    assert store.operator_key(key_id(public)).operator == "alice"
    assert store.signing_required("acct") is True


def test_a_privilege_refusal_through_the_store_is_not_reported_as_the_append_only_trigger(app):
    """The grant refuses with SQLSTATE 42501 before the trigger runs: the store reports a plain StoreError,
    and only the trigger's own code (AOM02, migration 0014) becomes AppendOnlyViolation."""
    store, _, _, _ = app
    to_state(store, "published")
    with pytest.raises(StoreError) as e:
        with store._tx() as conn:
            conn.exec_driver_sql("DELETE FROM aom_history")
    assert not isinstance(e.value, AppendOnlyViolation)
    assert e.value.__cause__ is not None and e.value.__cause__.orig.sqlstate == "42501"
