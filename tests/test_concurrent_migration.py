"""Opening a new database from several processes, threads or async tasks at once migrates it once
(``atmostonce_sql.migrate.upgrade``): workers started together on an empty database must not fail on each
other's half-built schema, and Alembic's per-process globals must not mix two migrations."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psycopg
import pytest

from atmostonce_sql import open_store
from atmostonce_sql.migrate import MIGRATION_LOCK_KEY, current_revision
from tests.helpers import empty_database_url


def _head() -> str:
    from atmostonce_sql.migrate import _known_revisions

    head = _known_revisions()[1]
    assert head is not None
    return head


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _waiting_for_the_migration_lock(admin: psycopg.Connection) -> int:
    key = MIGRATION_LOCK_KEY
    row = admin.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = %s AND objid = %s",
        ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.postgres
def test_processes_opening_a_new_postgresql_database_together_wait_for_one_migration(request, tmp_path):
    """Three processes open an empty database while the migration lock is held: all three wait on it, then each
    opens the database the first one migrated (none fails on a table another created)."""
    url, cleanup = empty_database_url(request, "postgresql", tmp_path)
    script = "import sys, atmostonce_sql; atmostonce_sql.open_store(sys.argv[1]).close()"
    try:
        with psycopg.connect(_libpq(url), autocommit=True) as admin:
            admin.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
            procs = [
                subprocess.Popen([sys.executable, "-c", script, url], stderr=subprocess.PIPE, text=True)
                for _ in range(3)
            ]
            try:
                deadline = time.monotonic() + 120
                while _waiting_for_the_migration_lock(admin) < 3 and time.monotonic() < deadline:
                    if any(p.poll() is not None for p in procs):
                        break
                    time.sleep(0.05)
                waiting = _waiting_for_the_migration_lock(admin)
            finally:
                admin.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
                results = [(p.wait(120), p.stderr.read() if p.stderr else "") for p in procs]
        assert waiting == 3
        assert results == [(0, "")] * 3
        with open_store(url, migrate=False) as store:
            assert current_revision(store.engine) == _head()
    finally:
        if cleanup is not None:
            cleanup()


def test_threads_migrating_different_databases_at_once_each_get_the_whole_schema(tmp_path):
    """Alembic keeps the running migration in module globals: four threads, each opening its own new SQLite
    database, all end at the newest revision with a working store."""
    urls = [f"sqlite:///{tmp_path / f'db{i}.sqlite3'}" for i in range(4)]
    barrier = threading.Barrier(len(urls))
    errors: list[BaseException] = []

    def open_one(url: str) -> None:
        barrier.wait()
        try:
            open_store(url).close()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(u,)) for u in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    for url in urls:
        with open_store(url, migrate=False) as store:
            assert current_revision(store.engine) == _head()
            assert store.list_intents() == []
