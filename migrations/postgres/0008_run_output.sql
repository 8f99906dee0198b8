-- A run's live output: each line a command printed (stdout or stderr), recorded as it comes,
-- per attempt, up to a cap (a last `lamplighter` line says what the cap dropped).
CREATE TABLE IF NOT EXISTS ll_run_output (
    run_id TEXT NOT NULL,
    seq    BIGINT NOT NULL,
    stream TEXT NOT NULL,
    at     BIGINT NOT NULL,
    text   TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
