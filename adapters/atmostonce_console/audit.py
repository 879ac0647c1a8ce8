"""The console's action log: one JSON line per operator action, appended and flushed to disk before the
page answers (docs/console.md). Intent moves are also in the store's history chain under the operator's
name (docs/design.md, "The audit: order, tamper evidence, the role, reconciliation records"); the policy
setters and ``retry`` take no operator in the store, so this log is where the console attributes them."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["ActionLog"]


class ActionLog:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8"):  # refuse to start when it cannot be written
            pass

    def record(self, *, operator: str, action: str, subject: str, reason: str | None, result: dict[str, Any]) -> dict:
        row = {
            "at": time.time(),
            "operator": operator,
            "action": action,
            "subject": subject,
            "reason": reason,
            "result": result,
        }
        line = json.dumps(row, sort_keys=True, default=str, ensure_ascii=False)
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        return row

    def rows(self, limit: int = 500) -> list[dict[str, Any]]:
        """The newest ``limit`` rows, newest first."""
        if not self.path.exists():
            return []
        with self._lock:
            lines = self.path.read_text("utf-8").splitlines()
        return [json.loads(x) for x in reversed(lines[-limit:]) if x.strip()]
