-- The outcomes of upstream jobs a job runs `after` that it has not used yet, each recorded
-- once by the pass that notices it (in the same transaction), and deleted by the pass that
-- uses it (starting the downstream run) or drops it (its `within` passed).
CREATE TABLE IF NOT EXISTS ll_after_outcomes (
    downstream  TEXT NOT NULL,
    upstream    TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    status      TEXT NOT NULL,
    output      TEXT,
    finished_at INTEGER NOT NULL,
    PRIMARY KEY (downstream, run_id)
);
