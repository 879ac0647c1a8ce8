"""atmostonce: publish a side effect at most once.

The public API is small: the front door (``atmostonce.open(url, transport=...)``,
an :class:`Outbox` that submits and runs dispatch, sweeper and reconciler; ``atmostonce.open_async`` for
asyncio, an :class:`AsyncOutbox`;
:func:`open_store`, a store by URL), the table, the identities, the store protocol and its in-memory reference
model, and the errors. Adapters (SQL stores, HTTP transport, CLI) are separate
packages found through entry points; this core imports none of them until a URL
asks for one.
"""

from .aio import AsyncOutbox, open_async
from .errors import (
    AppendOnlyViolation,
    AtMostOnceError,
    FoundOnPlatform,
    GuardRefused,
    IllegalMove,
    IntakeCode,
    IntakeError,
    LookupAnswerError,
    NoSynchronousStandby,
    NotVerified,
    ObjectOnRecord,
    Rejected,
    RetractionUnsupported,
    SchemaNewer,
    SequenceBehind,
    StoreError,
    StoreNotFound,
    UnknownIntent,
)
from .identity import DeliveryKey, attempt_token, canonical_json, delivery_key, normalize_text, request_digest
from .model import MemoryStore
from .plugins import open_async_store, open_store
from .records import Attempt, HistoryEntry, Intent, Lease, Plan, Reconciliation
from .service import Outbox, OutboxReport, open_outbox
from .store import Store
from .table import Table, TableError, load_table, table

open = open_outbox
"""``atmostonce.open(url, transport=...)``: an :class:`Outbox` over the store at ``url`` (see ``open_outbox``).
Not in ``__all__``: a star import would shadow the builtin ``open``."""

__all__ = [
    "AppendOnlyViolation",
    "AsyncOutbox",
    "AtMostOnceError",
    "Attempt",
    "DeliveryKey",
    "GuardRefused",
    "HistoryEntry",
    "IllegalMove",
    "IntakeCode",
    "IntakeError",
    "Intent",
    "Lease",
    "MemoryStore",
    "Outbox",
    "OutboxReport",
    "FoundOnPlatform",
    "LookupAnswerError",
    "ObjectOnRecord",
    "NotVerified",
    "Plan",
    "Reconciliation",
    "Rejected",
    "RetractionUnsupported",
    "NoSynchronousStandby",
    "SchemaNewer",
    "SequenceBehind",
    "Store",
    "StoreError",
    "StoreNotFound",
    "Table",
    "TableError",
    "UnknownIntent",
    "attempt_token",
    "canonical_json",
    "delivery_key",
    "load_table",
    "normalize_text",
    "open_async",
    "open_async_store",
    "open_outbox",
    "open_store",
    "request_digest",
    "table",
]

__version__ = "0.1.0"
