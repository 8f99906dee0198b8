-- Notifications, and what the per-job gauges read.
--
-- A run's final outcome (after its retries) is noticed once, by the pass that turns it into
-- notifications and moves the job's failure streak: `outcome_seen` marks runs it has done.
-- Runs that ended before this version are not noticed again.
ALTER TABLE ll_runs ADD COLUMN outcome_seen BIGINT;
UPDATE ll_runs SET outcome_seen = 1 WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS ll_runs_unseen ON ll_runs (finished_at) WHERE outcome_seen IS NULL AND finished_at IS NOT NULL;

-- Each job's streak of failed outcomes and its last success, as the pass leaves them.
ALTER TABLE ll_job_state ADD COLUMN consecutive_failures BIGINT NOT NULL DEFAULT 0;
ALTER TABLE ll_job_state ADD COLUMN last_success_at BIGINT;
UPDATE ll_job_state SET last_success_at =
    (SELECT max(finished_at) FROM ll_runs WHERE ll_runs.job = ll_job_state.job AND ll_runs.status = 'succeeded');

-- One row per notification: its key is the event's (run identity, event, the wait it is about,
-- the rule), so an event is recorded once however often it is noticed. `status`: pending (to
-- send at next_at), sending (claimed by claimed_by until next_at), delivered, abandoned.
CREATE TABLE IF NOT EXISTS ll_notifications (
    key         TEXT PRIMARY KEY,
    job         TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    root_id     TEXT NOT NULL,
    event       TEXT NOT NULL,
    -- Which target, as shown (a webhook by its host only: its path may be a secret), and its
    -- identity, to find the rule in the config in force (headers are never stored).
    target      TEXT NOT NULL,
    target_id   TEXT NOT NULL,
    payload     TEXT NOT NULL,
    status      TEXT NOT NULL,
    attempts    BIGINT NOT NULL DEFAULT 0,
    next_at     BIGINT NOT NULL,
    claimed_by  TEXT,
    last_error  TEXT,
    -- What it became: the HTTP status answered, or the run it started.
    delivered   TEXT,
    created_at  BIGINT NOT NULL,
    sent_at     BIGINT
);
CREATE INDEX IF NOT EXISTS ll_notifications_due ON ll_notifications (next_at) WHERE status IN ('pending', 'sending');
CREATE INDEX IF NOT EXISTS ll_notifications_by_root ON ll_notifications (root_id);
