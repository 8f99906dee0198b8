-- Successes noticed at their end, a row per job and worker: the latest success each worker
-- noticed so. An end writes only its own worker's row, so workers ending runs of one job never
-- wait for each other (on `ll_job_state` they did, and the ends that found it held left their
-- successes to the notice pass). The notice pass and the jobs' health fold these rows in: a
-- success newer than the state's last ends the job's failure streak.
CREATE TABLE IF NOT EXISTS ll_job_successes (
    job    TEXT NOT NULL,
    worker TEXT NOT NULL,
    at     BIGINT NOT NULL,
    PRIMARY KEY (job, worker)
);
