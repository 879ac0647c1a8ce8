"""Checked by ``make typecheck`` (mypy), not run by pytest: the shipped stores and transports satisfy the protocols
they are used through (``Store`` and each role's protocol, the implementers' ``StoreCore``, ``Transport``,
``AsyncTransport``), keyword for keyword."""

from __future__ import annotations

from atmostonce.aio import ThreadedTransport
from atmostonce.model import MemoryStore
from atmostonce.protocols import (
    AuditStore,
    IntakeStore,
    MaintenanceStore,
    OperatorStore,
    OutboxStore,
    Store,
    StoreCore,
    WorkerStore,
)
from atmostonce.transport import AsyncTransport, Transport
from atmostonce_email import EmailTransport
from atmostonce_function import FunctionTransport
from atmostonce_http import AsyncHttpTransport, HttpTransport
from atmostonce_matrix import MatrixTransport
from atmostonce_sql.store import SqlStore


def stores(sql: SqlStore, memory: MemoryStore) -> list[Store]:
    return [sql, memory]


def cores(sql: SqlStore, memory: MemoryStore) -> list[StoreCore]:
    return [sql, memory]


def roles(
    store: Store,
) -> tuple[WorkerStore, MaintenanceStore, IntakeStore, OperatorStore, AuditStore, OutboxStore]:
    # the union is every role: a store written to Store can be handed to every caller
    return store, store, store, store, store, store


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
