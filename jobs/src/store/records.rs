//! What a run records as it goes, per run identity: its row, steps and decisions, checkpoints, agent calls and live output.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::dialect::{Column, Record, RunSql, Stmt, call_from_row, insert_rows, run_cols, run_from_row, sql, step_from_row};
use super::scripts::*;
use super::{Decided, Dispatch, NewRun, StepDecision, StoreError, from_ms, ms, new_id};
use crate::decide::{AfterDecision, StepChoice, after_decision, choose_step, decision_record};
use crate::limits::{self, Pool};
use crate::run::{CallRecord, Run, RunStatus, StepRecord, StepStatus};
use crate::snapshot::JobSnapshot;

#[async_trait]
pub(crate) trait Records: Send + Sync + std::fmt::Debug {
    /// Inserts a run (manual trigger). With an idempotency key used before for the job,
    /// returns the existing run's id and `false`.
    async fn insert_run(&self, run: NewRun, now: DateTime<Utc>) -> Result<(String, bool), StoreError>;
    /// Whether an insert hands a due run that needs no hand-over decision to the queue itself
    /// ([`Dialect::QUEUED_BY_INSERT`](super::dialect::Dialect::QUEUED_BY_INSERT)): then the
    /// inserter tells the queue's takers ([`crate::signals::Signal::TasksPushed`]).
    fn queued_by_insert(&self) -> bool;
    async fn get_run(&self, id: &str) -> Result<Option<Run>, StoreError>;
    /// The job snapshot a run was created with.
    async fn run_snapshot(&self, id: &str) -> Result<Option<JobSnapshot>, StoreError>;
    async fn checkpoint(&self, root_id: &str, step: &str) -> Result<Option<serde_json::Value>, StoreError>;
    /// Records `run_id`'s value for `step`, fenced as steps are.
    async fn record_checkpoint(
        &self,
        root_id: &str,
        step: &str,
        run_id: &str,
        value: &serde_json::Value,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// Every step recorded for the run identity `root_id`.
    async fn steps(&self, root_id: &str) -> Result<Vec<StepRecord>, StoreError>;
    /// Records steps (replacing an earlier record of the same step), in one transaction. The
    /// steps are one attempt's (their `run_id`), and only written while that run is running
    /// and its worker holds a live lease of the epoch it was claimed under: otherwise the
    /// write is refused ([`StoreError::is_fenced`]). So an attempt that lost its run (its
    /// lease ran out while it went on) cannot overwrite what the attempt after it recorded.
    async fn record_steps(&self, root_id: &str, steps: &[StepRecord]) -> Result<(), StoreError>;
    /// Records a decision on a waiting approval step, in one transaction with what it does to
    /// the run: an approval resumes it (`queued`, unless other steps still wait), a rejection
    /// fails it naming the step and cancels its other waiting steps. Of two decisions on the
    /// same step, the second finds it decided.
    async fn record_decision(&self, d: &StepDecision<'_>, now: DateTime<Utc>) -> Result<Decided, StoreError>;
    /// Every model and tool call recorded for the run identity `root_id`, by conversation and
    /// order.
    async fn calls(&self, root_id: &str) -> Result<Vec<CallRecord>, StoreError>;
    /// Records a call (replacing an earlier record at the same place), fenced as steps are;
    /// durable when this returns.
    async fn record_call(&self, root_id: &str, call: &CallRecord) -> Result<(), StoreError>;
    /// A workflow step that held `freed` ended: run `run_id` gives their slots back and keeps
    /// `kept` (its job's own) as the pools it takes, fenced as its steps are.
    async fn release_limits(&self, run_id: &str, kept: &[Pool], freed: &[Pool]) -> Result<(), StoreError>;
    /// Appends lines to run `run_id`'s output, fenced as its steps are.
    async fn append_output(&self, run_id: &str, lines: &[lamplighter_contract::OutputLine]) -> Result<(), StoreError>;
    /// Run `run_id`'s output, in order.
    async fn output(&self, run_id: &str) -> Result<Vec<lamplighter_contract::OutputLine>, StoreError>;
}

#[async_trait]
impl<D: RunSql> Records for D {
    async fn insert_run(&self, run: NewRun, now: DateTime<Utc>) -> Result<(String, bool), StoreError> {
        let existing = |job: &str, key: &str| {
            Stmt::new(sql!(D, "SELECT id FROM ll_runs WHERE job = $1 AND idempotency_key = $2"), "looking up an idempotency key")
                .bind(job.to_owned())
                .bind(key.to_owned())
        };
        let mut tx = self.begin().await?;
        if let Some(key) = run.idempotency_key.as_deref()
            && let Some(row) = D::fetch_optional(&mut tx, existing(&run.owner.to_string(), key)).await?
        {
            D::rollback(tx).await?;
            return Ok((row.text("id"), false));
        }
        let id = new_id();
        let (job, key) = (run.owner.to_string(), run.idempotency_key.clone());
        match insert_runs::<D>(&mut tx, &[(id.clone(), run, Dispatch::No)], None, now).await {
            Ok(()) => {}
            // Two callers with the same new key (several writers): the unique (job, key) made
            // this one wait for the other and fail; the other's run is the answer.
            Err(e)
                if e.is_unique_violation()
                    && let Some(key) = key =>
            {
                drop(tx);
                let row = D::fetch_optional(&mut *self.reader().await?, existing(&job, &key)).await?;
                return row.map(|r| (r.text("id"), false)).ok_or(e);
            }
            Err(e) => return Err(e),
        }
        D::commit(tx).await?;
        Ok((id, true))
    }

    fn queued_by_insert(&self) -> bool {
        D::QUEUED_BY_INSERT
    }

    async fn get_run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        let q = Stmt::new(sql!(D, concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE id = $1")), "reading a run");
        Ok(D::fetch_optional(&mut *self.reader().await?, q.bind(id)).await?.as_ref().map(run_from_row))
    }

    async fn run_snapshot(&self, id: &str) -> Result<Option<JobSnapshot>, StoreError> {
        let q = Stmt::new(sql!(D, "SELECT job_snapshot FROM ll_runs WHERE id = $1"), "reading a run's job snapshot");
        Ok(D::fetch_optional(&mut *self.reader().await?, q.bind(id)).await?.and_then(|r| r.json("job_snapshot")))
    }

    async fn checkpoint(&self, root_id: &str, step: &str) -> Result<Option<serde_json::Value>, StoreError> {
        let q = Stmt::new(sql!(D, "SELECT value FROM ll_checkpoints WHERE root_id = $1 AND step = $2"), "reading a checkpoint");
        Ok(D::fetch_optional(&mut *self.reader().await?, q.bind(root_id).bind(step)).await?.and_then(|r| r.json("value")))
    }

    async fn record_checkpoint(
        &self,
        root_id: &str,
        step: &str,
        run_id: &str,
        value: &serde_json::Value,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                "INSERT INTO ll_checkpoints (root_id, step, run_id, value, recorded_at) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (root_id, step) DO UPDATE SET run_id = $3, value = $4, recorded_at = $5"
            ),
            "recording a checkpoint",
        );
        write_fenced(self, run_id, q.bind(root_id).bind(step).bind(run_id).bind(value.to_string()).bind(ms(now))).await
    }

    async fn steps(&self, root_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT * FROM ll_steps WHERE root_id = $1 ORDER BY coalesce(started_at, finished_at), step"),
            "reading workflow steps",
        );
        Ok(D::fetch_all(&mut *self.reader().await?, q.bind(root_id)).await?.iter().map(step_from_row).collect())
    }

    async fn record_steps(&self, root_id: &str, steps: &[StepRecord]) -> Result<(), StoreError> {
        if steps.is_empty() {
            return Ok(());
        }
        let cols = [
            ("root_id", "text"),
            ("step", "text"),
            ("status", "text"),
            ("run_id", "text"),
            ("attempt", "bigint"),
            ("started_at", "bigint"),
            ("finished_at", "bigint"),
            ("output", "text"),
            ("error", "text"),
            ("resumes_on_reject", "bool"),
        ];
        let rows = steps
            .iter()
            .map(|st| {
                vec![
                    root_id.into(),
                    st.step.as_str().into(),
                    st.status.as_str().into(),
                    st.run_id.as_str().into(),
                    i64::from(st.attempt).into(),
                    st.started_at.map(ms).into(),
                    st.finished_at.map(ms).into(),
                    st.output.as_ref().map(|v| v.to_string()).into(),
                    st.error.as_deref().into(),
                    st.resumes_on_reject.into(),
                ]
            })
            .collect();
        let tail =
            "ON CONFLICT (root_id, step) DO UPDATE SET status = excluded.status, run_id = excluded.run_id, attempt = excluded.attempt,
                 started_at = excluded.started_at, finished_at = excluded.finished_at, output = excluded.output, error = excluded.error,
                 resumes_on_reject = excluded.resumes_on_reject
             WHERE ll_steps.attempt <= excluded.attempt";
        let q = insert_rows(&D::SPELLING, "ll_steps", &cols, rows, tail, "recording workflow steps");
        // One attempt writes its own steps.
        let run = steps[0].run_id.as_str();
        debug_assert!(steps.iter().all(|st| st.run_id == run));
        write_fenced(self, run, q).await
    }

    async fn release_limits(&self, run_id: &str, kept: &[Pool], freed: &[Pool]) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        fence::<D>(&mut tx, run_id).await?;
        let q = Stmt::new(sql!(D, "UPDATE ll_runs SET limits = $2 WHERE id = $1"), "keeping the run's own limits");
        D::execute(&mut tx, q.bind(run_id).bind(limits::stored(kept))).await?;
        let q = Stmt::new(
            sql!(
                D,
                "DELETE FROM ll_run_limits WHERE run_id = $1
                 AND EXISTS (SELECT 1 FROM {rows $2 AS j(name text, key text)} WHERE j.name = ll_run_limits.name AND j.key = ll_run_limits.key)"
            ),
            "freeing a step's slots",
        );
        let cols = vec![
            Column::Texts(freed.iter().map(|p| Some(p.name.as_str().into())).collect()),
            Column::Texts(freed.iter().map(|p| Some(p.key.as_str().into())).collect()),
        ];
        D::execute(&mut tx, q.bind(run_id).bind_rows(cols)).await?;
        // A slot an end handed over is held in the run's own row (PostgreSQL): freed too.
        let q =
            Stmt::new(sql!(D, "UPDATE ll_runs SET limit_hold = NULL WHERE id = $1 AND limit_hold {in $2}"), "freeing a step's handed slot");
        D::execute(&mut tx, q.bind(run_id).bind_list(freed.iter().map(Pool::encode).collect::<Vec<_>>().iter().map(String::as_str)))
            .await?;
        D::commit(tx).await
    }

    async fn record_decision(&self, d: &StepDecision<'_>, now: DateTime<Utc>) -> Result<Decided, StoreError> {
        let mut tx = self.begin().await?;
        // The run's lock orders decisions on it: the second reads what the first did.
        let q = Stmt::new(
            sql!(D, "SELECT status, coalesce(root_id, id) AS root FROM ll_runs WHERE id = $1 {lock}"),
            "reading the run to decide on",
        );
        let Some(run) = D::fetch_optional(&mut tx, q.bind(d.run_id)).await? else {
            D::rollback(tx).await?;
            return Ok(Decided::NoSuchRun);
        };
        let status: RunStatus = run.str("status").parse().unwrap_or(RunStatus::Failed);
        if status != RunStatus::WaitingApproval {
            D::rollback(tx).await?;
            return Ok(Decided::NotWaiting(status));
        }
        let q = Stmt::new(
            sql!(D, "SELECT step, resumes_on_reject FROM ll_steps WHERE run_id = $1 AND status = {step:WaitingApproval} ORDER BY step"),
            "reading the steps waiting for a decision",
        );
        let open_rows: Vec<(String, bool)> =
            D::fetch_all(&mut tx, q.bind(d.run_id)).await?.iter().map(|r| (r.text("step"), r.flag("resumes_on_reject"))).collect();
        let open: Vec<String> = open_rows.iter().map(|(s, _)| s.clone()).collect();
        let step = match choose_step(d.step, &open) {
            StepChoice::Step(s) => s.to_owned(),
            StepChoice::NotWaiting => {
                D::rollback(tx).await?;
                return Ok(Decided::NotWaitingStep { waiting: open });
            }
            StepChoice::Which => {
                D::rollback(tx).await?;
                return Ok(Decided::WhichStep { waiting: open });
            }
        };
        let (output, error) = decision_record(d.approve, d.comment, d.decided_by, now);
        let new_status = if d.approve { StepStatus::Succeeded } else { StepStatus::Failed };
        let q = Stmt::new(
            sql!(
                D,
                "UPDATE ll_steps SET status = $3, output = $4, error = $5, finished_at = $6
                 WHERE root_id = $1 AND step = $2 AND status = {step:WaitingApproval} RETURNING *"
            ),
            "recording a decision",
        )
        .bind(run.text("root"))
        .bind(step.as_str())
        .bind(new_status.as_str())
        .bind(output.to_string())
        .bind(error.as_deref())
        .bind(ms(now));
        let Some(record) = D::fetch_optional(&mut tx, q).await? else {
            // Read as waiting in this transaction a moment ago: only a broken row gets here.
            D::rollback(tx).await?;
            return Ok(Decided::NotWaitingStep { waiting: open });
        };
        let record = step_from_row(&record);
        let resumes_on_reject = open_rows.iter().any(|(s, resumes)| *s == step && *resumes);
        let run_status = match after_decision(d.approve, resumes_on_reject, open.len(), &step, error.as_deref()) {
            AfterDecision::Wait => RunStatus::WaitingApproval,
            AfterDecision::Resume => {
                let q = Stmt::new(
                    sql!(
                        D,
                        "UPDATE ll_runs SET status = {Queued}, dispatched_at = NULL, wait_until = NULL WHERE id = $1 AND status = {WaitingApproval}"
                    ),
                    "resuming an approved run",
                );
                D::execute(&mut tx, q.bind(d.run_id)).await?;
                RunStatus::Queued
            }
            AfterDecision::Fail(why) => {
                let q = Stmt::new(
                    sql!(
                        D,
                        "UPDATE ll_runs SET status = {Failed}, error = $2, finished_at = $3, wait_until = NULL,
                                            next_run_id = coalesce(next_run_id, '')
                         WHERE id = $1 AND status = {WaitingApproval}"
                    ),
                    "failing a rejected run",
                );
                D::execute(&mut tx, q.bind(d.run_id).bind(why).bind(ms(now))).await?;
                close_steps::<D>(&mut tx, &[(d.run_id, RunStatus::Failed)], now).await?;
                RunStatus::Failed
            }
        };
        D::commit(tx).await?;
        Ok(Decided::Recorded { step: record, run: run_status })
    }

    async fn calls(&self, root_id: &str) -> Result<Vec<CallRecord>, StoreError> {
        let q = Stmt::new(sql!(D, "SELECT * FROM ll_agent_calls WHERE root_id = $1 ORDER BY conversation, seq"), "reading agent calls");
        Ok(D::fetch_all(&mut *self.reader().await?, q.bind(root_id)).await?.iter().filter_map(call_from_row).collect())
    }

    async fn record_call(&self, root_id: &str, c: &CallRecord) -> Result<(), StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                "INSERT INTO ll_agent_calls (root_id, conversation, seq, kind, name, call_id, request, response, error,
                     input_tokens, output_tokens, cost, run_id, attempt, started_at, finished_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
                 ON CONFLICT (root_id, conversation, seq) DO UPDATE SET kind = excluded.kind, name = excluded.name,
                     call_id = excluded.call_id, request = excluded.request, response = excluded.response, error = excluded.error,
                     input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens, cost = excluded.cost,
                     run_id = excluded.run_id, attempt = excluded.attempt, started_at = excluded.started_at,
                     finished_at = excluded.finished_at
                 WHERE ll_agent_calls.attempt <= excluded.attempt"
            ),
            "recording an agent call",
        )
        .bind(root_id)
        .bind(c.conversation.as_str())
        .bind(i64::from(c.seq))
        .bind(c.kind.as_str())
        .bind(c.name.as_str())
        .bind(c.call_id.as_deref())
        .bind(c.request.as_ref().map(|v| v.to_string()))
        .bind(c.response.as_ref().map(|v| v.to_string()))
        .bind(c.error.as_deref())
        .bind(i64::try_from(c.input_tokens).unwrap_or(i64::MAX))
        .bind(i64::try_from(c.output_tokens).unwrap_or(i64::MAX))
        .bind(c.cost)
        .bind(c.run_id.as_str())
        .bind(i64::from(c.attempt))
        .bind(ms(c.started_at))
        .bind(ms(c.finished_at));
        write_fenced(self, &c.run_id, q).await
    }

    async fn append_output(&self, run_id: &str, lines: &[lamplighter_contract::OutputLine]) -> Result<(), StoreError> {
        if lines.is_empty() {
            return Ok(());
        }
        // One transaction for the whole batch, and a line written before is left as it is: a
        // batch tried again after an answer was lost writes what it had not.
        let mut tx = self.begin().await?;
        fence::<D>(&mut tx, run_id).await?;
        for chunk in lines.chunks(ROWS_PER_STATEMENT) {
            let rows = chunk
                .iter()
                .map(|l| vec![run_id.into(), (l.seq as i64).into(), l.stream.as_str().into(), ms(l.at).into(), l.text.as_str().into()])
                .collect();
            let cols = [("run_id", "text"), ("seq", "bigint"), ("stream", "text"), ("at", "bigint"), ("text", "text")];
            let q = insert_rows(&D::SPELLING, "ll_run_output", &cols, rows, "ON CONFLICT (run_id, seq) DO NOTHING", "recording output");
            D::execute(&mut tx, q).await?;
        }
        D::commit(tx).await
    }

    async fn output(&self, run_id: &str) -> Result<Vec<lamplighter_contract::OutputLine>, StoreError> {
        let q =
            Stmt::new(sql!(D, "SELECT seq, stream, at, text FROM ll_run_output WHERE run_id = $1 ORDER BY seq"), "reading a run's output");
        let rows = D::fetch_all(&mut *self.reader().await?, q.bind(run_id)).await?;
        Ok(rows
            .iter()
            .map(|r| lamplighter_contract::OutputLine {
                seq: r.int("seq").max(0) as u64,
                stream: r.text("stream"),
                at: from_ms(r.int("at")),
                text: r.text("text"),
            })
            .collect())
    }
}
