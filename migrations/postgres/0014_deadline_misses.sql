-- Each deadline a run identity (its root: the first attempt) missed, told once: the pass
-- that inserts the row records the notifications of the miss in the same transaction, so
-- whichever worker's pass sees the miss first tells it, and no other pass tells it again.
-- `deadline` is start_within, finish_within or finish_by; instants are Unix ms, as ll_runs'.
CREATE TABLE IF NOT EXISTS ll_deadline_misses (
    root_id  TEXT NOT NULL,
    deadline TEXT NOT NULL,
    job      TEXT NOT NULL,
    run_id   TEXT NOT NULL,
    tick     BIGINT,
    due_at   BIGINT NOT NULL,
    told_at  BIGINT NOT NULL,
    action   TEXT NOT NULL,
    PRIMARY KEY (root_id, deadline)
);
CREATE INDEX IF NOT EXISTS ll_deadline_misses_by_job ON ll_deadline_misses (job, told_at);
