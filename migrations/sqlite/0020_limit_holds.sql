-- A slot held in the run's own row (`limit_hold`: the pool, as `limit_wait`), as PostgreSQL's
-- 0013. The SQLite backend writes none (its hand-off writes slot rows in the one writer's
-- transaction); the column and its index keep the two backends' shared reads of the holders
-- the same.
ALTER TABLE ll_runs ADD COLUMN limit_hold TEXT;
CREATE INDEX IF NOT EXISTS ll_runs_limit_holds ON ll_runs (limit_hold) WHERE limit_hold IS NOT NULL;
