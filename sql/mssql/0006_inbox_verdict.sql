-- See sql/postgres/0006_inbox_verdict.sql.
ALTER TABLE sb_inbox ADD
    verdict              nvarchar(64) NULL,
    verdict_resubmission bigint       NULL;
