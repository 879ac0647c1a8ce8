"""A declared restore fences `parked` intents too (docs/design.md#what-a-restore-cannot-know), on SQLite and on
PostgreSQL, through the CLI against the operator trial's posts API (no idempotency of its own).

The story: a send answered 500 and a person parked the intent; a backup was taken; the person then settled it
`not-sent` and a `work` pass posted it. The backup is put back in service and the restore declared. Before, the
restored intent was `parked` again with its old evidence, and a person who settled it again posted it twice.
Now the restore moves it to `indeterminate` with a lookup left: the lookup finds the post and the intent ends
`published`, and when the lookup cannot see the post the intent parks again with the restore in its history.
Posts are counted from the server's own records, never from atmostonce's counters."""

# ruff: noqa: F811  (the trial's fixtures are imported by name, and pytest passes them as the tests' arguments)

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.test_operator_trial import (  # noqa: F401  (fixtures, used by name)
    PostsApi,
    api,
    cli,
    pg_cluster,
    pg_url,
    profile,
    sqlite_backup,
    sqlite_url,
    state,
    to_parked_by_operator,
    work,
)


def settle_and_post(capsys, url: str, profile: Path, key: str) -> None:
    """After the backup: the person settles the parked intent as not sent, and a `work` pass posts it."""
    assert cli(capsys, "resolve", "--database-url", url, key, "--operator", "alice", "--not-sent")[0] == 0
    assert work(capsys, url, profile)[0] == 0
    assert state(capsys, url, key) == "published"


def declare_and_work(capsys, url: str, profile: Path, key: str) -> tuple[dict, str]:
    """`declare-restore`, then `work` passes until the fenced intent leaves `indeterminate` (one lookup per
    intent per second): the declaration's report and the state it ends in."""
    rc, declared = cli(capsys, "db", "declare-restore", "--database-url", url, "--operator", "alice")
    assert rc == 0, declared
    assert state(capsys, url, key) == "indeterminate"
    for _ in range(6):
        work(capsys, url, profile)
        if state(capsys, url, key) != "indeterminate":
            break
        time.sleep(1.05)
    return declared, state(capsys, url, key)


def history_events(capsys, url: str, key: str) -> list[str]:
    rc, doc = cli(capsys, "intents", "show", "--database-url", url, key)
    assert rc == 0, doc
    return [h["event"] for h in doc["history"]]


def parked_backed_up_then_sent_then_restored(tmp_path: Path, capsys, url: str, profile: Path, api, text: str) -> str:
    """SQLite: an intent parked by a person, a backup, the person's settling and the post it made, then the
    backup put in service over the store (no process has it open: every CLI command closed it)."""
    key = to_parked_by_operator(capsys, url, profile, api, text)
    sqlite_backup(tmp_path / "outbox.sqlite3", tmp_path / "backup.sqlite3")
    settle_and_post(capsys, url, profile, key)
    (tmp_path / "backup.sqlite3").replace(tmp_path / "outbox.sqlite3")
    return key


def test_sqlite_a_parked_intent_settled_and_posted_after_the_backup_is_found_not_posted_again(
    tmp_path, capsys, sqlite_url, profile, api: PostsApi
):
    key = parked_backed_up_then_sent_then_restored(tmp_path, capsys, sqlite_url, profile, api, "parked then sent")
    assert state(capsys, sqlite_url, key) == "parked"  # what the backup holds

    declared, end = declare_and_work(capsys, sqlite_url, profile, key)

    assert declared["fenced"] == 1
    assert end == "published"
    assert len(api.by_delivery_key()[key]) == 1
    assert api.duplicates() == {}
    assert cli(capsys, "audit", "verify", "--database-url", sqlite_url)[0] == 0


def test_sqlite_a_fenced_parked_intent_the_lookup_cannot_settle_parks_again_with_the_restore_in_its_history(
    tmp_path, capsys, sqlite_url, profile, api: PostsApi
):
    key = parked_backed_up_then_sent_then_restored(tmp_path, capsys, sqlite_url, profile, api, "parked, blind")
    posts_before = api.create_requests

    api.hide_lookup = True  # the platform's listing does not show the post: a miss, which proves nothing here
    _, end = declare_and_work(capsys, sqlite_url, profile, key)

    assert end == "parked"
    events = history_events(capsys, sqlite_url, key)
    after_restore = events[events.index("restore_fence") + 1 :]
    assert after_restore[-1] == "park_unreconcilable"
    assert {"reconcile_not_found", "reconcile_unproven"} & set(after_restore[:-1])  # looked before parking
    assert api.create_requests == posts_before  # nothing was sent by the machine
    assert api.duplicates() == {}


@pytest.mark.postgres
def test_postgres_a_parked_intent_settled_and_posted_after_the_dump_is_found_not_posted_again(
    tmp_path, capsys, pg_cluster, pg_url, profile, api: PostsApi
):
    key = to_parked_by_operator(capsys, pg_url, profile, api, "pg parked then sent")
    dump = tmp_path / "outbox.dump"
    dbname = urlparse(pg_url).path.lstrip("/")
    dsn = pg_cluster.dsn_for(dbname)
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump), dsn], check=True)
    settle_and_post(capsys, pg_url, profile, key)
    pg_cluster.drop_database(dbname)
    restored = pg_cluster.create_database(dbname)
    subprocess.run(["pg_restore", "-d", dsn, str(dump)], check=True)
    assert state(capsys, restored, key) == "parked"

    declared, end = declare_and_work(capsys, restored, profile, key)

    assert declared["fenced"] == 1
    assert end == "published"
    assert len(api.by_delivery_key()[key]) == 1
    assert api.duplicates() == {}
