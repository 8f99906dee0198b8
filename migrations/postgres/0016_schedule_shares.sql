-- Each worker's share of the schedule (`jobs/src/share.rs`): the digest of the scheduled jobs
-- it knows, written with its lease. Workers with a live lease and the same digest divide those
-- jobs between them; a worker without one (an earlier version, or one shutting down) is in no
-- group and takes no share of anyone's jobs.
ALTER TABLE ll_workers ADD COLUMN IF NOT EXISTS shares TEXT;
