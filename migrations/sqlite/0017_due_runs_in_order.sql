-- The due read takes the first of the queued runs not handed over by (due_at, enqueued_at,
-- id): with id in the index, it reads them in that order and stops at its batch. Runs queued
-- at one instant (a backlog of triggers, a catch-up) were all read and sorted on every pass.
DROP INDEX IF EXISTS ll_runs_undispatched;
CREATE INDEX IF NOT EXISTS ll_runs_undispatched ON ll_runs (due_at, enqueued_at, id)
    WHERE status = 'queued' AND dispatched_at IS NULL;
