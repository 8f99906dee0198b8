-- Fewer index entries for each change of a run. A run's row is updated four or five times in
-- its life (handed to the queue, claimed, ended, its outcome noticed), and on PostgreSQL each
-- update that changes an indexed column writes a new entry into every index of the table.
-- Two indexes held every run for good, though their queries look for a few:
--   * by status: only the active runs, and interrupted runs not yet followed up, are looked up
--     by status (the history is read by job or by id);
--   * by idempotency key: most runs have none, and runs without one never conflict.
-- Together they were 5-12 % of a drain's rate on one worker (`cargo bench --bench postgres`).
-- SQLite keeps its indexes: it updates only the indexes whose columns change.
CREATE INDEX IF NOT EXISTS ll_runs_active ON ll_runs (status, due_at)
    WHERE status IN ('queued', 'running', 'waiting_approval') OR (status = 'interrupted' AND next_run_id IS NULL);
DROP INDEX IF EXISTS ll_runs_by_status;
CREATE UNIQUE INDEX IF NOT EXISTS ll_runs_idempotency ON ll_runs (job, idempotency_key) WHERE idempotency_key IS NOT NULL;
ALTER TABLE ll_runs DROP CONSTRAINT IF EXISTS ll_runs_job_idempotency_key_key;
