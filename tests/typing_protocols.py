"""Checked by ``make typecheck`` (mypy), not run by pytest: the shipped stores and transports satisfy the protocols
they are used through (``Store``, ``Transport``, ``AsyncTransport``), keyword for keyword."""

from __future__ import annotations

from atmostonce.aio import ThreadedTransport
from atmostonce.model import MemoryStore
from atmostonce.store import Store
from atmostonce.transport import AsyncTransport, Transport
from atmostonce_email import EmailTransport
from atmostonce_function import FunctionTransport
from atmostonce_http import AsyncHttpTransport, HttpTransport
from atmostonce_matrix import MatrixTransport
from atmostonce_sql.store import SqlStore


def stores(sql: SqlStore, memory: MemoryStore) -> list[Store]:
    return [sql, memory]


def transports(
    http: HttpTransport,
    matrix: MatrixTransport,
    email: EmailTransport,
    function: FunctionTransport,
    bridge: ThreadedTransport,
) -> list[Transport]:
    return [http, matrix, email, function, bridge]


def async_transports(http: AsyncHttpTransport) -> list[AsyncTransport]:
    return [http]
