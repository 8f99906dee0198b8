-- Successes noticed at their end, a row per job and worker: the latest success each worker
-- noticed so (as PostgreSQL's 0018, where workers share the database: an end writes only its
-- own worker's row, so ends of one job's runs never wait for each other). The notice pass and
-- the jobs' health fold these rows in: a success newer than the state's last ends the job's
-- failure streak. Instants are Unix ms.
CREATE TABLE IF NOT EXISTS ll_job_successes (
    job    TEXT NOT NULL,
    worker TEXT NOT NULL,
    at     BIGINT NOT NULL,
    PRIMARY KEY (job, worker)
);
