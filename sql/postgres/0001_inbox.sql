-- The inbox: one row per (consumer, message id) that committed. The primary key is the
-- concurrency boundary: a second insert of the same key waits for the first transaction and
-- then fails with 23505 on pk_sb_inbox.
CREATE TABLE sb_inbox (
    consumer     varchar(128) NOT NULL,
    message_id   varchar(128) NOT NULL,
    processed_at timestamptz  NOT NULL DEFAULT now(),
    CONSTRAINT pk_sb_inbox PRIMARY KEY (consumer, message_id)
);
CREATE INDEX ix_sb_inbox_processed_at ON sb_inbox (processed_at);

-- Business idempotency keys: several messages may carry one business request.
CREATE TABLE sb_inbox_business_key (
    consumer     varchar(128) NOT NULL,
    business_key varchar(256) NOT NULL,
    message_id   varchar(128) NOT NULL,
    claimed_at   timestamptz  NOT NULL DEFAULT now(),
    CONSTRAINT pk_sb_inbox_business_key PRIMARY KEY (consumer, business_key)
);

-- Last applied version per aggregate, for stale detection.
CREATE TABLE sb_inbox_aggregate_version (
    consumer   varchar(128) NOT NULL,
    aggregate  varchar(256) NOT NULL,
    version    bigint       NOT NULL,
    updated_at timestamptz  NOT NULL DEFAULT now(),
    CONSTRAINT pk_sb_inbox_aggregate_version PRIMARY KEY (consumer, aggregate)
);

-- The local outbox, written in the consumer's transaction and published by the relay.
CREATE TABLE sb_outbox (
    id                     bigint GENERATED ALWAYS AS IDENTITY,
    message_id             varchar(128) NOT NULL,
    destination            varchar(260) NOT NULL,
    subject                varchar(256),
    correlation_id         varchar(128),
    content_type           varchar(128),
    application_properties text         NOT NULL,
    body                   bytea        NOT NULL,
    created_at             timestamptz  NOT NULL DEFAULT now(),
    dispatched_at          timestamptz,
    CONSTRAINT pk_sb_outbox PRIMARY KEY (id),
    CONSTRAINT uq_sb_outbox_message_id UNIQUE (message_id)
);
CREATE INDEX ix_sb_outbox_pending ON sb_outbox (id) WHERE dispatched_at IS NULL;
