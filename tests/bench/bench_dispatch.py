"""Benchmark: a protected call through atmostonce, raw SQL and the two PyPI peers, in one interleaved run.

A *protected call* records the intent durably before the bytes, sends to a transport that does
nothing, and records the outcome. Every system does exactly that on the same server:

* ``raw psycopg``: the two-commit limit: ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` (autocommit),
  the no-op send, a conditional ``UPDATE ... WHERE state = 'authorized'`` (autocommit);
* ``agent-once`` 0.1.0 (``once.Once(store=PostgresStore(dsn)).execute``);
* ``exactly-once`` 0.2.1 (``exactly_once.once(Store.postgres(dsn), key=...)``);
* ``atmostonce``: ``Dispatcher.publish`` (submit and dispatch: the intent with its authorization in one commit, the
  outcome in the other: docs/design.md#two-durable-points-per-send), with a transport whose send and read-back do
  nothing.

PostgreSQL 15 runs with fsync on, ``pg_stat_statements`` loaded; every system's tables are
pre-seeded with ``--seed`` settled rows. For 1 and 4 threads (each thread its own store and
connection) and 4 threads sharing one store, each system makes ``--calls`` protected calls per
round, the systems taking turns, ``--rounds`` rounds; the table shows the median round. Per call:
statements (``pg_stat_statements``, this database only), commits (``pg_stat_database.xact_commit``),
WAL syncs (``pg_stat_wal.wal_sync``; the systems run one at a time, so the cluster-wide counter is
theirs), client CPU (``time.process_time`` of this process). The same for SQLite: atmostonce's
SQLite store against raw ``sqlite3`` doing the same two statements, with the store's pragmas
(``atmostonce_sql.SQLITE_PRAGMAS``: WAL, ``synchronous=FULL``).

``make bench`` installs the peers into ``build/bench-venv`` and runs this with ``--write``, which
writes docs/performance.md. It is a measurement, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

import atmostonce
from atmostonce.runtime import Dispatcher
from atmostonce.transport import Capabilities, Found, NotFound, Sent
from atmostonce_sql import SQLITE_PRAGMAS
from atmostonce_sql.pgserver import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import seed as seed_settled  # noqa: E402  (the same settled rows as the replay benchmark)

ROOT = Path(__file__).resolve().parents[2]


class NoopTransport:
    """Sends nothing and reads back what it was given: the platform costs nothing."""

    name = "noop"
    protocol_version = 1
    capabilities = Capabilities(read_back=True)

    def __init__(self) -> None:
        self.bodies: dict[str, Any] = {}
        self.lock = threading.Lock()

    def send(self, wire):
        rid = uuid.uuid4().hex
        with self.lock:
            self.bodies[rid] = dict(wire.body)
        return Sent(rid)

    def read_back(self, remote_id):
        body = self.bodies.get(remote_id)
        return NotFound() if body is None else Found(remote_id, body)

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        return NotFound()

    def matches(self, request, found):
        return True

    def close(self) -> None:
        pass


def noop_effect(**kwargs: Any) -> str:
    return "ok"


# ---------------------------------------------------------------- systems: make(dsn) -> (call(i, tag), close)
def raw_pg(dsn: str) -> tuple[Callable[[int, str], None], Callable[[], None]]:
    conn = psycopg.connect(dsn, autocommit=True)
    lock = threading.Lock()

    def call(i: int, tag: str) -> None:
        key = f"{tag}-{i}"
        with lock:
            row = conn.execute(
                "INSERT INTO raw_calls (key, state, request, created_at) VALUES (%s, 'authorized', %s, now()) "
                "ON CONFLICT (key) DO NOTHING RETURNING key",
                (key, f'{{"text": "bench {key}"}}'),
            ).fetchone()
        if row is None:
            return
        noop_effect()
        with lock:
            conn.execute(
                "UPDATE raw_calls SET state = 'done', result = %s, updated_at = now() "
                "WHERE key = %s AND state = 'authorized'",
                ("ok", key),
            )

    return call, conn.close


def raw_pg_schema(dsn: str, seed: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE raw_calls (key text PRIMARY KEY, state text NOT NULL, request text NOT NULL, "
            "result text, created_at timestamptz NOT NULL, updated_at timestamptz)"
        )
        conn.execute(
            "INSERT INTO raw_calls SELECT 'seed-' || i, 'done', '{}', 'ok', now(), now() FROM generate_series(1, %s) i",
            (seed,),
        )


def agent_once(dsn: str) -> tuple[Callable[[int, str], None], Callable[[], None]]:
    from once import Once
    from once.postgres import PostgresStore

    once = Once(store=PostgresStore(dsn))

    def call(i: int, tag: str) -> None:
        once.execute(noop_effect, key=f"{tag}-{i}", text=f"bench {tag} {i}")

    return call, once.close


def agent_once_seed(dsn: str, seed: int) -> None:
    from once.postgres import PostgresStore

    PostgresStore(dsn).close()  # creates its table
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO once_effects (key, status, result, args_hash, created_at, updated_at) "
            "SELECT 'seed-' || i, 'done', '\"ok\"', md5(i::text), now()::text, now()::text "
            "FROM generate_series(1, %s) i",
            (seed,),
        )


def exactly_once(dsn: str) -> tuple[Callable[[int, str], None], Callable[[], None]]:
    from exactly_once import Store, once

    store = Store.postgres(dsn)
    guarded = once(store, key=lambda text, k: k)(lambda text, k: noop_effect(text=text))

    def call(i: int, tag: str) -> None:
        guarded(f"bench {tag} {i}", f"{tag}-{i}")

    return call, store.close


def exactly_once_seed(dsn: str, seed: int) -> None:
    from exactly_once import Store

    store = Store.postgres(dsn)
    store.get("nothing")  # creates its table
    store.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO effects (key, state, result, created_at, updated_at) "
            "SELECT 'seed-' || i, 'committed', 'ok', extract(epoch from now()), extract(epoch from now()) "
            "FROM generate_series(1, %s) i",
            (seed,),
        )


def aom(url: str) -> tuple[Callable[[int, str], None], Callable[[], None]]:
    store = atmostonce.open_store(url, pool_size=8)
    dispatcher = Dispatcher(store, NoopTransport())

    def call(i: int, tag: str) -> None:
        # submit and dispatch: the intent and its authorization in one commit, the outcome in the other
        _, outcome = dispatcher.publish("bench", "post", f"room-{i % 97}", {"text": f"bench {tag} {i}"})
        if outcome != "read_back.match":
            raise RuntimeError(f"a protected call ended {outcome}")

    return call, store.close


def aom_seed(url: str, seed: int) -> None:
    """Settled intents with their history rows, by raw SQL (the store's own tables, migration head)."""
    atmostonce.open_store(url).close()
    seed_settled(url.replace("postgresql+psycopg://", "postgresql://"), seed)


# ---------------------------------------------------------------- measurement
def run_threads(make: Callable[[], tuple[Callable, Callable]], threads: int, calls: int, tag: str, shared: bool):
    """``calls`` protected calls split over ``threads``; returns (seconds, cpu seconds)."""
    made = [make()] if shared else [make() for _ in range(threads)]
    per = calls // threads
    errors: list[BaseException] = []

    def work(t: int) -> None:
        call = made[0 if shared else t][0]
        try:
            for i in range(per):
                call(t * per + i, tag)
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    t0, c0 = time.perf_counter(), time.process_time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    for _, close in made:
        close()
    if errors:
        raise errors[0]
    return dt, cpu, per * threads


def counters(admin: psycopg.Connection, db: str) -> dict[str, float]:
    row = admin.execute(
        "SELECT (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
        "        WHERE d.datname = %s AND s.query NOT ILIKE '%%pg_stat%%'),"
        "       (SELECT xact_commit FROM pg_stat_database WHERE datname = %s),"
        "       (SELECT wal_sync FROM pg_stat_wal)",
        (db, db),
    ).fetchone()
    return {"statements": float(row[0]), "commits": float(row[1]), "wal_syncs": float(row[2])}


PICKS = {
    "begin (worker poll: `claimable(100)`)": lambda store: store.claimable(100),
    "sweeper (`due_leases(100)`)": lambda store: store.due_leases(100),
    "reconciler (`list_intents(indeterminate, 50)`)": lambda store: store.list_intents(state="indeterminate", limit=50),
}


def captured(fn: Callable[[], Any]) -> list[tuple[str, Any]]:
    """The (query, params) pairs psycopg was asked to run while ``fn()`` ran."""
    sent: list[tuple[str, Any]] = []
    original = psycopg.Cursor.execute

    def execute(cur, query, params=None, *a, **kw):
        sent.append((query if isinstance(query, str) else str(query), params))
        return original(cur, query, params, *a, **kw)

    psycopg.Cursor.execute = execute
    try:
        fn()
    finally:
        psycopg.Cursor.execute = original
    return sent


def intents_scan(node: dict[str, Any]) -> dict[str, Any] | None:
    """The plan node that reads ``aom_intents`` (not the epoch's one-row subquery)."""
    if node.get("Relation Name") == "aom_intents":
        return node
    for child in node.get("Plans", []):
        found = intents_scan(child)
        if found is not None:
            return found
    return None


def plan_rows(pg: LocalCluster, sizes: list[int], backlog: int) -> list[tuple[str, str, float, int, str]]:
    """For each table size, and then with ``backlog`` pending intents added after the last ANALYZE (stale
    statistics, autovacuum off on the table): each pick's plan, by EXPLAIN (ANALYZE, BUFFERS)."""
    rows = []
    for n in sizes:
        url = pg.create_database(f"plans_{n}")
        aom_seed(url, n)
        dsn = url.replace("postgresql+psycopg://", "postgresql://")
        store = atmostonce.open_store(url)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE aom_intents SET (autovacuum_enabled = false)")
            conn.execute("ANALYZE")
            for label, extra in (
                (f"{n:,} settled", 0),
                (f"{n:,} settled + {backlog:,} pending, stale statistics", backlog),
            ):
                if extra:
                    conn.execute(
                        """
                        INSERT INTO aom_intents (key, account, action_kind, target, request, request_digest, state,
                          attempt_count, max_attempts, reconcile_count, max_reconciles, resend_epoch, normalizer_version,
                          created_at, updated_at, history_count)
                        SELECT md5('backlog' || i) || md5('y' || i), 'acct-' || (i %% 50), 'post', 'room-' || (i %% 500),
                               '{"text":"backlog"}', md5('b' || i), 'pending', 0, 3, 0, 3, 0, 1,
                               extract(epoch from now()), extract(epoch from now()), 1
                        FROM generate_series(1, %s) AS i
                        """,
                        (extra,),
                    )
                for pick, fn in PICKS.items():
                    # the pick's transaction: the settings it sends (SET LOCAL), then its one query
                    *settings, (query, params) = [
                        sq for sq in captured(lambda fn=fn, store=store: fn(store)) if sq[0] not in ("BEGIN", "COMMIT")
                    ]
                    with conn.transaction():
                        for setting, values in settings:
                            conn.execute(setting, values)
                        explain = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params).fetchone()[0]
                    top = explain[0]["Plan"]
                    node = intents_scan(top) or top
                    scan = node["Node Type"] + (f" using {node['Index Name']}" if node.get("Index Name") else "")
                    buffers = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
                    rows.append((label, pick, explain[0]["Execution Time"], buffers, scan))
                # the authorization itself (begin + authorize_dispatch, one commit) on queued intents, by a store
                # whose connections are new (no statement planned yet), the indexes it read from their counters
                keys = [r[0] for r in conn.execute("SELECT key FROM aom_intents WHERE state = 'pending' LIMIT 21")]
                if not keys:
                    keys = [store.submit("plans", "post", f"t{i}", {"text": f"plan {i}"}).key for i in range(21)]
                store.close()
                conn.execute("SELECT pg_stat_reset()")
                store = atmostonce.open_store(url, migrate=False)
                times = []
                for k in keys:
                    digest = store.get(k).request_digest
                    t0 = time.perf_counter()
                    store.begin_and_authorize(k, request_digest=digest)
                    times.append((time.perf_counter() - t0) * 1000)
                store.close()
                read = indexes_read(conn)
                scan = "by primary key" if set(read) <= {"aom_intents_pkey"} else "reads " + ", ".join(sorted(read))
                rows.append(
                    (
                        label,
                        f"authorization (`begin_and_authorize` on new connections; median of {len(times)}, "
                        f"slowest {max(times):.2f} ms)",
                        statistics.median(times),
                        -1,
                        scan,
                    )
                )
                store = atmostonce.open_store(url, migrate=False)
        store.close()
    return rows


def indexes_read(conn: psycopg.Connection) -> dict[str, int]:
    """The indexes of ``aom_intents`` read since the last ``pg_stat_reset()``, with the entries each returned, once
    every other backend of the database (a closed store's) has exited and so reported its counts."""
    for _ in range(2000):
        others = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
        if others is not None and others[0] == 0:
            break
        conn.execute("SELECT pg_sleep(0.005)")
    rows = conn.execute(
        "SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes WHERE relname = 'aom_intents' AND idx_scan > 0"
    ).fetchall()
    return {name: n for name, n in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="protected calls per system per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=100_000, help="settled rows pre-seeded in every system's table")
    ap.add_argument("--no-peers", action="store_true", help="leave agent-once and exactly-once out")
    ap.add_argument("--write", action="store_true", help="write docs/performance.md")
    ap.add_argument("--plan-sizes", default="10000,100000,1000000", help="table sizes for the plan table")
    ap.add_argument("--backlog", type=int, default=200_000, help="pending intents added with stale statistics")
    args = ap.parse_args()

    settings = {"max_connections": "200", "shared_preload_libraries": "pg_stat_statements", "track_io_timing": "on"}
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    load_before = os.getloadavg()
    with LocalCluster(fsync=True, settings=settings) as pg:
        systems: list[tuple[str, str, Callable]] = []
        admin_url = pg.create_database("bench_admin")
        admin = psycopg.connect(admin_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

        def database(name: str) -> tuple[str, str]:
            url = pg.create_database(name)
            return url, url.replace("postgresql+psycopg://", "postgresql://")

        url, dsn = database("bench_raw")
        raw_pg_schema(dsn, args.seed)
        systems.append(("raw psycopg, 2 commits", "bench_raw", lambda dsn=dsn: raw_pg(dsn)))
        if not args.no_peers:
            url, dsn = database("bench_agent_once")
            agent_once_seed(dsn, args.seed)
            systems.append(("agent-once 0.1.0", "bench_agent_once", lambda dsn=dsn: agent_once(dsn)))
            url, dsn = database("bench_exactly_once")
            exactly_once_seed(dsn, args.seed)
            systems.append(("exactly_once 0.2.1", "bench_exactly_once", lambda dsn=dsn: exactly_once(dsn)))
        url, dsn = database("bench_aom")
        aom_seed(url, args.seed)
        systems.append(("atmostonce Dispatcher.publish", "bench_aom", lambda url=url: aom(url)))
        for _, _, make in systems:  # warm: imports, prepared statements, caches
            run_threads(make, 1, 50, "warm", shared=False)
        admin.execute("ANALYZE")
        modes = [("1 thread", 1, False), ("4 threads", 4, False), ("4 threads, one store", 4, True)]
        for r in range(args.rounds):
            for m, (mode, threads, shared) in enumerate(modes):
                for name, db, make in systems:
                    before = counters(admin, db)
                    dt, cpu, n = run_threads(make, threads, args.calls, f"r{r}m{m}", shared)
                    after = counters(admin, db)
                    out = {k: (after[k] - before[k]) / n for k in before}
                    out |= {"calls_per_s": n / dt, "cpu_ms": cpu / n * 1000}
                    results.setdefault((name, mode), []).append(out)
                    print(f"round {r + 1} {mode:22} {name:24} {n / dt:8.0f} calls/s", flush=True)
        admin.close()
        plans = plan_rows(pg, [int(x) for x in args.plan_sizes.split(",") if x], args.backlog)
    sqlite_rows = sqlite_bench(args.calls, args.rounds)
    load_after = os.getloadavg()
    report = render(results, [m for m, _, _ in modes], sqlite_rows, args, load_before, load_after)
    report += render_plans(plans)
    print(report)
    if args.write:
        path = ROOT / "docs" / "performance.md"
        text = path.read_text() if path.exists() else ""
        marker = "<!-- bench_dispatch -->"
        head = text.split(marker)[0].rstrip() if marker in text else "# Performance"
        path.write_text(f"{head}\n\n{marker}\n{report}")


def median_of(rows: list[dict[str, float]]) -> dict[str, float]:
    mid = sorted(rows, key=lambda r: r["calls_per_s"])[len(rows) // 2]
    return mid


def sqlite_bench(calls: int, rounds: int) -> list[tuple[str, float, float]]:
    """atmostonce's SQLite store against raw sqlite3 doing the two statements, same pragmas."""
    folder = Path(tempfile.mkdtemp(prefix="aom-bench-"))
    raw = sqlite3.connect(folder / "raw.sqlite3", isolation_level=None, check_same_thread=False)
    for pragma in SQLITE_PRAGMAS:  # the store's own: every commit syncs the WAL
        raw.execute(f"PRAGMA {pragma}")
    raw.execute("CREATE TABLE raw_calls (key TEXT PRIMARY KEY, state TEXT NOT NULL, request TEXT, result TEXT)")

    def raw_call(i: int, tag: str) -> None:
        key = f"{tag}-{i}"
        if raw.execute(
            "INSERT INTO raw_calls (key, state, request) VALUES (?, 'authorized', ?) "
            "ON CONFLICT (key) DO NOTHING RETURNING key",
            (key, f'{{"text": "bench {key}"}}'),
        ).fetchone():
            noop_effect()
            raw.execute(
                "UPDATE raw_calls SET state = 'done', result = 'ok' WHERE key = ? AND state = 'authorized'", (key,)
            )

    url = f"sqlite:///{folder}/aom.sqlite3"
    out: dict[str, list[tuple[float, float]]] = {}
    for r in range(rounds):
        for name, make in (
            ("raw sqlite3, 2 statements", lambda: (raw_call, lambda: None)),
            ("atmostonce Dispatcher.publish (SQLite)", lambda: aom(url)),
        ):
            n = max(200, calls // 4)
            dt, cpu, n = run_threads(make, 1, n, f"s{r}", shared=False)
            out.setdefault(name, []).append((n / dt, cpu / n * 1000))
            print(f"round {r + 1} sqlite {name:32} {n / dt:8.0f} calls/s", flush=True)
    raw.close()
    rows = []
    for name, runs in out.items():
        rate, cpu = sorted(runs)[len(runs) // 2]
        rows.append((name, rate, cpu))
    return rows


def render(results, modes, sqlite_rows, args, load_before, load_after) -> str:
    names = list(dict.fromkeys(name for name, _ in results))
    raw_name = names[0]
    lines = [
        "## A protected call against raw SQL and the peers (`make bench`)",
        "",
        f"`tests/bench/bench_dispatch.py`: PostgreSQL 15 on this machine, fsync on, every table pre-seeded with "
        f"{args.seed:,} settled rows, {args.calls:,} protected calls per system per round, the systems taking turns, "
        f"median of {args.rounds} rounds. A protected call records the intent durably before the bytes, sends to a "
        "no-op transport and records the outcome (atmostonce: `Dispatcher.publish`, the intent and its authorization "
        "in one commit, the outcome in the other). Load average (1, 5, 15 min) before the run "
        f"{load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, after {load_after[0]:.2f} "
        f"{load_after[1]:.2f} {load_after[2]:.2f}. Statements, commits and WAL syncs per call come from "
        "`pg_stat_statements`, `pg_stat_database` and `pg_stat_wal`; client CPU is this process's.",
        "",
        "| system | "
        + " | ".join(f"{m} calls/s (ratio to raw)" for m in modes)
        + " | statements / commits / WAL syncs per call | client CPU per call |",
        "|---|" + "---|" * len(modes) + "---|---|",
    ]
    for name in names:
        cells = []
        for m in modes:
            row = median_of(results[(name, m)])
            raw = median_of(results[(raw_name, m)])["calls_per_s"]
            cells.append(f"{row['calls_per_s']:,.0f} ({row['calls_per_s'] / raw:.2f})")
        one = median_of(results[(name, modes[0])])
        lines.append(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {one['statements']:.1f} / {one['commits']:.1f} / {one['wal_syncs']:.1f} | {one['cpu_ms']:.2f} ms |"
        )
    lines += [
        "",
        "Statements count what the server executed for the database (BEGIN and COMMIT included when a system "
        "sends them); commits include read-only transactions; WAL syncs are the durable points that cost a disk flush.",
        "",
        f"SQLite (one thread, the store's pragmas: {', '.join(f'`{p}`' for p in SQLITE_PRAGMAS)}), median of the rounds:",
        "",
        "| system | calls/s | ratio to raw | client CPU per call |",
        "|---|---|---|---|",
    ]
    raw_rate = sqlite_rows[0][1]
    for name, rate, cpu in sqlite_rows:
        lines.append(f"| {name} | {rate:,.0f} | {rate / raw_rate:.3f} | {cpu:.2f} ms |")
    return "\n".join(lines) + "\n"


def render_plans(plans: list[tuple[str, str, float, int, str]]) -> str:
    lines = [
        "",
        "How each pick of due work reads the table (EXPLAIN ANALYZE, BUFFERS), as the table grows and with a "
        "pending backlog the planner's statistics do not know about yet (autovacuum off on the table):",
        "",
        "| table | pick | ms | buffers | scan |",
        "|---|---|---|---|---|",
    ]
    for label, pick, ms, buffers, scan in plans:
        shown = "" if buffers < 0 else str(buffers)
        lines.append(f"| {label} | {pick} | {ms:.2f} | {shown} | `{scan}` |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
