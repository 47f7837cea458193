-- Dead-letter verdicts (issue 41). Before the runtime dead-letters a message for what its
-- delivery history decided (delayed retries spent: RetriesExhausted; panics counted out:
-- HandlerPanicked), it inserts the message's inbox row with the reason here, under the same
-- primary key a processed message's row takes. A delayed retry schedules its copy and then
-- completes the original; when that completion fails both live on, and the key lets only one
-- of them decide: a twin that meets a verdict is dead-lettered too, one that meets a processed
-- row completes as a duplicate. NULL: the row is a processed message's.
-- verdict_resubmission: the resubmission count (sb-inbox-resubmission, 0 before any) of the
-- delivery that decided; a later resubmission of the dead letter deletes the verdict in its
-- own transaction and takes effect once.
ALTER TABLE sb_inbox
    ADD COLUMN verdict              varchar(64),
    ADD COLUMN verdict_resubmission bigint;
