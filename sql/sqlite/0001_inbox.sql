-- See sql/postgres/0001_inbox.sql. SQLite reports unique violations by table and columns,
-- not by constraint name; the store maps the column lists back to these names.
CREATE TABLE sb_inbox (
    consumer     TEXT NOT NULL CONSTRAINT ck_sb_inbox_consumer_length CHECK (length(consumer) <= 128),
    message_id   TEXT NOT NULL CONSTRAINT ck_sb_inbox_message_id_length CHECK (length(message_id) <= 128),
    processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    CONSTRAINT pk_sb_inbox PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;
CREATE INDEX ix_sb_inbox_processed_at ON sb_inbox (processed_at);

CREATE TABLE sb_inbox_business_key (
    consumer     TEXT NOT NULL,
    business_key TEXT NOT NULL CONSTRAINT ck_sb_inbox_business_key_length CHECK (length(business_key) <= 256),
    message_id   TEXT NOT NULL,
    claimed_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    CONSTRAINT pk_sb_inbox_business_key PRIMARY KEY (consumer, business_key)
) WITHOUT ROWID;

CREATE TABLE sb_inbox_aggregate_version (
    consumer   TEXT    NOT NULL,
    aggregate  TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    updated_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    CONSTRAINT pk_sb_inbox_aggregate_version PRIMARY KEY (consumer, aggregate)
) WITHOUT ROWID;

CREATE TABLE sb_outbox (
    id                     INTEGER NOT NULL CONSTRAINT pk_sb_outbox PRIMARY KEY AUTOINCREMENT,
    message_id             TEXT    NOT NULL CONSTRAINT uq_sb_outbox_message_id UNIQUE,
    destination            TEXT    NOT NULL,
    subject                TEXT,
    correlation_id         TEXT,
    content_type           TEXT,
    application_properties TEXT    NOT NULL,
    body                   BLOB    NOT NULL,
    created_at             TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    dispatched_at          TEXT
);
CREATE INDEX ix_sb_outbox_pending ON sb_outbox (id) WHERE dispatched_at IS NULL;
