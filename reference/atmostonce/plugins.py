"""Open a store by URL through the ``atmostonce.stores`` entry points (the core imports no adapter).

A store plugin registers a factory ``factory(url, **options) -> Store`` under its URL scheme in the
``atmostonce.stores`` entry-point group (``pyproject.toml``: ``memory``, ``sqlite``, ``postgresql``); a
third-party store plugs in the same way.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from .store import Store

__all__ = [
    "DEFAULT_URL",
    "ENV_URL",
    "async_store_factory",
    "open_async_store",
    "open_store",
    "resolve_url",
    "scheme_of",
]

DEFAULT_URL = "sqlite:///atmostonce.sqlite3"
"""The store opened when neither a URL nor ``$ATMOSTONCE_DATABASE_URL`` names one: a SQLite file here."""
ENV_URL = "ATMOSTONCE_DATABASE_URL"
"""The environment variable read when no URL is given."""

_ALIASES = {"postgres": "postgresql"}
# running from a source tree with no installed distribution (no entry points): the same targets as
# pyproject's, by name, so the core still imports no adapter until a URL asks for it
_FALLBACK = {
    "memory": "atmostonce.model:open_memory_store",
    "sqlite": "atmostonce_sql:open_store",
    "postgresql": "atmostonce_sql:open_store",
}


# the native asyncio stores (docs/design.md#asyncio-the-async-outbox-and-stores): ``async factory(url, **options)``
# under its URL scheme in the ``atmostonce.async_stores`` group; a scheme without one has only its sync store
_ASYNC_FALLBACK = {
    "sqlite": "atmostonce_sql.aio:open_async_store",
    "postgresql": "atmostonce_sql.aio:open_async_store",
}

_ASYNC_DRIVERS = {"sqlite": ("greenlet", "aiosqlite"), "postgresql": ("greenlet", "psycopg")}

_EXTRAS = {"postgresql": "postgres"}  # the pyproject extra that installs a scheme's driver


def scheme_of(url: str) -> str:
    """The store scheme of a URL, lower case, without a driver suffix (``postgresql+psycopg://`` ->
    ``postgresql``; ``postgres://`` -> ``postgresql``)."""
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    return _ALIASES.get(scheme, scheme)


def resolve_url(url: str | None = None) -> str:
    """``url``, else ``$ATMOSTONCE_DATABASE_URL``, else :data:`DEFAULT_URL`. Raises ``ValueError`` for a
    blank URL."""
    if url is None:
        url = os.environ.get(ENV_URL) or DEFAULT_URL
    if not isinstance(url, str) or not url.strip():
        raise ValueError("the database URL is empty")
    return url


def _factory(
    scheme: str, group: str = "atmostonce.stores", fallback: dict[str, str] = _FALLBACK
) -> tuple[Callable[..., Any] | None, list[str]]:
    eps = {ep.name: ep for ep in entry_points(group=group)}
    if scheme in eps:
        return eps[scheme].load(), sorted(eps)
    target = fallback.get(scheme)
    if target is None:
        return None, sorted(eps)
    module, _, name = target.partition(":")
    return getattr(import_module(module), name), sorted(eps)


def open_store(url: str | None = None, **options: Any) -> Store:
    """Open the store at ``url`` (``sqlite:///path.sqlite3``, ``postgresql://user@host/db``, ``memory://``).

    ``url=None``: ``$ATMOSTONCE_DATABASE_URL``, else :data:`DEFAULT_URL`. ``options`` go to the scheme's
    factory unchanged (for the SQL stores e.g. ``migrate=``, ``check_sequences=``; see
    ``atmostonce_sql.open_store``). The caller owns the store: ``close()`` it when done.

    Raises ``ValueError`` for a blank URL or a scheme no installed plugin handles, ``ModuleNotFoundError``
    naming the extra to install when the scheme's driver is missing (``atmostonce[postgres]``); whatever the factory
    raises otherwise (``StoreError`` when the database cannot be opened, ``SequenceBehind`` after a partial
    restore).
    """
    url = resolve_url(url)
    scheme = scheme_of(url)
    try:
        factory, installed = _factory(scheme)
        if factory is None:
            raise ValueError(f"no store plugin for {scheme!r} URLs (installed: {installed or 'none'})")
        store: Store = factory(url, **options)
        return store
    except ModuleNotFoundError as exc:
        extra = _EXTRAS.get(scheme)
        hint = f": pip install 'atmostonce[{extra}]'" if extra else ""
        raise ModuleNotFoundError(
            f"the {scheme} store needs {exc.name!r}, which is not installed{hint}", name=exc.name
        ) from exc


def async_store_factory(url: str | None = None) -> Callable[..., Awaitable[Any]] | None:
    """The ``atmostonce.async_stores`` factory for ``url``'s scheme, or ``None`` when the scheme has no native
    asyncio store (``memory://``, a plugin with only a sync store). Raises ``ModuleNotFoundError`` naming the
    extra to install when the async driver is missing (``atmostonce[postgres]`` for PostgreSQL)."""
    scheme = scheme_of(resolve_url(url))
    try:
        factory, _ = _factory(scheme, "atmostonce.async_stores", _ASYNC_FALLBACK)
        if factory is not None and scheme in _ASYNC_DRIVERS:  # imported on first use: ask for them now
            for module in _ASYNC_DRIVERS[scheme]:
                import_module(module)
        return factory
    except ModuleNotFoundError as exc:
        hint = "pip install 'atmostonce[postgres]'" if exc.name == "psycopg" else "reinstall atmostonce"
        raise ModuleNotFoundError(
            f"the async {scheme} store needs {exc.name!r}, which is not installed: {hint}", name=exc.name
        ) from exc


async def open_async_store(url: str | None = None, **options: Any) -> Any:
    """``atmostonce.open_async_store``: open the native asyncio store at ``url`` (``sqlite:///path.sqlite3``,
    ``postgresql://user@host/db``; ``None`` as in :func:`open_store`): for the SQL stores an
    ``atmostonce_sql.AsyncSqlStore``, every store operation a coroutine. ``options`` go to the factory (for the
    SQL stores :func:`open_store`'s: ``migrate=``, ``check_sequences=``, ``pool_size=``). The caller owns the
    store: ``await store.aclose()`` (or ``async with``).

    Raises ``ValueError`` for a blank URL or a scheme with no async store (``memory://``),
    ``ModuleNotFoundError`` naming the extra when the async driver is missing, and what the factory raises
    (``StoreError``, ``SequenceBehind``).
    """
    factory = async_store_factory(url)
    if factory is None:
        raise ValueError(f"no async store plugin for {scheme_of(resolve_url(url))!r} URLs")
    return await factory(resolve_url(url), **options)
