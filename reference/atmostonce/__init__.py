"""atmostonce: publish a side effect at most once.

The public API is small: the table, the identities, the store protocol and its
in-memory reference model, and the errors. Adapters (SQL stores, HTTP
transport, CLI) are separate packages found through entry points; this core
imports none of them.
"""

from .errors import (
    AppendOnlyViolation,
    AtMostOnceError,
    GuardRefused,
    IllegalMove,
    IntakeError,
    Rejected,
    StoreError,
    UnknownIntent,
)
from .identity import DeliveryKey, attempt_token, canonical_json, delivery_key, normalize_text, request_digest
from .model import MemoryStore
from .records import Attempt, HistoryEntry, Intent, Lease, Plan, Reconciliation
from .store import Store
from .table import Table, TableError, load_table, table

__all__ = [
    "AppendOnlyViolation",
    "AtMostOnceError",
    "Attempt",
    "DeliveryKey",
    "GuardRefused",
    "HistoryEntry",
    "IllegalMove",
    "IntakeError",
    "Intent",
    "Lease",
    "MemoryStore",
    "Plan",
    "Reconciliation",
    "Rejected",
    "Store",
    "StoreError",
    "Table",
    "TableError",
    "UnknownIntent",
    "attempt_token",
    "canonical_json",
    "delivery_key",
    "load_table",
    "normalize_text",
    "request_digest",
    "table",
]

__version__ = "0.1.0"
