"""A copied or restored SQLite file is refused for work until its restore is declared
(docs/design.md#the-restore-protocol): its data agree with themselves, so no sequence check can tell it from
the original, but it may not show the sends its original made after it was taken, and its workers would make
them again. The store records the file's device and inode number the first time it opens it; a move keeps
them, a copy or a backup put back does not."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pytest

from atmostonce import StoreCopied
from atmostonce.names import STATE
from atmostonce_cli.main import main
from atmostonce_sql import file_identity, open_store
from tests.helpers import begin_authorize, submit
from tests.worker_proc import write_config


def backup(src, dst) -> None:
    """SQLite's own consistent copy of a live database (what docs/operations.md tells operators to use)."""
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    a.close()
    b.close()


@pytest.fixture
def original(tmp_path):
    """A store with one intent queued and one authorized (a send in flight), then a backup of it."""
    path = tmp_path / "outbox.sqlite3"
    store = open_store(f"sqlite:///{path}")
    queued = submit(store, text="queued", target="room-1")
    in_flight = submit(store, text="in flight", target="room-2")
    begin_authorize(store, in_flight.key)
    backup(path, tmp_path / "copy.sqlite3")
    yield SimpleNamespace(store=store, path=path, copy=tmp_path / "copy.sqlite3", keys=(queued.key, in_flight.key))
    store.close()


def test_a_backup_of_a_store_is_refused_for_work_naming_the_restore_to_declare(original):
    with pytest.raises(StoreCopied) as refused:
        open_store(f"sqlite:///{original.copy}", migrate=False)
    exc = refused.value
    assert exc.path == str(original.copy)
    assert exc.found == file_identity.identity(str(original.copy)) != exc.recorded
    assert exc.recorded == file_identity.identity(str(original.path))
    assert exc.repair == "atmostonce db declare-restore --operator NAME"
    with open_store(f"sqlite:///{original.path}", migrate=False) as again:  # the original is still its own file
        assert again.get(original.keys[0]).state == STATE.pending


def test_the_cli_refuses_work_on_a_copy_with_a_store_error_and_reads_it_for_verifying(original, capsys):
    url = f"sqlite:///{original.copy}"
    assert main(["--json", "intents", "list", "--database-url", url]) == 3
    out, err = capsys.readouterr()
    doc = json.loads(out or err)
    assert doc["store_copied"]["path"] == str(original.copy)
    assert doc["store_copied"]["repair"] == StoreCopied.REPAIR
    assert main(["audit", "verify", "--database-url", url]) == 0  # a backup is verified before it is used


def test_once_its_restore_is_declared_a_copy_opens_with_its_open_work_fenced(original, capsys):
    url = f"sqlite:///{original.copy}"
    assert main(["db", "declare-restore", "--operator", "ops", "--database-url", url]) == 0
    capsys.readouterr()
    with open_store(url, migrate=False) as copy:
        assert {copy.get(k).state for k in original.keys} == {STATE.indeterminate}
        assert copy.claimable(10) == []
    with open_store(url, migrate=False) as copy:  # and it stays its own file from then on
        assert copy.get(original.keys[1]).state == STATE.indeterminate


def test_a_store_file_moved_on_its_file_system_is_still_its_own(original, tmp_path):
    original.store.close()
    moved = tmp_path / "moved" / "outbox.sqlite3"
    moved.parent.mkdir()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{original.path}{suffix}"):
            os.rename(f"{original.path}{suffix}", f"{moved}{suffix}")
    with open_store(f"sqlite:///{moved}", migrate=False) as store:
        assert store.get(original.keys[0]).state == STATE.pending


def test_an_inode_number_using_all_64_bits_is_recorded_and_recognised(tmp_path, monkeypatch):
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        st = real_stat(path, *args, **kwargs)
        if str(path).endswith("big.sqlite3"):
            return SimpleNamespace(st_dev=st.st_dev, st_ino=(1 << 64) - 5)
        return st

    monkeypatch.setattr(file_identity.os, "stat", stat)
    url = f"sqlite:///{tmp_path / 'big.sqlite3'}"
    open_store(url).close()
    with open_store(url, migrate=False) as store:
        assert store.claimable(1) == []


def test_a_worker_on_a_copied_store_exits_with_a_store_error_at_once(original, tmp_path):
    cfg = write_config(tmp_path / "w.toml", f"sqlite:///{original.copy}", "http://127.0.0.1:9/")
    proc = subprocess.run(
        [sys.executable, "-m", "atmostonce_cli.main", "worker", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3
    assert "declare-restore" in proc.stderr
