"""A/B of two versions of the code: ``Dispatcher.publish`` from this working tree and from a git revision, each
in its own process on one database, taking turns every ``--batch`` calls so both see the same machine (this one
is shared, and runs apart by 10 to 30%).

For a change spread over many places (the Python of a publish), where ``ab_publish.py``'s switch of one
function in one process cannot hold the other version. The revision is checked out into a temporary git
worktree (removed afterwards); each process puts its tree's ``reference`` and ``adapters`` first on its path,
warms up, then publishes when told. PostgreSQL 15 with fsync on, tables pre-seeded as ``make bench`` seeds
them (the revision must read the same schema: it runs on the database this tree migrated). Prints calls per
second and client CPU per call for each. A measurement, not a test: nothing here asserts a speed.

    python tests/bench/ab_versions.py REV [--turns N] [--batch N]     # make bench-vs BASE=REV
    python tests/bench/ab_versions.py REV --sqlite                    # make bench-vs BASE=REV SQLITE=1

With ``--sqlite`` both processes publish into one new SQLite file (WAL, this tree's migrations), taking the
same turns; only one writes at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_WORKER = r"""
import sys, time
root, url = sys.argv[1], sys.argv[2]
sys.path[:0] = [f"{root}/reference", f"{root}/adapters", f"{root}/tests/bench"]
import atmostonce
from atmostonce.runtime import Dispatcher
from bench_dispatch import NoopTransport
assert atmostonce.__file__.startswith(root), atmostonce.__file__
store = atmostonce.open_store(url, migrate=False, **({} if url.startswith("sqlite") else {"pool_size": 2}))
d = Dispatcher(store, NoopTransport())
tag = f"{root}-{time.time()}"
for i in range(300):
    d.publish("bench", "post", f"room-{i % 97}", {"text": f"warm {tag} {i}"})
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(n):
        d.publish("bench", "post", f"room-{i % 97}", {"text": f"ab {tag} {time.time()} {i}"})
    print(time.perf_counter() - t0, time.process_time() - c0, flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rev", help="the git revision to compare this working tree with")
    ap.add_argument("--turns", type=int, default=12, help="turns per version")
    ap.add_argument("--batch", type=int, default=200, help="publishes per turn")
    ap.add_argument("--seed", type=int, default=10_000, help="settled rows pre-seeded (PostgreSQL)")
    ap.add_argument("--sqlite", action="store_true", help="one SQLite file instead of PostgreSQL")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import psycopg
    from bench_dispatch import aom_seed

    from atmostonce_sql.pgserver import LocalCluster

    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="aom-ab-"))
        base = str(Path(tmp) / "base")
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", base, args.rev], check=True)
        try:
            if args.sqlite:
                import atmostonce

                url = f"sqlite:///{tmp}/ab.sqlite3"
                atmostonce.open_store(url).close()  # this tree's migrations
            else:
                pg = stack.enter_context(LocalCluster(fsync=True))
                url = pg.create_database("ab")
                aom_seed(url, args.seed)
                with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
                    admin.execute("ANALYZE")
            trees = {f"{args.rev} (git worktree)": base, "this working tree": str(ROOT)}
            procs = {
                name: subprocess.Popen(
                    [sys.executable, "-c", _WORKER, root, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                )
                for name, root in trees.items()
            }
            for p in procs.values():
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in procs}
            for turn in range(args.turns):
                for name in list(procs) if turn % 2 == 0 else list(procs)[::-1]:
                    p = procs[name]
                    assert p.stdin is not None and p.stdout is not None
                    p.stdin.write(f"{args.batch}\n")
                    p.stdin.flush()
                    wall, cpu = map(float, p.stdout.readline().split())
                    runs[name].append((wall, cpu))
            for p in procs.values():
                assert p.stdin is not None
                p.stdin.close()
                p.wait()
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", base], check=False)
    n = args.turns * args.batch
    for name, rows in runs.items():
        wall, cpu = sum(w for w, _ in rows), sum(c for _, c in rows)
        median = statistics.median(c / args.batch * 1e3 for _, c in rows)
        print(
            f"{name:28s} {n / wall:7.0f} calls/s   client CPU {cpu / n * 1e3:.3f} ms/call (median of turns {median:.3f})"
        )


if __name__ == "__main__":
    main()
