-- A count of changes to what a job listing shows: a run's brief (its id, job, trigger, status
-- and times) and a job's pause. A listing kept by the worker (`worker/src/direct.rs`) is served
-- again while this count is unchanged, which one read of one row tells. SQLite's own data
-- version would not do: it moves with every commit, the worker's lease heartbeat every ten
-- seconds among them. Triggers count every writer, this worker, an older binary or another
-- process. A tick moving `last_tick`, a step record or a run's output leave it as it is.
CREATE TABLE IF NOT EXISTS ll_listing_changes (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    n  INTEGER NOT NULL
);
INSERT OR IGNORE INTO ll_listing_changes (id, n) VALUES (1, 0);

CREATE TRIGGER IF NOT EXISTS ll_listing_run_added AFTER INSERT ON ll_runs
BEGIN UPDATE ll_listing_changes SET n = n + 1 WHERE id = 1; END;
CREATE TRIGGER IF NOT EXISTS ll_listing_run_changed AFTER UPDATE OF id, job, trigger, status, enqueued_at, finished_at ON ll_runs
BEGIN UPDATE ll_listing_changes SET n = n + 1 WHERE id = 1; END;
CREATE TRIGGER IF NOT EXISTS ll_listing_run_deleted AFTER DELETE ON ll_runs
BEGIN UPDATE ll_listing_changes SET n = n + 1 WHERE id = 1; END;

CREATE TRIGGER IF NOT EXISTS ll_listing_state_added AFTER INSERT ON ll_job_state
BEGIN UPDATE ll_listing_changes SET n = n + 1 WHERE id = 1; END;
CREATE TRIGGER IF NOT EXISTS ll_listing_state_changed AFTER UPDATE OF job, paused, pause_reason, paused_at ON ll_job_state
BEGIN UPDATE ll_listing_changes SET n = n + 1 WHERE id = 1; END;
CREATE TRIGGER IF NOT EXISTS ll_listing_state_deleted AFTER DELETE ON ll_job_state
BEGIN UPDATE ll_listing_changes SET n = n + 1 WHERE id = 1; END;
