-- The highest count the job's failure streak reached since it was last 0. A success written
-- late (it ended before failures already counted) can take back an alert's count; the success
-- that ends the streak then still answers that alert with a recovery. NULL (a state written
-- before this column): the count is the peak.
ALTER TABLE ll_job_state ADD COLUMN IF NOT EXISTS streak_peak BIGINT;
