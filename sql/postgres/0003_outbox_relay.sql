-- Outbox relay leases. A relay claims due rows in a short transaction of its own (FOR UPDATE
-- SKIP LOCKED, so it never waits for another relay or a consumer), writes its token and the
-- lease end, publishes outside any transaction and marks the rows dispatched by id and token. A
-- relay that dies leaves its rows leased; after lease_until they are claimed again and
-- published again under the same message id. All times come from the relay's clock.
ALTER TABLE sb_outbox
    ADD COLUMN lease_until timestamptz,
    ADD COLUMN lease_token varchar(36),
    ADD COLUMN attempts    integer NOT NULL DEFAULT 0,
    ADD COLUMN last_error  varchar(1024);
ALTER TABLE sb_outbox ADD CONSTRAINT ck_sb_outbox_attempts CHECK (attempts >= 0);

-- Retention deletes dispatched rows by age.
CREATE INDEX ix_sb_outbox_dispatched_at ON sb_outbox (dispatched_at) WHERE dispatched_at IS NOT NULL;
