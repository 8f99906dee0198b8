-- Run identity across attempts, and what each run executes.
--
-- root_id: the first attempt's id, shared by every retry and recovery of the same tick or
-- trigger; NULL means the run is its own root (a first attempt, or a row from before this
-- migration). Checkpoints are kept
-- under it, so a retried or recovered run finds the steps its earlier attempts completed.
-- job_snapshot: the job's target, timeout and directory as they were when the run was created
-- (JSON), so a reload never mixes two configs in one run. NULL in older rows: those run with
-- the config in force, as before.
ALTER TABLE ll_runs ADD COLUMN root_id TEXT;
ALTER TABLE ll_runs ADD COLUMN job_snapshot TEXT;

-- Durable step results, per run identity (root_id), written by targets through RunContext.
CREATE TABLE IF NOT EXISTS ll_checkpoints (
    root_id     TEXT NOT NULL,
    step        TEXT NOT NULL,
    -- The attempt (run id) that recorded it.
    run_id      TEXT NOT NULL,
    value       TEXT NOT NULL,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (root_id, step)
);

-- Keyed by run id, it could not survive a retry; nothing ever wrote it.
DROP TABLE IF EXISTS ll_run_steps;
