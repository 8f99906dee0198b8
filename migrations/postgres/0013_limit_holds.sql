-- A run handed a slot by an end's one statement (`ends_and_hand_offs_at_once`) holds it in its
-- own row: `limit_hold` is the pool (`name` or `name:key`, as `limit_wait`), written by that
-- claim and cleared by any other claim or hand-over to the queue of a run not handed over.
-- It counts, as a slot row does, while the run is running or queued and handed over; the
-- partial index holds exactly those rows, so a pool's holders are one probe. No slot row is
-- written or deleted for such a run: the claim and the end write the run's row anyway.
SET LOCAL statement_timeout = 0;
ALTER TABLE ll_runs ADD COLUMN IF NOT EXISTS limit_hold TEXT;
CREATE INDEX IF NOT EXISTS ll_runs_limit_holds ON ll_runs (limit_hold)
    WHERE limit_hold IS NOT NULL AND (status = 'running' OR (status = 'queued' AND dispatched_at IS NOT NULL));
