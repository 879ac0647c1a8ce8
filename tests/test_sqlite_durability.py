"""The SQLite store's authorization is on the disk before the bytes leave (docs/design.md#two-durable-points-per-send).

A power loss cannot be staged in a test, but what survives one can be read from the system calls: a commit
is durable once the WAL frames it wrote have been synced. The store runs in a child process under ``strace``
(a tool nobody here wrote); the transport's send makes one recognisable system call (a ``stat`` of a marker
path) and nothing else. Every WAL write before that call must be followed, still before it, by an
``fsync``/``fdatasync`` of the WAL: otherwise the authorization sat in the page cache while the platform took
the request, and a crash at that moment would leave the intent pending, to be sent again.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import atmostonce

pytestmark = pytest.mark.slow

CHILD = r"""
import os, sys
import atmostonce
from atmostonce.runtime import Dispatcher
from atmostonce_function import FunctionTransport

db, marker = sys.argv[1:3]
store = atmostonce.open_store("sqlite:///" + db)
intent = store.submit("acct", "post", "room-1", {"text": "durable before the bytes"})

def send(request):
    os.path.exists(marker)  # the send, as the system calls see it
    return {"id": "obj-1"}

print(Dispatcher(store, FunctionTransport(send, read_back=lambda rid: {"text": "durable before the bytes"})).dispatch(intent))
store.close()
"""

SYNC = re.compile(r"^(\d+\s+)?(fsync|fdatasync)\((\d+)\)")
WRITE = re.compile(r"^(\d+\s+)?(pwrite64|write)\((\d+),")
OPEN_WAL = re.compile(r'openat\(.*-wal", .*= (\d+)$')


def strace_child(tmp_path: Path, child: str, marker: str = "THE_SEND") -> tuple[list[str], str]:
    """Run the Python source ``child`` (argv: a database path in ``tmp_path``, a marker path) under ``strace``,
    tracing opens, writes, syncs and stats; returns the trace's lines and the child's stdout."""
    strace = shutil.which("strace")
    assert strace is not None, "strace is missing: bash .ci/install-tools.sh installs it"
    db = tmp_path / "outbox.sqlite3"
    out = subprocess.run(
        [strace, "-f", "-qq", "-o", str(tmp_path / "trace.txt"), "-e",
         "trace=openat,write,pwrite64,fsync,fdatasync,newfstatat,stat",
         sys.executable, "-c", child, str(db), str(tmp_path / marker)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return (tmp_path / "trace.txt").read_text().splitlines(), out.stdout.strip()


def test_the_authorization_is_synced_to_the_disk_before_the_send(tmp_path):
    lines, outcome = strace_child(tmp_path, CHILD)
    assert outcome == "read_back.match"
    send = next(i for i, line in enumerate(lines) if "THE_SEND" in line)
    wal_fds = {m.group(1) for line in lines[:send] if (m := OPEN_WAL.search(line))}
    assert wal_fds, "the store wrote no WAL before the send"
    writes = [i for i, line in enumerate(lines[:send]) if (m := WRITE.match(line)) and m.group(3) in wal_fds]
    assert writes, "no WAL frame was written before the send: the authorization was not committed"
    syncs = [i for i, line in enumerate(lines[:send]) if (m := SYNC.match(line)) and m.group(3) in wal_fds]
    assert syncs and syncs[-1] > writes[-1], (
        f"the WAL's last write before the send (line {writes[-1]}) was not synced before it: "
        f"{lines[writes[-1]]!r}; syncs at {syncs}"
    )


def test_every_sqlite_connection_of_a_store_syncs_at_each_commit(tmp_path):
    # the pragma the trace above depends on, on the sync store's connections: 2 is FULL
    store = atmostonce.open_store(f"sqlite:///{tmp_path}/x.sqlite3")
    try:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2
    finally:
        store.close()


CHILD_TWO = r"""
import os, sys
import atmostonce
from atmostonce.runtime import Dispatcher
from atmostonce_function import FunctionTransport

db, marker = sys.argv[1:3]
store = atmostonce.open_store("sqlite:///" + db)
sends = []

def send(request):
    sends.append(dict(request.body))
    os.path.exists(f"{marker}_{len(sends)}")  # the send, as the system calls see it
    return {"id": f"obj-{len(sends)}"}

d = Dispatcher(store, FunctionTransport(send, read_back=lambda rid: sends[int(rid[4:]) - 1]))
print(d.publish("acct", "post", "room-1", {"text": "first"})[1])
print(d.publish("acct", "post", "room-2", {"text": "second"})[1])
os.path.exists(f"{marker}_END")
store.close()
"""


def test_an_outcome_s_commit_is_synced_by_the_next_authorization_s_and_not_on_its_own(tmp_path):
    """Two publishes: the first's outcome commits without a sync of its own, and the second authorization's
    sync, before the second send, covers it (one WAL, written in order). Between the sends the WAL is synced
    once, and after the second send not at all until the store closes."""
    lines, out = strace_child(tmp_path, CHILD_TWO)
    assert out.split() == ["read_back.match", "read_back.match"]
    first, second, end = (next(i for i, line in enumerate(lines) if f"THE_SEND_{n}" in line) for n in ("1", "2", "END"))
    wal_fds = {m.group(1) for line in lines if (m := OPEN_WAL.search(line))}

    def wal(kind, lo, hi):
        pattern = SYNC if kind == "sync" else WRITE
        return [i for i in range(lo, hi) if (m := pattern.match(lines[i])) and m.group(3) in wal_fds]

    outcome_writes = [i for i in wal("write", first, second) if not wal("sync", first, i)]
    assert outcome_writes, "the first outcome wrote nothing to the WAL before the second authorization"
    assert len(wal("sync", first, second)) == 1  # the second authorization's, after the first outcome's writes
    assert wal("sync", first, second)[0] > max(wal("write", first, second))
    assert wal("write", second, end) and not wal("sync", second, end)  # the second outcome: written, not synced
