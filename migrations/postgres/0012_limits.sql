-- Limits shared across jobs and workers (SPEC §4a); as SQLite's 0019.
--
-- `limits`: the slot pools a run takes, as JSON `[[name, key], …]`, rendered from its job's
-- `limits` and its input when it is queued (NULL: none). `limit_wait`: the pool a queued run
-- waits on (`name` or `name:key`), since `limit_wait_since`; a waiting run is not due, so the
-- due read's index leaves it out and the waiters' own index reads it by pool, in line.
SET LOCAL statement_timeout = 0;
ALTER TABLE ll_runs ADD COLUMN IF NOT EXISTS limits TEXT;
ALTER TABLE ll_runs ADD COLUMN IF NOT EXISTS limit_wait TEXT;
ALTER TABLE ll_runs ADD COLUMN IF NOT EXISTS limit_wait_since BIGINT;

-- A slot: a row per pool of an admitted run. It counts while its run is running, or queued
-- and handed to the queue; any other row is stale, and deleted by the next admission to the pool.
CREATE TABLE IF NOT EXISTS ll_run_limits (
    run_id TEXT NOT NULL REFERENCES ll_runs (id) ON DELETE CASCADE,
    name   TEXT NOT NULL,
    key    TEXT NOT NULL,
    PRIMARY KEY (run_id, name, key)
);
CREATE INDEX IF NOT EXISTS ll_run_limits_by_pool ON ll_run_limits (name, key);

CREATE INDEX IF NOT EXISTS ll_runs_due ON ll_runs (due_at, enqueued_at, id)
    WHERE status = 'queued' AND dispatched_at IS NULL AND limit_wait IS NULL;
DROP INDEX IF EXISTS ll_runs_undispatched;
ALTER INDEX ll_runs_due RENAME TO ll_runs_undispatched;
CREATE INDEX IF NOT EXISTS ll_runs_limit_waits ON ll_runs (limit_wait, due_at, enqueued_at, id)
    WHERE status = 'queued' AND dispatched_at IS NULL AND limit_wait IS NOT NULL;
