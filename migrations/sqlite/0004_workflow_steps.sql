-- Workflow steps, and runs that wait for a person.
--
-- One record per step of a workflow run, kept under the run's identity (root_id, shared by
-- every attempt), so a retried or recovered run continues after the steps that finished.
-- run_id/attempt: the attempt that last recorded the step.
CREATE TABLE IF NOT EXISTS ll_steps (
    root_id     TEXT NOT NULL,
    step        TEXT NOT NULL,
    status      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    started_at  INTEGER,
    finished_at INTEGER,
    output      TEXT,
    error       TEXT,
    PRIMARY KEY (root_id, step)
);
-- Steps still going, by attempt: what a run's end (failed, cancelled, interrupted) closes.
CREATE INDEX IF NOT EXISTS ll_steps_open ON ll_steps (run_id) WHERE status IN ('running', 'waiting_approval');

-- A run waiting for approval is resumed at wait_until (its approval's timeout) if nobody
-- decided before; NULL waits until someone does.
ALTER TABLE ll_runs ADD COLUMN wait_until INTEGER;
