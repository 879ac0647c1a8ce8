"""``make ha``: worker processes publish through the local platform sink while the primary of a real Patroni cluster is
killed with SIGKILL, again and again (docs/deployment.md, "Measured failovers").

    python -m tests.ha.load --intents 2000 --failovers 3 --workers 4 --write docs/deployment.md
    python -m tests.ha.load --intents 2000 --failovers 3 --workers 4 --ablation --write docs/deployment.md

Each worker is its own process running an ``Outbox`` (one worker thread, its sweeper and reconciler) on the
multi-host URL. The sink runs without idempotency-key dedupe and with a fenced lookup, as in ``make demo``, so a
second send of an intent shows as a second object. Before each kill the relays hold replication for a moment, so
the commits of that moment reach the primary alone: with synchronous replication they are never acknowledged, without
it they are acknowledged and lost in the promotion. The run checks: duplicates 0 (counted by the sink), acknowledged
submits lost 0 (every key the harness was told was stored is in the store at the end), every intent in a state of the
table, and the audit chains intact (``atmostonce audit verify`` on the same URL exits 0). ``--ablation`` runs the same with synchronous replication off and the store
without its HA mode (no per-transaction durability, no standby check, no failover fence): the run is expected to
catch a duplicate, and exits 0 only when it does.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from atmostonce.names import STATE

MARK_BEGIN = "<!-- make ha results: begin -->"
MARK_END = "<!-- make ha results: end -->"


def worker_main(url: str, sink_url: str, index: int) -> int:
    """One worker process: an Outbox on ``url`` until SIGTERM, then a clean stop."""
    import atmostonce
    from atmostonce.runtime import RuntimeConfig
    from atmostonce_http import HttpTransport, sink_config

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    cfg = sink_config(
        sink_url,
        key_field="/delivery_key",
        lookup_fenced=True,
        connect_timeout=2.0,
        write_timeout=2.0,
        read_timeout=2.0,
    )
    config = RuntimeConfig(lease_seconds=4.0, send_lease_seconds=6.0, retries_per_tick=25, reconcile_interval=0.5)
    while True:  # the database may be failing over when the process starts
        try:
            outbox = atmostonce.open(
                url, transport=HttpTransport(cfg), workers=1, config=config, sweep_every=0.2, reconcile_every=0.2
            )
            break
        except atmostonce.StoreError:
            time.sleep(0.5)
    outbox.start()
    while not stop:
        time.sleep(0.2)
    outbox.stop(timeout=30)
    outbox.close()
    return 0


def _retry(fn, timeout=120.0):
    from atmostonce.errors import StoreError

    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def run(intents: int, failovers: int, workers: int, ablation: bool, seed: int, timeout: float) -> dict:
    import psycopg

    from atmostonce.audit import verify_store
    from atmostonce.identity import split_platform_idempotency_key
    from atmostonce_http import PlatformSink
    from atmostonce_sql import open_store
    from atmostonce_sql.hacluster import HaCluster

    rng = random.Random(seed)
    started = time.monotonic()
    result: dict = {"mode": "ablation" if ablation else "sync", "intents": intents, "workers": workers}
    with (
        HaCluster(synchronous=not ablation) as ha,
        PlatformSink(dedupe=False, fenced_lookup=True, read_lag_seconds=0.2) as sink,
    ):
        sink.set_fault_mix({"error_before_write": 0.03, "drop_after_write": 0.03, "delay": 0.04}, seed=seed)
        with psycopg.connect(ha.node_dsn(ha.wait_primary()), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "load"')
        url = ha.url("load") if ablation else ha.url("load", atmostonce_ha="sync")
        store = open_store(url)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        procs = [
            subprocess.Popen([sys.executable, "-m", "tests.ha.load", "worker", url, sink.url, str(i)], env=env)
            for i in range(workers)
        ]
        acknowledged: list[str] = []
        recoveries: list[float] = []
        killed = 0
        try:
            batch = max(1, intents // (failovers + 1))
            while len(acknowledged) < intents or killed < failovers:
                for i in range(len(acknowledged), min(intents, len(acknowledged) + batch)):
                    acknowledged.append(
                        _retry(lambda i=i: store.submit(f"acct-{i % 4}", "post", "room", {"text": f"ha post {i}"}))
                    .key)  # fmt: skip
                if killed < failovers:
                    time.sleep(rng.uniform(2.0, 5.0))  # at a random moment of the publishing
                    old = ha.primary()
                    ha.hold_replication()  # what commits now reaches the primary alone
                    time.sleep(rng.uniform(0.5, 1.5))
                    t0 = time.monotonic()
                    ha.kill_primary()
                    killed += 1
                    ha.wait_primary(exclude=old)
                    _retry(lambda n=killed: store.submit("acct-0", "post", "probe", {"text": f"probe {n}"}))
                    recoveries.append(round(time.monotonic() - t0, 1))
                    print(f"failover {killed}: {old} killed, recovered in {recoveries[-1]} s", flush=True)
                    ha.restart(old)  # the old primary rejoins as a standby
                    ha.wait_replicating()
            open_kinds = (STATE.pending, STATE.authorized, STATE.indeterminate, STATE.failed)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                counts = _retry(store.count_by_state)
                if all(counts.get(s, 0) == 0 for s in open_kinds):
                    break
                time.sleep(1.0)
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
        counts = _retry(store.count_by_state)
        present = {it.key for it in _retry(lambda: store.list_intents(limit=10 * intents + 100))}
        audit = _retry(lambda: verify_store(store))
        cli = Path(sys.executable).with_name("atmostonce")  # the operator's command, on the same multi-host URL
        audit_cli = subprocess.run(
            [str(cli), "audit", "verify", "--database-url", url], capture_output=True, text=True, timeout=300
        )
        print(audit_cli.stdout.strip(), audit_cli.stderr.strip()[-500:], flush=True)
        by_key = Counter(
            split_platform_idempotency_key(obj["body"]["delivery_key"])[0]
            for obj in sink.objects.values()
            if isinstance(obj["body"].get("delivery_key"), str)
        )
        result.update(
            failovers=killed,
            recover_seconds=recoveries,
            duplicates=sum(c - 1 for c in by_key.values() if c > 1),
            lost_submits=sum(1 for k in acknowledged if k not in present),
            by_state={k: v for k, v in sorted(counts.items()) if v},
            undeclared_states=sorted(set(counts) - set(store.table.state_names)),
            finished=all(counts.get(s, 0) == 0 for s in open_kinds),
            audit_intact=not audit.breaks and audit_cli.returncode == 0,
            store_failovers=sum(1 for f in _retry(store.failovers) if f["kind"] == "failover")
            if not ablation
            else None,
            seconds=round(time.monotonic() - started, 1),
        )
        store.close()
    return result


def ok(result: dict) -> bool:
    sound = not result["undeclared_states"] and result["audit_intact"]
    if result["mode"] == "ablation":
        return sound and result["duplicates"] > 0  # the rule matters: without it a failover sends twice
    return sound and result["duplicates"] == 0 and result["lost_submits"] == 0 and result["finished"]


def render(result: dict) -> str:
    mode = (
        "synchronous replication, store in HA mode `sync`"
        if result["mode"] == "sync"
        else "ablation: asynchronous replication, store without HA mode"
    )
    states = ", ".join(f"{k} {v}" for k, v in result["by_state"].items())
    return (
        f"| {mode} | {result['intents']} | {result['workers']} | {result['failovers']} | "
        f"{', '.join(str(s) for s in result['recover_seconds'])} | {result['duplicates']} | {result['lost_submits']} | "
        f"{states} | {'intact' if result['audit_intact'] else 'BROKEN'} | {result['seconds']} |"
    )


def write(path: Path, result: dict) -> None:
    """Put the run's row into the results table between the markers of ``path`` (one row per mode, replaced)."""
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(MARK_BEGIN, 1)
    body, tail = rest.split(MARK_END, 1)
    rows = [line for line in body.strip().splitlines() if line.startswith("| ") and not line.startswith("| run")]
    rows = [r for r in rows if not r.startswith("| ---") and ("ablation" in r) != (result["mode"] == "ablation")]
    header = (
        "| run | intents | worker processes | failovers | seconds to recover (each) | duplicates | "
        "acknowledged submits lost | final states | audit | seconds |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    rows.append(render(result))
    rows.sort(key=lambda r: "ablation" in r)
    path.write_text(head + MARK_BEGIN + "\n" + header + "\n" + "\n".join(rows) + "\n" + MARK_END + tail, "utf-8")


def main(argv: list[str] | None = None) -> int:
    # a pooled connection to a killed server fails its reset: expected here, and the store drops its pool for it
    logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        return worker_main(argv[1], argv[2], int(argv[3]))
    parser = argparse.ArgumentParser(prog="python -m tests.ha.load", description=__doc__.split("\n")[0])
    parser.add_argument("--intents", type=int, default=2000)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for every intent to settle")
    parser.add_argument("--ablation", action="store_true", help="synchronous replication and the HA mode off")
    parser.add_argument("--write", type=Path, help="record the result in this file's results table")
    args = parser.parse_args(argv)
    result = run(args.intents, args.failovers, args.workers, args.ablation, args.seed, args.timeout)
    for k, v in result.items():
        print(f"{k}: {v}")
    good = ok(result)
    print("OK" if good else "FAILED", "(ablation: a duplicate was expected)" if args.ablation else "")
    if args.write is not None:
        write(args.write, result)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
