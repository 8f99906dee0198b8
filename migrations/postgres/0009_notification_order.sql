-- The order notifications were recorded in: a job's are sent in it (a failure before the
-- recovery that follows it). SQLite uses the table's own rowid for this.
ALTER TABLE ll_notifications ADD COLUMN IF NOT EXISTS seq BIGSERIAL;
