"""The worker soak (``make soak-worker``, docs/soak.md): worker processes (``atmostonce worker``) on a throwaway
PostgreSQL for ``--seconds`` (``SOAK_SECONDS``, default one hour), publishing through the local platform sink
with faults injected, while the database is restarted under them and workers are SIGKILLed and started
again at random times. At the end: duplicates 0 (counted by the sink, which never dedupes), every intent in
a state of the table, nothing open left, and ``atmostonce audit verify`` intact.

    python -m tests.soak_worker --seconds 180 --write docs/soak.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from atmostonce.errors import StoreError
from atmostonce.identity import split_platform_idempotency_key
from atmostonce.names import STATE
from tests.worker_proc import REPO, SINK_PROFILE, WorkerProcess, write_config

FAULT_MIX = {
    "delay": 0.03,  # longer than the read timeout: unknown, and it may still land
    "error_before_write": 0.04,
    "error_after_write": 0.04,
    "drop_before_write": 0.04,
    "drop_after_write": 0.04,
    "reset": 0.03,
    "read_lag": 0.06,
}


def _toml_value(v: Any) -> str:
    return json.dumps(v)  # strings, numbers, booleans and lists of them read the same in TOML


def write_profile(path: Path, sink_url: str) -> Path:
    """The shipped local-sink profile, fenced (the sink keeps a tombstone for its lifetime) and with short
    timeouts, so a slow answer is an unknown outcome the reconciler must settle."""
    raw = tomllib.loads(SINK_PROFILE.read_text())
    http = dict(raw["http"])
    http.update(
        base_url=sink_url,
        key_field="/delivery_key",
        lookup_fenced=True,
        connect_timeout=2.0,
        write_timeout=2.0,
        read_timeout=0.8,
    )
    lines = [
        "format = 1",
        'name = "soak-sink"',
        'description = "the local sink, fenced, for the worker soak"',
        'transport = "http"',
        'outcomes = "http_outcomes.toml"',
        "read_lag_seconds = 0.4",
        "[tombstone]",
        'kept = "forever"',
        "[http]",
        *(f"{k} = {_toml_value(v)}" for k, v in http.items()),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_soak(
    seconds: float,
    *,
    workers: int = 3,
    rate: float = 3.0,
    restart_every: float = 60.0,
    kill_every: float = 30.0,
    settle_seconds: float = 180.0,
    seed: int = 1,
    progress=sys.stderr,
) -> dict[str, Any]:
    """Run the soak; returns its results (``ok`` says whether every check held)."""
    from atmostonce_http import PlatformSink
    from atmostonce_sql import open_store
    from atmostonce_sql.pgserver import LocalCluster

    rng = random.Random(seed)
    parent = tempfile.mkdtemp(prefix="atmostonce-soak-", dir="/tmp")
    os.chmod(parent, 0o755)  # the server's OS user must reach the cluster's folder
    # durable commits: an immediate stop is a crash, and a lost commit of an authorization would look unsent
    cluster = LocalCluster(os.path.join(parent, "pg"), remove_on_stop=False, fsync=True).start()
    procs: list[WorkerProcess] = []
    exits: list[int] = []
    counts = {"submitted": 0, "submit_errors": 0, "db_restarts": 0, "worker_kills": 0, "worker_starts": 0}
    store = None
    started = time.monotonic()

    def say(msg: str) -> None:
        if progress is not None:
            progress.write(f"[{time.monotonic() - started:7.1f}s] {msg}\n")
            progress.flush()

    try:
        url = cluster.create_database("soak")
        store = open_store(url)
        table = store.table
        with PlatformSink(dedupe=False, fenced_lookup=True, delay_seconds=1.2, read_lag_seconds=0.4) as sink:
            sink.set_fault_mix(FAULT_MIX, seed=seed)
            profile = write_profile(Path(parent) / "soak_sink.toml", sink.url)
            configs = []
            for i in range(workers):
                cfg = write_config(
                    Path(parent) / f"worker{i}.toml",
                    url,
                    None,
                    platform=profile,
                    workers=2,
                    owner=f"soak-worker-{i}",
                    drain_seconds=30.0,
                    intervals={"poll_seconds": 1.0, "sweep_seconds": 0.5, "reconcile_seconds": 0.5},
                    runtime={"lease_seconds": 3.0, "send_lease_seconds": 4.0, "retries_per_tick": 25},
                    logging={"level": "WARNING"},
                )
                configs.append(cfg)

            def start(i: int) -> WorkerProcess:
                counts["worker_starts"] += 1
                return WorkerProcess(configs[i])

            procs = [start(i) for i in range(workers)]
            deadline = started + seconds
            next_restart = started + rng.expovariate(1 / restart_every)
            next_kill = started + rng.expovariate(1 / kill_every)
            next_report = started + 10
            n = 0
            while (now := time.monotonic()) < deadline:
                for _ in range(max(1, round(rate * 0.5 * rng.uniform(0.5, 1.5)))):
                    try:
                        store.submit(f"soak-account-{n % 4}", "post", f"room-{n % 7}", {"text": f"soak post {n}"})
                        counts["submitted"] += 1
                        n += 1
                    except StoreError:
                        counts["submit_errors"] += 1
                        break
                if now >= next_restart:
                    down = rng.uniform(0.5, 4.0)
                    say(f"restarting PostgreSQL (down {down:.1f} s)")
                    cluster.stop()
                    time.sleep(down)
                    cluster.start()
                    counts["db_restarts"] += 1
                    next_restart = time.monotonic() + rng.expovariate(1 / restart_every)
                if now >= next_kill:
                    i = rng.randrange(workers)
                    exits.append(procs[i].kill())
                    procs[i].close()
                    counts["worker_kills"] += 1
                    say(f"SIGKILLed worker {i}")
                    procs[i] = start(i)
                    next_kill = time.monotonic() + rng.expovariate(1 / kill_every)
                if now >= next_report:
                    try:
                        say(" ".join(f"{k} {v}" for k, v in store.count_by_state().items()))
                    except StoreError:
                        say("(database down)")
                    next_report = now + 30
                time.sleep(0.5)
            say(f"chaos over after {counts['submitted']} submissions; settling")
            open_kinds = (STATE.pending, STATE.authorized, STATE.indeterminate, STATE.failed)
            settle_deadline = time.monotonic() + settle_seconds
            settled = False
            while time.monotonic() < settle_deadline:
                try:
                    by_state = store.count_by_state()
                except StoreError:
                    time.sleep(1)
                    continue
                if not any(by_state[s] for s in open_kinds):
                    settled = True
                    break
                time.sleep(1)
            reports = []
            for p in procs:
                rc, report = p.terminate(timeout=120)
                exits.append(rc)
                reports.append(report)
                p.close()
            procs = []
            by_state = store.count_by_state()
            intents = store.list_intents(limit=10_000_000)
            undeclared = sorted({it.state for it in intents} - set(table.states))
            by_key = sink.creates_by_key
            on_platform = {
                split_platform_idempotency_key(dk)[0]
                for dk in (obj["body"].get("delivery_key") for obj in sink.objects.values())
                if isinstance(dk, str) and dk
            }
            published_without_object = sum(1 for it in intents if it.state == "published" and it.key not in on_platform)
            audit = subprocess.run(
                [sys.executable, "-m", "atmostonce_cli.main", "--json", "audit", "verify", "--database-url", url],
                capture_output=True,
                text=True,
                timeout=600,
            )
            clean_exits = sum(1 for rc in exits if rc == 0)
            result = {
                "seconds": round(seconds),
                "wall_seconds": round(time.monotonic() - started, 1),
                "worker_processes": workers,
                "threads_per_worker": 2,
                **counts,
                "intents": len(intents),
                "by_state": by_state,
                "undeclared_states": undeclared,
                "settled": settled,
                "creates": sink.creates,
                "create_requests": sink.requests,
                "duplicates": sum(c - 1 for c in by_key.values() if c > 1),
                "published_without_object": published_without_object,
                "faults": dict(sorted(sink.faults_applied.items())),
                "audit_intact": audit.returncode == 0,
                "worker_exits": {"sigkill": sum(1 for rc in exits if rc == -9), "clean": clean_exits},
                "worker_errors_waited_out": sum(sum((r or {}).get("errors", {}).values()) for r in reports),
                "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            }
            result["ok"] = (
                result["duplicates"] == 0
                and not undeclared
                and settled
                and result["audit_intact"]
                and published_without_object == 0
                and clean_exits == workers
            )
            if not result["audit_intact"]:
                result["audit_output"] = (audit.stdout + audit.stderr)[-2000:]
            return result
    finally:
        for p in procs:
            p.close()
        if store is not None:
            store.close()
        cluster.remove_on_stop = True
        cluster.stop()
        shutil.rmtree(parent, ignore_errors=True)


def format_result(r: dict[str, Any]) -> str:
    rows = [
        ("duration (s)", f"{r['seconds']} (wall {r['wall_seconds']})"),
        ("worker processes x dispatch threads", f"{r['worker_processes']} x {r['threads_per_worker']}"),
        ("intents submitted", r["submitted"]),
        ("submissions refused while the database was down", r["submit_errors"]),
        ("PostgreSQL restarts (immediate stop)", r["db_restarts"]),
        ("workers SIGKILLed (and started again)", r["worker_kills"]),
        ("worker database errors waited out (last processes)", r["worker_errors_waited_out"]),
        ("faults injected by the sink", sum(r["faults"].values())),
        ("create requests the platform received", r["create_requests"]),
        ("objects the platform created", r["creates"]),
        ("duplicates (must be 0)", r["duplicates"]),
        ("published intents with no object (must be 0)", r["published_without_object"]),
        ("every intent in a declared state", not r["undeclared_states"]),
        ("nothing left open at the end", r["settled"]),
        ("audit verify intact", r["audit_intact"]),
    ]
    rows += [(f"  final: {s}", n) for s, n in r["by_state"].items()]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("OK" if r["ok"] else "FAILED")
    return "\n".join(lines)


def write_doc(path: Path, r: dict[str, Any]) -> None:
    text = f"""# The worker soak

`make soak-worker` (`SOAK_SECONDS`, default 3600) runs `python -m tests.soak_worker`: {r["worker_processes"]} worker
processes (`atmostonce worker --config FILE`, {r["threads_per_worker"]} dispatch threads each) on a throwaway
PostgreSQL cluster with durable commits, publishing through the local platform sink
(`atmostonce_http.PlatformSink`, no idempotency-key dedupe, a fenced lookup, faults injected on creates: delays
past the read timeout, errors and dropped connections before and after the write, resets, read lag), while
intents are submitted throughout, PostgreSQL is stopped (`pg_ctl stop -m immediate`) and started again at random
times, and workers are SIGKILLed at random times and started again. Then submissions stop, the workers settle
what is open, get SIGTERM and drain. The checks: the sink's duplicate count is 0, no published intent lacks its
object, every intent is in a state of the table and none is left open, `atmostonce audit verify` is intact, and
every last worker exits 0 after its drain ([the outbox service](design.md#the-outbox-service),
[the runtime](design.md#the-runtime), [operations](operations.md)).

The last recorded run ({r["date"]}, this machine, 2 cores shared), written by
`python -m tests.soak_worker --seconds {r["seconds"]} --write docs/soak.md`:

```
{format_result(r)}
```

Faults injected: {", ".join(f"{k} {v}" for k, v in r["faults"].items()) or "none"}.

A bounded form (12 s, at least one restart and one kill) runs in `make test` (`tests/test_soak_worker.py`).
"""
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 3600)))
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--rate", type=float, default=3.0, help="intents submitted per second")
    p.add_argument("--restart-every", type=float, default=60.0, help="mean seconds between database restarts")
    p.add_argument("--kill-every", type=float, default=30.0, help="mean seconds between worker SIGKILLs")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--write", type=Path, help="write the results to this Markdown file (docs/soak.md)")
    args = p.parse_args(argv)
    r = run_soak(
        args.seconds,
        workers=args.workers,
        rate=args.rate,
        restart_every=args.restart_every,
        kill_every=args.kill_every,
        seed=args.seed,
    )
    print(format_result(r))
    if args.write is not None:
        write_doc(args.write if args.write.is_absolute() else REPO / args.write, r)
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
