-- See sql/postgres/0005_outbox_publishing.sql.
ALTER TABLE sb_outbox ADD
    session_id             nvarchar(128) NULL,
    partition_key          nvarchar(128) NULL,
    scheduled_enqueue_time datetime2(3)  NULL,
    time_to_live_ms        bigint        NULL,
    to_address             nvarchar(260) NULL,
    reply_to               nvarchar(260) NULL,
    CONSTRAINT ck_sb_outbox_time_to_live CHECK (time_to_live_ms > 0);

-- Compiled when it runs, after the columns above exist.
EXEC (N'CREATE INDEX ix_sb_outbox_session ON sb_outbox (destination, session_id, id)
          WHERE dispatched_at IS NULL AND session_id IS NOT NULL');
