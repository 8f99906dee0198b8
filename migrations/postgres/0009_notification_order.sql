-- The order notifications were recorded in: each receiver gets a job's notifications in it (a
-- failure, retried or not, before the recovery that follows it). SQLite uses the table's own
-- rowid. Rows already here are numbered by when they were recorded.
CREATE SEQUENCE IF NOT EXISTS ll_notifications_seq;
ALTER TABLE ll_notifications ADD COLUMN IF NOT EXISTS seq BIGINT;
UPDATE ll_notifications n SET seq = o.rn
    FROM (SELECT key, row_number() OVER (ORDER BY created_at, key) AS rn FROM ll_notifications) o
    WHERE n.key = o.key AND n.seq IS NULL;
SELECT setval('ll_notifications_seq', coalesce((SELECT max(seq) FROM ll_notifications), 0) + 1, false);
ALTER TABLE ll_notifications ALTER COLUMN seq SET DEFAULT nextval('ll_notifications_seq'), ALTER COLUMN seq SET NOT NULL;
ALTER SEQUENCE ll_notifications_seq OWNED BY ll_notifications.seq;
-- What stands before a notification in its line: the unsent ones of its job and target.
CREATE INDEX IF NOT EXISTS ll_notifications_open_line ON ll_notifications (job, target_id, seq) WHERE status IN ('pending', 'sending');
