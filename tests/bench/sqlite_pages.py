"""Which pages a publish writes on the SQLite store: the WAL frames of each commit, by the table or index (b-tree)
each page belongs to.

A store of ``--seed`` publishes is checkpointed into its file, then ``--calls`` more publishes are made with the
automatic checkpoint off; the WAL then holds exactly their frames. Each frame's page is named through SQLite's
``dbstat`` table (a page past the file's end before the run is ``new``; page 1 holds the file's header, which
changes whenever the file grows). A commit is the frame that carries the database size. Prints, for the
authorization's commit and the outcome's, the mean pages per commit and the pages of each b-tree. A
measurement, not a test.

    python tests/bench/sqlite_pages.py [--seed N] [--calls N]
"""

from __future__ import annotations

import argparse
import collections
import sqlite3
import struct
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sqlalchemy as sa  # noqa: E402
from bench_dispatch import NoopTransport  # noqa: E402

import atmostonce  # noqa: E402
from atmostonce.runtime import Dispatcher  # noqa: E402


def wal_commits(path: Path) -> list[list[int]]:
    """The page numbers of the WAL's frames, one list per commit, in order (the format: sqlite.org/fileformat2)."""
    data = path.read_bytes()
    page_size = struct.unpack(">I", data[8:12])[0]
    commits: list[list[int]] = []
    current: list[int] = []
    offset = 32
    while offset + 24 + page_size <= len(data):
        page, size_after = struct.unpack(">II", data[offset : offset + 8])
        current.append(page)
        if size_after:  # the commit frame carries the database size in pages
            commits.append(current)
            current = []
        offset += 24 + page_size
    return commits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=3000, help="publishes made before the counted ones")
    ap.add_argument("--calls", type=int, default=20, help="publishes counted")
    args = ap.parse_args()
    path = Path(tempfile.mkdtemp(prefix="aom-pages-")) / "store.sqlite3"
    store = atmostonce.open_store(f"sqlite:///{path}")
    dispatcher = Dispatcher(store, NoopTransport())
    for i in range(args.seed):
        dispatcher.publish("bench", "post", f"room-{i % 97}", {"text": f"seed {i}"})
    admin = sqlite3.connect(path, isolation_level=None)
    admin.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    owner = {page: name for name, page in admin.execute("SELECT name, pageno FROM dbstat")}
    admin.execute("PRAGMA wal_autocheckpoint = 0")
    # the store's own connections checkpoint on their own: turned off on each as it is handed out
    sa.event.listen(
        store.engine, "checkout", lambda dbapi, record, proxy: dbapi.execute("PRAGMA wal_autocheckpoint = 0")
    )
    store.engine.pool.dispose()
    for i in range(args.calls):
        dispatcher.publish("bench", "post", f"room-{i % 97}", {"text": f"counted {i}"})
    commits = wal_commits(Path(f"{path}-wal"))
    store.close()
    admin.close()
    if len(commits) != 2 * args.calls:
        raise SystemExit(f"expected {2 * args.calls} commits in the WAL, found {len(commits)}")
    for label, picked in (("authorization", commits[0::2]), ("outcome", commits[1::2])):
        trees: collections.Counter[str] = collections.Counter()
        for pages in picked:
            trees.update(owner.get(p, "new") if p != 1 else "header (page 1)" for p in pages)
        mean = sum(len(p) for p in picked) / len(picked)
        print(f"{label}: {mean:.1f} pages per commit")
        for name, count in trees.most_common():
            print(f"    {count / len(picked):5.2f}  {name}")


if __name__ == "__main__":
    main()
