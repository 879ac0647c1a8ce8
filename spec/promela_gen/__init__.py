"""The Promela generator behind ``spec/promela.py`` (docs/formal.md).

* ``templates/*.pml``: the fixed environment, Promela text with ``${name}`` placeholders
  (``string.Template``): ``model.pml`` the file's skeleton and header, ``main.pml`` the intent
  model's processes, ``text.pml`` the other intent, ``restore.pml`` the database that backs up and
  restores, ``claims.pml`` the claims configuration's processes;
* ``configurations/``: one module per model-check configuration (main, text, restore, claims):
  its cpp flags and what it generates from the tables into its template;
* ``guards.py``: the registry of guard translations (table guard -> Promela expression), the
  counterpart of ``reference/atmostonce/guards.py`` and ``adapters/atmostonce_sql/guards.py``;
* ``model.py``: :func:`generate`, the whole file; ``base.py``: bounds, errors, shared helpers.
"""

from __future__ import annotations

from .base import Bounds, GenerationError
from .model import PROPERTIES, generate

__all__ = ["PROPERTIES", "Bounds", "GenerationError", "generate"]
