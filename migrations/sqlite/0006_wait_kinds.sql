-- What a rejection does to a run is a property of the wait, kept in its own column: 1 for a
-- wait that asked "may this go on?" (an agent's tool call), whose rejection resumes the run so
-- that it acts on it; 0 (every workflow approval) fails the run naming the step.
ALTER TABLE ll_steps ADD COLUMN resumes_on_reject INTEGER NOT NULL DEFAULT 0;
UPDATE ll_steps SET resumes_on_reject = 1
WHERE status = 'waiting_approval' AND json_valid(output) AND json_extract(output, '$.on_reject') = 'resume';

-- Before this version a `parallel` holding a step that waits for a decision recorded itself
-- waiting too: with two open waits, deciding the real one left the run waiting on the parallel
-- forever. Such parallels go back to `running`; which steps are parallels is read from the
-- workflow definition each run keeps in its job snapshot.
UPDATE ll_steps SET status = 'running'
WHERE status = 'waiting_approval'
  AND EXISTS (
    SELECT 1
    FROM ll_runs r,
         json_tree(CASE WHEN json_valid(r.job_snapshot) THEN r.job_snapshot ELSE '{}' END, '$.target') t
    WHERE r.status = 'waiting_approval'
      AND coalesce(r.root_id, r.id) = ll_steps.root_id
      AND t.type = 'object'
      AND json_extract(t.value, '$.type') = 'parallel'
      AND json_extract(t.value, '$.id') = ll_steps.step
  );
