-- What the relay publishes besides the body (issue 40): the properties the Service Bus SDKs send
-- on a ServiceBusMessage. A session id is required by session-enabled destinations, and the relay
-- publishes one (destination, session id)'s rows one at a time in id order. The partition key
-- equals the session id when both are set (checked when the row is written). The time-to-live
-- counts from the publish. to_address and reply_to are entity paths or addresses for the
-- application; the broker does not route on them.
ALTER TABLE sb_outbox
    ADD COLUMN session_id             varchar(128),
    ADD COLUMN partition_key          varchar(128),
    ADD COLUMN scheduled_enqueue_time timestamptz,
    ADD COLUMN time_to_live_ms        bigint,
    ADD COLUMN to_address             varchar(260),
    ADD COLUMN reply_to               varchar(260);
ALTER TABLE sb_outbox ADD CONSTRAINT ck_sb_outbox_time_to_live CHECK (time_to_live_ms > 0);

-- A claim skips a session row while an earlier row of its (destination, session id) waits
-- (leased by a relay, or backing off after a failed send): this index finds that row.
CREATE INDEX ix_sb_outbox_session ON sb_outbox (destination, session_id, id)
    WHERE dispatched_at IS NULL AND session_id IS NOT NULL;
