"""A worker process (``atmostonce worker --config FILE``) under test: its config file, its JSON log records
(read from stderr as they come), and a graceful or a brutal end. Used by the worker tests and the soak."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SINK_PROFILE = REPO / "spec" / "platforms" / "local_sink.toml"


def write_config(
    path: Path, database_url: str, sink_url: str | None, *, platform: Path = SINK_PROFILE, **extra: Any
) -> Path:
    """A worker config for the local sink at ``sink_url`` (``None``: the ``platform`` profile names its URL);
    ``extra`` adds top-level fields or tables."""
    lines = [
        f"database_url = {json.dumps(database_url)}",
        f"platform = {json.dumps(str(platform))}",
    ]
    tables = {k: v for k, v in extra.items() if isinstance(v, dict)}
    for k, v in extra.items():
        if not isinstance(v, dict):
            lines.append(f"{k} = {json.dumps(v)}")
    overrides = {**({} if sink_url is None else {"base_url": sink_url}), **tables.pop("platform_overrides", {})}
    if overrides:
        tables["platform_overrides"] = overrides
    for name, fields in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in fields.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class WorkerProcess:
    """``atmostonce worker`` in a child process; ``records`` are its JSON log records so far."""

    def __init__(self, config: Path, *args: str, env: dict[str, str] | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "atmostonce_cli.main", "worker", "--config", str(config), "--json", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.records: list[dict[str, Any]] = []
        self.other: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                rec = json.loads(line)
            except ValueError:
                rec = None
            with self._cond:
                if isinstance(rec, dict):
                    self.records.append(rec)
                else:
                    self.other.append(line)
                self._cond.notify_all()

    def wait_for(self, pred, timeout: float = 60.0, what: str = "a log record") -> dict[str, Any]:
        """The first record (old or new) for which ``pred(record)`` holds; ``AssertionError`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for rec in self.records:
                    if pred(rec):
                        return rec
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no {what} from the worker; stderr: {''.join(self.other)[-2000:]}")
                self._cond.wait(min(left, 0.5))

    def events(self, name: str) -> list[dict[str, Any]]:
        with self._cond:
            return [r for r in self.records if r.get("event") == name]

    def terminate(self, timeout: float = 60.0) -> tuple[int, dict[str, Any] | None]:
        """SIGTERM, then the exit code and the report the worker printed (``--json``)."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout)
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self._reader.join(10)
        try:
            report = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
        except ValueError:
            report = None
        return self.proc.returncode, report

    def kill(self) -> int:
        self.proc.kill()
        self.proc.wait(30)
        self._reader.join(10)
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
