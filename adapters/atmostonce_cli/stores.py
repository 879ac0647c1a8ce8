"""Open a store by URL through the ``atmostonce.stores`` entry points (the core imports no adapter)."""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from typing import Any

from atmostonce.store import Store

__all__ = ["DEFAULT_URL", "open_store_url", "scheme_of"]

DEFAULT_URL = "sqlite:///atmostonce.sqlite3"
_ALIASES = {"postgres": "postgresql"}


def scheme_of(url: str) -> str:
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    return _ALIASES.get(scheme, scheme)


def _fallback(scheme: str):
    # running from a source tree without an installed distribution: same targets as pyproject's entry points
    if scheme in ("sqlite", "postgresql"):
        from atmostonce_sql import open_store

        return open_store
    if scheme == "memory":
        from atmostonce.model import open_memory_store

        return open_memory_store
    return None


def open_store_url(url: str | None = None, **kw: Any) -> Store:
    """Open the store at ``url`` (default ``$ATMOSTONCE_DATABASE_URL`` or ``sqlite:///atmostonce.sqlite3``).

    Raises ``ValueError`` for a scheme no installed plugin handles.
    """
    if url is None:
        url = os.environ.get("ATMOSTONCE_DATABASE_URL") or DEFAULT_URL
    if not url.strip():
        raise ValueError("the database URL is empty")
    scheme = scheme_of(url)
    eps = {ep.name: ep for ep in entry_points(group="atmostonce.stores")}
    factory = eps[scheme].load() if scheme in eps else _fallback(scheme)
    if factory is None:
        raise ValueError(f"no store plugin for {scheme!r} URLs (installed: {sorted(eps) or 'none'})")
    return factory(url, **kw)
