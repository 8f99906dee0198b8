-- A run handed to the queue is its own queue entry: a claim takes it from `ll_runs` (queued,
-- `dispatched_at` set), first handed over first, skipping rows another claim holds. No
-- apalis-postgres task is written for it any more (an insert at the hand-over and a delete at
-- the claim, a run); the tasks an earlier version left are dropped by the housekeeping.
SET LOCAL statement_timeout = 0;
CREATE INDEX IF NOT EXISTS ll_runs_handed_over ON ll_runs (dispatched_at, id)
    WHERE status = 'queued' AND dispatched_at IS NOT NULL;
