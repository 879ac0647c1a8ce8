"""A database migrated by a newer atmostonce is refused, not migrated and not used (docs/operations.md,
"Upgrading"): during a rolling upgrade an older worker or CLI meets a schema whose columns, triggers or guards it
does not know. ``SchemaNewer`` (a ``StoreError``) names the database's revision and the newest this version knows;
the CLI exits 3 with it under ``schema_newer``; a worker exits 3 at once instead of waiting for the database."""

from __future__ import annotations

import json

import pytest

from atmostonce import SchemaNewer, StoreError
from atmostonce_cli.main import main as cli
from atmostonce_sql import open_store
from atmostonce_sql.migrate import current_revision, upgrade
from tests.helpers import submit
from tests.worker_proc import WorkerProcess, write_config

NEWER = "9999_from_a_newer_version"


def _head() -> str:
    from alembic.script import ScriptDirectory

    from atmostonce_sql.migrate import alembic_config

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def _stamp(store, revision: str) -> None:
    """What a newer atmostonce's migration leaves: its own revision in ``alembic_version``."""
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE alembic_version SET version_num = '{revision}'")


def _url(store) -> str:
    return store.engine.url.render_as_string(hide_password=False)


@pytest.mark.parametrize("migrate", [True, False])
def test_a_schema_a_newer_version_migrated_is_refused_naming_both_revisions_and_left_as_it_is(sql_store, migrate):
    it = submit(sql_store)
    _stamp(sql_store, NEWER)
    try:
        with pytest.raises(SchemaNewer) as refused:
            open_store(_url(sql_store), migrate=migrate)
        exc = refused.value
        assert isinstance(exc, StoreError)
        assert (exc.found, exc.known, exc.repair) == (NEWER, _head(), SchemaNewer.REPAIR)
        assert current_revision(sql_store.engine) == NEWER  # nothing migrated
        with pytest.raises(SchemaNewer):
            upgrade(sql_store.engine)
        assert current_revision(sql_store.engine) == NEWER
    finally:
        _stamp(sql_store, _head())
    assert sql_store.get(it.key).state == "pending"  # the data untouched


def test_every_cli_command_refuses_it_with_exit_3_and_the_structured_fields(sql_store, capsys):
    _stamp(sql_store, NEWER)
    try:
        for argv in (["intents", "list"], ["db", "upgrade"]):
            assert cli(["--json", *argv, "--database-url", _url(sql_store)]) == 3, argv
            doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
            assert doc["schema_newer"] == {"found": NEWER, "known": _head(), "repair": SchemaNewer.REPAIR}, argv
    finally:
        _stamp(sql_store, _head())


def test_a_worker_on_it_exits_3_at_once_instead_of_waiting_for_the_database(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'outbox.sqlite3'}"
    assert cli(["db", "upgrade", "--database-url", url]) == 0
    with open_store(url, migrate=False) as store:
        _stamp(store, NEWER)
    w = WorkerProcess(write_config(tmp_path / "w.toml", url, "http://127.0.0.1:9"))
    try:
        rc = w.proc.wait(60)
    finally:
        w.close()
    assert rc == 3
    assert w.events("worker.store_unreachable") == [] and w.events("worker.start") == []
