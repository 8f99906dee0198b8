-- Worker leases (as on PostgreSQL). SQLite serves one worker per file, so the table holds the
-- worker itself: `worker_status` reads it on both backends. Times are Unix milliseconds.
-- 0001 created an `ll_workers` nothing ever wrote; it is replaced.
DROP TABLE IF EXISTS ll_workers;
CREATE TABLE ll_workers (
    name         TEXT PRIMARY KEY,
    instance     TEXT NOT NULL,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    lease_until  INTEGER NOT NULL
);
