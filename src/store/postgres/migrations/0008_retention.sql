-- Retention (docs/retention.md): finished runs are deleted once their
-- retention has passed, leaving a tombstone for a while.
--
-- A finished run that follows the server's --retention has finished_ms
-- (its last event's time); one with its own retention (the aaa.retention
-- label) has expires_ms instead; one kept for good has neither. Written
-- with the summary that says the run finished. Runs that finished before
-- this version follow the server's retention, unless they carry that
-- label (then they are kept).
ALTER TABLE aaa_runs ADD COLUMN finished_ms bigint, ADD COLUMN expires_ms bigint;
UPDATE aaa_runs SET finished_ms = updated_ms
    WHERE status IN (3, 4, 5) AND NOT labels ? 'aaa.retention';
CREATE INDEX aaa_runs_finished ON aaa_runs (finished_ms) WHERE finished_ms IS NOT NULL;
CREATE INDEX aaa_runs_expires ON aaa_runs (expires_ms) WHERE expires_ms IS NOT NULL;

-- The run an idempotency record belongs to (StartRun's, Signal's), which
-- deletes it with the run; NULL for records kept for the life of the store.
ALTER TABLE aaa_requests ADD COLUMN run_id uuid;
CREATE INDEX aaa_requests_run ON aaa_requests (run_id) WHERE run_id IS NOT NULL;

-- Tombstones of deleted runs: they answer RUN_EXPIRED until until_ms.
CREATE TABLE aaa_expired (
    run_id uuid PRIMARY KEY,
    expired_ms bigint NOT NULL,
    until_ms bigint NOT NULL
);
CREATE INDEX aaa_expired_until ON aaa_expired (until_ms);
