"""The README's Python blocks run verbatim (docs/design.md#the-outbox-service), in order, as one script, twice in a row on the same SQLite
file in a fresh folder: the second run finds every intent published and sends nothing again."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", README.read_text("utf-8"), flags=re.S | re.M)


def run_readme(capsys) -> tuple[dict, str]:
    ns: dict = {"__name__": "__readme__"}
    try:
        for block in python_blocks():
            exec(compile(block, str(README), "exec"), ns)  # noqa: S102 - the README's own code, verbatim
        return ns, capsys.readouterr().out
    finally:
        if "outbox" in ns:
            ns["outbox"].close()
        if "sink" in ns:
            ns["sink"].stop()


def test_the_readme_has_the_front_door_snippet():
    blocks = python_blocks()
    assert len(blocks) >= 2
    first = blocks[0]
    for piece in ("atmostonce.open(", ".submit(", ".run(until_idle=True)"):
        assert piece in first
    assert "atmostonce_cli" not in "".join(blocks)  # nothing opens a store through the CLI package


def test_the_readme_runs_twice_in_a_row_on_the_same_sqlite_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    first, out1 = run_readme(capsys)
    assert (tmp_path / "outbox.sqlite3").exists()
    t = first["outbox"].store.table
    lines = out1.splitlines()
    assert "read_back.match 1" in lines[0] and "idle" in lines[0]
    assert lines[1] in t.terminal_states
    assert first["sink"].creates == 2  # the post and the approved reply

    second, out2 = run_readme(capsys)
    assert second["intent"].key == first["intent"].key and second["it"].key == first["it"].key
    assert out2.splitlines()[1] in t.terminal_states
    assert second["sink"].creates == 0  # nothing sent again
