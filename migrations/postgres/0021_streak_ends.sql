-- When the last failures of the job's streak ended (a JSON array of Unix ms: those within a
-- second of the latest, the bound within which an end is written). A run's recorded end is its
-- own, and its write may come later: a success written after failures already counted (two
-- workers, ends gathered) takes back only the failures that ended after it. NULL (a state
-- written before this column): a success ends the streak, as before.
ALTER TABLE ll_job_state ADD COLUMN IF NOT EXISTS streak_ends TEXT;
