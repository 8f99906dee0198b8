-- Ticks of a job no worker fired on time (none was up, or the database was away), as the pass
-- that next saw them found them: one row per job and first missed tick, inserted with the
-- `missed` notifications in one transaction before the pass fires what catch-up keeps, so a
-- pass repeated after a crash, or another worker's, records nothing new. Instants are Unix ms.
CREATE TABLE IF NOT EXISTS ll_missed_ticks (
    job            TEXT NOT NULL,
    first_tick     BIGINT NOT NULL,
    last_tick      BIGINT NOT NULL,
    count          BIGINT NOT NULL,
    caught_up      BIGINT NOT NULL,
    skipped        BIGINT NOT NULL,
    outside_window BIGINT NOT NULL,
    told_at        BIGINT NOT NULL,
    PRIMARY KEY (job, first_tick)
);
