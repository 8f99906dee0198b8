-- `0019` keyed the active runs by job alone; two readers looked them up by status, and had to
-- read every active run (a backlog of queued runs included) and their rows:
--   * each lease renewal reads the interrupted runs not yet followed up: they get an index of
--     their own (runs enter it only when interrupted, and leave it when followed up);
--   * the gauges count the queued runs: with the status in the active runs' key, the count
--     reads the index, not the rows.
-- A tick's read of the jobs it fires still finds them by job (the status is checked in the
-- index entry).
SET LOCAL statement_timeout = 0;
CREATE INDEX IF NOT EXISTS ll_runs_active_by_job_status ON ll_runs (job, status)
    WHERE status IN ('queued', 'running', 'waiting_approval') OR (status = 'interrupted' AND next_run_id IS NULL);
DROP INDEX IF EXISTS ll_runs_active;
ALTER INDEX ll_runs_active_by_job_status RENAME TO ll_runs_active;
CREATE INDEX IF NOT EXISTS ll_runs_unfollowed ON ll_runs (id) WHERE status = 'interrupted' AND next_run_id IS NULL;
