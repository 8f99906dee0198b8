-- One job's runs newest first, by id (ids are UUIDv7: they sort by time): a job's recent runs,
-- `runs list --job`, the latest run of each job in a listing, retention. The index on
-- (job, enqueued_at) it replaces had no id, so each of those read every run of the job from the
-- table (a listing of 1,000 jobs with 100 runs each read all 100,000); this one answers them
-- from the index. No query orders one job's runs by enqueued_at.
DROP INDEX IF EXISTS ll_runs_by_job;
CREATE INDEX IF NOT EXISTS ll_runs_by_job_id ON ll_runs (job, id);
