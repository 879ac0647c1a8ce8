"""Kept for old imports: the store opener lives in the core now (``atmostonce.open_store``)."""

from __future__ import annotations

from atmostonce.plugins import DEFAULT_URL, open_store, scheme_of

open_store_url = open_store

__all__ = ["DEFAULT_URL", "open_store_url", "scheme_of"]
