-- See sql/postgres/0003_outbox_relay.sql. Claims read with UPDLOCK, ROWLOCK, READPAST: rows
-- another claim holds are skipped, not waited for.
ALTER TABLE sb_outbox ADD
    lease_until datetime2(3)   NULL,
    lease_token nvarchar(36)   NULL,
    attempts    int            NOT NULL CONSTRAINT df_sb_outbox_attempts DEFAULT 0,
    last_error  nvarchar(1024) NULL,
    CONSTRAINT ck_sb_outbox_attempts CHECK (attempts >= 0);

-- Retention deletes dispatched rows by age.
CREATE INDEX ix_sb_outbox_dispatched_at ON sb_outbox (dispatched_at) WHERE dispatched_at IS NOT NULL;
