-- The trace id of a run's latest execution (32 hex digits), when its spans were exported:
-- `lampctl runs show` prints it so the run can be found in the tracing backend.
ALTER TABLE ll_runs ADD COLUMN trace_id TEXT;
