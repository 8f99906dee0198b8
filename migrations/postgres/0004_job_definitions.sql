-- Jobs created at runtime (over MCP): the definition as JSON, exactly the object a job's entry
-- in YAML is; the worker compiles it against the config in force. `version` counts every
-- change of the name, across deletes (a name created again continues its count), so an
-- `expected_version` can never match a definition it was not read from. Times are Unix
-- milliseconds; actors are who asked (the MCP client's name, and its token's when tokens have
-- names).
CREATE TABLE IF NOT EXISTS ll_job_definitions (
    name       TEXT PRIMARY KEY,
    definition TEXT NOT NULL,
    version    BIGINT NOT NULL,
    created_by TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_by TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- Every change of a runtime job, kept when the job is deleted: the definition before and after
-- (null for none), who and when.
CREATE TABLE IF NOT EXISTS ll_job_history (
    id BIGSERIAL PRIMARY KEY,
    job        TEXT NOT NULL,
    version    BIGINT NOT NULL,
    action     TEXT NOT NULL,
    before     TEXT,
    after      TEXT,
    actor      TEXT NOT NULL,
    at         BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS ll_job_history_by_job ON ll_job_history (job, version);
