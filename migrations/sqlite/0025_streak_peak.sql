-- The highest count the job's failure streak reached since it was last 0 (as PostgreSQL's
-- 0022): the success that ends the streak answers an alert a late success took back. NULL (a
-- state written before this column): the count is the peak.
ALTER TABLE ll_job_state ADD COLUMN streak_peak INTEGER;
