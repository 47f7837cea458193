-- See sql/postgres/0005_outbox_publishing.sql. scheduled_enqueue_time is text in the format of
-- the other time columns.
ALTER TABLE sb_outbox ADD COLUMN session_id TEXT;
ALTER TABLE sb_outbox ADD COLUMN partition_key TEXT;
ALTER TABLE sb_outbox ADD COLUMN scheduled_enqueue_time TEXT;
ALTER TABLE sb_outbox ADD COLUMN time_to_live_ms INTEGER CONSTRAINT ck_sb_outbox_time_to_live CHECK (time_to_live_ms > 0);
ALTER TABLE sb_outbox ADD COLUMN to_address TEXT;
ALTER TABLE sb_outbox ADD COLUMN reply_to TEXT;

CREATE INDEX ix_sb_outbox_session ON sb_outbox (destination, session_id, id)
    WHERE dispatched_at IS NULL AND session_id IS NOT NULL;
