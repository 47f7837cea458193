-- See sql/postgres/0006_inbox_verdict.sql.
ALTER TABLE sb_inbox ADD COLUMN verdict TEXT CONSTRAINT ck_sb_inbox_verdict_length CHECK (length(verdict) <= 64);
ALTER TABLE sb_inbox ADD COLUMN verdict_resubmission INTEGER;
