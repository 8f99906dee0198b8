//! Every transaction of the run core, written once: a store whose backend implements
//! [`Dialect`] is a [`RunStore`]. Each script reads the facts it needs, asks the pure
//! decisions of [`crate::decide`] (and [`super::plan_ticks`]) what to do, and writes the
//! result in the same transaction; where the backends really differ (binding a batch, locking,
//! leases, the queue) it calls the dialect.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use lamplighter_config::Overlap;

use super::RunBrief;
use super::dialect::{
    Dialect, Locked, Record, Stmt, call_from_row, handed_from_row, job_state_from_row, leases_with_runs, run_cols, run_from_row, sql,
    step_from_row, values,
};
use super::{
    ACTIVE, ChangeRequest, Changed, Claim, DUE_BATCH, Decided, Dispatch, Handed, Hold, JobChangeRecord, JobHealth, JobOverview, JobState,
    Lease, NewRun, Noticed, Refused, RulesOf, RunEnd, RunFilter, RunStore, StepDecision, StoreError, StoredJob, TICK_KEYS_KEPT, Taken,
    TickOutcome, TickPlan, WorkerId, WorkerLease, from_ms, ms, new_id, plan_ticks, status_list,
};
use crate::decide::{
    AfterDecision, Finality, OutcomeKind, RETRY_RECORDED_WITHIN, StepChoice, after_decision, choose_step, decision_record, finality,
    notify_on_outcome, notify_on_wait,
};
use crate::definitions::{Change, decide_change};
use crate::notify::{self, Claimed, NewNotification, Notification, NotificationStatus, Sent};
use crate::run::{CallRecord, Run, RunStatus, StepRecord, StepStatus, Transitions, Trigger};
use crate::snapshot::JobSnapshot;

/// Rows per multi-row statement: 22 columns × 1000 stays under both drivers' bound on
/// parameters (SQLite 32,766, PostgreSQL 65,535).
const ROWS_PER_STATEMENT: usize = 1000;

/// The columns of a run as [`insert_runs`] writes them.
const RUN_INSERT: &str = "ll_runs (id, job, trigger, status, scheduled_at, due_at, enqueued_at, dispatched_at, attempt, input, \
                          parameters, error, idempotency_key, retry_of, finished_at, root_id, job_snapshot, worker, started_at, requested_by, epoch, \
                          outcome_seen)";
const RUN_INSERT_COLS: usize = 22;

/// Runs one notice pass reads ([`RunStore::notice`]).
const NOTICE_BATCH: usize = 1000;

/// What a notice pass locks (as a job's ticks are locked: no job has this name), so that one
/// pass at a time moves the streaks across workers.
const NOTICE_LOCK: &str = "\u{1}notice";

/// The columns of a runtime job, for [`stored_job_from_row`].
const DEFINITION_COLS: &str = "name, definition, version, created_by, created_at, updated_by, updated_at";

/// A damaged definition reads as `null`: the job is then shown as one that does not compile,
/// and can be updated or deleted, rather than vanishing.
fn stored_job_from_row(r: &impl Record) -> StoredJob {
    StoredJob {
        name: r.text("name"),
        definition: r.json("definition").unwrap_or(serde_json::Value::Null),
        version: r.int("version").max(0) as u64,
        created_by: r.text("created_by"),
        created_at: from_ms(r.int("created_at")),
        updated_by: r.text("updated_by"),
        updated_at: from_ms(r.int("updated_at")),
    }
}

/// Inserts runs, one multi-row statement per [`ROWS_PER_STATEMENT`]. Claimed runs record
/// `epoch`, their worker's lease epoch.
async fn insert_runs<D: Dialect>(
    c: &mut D::Conn,
    rows: &[(String, NewRun, Dispatch<'_>)],
    epoch: Option<i64>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let now = ms(now);
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let mut q = Stmt::built(values(&D::SPELLING, RUN_INSERT, RUN_INSERT_COLS, chunk.len(), ""), "inserting runs");
        for (id, r, dispatch) in chunk {
            let (status, worker) = match dispatch {
                Dispatch::Claimed(worker) => (RunStatus::Running, Some(*worker)),
                _ => (r.status, None),
            };
            q = q
                .bind(id.as_str())
                .bind(r.job.as_str())
                .bind(r.trigger.as_str())
                .bind(status.as_str())
                .bind(r.scheduled_at.map(ms))
                .bind(ms(r.due_at))
                .bind(now)
                .bind((!matches!(dispatch, Dispatch::No)).then_some(now))
                .bind(i64::from(r.attempt))
                .bind(r.input.as_ref().map(|v| v.to_string()))
                .bind(r.parameters.as_ref().map(|v| v.to_string()))
                .bind(r.error.as_deref())
                .bind(r.idempotency_key.as_deref())
                .bind(r.retry_of.as_deref())
                .bind(status.is_final().then_some(now))
                // NULL means "its own root" (reads coalesce): a first attempt stores no copy of its id.
                .bind(r.root_id.as_deref().filter(|root| *root != id.as_str()))
                .bind(r.snapshot.as_ref().and_then(|s| serde_json::to_string(s).ok()))
                .bind(worker)
                .bind(worker.map(|_| now))
                .bind(r.requested_by.as_deref())
                .bind(worker.and(epoch))
                // A run that ends as it is made (a skipped tick) has nothing to notice: no event,
                // no streak moved; marked so that retention can prune it at once.
                .bind(status.is_final().then_some(1i64));
        }
        D::execute(c, q).await?;
    }
    Ok(())
}

/// Closes the steps still open (running or waiting) of runs that ended without succeeding
/// ([`super::steps_closed_by`]). `ends`: (run id, run status).
async fn close_steps<D: Dialect>(c: &mut D::Conn, ends: &[(&str, RunStatus)], now: DateTime<Utc>) -> Result<(), StoreError> {
    let ends: Vec<(&str, StepStatus)> = ends.iter().filter_map(|(id, s)| super::steps_closed_by(*s).map(|step| (*id, step))).collect();
    if ends.is_empty() {
        return Ok(());
    }
    D::close_steps(c, &ends, ms(now)).await
}

/// Claims `ids` for `worker` under its lease's `epoch` (see [`Dialect::claim`]).
async fn claim<D: Dialect>(
    c: &mut D::Conn,
    ids: &[String],
    worker: &str,
    epoch: i64,
    now: DateTime<Utc>,
    locked: Locked,
) -> Result<Vec<Handed>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(D::claim(c, ids, worker, epoch, ms(now), locked).await?.iter().map(handed_from_row).collect())
}

/// Takes up to `n` tasks and claims their runs for `worker`, in the caller's transaction.
/// Taking a task consumes it: a worker without a live lease (whose claims would take nothing)
/// leaves the queue alone.
async fn take_and_claim<D: Dialect>(c: &mut D::Conn, n: usize, worker: &str, now: DateTime<Utc>) -> Result<Taken, StoreError> {
    let Some(epoch) = live_epoch::<D>(c, worker).await? else {
        return Ok(Taken::default());
    };
    let (tasks, ids) = D::take(c, n).await?;
    let runs = claim::<D>(c, &ids, worker, epoch, now, Locked::Wait).await?;
    Ok(Taken { tasks, runs })
}

/// The ids of `done` (run id, status recorded) whose end was recorded as `ends` asked (not
/// cancelled instead).
fn recorded_as_asked(ends: &[RunEnd<'_>], done: &[(String, RunStatus)]) -> Vec<String> {
    let asked: HashMap<&str, RunStatus> = ends.iter().map(|e| (e.id, e.status)).collect();
    done.iter().filter(|(id, s)| asked.get(id.as_str()) == Some(s)).map(|(id, _)| id.clone()).collect()
}

/// The epoch of `worker`'s lease, if it is live.
async fn live_epoch<D: Dialect>(c: &mut D::Conn, worker: &str) -> Result<Option<i64>, StoreError> {
    let q = Stmt::new(sql!(D, "SELECT epoch FROM ll_workers w WHERE w.name = $1 {lease_live}"), "reading the worker's lease");
    Ok(D::fetch_optional(c, q.bind(worker)).await?.map(|r| r.int("epoch")))
}

/// The fence of a run's own writes (its steps, calls and checkpoints), in the transaction that
/// makes them: the run is running and its worker holds a live lease of the epoch it was claimed
/// under. The run's row is locked (PostgreSQL): a takeover that would interrupt it waits for
/// this write to commit, or this write finds the run gone.
async fn fence<D: Dialect>(c: &mut D::Conn, run: &str) -> Result<(), StoreError> {
    let q = Stmt::new(
        sql!(D, "SELECT 1 AS held FROM ll_runs WHERE id = $1 AND status = {Running} AND {held} {lock}"),
        "checking that the run is still this worker's",
    );
    match D::fetch_optional(c, q.bind(run)).await? {
        Some(_) => Ok(()),
        None => Err(StoreError::fenced(run)),
    }
}

/// Writes `q` for run `run`, in one transaction behind its [`fence`].
async fn write_fenced<D: Dialect>(store: &D, run: &str, q: Stmt<'_>) -> Result<(), StoreError> {
    let mut tx = store.begin().await?;
    fence::<D>(&mut tx, run).await?;
    D::execute(&mut tx, q).await?;
    D::commit(tx).await
}

/// The reads the scheduler makes on every pass, for the SQLite backend's plan tests.
#[cfg(test)]
pub(crate) fn scheduler_reads<D: Dialect>() -> [&'static str; 2] {
    [due_undispatched_sql::<D>(), next_due_sql::<D>()]
}

/// A notification (`ll_notifications n`) whose turn it is. A job's notifications go out in
/// the order they were recorded, across workers:
/// - to one target, one at a time: none before it is unsent (a failure, retried or not, reaches
///   its receiver before the recovery that follows it);
/// - to other targets, none before it is in flight or not yet tried (a failure sent to one
///   webhook goes before the recovery sent to another); one whose send failed and waits for
///   its retry holds back only its own target's line.
const FIRST_IN_LINE: &str = "NOT EXISTS (SELECT 1 FROM ll_notifications e WHERE e.job = n.job AND e.status IN ('pending', 'sending')
                             AND e.{notification_seq} < n.{notification_seq}
                             AND (e.target_id = n.target_id OR e.status = 'sending' OR e.attempts = 0))";

fn due_undispatched_sql<D: Dialect>() -> &'static str {
    sql!(
        D,
        "SELECT id, job, trigger FROM ll_runs {undispatched} WHERE status = {Queued} AND dispatched_at IS NULL AND due_at <= $1
         ORDER BY due_at, enqueued_at, id LIMIT $2"
    )
}

fn next_due_sql<D: Dialect>() -> &'static str {
    sql!(
        D,
        "SELECT min(t) AS t FROM (SELECT min(due_at) AS t FROM ll_runs {undispatched} WHERE status = {Queued} AND dispatched_at IS NULL
                                  UNION ALL SELECT min(wait_until) FROM ll_runs WHERE status = {WaitingApproval}) AS due"
    )
}

#[async_trait]
impl<D: Dialect> RunStore for D {
    async fn migrate(&self) -> Result<(), StoreError> {
        Dialect::migrate(self).await
    }

    async fn close(&self) {
        Dialect::close(self).await
    }

    async fn check(&self) -> Result<(), String> {
        Dialect::check(self).await
    }

    async fn listing_changes(&self) -> Option<u64> {
        Dialect::listing_changes(self).await
    }

    async fn job_states(&self) -> Result<HashMap<String, JobState>, StoreError> {
        Dialect::job_states(self).await
    }

    async fn job_state(&self, job: &str) -> Result<JobState, StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT job, paused, pause_reason, paused_at, last_tick FROM ll_job_state WHERE job = $1"),
            "reading job state",
        );
        let row = D::fetch_optional(&mut *self.reader().await?, q.bind(job)).await?;
        Ok(row.as_ref().map(job_state_from_row).unwrap_or_default())
    }

    async fn set_paused(&self, job: &str, paused: bool, reason: Option<&str>, now: DateTime<Utc>) -> Result<(), StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                "INSERT INTO ll_job_state (job, paused, pause_reason, paused_at) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (job) DO UPDATE SET paused = $2, pause_reason = $3, paused_at = $4"
            ),
            "saving pause state",
        );
        D::execute(&mut *self.writer().await?, q.bind(job).bind(paused).bind(reason).bind(paused.then(|| ms(now)))).await?;
        Ok(())
    }

    async fn set_last_tick(&self, job: &str, tick: DateTime<Utc>) -> Result<(), StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                "INSERT INTO ll_job_state (job, last_tick) VALUES ($1, $2)
                 ON CONFLICT (job) DO UPDATE SET last_tick = {greatest}(coalesce(ll_job_state.last_tick, 0), $2)"
            ),
            "saving the last tick",
        );
        D::execute(&mut *self.writer().await?, q.bind(job).bind(ms(tick))).await?;
        Ok(())
    }

    async fn fire_ticks_held(
        &self,
        ticks: Vec<(NewRun, Overlap)>,
        claim: Claim<'_>,
        now: DateTime<Utc>,
        hold: Option<Hold<'_>>,
    ) -> Result<Option<Vec<Option<TickOutcome>>>, StoreError> {
        // Where the transaction's time goes, for the bench's stage lines (`tick transaction`).
        let began = std::time::Instant::now();
        let mut lap = began;
        let mut split = move || {
            let now = std::time::Instant::now();
            now.duration_since(std::mem::replace(&mut lap, now)).as_micros() as u64
        };
        let mut tx = self.begin().await?;
        let begin_us = split();
        let ids: Vec<String> = ticks.iter().map(|_| new_id()).collect();
        let keys =
            ticks.iter().zip(&ids).map(|((r, _), id)| (r.job.as_str(), ms(r.scheduled_at.unwrap_or(r.due_at)), id.as_str())).collect();
        let fresh = D::record_ticks(&mut tx, keys).await?;
        let keys_us = split();
        let jobs: Vec<&str> = ticks
            .iter()
            .zip(&ids)
            .filter(|(_, id)| fresh.contains(*id))
            .map(|((r, _), _)| r.job.as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        D::lock_jobs(&mut tx, &jobs).await?;
        let q = Stmt::new(sql!(D, "SELECT job FROM ll_job_state WHERE paused AND job {in $1}"), "reading pause state");
        let paused: HashSet<String> =
            D::fetch_all(&mut tx, q.bind_list(jobs.iter().copied())).await?.iter().map(|r| r.text("job")).collect();
        // A backfill's runs are a stream of their own: they hold each other back (a backfill
        // batch sees them), but never count against a live tick's overlap policy, which would
        // otherwise skip live ticks while a backfill drains, or cancel it (`replace`).
        let backfill = ticks.iter().any(|(r, _)| r.trigger == Trigger::Backfill);
        let q = Stmt::new(
            sql!(
                D,
                format!(
                    "SELECT job, id FROM ll_runs WHERE job {{in $1}} AND status IN {} AND (trigger != $2 OR $3) ORDER BY enqueued_at, id",
                    *ACTIVE
                )
            ),
            "reading active runs",
        );
        let mut active: HashMap<String, Vec<String>> = HashMap::new();
        for row in D::fetch_all(&mut tx, q.bind_list(jobs.iter().copied()).bind(Trigger::Backfill.as_str()).bind(backfill)).await? {
            active.entry(row.text("job")).or_default().push(row.text("id"));
        }
        // Claims need a live lease: they record its epoch, the fence of the runs' writes. A
        // worker without one leaves its runs to the queue, for a worker that has.
        let mut claim = claim;
        let mut epoch = None;
        if claim.slots > 0 {
            epoch = live_epoch::<D>(&mut tx, claim.worker).await?;
            if epoch.is_none() {
                claim.slots = 0;
            }
        }
        let reads_us = split();
        let TickPlan { out, rows, pushed, last_ticks } = plan_ticks(ticks, ids, &fresh, &paused, active, claim, now);
        insert_runs::<D>(&mut tx, &rows, epoch, now).await?;
        let runs_us = split();
        // In job order (a BTreeMap), as the jobs were locked.
        let last: Vec<(&String, &i64)> = last_ticks.iter().collect();
        for chunk in last.chunks(ROWS_PER_STATEMENT) {
            let tail =
                sql!(D, "ON CONFLICT (job) DO UPDATE SET last_tick = {greatest}(coalesce(ll_job_state.last_tick, 0), excluded.last_tick)");
            let mut q = Stmt::built(values(&D::SPELLING, "ll_job_state (job, last_tick)", 2, chunk.len(), tail), "saving the last ticks");
            for (job, at) in chunk {
                q = q.bind(job.as_str()).bind(**at);
            }
            D::execute(&mut tx, q).await?;
        }
        D::push(&mut tx, &pushed).await?;
        let state_us = split();
        if let Some(hold) = hold
            && !hold.await
        {
            D::rollback(tx).await?;
            tracing::debug!(ticks = rows.len(), "tick transaction rolled back as asked");
            return Ok(None);
        }
        let held_us = split();
        D::commit(tx).await?;
        tracing::debug!(
            ticks = rows.len(),
            begin_us,
            keys_us,
            reads_us,
            runs_us,
            state_us,
            held_us,
            commit_us = split(),
            total_us = began.elapsed().as_micros() as u64,
            "tick transaction"
        );
        Ok(Some(out))
    }

    async fn insert_run(&self, run: NewRun, now: DateTime<Utc>) -> Result<(String, bool), StoreError> {
        let existing = |job: &str, key: &str| {
            Stmt::new(sql!(D, "SELECT id FROM ll_runs WHERE job = $1 AND idempotency_key = $2"), "looking up an idempotency key")
                .bind(job.to_owned())
                .bind(key.to_owned())
        };
        let mut tx = self.begin().await?;
        if let Some(key) = run.idempotency_key.as_deref()
            && let Some(row) = D::fetch_optional(&mut tx, existing(&run.job, key)).await?
        {
            D::rollback(tx).await?;
            return Ok((row.text("id"), false));
        }
        let id = new_id();
        let (job, key) = (run.job.clone(), run.idempotency_key.clone());
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

    async fn follow_up(&self, run: &Run, due_at: DateTime<Utc>, now: DateTime<Utc>) -> Result<Option<String>, StoreError> {
        let mut tx = self.begin().await?;
        let id = new_id();
        // Claims the link first: a run is followed up at most once, whichever worker asks.
        let q = Stmt::new(
            sql!(D, "UPDATE ll_runs SET next_run_id = $1 WHERE id = $2 AND next_run_id IS NULL RETURNING job_snapshot"),
            "linking a follow-up",
        );
        let Some(linked) = D::fetch_optional(&mut tx, q.bind(id.as_str()).bind(run.id.as_str())).await? else {
            D::rollback(tx).await?;
            return Ok(None);
        };
        let mut next = NewRun::follow_up(run, due_at);
        next.snapshot = linked.json("job_snapshot");
        insert_runs::<D>(&mut tx, &[(id.clone(), next, Dispatch::No)], None, now).await?;
        D::commit(tx).await?;
        Ok(Some(id))
    }

    async fn mark_no_follow_up(&self, id: &str) -> Result<(), StoreError> {
        let q =
            Stmt::new(sql!(D, "UPDATE ll_runs SET next_run_id = '' WHERE id = $1 AND next_run_id IS NULL"), "closing an interrupted run");
        D::execute(&mut *self.writer().await?, q.bind(id)).await?;
        Ok(())
    }

    async fn due_undispatched(&self, now: DateTime<Utc>) -> Result<Vec<(String, String, Trigger)>, StoreError> {
        let q = Stmt::new(due_undispatched_sql::<D>(), "reading due runs").bind(ms(now)).bind(DUE_BATCH as i64);
        Ok(D::fetch_all(&mut *self.reader().await?, q)
            .await?
            .iter()
            .map(|r| (r.text("id"), r.text("job"), r.str("trigger").parse().unwrap_or(Trigger::Api)))
            .collect())
    }

    async fn next_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let row = D::fetch_optional(&mut *self.reader().await?, Stmt::new(next_due_sql::<D>(), "reading the next due run")).await?;
        Ok(row.and_then(|r| r.opt_int("t")).map(from_ms))
    }

    async fn has_dispatched_active(&self, job: &str) -> Result<bool, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                format!(
                    "SELECT EXISTS (SELECT 1 FROM ll_runs WHERE job = $1 AND status IN {} AND (status != {{Queued}} OR dispatched_at IS NOT NULL)) AS found",
                    *ACTIVE
                )
            ),
            "reading active runs",
        );
        Ok(D::fetch_optional(&mut *self.reader().await?, q.bind(job)).await?.is_some_and(|r| r.flag("found")))
    }

    /// Several schedulers may hand the same due runs over at once: rows another one holds are
    /// skipped (it is handing them over), the rest taken.
    async fn dispatch(&self, handed: &[String], queued: &[String], worker: &str, now: DateTime<Utc>) -> Result<Vec<Handed>, StoreError> {
        let mut tx = self.begin().await?;
        // Without a live lease nothing is claimed: the runs stay due, for a worker that has one.
        let epoch = if handed.is_empty() { None } else { live_epoch::<D>(&mut tx, worker).await? };
        let claimed = match epoch {
            Some(epoch) => claim::<D>(&mut tx, handed, worker, epoch, now, Locked::Skip).await?,
            None => Vec::new(),
        };
        let to_push = if queued.is_empty() { Vec::new() } else { D::mark_dispatched(&mut tx, queued, ms(now)).await? };
        D::push(&mut tx, &to_push).await?;
        D::commit(tx).await?;
        Ok(claimed)
    }

    /// The tasks taken are this transaction's alone, so their runs are locked by nobody else
    /// but a concurrent cancel: the claim waits for it and then leaves the run out.
    async fn claim_queued(&self, n: usize, worker: &str, now: DateTime<Utc>) -> Result<Taken, StoreError> {
        let mut tx = self.begin().await?;
        let taken = take_and_claim::<D>(&mut tx, n, worker, now).await?;
        D::commit(tx).await?;
        Ok(taken)
    }

    async fn finish_and_claim(
        &self,
        ends: &[RunEnd<'_>],
        n: usize,
        worker: &str,
        now: DateTime<Utc>,
    ) -> Result<(Vec<String>, Taken), StoreError> {
        if n == 0 {
            return Ok((self.finish_many(ends, now).await?, Taken::default()));
        }
        // Where the write's time goes, for the queue bench (`ends and claims`).
        let mut lap = std::time::Instant::now();
        if let Some(written) = self.ends_and_claims_at_once(ends, n, worker, ms(now)).await {
            let (done, tasks, rows) = written?;
            let taken = Taken { tasks, runs: rows.iter().map(handed_from_row).collect() };
            let statement_us = lap.elapsed().as_micros() as u64;
            tracing::debug!(ends = ends.len(), claimed = taken.runs.len(), statement_us, "ends and claims");
            return Ok((recorded_as_asked(ends, &done), taken));
        }
        let mut split = move || {
            let now = std::time::Instant::now();
            now.duration_since(std::mem::replace(&mut lap, now)).as_micros() as u64
        };
        let mut tx = self.begin().await?;
        let begin_us = split();
        let done = D::finish_runs(&mut tx, ends, ms(now)).await?;
        let ended: Vec<(&str, RunStatus)> = done.iter().map(|(id, s)| (id.as_str(), *s)).collect();
        close_steps::<D>(&mut tx, &ended, now).await?;
        let ends_us = split();
        // The lease, the take and the claim, as `claim_queued` makes them.
        let taken = take_and_claim::<D>(&mut tx, n, worker, now).await?;
        let claim_us = split();
        D::commit(tx).await?;
        tracing::debug!(ends = ends.len(), claimed = taken.runs.len(), begin_us, ends_us, claim_us, commit_us = split(), "ends and claims");
        Ok((recorded_as_asked(ends, &done), taken))
    }

    async fn finish_many(&self, ends: &[RunEnd<'_>], now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        debug_assert!(ends.iter().all(|e| RunStatus::Running.can_become(e.status)));
        let as_asked = |done: &[(String, RunStatus)]| recorded_as_asked(ends, done);
        // Only a batch with steps to close needs a transaction around both statements (a run
        // ended `cancelled` instead, its cancel asked for meanwhile, has its steps closed after).
        if !ends.iter().any(|e| e.status.is_final() && e.status != RunStatus::Succeeded) {
            let done = D::finish_runs(&mut *self.writer().await?, ends, ms(now)).await?;
            let cancelled: Vec<(&str, RunStatus)> =
                done.iter().filter(|(_, s)| *s == RunStatus::Cancelled).map(|(id, s)| (id.as_str(), *s)).collect();
            if !cancelled.is_empty() {
                close_steps::<D>(&mut *self.writer().await?, &cancelled, now).await?;
            }
            return Ok(as_asked(&done));
        }
        let mut tx = self.begin().await?;
        let done = D::finish_runs(&mut tx, ends, ms(now)).await?;
        let ended: Vec<(&str, RunStatus)> = done.iter().map(|(id, s)| (id.as_str(), *s)).collect();
        close_steps::<D>(&mut tx, &ended, now).await?;
        D::commit(tx).await?;
        Ok(as_asked(&done))
    }

    async fn finish(
        &self,
        id: &str,
        status: RunStatus,
        output: Option<&serde_json::Value>,
        error: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let sources: Vec<RunStatus> = RunStatus::sources(status).filter(|s| *s != RunStatus::Running).collect();
        if sources.is_empty() {
            return Ok(false);
        }
        let sql = super::dialect::numbered(
            &format!(
                "UPDATE ll_runs SET status = $2, output = $3, error = $4, finished_at = $5,
                                   next_run_id = CASE WHEN $6 THEN coalesce(next_run_id, '') ELSE next_run_id END
                 WHERE id = $1 AND status IN {}",
                status_list(sources.into_iter())
            ),
            &D::SPELLING,
        );
        let mut tx = self.begin().await?;
        let q = Stmt::built(sql, "finishing a run")
            .bind(id)
            .bind(status.as_str())
            .bind(output.map(|o| o.to_string()))
            .bind(error)
            .bind(ms(now))
            // A failure ended here has no attempt to follow: it is the run's outcome.
            .bind(matches!(status, RunStatus::Failed | RunStatus::TimedOut | RunStatus::Interrupted));
        let n = D::execute(&mut tx, q).await?;
        if n == 1 {
            close_steps::<D>(&mut tx, &[(id, status)], now).await?;
        }
        D::commit(tx).await?;
        Ok(n == 1)
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
        let sql = values(
            &D::SPELLING,
            "ll_steps (root_id, step, status, run_id, attempt, started_at, finished_at, output, error, resumes_on_reject)",
            10,
            steps.len(),
            "ON CONFLICT (root_id, step) DO UPDATE SET status = excluded.status, run_id = excluded.run_id, attempt = excluded.attempt,
                 started_at = excluded.started_at, finished_at = excluded.finished_at, output = excluded.output, error = excluded.error,
                 resumes_on_reject = excluded.resumes_on_reject
             WHERE ll_steps.attempt <= excluded.attempt",
        );
        let mut q = Stmt::built(sql, "recording workflow steps");
        for st in steps {
            q = q
                .bind(root_id)
                .bind(st.step.as_str())
                .bind(st.status.as_str())
                .bind(st.run_id.as_str())
                .bind(i64::from(st.attempt))
                .bind(st.started_at.map(ms))
                .bind(st.finished_at.map(ms))
                .bind(st.output.as_ref().map(|v| v.to_string()))
                .bind(st.error.as_deref())
                .bind(st.resumes_on_reject);
        }
        // One attempt writes its own steps.
        let run = steps[0].run_id.as_str();
        debug_assert!(steps.iter().all(|st| st.run_id == run));
        write_fenced(self, run, q).await
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

    async fn request_cancel(&self, id: &str, why: &str) -> Result<bool, StoreError> {
        let q =
            Stmt::new(sql!(D, "UPDATE ll_runs SET cancel_requested = $2 WHERE id = $1 AND status = {Running}"), "keeping a cancel request");
        Ok(D::execute(&mut *self.writer().await?, q.bind(id).bind(why)).await? == 1)
    }

    async fn cancels_requested(&self, worker: &str) -> Result<Vec<(String, String)>, StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT id, cancel_requested FROM ll_runs WHERE worker = $1 AND status = {Running} AND cancel_requested IS NOT NULL"),
            "reading cancel requests",
        );
        Ok(D::fetch_all(&mut *self.reader().await?, q.bind(worker))
            .await?
            .iter()
            .map(|r| (r.text("id"), r.text("cancel_requested")))
            .collect())
    }

    async fn wake_waiting(&self, now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                "UPDATE ll_runs SET status = {Queued}, dispatched_at = NULL, wait_until = NULL
                 WHERE status = {WaitingApproval} AND wait_until <= $1 RETURNING id"
            ),
            "resuming runs whose wait is over",
        );
        Ok(D::fetch_all(&mut *self.writer().await?, q.bind(ms(now))).await?.iter().map(|r| r.text("id")).collect())
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

    async fn run_snapshot(&self, id: &str) -> Result<Option<JobSnapshot>, StoreError> {
        let q = Stmt::new(sql!(D, "SELECT job_snapshot FROM ll_runs WHERE id = $1"), "reading a run's job snapshot");
        Ok(D::fetch_optional(&mut *self.reader().await?, q.bind(id)).await?.and_then(|r| r.json("job_snapshot")))
    }

    async fn get_run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        let q = Stmt::new(sql!(D, concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE id = $1")), "reading a run");
        Ok(D::fetch_optional(&mut *self.reader().await?, q.bind(id)).await?.as_ref().map(run_from_row))
    }

    /// Runs, newest first, with paging by cursor.
    async fn list_runs(&self, f: &RunFilter) -> Result<Vec<Run>, StoreError> {
        Ok(D::fetch_all(&mut *self.reader().await?, f.query(&D::SPELLING)).await?.iter().map(run_from_row).collect())
    }

    async fn job_overview(&self, job: &str, recent: u32) -> Result<JobOverview, StoreError> {
        Dialect::job_overview(self, job, recent).await
    }

    async fn last_runs(&self, jobs: &[&str]) -> Result<HashMap<String, RunBrief>, StoreError> {
        Dialect::last_runs(self, jobs).await
    }

    async fn queue_depth(&self) -> Result<u64, StoreError> {
        let q = Stmt::new(sql!(D, "SELECT count(*) AS n FROM ll_runs WHERE status = {Queued}"), "counting queued runs");
        Ok(D::fetch_optional(&mut *self.reader().await?, q).await?.map_or(0, |r| r.int("n")) as u64)
    }

    async fn still_running(&self, ids: &[&str]) -> Result<Vec<String>, StoreError> {
        let q =
            Stmt::new(sql!(D, "SELECT id FROM ll_runs WHERE id {in $1} AND status = {Running} ORDER BY id"), "reading runs still running");
        Ok(D::fetch_all(&mut *self.reader().await?, q.bind_list(ids.iter().copied())).await?.iter().map(|r| r.text("id")).collect())
    }

    async fn heartbeat(&self, me: &WorkerId, lease: Duration, take_over: bool, now: DateTime<Utc>) -> Result<Option<Lease>, StoreError> {
        let row = Dialect::heartbeat(self, me, lease, take_over, ms(now)).await?;
        Ok(row.map(|(epoch, server_now)| Lease { epoch, server_now: from_ms(server_now) }))
    }

    async fn release(&self, me: &WorkerId) -> Result<(), StoreError> {
        let q = Stmt::new(sql!(D, "DELETE FROM ll_workers WHERE name = $1 AND instance = $2"), "giving up the worker's lease");
        D::execute(&mut *self.writer().await?, q.bind(me.name.as_str()).bind(me.instance.as_str())).await?;
        Ok(())
    }

    async fn workers(&self, now: DateTime<Utc>) -> Result<Vec<WorkerLease>, StoreError> {
        let mut c = self.reader().await?;
        let leases = D::live_leases(&mut c, ms(now)).await?;
        let q = Stmt::new(
            sql!(D, "SELECT worker, id FROM ll_runs WHERE status = {Running} AND worker IS NOT NULL ORDER BY id"),
            "reading running runs",
        );
        let running = D::fetch_all(&mut c, q).await?;
        Ok(leases_with_runs(&leases, &running))
    }

    /// The orphans and their open steps are interrupted together, in one transaction. Where a
    /// backend serves one worker, every queued run is then handed over again (the tasks that
    /// carried them are dropped); on a shared database queue tasks are not owned by workers (a
    /// task is consumed in the transaction that claims its run), so nothing is handed over.
    async fn recover(&self, starting: Option<&str>, now: DateTime<Utc>) -> Result<Vec<Run>, StoreError> {
        let mut tx = self.begin().await?;
        let runs: Vec<Run> = D::interrupt_orphans(&mut tx, starting, ms(now)).await?.iter().map(run_from_row).collect();
        // Interrupted, or cancelled when a cancel had been asked for.
        let interrupted: Vec<(&str, RunStatus)> = runs.iter().map(|r| (r.id.as_str(), r.status)).collect();
        close_steps::<D>(&mut tx, &interrupted, now).await?;
        // A notification claimed by a worker that is gone was being sent when it stopped: it
        // goes again now, with the same key, instead of when the claim would have run out. On
        // SQLite the lock says the one before this process is gone; on PostgreSQL, a lease
        // that is no longer live.
        let gone = if D::KIND.takes_over_from_others() {
            "NOT EXISTS (SELECT 1 FROM ll_workers w WHERE w.name = ll_notifications.claimed_by {lease_live})"
        } else {
            "claimed_by <> $2"
        };
        let q = Stmt::new(
            sql!(D, format!("UPDATE ll_notifications SET status = 'pending', next_at = $1 WHERE status = 'sending' AND {gone}")),
            "releasing the notifications of workers that are gone",
        );
        let q = q.bind(ms(now));
        let q = if D::KIND.takes_over_from_others() { q } else { q.bind(starting.unwrap_or_default()) };
        D::execute(&mut tx, q).await?;
        D::commit(tx).await?;
        if !D::KIND.takes_over_from_others() {
            let mut tx = self.begin().await?;
            let q = Stmt::new(sql!(D, "UPDATE ll_runs SET dispatched_at = NULL WHERE status = {Queued}"), "re-queueing runs");
            D::execute(&mut tx, q).await?;
            D::forget_queue(&mut tx).await?;
            D::commit(tx).await?;
        }
        Ok(runs)
    }

    async fn interrupted_without_follow_up(&self) -> Result<Vec<Run>, StoreError> {
        let q = Stmt::new(
            sql!(D, concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE status = {Interrupted} AND next_run_id IS NULL")),
            "reading interrupted runs",
        );
        Ok(D::fetch_all(&mut *self.reader().await?, q).await?.iter().map(run_from_row).collect())
    }

    async fn runtime_jobs(&self) -> Result<Vec<StoredJob>, StoreError> {
        let q = Stmt::new(sql!(D, format!("SELECT {DEFINITION_COLS} FROM ll_job_definitions ORDER BY name")), "reading runtime jobs");
        Ok(D::fetch_all(&mut *self.reader().await?, q).await?.iter().map(stored_job_from_row).collect())
    }

    async fn runtime_job(&self, name: &str) -> Result<Option<StoredJob>, StoreError> {
        let q = Stmt::new(sql!(D, format!("SELECT {DEFINITION_COLS} FROM ll_job_definitions WHERE name = $1")), "reading a runtime job");
        Ok(D::fetch_optional(&mut *self.reader().await?, q.bind(name)).await?.as_ref().map(stored_job_from_row))
    }

    async fn change_job(&self, req: &ChangeRequest<'_>, now: DateTime<Utc>) -> Result<Result<Changed, Refused>, StoreError> {
        let at = ms(now);
        let mut tx = self.begin().await?;
        // "" is no job's name: it stands for the table, so that changes (and the count a create
        // checks) go one at a time across writers; the name itself orders them with its ticks.
        D::lock_jobs(&mut tx, &["", req.name]).await?;
        let q = Stmt::new(sql!(D, format!("SELECT {DEFINITION_COLS} FROM ll_job_definitions WHERE name = $1")), "reading a runtime job");
        let current = D::fetch_optional(&mut tx, q.bind(req.name)).await?.as_ref().map(stored_job_from_row);
        let q = Stmt::new(sql!(D, "SELECT coalesce(max(version), 0) AS v FROM ll_job_history WHERE job = $1"), "reading a job's history");
        let last = D::fetch_optional(&mut tx, q.bind(req.name)).await?.map_or(0, |r| r.int("v").max(0) as u64);
        // Only a create of a new name is bounded by the count: only then is it read.
        let jobs = if matches!(req.change, Change::Create { .. }) && current.is_none() {
            let q = Stmt::new(sql!(D, "SELECT count(*) AS n FROM ll_job_definitions"), "counting runtime jobs");
            D::fetch_optional(&mut tx, q).await?.map_or(0, |r| r.int("n").max(0) as u64)
        } else {
            0
        };
        let version = match decide_change(&req.change, current.as_ref(), last, jobs) {
            Ok(v) => v as i64,
            Err(refused) => {
                D::rollback(tx).await?;
                return Ok(Err(refused));
            }
        };
        let before = current.as_ref().map(|c| c.definition.to_string());
        let (after, changed) = match req.change {
            Change::Create { definition, .. } => {
                let text = definition.to_string();
                let q = Stmt::new(
                    sql!(
                        D,
                        "INSERT INTO ll_job_definitions (name, definition, version, created_by, created_at, updated_by, updated_at)
                         VALUES ($1, $2, $3, $4, $5, $4, $5)"
                    ),
                    "saving a runtime job",
                );
                D::execute(&mut tx, q.bind(req.name).bind(text.as_str()).bind(version).bind(req.actor).bind(at)).await?;
                // A new job's schedule begins at its creation, recorded with it: every worker plans
                // from there, so one that hears of the job a little late (a signal, a replan after
                // the clock moved) still fires its first tick. A name deleted and created again
                // starts afresh: no pause, no ticks of before to catch up.
                let q = Stmt::new(
                    sql!(
                        D,
                        "INSERT INTO ll_job_state (job, paused, pause_reason, paused_at, last_tick) VALUES ($1, $2, NULL, NULL, $3)
                         ON CONFLICT (job) DO UPDATE SET paused = $2, pause_reason = NULL, paused_at = NULL, last_tick = $3"
                    ),
                    "starting a job's state",
                );
                D::execute(&mut tx, q.bind(req.name).bind(false).bind(at)).await?;
                let job = StoredJob {
                    name: req.name.to_owned(),
                    definition: definition.clone(),
                    version: version as u64,
                    created_by: req.actor.to_owned(),
                    created_at: from_ms(at),
                    updated_by: req.actor.to_owned(),
                    updated_at: from_ms(at),
                };
                (Some(text), Changed::Saved(job))
            }
            Change::Update { definition, .. } => {
                let text = definition.to_string();
                let q = Stmt::new(
                    sql!(
                        D,
                        "UPDATE ll_job_definitions SET definition = $2, version = $3, updated_by = $4, updated_at = $5 WHERE name = $1"
                    ),
                    "saving a runtime job",
                );
                D::execute(&mut tx, q.bind(req.name).bind(text.as_str()).bind(version).bind(req.actor).bind(at)).await?;
                let mut job = current.clone().expect("checked above");
                job.definition = definition.clone();
                job.version = version as u64;
                job.updated_by = req.actor.to_owned();
                job.updated_at = from_ms(at);
                (Some(text), Changed::Saved(job))
            }
            Change::Delete { .. } => {
                let q = Stmt::new(sql!(D, "DELETE FROM ll_job_definitions WHERE name = $1"), "deleting a runtime job");
                D::execute(&mut tx, q.bind(req.name)).await?;
                let q = Stmt::new(sql!(D, "DELETE FROM ll_job_state WHERE job = $1"), "clearing a job's state");
                D::execute(&mut tx, q.bind(req.name)).await?;
                (None, Changed::Deleted { version: version as u64 })
            }
        };
        let q = Stmt::new(
            sql!(D, "INSERT INTO ll_job_history (job, version, action, before, after, actor, at) VALUES ($1, $2, $3, $4, $5, $6, $7)"),
            "recording a job's change",
        );
        D::execute(&mut tx, q.bind(req.name).bind(version).bind(req.change.action()).bind(before).bind(after).bind(req.actor).bind(at))
            .await?;
        D::commit(tx).await?;
        Ok(Ok(changed))
    }

    async fn job_history(&self, name: &str, limit: usize) -> Result<Vec<JobChangeRecord>, StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT version, action, before, after, actor, at FROM ll_job_history WHERE job = $1 ORDER BY version DESC LIMIT $2"),
            "reading a job's history",
        );
        let rows = D::fetch_all(&mut *self.reader().await?, q.bind(name).bind(limit.min(100_000) as i64)).await?;
        Ok(rows
            .iter()
            .map(|r| JobChangeRecord {
                version: r.int("version").max(0) as u64,
                action: r.text("action"),
                before: r.json("before"),
                after: r.json("after"),
                actor: r.text("actor"),
                at: from_ms(r.int("at")),
            })
            .collect())
    }

    async fn run_span(&self, job: &str) -> Result<(u64, Option<DateTime<Utc>>), StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT count(*) AS n, min(coalesce(scheduled_at, enqueued_at)) AS oldest FROM ll_runs WHERE job = $1"),
            "reading a job's runs",
        );
        let row = D::fetch_optional(&mut *self.reader().await?, q.bind(job)).await?;
        Ok(row.map_or((0, None), |r| (r.int("n").max(0) as u64, r.opt_int("oldest").map(from_ms))))
    }

    async fn ticks_with_runs(&self, job: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> Result<HashSet<i64>, StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT DISTINCT scheduled_at FROM ll_runs WHERE job = $1 AND scheduled_at >= $2 AND scheduled_at <= $3"),
            "reading a job's ticks",
        );
        let rows = D::fetch_all(&mut *self.reader().await?, q.bind(job).bind(ms(from)).bind(ms(to))).await?;
        let mut out: HashSet<i64> = rows.iter().filter_map(|r| r.opt_int("scheduled_at")).collect();
        // Tick keys are kept for an hour after their runs may be pruned.
        let q = Stmt::new(
            sql!(D, "SELECT scheduled_at FROM ll_ticks WHERE job = $1 AND scheduled_at >= $2 AND scheduled_at <= $3"),
            "reading a job's tick keys",
        );
        out.extend(
            D::fetch_all(&mut *self.reader().await?, q.bind(job).bind(ms(from)).bind(ms(to))).await?.iter().map(|r| r.int("scheduled_at")),
        );
        Ok(out)
    }

    async fn prune(&self, job: &str, keep: Option<u32>, max_age: Option<Duration>, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut c = self.writer().await?;
        let mut deleted = 0;
        if let Some(keep) = keep {
            let q = Stmt::new(
                sql!(
                    D,
                    format!(
                        "DELETE FROM ll_runs WHERE job = $1 AND status NOT IN {a} AND outcome_seen IS NOT NULL AND id NOT IN
                         (SELECT id FROM ll_runs WHERE job = $1 AND status NOT IN {a} ORDER BY id DESC LIMIT $2)",
                        a = *ACTIVE
                    )
                ),
                "pruning runs by count",
            );
            deleted += D::execute(&mut c, q.bind(job).bind(i64::from(keep))).await?;
        }
        if let Some(age) = max_age {
            let q = Stmt::new(
                sql!(
                    D,
                    format!(
                        "DELETE FROM ll_runs WHERE job = $1 AND status NOT IN {} AND outcome_seen IS NOT NULL AND finished_at < $2",
                        *ACTIVE
                    )
                ),
                "pruning runs by age",
            );
            deleted += D::execute(&mut c, q.bind(job).bind(ms(now) - age.as_millis() as i64)).await?;
        }
        let q = Stmt::new(sql!(D, "DELETE FROM ll_ticks WHERE job = $1 AND scheduled_at < $2"), "pruning ticks");
        D::execute(&mut c, q.bind(job).bind(ms(now) - TICK_KEYS_KEPT.as_millis() as i64)).await?;
        Ok(deleted)
    }

    async fn notice(&self, rules: RulesOf<'_>, waits: bool, now: DateTime<Utc>) -> Result<Noticed, StoreError> {
        let mut tx = self.begin().await?;
        // One pass at a time across workers: a streak moves in order.
        D::lock_jobs(&mut tx, &[NOTICE_LOCK]).await?;
        let q = Stmt::new(
            sql!(
                D,
                concat!(
                    "SELECT ",
                    run_cols!(),
                    " FROM ll_runs WHERE outcome_seen IS NULL AND finished_at IS NOT NULL ORDER BY finished_at, id LIMIT $1"
                )
            ),
            "reading ended runs to notice",
        );
        let runs: Vec<Run> = D::fetch_all(&mut tx, q.bind(NOTICE_BATCH as i64)).await?.iter().map(run_from_row).collect();
        let more = runs.len() == NOTICE_BATCH;
        let jobs: BTreeSet<&str> = runs.iter().map(|r| r.job.as_str()).collect();
        let mut streaks: HashMap<String, u32> = HashMap::new();
        let mut last_success: HashMap<String, DateTime<Utc>> = HashMap::new();
        let mut recheck_at: Option<DateTime<Utc>> = None;
        if !jobs.is_empty() {
            let q = Stmt::new(
                sql!(D, "SELECT job, consecutive_failures, last_success_at FROM ll_job_state WHERE job {in $1}"),
                "reading failure streaks",
            );
            for r in D::fetch_all(&mut tx, q.bind_list(jobs.iter().copied())).await? {
                streaks.insert(r.text("job"), r.int("consecutive_failures").clamp(0, i64::from(u32::MAX)) as u32);
                if let Some(at) = r.opt_int("last_success_at") {
                    last_success.insert(r.text("job"), from_ms(at));
                }
            }
        }
        let mut of_job: HashMap<&str, Option<Vec<lamplighter_config::NotifyRule>>> = HashMap::new();
        let mut seen: Vec<&str> = Vec::new();
        let mut states: BTreeMap<&str, (u32, Option<i64>)> = BTreeMap::new();
        let mut new: Vec<NewNotification> = Vec::new();
        for run in &runs {
            let finished = run.finished_at.unwrap_or(now);
            let kind = match finality(run.status, run.next_run_id.as_deref(), finished, last_success.get(&run.job).copied(), now) {
                Finality::Undecided => {
                    // Its retry may still be recorded: looked at again then, at the latest.
                    let at = finished + RETRY_RECORDED_WITHIN;
                    recheck_at = Some(recheck_at.map_or(at, |r| r.min(at)));
                    continue;
                }
                Finality::Retried => {
                    seen.push(run.id.as_str());
                    continue;
                }
                Finality::Outcome(kind) => kind,
            };
            seen.push(run.id.as_str());
            let Some(rules) = of_job.entry(run.job.as_str()).or_insert_with(|| rules(&run.job)) else { continue };
            let before = streaks.get(&run.job).copied().unwrap_or(0);
            let (fire, after) = notify_on_outcome(kind, before, rules);
            let shown = if kind == OutcomeKind::Failure { after } else { before };
            new.extend(fire.into_iter().map(|(i, on)| notification(run, on, None, i, &rules[i].to, shown)));
            streaks.insert(run.job.clone(), after);
            let success = (kind == OutcomeKind::Success).then(|| ms(finished));
            if kind == OutcomeKind::Success {
                last_success.insert(run.job.clone(), finished);
            }
            let state = states.entry(run.job.as_str()).or_insert((after, None));
            *state = (after, success.or(state.1));
        }
        if waits {
            new.extend(waiting_notifications::<D>(&mut tx, rules).await?);
        }
        let mut recorded = 0;
        for n in &new {
            let q = Stmt::new(
                sql!(
                    D,
                    "INSERT INTO ll_notifications (key, job, run_id, root_id, event, target, target_id, payload, status, attempts, next_at, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', 0, $9, $9) ON CONFLICT (key) DO NOTHING"
                ),
                "recording a notification",
            );
            recorded += D::execute(
                &mut tx,
                q.bind(n.key.as_str())
                    .bind(n.job.as_str())
                    .bind(n.run_id.as_str())
                    .bind(n.root_id.as_str())
                    .bind(n.event.as_str())
                    .bind(n.target.as_str())
                    .bind(n.target_id.as_str())
                    .bind(n.payload.to_string())
                    .bind(ms(now)),
            )
            .await? as usize;
        }
        for (job, (streak, success)) in &states {
            let q = Stmt::new(
                sql!(
                    D,
                    "INSERT INTO ll_job_state (job, consecutive_failures, last_success_at) VALUES ($1, $2, $3)
                     ON CONFLICT (job) DO UPDATE SET consecutive_failures = $2, last_success_at = coalesce($3, ll_job_state.last_success_at)"
                ),
                "recording a job's failure streak",
            );
            D::execute(&mut tx, q.bind(*job).bind(i64::from(*streak)).bind(*success)).await?;
        }
        if !seen.is_empty() {
            let q = Stmt::new(sql!(D, "UPDATE ll_runs SET outcome_seen = 1 WHERE id {in $1}"), "marking runs noticed");
            D::execute(&mut tx, q.bind_list(seen.iter().copied())).await?;
        }
        D::commit(tx).await?;
        let seen_ids: HashSet<&str> = seen.iter().copied().collect();
        let mut prunable: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
        for run in runs.iter().filter(|r| seen_ids.contains(r.id.as_str())) {
            let ended = run.finished_at.unwrap_or(now);
            prunable.entry(run.job.clone()).and_modify(|at| *at = (*at).min(ended)).or_insert(ended);
        }
        // A full batch with nothing in it to notice (failures waiting for their retries) is not
        // "more": the pass would only read it again.
        Ok(Noticed { runs: seen.len(), recorded, more: more && !seen.is_empty(), recheck_at, prunable })
    }

    async fn claim_notifications(&self, worker: &str, n: usize, hold: Duration, now: DateTime<Utc>) -> Result<Vec<Claimed>, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                format!(
                    "UPDATE ll_notifications SET status = 'sending', claimed_by = $1, attempts = attempts + 1, next_at = $2
                     WHERE key IN (SELECT key FROM ll_notifications n WHERE status IN ('pending', 'sending') AND next_at <= $3 AND {FIRST_IN_LINE}
                                   ORDER BY next_at LIMIT $4)
                       AND status IN ('pending', 'sending') AND next_at <= $3
                     RETURNING key, job, event, target, target_id, payload, attempts, created_at"
                )
            ),
            "claiming notifications",
        );
        let until = ms(now) + hold.as_millis() as i64;
        let rows = D::fetch_all(&mut *self.writer().await?, q.bind(worker).bind(until).bind(ms(now)).bind(n as i64)).await?;
        Ok(rows
            .iter()
            .map(|r| Claimed {
                key: r.text("key"),
                job: r.text("job"),
                event: r.text("event"),
                target: r.text("target"),
                target_id: r.text("target_id"),
                payload: r.json("payload").unwrap_or(serde_json::Value::Null),
                attempts: r.int("attempts").clamp(0, i64::from(u32::MAX)) as u32,
                created_at: from_ms(r.int("created_at")),
            })
            .collect())
    }

    async fn notification_sent(&self, key: &str, worker: &str, sent: &Sent, now: DateTime<Utc>) -> Result<(), StoreError> {
        let q = match sent {
            Sent::Delivered(what) => Stmt::new(
                sql!(
                    D,
                    "UPDATE ll_notifications SET status = 'delivered', delivered = $3, sent_at = $4, last_error = NULL
                     WHERE key = $1 AND claimed_by = $2 AND status = 'sending'"
                ),
                "recording a notification sent",
            )
            .bind(key)
            .bind(worker)
            .bind(what.as_str())
            .bind(ms(now)),
            Sent::Failed { error, retry_at } => Stmt::new(
                sql!(
                    D,
                    "UPDATE ll_notifications SET status = $3, last_error = $4, next_at = $5
                     WHERE key = $1 AND claimed_by = $2 AND status = 'sending'"
                ),
                "recording a notification that was not taken",
            )
            .bind(key)
            .bind(worker)
            .bind(if retry_at.is_some() { NotificationStatus::Pending } else { NotificationStatus::Abandoned }.as_str())
            .bind(error.as_str())
            .bind(ms(retry_at.unwrap_or(now))),
        };
        D::execute(&mut *self.writer().await?, q).await?;
        Ok(())
    }

    async fn release_claims(&self, worker: &str, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let q = Stmt::new(
            sql!(D, "UPDATE ll_notifications SET status = 'pending', next_at = $2 WHERE status = 'sending' AND claimed_by = $1"),
            "handing back notifications left mid-send",
        );
        D::execute(&mut *self.writer().await?, q.bind(worker).bind(ms(now))).await
    }

    async fn next_notification(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                format!("SELECT min(next_at) AS at FROM ll_notifications n WHERE status IN ('pending', 'sending') AND {FIRST_IN_LINE}")
            ),
            "reading when the next notification is due",
        );
        Ok(D::fetch_optional(&mut *self.reader().await?, q).await?.and_then(|r| r.opt_int("at")).map(from_ms))
    }

    async fn notifications(&self, root_id: &str) -> Result<Vec<Notification>, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                "SELECT key, event, target, status, attempts, run_id, created_at, next_at, sent_at, delivered, last_error
                 FROM ll_notifications WHERE root_id = $1 ORDER BY created_at, key"
            ),
            "reading a run's notifications",
        );
        let rows = D::fetch_all(&mut *self.reader().await?, q.bind(root_id)).await?;
        Ok(rows
            .iter()
            .map(|r| {
                let status: NotificationStatus = r.str("status").parse().unwrap_or(NotificationStatus::Pending);
                let waiting = matches!(status, NotificationStatus::Pending | NotificationStatus::Sending);
                Notification {
                    key: r.text("key"),
                    event: r.text("event"),
                    target: r.text("target"),
                    status,
                    attempts: r.int("attempts").clamp(0, i64::from(u32::MAX)) as u32,
                    run_id: r.text("run_id"),
                    created_at: from_ms(r.int("created_at")),
                    next_at: waiting.then(|| from_ms(r.int("next_at"))),
                    sent_at: r.opt_int("sent_at").map(from_ms),
                    delivered: r.opt_text("delivered"),
                    error: r.opt_text("last_error"),
                }
            })
            .collect())
    }

    async fn job_health(&self) -> Result<HashMap<String, JobHealth>, StoreError> {
        let mut c = self.reader().await?;
        let q = Stmt::new(
            sql!(D, "SELECT job, paused, consecutive_failures, last_success_at, last_tick FROM ll_job_state"),
            "reading the jobs' health",
        );
        let mut out: HashMap<String, JobHealth> = D::fetch_all(&mut c, q)
            .await?
            .iter()
            .map(|r| {
                let health = JobHealth {
                    paused: r.flag("paused"),
                    consecutive_failures: r.int("consecutive_failures").clamp(0, i64::from(u32::MAX)) as u32,
                    last_success: r.opt_int("last_success_at").map(from_ms),
                    last_tick: r.opt_int("last_tick").map(from_ms),
                    oldest_running: None,
                    oldest_wait: None,
                };
                (r.text("job"), health)
            })
            .collect();
        let q = Stmt::new(
            sql!(D, "SELECT job, min(started_at) AS oldest FROM ll_runs WHERE status = {Running} GROUP BY job"),
            "reading the oldest running runs",
        );
        for r in D::fetch_all(&mut c, q).await? {
            out.entry(r.text("job")).or_default().oldest_running = r.opt_int("oldest").map(from_ms);
        }
        let q = Stmt::new(
            sql!(
                D,
                "SELECT r.job AS job, min(s.started_at) AS since FROM ll_steps s JOIN ll_runs r ON r.id = s.run_id
                 WHERE s.status = {step:WaitingApproval} AND r.status = {WaitingApproval} GROUP BY r.job"
            ),
            "reading the oldest waits for a decision",
        );
        for r in D::fetch_all(&mut c, q).await? {
            out.entry(r.text("job")).or_default().oldest_wait = r.opt_int("since").map(from_ms);
        }
        Ok(out)
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
            let text = values(
                &D::SPELLING,
                "ll_run_output (run_id, seq, stream, at, text)",
                5,
                chunk.len(),
                " ON CONFLICT (run_id, seq) DO NOTHING",
            );
            let mut q = Stmt::built(text, "recording output");
            for l in chunk {
                q = q.bind(run_id).bind(l.seq as i64).bind(l.stream.as_str()).bind(ms(l.at)).bind(l.text.as_str());
            }
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

    async fn housekeeping(&self) -> Result<(), StoreError> {
        // The output of runs that are gone (pruned).
        let q = Stmt::new(
            sql!(D, "DELETE FROM ll_run_output WHERE NOT EXISTS (SELECT 1 FROM ll_runs WHERE ll_runs.id = ll_run_output.run_id)"),
            "pruning output",
        );
        D::execute(&mut *self.writer().await?, q).await?;
        // Notifications about runs that are gone (pruned), once they are done with.
        let q = Stmt::new(
            sql!(
                D,
                "DELETE FROM ll_notifications WHERE status IN ('delivered', 'abandoned')
                 AND NOT EXISTS (SELECT 1 FROM ll_runs WHERE ll_runs.id = ll_notifications.root_id)"
            ),
            "pruning notifications",
        );
        D::execute(&mut *self.writer().await?, q).await?;
        Dialect::housekeeping(self).await
    }
}

/// The notifications of runs waiting for a decision: one per wait and rule, recorded once
/// (the wait's key), read each pass (waiting runs are few).
async fn waiting_notifications<D: Dialect>(c: &mut D::Conn, rules: RulesOf<'_>) -> Result<Vec<NewNotification>, StoreError> {
    let q = Stmt::new(
        sql!(D, "SELECT run_id, step FROM ll_steps WHERE status = {step:WaitingApproval}"),
        "reading the steps waiting for a decision",
    );
    let waits: Vec<(String, String)> = D::fetch_all(c, q).await?.iter().map(|r| (r.text("run_id"), r.text("step"))).collect();
    if waits.is_empty() {
        return Ok(Vec::new());
    }
    let q = Stmt::new(
        sql!(D, concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE id {in $1} AND status = {WaitingApproval}")),
        "reading the runs that wait",
    );
    let runs: HashMap<String, Run> = D::fetch_all(c, q.bind_list(waits.iter().map(|(id, _)| id.as_str())))
        .await?
        .iter()
        .map(|r| (r.text("id"), run_from_row(r)))
        .collect();
    let mut out = Vec::new();
    let mut of_job: HashMap<String, Option<Vec<lamplighter_config::NotifyRule>>> = HashMap::new();
    for (id, step) in &waits {
        let Some(run) = runs.get(id) else { continue };
        let Some(rules) = of_job.entry(run.job.clone()).or_insert_with(|| rules(&run.job)) else { continue };
        for (i, on) in notify_on_wait(step, rules) {
            out.push(notification(run, on, Some(step), i, &rules[i].to, 0));
        }
    }
    Ok(out)
}

/// The notification rule `rule` (to `to`) records for `run`'s event.
fn notification(
    run: &Run,
    on: lamplighter_config::NotifyOn,
    step: Option<&str>,
    rule: usize,
    to: &lamplighter_config::NotifyTarget,
    streak: u32,
) -> NewNotification {
    let key = notify::key(&run.root_id, on, step, rule);
    NewNotification {
        payload: notify::payload(on, &key, run, streak, step),
        key,
        job: run.job.clone(),
        run_id: run.id.clone(),
        root_id: run.root_id.clone(),
        event: on,
        target: to.describe(),
        target_id: notify::target_id(to),
    }
}
