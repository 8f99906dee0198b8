-- When the last failures of the job's streak ended (as PostgreSQL's 0021: a JSON array of Unix
-- ms, those within a second of the latest): a success written after failures already counted
-- takes back only the failures that ended after it. NULL (a state written before this column):
-- a success ends the streak, as before.
ALTER TABLE ll_job_state ADD COLUMN streak_ends TEXT;
