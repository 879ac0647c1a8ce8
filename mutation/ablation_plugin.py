"""pytest plugin used only by ``mutation/ablate.py``: switches one ablation on for one test run.

Loaded explicitly with ``-p mutation.ablation_plugin --ablate=LAYER:KIND:NAME``. It lives outside the
shipped packages (the wheel has no ``mutation`` package), and nothing in the library reads an
environment variable or setting to disable a guard: the hooks are private attributes set here.

LAYER: ``model``, ``sqlite``, ``postgresql`` or ``runtime``. KIND and NAME:

* ``guard:<guard>``: the guard is left out of that layer's evaluation (model predicate or SQL fragment);
* ``source:<event>/<state>``: the state is removed from the event's source states in that layer;
* ``approval-source:<event>/<state>``, ``claim-source:<event>/<state>``: the same for the approval or
  claim machine (spec/approval.toml, spec/claim.toml);
* ``coupling:<event>``: the intent event no longer moves the claim it couples (its ``couples`` and
  ``couples_required`` are emptied) in that layer;
* ``outcome:<outcome>=<event>``: the runtime records ``outcome`` with ``event`` instead;
* ``refusal:<guard>`` (runtime): the table no longer says the guard's refusal is a wait (its
  ``refusal_outcome`` is dropped from ``Table.waiting_guards``), so the dispatcher treats it as it
  treats any other refusal it cannot explain;
* ``guard-and-backstop:<guard>`` (SQL layers): the guard's fragment is left out as for ``guard:``, and
  the database object that enforces the same rule a second time (``BACKSTOPS``) is dropped from the
  database the store opens, so the rule is gone from that layer altogether.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

# guards whose SQL fragment a database object backs up (spec 004 M6: the duplicate-text exclusion lives in
# the database): removing the fragment alone is equivalent (mutation/expected.json), so the ablation also
# removes the object. Statement per dialect; each is idempotent, since every store opened runs it.
BACKSTOPS = {
    "text_window_clear": {
        "sqlite": "DROP TRIGGER IF EXISTS aom_text_claims_window",
        "postgresql": "ALTER TABLE aom_text_claims DROP CONSTRAINT IF EXISTS aom_text_claims_window",
    },
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--ablate", default=None, help="LAYER:KIND:NAME (see mutation/ablate.py)")


def _table_without_source(event: str, state: str):
    from atmostonce.table import table

    t = table()
    ev = t.events[event]
    events = dict(t.events)
    events[event] = dataclasses.replace(ev, sources=tuple(s for s in ev.sources if s != state))
    return dataclasses.replace(t, events=MappingProxyType(events))


def _table_without_coupling(event: str):
    from atmostonce.table import table

    t = table()
    events = dict(t.events)
    events[event] = dataclasses.replace(t.events[event], couples=MappingProxyType({}), couples_required=())
    return dataclasses.replace(t, events=MappingProxyType(events))


def _machine_without_source(mname: str, event: str, state: str):
    from atmostonce.table import machine

    t = machine(mname)
    ev = t.events[event]
    events = dict(t.events)
    events[event] = dataclasses.replace(ev, sources=tuple(s for s in ev.sources if s != state))
    return dataclasses.replace(t, events=MappingProxyType(events))


def pytest_configure(config: pytest.Config) -> None:
    spec = config.getoption("--ablate")
    if not spec:
        return
    layer, kind, name = spec.split(":", 2)
    mp = pytest.MonkeyPatch()
    config.add_cleanup(mp.undo)

    if kind == "refusal":
        from atmostonce.table import Table

        waiting = Table.waiting_guards.fget

        mp.setattr(
            Table,
            "waiting_guards",
            property(lambda t: MappingProxyType({g: o for g, o in waiting(t).items() if g != name})),
        )
        return

    if kind == "outcome":
        from atmostonce.runtime import Dispatcher

        outcome, event = name.split("=", 1)
        original = Dispatcher._record

        def _record(self, out, lease, **kw):
            if out == outcome:
                return getattr(self.store, event)(lease, **kw)
            return original(self, out, lease, **kw)

        mp.setattr(Dispatcher, "_record", _record)
        return

    if layer == "model":
        from atmostonce.model import MemoryStore as cls
    else:
        from atmostonce_sql.store import SqlStore as cls
    original_init = cls.__init__

    def __init__(self, *args, **kwargs):
        if kind == "source" and layer == "model":
            kwargs["table"] = _table_without_source(*name.split("/", 1))
        if kind == "coupling" and layer == "model":
            kwargs["table"] = _table_without_coupling(name)
        original_init(self, *args, **kwargs)
        if layer != "model" and self.dialect != layer:
            return
        if kind in ("guard", "guard-and-backstop"):
            self._disabled_guards = frozenset({name})
        if kind == "guard-and-backstop":
            import sqlalchemy as sa

            with self.engine.begin() as conn:
                conn.execute(sa.text(BACKSTOPS[name][layer]))
        elif kind == "source" and layer != "model":
            self.table = _table_without_source(*name.split("/", 1))
            self._cache.clear()
        elif kind == "coupling" and layer != "model":
            self.table = _table_without_coupling(name)
            self._cache.clear()
        elif kind.endswith("-source"):
            mname = kind.removesuffix("-source")
            setattr(self, f"{mname}_table", _machine_without_source(mname, *name.split("/", 1)))
            if layer != "model":
                self._cache.clear()

    mp.setattr(cls, "__init__", __init__)
