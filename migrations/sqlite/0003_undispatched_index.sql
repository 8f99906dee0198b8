-- Queued runs not yet handed over: what the scheduler looks for on every pass. The partial
-- index holds only those rows, so a pass costs the same with 50,000 runs waiting in the
-- queue (dispatched) as with none; without it, each pass scanned every queued run.
CREATE INDEX IF NOT EXISTS ll_runs_undispatched ON ll_runs (due_at, enqueued_at)
    WHERE status = 'queued' AND dispatched_at IS NULL;
