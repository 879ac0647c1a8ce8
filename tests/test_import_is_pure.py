"""``import atmostonce`` is pure: it reads no table file and loads neither the conformance suite nor any tool;
the tables are read on first use and cached (docs/design.md#package-layout)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: this test process has long since loaded the tables. Every way the package reads
# a table (tomllib, then the JSON schema through jsonschema) is made to raise, then the package is imported;
# the script reports what was loaded, and whether a table was read, as JSON.
_SCRIPT = textwrap.dedent(
    """
    import json, sys, tomllib

    reads = []

    def refusing(original):
        def refuse(*args, **kwargs):
            if "/mutmut/" in sys._getframe(1).f_code.co_filename:  # under mutmut: it reads its own settings
                return original(*args, **kwargs)
            reads.append("tomllib")
            raise AssertionError("a TOML file was parsed during import")
        return refuse

    tomllib.load, tomllib.loads = refusing(tomllib.load), refusing(tomllib.loads)
    import atmostonce

    tables = sys.modules["atmostonce.table"]

    def cached(f):  # under mutmut the function is its trampoline, without the cache's counters
        return f.cache_info().currsize if hasattr(f, "cache_info") else 0

    print(json.dumps({
        "reads": reads,
        "table_cached": cached(tables.table),
        "machines_cached": cached(tables.machine),
        "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("atmostonce", "tools", "jsonschema")),
    }))
    """
)


def _import_in_a_fresh_interpreter() -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_package_reads_no_table_file():
    report = _import_in_a_fresh_interpreter()
    assert report["reads"] == []
    assert report["table_cached"] == 0
    assert report["machines_cached"] == 0
    assert not [m for m in report["loaded"] if m.split(".")[0] == "jsonschema"]


def test_importing_the_package_loads_neither_the_conformance_suite_nor_the_docs_tool():
    loaded = _import_in_a_fresh_interpreter()["loaded"]
    assert "atmostonce" in loaded
    assert not [m for m in loaded if m.startswith(("atmostonce.conformance", "atmostonce.testing", "tools"))]


def test_the_tables_load_on_first_use_and_are_cached():
    import atmostonce
    from atmostonce.model import MemoryStore

    assert atmostonce.table() is atmostonce.table()
    store = MemoryStore()
    assert store.approval_table is MemoryStore().approval_table
    assert store.claim_table is MemoryStore().claim_table


def test_the_docs_generator_is_not_part_of_the_package():
    import importlib.util

    assert importlib.util.find_spec("atmostonce.docgen") is None
