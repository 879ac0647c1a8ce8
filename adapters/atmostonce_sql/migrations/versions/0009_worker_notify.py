"""Wake idle workers: NOTIFY when an intent is submitted or becomes due (PostgreSQL only; docs/operations.md).

Triggers send ``pg_notify('atmostonce_due', ...)`` inside the writing transaction, so the notification is
delivered at its commit and never for a move that rolled back. The payload names the row kind and the
state it reached (``intent:<state>``, ``approval:<state>``, ``policy:kill_switch``); which states make an
intent due is the table's business, so the listener (``atmostonce_sql.notify``) filters by the loaded table
and the triggers name no state. An intent row notifies when it is inserted, and when an update leaves it
with no open attempt after a change of state or the close of an attempt (``retry``, ``abandon_attempt``,
``resend``, ...). SQLite has no LISTEN: its workers poll.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

CHANNEL = "atmostonce_due"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        f"""
        CREATE FUNCTION aom_notify_intent() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM pg_notify('{CHANNEL}', 'intent:' || NEW.state);
          RETURN NULL;
        END $$;
        CREATE FUNCTION aom_notify_approval() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM pg_notify('{CHANNEL}', 'approval:' || NEW.state);
          RETURN NULL;
        END $$;
        CREATE FUNCTION aom_notify_policy() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM pg_notify('{CHANNEL}', 'policy:' || TG_ARGV[0]);
          RETURN NULL;
        END $$;
        CREATE TRIGGER aom_intents_notify_insert AFTER INSERT ON aom_intents
          FOR EACH ROW EXECUTE FUNCTION aom_notify_intent();
        CREATE TRIGGER aom_intents_notify_update AFTER UPDATE ON aom_intents
          FOR EACH ROW
          WHEN (NEW.attempt_token IS NULL
                AND (OLD.state IS DISTINCT FROM NEW.state OR OLD.attempt_token IS NOT NULL))
          EXECUTE FUNCTION aom_notify_intent();
        CREATE TRIGGER aom_approvals_notify AFTER INSERT ON aom_approvals
          FOR EACH ROW EXECUTE FUNCTION aom_notify_approval();
        CREATE TRIGGER aom_kill_switches_notify AFTER INSERT OR UPDATE OR DELETE ON aom_kill_switches
          FOR EACH ROW EXECUTE FUNCTION aom_notify_policy('kill_switch');
        """
    )


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
