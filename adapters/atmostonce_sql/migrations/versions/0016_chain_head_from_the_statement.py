"""PostgreSQL: a statement that knows a history row's predecessor gives it, and the chain trigger does not look
it up.

``aom_history_chain`` (migration 0002) read the previous row's hash with a query of its own for every history
row: on the hot path, five such queries per send, about a quarter of the server's time per publish
(docs/performance.md). A statement that writes several history rows of one intent, under that intent's row
lock, knows each row's predecessor: the row it wrote just before (its ``RETURNING row_hash``), or none when
the statement creates the intent. It now inserts that hash as ``prev_hash`` and ``''`` as ``row_hash``,
which tells the trigger the predecessor is given. The trigger then skips its query; otherwise (``row_hash``
NULL, every other writer) it reads the predecessor as before. Either way the trigger computes ``row_hash``
itself, over the row as stored, and refuses any other value a writer puts there. What the writer is trusted
with is the link alone, and ``atmostonce.audit.verify_store`` checks every link
(docs/design.md#the-audit-order-tamper-evidence-the-role-reconciliation-records).

The hash is unchanged (``atmostonce.audit.CHAIN_TAG``); no row is rewritten. SQLite computes its chain in
the statement already (``aom_chain_hash``). Forward-only.

Revision ID: 0016
Revises: 0015
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    from atmostonce_sql.chain_sql import row_hash_sql

    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION aom_history_chain() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.row_hash IS NULL THEN
            -- a query of its own: a fresh snapshot (READ COMMITTED), taken after this statement
            -- locked the intent row, so the newest committed row of the chain is seen
            SELECT h.row_hash INTO NEW.prev_hash FROM aom_history h
              WHERE h.key = NEW.key AND h.seq < NEW.seq ORDER BY h.seq DESC LIMIT 1;
          ELSIF NEW.row_hash <> '' THEN
            RAISE EXCEPTION 'atmostonce: a history row''s hash is computed by the database, not given'
              USING ERRCODE = 'integrity_constraint_violation';
          END IF;
          -- row_hash '': the statement gave prev_hash (the row it wrote before, or none for a new intent)
          NEW.row_hash := {row_hash_sql("NEW")};
          RETURN NEW;
        END $$
        """
    )


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
