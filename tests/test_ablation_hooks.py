"""The ablation hooks exist only for the mutation runner (docs/design.md#static-checks): no configuration switches them on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from atmostonce import MemoryStore
from atmostonce_sql import open_store

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = [ROOT / "reference" / "atmostonce", *(ROOT / "adapters").glob("atmostonce_*")]


def test_no_shipped_code_reads_an_ablation_setting_from_the_environment_or_config():
    for folder in SHIPPED:
        for path in folder.rglob("*.py"):
            text = path.read_text("utf-8")
            for line in text.splitlines():
                if "_disabled_guards" in line:
                    # only the initial empty value and the evaluation may mention it
                    assert re.search(
                        r"_disabled_guards(: frozenset\[str\])? = frozenset\(\)|in self\._disabled_guards|"
                        r"not in self\._disabled_guards|\(ev\.name, self\._disabled_guards\)|self\._disabled_guards, coupled\)",
                        line,
                    ), f"{path}: {line.strip()}"
            assert "ATMOSTONCE_ABLATE" not in text and "ablat" not in text.lower(), path


def test_stores_accept_no_ablation_argument(tmp_path):
    with pytest.raises(TypeError):
        MemoryStore(disabled_guards={"lease_holder"})  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        open_store(f"sqlite:///{tmp_path / 'a.sqlite3'}", disabled_guards={"lease_holder"})


def test_a_fresh_store_evaluates_every_guard(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'b.sqlite3'}")
    assert MemoryStore()._disabled_guards == frozenset() and store._disabled_guards == frozenset()
    store.close()


def test_the_mutation_package_is_not_shipped_in_the_wheel():
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    packages = re.search(r"packages = \[(.*?)\]", text, re.S).group(1)
    assert "mutation" not in packages
