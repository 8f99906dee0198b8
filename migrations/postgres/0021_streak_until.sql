-- The end of the latest run the notice pass counted into the job's failure streak. A success
-- noticed at its end (`ll_job_successes`) ends the streak only if it ended after that: one
-- that ended before a failure already counted, but was written after it (two workers, ends
-- gathered), moves the last success and leaves the streak. NULL (a state written before this
-- column): any newer success ends it, as before.
ALTER TABLE ll_job_state ADD COLUMN IF NOT EXISTS streak_until BIGINT;
