-- Who asked for a run started by hand (`trigger_job`, `run_workflow`): the token's name when
-- tokens have names, else the MCP client's. None for runs the schedule started; a retry keeps
-- its first attempt's.
ALTER TABLE ll_runs ADD COLUMN requested_by TEXT;
