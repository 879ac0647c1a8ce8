"""Which database a CLI command acts on (docs/operations.md): ``$ATMOSTONCE_DATABASE_URL`` when ``--database-url`` is
absent, for every command; ``db upgrade`` names it (password hidden); commands that only read or work on
existing intents never create a SQLite file from a mistyped path."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.engine import make_url

from atmostonce_cli.main import EXIT_OK, EXIT_STORE, main
from atmostonce_cli.urls import display_url
from atmostonce_sql import open_store
from tests.helpers import to_state


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """The current folder is an empty one, so a command that fell back to ./atmostonce.sqlite3 shows there."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_db_upgrade_uses_the_environment_url_and_names_it(capsys, tmp_path, elsewhere, monkeypatch):
    target = tmp_path / "from-env.sqlite3"
    url = f"sqlite:///{target}"
    monkeypatch.setenv("ATMOSTONCE_DATABASE_URL", url)
    rc, out, _ = run(capsys, "--json", "db", "upgrade")
    data = json.loads(out)
    assert rc == EXIT_OK and data["database"] == url and data["revision"]
    assert target.exists() and list(elsewhere.iterdir()) == []
    rc, out, _ = run(capsys, "db", "upgrade")
    assert rc == EXIT_OK and url in out


def test_an_explicit_database_url_wins_over_the_environment(capsys, tmp_path, elsewhere, monkeypatch):
    monkeypatch.setenv("ATMOSTONCE_DATABASE_URL", f"sqlite:///{tmp_path / 'env.sqlite3'}")
    url = f"sqlite:///{tmp_path / 'flag.sqlite3'}"
    rc, out, _ = run(capsys, "--json", "db", "upgrade", "--database-url", url)
    assert rc == EXIT_OK and json.loads(out)["database"] == url
    assert not (tmp_path / "env.sqlite3").exists()


def test_every_database_command_reads_the_environment_url(capsys, tmp_path, elsewhere, monkeypatch):
    url = f"sqlite:///{tmp_path / 'env.sqlite3'}"
    store = open_store(url)
    it, _ = to_state(store, "indeterminate")
    store.close()
    monkeypatch.setenv("ATMOSTONCE_DATABASE_URL", url)
    rc, out, _ = run(capsys, "--json", "intents", "list")
    assert rc == EXIT_OK and [d["key"] for d in json.loads(out)["intents"]] == [it.key]
    rc, out, _ = run(capsys, "--json", "intents", "show", it.key)
    assert rc == EXIT_OK and json.loads(out)["intent"]["key"] == it.key
    rc, out, _ = run(capsys, "--json", "audit", "verify")
    assert rc == EXIT_OK and json.loads(out)["intents"] == 1
    rc, out, _ = run(capsys, "--json", "park", it.key, "--operator", "alice")
    assert rc == EXIT_OK and json.loads(out)["key"] == it.key
    assert list(elsewhere.iterdir()) == []


def test_grant_app_role_reads_the_environment_url(capsys, tmp_path, elsewhere, monkeypatch):
    url = f"sqlite:///{tmp_path / 'env.sqlite3'}"
    open_store(url).close()
    monkeypatch.setenv("ATMOSTONCE_DATABASE_URL", url)
    rc, out, err = run(capsys, "--json", "db", "grant-app-role", "app")
    assert rc == 2 and "PostgreSQL" in json.loads(out)["error"]  # it opened the SQLite file from the environment
    assert list(elsewhere.iterdir()) == []


def test_display_url_hides_only_the_password():
    assert display_url("postgresql://app:s3cret@db.example:5433/prod") == "postgresql://app:***@db.example:5433/prod"
    assert display_url("postgresql://app@db/prod?host=/run/pg") == "postgresql://app@db/prod?host=/run/pg"
    assert display_url("sqlite:////var/lib/a.sqlite3") == "sqlite:////var/lib/a.sqlite3"


@pytest.mark.postgres
def test_db_upgrade_and_grant_app_role_on_postgresql_from_the_environment(capsys, pg_databases, monkeypatch):
    import uuid

    url = pg_databases.fresh()
    secret = "hunter2-" + uuid.uuid4().hex[:6]
    with_password = make_url(url).set(password=secret).render_as_string(hide_password=False)
    role = f"aom_app_{uuid.uuid4().hex[:8]}"
    with pg_databases.admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
    try:
        monkeypatch.setenv("ATMOSTONCE_DATABASE_URL", with_password)
        rc, out, err = run(capsys, "--json", "db", "upgrade")
        data = json.loads(out)
        assert rc == EXIT_OK and secret not in out + err
        assert make_url(data["database"]).database == make_url(url).database
        assert make_url(data["database"]).password == "***"
        rc, out, err = run(capsys, "--json", "db", "grant-app-role", role)
        data = json.loads(out)
        assert rc == EXIT_OK and data["role"] == role and data["tables"] and secret not in out + err
        assert make_url(data["database"]).database == make_url(url).database
    finally:
        pg_databases.drop(url)
        with pg_databases.admin.connect() as conn:
            conn.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")


READS = [
    ("intents", "list"),
    ("intents", "show", "0123456789abcdef"),
    ("audit", "verify"),
    ("approvals", "0123456789abcdef"),
    ("claim", "show", "room-1"),
    ("sweep",),
    ("retry", "0123456789abcdef", "--operator", "alice"),
    ("park", "0123456789abcdef", "--operator", "alice"),
]


@pytest.mark.parametrize("argv", READS, ids=[" ".join(a[:2]) for a in READS])
def test_a_read_on_a_missing_sqlite_file_is_refused_and_creates_nothing(capsys, tmp_path, argv):
    path = tmp_path / "typo.sqlite3"
    rc, out, err = run(capsys, "--json", *argv, "--database-url", f"sqlite:///{path}")
    assert rc == EXIT_STORE and "store_error" in json.loads(out) and str(path) in err
    assert list(tmp_path.iterdir()) == []


def test_a_read_on_a_missing_sqlite_file_from_the_environment_creates_nothing(capsys, elsewhere, monkeypatch):
    monkeypatch.delenv("ATMOSTONCE_DATABASE_URL", raising=False)
    rc, out, _ = run(capsys, "--json", "intents", "list")  # the default ./atmostonce.sqlite3
    assert rc == EXIT_STORE and "store_error" in json.loads(out)
    assert list(elsewhere.iterdir()) == []


def test_db_upgrade_still_creates_a_new_database(capsys, tmp_path):
    path = tmp_path / "new.sqlite3"
    rc, _, _ = run(capsys, "db", "upgrade", "--database-url", f"sqlite:///{path}")
    assert rc == EXIT_OK and path.exists()
    rc, out, _ = run(capsys, "--json", "intents", "list", "--database-url", f"sqlite:///{path}")
    assert rc == EXIT_OK and json.loads(out)["intents"] == []
