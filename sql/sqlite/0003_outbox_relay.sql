-- See sql/postgres/0003_outbox_relay.sql. SQLite has a single writer: claims take turns with
-- consumer transactions instead of skipping their rows.
ALTER TABLE sb_outbox ADD COLUMN lease_until TEXT;
ALTER TABLE sb_outbox ADD COLUMN lease_token TEXT;
ALTER TABLE sb_outbox ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0 CONSTRAINT ck_sb_outbox_attempts CHECK (attempts >= 0);
ALTER TABLE sb_outbox ADD COLUMN last_error TEXT;

CREATE INDEX ix_sb_outbox_dispatched_at ON sb_outbox (dispatched_at) WHERE dispatched_at IS NOT NULL;
