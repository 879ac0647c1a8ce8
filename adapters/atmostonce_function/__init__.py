"""Any Python call as a transport (docs/platforms.md).

* :class:`FunctionTransport`: ``atmostonce.transport.Transport`` around a user's ``send``, optional
  ``read_back`` and optional ``lookup`` callables (an SDK call: smtplib, a chat client, a payments client).
* :class:`FunctionTransportError`: a read-back or lookup callable failed; never "not found".

Exceptions the send callable raises are classified by ``spec/exception_outcomes.toml``
(:mod:`atmostonce_function.classify`); one no row knows is unknown, never not sent.
"""

from __future__ import annotations

from .classify import ExceptionTable, ExceptionTableError, exception_table, load_exception_table
from .transport import FunctionTransport, FunctionTransportError

__all__ = [
    "ExceptionTable",
    "ExceptionTableError",
    "FunctionTransport",
    "FunctionTransportError",
    "exception_table",
    "load_exception_table",
]
