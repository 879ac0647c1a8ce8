"""Where a CLI command's database URL comes from, and how it is shown to a person."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

from atmostonce.plugins import DEFAULT_URL, ENV_URL

__all__ = ["display_url", "resolve_url", "usable_url"]


def resolve_url(url: str | None = None) -> str:
    """The URL a command acts on: ``url`` when given, else ``$ATMOSTONCE_DATABASE_URL``, else ``DEFAULT_URL``."""
    if url is None:
        url = os.environ.get(ENV_URL) or DEFAULT_URL
    return url


def display_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for output a person reads."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def usable_url(url: str) -> tuple[str, bool]:
    """``url`` as a person may pass it back to ``--database-url``: the whole URL (user, host, database,
    query such as ``?host=/run/postgresql``) with only the password left out; and whether one was left out
    (give it through ``PGPASSWORD`` or ``~/.pgpass`` then). Never a fragment that no longer parses."""
    parts = urlsplit(url)
    if parts.password is None:
        return url, False
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.netloc.rsplit("@", 1)[0].split(":", 1)[0]  # as written (still percent-encoded)
    return urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host)), True
