-- The indexes of ll_runs, for a run's hot path (`cargo bench --bench postgres -- drain`).
--
-- Fewer index entries for each change of a run. A run's row is updated four times in its life
-- (handed to the queue, claimed, ended, its outcome noticed), and on PostgreSQL each update
-- that changes an indexed column writes a new entry into every index of the table. Two indexes
-- held every run for good, though the engine's own lookups want a few:
--   * by status: the engine looks up the active runs, and interrupted runs not yet followed
--     up. Listing the history by a final status alone (`lampctl runs list --status failed`)
--     now reads it newest first until the page is full;
--   * by idempotency key: most runs have none, and runs without one never conflict.
-- Together they were 4-12 % of a drain's rate on one worker. SQLite keeps them: it updates
-- only the indexes whose columns change.
--
-- The due read takes the first of the queued runs not handed over by (due_at, enqueued_at,
-- id): with id in the index, it reads them in that order and stops at its batch. Runs queued
-- at one instant (a backlog of triggers, a catch-up) were all read and sorted on every pass.
--
-- The new indexes are built first, under a lock that lets readers in; the old ones are
-- dropped last, so the table is locked whole only for the drops. A long history's builds are
-- not cut short by the pool's statement timeout.
SET LOCAL statement_timeout = 0;
CREATE INDEX IF NOT EXISTS ll_runs_active ON ll_runs (status, due_at)
    WHERE status IN ('queued', 'running', 'waiting_approval') OR (status = 'interrupted' AND next_run_id IS NULL);
CREATE UNIQUE INDEX IF NOT EXISTS ll_runs_idempotency ON ll_runs (job, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS ll_runs_due ON ll_runs (due_at, enqueued_at, id)
    WHERE status = 'queued' AND dispatched_at IS NULL;
DROP INDEX IF EXISTS ll_runs_by_status;
ALTER TABLE ll_runs DROP CONSTRAINT IF EXISTS ll_runs_job_idempotency_key_key;
DROP INDEX IF EXISTS ll_runs_undispatched;
ALTER INDEX ll_runs_due RENAME TO ll_runs_undispatched;
