"""A/B of one hot-path change, in one process: ``Dispatcher.publish`` with the change and without it, taking
turns every ``--batch`` calls, so both see the same machine (this one is shared, and runs apart by 10 to 30%).

* ``query``: the store's own prepared statements (``Executor._query``) against psycopg's cursor for the same
  statements (what the store sent before): client CPU per call.
* ``chain``: the history trigger taking the predecessor a statement gives (migration 0016) against the
  trigger reading it for every row (its form before): server time per call (``pg_stat_statements``).

PostgreSQL 15 with fsync on, tables pre-seeded as ``make bench`` seeds them. Prints one line per variant.
A measurement, not a test: nothing here asserts a speed. ``make bench-ab`` runs both.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

import atmostonce
from atmostonce.runtime import Dispatcher
from atmostonce_sql.execution import Executor
from atmostonce_sql.pgserver import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dispatch import NoopTransport, aom_seed  # noqa: E402


def _cursor_query(self: Executor, raw: Any, stmts: dict[str, Any], name: str, params: Any) -> Any:
    """The same statement through psycopg's cursor, as the store sent it before ``Executor._query``."""
    cur = self.send(raw, stmts, name, params)
    try:
        return [d.name for d in cur.description], cur.fetchall()
    finally:
        cur.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("change", choices=["query", "chain"])
    ap.add_argument("--turns", type=int, default=12, help="turns per variant")
    ap.add_argument("--batch", type=int, default=200, help="publishes per turn")
    ap.add_argument("--seed", type=int, default=10_000, help="settled rows pre-seeded")
    args = ap.parse_args()
    with LocalCluster(fsync=True, settings={"shared_preload_libraries": "pg_stat_statements"}) as pg:
        url = pg.create_database("ab")
        aom_seed(url, args.seed)
        admin = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        store = atmostonce.open_store(url, pool_size=2)
        given = admin.execute("SELECT pg_get_functiondef('aom_history_chain'::regproc)").fetchone()[0]
        lookup = given.replace("IF NEW.row_hash IS NULL THEN", "IF NEW.row_hash IS NULL OR NEW.row_hash = '' THEN")
        assert lookup != given, "the trigger of migration 0016 was not found"
        if args.change == "query":
            variants = {"Executor._query": Executor._query, "psycopg cursor": _cursor_query}
        else:
            variants = {"predecessor given": given, "predecessor read per row": lookup}

        def use(name: str) -> None:
            if args.change == "query":
                Executor._query = variants[name]  # type: ignore[method-assign]
            else:
                admin.execute(variants[name])

        dispatcher = Dispatcher(store, NoopTransport())
        tag = f"ab-{time.time()}"
        for name in variants:  # warm: connections, prepared statements, caches, for each variant
            use(name)
            for i in range(args.batch):
                dispatcher.publish("bench", "post", f"room-{i % 97}", {"text": f"{tag} warm {name} {i}"})
        # a cached generic plan is made from the statistics of its first run: a plan made while a table (the text
        # claims) looked empty scans it, and another made later reads its index. ANALYZE now invalidates every
        # plan, so both variants plan their statements again in their first turn, from the same statistics
        admin.execute("ANALYZE")
        totals = {name: [0.0, 0.0, 0.0] for name in variants}
        per_statement: dict[str, dict[str, list[float]]] = {name: {} for name in variants}

        def statements() -> dict[Any, tuple[int, float, str]]:
            rows = admin.execute(
                "SELECT queryid, calls, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 40) "
                "FROM pg_stat_statements WHERE query LIKE 'WITH%'"
            )
            return {r[0]: (r[1], r[2], r[3]) for r in rows}

        n = 0
        for turn in range(args.turns):
            order = list(variants) if turn % 2 == 0 else list(reversed(list(variants)))
            for name in order:
                use(name)
                (s0,) = admin.execute("SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements").fetchone()
                before = statements()
                c0, t0 = time.process_time(), time.perf_counter()
                for i in range(args.batch):
                    n += 1
                    dispatcher.publish("bench", "post", f"room-{i % 97}", {"text": f"{tag} {n}"})
                t = totals[name]
                t[0] += time.perf_counter() - t0
                t[1] += time.process_time() - c0
                t[2] += float(admin.execute("SELECT sum(total_exec_time) FROM pg_stat_statements").fetchone()[0]) - s0
                for q, (calls, total, text) in statements().items():
                    c_, t_, _ = before.get(q, (0, 0.0, text))
                    if calls > c_:
                        acc = per_statement[name].setdefault(text, [0.0, 0.0])
                        acc[0] += calls - c_
                        acc[1] += total - t_
        use(next(iter(variants)))
        store.close()
        calls = args.batch * args.turns
        for name, (wall, cpu, server) in totals.items():
            print(
                f"{args.change}: {name:26} {calls / wall:6.0f} calls/s, client CPU {cpu / calls * 1000:.3f} ms/call, "
                f"server {server / calls:.3f} ms/call"
            )
            for text, (count, total) in sorted(per_statement[name].items()):
                print(f"    {text:42} {count:7.0f} runs, {total / count:.3f} ms each")


if __name__ == "__main__":
    main()
