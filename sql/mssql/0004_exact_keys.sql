-- Keys compare exactly (issue 14, finding 1). The database's default collation (infra/modules/
-- sql.bicep: SQL_Latin1_General_CP1_CI_AS) ignores case, width and accents, so `order-a` after
-- `Order-A` hit pk_sb_inbox and was completed as a duplicate without its effect. Every key
-- column is Latin1_General_100_BIN2 (code point order). Equality still ignores trailing spaces
-- in every collation (SQL-92 padding), so the message id, business key and aggregate also carry
-- their length in bytes, and the unique keys include it: `m-1 ` after `m-1` is another key.
-- Constraint names stay: the store recognises duplicates by them.

-- Statistics on a column block a change of its collation; the server re-creates them on demand.
DECLARE @drop nvarchar(max) = N'';
SELECT @drop = @drop + N'DROP STATISTICS ' + QUOTENAME(SCHEMA_NAME(o.schema_id)) + N'.'
       + QUOTENAME(o.name) + N'.' + QUOTENAME(s.name) + N'; '
  FROM sys.stats AS s
  JOIN sys.objects AS o ON o.object_id = s.object_id
 WHERE (s.auto_created = 1 OR s.user_created = 1)
   AND o.schema_id = SCHEMA_ID()
   AND o.name IN (N'sb_inbox', N'sb_inbox_business_key', N'sb_inbox_aggregate_version', N'sb_outbox')
   AND EXISTS (SELECT 1
                 FROM sys.stats_columns AS sc
                 JOIN sys.columns AS c ON c.object_id = sc.object_id AND c.column_id = sc.column_id
                WHERE sc.object_id = s.object_id AND sc.stats_id = s.stats_id
                  AND c.name IN (N'consumer', N'message_id', N'business_key', N'aggregate'));
EXEC sys.sp_executesql @drop;

ALTER TABLE sb_inbox DROP CONSTRAINT pk_sb_inbox;
ALTER TABLE sb_inbox_business_key DROP CONSTRAINT pk_sb_inbox_business_key;
ALTER TABLE sb_inbox_aggregate_version DROP CONSTRAINT pk_sb_inbox_aggregate_version;
ALTER TABLE sb_outbox DROP CONSTRAINT uq_sb_outbox_message_id;

ALTER TABLE sb_inbox ALTER COLUMN consumer nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL;
ALTER TABLE sb_inbox ALTER COLUMN message_id nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL;
ALTER TABLE sb_inbox_business_key ALTER COLUMN consumer nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL;
ALTER TABLE sb_inbox_business_key ALTER COLUMN business_key nvarchar(256) COLLATE Latin1_General_100_BIN2 NOT NULL;
ALTER TABLE sb_inbox_business_key ALTER COLUMN message_id nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL;
ALTER TABLE sb_inbox_aggregate_version ALTER COLUMN consumer nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL;
ALTER TABLE sb_inbox_aggregate_version ALTER COLUMN aggregate nvarchar(256) COLLATE Latin1_General_100_BIN2 NOT NULL;
ALTER TABLE sb_outbox ALTER COLUMN message_id nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL;

ALTER TABLE sb_inbox ADD message_id_bytes AS DATALENGTH(message_id) PERSISTED NOT NULL;
ALTER TABLE sb_inbox_business_key ADD business_key_bytes AS DATALENGTH(business_key) PERSISTED NOT NULL;
ALTER TABLE sb_inbox_aggregate_version ADD aggregate_bytes AS DATALENGTH(aggregate) PERSISTED NOT NULL;
ALTER TABLE sb_outbox ADD message_id_bytes AS DATALENGTH(message_id) PERSISTED NOT NULL;

-- Compiled when they run, after the columns above exist.
EXEC (N'ALTER TABLE sb_inbox ADD CONSTRAINT pk_sb_inbox
          PRIMARY KEY NONCLUSTERED (consumer, message_id, message_id_bytes)');
EXEC (N'ALTER TABLE sb_inbox_business_key ADD CONSTRAINT pk_sb_inbox_business_key
          PRIMARY KEY NONCLUSTERED (consumer, business_key, business_key_bytes)');
EXEC (N'ALTER TABLE sb_inbox_aggregate_version ADD CONSTRAINT pk_sb_inbox_aggregate_version
          PRIMARY KEY CLUSTERED (consumer, aggregate, aggregate_bytes)');
EXEC (N'ALTER TABLE sb_outbox ADD CONSTRAINT uq_sb_outbox_message_id
          UNIQUE (message_id, message_id_bytes)');
