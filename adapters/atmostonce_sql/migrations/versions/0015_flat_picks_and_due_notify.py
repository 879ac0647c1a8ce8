"""A worker's pick stays flat under a backlog, and only an intent that became due wakes a worker.

- ``aom_intents_claimable`` (both dialects) is rebuilt on ``(created_at, key)``: ``claimable`` orders by
  both, so with the key in the index a page of due work is the first entries of the index even when many
  intents share a creation time (a bulk submit in one transaction, a coarse clock). On ``created_at`` alone
  PostgreSQL had to read and sort every intent of the tied time: 6,576 buffers for a page of 100 with
  200,000 queued (docs/performance.md). ``aom_intents_state``, which the reconciler's and the listings'
  pages by state read in the same order, gets the key for the same reason.
- ``aom_intents_unknown`` (both dialects): ``(created_at, key)`` of the intents whose send is unknown (the
  table's ``indeterminate``), the reconciler's pick. An outage makes many sends unknown at once, before the
  planner's statistics know of them; on the index by state it then chose a bitmap scan and a sort of every
  unknown intent, while this index is read in order and stops at the page.
- PostgreSQL: the notify triggers of migration 0009 fire only when the row enters the claimable predicate,
  the table's initial state with no open attempt: on insert in that state, and on an update into it. Every
  other move (an authorization, an outcome, a park) notified before, and a ``NOTIFY`` serializes the
  commits of every notifying transaction of the cluster on the notification queue's lock. The payload is
  unchanged (``intent:<state>``); the listener still filters by the loaded table.

The initial state is read from the transition table, as migration 0010 reads it for the index.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from atmostonce.names import STATE
    from atmostonce.table import table
    from atmostonce_sql.schema import claimable_where, unknown_where

    initial = table().initial
    where = sa.text(claimable_where(initial))
    op.drop_index("aom_intents_claimable", table_name="aom_intents")
    op.create_index(
        "aom_intents_claimable", "aom_intents", ["created_at", "key"], postgresql_where=where, sqlite_where=where
    )
    op.drop_index("aom_intents_state", table_name="aom_intents")
    op.create_index("aom_intents_state", "aom_intents", ["state", "created_at", "key"])
    unknown = sa.text(unknown_where(STATE.indeterminate))
    op.create_index(
        "aom_intents_unknown", "aom_intents", ["created_at", "key"], postgresql_where=unknown, sqlite_where=unknown
    )
    if op.get_bind().dialect.name != "postgresql":
        return
    due = claimable_where(initial, row="NEW.")
    op.execute(
        f"""
        DROP TRIGGER aom_intents_notify_insert ON aom_intents;
        DROP TRIGGER aom_intents_notify_update ON aom_intents;
        CREATE TRIGGER aom_intents_notify_insert AFTER INSERT ON aom_intents
          FOR EACH ROW
          WHEN ({due})
          EXECUTE FUNCTION aom_notify_intent();
        CREATE TRIGGER aom_intents_notify_update AFTER UPDATE ON aom_intents
          FOR EACH ROW
          WHEN ({due} AND (OLD.state IS DISTINCT FROM NEW.state OR OLD.attempt_token IS NOT NULL))
          EXECUTE FUNCTION aom_notify_intent();
        """
    )


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
