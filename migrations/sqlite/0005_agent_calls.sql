-- Agent conversations: every model call and tool call of a run, in conversation order, kept
-- under the run's identity (root_id, shared by every attempt). A run that executes again
-- (retry, recovery, resumption after an approval) replays these instead of calling again:
-- a model call recorded here is never paid for twice, a tool call recorded here never runs
-- twice.
--
-- conversation: '' for an agent job; the step id for a workflow's agent step; a delegation
-- or group-chat turn gets its parent's conversation with a suffix.
-- seq: the call's place in its conversation (a model reply, then its tool calls in order).
-- kind: 'model' or 'tool'; name: the model id or the tool (plugin.action / server.tool).
CREATE TABLE IF NOT EXISTS ll_agent_calls (
    root_id       TEXT NOT NULL,
    conversation  TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    kind          TEXT NOT NULL,
    name          TEXT NOT NULL,
    call_id       TEXT,
    request       TEXT,
    response      TEXT,
    error         TEXT,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cost          REAL,
    run_id        TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER NOT NULL,
    PRIMARY KEY (root_id, conversation, seq)
);
