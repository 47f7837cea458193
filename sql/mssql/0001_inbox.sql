-- The inbox: one row per (consumer, message id) that committed. The primary key pk_sb_inbox is
-- the concurrency boundary: a second insert of the same key waits for the first transaction and
-- then fails with 2627 naming pk_sb_inbox. It is NONCLUSTERED: message ids are often random
-- (GUIDs), so the table is clustered on a sequential identity instead, which keeps inserts at the
-- end of the clustered index (no page splits) and makes retention deletes by age cheap.
CREATE TABLE sb_inbox (
    id           bigint IDENTITY(1, 1) NOT NULL,
    consumer     nvarchar(128) NOT NULL,
    message_id   nvarchar(128) NOT NULL,
    processed_at datetime2(3)  NOT NULL CONSTRAINT df_sb_inbox_processed_at DEFAULT SYSUTCDATETIME(),
    CONSTRAINT pk_sb_inbox PRIMARY KEY NONCLUSTERED (consumer, message_id)
);
CREATE UNIQUE CLUSTERED INDEX cx_sb_inbox_id ON sb_inbox (id);
CREATE INDEX ix_sb_inbox_processed_at ON sb_inbox (processed_at);

-- Business idempotency keys: several messages may carry one business request.
CREATE TABLE sb_inbox_business_key (
    id           bigint IDENTITY(1, 1) NOT NULL,
    consumer     nvarchar(128) NOT NULL,
    business_key nvarchar(256) NOT NULL,
    message_id   nvarchar(128) NOT NULL,
    claimed_at   datetime2(3)  NOT NULL CONSTRAINT df_sb_inbox_business_key_claimed_at DEFAULT SYSUTCDATETIME(),
    CONSTRAINT pk_sb_inbox_business_key PRIMARY KEY NONCLUSTERED (consumer, business_key)
);
CREATE UNIQUE CLUSTERED INDEX cx_sb_inbox_business_key_id ON sb_inbox_business_key (id);
CREATE INDEX ix_sb_inbox_business_key_claimed_at ON sb_inbox_business_key (claimed_at);

-- Last applied version per aggregate, for stale detection (updated in place: clustered on its key).
CREATE TABLE sb_inbox_aggregate_version (
    consumer   nvarchar(128) NOT NULL,
    aggregate  nvarchar(256) NOT NULL,
    version    bigint        NOT NULL,
    updated_at datetime2(3)  NOT NULL CONSTRAINT df_sb_inbox_aggregate_version_updated_at DEFAULT SYSUTCDATETIME(),
    CONSTRAINT pk_sb_inbox_aggregate_version PRIMARY KEY CLUSTERED (consumer, aggregate)
);

-- The local outbox, written in the consumer's transaction and published by the relay.
CREATE TABLE sb_outbox (
    id                     bigint IDENTITY(1, 1) NOT NULL,
    message_id             nvarchar(128)  NOT NULL,
    destination            nvarchar(260)  NOT NULL,
    subject                nvarchar(256)  NULL,
    correlation_id         nvarchar(128)  NULL,
    content_type           nvarchar(128)  NULL,
    application_properties nvarchar(max)  NOT NULL,
    body                   varbinary(max) NOT NULL,
    created_at             datetime2(3)   NOT NULL CONSTRAINT df_sb_outbox_created_at DEFAULT SYSUTCDATETIME(),
    dispatched_at          datetime2(3)   NULL,
    CONSTRAINT pk_sb_outbox PRIMARY KEY CLUSTERED (id),
    CONSTRAINT uq_sb_outbox_message_id UNIQUE (message_id)
);
CREATE INDEX ix_sb_outbox_pending ON sb_outbox (id) WHERE dispatched_at IS NULL;
