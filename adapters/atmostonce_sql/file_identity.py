"""SQLite: which file a database is (docs/design.md#the-restore-protocol).

A copy of a SQLite file, or a backup put back in its place, holds data consistent with itself, so no check of
sequences can tell it from the original; but it may not show the sends its original made after it was taken,
and its workers would make them again. The file's identity (device and inode number) is recorded in
``aom_meta`` the first time the store opens it; opening a file whose identity differs raises
:class:`~atmostonce.errors.StoreCopied`, and ``db declare-restore`` records the new one as it fences the open
work. A move or rename on one file system keeps the identity; a copy, a restore or a file replaced does not."""

from __future__ import annotations

import os

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from atmostonce.errors import StoreCopied

from .schema import meta

DEVICE, INODE = "sqlite_file_device", "sqlite_file_inode"
"""The ``aom_meta`` rows that hold the file's identity."""


def sqlite_path(engine: Engine) -> str | None:
    """The path of ``engine``'s SQLite database on disk, or ``None`` (another database, memory, a URI)."""
    u = engine.url
    if u.get_backend_name() != "sqlite":
        return None
    path = u.database or ""
    if path in ("", ":memory:") or path.startswith("file:"):
        return None
    return path


def _signed(n: int) -> int:
    """``n`` as a signed 64-bit integer (an inode number may use all 64 bits; ``aom_meta.value`` is signed)."""
    n &= (1 << 64) - 1
    return n - (1 << 64) if n >= 1 << 63 else n


def identity(path: str) -> tuple[int, int]:
    """The file's ``(device, inode)``, each as a signed 64-bit integer."""
    st = os.stat(path)
    return _signed(st.st_dev), _signed(st.st_ino)


def _recorded(conn: Connection) -> dict[str, int]:
    rows = conn.execute(sa.select(meta.c.name, meta.c.value).where(meta.c.name.in_((DEVICE, INODE))))
    return {name: int(value) for name, value in rows}


def check(conn: Connection, path: str) -> bool:
    """Inside ``conn``'s transaction: record the file's identity if none is, else compare it. Returns whether it
    wrote (the caller commits). Raises :class:`StoreCopied` when the file is not the one recorded."""
    found = identity(path)
    stored = _recorded(conn)
    if not stored:
        record(conn, path)
        return True
    recorded = (stored.get(DEVICE, 0), stored.get(INODE, 0))
    if recorded != found:
        raise StoreCopied(path, recorded, found)
    return False


def record(conn: Connection, path: str) -> None:
    """Inside ``conn``'s transaction: the file at ``path`` is this database's own from now on."""
    for name, value in zip((DEVICE, INODE), identity(path), strict=True):
        conn.execute(sa.delete(meta).where(meta.c.name == name))
        conn.execute(sa.insert(meta).values(name=name, value=value))
