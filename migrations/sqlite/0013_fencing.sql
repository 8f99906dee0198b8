-- Fencing. A worker's lease has an epoch, raised whenever the lease is taken afresh (a new
-- process under the name, or a renewal after it ran out); a run records the epoch it was
-- claimed under, and the run's writes (its end, steps, checkpoints, agent calls) are taken only
-- while that worker holds a live lease of that epoch. `takeover_at` is when others may take
-- the worker's runs over: the lease's end plus the margin its runs need to stop.
ALTER TABLE ll_workers ADD COLUMN epoch INTEGER NOT NULL DEFAULT 1;
ALTER TABLE ll_workers ADD COLUMN takeover_at INTEGER;
-- When a lease that ran out is renewed (a new epoch), the old lease's takeover time: the runs of
-- the old epoch are not taken over before it, so they keep the margin they need to stop.
ALTER TABLE ll_workers ADD COLUMN fenced_until INTEGER;
ALTER TABLE ll_runs ADD COLUMN epoch INTEGER;
-- A cancel asked for a running run, kept until the run ends: the worker running it reads it
-- again whenever it may have missed the signal (its listener reconnected or fell behind).
ALTER TABLE ll_runs ADD COLUMN cancel_requested TEXT;
