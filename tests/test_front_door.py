"""The front door (docs/design.md#the-outbox-service): ``atmostonce.open_store`` resolves a URL's scheme through the ``atmostonce.stores``
entry points, and nothing imports a store opener from the CLI package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import atmostonce
from atmostonce import MemoryStore, Store
from atmostonce.plugins import DEFAULT_URL, ENV_URL, resolve_url, scheme_of

ROOT = Path(__file__).resolve().parents[1]


def test_open_store_opens_each_registered_scheme(tmp_path):
    mem = atmostonce.open_store("memory://")
    assert isinstance(mem, MemoryStore) and isinstance(mem, Store)
    sql = atmostonce.open_store(f"sqlite:///{tmp_path / 'a.sqlite3'}")
    try:
        assert isinstance(sql, Store)
        it = sql.submit("acct", "post", "room", {"text": "hi"})
        assert sql.get(it.key).state == sql.table.initial
    finally:
        sql.close()


def test_open_store_reads_the_environment_then_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_URL, "memory://")
    assert isinstance(atmostonce.open_store(), MemoryStore)
    monkeypatch.delenv(ENV_URL)
    assert resolve_url(None) == DEFAULT_URL
    assert resolve_url("memory://") == "memory://"


def test_open_store_refuses_an_unknown_scheme_and_a_blank_url():
    with pytest.raises(ValueError, match="no store plugin for 'nosuch'"):
        atmostonce.open_store("nosuch://x")
    with pytest.raises(ValueError, match="empty"):
        atmostonce.open_store("  ")


def test_scheme_of_drops_the_driver_and_maps_aliases():
    assert scheme_of("postgresql+psycopg://u@h/db") == "postgresql"
    assert scheme_of("postgres://u@h/db") == "postgresql"
    assert scheme_of("SQLite:///x") == "sqlite"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level and path.parent.name == "atmostonce_cli":
                mod = f"atmostonce_cli.{mod}" if mod else "atmostonce_cli"
            names.add(mod)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_nothing_imports_a_store_opener_from_the_cli_package():
    shim = ROOT / "adapters" / "atmostonce_cli" / "stores.py"
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("reference", "adapters", "tests", "mutation")
        for p in (ROOT / folder).rglob("*.py")
        if p != shim and "atmostonce_cli.stores" in _imports(p)
    ]
    assert offenders == []


@pytest.mark.parametrize("scheme", ["memory", "sqlite"])
def test_a_store_opened_in_a_with_block_is_closed_when_the_block_ends(tmp_path, monkeypatch, scheme):
    url = "memory://" if scheme == "memory" else f"sqlite:///{tmp_path / 'a.sqlite3'}"
    closed = []
    with atmostonce.open_store(url) as store:
        monkeypatch.setattr(store, "close", lambda: closed.append(True))
        key = store.submit("acct", "post", "room", {"text": "hi"}).key
        assert store.get(key).state == store.table.initial
    assert closed == [True]


def test_a_sqlite_store_closed_by_its_with_block_holds_no_connection(tmp_path):
    with atmostonce.open_store(f"sqlite:///{tmp_path / 'a.sqlite3'}") as store:
        store.submit("acct", "post", "room", {"text": "hi"})
        pools = [store._exec.engine.pool, store._exec.autocommit.pool]
        assert sum(p.checkedin() for p in pools if hasattr(p, "checkedin")) > 0
    assert all(
        p.checkedin() == 0 for p in [store._exec.engine.pool, store._exec.autocommit.pool] if hasattr(p, "checkedin")
    )
