-- The end of the latest run the notice pass counted into the job's failure streak (as
-- PostgreSQL's 0021): a success noticed at its end ends the streak only if it ended after
-- that. NULL (a state written before this column): any newer success ends it, as before.
-- Unix ms.
ALTER TABLE ll_job_state ADD COLUMN streak_until INTEGER;
