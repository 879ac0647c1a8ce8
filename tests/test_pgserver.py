"""Tests for atmostonce_sql.pgserver against a real local PostgreSQL server."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest
import sqlalchemy

from atmostonce_sql import pgserver
from atmostonce_sql.pgserver import ClusterError, LocalCluster, PgBinariesNotFound, find_pg_bin

pytestmark = pytest.mark.postgres

ADAPTERS = Path(__file__).resolve().parents[1] / "adapters"


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster() as pg:
        yield pg


def _uid_of_pid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])  # real uid
    raise AssertionError(f"no Uid line for pid {pid}")


def _expected_server_uid() -> int:
    return pwd.getpwnam("postgres").pw_uid if os.geteuid() == 0 else os.geteuid()


def test_find_pg_bin_holds_the_server_binaries():
    folder = find_pg_bin()
    for name in ("initdb", "pg_ctl", "postgres"):
        assert (folder / name).is_file() and os.access(folder / name, os.X_OK)


def test_pg_bin_env_is_authoritative(monkeypatch, tmp_path):
    monkeypatch.setenv("PG_BIN", str(tmp_path))
    with pytest.raises(PgBinariesNotFound):
        find_pg_bin()
    monkeypatch.delenv("PG_BIN")
    real = find_pg_bin()
    monkeypatch.setenv("PG_BIN", str(real))
    assert find_pg_bin() == real


def test_version_matches_the_binaries(cluster):
    out = subprocess.run([str(cluster.pg_bin / "postgres"), "--version"], capture_output=True, text=True, check=True)
    major = next(tok for tok in out.stdout.split() if tok[0].isdigit()).split(".")[0]
    with psycopg.connect(cluster.dsn) as conn:
        version = conn.execute("SELECT version()").fetchone()[0]
        version_num = int(conn.execute("SHOW server_version_num").fetchone()[0])
    assert version.startswith(f"PostgreSQL {major}.")
    assert version_num // 10000 == int(major)
    assert version_num >= 150000


def test_defaults_are_fast_and_private(cluster):
    with psycopg.connect(cluster.dsn) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (
                    [
                        "fsync",
                        "synchronous_commit",
                        "full_page_writes",
                        "listen_addresses",
                        "max_connections",
                        "shared_buffers",
                        "block_size",
                        "port",
                        "unix_socket_directories",
                    ],
                ),
            ).fetchall()
        )
    assert settings["fsync"] == "off"
    assert settings["synchronous_commit"] == "off"
    assert settings["full_page_writes"] == "off"
    assert settings["listen_addresses"] == ""
    assert settings["max_connections"] == "200"
    assert int(settings["shared_buffers"]) * int(settings["block_size"]) == 128 * 1024 * 1024
    assert int(settings["port"]) == cluster.port
    assert settings["unix_socket_directories"] == str(cluster.socket_dir)
    assert (cluster.socket_dir / f".s.PGSQL.{cluster.port}").is_socket()


def test_server_runs_as_unprivileged_user(cluster):
    expected = _expected_server_uid()
    assert expected != 0
    with psycopg.connect(cluster.dsn) as conn:
        data_dir, backend_pid = conn.execute("SELECT current_setting('data_directory'), pg_backend_pid()").fetchone()
        assert _uid_of_pid(backend_pid) == expected  # while the connection (and so the backend) lives
    assert Path(data_dir) == cluster.data_dir
    assert Path(data_dir).stat().st_uid == expected
    postmaster = cluster.postmaster_pid()
    assert postmaster is not None and postmaster != backend_pid
    assert _uid_of_pid(postmaster) == expected
    assert cluster.os_user == pwd.getpwuid(expected).pw_name


def test_databases_are_independent(cluster):
    url_a = cluster.create_database("pgs_a")
    url_b = cluster.create_database("pgs_b")
    try:
        assert url_a.endswith(f"/pgs_a?host={cluster.socket_dir}&port={cluster.port}")
        assert sqlalchemy.make_url(url_b).database == "pgs_b"
        with psycopg.connect(cluster.dsn_for("pgs_a"), autocommit=True) as a:
            a.execute("CREATE TABLE only_in_a (id int PRIMARY KEY)")
            a.execute("INSERT INTO only_in_a VALUES (1)")
            assert a.execute("SELECT to_regclass('only_in_a') IS NOT NULL").fetchone()[0] is True
        with psycopg.connect(cluster.dsn_for("pgs_b"), autocommit=True) as b:
            assert b.execute("SELECT current_database()").fetchone()[0] == "pgs_b"
            assert b.execute("SELECT to_regclass('only_in_a') IS NULL").fetchone()[0] is True
            with pytest.raises(psycopg.errors.UndefinedTable):
                b.execute("SELECT * FROM only_in_a")
        with pytest.raises(psycopg.errors.DuplicateDatabase):
            cluster.create_database("pgs_a")
    finally:
        cluster.drop_database("pgs_a")
        cluster.drop_database("pgs_b")
    with psycopg.connect(cluster.dsn) as conn:
        names = {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}
    assert not names & {"pgs_a", "pgs_b"}
    cluster.drop_database("pgs_a")  # missing is no error


def test_create_from_template_copies_schema(cluster):
    cluster.create_database("pgs_tmpl")
    try:
        with psycopg.connect(cluster.dsn_for("pgs_tmpl"), autocommit=True) as t:
            t.execute("CREATE TABLE seeded (v text)")
            t.execute("INSERT INTO seeded VALUES ('x')")
        cluster.create_database("pgs_copy", template="pgs_tmpl")
        with psycopg.connect(cluster.dsn_for("pgs_copy")) as c:
            assert c.execute("SELECT v FROM seeded").fetchall() == [("x",)]
    finally:
        cluster.drop_database("pgs_copy")
        cluster.drop_database("pgs_tmpl")


def test_url_works_with_sqlalchemy(cluster):
    engine = sqlalchemy.create_engine(cluster.url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sqlalchemy.text("SELECT current_user")).scalar() == "postgres"
            assert conn.execute(sqlalchemy.text("SELECT inet_server_addr()")).scalar() is None  # unix socket
    finally:
        engine.dispose()


def test_fsync_on_and_stop_removes_everything():
    pg = LocalCluster(fsync=True).start()
    directory, dsn = pg.directory, pg.dsn
    try:
        assert pg.startup_seconds is not None and pg.startup_seconds < 30
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SHOW fsync").fetchone()[0] == "on"
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
            assert conn.execute("SHOW full_page_writes").fetchone()[0] == "off"
    finally:
        pg.stop()
    assert not directory.exists()
    assert not pg.is_running()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)
    pg.stop()  # idempotent


def test_non_empty_foreign_directory_is_refused():
    target = Path("/tmp") / f"pgs-refuse-{os.getpid()}"
    target.mkdir()
    try:
        (target / "unrelated.txt").write_text("keep me")
        with pytest.raises(ClusterError, match="not empty"):
            LocalCluster(target).start()
        assert (target / "unrelated.txt").read_text() == "keep me"
    finally:
        (target / "unrelated.txt").unlink()
        target.rmdir()


def test_cli_start_url_stop():
    target = Path("/tmp") / f"pgs-cli-{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ADAPTERS), os.environ.get("PYTHONPATH", "")])}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "atmostonce_sql.pgserver", *args, "--dir", str(target)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    started = cli("start")
    try:
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip()
        assert url.startswith("postgresql+psycopg://postgres@/postgres?host=")
        # the server outlives the CLI process
        again = cli("start")
        assert again.returncode == 0 and again.stdout.strip() == url
        assert cli("url").stdout.strip() == url
        dsn = cli("url", "--dsn").stdout.strip()
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SHOW fsync").fetchone()[0] == "off"
        assert LocalCluster.attach(target).url == url
    finally:
        stopped = cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not target.exists()
    missing = cli("url")
    assert missing.returncode == 1 and "error:" in missing.stderr


def test_postgres_url_for_tests_prefers_database_url(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://u:p@db.example:5432/x")
    url, cleanup = pgserver.postgres_url_for_tests()
    assert url == "postgresql+psycopg://u:p@db.example:5432/x"
    cleanup()


def test_postgres_url_for_tests_falls_back_to_local_cluster(monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setattr(pgserver, "_docker_available", lambda timeout=5.0: False)
    url, cleanup = pgserver.postgres_url_for_tests()
    try:
        engine = sqlalchemy.create_engine(url)
        with engine.connect() as conn:
            assert conn.execute(sqlalchemy.text("SHOW fsync")).scalar() == "off"
        engine.dispose()
    finally:
        cleanup()
    host = sqlalchemy.make_url(url).query["host"]
    assert not Path(host).exists()
    cleanup()  # safe twice


@pytest.mark.parametrize("room", ["enough", "too little"])
def test_the_test_cluster_lives_in_memory_when_there_is_room_and_on_disk_otherwise(monkeypatch, room):
    memory = Path(tempfile.mkdtemp(prefix="shm-", dir="/tmp"))  # reachable by the server's OS user
    memory.chmod(0o1777)  # as /dev/shm
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setattr(pgserver, "_docker_available", lambda timeout=5.0: False)
    monkeypatch.setattr(pgserver, "_MEMORY_FOLDER", memory)
    if room == "too little":
        monkeypatch.setattr(pgserver, "_MEMORY_FOLDER_MIN_FREE", 1 << 62)
    url, cleanup = pgserver.postgres_url_for_tests()
    try:
        engine = sqlalchemy.create_engine(url)
        with engine.connect() as conn:
            data = Path(conn.execute(sqlalchemy.text("SHOW data_directory")).scalar())
            assert conn.execute(sqlalchemy.text("SHOW fsync")).scalar() == "off"
        engine.dispose()
        assert (memory in data.parents) == (room == "enough")
    finally:
        cleanup()
        shutil.rmtree(memory, ignore_errors=True)
    assert not data.exists()
