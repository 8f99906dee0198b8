//! The PostgreSQL backend: Lamplighter's tables (`migrations/postgres`) and apalis-postgres's
//! queue (schema `apalis`) in one database, shared by any number of workers.
//!
//! The same model and the same statements as [`super::sqlite`], with what sharing adds:
//! - **No writer to queue behind**: concurrent writers meet at row locks. Statements that take
//!   many rows take them in one order (ticks by job and instant, job state by job), or skip
//!   rows another transaction holds where someone else taking them is fine
//!   (`FOR UPDATE SKIP LOCKED`: queue tasks, runs handed over by a scheduler pass).
//! - **Ticks of one job are decided one transaction at a time** (a transaction-scoped advisory
//!   lock per job), so two workers firing different ticks of a job both see each other's run
//!   when they apply the overlap policy.
//! - **A decision locks its run**, so of two concurrent decisions the second finds it decided.
//! - **Leases on the server's clock** (`ll_workers`): recovery interrupts only the runs of
//!   workers whose lease ran out, never a live worker's.

mod queue;
mod signals;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use tokio_util::sync::CancellationToken;

use lamplighter_config::Overlap;

use super::{ACTIVE, Backend, OpenError, StorageKind, sql, status_list};
use super::{
    Claim, DUE_BATCH, Decide, Decided, Dispatch, Handed, JobOverview, JobState, NewRun, RunBrief, RunEnd, RunFilter, RunStore, StoreError,
    TICK_KEYS_KEPT, Taken, TickOutcome, TickPlan, WorkerId, WorkerLease, brief, from_ms, ms, new_id, plan_ticks,
};
use crate::run::{CallKind, CallRecord, Run, RunStatus, StepRecord, StepStatus, Trigger};
use crate::snapshot::JobSnapshot;

super::row_readers!(PgRow);
super::lease_readers!(PgRow);

trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, StoreError>;
}

impl<T> Ctx<T> for Result<T, sqlx::Error> {
    fn ctx(self, what: &str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::new(what, source))
    }
}

/// The server's clock, in Unix milliseconds (leases are measured on it).
const DB_NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// How long a call waits for a connection before it fails (the server is down or every
/// connection is busy); readiness answers within it.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The namespace of Lamplighter's advisory locks (the first key of the two-key form).
const TICK_LOCKS: i32 = 0x4c4c_5449; // "LLTI"

#[derive(Debug)]
pub(crate) struct PgStore {
    pool: PgPool,
}

/// Closes the steps still open of runs that ended without succeeding: `interrupted` when the
/// run was, otherwise `cancelled`.
async fn close_steps(conn: &mut sqlx::PgConnection, ends: &[(&str, RunStatus)], now: DateTime<Utc>) -> Result<(), StoreError> {
    let (ids, statuses): (Vec<&str>, Vec<&str>) = ends
        .iter()
        .filter(|(_, s)| s.is_final() && *s != RunStatus::Succeeded)
        .map(|(id, s)| (*id, if *s == RunStatus::Interrupted { StepStatus::Interrupted } else { StepStatus::Cancelled }.as_str()))
        .unzip();
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(sql!(
        "UPDATE ll_steps SET status = j.status, finished_at = $3
             FROM unnest($1::text[], $2::text[]) AS j(id, status)
             WHERE ll_steps.run_id = j.id AND ll_steps.status IN ({step:Running}, {step:WaitingApproval})"
    ))
    .bind(ids)
    .bind(statuses)
    .bind(ms(now))
    .execute(conn)
    .await
    .ctx("closing the steps of ended runs")?;
    Ok(())
}

/// The PostgreSQL backend for worker `me`: the store, migrated, and signals shared with the
/// other workers through `LISTEN`/`NOTIFY` (listening before this returns, until `stop`).
pub(super) async fn backend(
    url: &str,
    pool_size: u32,
    statement_timeout: Duration,
    me: &str,
    stop: &CancellationToken,
) -> Result<Backend, OpenError> {
    let store = PgStore::connect(url, pool_size, statement_timeout).await?;
    store.migrate().await?;
    let signals = signals::PgSignals::start(store.pool.clone(), me.to_owned(), stop.clone())
        .await
        .map_err(|e| StoreError::new("listening for other workers", e))?;
    Ok(Backend { store: Arc::new(store), signals, lock: None, kind: StorageKind::Postgres })
}

impl PgStore {
    /// Connects with a pool of `pool_size` connections; every statement runs under
    /// `statement_timeout`. Connections are made lazily: a server that is down makes calls
    /// fail (and readiness false) until it is back, without failing here.
    pub(crate) async fn connect(url: &str, pool_size: u32, statement_timeout: Duration) -> Result<Self, StoreError> {
        let opts = PgConnectOptions::from_str(url)
            .ctx("reading the connection string")?
            .application_name("lamplighter")
            .options([("statement_timeout", format!("{}ms", statement_timeout.as_millis()))]);
        let pool = PgPoolOptions::new()
            .max_connections(pool_size)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(opts)
            .await
            .ctx("connecting to the database")?;
        Ok(Self { pool })
    }
}

#[async_trait]
impl RunStore for PgStore {
    async fn ping(&self) -> bool {
        tokio::time::timeout(Duration::from_secs(2), sqlx::query("SELECT 1").execute(&self.pool)).await.is_ok_and(|r| r.is_ok())
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    /// apalis's migrations (their own history table, `apalis._sqlx_migrations`), then ours
    /// (`public._sqlx_migrations`). sqlx holds an advisory lock while it migrates, so workers
    /// starting together apply each migration once.
    async fn migrate(&self) -> Result<(), StoreError> {
        apalis_postgres::PostgresStorage::<()>::setup(&self.pool).await.map_err(|e| {
            StoreError::new(
                "applying queue migrations",
                match e {
                    apalis_postgres::Error::Database(e) => e,
                    other => sqlx::Error::Protocol(other.to_string()),
                },
            )
        })?;
        let mut ours = sqlx::migrate!("../migrations/postgres");
        ours.set_ignore_missing(true);
        ours.run(&self.pool).await.map_err(|e| StoreError::new("applying lamplighter migrations", e.into()))?;
        Ok(())
    }

    async fn job_states(&self) -> Result<HashMap<String, JobState>, StoreError> {
        let rows = sqlx::query("SELECT job, paused, pause_reason, paused_at, last_tick FROM ll_job_state")
            .fetch_all(&self.pool)
            .await
            .ctx("reading job state")?;
        Ok(rows.iter().map(|r| (r.get("job"), job_state_from_row(r))).collect())
    }

    async fn job_state(&self, job: &str) -> Result<JobState, StoreError> {
        let row = sqlx::query("SELECT job, paused, pause_reason, paused_at, last_tick FROM ll_job_state WHERE job = $1")
            .bind(job)
            .fetch_optional(&self.pool)
            .await
            .ctx("reading job state")?;
        Ok(row.as_ref().map(job_state_from_row).unwrap_or_default())
    }

    async fn set_paused(&self, job: &str, paused: bool, reason: Option<&str>, now: DateTime<Utc>) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO ll_job_state (job, paused, pause_reason, paused_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (job) DO UPDATE SET paused = $2, pause_reason = $3, paused_at = $4",
        )
        .bind(job)
        .bind(paused)
        .bind(reason)
        .bind(paused.then(|| ms(now)))
        .execute(&self.pool)
        .await
        .ctx("saving pause state")?;
        Ok(())
    }

    async fn set_last_tick(&self, job: &str, tick: DateTime<Utc>) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO ll_job_state (job, last_tick) VALUES ($1, $2)
             ON CONFLICT (job) DO UPDATE SET last_tick = greatest(coalesce(ll_job_state.last_tick, 0), $2)",
        )
        .bind(job)
        .bind(ms(tick))
        .execute(&self.pool)
        .await
        .ctx("saving the last tick")?;
        Ok(())
    }

    async fn fire_ticks(
        &self,
        ticks: Vec<(NewRun, Overlap)>,
        claim: Claim<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<Option<TickOutcome>>, StoreError> {
        let mut tx = self.pool.begin().await.ctx("starting a tick")?;
        let ids: Vec<String> = ticks.iter().map(|_| new_id()).collect();
        // The tick keys, in (job, instant) order so that workers firing the same ticks lock
        // them in the same order; a key another worker holds makes this one wait for its
        // commit, then find it taken.
        let mut keys: Vec<(&str, i64, &str)> =
            ticks.iter().zip(&ids).map(|((r, _), id)| (r.job.as_str(), ms(r.scheduled_at.unwrap_or(r.due_at)), id.as_str())).collect();
        keys.sort_unstable();
        let fresh: std::collections::HashSet<String> = sqlx::query_scalar(
            "INSERT INTO ll_ticks (job, scheduled_at, run_id)
             SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[]) ON CONFLICT DO NOTHING RETURNING run_id",
        )
        .bind(keys.iter().map(|k| k.0).collect::<Vec<_>>())
        .bind(keys.iter().map(|k| k.1).collect::<Vec<_>>())
        .bind(keys.iter().map(|k| k.2).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await
        .ctx("recording ticks")?
        .into_iter()
        .collect();
        let jobs: Vec<&str> = ticks
            .iter()
            .zip(&ids)
            .filter(|(_, id)| fresh.contains(*id))
            .map(|((r, _), _)| r.job.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        // One tick decision per job at a time across workers (in job order: no deadlock).
        sqlx::query("SELECT count(pg_advisory_xact_lock($2, hashtext(j))) FROM (SELECT j FROM unnest($1::text[]) j ORDER BY j) s")
            .bind(&jobs)
            .bind(TICK_LOCKS)
            .execute(&mut *tx)
            .await
            .ctx("locking jobs for their ticks")?;
        let paused: std::collections::HashSet<String> = sqlx::query_scalar("SELECT job FROM ll_job_state WHERE paused AND job = ANY($1)")
            .bind(&jobs)
            .fetch_all(&mut *tx)
            .await
            .ctx("reading pause state")?
            .into_iter()
            .collect();
        let sql = format!("SELECT job, id FROM ll_runs WHERE job = ANY($1) AND status IN {} ORDER BY enqueued_at, id", *ACTIVE);
        let mut active: HashMap<String, Vec<String>> = HashMap::new();
        for row in sqlx::query(sqlx::AssertSqlSafe(sql)).bind(&jobs).fetch_all(&mut *tx).await.ctx("reading active runs")? {
            active.entry(row.get("job")).or_default().push(row.get("id"));
        }
        let TickPlan { out, rows, pushed, last_ticks } = plan_ticks(ticks, ids, &fresh, &paused, active, claim, now);
        insert_rows(&mut tx, &rows, now).await?;
        if !last_ticks.is_empty() {
            // In job order (a BTreeMap), as the advisory locks.
            sqlx::query(
                "INSERT INTO ll_job_state (job, last_tick) SELECT * FROM unnest($1::text[], $2::bigint[])
                 ON CONFLICT (job) DO UPDATE SET last_tick = greatest(coalesce(ll_job_state.last_tick, 0), excluded.last_tick)",
            )
            .bind(last_ticks.keys().collect::<Vec<_>>())
            .bind(last_ticks.values().copied().collect::<Vec<_>>())
            .execute(&mut *tx)
            .await
            .ctx("saving the last ticks")?;
        }
        queue::push(&mut tx, &pushed).await?;
        tx.commit().await.ctx("committing ticks")?;
        Ok(out)
    }

    async fn insert_run(&self, run: NewRun, now: DateTime<Utc>) -> Result<(String, bool), StoreError> {
        let mut tx = self.pool.begin().await.ctx("starting an insert")?;
        if let Some(key) = &run.idempotency_key {
            // Two callers with the same new key: the unique (job, key) makes the second wait
            // for the first and then find its run.
            let existing: Option<String> = sqlx::query_scalar("SELECT id FROM ll_runs WHERE job = $1 AND idempotency_key = $2")
                .bind(&run.job)
                .bind(key)
                .fetch_optional(&mut *tx)
                .await
                .ctx("looking up an idempotency key")?;
            if let Some(id) = existing {
                return Ok((id, false));
            }
        }
        let id = new_id();
        let key = run.idempotency_key.clone();
        let job = run.job.clone();
        match insert_rows(&mut tx, &[(id.clone(), run, Dispatch::No)], now).await {
            Ok(()) => {}
            Err(e) if key.is_some() && e.is_unique_violation() => {
                drop(tx);
                let existing: String = sqlx::query_scalar("SELECT id FROM ll_runs WHERE job = $1 AND idempotency_key = $2")
                    .bind(&job)
                    .bind(key)
                    .fetch_one(&self.pool)
                    .await
                    .ctx("looking up an idempotency key")?;
                return Ok((existing, false));
            }
            Err(e) => return Err(e),
        }
        tx.commit().await.ctx("committing a run")?;
        Ok((id, true))
    }

    async fn follow_up(&self, run: &Run, due_at: DateTime<Utc>, now: DateTime<Utc>) -> Result<Option<String>, StoreError> {
        let mut tx = self.pool.begin().await.ctx("starting a follow-up")?;
        let id = new_id();
        // Claims the link first: a run is followed up at most once, whichever worker asks.
        let snapshot: Option<Option<String>> =
            sqlx::query_scalar("UPDATE ll_runs SET next_run_id = $1 WHERE id = $2 AND next_run_id IS NULL RETURNING job_snapshot")
                .bind(&id)
                .bind(&run.id)
                .fetch_optional(&mut *tx)
                .await
                .ctx("linking a follow-up")?;
        let Some(snapshot) = snapshot else { return Ok(None) };
        let mut next = NewRun::follow_up(run, due_at);
        next.snapshot = snapshot.and_then(|s| serde_json::from_str(&s).ok());
        insert_rows(&mut tx, &[(id.clone(), next, Dispatch::No)], now).await?;
        tx.commit().await.ctx("committing a follow-up")?;
        Ok(Some(id))
    }

    async fn mark_no_follow_up(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE ll_runs SET next_run_id = '' WHERE id = $1 AND next_run_id IS NULL")
            .bind(id)
            .execute(&self.pool)
            .await
            .ctx("closing an interrupted run")?;
        Ok(())
    }

    async fn due_undispatched(&self, now: DateTime<Utc>) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query(sql!(
            "SELECT id, job FROM ll_runs WHERE status = {Queued} AND dispatched_at IS NULL AND due_at <= $1
                 ORDER BY due_at, enqueued_at LIMIT $2"
        ))
        .bind(ms(now))
        .bind(DUE_BATCH as i64)
        .fetch_all(&self.pool)
        .await
        .ctx("reading due runs")?;
        Ok(rows.iter().map(|r| (r.get("id"), r.get("job"))).collect())
    }

    async fn next_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let v: Option<i64> = sqlx::query_scalar(sql!(
            "SELECT least((SELECT min(due_at) FROM ll_runs WHERE status = {Queued} AND dispatched_at IS NULL),
                              (SELECT min(wait_until) FROM ll_runs WHERE status = {WaitingApproval}))"
        ))
        .fetch_one(&self.pool)
        .await
        .ctx("reading the next due run")?;
        Ok(v.map(from_ms))
    }

    async fn has_dispatched_active(&self, job: &str) -> Result<bool, StoreError> {
        sqlx::query_scalar(sql!(&format!(
            "SELECT EXISTS (SELECT 1 FROM ll_runs WHERE job = $1 AND status IN {} AND (status != {{Queued}} OR dispatched_at IS NOT NULL))",
            *ACTIVE
        )))
        .bind(job)
        .fetch_one(&self.pool)
        .await
        .ctx("reading active runs")
    }

    /// Several schedulers may hand the same due runs over at once: rows another one holds are
    /// skipped (it is handing them over), the rest taken.
    async fn dispatch(&self, handed: &[String], queued: &[String], worker: &str, now: DateTime<Utc>) -> Result<Vec<Handed>, StoreError> {
        let mut tx = self.pool.begin().await.ctx("starting a dispatch")?;
        let claimed = if handed.is_empty() { Vec::new() } else { claim(&mut tx, handed, worker, now, Locked::Skip).await? };
        let to_push: Vec<String> = if queued.is_empty() {
            Vec::new()
        } else {
            sqlx::query_scalar(sql!(
                "WITH picked AS MATERIALIZED (
                         SELECT id FROM ll_runs WHERE id = ANY($1) AND status = {Queued} AND dispatched_at IS NULL
                         ORDER BY id FOR UPDATE SKIP LOCKED)
                     UPDATE ll_runs SET dispatched_at = $2 FROM picked WHERE ll_runs.id = picked.id RETURNING ll_runs.id"
            ))
            .bind(queued)
            .bind(ms(now))
            .fetch_all(&mut *tx)
            .await
            .ctx("marking runs dispatched")?
        };
        queue::push(&mut tx, &to_push).await?;
        tx.commit().await.ctx("committing a dispatch")?;
        Ok(claimed)
    }

    /// The tasks taken are this transaction's alone (skip locked), so their runs are locked by
    /// nobody else but a concurrent cancel: the claim waits for it and then leaves the run out.
    async fn claim_queued(&self, n: usize, worker: &str, now: DateTime<Utc>) -> Result<Taken, StoreError> {
        let mut tx = self.pool.begin().await.ctx("starting a claim")?;
        let (tasks, ids) = queue::take(&mut tx, n).await?;
        let runs = if ids.is_empty() { Vec::new() } else { claim(&mut tx, &ids, worker, now, Locked::Wait).await? };
        tx.commit().await.ctx("committing a claim")?;
        Ok(Taken { tasks, runs })
    }

    async fn finish_many(&self, ends: &[RunEnd<'_>], now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        debug_assert!(ends.iter().all(|e| RunStatus::Running.can_become(e.status)));
        let steps_to_close = ends.iter().any(|e| e.status.is_final() && e.status != RunStatus::Succeeded);
        let mut tx = self.pool.begin().await.ctx("starting to finish runs")?;
        let done: Vec<String> = sqlx::query_scalar(sql!(
            "UPDATE ll_runs SET status = j.status, output = j.output, error = j.error,
                                    finished_at = CASE WHEN j.finished THEN $8 END, wait_until = j.wait_until,
                                    started_at = coalesce(j.started_at, ll_runs.started_at),
                                    trace_id = coalesce(j.trace_id, ll_runs.trace_id)
                 FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bool[], $7::bigint[], $9::text[])
                      AS j(id, started_at, status, output, error, finished, wait_until, trace_id)
                 WHERE ll_runs.id = j.id AND ll_runs.status = {Running} RETURNING ll_runs.id"
        ))
        .bind(ends.iter().map(|e| e.id).collect::<Vec<_>>())
        .bind(ends.iter().map(|e| e.started_at.map(ms)).collect::<Vec<_>>())
        .bind(ends.iter().map(|e| e.status.as_str()).collect::<Vec<_>>())
        .bind(ends.iter().map(|e| e.output.map(|o| o.to_string())).collect::<Vec<_>>())
        .bind(ends.iter().map(|e| e.error).collect::<Vec<_>>())
        .bind(ends.iter().map(|e| e.status.is_final()).collect::<Vec<_>>())
        .bind(ends.iter().map(|e| e.wait_until.map(ms)).collect::<Vec<_>>())
        .bind(ms(now))
        .bind(ends.iter().map(|e| e.trace_id).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await
        .ctx("finishing runs")?;
        if steps_to_close {
            let ended: Vec<(&str, RunStatus)> = ends.iter().map(|e| (e.id, e.status)).collect();
            close_steps(&mut tx, &ended, now).await?;
        }
        tx.commit().await.ctx("committing the end of runs")?;
        Ok(done)
    }

    async fn finish(
        &self,
        id: &str,
        status: RunStatus,
        output: Option<&serde_json::Value>,
        error: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let sql = format!(
            "UPDATE ll_runs SET status = $2, output = $3, error = $4, finished_at = $5 WHERE id = $1 AND status IN {}",
            status_list(RunStatus::sources(status))
        );
        let mut tx = self.pool.begin().await.ctx("starting to finish a run")?;
        let n = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(status.as_str())
            .bind(output.map(|o| o.to_string()))
            .bind(error)
            .bind(ms(now))
            .execute(&mut *tx)
            .await
            .ctx("finishing a run")?
            .rows_affected();
        if n == 1 {
            close_steps(&mut tx, &[(id, status)], now).await?;
        }
        tx.commit().await.ctx("committing the end of a run")?;
        Ok(n == 1)
    }

    async fn checkpoint(&self, root_id: &str, step: &str) -> Result<Option<serde_json::Value>, StoreError> {
        let v: Option<String> = sqlx::query_scalar("SELECT value FROM ll_checkpoints WHERE root_id = $1 AND step = $2")
            .bind(root_id)
            .bind(step)
            .fetch_optional(&self.pool)
            .await
            .ctx("reading a checkpoint")?;
        Ok(v.and_then(|s| serde_json::from_str(&s).ok()))
    }

    async fn record_checkpoint(
        &self,
        root_id: &str,
        step: &str,
        run_id: &str,
        value: &serde_json::Value,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO ll_checkpoints (root_id, step, run_id, value, recorded_at) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (root_id, step) DO UPDATE SET run_id = $3, value = $4, recorded_at = $5",
        )
        .bind(root_id)
        .bind(step)
        .bind(run_id)
        .bind(value.to_string())
        .bind(ms(now))
        .execute(&self.pool)
        .await
        .ctx("recording a checkpoint")?;
        Ok(())
    }

    async fn steps(&self, root_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM ll_steps WHERE root_id = $1 ORDER BY coalesce(started_at, finished_at), step")
            .bind(root_id)
            .fetch_all(&self.pool)
            .await
            .ctx("reading workflow steps")?;
        Ok(rows.iter().map(step_from_row).collect())
    }

    async fn record_steps(&self, root_id: &str, steps: &[StepRecord]) -> Result<(), StoreError> {
        if steps.is_empty() {
            return Ok(());
        }
        let mut q = sqlx::QueryBuilder::<sqlx::Postgres>::new(
            "INSERT INTO ll_steps (root_id, step, status, run_id, attempt, started_at, finished_at, output, error, resumes_on_reject) ",
        );
        q.push_values(steps, |mut b, st| {
            b.push_bind(root_id)
                .push_bind(st.step.as_str())
                .push_bind(st.status.as_str())
                .push_bind(st.run_id.as_str())
                .push_bind(i64::from(st.attempt))
                .push_bind(st.started_at.map(ms))
                .push_bind(st.finished_at.map(ms))
                .push_bind(st.output.as_ref().map(|v| v.to_string()))
                .push_bind(st.error.as_deref())
                .push_bind(st.resumes_on_reject);
        });
        q.push(
            " ON CONFLICT (root_id, step) DO UPDATE SET status = excluded.status, run_id = excluded.run_id, attempt = excluded.attempt,
              started_at = excluded.started_at, finished_at = excluded.finished_at, output = excluded.output, error = excluded.error,
              resumes_on_reject = excluded.resumes_on_reject
             WHERE ll_steps.attempt <= excluded.attempt",
        );
        q.build().execute(&self.pool).await.ctx("recording workflow steps")?;
        Ok(())
    }

    async fn decide(&self, d: &Decide<'_>, now: DateTime<Utc>) -> Result<Decided, StoreError> {
        let waiting = RunStatus::WaitingApproval.as_str();
        let step_waiting = StepStatus::WaitingApproval.as_str();
        let mut tx = self.pool.begin().await.ctx("starting a decision")?;
        // The run's lock orders decisions on it: the second reads what the first did.
        let run: Option<(String, String)> = sqlx::query_as("SELECT status, coalesce(root_id, id) FROM ll_runs WHERE id = $1 FOR UPDATE")
            .bind(d.run_id)
            .fetch_optional(&mut *tx)
            .await
            .ctx("reading the run to decide on")?;
        // An answer that records nothing ends the transaction at once: a dropped one would
        // keep the run locked until its connection is next used.
        let Some((status, root)) = run else {
            tx.rollback().await.ctx("ending a decision")?;
            return Ok(Decided::NoSuchRun);
        };
        let status = RunStatus::from_str(&status).unwrap_or(RunStatus::Failed);
        if status != RunStatus::WaitingApproval {
            tx.rollback().await.ctx("ending a decision")?;
            return Ok(Decided::NotWaiting(status));
        }
        let open_rows: Vec<(String, bool)> =
            sqlx::query_as("SELECT step, resumes_on_reject FROM ll_steps WHERE run_id = $1 AND status = $2 ORDER BY step")
                .bind(d.run_id)
                .bind(step_waiting)
                .fetch_all(&mut *tx)
                .await
                .ctx("reading the steps waiting for a decision")?;
        let open: Vec<String> = open_rows.iter().map(|(s, _)| s.clone()).collect();
        let step = match (d.step, open.as_slice()) {
            (Some(s), _) if open.iter().any(|o| o == s) => s.to_string(),
            (None, [only]) => only.clone(),
            (Some(_), _) => {
                tx.rollback().await.ctx("ending a decision")?;
                return Ok(Decided::NotWaitingStep { waiting: open });
            }
            (None, _) => {
                tx.rollback().await.ctx("ending a decision")?;
                return Ok(Decided::WhichStep { waiting: open });
            }
        };
        let (output, error) = super::decision_record(d, now);
        let new_status = if d.approve { StepStatus::Succeeded } else { StepStatus::Failed };
        let row = sqlx::query(
            "UPDATE ll_steps SET status = $3, output = $4, error = $5, finished_at = $6
             WHERE root_id = $1 AND step = $2 AND status = $7 RETURNING *",
        )
        .bind(&root)
        .bind(&step)
        .bind(new_status.as_str())
        .bind(output.to_string())
        .bind(error.as_deref())
        .bind(ms(now))
        .bind(step_waiting)
        .fetch_one(&mut *tx)
        .await
        .ctx("recording a decision")?;
        let record = step_from_row(&row);
        let resumes_on_reject = open_rows.iter().any(|(s, resumes)| *s == step && *resumes);
        let run_status = if d.approve || resumes_on_reject {
            if open.len() > 1 {
                RunStatus::WaitingApproval
            } else {
                sqlx::query(sql!(
                    "UPDATE ll_runs SET status = {Queued}, dispatched_at = NULL, wait_until = NULL WHERE id = $1 AND status = $2"
                ))
                .bind(d.run_id)
                .bind(waiting)
                .execute(&mut *tx)
                .await
                .ctx("resuming an approved run")?;
                RunStatus::Queued
            }
        } else {
            let why = format!("step \"{step}\" was {}", error.as_deref().unwrap_or("rejected"));
            sqlx::query(sql!(
                "UPDATE ll_runs SET status = {Failed}, error = $2, finished_at = $3, wait_until = NULL WHERE id = $1 AND status = $4"
            ))
            .bind(d.run_id)
            .bind(why)
            .bind(ms(now))
            .bind(waiting)
            .execute(&mut *tx)
            .await
            .ctx("failing a rejected run")?;
            close_steps(&mut tx, &[(d.run_id, RunStatus::Failed)], now).await?;
            RunStatus::Failed
        };
        tx.commit().await.ctx("committing a decision")?;
        Ok(Decided::Recorded { step: record, run: run_status })
    }

    async fn wake_waiting(&self, now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar(sql!("UPDATE ll_runs SET status = {Queued}, dispatched_at = NULL, wait_until = NULL WHERE status = {WaitingApproval} AND wait_until <= $1 RETURNING id"))
        .bind(ms(now))
        .fetch_all(&self.pool)
        .await
        .ctx("resuming runs whose wait is over")
    }

    async fn calls(&self, root_id: &str) -> Result<Vec<CallRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM ll_agent_calls WHERE root_id = $1 ORDER BY conversation, seq")
            .bind(root_id)
            .fetch_all(&self.pool)
            .await
            .ctx("reading agent calls")?;
        Ok(rows.iter().filter_map(call_from_row).collect())
    }

    async fn record_call(&self, root_id: &str, c: &CallRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO ll_agent_calls (root_id, conversation, seq, kind, name, call_id, request, response, error,
                 input_tokens, output_tokens, cost, run_id, attempt, started_at, finished_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
             ON CONFLICT (root_id, conversation, seq) DO UPDATE SET kind = excluded.kind, name = excluded.name,
                 call_id = excluded.call_id, request = excluded.request, response = excluded.response, error = excluded.error,
                 input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens, cost = excluded.cost,
                 run_id = excluded.run_id, attempt = excluded.attempt, started_at = excluded.started_at,
                 finished_at = excluded.finished_at
             WHERE ll_agent_calls.attempt <= excluded.attempt",
        )
        .bind(root_id)
        .bind(&c.conversation)
        .bind(i64::from(c.seq))
        .bind(c.kind.as_str())
        .bind(&c.name)
        .bind(c.call_id.as_deref())
        .bind(c.request.as_ref().map(|v| v.to_string()))
        .bind(c.response.as_ref().map(|v| v.to_string()))
        .bind(c.error.as_deref())
        .bind(i64::try_from(c.input_tokens).unwrap_or(i64::MAX))
        .bind(i64::try_from(c.output_tokens).unwrap_or(i64::MAX))
        .bind(c.cost)
        .bind(&c.run_id)
        .bind(i64::from(c.attempt))
        .bind(ms(c.started_at))
        .bind(ms(c.finished_at))
        .execute(&self.pool)
        .await
        .ctx("recording an agent call")?;
        Ok(())
    }

    async fn run_snapshot(&self, id: &str) -> Result<Option<JobSnapshot>, StoreError> {
        let v: Option<Option<String>> = sqlx::query_scalar("SELECT job_snapshot FROM ll_runs WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .ctx("reading a run's job snapshot")?;
        Ok(v.flatten().and_then(|s| serde_json::from_str(&s).ok()))
    }

    async fn get_run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        let row = sqlx::query(concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .ctx("reading a run")?;
        Ok(row.as_ref().map(run_from_row))
    }

    async fn list_runs(&self, f: &RunFilter) -> Result<Vec<Run>, StoreError> {
        let rows = super::list_runs_query!(f, "$").fetch_all(&self.pool).await.ctx("listing runs")?;
        Ok(rows.iter().map(run_from_row).collect())
    }

    async fn job_overview(&self, job: &str, recent: u32) -> Result<JobOverview, StoreError> {
        let filter = RunFilter { job: Some(job.to_owned()), limit: Some(recent), ..Default::default() };
        let counts = async {
            let rows = sqlx::query("SELECT status, count(*) AS n FROM ll_runs WHERE job = $1 GROUP BY status")
                .bind(job)
                .fetch_all(&self.pool)
                .await
                .ctx("counting runs")?;
            Ok::<_, StoreError>(
                rows.iter()
                    .filter_map(|r| Some((RunStatus::from_str(r.get::<&str, _>("status")).ok()?, r.get::<i64, _>("n") as u64)))
                    .collect(),
            )
        };
        let (state, recent, counts) = tokio::try_join!(self.job_state(job), self.list_runs(&filter), counts)?;
        Ok(JobOverview { state, recent: recent.iter().map(RunBrief::from).collect(), counts })
    }

    async fn last_runs(&self, jobs: &[&str]) -> Result<HashMap<String, RunBrief>, StoreError> {
        // Each job's newest run straight from the `(job, id)` index.
        let rows = sqlx::query(
            "SELECT r.* FROM unnest($1::text[]) AS j(name) CROSS JOIN LATERAL
             (SELECT job, id, status, trigger, enqueued_at, finished_at FROM ll_runs WHERE job = j.name ORDER BY id DESC LIMIT 1) r",
        )
        .bind(jobs)
        .fetch_all(&self.pool)
        .await
        .ctx("reading last runs")?;
        let row = |r: &PgRow| brief((r.get("id"), r.get("status"), r.get("trigger"), r.get("enqueued_at"), r.get("finished_at")));
        Ok(rows.iter().map(|r| (r.get("job"), row(r))).collect())
    }

    async fn queue_depth(&self) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar(sql!("SELECT count(*) FROM ll_runs WHERE status = {Queued}"))
            .fetch_one(&self.pool)
            .await
            .ctx("counting queued runs")?;
        Ok(n as u64)
    }

    async fn heartbeat(&self, me: &WorkerId, lease: Duration, take_over: bool, _now: DateTime<Utc>) -> Result<bool, StoreError> {
        let sql = format!(
            "INSERT INTO ll_workers (name, instance, host, pid, started_at, heartbeat_at, lease_until)
             VALUES ($1, $2, $3, $4, {now}, {now}, {now} + $5)
             ON CONFLICT (name) DO UPDATE SET instance = excluded.instance, host = excluded.host, pid = excluded.pid,
                 started_at = CASE WHEN ll_workers.instance = excluded.instance THEN ll_workers.started_at ELSE excluded.started_at END,
                 heartbeat_at = excluded.heartbeat_at, lease_until = excluded.lease_until
             WHERE $6 OR ll_workers.instance = excluded.instance",
            now = DB_NOW_MS
        );
        let n = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&me.name)
            .bind(&me.instance)
            .bind(&me.host)
            .bind(i64::from(me.pid))
            .bind(lease.as_millis() as i64)
            .bind(take_over)
            .execute(&self.pool)
            .await
            .ctx("renewing the worker's lease")?
            .rows_affected();
        Ok(n == 1)
    }

    async fn release(&self, me: &WorkerId) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM ll_workers WHERE name = $1 AND instance = $2")
            .bind(&me.name)
            .bind(&me.instance)
            .execute(&self.pool)
            .await
            .ctx("giving up the worker's lease")?;
        Ok(())
    }

    async fn workers(&self, _now: DateTime<Utc>) -> Result<Vec<WorkerLease>, StoreError> {
        let leases = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT * FROM ll_workers WHERE lease_until > {DB_NOW_MS} ORDER BY name")))
            .fetch_all(&self.pool)
            .await
            .ctx("reading worker leases")?;
        let running = sqlx::query(sql!("SELECT worker, id FROM ll_runs WHERE status = {Running} AND worker IS NOT NULL ORDER BY id"))
            .fetch_all(&self.pool)
            .await
            .ctx("reading running runs")?;
        Ok(leases_with_runs(&leases, &running))
    }

    /// Runs left `running` by `starting` (an earlier process under its name) or by a worker
    /// whose lease ran out become `interrupted`, with their open steps, in one transaction. A live
    /// worker's runs are never touched. Queue tasks are not owned by workers (a task is
    /// consumed in the transaction that claims its run), so nothing is handed over again.
    async fn recover(&self, starting: Option<&str>, now: DateTime<Utc>) -> Result<Vec<Run>, StoreError> {
        let mut tx = self.pool.begin().await.ctx("starting recovery")?;
        let rows = sqlx::query(sql!(&format!(
            "UPDATE ll_runs SET status = {{Interrupted}}, finished_at = $2,
                     error = 'worker \"' || coalesce(worker, '?') || '\" stopped while the run was going'
                 WHERE status = {{Running}} AND (worker IS NULL OR worker = $1
                       OR worker NOT IN (SELECT name FROM ll_workers WHERE lease_until > {DB_NOW_MS}))
                 RETURNING {}",
            run_cols!()
        )))
        .bind(starting)
        .bind(ms(now))
        .fetch_all(&mut *tx)
        .await
        .ctx("interrupting orphaned runs")?;
        let runs: Vec<Run> = rows.iter().map(run_from_row).collect();
        let interrupted: Vec<(&str, RunStatus)> = runs.iter().map(|r| (r.id.as_str(), RunStatus::Interrupted)).collect();
        close_steps(&mut tx, &interrupted, now).await?;
        tx.commit().await.ctx("committing recovery")?;
        Ok(runs)
    }

    async fn interrupted_without_follow_up(&self) -> Result<Vec<Run>, StoreError> {
        let rows = sqlx::query(sql!(concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE status = {Interrupted} AND next_run_id IS NULL")))
            .fetch_all(&self.pool)
            .await
            .ctx("reading interrupted runs")?;
        Ok(rows.iter().map(run_from_row).collect())
    }

    async fn prune(&self, job: &str, keep: Option<u32>, max_age: Option<Duration>, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut deleted = 0;
        if let Some(keep) = keep {
            let sql = format!(
                "DELETE FROM ll_runs WHERE job = $1 AND status NOT IN {a} AND id NOT IN
                 (SELECT id FROM ll_runs WHERE job = $1 AND status NOT IN {a} ORDER BY id DESC LIMIT $2)",
                a = *ACTIVE
            );
            deleted += sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(job)
                .bind(keep as i64)
                .execute(&self.pool)
                .await
                .ctx("pruning runs by count")?
                .rows_affected();
        }
        if let Some(age) = max_age {
            let cutoff = ms(now) - age.as_millis() as i64;
            let sql = format!("DELETE FROM ll_runs WHERE job = $1 AND status NOT IN {} AND finished_at < $2", *ACTIVE);
            deleted += sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(job)
                .bind(cutoff)
                .execute(&self.pool)
                .await
                .ctx("pruning runs by age")?
                .rows_affected();
        }
        sqlx::query("DELETE FROM ll_ticks WHERE job = $1 AND scheduled_at < $2")
            .bind(job)
            .bind(ms(now) - TICK_KEYS_KEPT.as_millis() as i64)
            .execute(&self.pool)
            .await
            .ctx("pruning ticks")?;
        Ok(deleted)
    }

    async fn housekeeping(&self) -> Result<(), StoreError> {
        for (table, what) in
            [("ll_checkpoints", "pruning checkpoints"), ("ll_steps", "pruning workflow steps"), ("ll_agent_calls", "pruning agent calls")]
        {
            let sql =
                format!("DELETE FROM {table} t WHERE NOT EXISTS (SELECT 1 FROM ll_runs r WHERE coalesce(r.root_id, r.id) = t.root_id)");
            sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&self.pool).await.ctx(what)?;
        }
        queue::prune(&self.pool).await?;
        Ok(())
    }
}

/// Rows per multi-row insert: 19 columns × 1000 stays under PostgreSQL's 65,535 parameters.
const ROWS_PER_STATEMENT: usize = 1000;

async fn insert_rows(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    rows: &[(String, NewRun, Dispatch<'_>)],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let mut q = sqlx::QueryBuilder::<sqlx::Postgres>::new(
            "INSERT INTO ll_runs (id, job, trigger, status, scheduled_at, due_at, enqueued_at, dispatched_at, attempt, input, parameters, \
             error, idempotency_key, retry_of, finished_at, root_id, job_snapshot, worker, started_at) ",
        );
        q.push_values(chunk, |mut b, (id, r, dispatch)| {
            let (status, worker) = match dispatch {
                Dispatch::Claimed(worker) => (RunStatus::Running, Some(*worker)),
                _ => (r.status, None),
            };
            b.push_bind(id.as_str())
                .push_bind(r.job.as_str())
                .push_bind(r.trigger.as_str())
                .push_bind(status.as_str())
                .push_bind(r.scheduled_at.map(ms))
                .push_bind(ms(r.due_at))
                .push_bind(ms(now))
                .push_bind((!matches!(dispatch, Dispatch::No)).then(|| ms(now)))
                .push_bind(i64::from(r.attempt))
                .push_bind(r.input.as_ref().map(|v| v.to_string()))
                .push_bind(r.parameters.as_ref().map(|v| v.to_string()))
                .push_bind(r.error.as_deref())
                .push_bind(r.idempotency_key.as_deref())
                .push_bind(r.retry_of.as_deref())
                .push_bind(status.is_final().then(|| ms(now)))
                .push_bind(r.root_id.as_deref().filter(|root| *root != id.as_str()))
                .push_bind(r.snapshot.as_ref().and_then(|s| serde_json::to_string(s).ok()))
                .push_bind(worker)
                .push_bind(worker.map(|_| ms(now)));
        });
        q.build().execute(&mut **tx).await.ctx("inserting runs")?;
    }
    Ok(())
}

/// What a claim does with a run another transaction holds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Locked {
    /// Leave it: whoever holds it is handing it over.
    Skip,
    /// Wait for it, then claim it if it is still queued.
    Wait,
}

/// Claims queued runs for `worker` inside the caller's transaction; runs no longer queued are
/// left out: the guard that makes a run execute at most once.
async fn claim(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    ids: &[String],
    worker: &str,
    now: DateTime<Utc>,
    locked: Locked,
) -> Result<Vec<Handed>, StoreError> {
    // The rows to take, picked once (a materialized CTE): see `queue::take`.
    macro_rules! claim_sql {
        ($skip:literal) => {
            sql!(format!(
                concat!(
                    "WITH picked AS MATERIALIZED (SELECT id AS pick FROM ll_runs WHERE id = ANY($1) AND status = {{Queued}} ORDER BY id FOR UPDATE",
                    $skip,
                    ")
                     UPDATE ll_runs SET status = {{Running}}, started_at = coalesce(started_at, $3), worker = $2,
                         dispatched_at = coalesce(dispatched_at, $3)
                     FROM picked WHERE ll_runs.id = picked.pick RETURNING job_snapshot, started_at < $3 AS resumed, {}"
                ),
                run_cols!()
            ))
        };
    }
    let sql = if locked == Locked::Skip { claim_sql!(" SKIP LOCKED") } else { claim_sql!("") };
    let rows = sqlx::query(sql).bind(ids).bind(worker).bind(ms(now)).fetch_all(&mut **tx).await.ctx("claiming runs")?;
    Ok(rows.iter().map(handed_from_row).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::contract::tick;

    async fn store(cluster: &lamplighter_tests::pg::Cluster) -> PgStore {
        let store = PgStore::connect(&cluster.url(), 4, Duration::from_secs(30)).await.expect("connect");
        store.migrate().await.expect("migrate");
        store
    }

    fn worker(name: &str) -> WorkerId {
        WorkerId { name: name.into(), instance: format!("{name}-1"), host: "h".into(), pid: 1 }
    }

    /// Three workers (three pools) fire the same 200 ticks of 20 jobs at once, each batch in
    /// its own order: every tick is recorded once, with one run, and nobody deadlocks.
    #[tokio::test]
    async fn workers_firing_the_same_ticks_at_once_record_each_once() {
        let cluster = lamplighter_tests::pg::Cluster::start();
        let stores = [store(&cluster).await, store(&cluster).await, store(&cluster).await];
        let t0 = Utc::now();
        let ticks: Vec<(String, DateTime<Utc>)> =
            (0..20).flat_map(|j| (0..10).map(move |s| (format!("job-{j}"), t0 + chrono::Duration::seconds(s)))).collect();
        let names = ["a", "b", "c"];
        let fired = futures::future::join_all(stores.iter().zip(names).enumerate().map(|(i, (s, name))| {
            let mut batch: Vec<(NewRun, Overlap)> = ticks.iter().map(|(j, at)| (tick(j, *at), Overlap::Allow)).collect();
            if i == 1 {
                batch.reverse();
            }
            async move { s.fire_ticks(batch, Claim { worker: name, slots: 5 }, t0 + chrono::Duration::seconds(10)).await.expect("fire") }
        }))
        .await;
        let fresh: usize = fired.iter().map(|f| f.iter().filter(|o| o.is_some()).count()).sum();
        assert_eq!(fresh, ticks.len(), "each tick fired by exactly one worker");
        let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM ll_runs").fetch_one(&stores[0].pool).await.expect("count");
        assert_eq!(runs as usize, ticks.len());
        let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM apalis.jobs").fetch_one(&stores[0].pool).await.expect("count");
        let running: i64 = sqlx::query_scalar(sql!("SELECT count(*) FROM ll_runs WHERE status = {Running}"))
            .fetch_one(&stores[0].pool)
            .await
            .expect("count");
        assert_eq!((tasks + running) as usize, ticks.len(), "every run is either claimed or queued with its task");

        // The three take the queue in small batches at once: nobody takes more than it asked
        // for (each run it takes needs one of its slots), and every run is taken once.
        let later = t0 + chrono::Duration::seconds(11);
        let takers = stores.iter().zip(names).map(|(s, name)| async move {
            let mut mine = Vec::new();
            loop {
                let taken = s.claim_queued(3, name, later).await.expect("claim");
                assert!(taken.tasks <= 3 && taken.runs.len() <= 3, "{name} asked for 3 and took {}", taken.tasks);
                if taken.tasks == 0 {
                    return mine;
                }
                mine.extend(taken.runs.into_iter().map(|h| h.run.id));
            }
        });
        let taken: Vec<String> = futures::future::join_all(takers).await.concat();
        let unique: std::collections::HashSet<&String> = taken.iter().collect();
        assert_eq!((taken.len(), unique.len()), (tasks as usize, tasks as usize), "each queued run taken once");
    }

    /// Recovery by another worker leaves a live worker's runs alone, and takes a dead one's
    /// once its lease has run out.
    #[tokio::test]
    async fn recovery_takes_only_runs_of_workers_whose_lease_ran_out() {
        let cluster = lamplighter_tests::pg::Cluster::start();
        let s = store(&cluster).await;
        let now = Utc::now();
        let (live, dead) = (worker("live"), worker("dead"));
        assert!(s.heartbeat(&live, Duration::from_secs(60), true, now).await.expect("lease"));
        assert!(s.heartbeat(&dead, Duration::from_secs(60), true, now).await.expect("lease"));
        let a = s.fire_ticks(vec![(tick("a", now), Overlap::Allow)], Claim { worker: "live", slots: 1 }, now).await.expect("fire");
        let b = s.fire_ticks(vec![(tick("b", now), Overlap::Allow)], Claim { worker: "dead", slots: 1 }, now).await.expect("fire");
        let (a, b) = (a[0].as_ref().expect("fresh").run_id.clone(), b[0].as_ref().expect("fresh").run_id.clone());
        assert!(s.recover(None, now).await.expect("recover").is_empty(), "both leases are live");
        // The dead worker's last heartbeat gave it no time left.
        assert!(s.heartbeat(&dead, Duration::ZERO, false, now).await.expect("renew"));
        let taken: Vec<String> = s.recover(None, now).await.expect("recover").into_iter().map(|r| r.id).collect();
        assert_eq!(taken, vec![b.clone()]);
        let live_run = s.get_run(&a).await.expect("get").expect("run");
        assert_eq!(live_run.status, RunStatus::Running, "a live worker's run is never touched");
        let workers: Vec<String> = s.workers(now).await.expect("workers").into_iter().map(|w| w.name).collect();
        assert_eq!(workers, ["live"], "only live leases are listed");
    }
}
