"""A publisher process for the restart test: ``python -m tests.matrix.publisher_process ARGS``.

Opens the store and a :class:`MatrixTransport` (logging in with the persisted device), prints
one JSON line with its identity, dispatches the pending intents in the given order, and either
finishes (exit 0) or dies hard (``os._exit(CRASH_EXIT)``, no cleanup at all) at the
``after_send`` boundary of dispatch number ``--die-after-send``. Run with ``-m`` from the
repository root, so that ``tests/matrix/__init__.py`` runs first (it makes ``atmostonce_matrix``
importable from a checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from atmostonce.runtime import Dispatcher, RuntimeConfig
from atmostonce_matrix import MatrixConfig, MatrixTransport
from atmostonce_sql import open_store

CRASH_EXIT = 75


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--database-url", required=True)
    p.add_argument("--config", required=True, help="MatrixConfig as JSON")
    p.add_argument("--keys", required=True, help="comma-separated delivery keys, dispatched in this order")
    p.add_argument("--die-after-send", type=int, default=0, help="die at after_send of this dispatch (1-based)")
    args = p.parse_args(argv)
    store = open_store(args.database_url, migrate=False, pool_size=2)
    transport = MatrixTransport(MatrixConfig.from_mapping(json.loads(args.config)))
    print(json.dumps({"device_id": transport.device_id, "token": transport.token_fingerprint}), flush=True)
    sends = 0

    def crash(point: str) -> None:
        nonlocal sends
        if point == "after_send":
            sends += 1
            if sends == args.die_after_send:
                print(json.dumps({"dying_after_send": sends}), flush=True)
                os._exit(CRASH_EXIT)  # a real process death: no close, no lease release, no logout

    config = RuntimeConfig(lease_seconds=30, send_lease_seconds=30, reconcile_interval=0)
    dispatcher = Dispatcher(store, transport, config, crash=crash)
    for key in args.keys.split(","):
        if store.get(key).state == "pending":
            print(json.dumps({"key": key, "outcome": dispatcher.dispatch(key)}), flush=True)
    transport.close()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
