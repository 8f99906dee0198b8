-- Lamplighter's own tables. apalis keeps its queue in its own tables (Jobs, Workers); these
-- hold the history and the scheduling state. Instants are Unix milliseconds (UTC).

-- Per-job state that must survive restarts.
CREATE TABLE IF NOT EXISTS ll_job_state (
    job          TEXT PRIMARY KEY,
    paused       INTEGER NOT NULL DEFAULT 0,
    pause_reason TEXT,
    paused_at    INTEGER,
    -- The last tick that was processed (fired, skipped or caught up).
    last_tick    INTEGER
);

-- Exactly once per tick: the primary key is the tick's identity.
CREATE TABLE IF NOT EXISTS ll_ticks (
    job          TEXT NOT NULL,
    scheduled_at INTEGER NOT NULL,
    run_id       TEXT NOT NULL,
    PRIMARY KEY (job, scheduled_at)
);

CREATE TABLE IF NOT EXISTS ll_runs (
    id              TEXT PRIMARY KEY,
    job             TEXT NOT NULL,
    trigger         TEXT NOT NULL,
    status          TEXT NOT NULL,
    scheduled_at    INTEGER,
    due_at          INTEGER NOT NULL,
    enqueued_at     INTEGER NOT NULL,
    dispatched_at   INTEGER,
    started_at      INTEGER,
    finished_at     INTEGER,
    attempt         INTEGER NOT NULL DEFAULT 1,
    input           TEXT,
    parameters      TEXT,
    output          TEXT,
    error           TEXT,
    worker          TEXT,
    idempotency_key TEXT,
    retry_of        TEXT,
    next_run_id     TEXT,
    tokens_in       INTEGER,
    tokens_out      INTEGER,
    cost            REAL,
    UNIQUE (job, idempotency_key)
);
CREATE INDEX IF NOT EXISTS ll_runs_by_job ON ll_runs (job, enqueued_at DESC);
CREATE INDEX IF NOT EXISTS ll_runs_by_status ON ll_runs (status, due_at);

-- Per-step records of workflow runs.
CREATE TABLE IF NOT EXISTS ll_run_steps (
    run_id      TEXT NOT NULL,
    step_id     TEXT NOT NULL,
    status      TEXT NOT NULL,
    output      TEXT,
    error       TEXT,
    started_at  INTEGER,
    finished_at INTEGER,
    PRIMARY KEY (run_id, step_id)
);

CREATE TABLE IF NOT EXISTS ll_workers (
    name         TEXT PRIMARY KEY,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    stopped_at   INTEGER
);
