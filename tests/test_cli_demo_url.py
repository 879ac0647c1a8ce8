"""The URL the demo prints works with ``--database-url`` (docs/operations.md): on PostgreSQL it printed a fragment
(``/demo?host=...``) and told the user to pass it on; now it prints the whole URL with only the password
left out, and the command it prints, run as printed, reads the demo's intents."""

from __future__ import annotations

import json
import shlex

import pytest
from sqlalchemy.engine import make_url

from atmostonce_cli.main import EXIT_OK, main
from atmostonce_cli.urls import usable_url


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_usable_url_keeps_user_host_database_and_socket_query_and_leaves_out_only_the_password():
    url, left_out = usable_url("postgresql://alice:s%40cret@/demo?host=/run/postgresql")
    parsed = make_url(url)
    assert left_out is True and parsed.password is None
    assert (parsed.username, parsed.database, dict(parsed.query)) == ("alice", "demo", {"host": "/run/postgresql"})
    assert usable_url("postgresql://alice@db.example:5433/demo") == ("postgresql://alice@db.example:5433/demo", False)
    assert usable_url("sqlite:////tmp/x/demo.sqlite3") == ("sqlite:////tmp/x/demo.sqlite3", False)


def _printed_command(out: str) -> list[str]:
    [line] = [ln for ln in out.splitlines() if ln.strip().startswith("atmostonce intents list --database-url")]
    return shlex.split(line)[1:]


@pytest.mark.postgres
def test_the_postgresql_demo_prints_a_url_that_a_read_command_accepts(capsys, pg_databases, monkeypatch):
    url = pg_databases.fresh()
    password = make_url(url).password
    if password is not None:  # the printed URL leaves it out: the user gives it through PGPASSWORD
        monkeypatch.setenv("PGPASSWORD", password)
    try:
        rc, out, _ = run(capsys, "--json", "demo", "-n", "3", "--workers", "1", "--crash-rate", "0",
                         "--database-url", url, "--timeout", "90")  # fmt: skip
        result = json.loads(out)
        assert rc == EXIT_OK and result["password_left_out"] is (password is not None)
        printed = result["database"]
        rc, out, _ = run(capsys, "--json", "intents", "list", "--database-url", printed)
        assert rc == EXIT_OK and len(json.loads(out)["intents"]) == 3
        # the text summary's command, run as printed (shell-quoted), reads the same database
        from atmostonce_cli.demo import DemoResult, format_result

        fields = {k: v for k, v in result.items() if k in DemoResult.__dataclass_fields__}
        argv = _printed_command(format_result(DemoResult(**fields)))
        rc, out, _ = run(capsys, "--json", *argv)
        assert rc == EXIT_OK and len(json.loads(out)["intents"]) == 3
    finally:
        pg_databases.drop(url)


def test_the_sqlite_demo_prints_a_command_that_reads_its_database(capsys):
    rc, out, _ = run(capsys, "demo", "-n", "2", "--workers", "1", "--crash-rate", "0", "--timeout", "90")
    assert rc == EXIT_OK
    rc, out, _ = run(capsys, "--json", *_printed_command(out))
    assert rc == EXIT_OK and len(json.loads(out)["intents"]) == 2
