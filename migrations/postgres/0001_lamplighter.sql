-- Lamplighter's tables on PostgreSQL: the same model as migrations/sqlite (0001–0007 there),
-- in one file. Times are Unix milliseconds (bigint), JSON is text, as on SQLite, so the store
-- code and the contract suite read both the same way; every integer is BIGINT and every flag
-- BOOLEAN, so one set of row readers decodes both backends. apalis-postgres keeps its queue in the
-- `apalis` schema with its own migrations table.

-- Per job: pause state and the last tick processed (fired, skipped or caught up).
CREATE TABLE IF NOT EXISTS ll_job_state (
    job          TEXT PRIMARY KEY,
    paused       BOOLEAN NOT NULL DEFAULT false,
    pause_reason TEXT,
    paused_at    BIGINT,
    last_tick    BIGINT
);

-- A tick's identity: at most one run per (job, scheduled instant), whatever the number of
-- workers and their clocks.
CREATE TABLE IF NOT EXISTS ll_ticks (
    job          TEXT NOT NULL,
    scheduled_at BIGINT NOT NULL,
    run_id       TEXT NOT NULL,
    PRIMARY KEY (job, scheduled_at)
);

-- The history and the truth about runs.
CREATE TABLE IF NOT EXISTS ll_runs (
    id              TEXT PRIMARY KEY,
    job             TEXT NOT NULL,
    trigger         TEXT NOT NULL,
    status          TEXT NOT NULL,
    scheduled_at    BIGINT,
    due_at          BIGINT NOT NULL,
    enqueued_at     BIGINT NOT NULL,
    dispatched_at   BIGINT,
    started_at      BIGINT,
    finished_at     BIGINT,
    attempt         BIGINT NOT NULL DEFAULT 1,
    input           TEXT,
    parameters      TEXT,
    output          TEXT,
    error           TEXT,
    worker          TEXT,
    idempotency_key TEXT,
    retry_of        TEXT,
    next_run_id     TEXT,
    tokens_in       BIGINT,
    tokens_out      BIGINT,
    cost            DOUBLE PRECISION,
    root_id         TEXT,
    job_snapshot    TEXT,
    wait_until      BIGINT,
    UNIQUE (job, idempotency_key)
);
CREATE INDEX IF NOT EXISTS ll_runs_by_job ON ll_runs (job, enqueued_at DESC);
CREATE INDEX IF NOT EXISTS ll_runs_by_status ON ll_runs (status, due_at);
CREATE INDEX IF NOT EXISTS ll_runs_undispatched ON ll_runs (due_at, enqueued_at)
    WHERE status = 'queued' AND dispatched_at IS NULL;
CREATE INDEX IF NOT EXISTS ll_runs_waiting ON ll_runs (wait_until) WHERE status = 'waiting_approval';

-- Worker leases, on the database server's clock (workers' clocks may disagree). A worker's
-- running runs are its own until `lease_until` passes without a heartbeat; then any other
-- worker interrupts them and follows them up per policy. `instance` tells a restart under a
-- configured name (which takes the row over) from the process it replaced.
CREATE TABLE IF NOT EXISTS ll_workers (
    name         TEXT PRIMARY KEY,
    instance     TEXT NOT NULL,
    host         TEXT NOT NULL,
    pid          BIGINT NOT NULL,
    started_at   BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL,
    lease_until  BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS ll_runs_running ON ll_runs (worker) WHERE status = 'running';

-- Durable values of a run identity (every attempt shares the first one's id as root_id).
CREATE TABLE IF NOT EXISTS ll_checkpoints (
    root_id     TEXT NOT NULL,
    step        TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    value       TEXT NOT NULL,
    recorded_at BIGINT NOT NULL,
    PRIMARY KEY (root_id, step)
);

-- Workflow steps and agent waits, per run identity.
CREATE TABLE IF NOT EXISTS ll_steps (
    root_id     TEXT NOT NULL,
    step        TEXT NOT NULL,
    status      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    attempt     BIGINT NOT NULL,
    started_at  BIGINT,
    finished_at BIGINT,
    output      TEXT,
    error       TEXT,
    -- True for a wait that asked "may this go on?" (an agent's tool call): its rejection
    -- resumes the run, which acts on it; false (every workflow approval) fails the run.
    resumes_on_reject BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (root_id, step)
);
CREATE INDEX IF NOT EXISTS ll_steps_open ON ll_steps (run_id) WHERE status IN ('running', 'waiting_approval');

-- Agent conversations: every model call and tool call, by conversation and place.
CREATE TABLE IF NOT EXISTS ll_agent_calls (
    root_id       TEXT NOT NULL,
    conversation  TEXT NOT NULL,
    seq           BIGINT NOT NULL,
    kind          TEXT NOT NULL,
    name          TEXT NOT NULL,
    call_id       TEXT,
    request       TEXT,
    response      TEXT,
    error         TEXT,
    input_tokens  BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    cost          DOUBLE PRECISION,
    run_id        TEXT NOT NULL,
    attempt       BIGINT NOT NULL,
    started_at    BIGINT NOT NULL,
    finished_at   BIGINT NOT NULL,
    PRIMARY KEY (root_id, conversation, seq)
);
