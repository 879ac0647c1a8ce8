"""Configuration `restore`: the main model plus one database backup and one restore from it.

The restore rewinds every column of the intent row (``ROW`` of ``main.py``) and its sequences; the
restore epoch, kept outside the database, advances, and every lease is void; until the operator
declares the restore fence (the table's event with the ``fence_restore`` effect) no worker starts a
new attempt. Its process is ``templates/restore.pml``, compiled in with ``-DRESTORES``. One operator
move besides the fence; sends beyond the request slots are not explored (``-DCUT_AT_BOUND``: a
restore rewinds the attempt count, so the slot bound of the other configurations does not hold).
"""

from __future__ import annotations

from atmostonce.table import Table

from ..base import any_of, render
from .main import ROW

__all__ = ["FLAGS", "NAME", "process"]

NAME = "restore"
FLAGS: tuple[str, ...] = ("-DRESTORES", "-DOPERATOR_MOVES=1", "-DCUT_AT_BOUND")


def process(t: Table) -> str:
    """The database's process (inside ``#ifdef RESTORES`` of the main model)."""
    fences = [e for e in t.events.values() if "fence_restore" in e.effects]
    fence_sources = sorted({s for e in fences for s in e.sources}, key=list(t.states).index)
    rewound = [(name, typ) for name, typ, _ in ROW]
    return render(
        "restore",
        backup_decls=" ".join(f"{typ} b_{name};" for name, typ in rewound),
        take_backup=" ".join(f"b_{name} = {name};" for name, _ in rewound),
        do_restore=" ".join(f"{name} = b_{name};" for name, _ in rewound),
        clear_backup=" ".join(f"b_{name} = 0;" for name, _ in rewound),
        # the states the fence is declared from: a restore that leaves the intent in one needs the fence
        left_open=any_of("state", fence_sources),
    )
