//! The SQLite backend: Lamplighter's tables (`migrations/sqlite`) and apalis-sqlite's queue in
//! one database file, served to one worker (the engine holds a file lock).

mod queue;

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow, SqliteSynchronous};

use lamplighter_config::Overlap;

use super::{ACTIVE, Backend, OpenError, StorageKind, sql, status_list};
use super::{
    BriefRow, Claim, DUE_BATCH, Decide, Decided, Dispatch, Handed, JobOverview, JobState, NewRun, RunBrief, RunEnd, RunFilter, RunStore,
    StoreError, TICK_KEYS_KEPT, Taken, TickOutcome, TickPlan, WorkerId, WorkerLease, brief, from_ms, ms, new_id, plan_ticks,
};
use crate::run::{CallKind, CallRecord, Run, RunStatus, StepRecord, StepStatus, Trigger};
use crate::signals::Local;
use crate::snapshot::JobSnapshot;

trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, StoreError>;
}

impl<T> Ctx<T> for Result<T, sqlx::Error> {
    fn ctx(self, what: &str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::new(what, source))
    }
}

#[derive(Debug)]
pub(crate) struct SqliteStore {
    /// Readers (WAL: they never wait for the writer).
    pool: SqlitePool,
    /// The one writing connection. Writes queue for it in the process, in order, instead of
    /// meeting at SQLite's lock, whose busy handler sleeps 10–25 ms per retry (measured: a
    /// claim and a batch of ends taking turns this way held the queue to ~900 runs/s).
    write: SqlitePool,
    /// Worker names registered with the queue by this process.
    registered: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// The guard of the partial index `ll_runs_undispatched` (migration 0003). It is written out,
/// not bound, so the planner can prove a query's rows lie inside the index; `INDEXED BY`
/// makes it use it (without statistics it prefers the status index, which holds every queued
/// run) and fails loudly if it ever cannot.
static UNDISPATCHED: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("status = '{}' AND dispatched_at IS NULL", RunStatus::Queued.as_str()));

static DUE_UNDISPATCHED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT id, job FROM ll_runs INDEXED BY ll_runs_undispatched WHERE {} AND due_at <= ?1 ORDER BY due_at, enqueued_at LIMIT ?2",
        *UNDISPATCHED
    )
});

static NEXT_DUE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT min(t) FROM (SELECT min(due_at) AS t FROM ll_runs INDEXED BY ll_runs_undispatched WHERE {}
                             UNION ALL SELECT min(wait_until) FROM ll_runs WHERE status = '{}')",
        *UNDISPATCHED,
        RunStatus::WaitingApproval.as_str()
    )
});

super::row_readers!(SqliteRow);
super::lease_readers!(SqliteRow);

/// Closes the steps still open (running or waiting) of runs that ended without succeeding:
/// `interrupted` when the run was, otherwise `cancelled`. `ends`: (run id, run status).
async fn close_steps(conn: &mut sqlx::SqliteConnection, ends: &[(&str, RunStatus)], now: DateTime<Utc>) -> Result<(), StoreError> {
    let ends: Vec<serde_json::Value> = ends
        .iter()
        .filter(|(_, s)| s.is_final() && *s != RunStatus::Succeeded)
        .map(|(id, s)| serde_json::json!({"id": id, "status": if *s == RunStatus::Interrupted { StepStatus::Interrupted } else { StepStatus::Cancelled }.as_str()}))
        .collect();
    if ends.is_empty() {
        return Ok(());
    }
    sqlx::query(sql!(
        "UPDATE ll_steps SET status = j.status, finished_at = ?2
             FROM (SELECT value ->> 'id' AS id, value ->> 'status' AS status FROM json_each(?1)) AS j
             WHERE ll_steps.run_id = j.id AND ll_steps.status IN ({step:Running}, {step:WaitingApproval})"
    ))
    .bind(serde_json::Value::from(ends).to_string())
    .bind(ms(now))
    .execute(conn)
    .await
    .ctx("closing the steps of ended runs")?;
    Ok(())
}

/// Many rows read as one: sqlx hands each SQLite row from its connection's thread to the
/// async side on its own (a channel send and, often, a thread wake-up per row), which for the
/// 1,000 rows of a listing cost more than the query. Listings that read a row per job ask
/// SQLite for one row holding them all (`json_group_array` of `json_array`s), parsed here
/// into tuples. `None` (no rows) is an empty list.
fn parse_aggregate<T: serde::de::DeserializeOwned>(text: Option<String>, context: &str) -> Result<Vec<T>, StoreError> {
    match text {
        None => Ok(Vec::new()),
        Some(text) => serde_json::from_str(&text).map_err(|e| StoreError::new(context, sqlx::Error::Decode(Box::new(e)))),
    }
}

fn json_ids(ids: &[String]) -> String {
    serde_json::to_string(ids).unwrap_or_else(|_| "[]".into())
}

/// The SQLite backend for one worker: the file lock first (one worker per database, so every
/// run left `running` is an orphan at start), then the store, migrated, and in-process signals.
pub(super) async fn backend(path: &Path) -> Result<Backend, OpenError> {
    let lock = lock(path)?;
    let store = SqliteStore::open(path).await?;
    store.migrate().await?;
    Ok(Backend { store: Arc::new(store), signals: Arc::new(Local::new()), lock: Some(lock), kind: StorageKind::Sqlite })
}

/// Takes `<db>.lock` for this process, or says who has it.
fn lock(path: &Path) -> Result<std::fs::File, OpenError> {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let lock_path = path.with_extension("lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| OpenError::Locked(format!("cannot open {}: {e}", lock_path.display())))?;
    if lock.try_lock().is_err() {
        return Err(OpenError::Locked(format!(
            "another lamplighter worker is using {}; stop it first (SQLite storage serves one worker; use postgres for several)",
            path.display()
        )));
    }
    Ok(lock)
}

impl SqliteStore {
    /// Opens (creating if needed) the database with the pragmas every connection needs:
    /// WAL, `synchronous=NORMAL` (no lost commits on power loss in WAL mode, only the last
    /// transactions), a busy timeout, foreign keys.
    pub(crate) async fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            // The housekeeper checkpoints after each pass; this is the safety net (~40 MB).
            .pragma("wal_autocheckpoint", "10000")
            // Reads map the file instead of copying each page through a read() into every
            // connection's own cache, which a write elsewhere empties: a listing of 1,000 jobs
            // touches ~1,000 scattered pages of the history.
            .pragma("mmap_size", "268435456")
            .foreign_keys(true);
        let write = SqlitePoolOptions::new().max_connections(1).connect_with(opts.clone()).await.ctx("opening the database")?;
        let pool = SqlitePoolOptions::new().max_connections(4).connect_with(opts).await.ctx("opening the database")?;
        Ok(Self { pool, write, registered: Default::default() })
    }
}

#[async_trait]
impl RunStore for SqliteStore {
    async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    /// Kept by the triggers of migration 0010.
    async fn listing_changes(&self) -> Option<u64> {
        let n: i64 = sqlx::query_scalar("SELECT n FROM ll_listing_changes WHERE id = 1").fetch_one(&self.pool).await.ok()?;
        Some(n as u64)
    }

    /// Closes every connection (rolling back anything left open), so no lock outlives the
    /// engine. Later calls fail with a storage error.
    async fn close(&self) {
        self.write.close().await;
        self.pool.close().await;
    }

    /// Applies apalis's migrations and ours. Both share sqlx's migrations table, so each
    /// ignores the other's entries.
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut apalis = apalis_sqlite::SqliteStorage::<()>::migrations();
        apalis.set_ignore_missing(true);
        apalis.run(&self.write).await.map_err(|e| StoreError { context: "applying queue migrations".into(), source: e.into() })?;
        let mut ours = sqlx::migrate!("../migrations/sqlite");
        ours.set_ignore_missing(true);
        ours.run(&self.write).await.map_err(|e| StoreError { context: "applying lamplighter migrations".into(), source: e.into() })?;
        Ok(())
    }

    async fn job_states(&self) -> Result<HashMap<String, JobState>, StoreError> {
        // One JSON row for every job's state (see `parse_aggregate`).
        let text: Option<String> =
            sqlx::query_scalar("SELECT json_group_array(json_array(job, paused, pause_reason, paused_at, last_tick)) FROM ll_job_state")
                .fetch_one(&self.pool)
                .await
                .ctx("reading job state")?;
        let rows: Vec<(String, i64, Option<String>, Option<i64>, Option<i64>)> = parse_aggregate(text, "reading job state")?;
        Ok(rows
            .into_iter()
            .map(|(job, paused, pause_reason, paused_at, last_tick)| {
                (job, JobState { paused: paused != 0, pause_reason, paused_at: paused_at.map(from_ms), last_tick: last_tick.map(from_ms) })
            })
            .collect())
    }

    /// One job's state; the default (never paused, never ticked) when it has none yet.
    async fn job_state(&self, job: &str) -> Result<JobState, StoreError> {
        let row = sqlx::query("SELECT job, paused, pause_reason, paused_at, last_tick FROM ll_job_state WHERE job = ?1")
            .bind(job)
            .fetch_optional(&self.pool)
            .await
            .ctx("reading job state")?;
        Ok(row.as_ref().map(job_state_from_row).unwrap_or_default())
    }

    async fn set_paused(&self, job: &str, paused: bool, reason: Option<&str>, now: DateTime<Utc>) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO ll_job_state (job, paused, pause_reason, paused_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (job) DO UPDATE SET paused = ?2, pause_reason = ?3, paused_at = ?4",
        )
        .bind(job)
        .bind(paused as i64)
        .bind(reason)
        .bind(paused.then(|| ms(now)))
        .execute(&self.write)
        .await
        .ctx("saving pause state")?;
        Ok(())
    }

    async fn set_last_tick(&self, job: &str, tick: DateTime<Utc>) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO ll_job_state (job, last_tick) VALUES (?1, ?2)
             ON CONFLICT (job) DO UPDATE SET last_tick = max(coalesce(last_tick, 0), ?2)",
        )
        .bind(job)
        .bind(ms(tick))
        .execute(&self.write)
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
        let mut tx = self.write.begin().await.ctx("starting a tick")?;
        let ids: Vec<String> = ticks.iter().map(|_| new_id()).collect();
        // The tick keys, without RETURNING (1,000 returned rows cost more than the insert): when
        // every key was new, which is the rule, all ticks are fresh; otherwise look up which
        // keys hold our run ids.
        let mut fresh: std::collections::HashSet<String> = std::collections::HashSet::with_capacity(ids.len());
        let keyed: Vec<((&NewRun, &Overlap), &String)> = ticks.iter().map(|(r, o)| (r, o)).zip(&ids).collect();
        for chunk in keyed.chunks(ROWS_PER_STATEMENT) {
            let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new("INSERT INTO ll_ticks (job, scheduled_at, run_id) ");
            q.push_values(chunk, |mut b, ((r, _), id)| {
                b.push_bind(r.job.as_str()).push_bind(ms(r.scheduled_at.unwrap_or(r.due_at))).push_bind(id.as_str());
            });
            q.push(" ON CONFLICT DO NOTHING");
            let inserted = q.build().execute(&mut *tx).await.ctx("recording ticks")?.rows_affected();
            if inserted as usize == chunk.len() {
                fresh.extend(chunk.iter().map(|(_, id)| (*id).clone()));
                continue;
            }
            let mut q =
                sqlx::QueryBuilder::<sqlx::Sqlite>::new("SELECT run_id FROM ll_ticks WHERE (job, scheduled_at, run_id) IN (VALUES ");
            let mut list = q.separated(", ");
            for ((r, _), id) in chunk {
                list.push("(").push_bind_unseparated(r.job.as_str()).push_unseparated(", ");
                list.push_bind_unseparated(ms(r.scheduled_at.unwrap_or(r.due_at))).push_unseparated(", ");
                list.push_bind_unseparated(id.as_str()).push_unseparated(")");
            }
            q.push(")");
            let ours: Vec<String> = q.build_query_scalar().fetch_all(&mut *tx).await.ctx("reading tick keys")?;
            fresh.extend(ours);
        }
        let jobs: std::collections::BTreeSet<&str> =
            ticks.iter().zip(&ids).filter(|(_, id)| fresh.contains(*id)).map(|((r, _), _)| r.job.as_str()).collect();
        let jobs_json = serde_json::to_string(&jobs).unwrap_or_else(|_| "[]".into());
        let paused: std::collections::HashSet<String> =
            sqlx::query_scalar("SELECT job FROM ll_job_state WHERE paused = 1 AND job IN (SELECT value FROM json_each(?1))")
                .bind(&jobs_json)
                .fetch_all(&mut *tx)
                .await
                .ctx("reading pause state")?
                .into_iter()
                .collect();
        let sql = format!(
            "SELECT job, id FROM ll_runs WHERE job IN (SELECT value FROM json_each(?1)) AND status IN {} ORDER BY enqueued_at, id",
            *ACTIVE
        );
        let mut active: HashMap<String, Vec<String>> = HashMap::new();
        for row in sqlx::query(sqlx::AssertSqlSafe(sql)).bind(&jobs_json).fetch_all(&mut *tx).await.ctx("reading active runs")? {
            active.entry(row.get("job")).or_default().push(row.get("id"));
        }
        let TickPlan { out, rows, pushed, last_ticks } = plan_ticks(ticks, ids, &fresh, &paused, active, claim, now);
        insert_rows(&mut tx, &rows, now).await?;
        let last: Vec<(String, i64)> = last_ticks.into_iter().collect();
        for chunk in last.chunks(ROWS_PER_STATEMENT) {
            let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new("INSERT INTO ll_job_state (job, last_tick) ");
            q.push_values(chunk, |mut b, (job, at)| {
                b.push_bind(job.as_str()).push_bind(*at);
            });
            q.push(" ON CONFLICT (job) DO UPDATE SET last_tick = max(coalesce(last_tick, 0), excluded.last_tick)");
            q.build().execute(&mut *tx).await.ctx("saving the last ticks")?;
        }
        queue::push(&mut tx, &pushed).await?;
        tx.commit().await.ctx("committing ticks")?;
        Ok(out)
    }

    async fn insert_run(&self, run: NewRun, now: DateTime<Utc>) -> Result<(String, bool), StoreError> {
        let mut tx = self.write.begin().await.ctx("starting an insert")?;
        if let Some(key) = &run.idempotency_key {
            let existing: Option<String> = sqlx::query_scalar("SELECT id FROM ll_runs WHERE job = ?1 AND idempotency_key = ?2")
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
        insert_rows(&mut tx, &[(id.clone(), run, Dispatch::No)], now).await?;
        tx.commit().await.ctx("committing a run")?;
        Ok((id, true))
    }

    async fn follow_up(&self, run: &Run, due_at: DateTime<Utc>, now: DateTime<Utc>) -> Result<Option<String>, StoreError> {
        let mut tx = self.write.begin().await.ctx("starting a follow-up")?;
        let id = new_id();
        // Claims the link first: a run is followed up at most once.
        let linked = sqlx::query("UPDATE ll_runs SET next_run_id = ?1 WHERE id = ?2 AND next_run_id IS NULL")
            .bind(&id)
            .bind(&run.id)
            .execute(&mut *tx)
            .await
            .ctx("linking a follow-up")?
            .rows_affected();
        if linked != 1 {
            return Ok(None);
        }
        let snapshot: Option<Option<String>> = sqlx::query_scalar("SELECT job_snapshot FROM ll_runs WHERE id = ?1")
            .bind(&run.id)
            .fetch_optional(&mut *tx)
            .await
            .ctx("reading a run's job snapshot")?;
        let mut next = NewRun::follow_up(run, due_at);
        next.snapshot = snapshot.flatten().and_then(|s| serde_json::from_str(&s).ok());
        insert_rows(&mut tx, &[(id.clone(), next, Dispatch::No)], now).await?;
        tx.commit().await.ctx("committing a follow-up")?;
        Ok(Some(id))
    }

    /// Queued runs that are due and not handed to the queue yet, oldest first.
    async fn due_undispatched(&self, now: DateTime<Utc>) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(DUE_UNDISPATCHED.as_str()))
            .bind(ms(now))
            .bind(DUE_BATCH as i64)
            .fetch_all(&self.pool)
            .await
            .ctx("reading due runs")?;
        Ok(rows.iter().map(|r| (r.get("id"), r.get("job"))).collect())
    }

    async fn next_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let v: Option<i64> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(NEXT_DUE.as_str())).fetch_one(&self.pool).await.ctx("reading the next due run")?;
        Ok(v.map(from_ms))
    }

    async fn has_dispatched_active(&self, job: &str) -> Result<bool, StoreError> {
        let sql = format!(
            "SELECT count(*) FROM ll_runs WHERE job = ?1 AND status IN {} AND (status != ?2 OR dispatched_at IS NOT NULL)",
            *ACTIVE
        );
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(job)
            .bind(RunStatus::Queued.as_str())
            .fetch_one(&self.pool)
            .await
            .ctx("reading active runs")?;
        Ok(n > 0)
    }

    async fn dispatch(&self, handed: &[String], queued: &[String], worker: &str, now: DateTime<Utc>) -> Result<Vec<Handed>, StoreError> {
        let mut tx = self.write.begin().await.ctx("starting a dispatch")?;
        let claimed = if handed.is_empty() { Vec::new() } else { claim(&mut tx, handed, worker, now).await? };
        let to_push: Vec<String> = if queued.is_empty() {
            Vec::new()
        } else {
            sqlx::query_scalar(MARK_DISPATCHED)
                .bind(json_ids(queued))
                .bind(ms(now))
                .bind(RunStatus::Queued.as_str())
                .fetch_all(&mut *tx)
                .await
                .ctx("marking runs dispatched")?
        };
        queue::push(&mut tx, &to_push).await?;
        tx.commit().await.ctx("committing a dispatch")?;
        Ok(claimed)
    }

    async fn claim_queued(&self, n: usize, worker: &str, now: DateTime<Utc>) -> Result<Taken, StoreError> {
        let mut tx = self.write.begin().await.ctx("starting a claim")?;
        let known = self.registered.lock().unwrap_or_else(|e| e.into_inner()).contains(worker);
        if !known {
            queue::register(&mut tx, worker).await?;
        }
        let (tasks, ids) = queue::take(&mut tx, n, worker).await?;
        let runs = if ids.is_empty() { Vec::new() } else { claim(&mut tx, &ids, worker, now).await? };
        tx.commit().await.ctx("committing a claim")?;
        if !known {
            self.registered.lock().unwrap_or_else(|e| e.into_inner()).insert(worker.to_string());
        }
        Ok(Taken { tasks, runs })
    }

    /// Records the end of runs this worker claimed, in one statement. Returns the ids that
    /// were still running (a run cancelled meanwhile keeps its first end).
    async fn finish_many(&self, ends: &[RunEnd<'_>], now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        debug_assert!(ends.iter().all(|e| RunStatus::Running.can_become(e.status)));
        let payload: Vec<serde_json::Value> = ends
            .iter()
            .map(|e| {
                serde_json::json!({
                    "id": e.id, "started_at": e.started_at.map(ms), "status": e.status.as_str(),
                    "output": e.output.map(|o| o.to_string()), "error": e.error,
                    "finished": e.status.is_final(), "wait_until": e.wait_until.map(ms), "trace_id": e.trace_id,
                })
            })
            .collect();
        let steps_to_close = ends.iter().any(|e| e.status.is_final() && e.status != RunStatus::Succeeded);
        // `+ll_runs.status` keeps the planner off the status index: it must drive the update
        // from the batch and find each run by id (driven from the status index, the batch was
        // scanned once per running run: seconds for a thousand ends).
        let finish = sqlx::query_scalar(
            "UPDATE ll_runs SET status = j.status, output = j.output, error = j.error,
                                finished_at = CASE WHEN j.finished THEN ?2 END, wait_until = j.wait_until,
                                started_at = coalesce(j.started_at, ll_runs.started_at),
                                trace_id = coalesce(j.trace_id, ll_runs.trace_id)
             FROM (SELECT value ->> 'id' AS id, value ->> 'started_at' AS started_at, value ->> 'status' AS status,
                          value ->> 'output' AS output, value ->> 'error' AS error, value ->> 'finished' AS finished,
                          value ->> 'wait_until' AS wait_until, value ->> 'trace_id' AS trace_id FROM json_each(?1)) AS j
             WHERE ll_runs.id = j.id AND +ll_runs.status = ?3 RETURNING ll_runs.id",
        )
        .bind(serde_json::Value::from(payload).to_string())
        .bind(ms(now))
        .bind(RunStatus::Running.as_str());
        // Only a batch with steps to close needs a transaction around both statements.
        let done: Vec<String> = if steps_to_close {
            let mut tx = self.write.begin().await.ctx("starting to finish runs")?;
            let done = finish.fetch_all(&mut *tx).await.ctx("finishing runs")?;
            let ended: Vec<(&str, RunStatus)> = ends.iter().map(|e| (e.id, e.status)).collect();
            close_steps(&mut tx, &ended, now).await?;
            tx.commit().await.ctx("committing the end of runs")?;
            done
        } else {
            finish.fetch_all(&self.write).await.ctx("finishing runs")?
        };
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
            "UPDATE ll_runs SET status = ?2, output = ?3, error = ?4, finished_at = ?5 WHERE id = ?1 AND status IN {}",
            status_list(RunStatus::sources(status))
        );
        let mut tx = self.write.begin().await.ctx("starting to finish a run")?;
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
        let v: Option<String> = sqlx::query_scalar("SELECT value FROM ll_checkpoints WHERE root_id = ?1 AND step = ?2")
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
            "INSERT INTO ll_checkpoints (root_id, step, run_id, value, recorded_at) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (root_id, step) DO UPDATE SET run_id = ?3, value = ?4, recorded_at = ?5",
        )
        .bind(root_id)
        .bind(step)
        .bind(run_id)
        .bind(value.to_string())
        .bind(ms(now))
        .execute(&self.write)
        .await
        .ctx("recording a checkpoint")?;
        Ok(())
    }

    async fn steps(&self, root_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM ll_steps WHERE root_id = ?1 ORDER BY coalesce(started_at, finished_at), step")
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
        let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
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
        q.build().execute(&self.write).await.ctx("recording workflow steps")?;
        Ok(())
    }

    async fn calls(&self, root_id: &str) -> Result<Vec<CallRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM ll_agent_calls WHERE root_id = ?1 ORDER BY conversation, seq")
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
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
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
        .execute(&self.write)
        .await
        .ctx("recording an agent call")?;
        Ok(())
    }

    async fn decide(&self, d: &Decide<'_>, now: DateTime<Utc>) -> Result<Decided, StoreError> {
        let waiting = RunStatus::WaitingApproval.as_str();
        let step_waiting = StepStatus::WaitingApproval.as_str();
        let mut tx = self.write.begin().await.ctx("starting a decision")?;
        let run: Option<(String, String)> = sqlx::query_as("SELECT status, coalesce(root_id, id) FROM ll_runs WHERE id = ?1")
            .bind(d.run_id)
            .fetch_optional(&mut *tx)
            .await
            .ctx("reading the run to decide on")?;
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
            sqlx::query_as("SELECT step, resumes_on_reject != 0 FROM ll_steps WHERE run_id = ?1 AND status = ?2 ORDER BY step")
                .bind(d.run_id)
                .bind(step_waiting)
                .fetch_all(&mut *tx)
                .await
                .ctx("reading the steps waiting for a decision")?;
        let open: Vec<String> = open_rows.iter().map(|(s, _)| s.clone()).collect();
        let step = match (d.step, open.as_slice()) {
            (Some(s), _) if open.iter().any(|o| o == s) => s.to_string(),
            (Some(_), _) => {
                tx.rollback().await.ctx("ending a decision")?;
                return Ok(Decided::NotWaitingStep { waiting: open });
            }
            (None, [only]) => only.clone(),
            (None, _) => {
                tx.rollback().await.ctx("ending a decision")?;
                return Ok(Decided::WhichStep { waiting: open });
            }
        };
        let (output, error) = super::decision_record(d, now);
        let new_status = if d.approve { StepStatus::Succeeded } else { StepStatus::Failed };
        let row = sqlx::query(
            "UPDATE ll_steps SET status = ?3, output = ?4, error = ?5, finished_at = ?6
             WHERE root_id = ?1 AND step = ?2 AND status = ?7 RETURNING *",
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
        // A wait that asked "may this go on?" (an agent's tool call) resumes the run either
        // way: the run itself acts on a rejection.
        let resumes_on_reject = open_rows.iter().any(|(s, resumes)| *s == step && *resumes);
        let run_status = if d.approve || resumes_on_reject {
            if open.len() > 1 {
                RunStatus::WaitingApproval
            } else {
                sqlx::query("UPDATE ll_runs SET status = ?2, dispatched_at = NULL, wait_until = NULL WHERE id = ?1 AND status = ?3")
                    .bind(d.run_id)
                    .bind(RunStatus::Queued.as_str())
                    .bind(waiting)
                    .execute(&mut *tx)
                    .await
                    .ctx("resuming an approved run")?;
                RunStatus::Queued
            }
        } else {
            let why = format!("step \"{step}\" was {}", error.as_deref().unwrap_or("rejected"));
            sqlx::query("UPDATE ll_runs SET status = ?2, error = ?3, finished_at = ?4, wait_until = NULL WHERE id = ?1 AND status = ?5")
                .bind(d.run_id)
                .bind(RunStatus::Failed.as_str())
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
        sqlx::query_scalar(
            "UPDATE ll_runs SET status = ?2, dispatched_at = NULL, wait_until = NULL WHERE status = ?3 AND wait_until <= ?1 RETURNING id",
        )
        .bind(ms(now))
        .bind(RunStatus::Queued.as_str())
        .bind(RunStatus::WaitingApproval.as_str())
        .fetch_all(&self.write)
        .await
        .ctx("resuming runs whose wait is over")
    }

    async fn run_snapshot(&self, id: &str) -> Result<Option<JobSnapshot>, StoreError> {
        let v: Option<Option<String>> = sqlx::query_scalar("SELECT job_snapshot FROM ll_runs WHERE id = ?1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .ctx("reading a run's job snapshot")?;
        Ok(v.flatten().and_then(|s| serde_json::from_str(&s).ok()))
    }

    async fn get_run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        let row = sqlx::query(concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE id = ?1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .ctx("reading a run")?;
        Ok(row.as_ref().map(run_from_row))
    }

    /// Runs, newest first, with paging by cursor.
    async fn list_runs(&self, f: &RunFilter) -> Result<Vec<Run>, StoreError> {
        let rows = super::list_runs_query!(f, "?").fetch_all(&self.pool).await.ctx("listing runs")?;
        Ok(rows.iter().map(run_from_row).collect())
    }

    async fn job_overview(&self, job: &str, recent: u32) -> Result<JobOverview, StoreError> {
        // One statement, one JSON row (see `parse_aggregate`): three reads would each cross
        // sqlx's connection thread and back, which is most of a `get_job`.
        let text: String = sqlx::query_scalar(
            "SELECT json_array(
                json((SELECT json_array(paused, pause_reason, paused_at, last_tick) FROM ll_job_state WHERE job = ?1)),
                json((SELECT json_group_array(json_array(id, status, trigger, enqueued_at, finished_at) ORDER BY id DESC)
                      FROM (SELECT id, status, trigger, enqueued_at, finished_at FROM ll_runs WHERE job = ?1 ORDER BY id DESC LIMIT ?2))),
                json((SELECT json_group_array(json_array(status, n)) FROM (SELECT status, count(*) AS n FROM ll_runs WHERE job = ?1 GROUP BY status))))",
        )
        .bind(job)
        .bind(i64::from(recent))
        .fetch_one(&self.pool)
        .await
        .ctx("reading a job's overview")?;
        type State = (i64, Option<String>, Option<i64>, Option<i64>);
        let (state, recent, counts): (Option<State>, Vec<BriefRow>, Vec<(String, u64)>) =
            serde_json::from_str(&text).map_err(|e| StoreError::new("reading a job's overview", sqlx::Error::Decode(Box::new(e))))?;
        Ok(JobOverview {
            state: state.map_or_else(JobState::default, |(paused, pause_reason, paused_at, last_tick)| JobState {
                paused: paused != 0,
                pause_reason,
                paused_at: paused_at.map(from_ms),
                last_tick: last_tick.map(from_ms),
            }),
            recent: recent.into_iter().map(brief).collect(),
            counts: counts.into_iter().filter_map(|(status, n)| Some((RunStatus::from_str(&status).ok()?, n))).collect(),
        })
    }

    async fn last_runs(&self, jobs: &[&str]) -> Result<HashMap<String, RunBrief>, StoreError> {
        let jobs_json = serde_json::to_string(jobs).unwrap_or_else(|_| "[]".into());
        // Each job's newest run's rowid straight from the `(job, id)` index (its entries hold
        // the rowid), then its row: two seeks a job. All of them in one JSON row (see
        // `parse_aggregate`).
        let text: Option<String> = sqlx::query_scalar(
            "SELECT json_group_array(json_array(r.job, json_array(r.id, r.status, r.trigger, r.enqueued_at, r.finished_at)))
             FROM json_each(?1) j JOIN ll_runs r ON r.rowid = (SELECT rowid FROM ll_runs WHERE job = j.value ORDER BY id DESC LIMIT 1)",
        )
        .bind(&jobs_json)
        .fetch_one(&self.pool)
        .await
        .ctx("reading last runs")?;
        let rows: Vec<(String, BriefRow)> = parse_aggregate(text, "reading last runs")?;
        Ok(rows.into_iter().map(|(job, row)| (job, brief(row))).collect())
    }

    async fn queue_depth(&self) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM ll_runs WHERE status = ?1")
            .bind(RunStatus::Queued.as_str())
            .fetch_one(&self.pool)
            .await
            .ctx("counting queued runs")?;
        Ok(n as u64)
    }

    async fn heartbeat(&self, me: &WorkerId, lease: Duration, take_over: bool, now: DateTime<Utc>) -> Result<bool, StoreError> {
        let n = sqlx::query(HEARTBEAT)
            .bind(&me.name)
            .bind(&me.instance)
            .bind(&me.host)
            .bind(i64::from(me.pid))
            .bind(ms(now))
            .bind(ms(now) + lease.as_millis() as i64)
            .bind(take_over)
            .execute(&self.write)
            .await
            .ctx("renewing the worker's lease")?
            .rows_affected();
        Ok(n == 1)
    }

    async fn release(&self, me: &WorkerId) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM ll_workers WHERE name = ?1 AND instance = ?2")
            .bind(&me.name)
            .bind(&me.instance)
            .execute(&self.write)
            .await
            .ctx("giving up the worker's lease")?;
        Ok(())
    }

    async fn workers(&self, now: DateTime<Utc>) -> Result<Vec<WorkerLease>, StoreError> {
        let leases = sqlx::query("SELECT * FROM ll_workers WHERE lease_until > ?1 ORDER BY name")
            .bind(ms(now))
            .fetch_all(&self.pool)
            .await
            .ctx("reading worker leases")?;
        let running = sqlx::query("SELECT worker, id FROM ll_runs WHERE status = ?1 AND worker IS NOT NULL ORDER BY id")
            .bind(RunStatus::Running.as_str())
            .fetch_all(&self.pool)
            .await
            .ctx("reading running runs")?;
        Ok(leases_with_runs(&leases, &running))
    }

    /// After an unclean stop: runs left `running` become `interrupted`, and queued runs that
    /// were handed to the old queue are handed again. Only called with the database lock held,
    /// so no other process can be running anything: every `running` run is an orphan, whatever
    /// worker name it carries (a restart under a configured `worker.name` has the same name).
    /// Returns the interrupted runs.
    async fn recover(&self, _starting: Option<&str>, now: DateTime<Utc>) -> Result<Vec<Run>, StoreError> {
        // One transaction: the orphans and their open steps are interrupted together.
        let mut tx = self.write.begin().await.ctx("starting recovery")?;
        let rows = sqlx::query(concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE status = ?1"))
            .bind(RunStatus::Running.as_str())
            .fetch_all(&mut *tx)
            .await
            .ctx("finding orphaned runs")?;
        let runs: Vec<Run> = rows.iter().map(run_from_row).collect();
        for r in &runs {
            let msg = format!("worker \"{}\" stopped while the run was going", r.worker.as_deref().unwrap_or("?"));
            sqlx::query("UPDATE ll_runs SET status = ?4, error = ?2, finished_at = ?3 WHERE id = ?1 AND status = ?5")
                .bind(&r.id)
                .bind(msg)
                .bind(ms(now))
                .bind(RunStatus::Interrupted.as_str())
                .bind(RunStatus::Running.as_str())
                .execute(&mut *tx)
                .await
                .ctx("marking a run interrupted")?;
        }
        let interrupted: Vec<(&str, RunStatus)> = runs.iter().map(|r| (r.id.as_str(), RunStatus::Interrupted)).collect();
        close_steps(&mut tx, &interrupted, now).await?;
        tx.commit().await.ctx("committing recovery")?;
        // Queued runs are handed over again, so the tasks that carried them are dropped.
        let mut tx = self.write.begin().await.ctx("starting a re-queue")?;
        sqlx::query("UPDATE ll_runs SET dispatched_at = NULL WHERE status = ?1")
            .bind(RunStatus::Queued.as_str())
            .execute(&mut *tx)
            .await
            .ctx("re-queueing runs")?;
        queue::forget_all(&mut tx).await?;
        tx.commit().await.ctx("committing a re-queue")?;
        Ok(runs)
    }

    /// Interrupted runs that nobody has followed up with a retry yet.
    async fn interrupted_without_follow_up(&self) -> Result<Vec<Run>, StoreError> {
        let rows = sqlx::query(sql!(concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE status = {Interrupted} AND next_run_id IS NULL")))
            .fetch_all(&self.pool)
            .await
            .ctx("reading interrupted runs")?;
        Ok(rows.iter().map(run_from_row).collect())
    }

    async fn mark_no_follow_up(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE ll_runs SET next_run_id = '' WHERE id = ?1 AND next_run_id IS NULL")
            .bind(id)
            .execute(&self.write)
            .await
            .ctx("closing an interrupted run")?;
        Ok(())
    }

    /// Deletes finished runs of a job beyond its retention (count and age), and its old tick keys.
    async fn prune(&self, job: &str, keep: Option<u32>, max_age: Option<Duration>, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut deleted = 0;
        if let Some(keep) = keep {
            let sql = format!(
                "DELETE FROM ll_runs WHERE job = ?1 AND status NOT IN {a} AND id NOT IN
                 (SELECT id FROM ll_runs WHERE job = ?1 AND status NOT IN {a} ORDER BY id DESC LIMIT ?2)",
                a = *ACTIVE
            );
            deleted += sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(job)
                .bind(keep as i64)
                .execute(&self.write)
                .await
                .ctx("pruning runs by count")?
                .rows_affected();
        }
        if let Some(age) = max_age {
            let cutoff = ms(now) - age.as_millis() as i64;
            let sql = format!("DELETE FROM ll_runs WHERE job = ?1 AND status NOT IN {} AND finished_at < ?2", *ACTIVE);
            deleted += sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(job)
                .bind(cutoff)
                .execute(&self.write)
                .await
                .ctx("pruning runs by age")?
                .rows_affected();
        }
        sqlx::query("DELETE FROM ll_ticks WHERE job = ?1 AND scheduled_at < ?2")
            .bind(job)
            .bind(ms(now) - TICK_KEYS_KEPT.as_millis() as i64)
            .execute(&self.write)
            .await
            .ctx("pruning ticks")?;
        Ok(deleted)
    }

    /// Checkpoints of deleted runs, consumed queue tasks, and a WAL checkpoint: it moves the
    /// WAL into the database off the hot path (the automatic checkpoint would otherwise run,
    /// with its fsync, inside whichever commit crosses the threshold: often a tick's).
    async fn housekeeping(&self) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM ll_checkpoints WHERE root_id NOT IN (SELECT coalesce(root_id, id) FROM ll_runs)")
            .execute(&self.write)
            .await
            .ctx("pruning checkpoints")?;
        sqlx::query("DELETE FROM ll_steps WHERE root_id NOT IN (SELECT coalesce(root_id, id) FROM ll_runs)")
            .execute(&self.write)
            .await
            .ctx("pruning workflow steps")?;
        sqlx::query("DELETE FROM ll_agent_calls WHERE root_id NOT IN (SELECT coalesce(root_id, id) FROM ll_runs)")
            .execute(&self.write)
            .await
            .ctx("pruning agent calls")?;
        queue::prune(&self.write).await?;
        sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&self.write).await.ctx("checkpointing the WAL")?;
        Ok(())
    }
}

/// Takes or renews a lease: ?1 name, ?2 instance, ?3 host, ?4 pid, ?5 now, ?6 lease end,
/// ?7 take over a row another instance left.
const HEARTBEAT: &str = "INSERT INTO ll_workers (name, instance, host, pid, started_at, heartbeat_at, lease_until)
     VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6)
     ON CONFLICT (name) DO UPDATE SET instance = excluded.instance, host = excluded.host, pid = excluded.pid,
         started_at = CASE WHEN ll_workers.instance = excluded.instance THEN ll_workers.started_at ELSE excluded.started_at END,
         heartbeat_at = excluded.heartbeat_at, lease_until = excluded.lease_until
     WHERE ?7 OR ll_workers.instance = excluded.instance";

/// Rows per multi-row statement: 17 columns × 1000 stays well under SQLite's 32,766 bound
/// parameters.
const ROWS_PER_STATEMENT: usize = 1000;

/// Inserts runs with one multi-row statement per [`ROWS_PER_STATEMENT`]: binding values
/// directly, no JSON to build or parse.
async fn insert_rows(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    rows: &[(String, NewRun, Dispatch<'_>)],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
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
                // NULL means "its own root" (reads coalesce): a first attempt stores no copy of its id.
                .push_bind(r.root_id.as_deref().filter(|root| *root != id.as_str()))
                .push_bind(r.snapshot.as_ref().and_then(|s| serde_json::to_string(s).ok()))
                .push_bind(worker)
                .push_bind(worker.map(|_| ms(now)));
        });
        q.build().execute(&mut **tx).await.ctx("inserting runs")?;
    }
    Ok(())
}

/// Statements that find runs by a batch of ids also test their status; `+status` keeps the
/// planner on the primary key (on the status index it walks every queued run: measured 7 ms
/// per claim with 50,000 queued).
const CLAIM: &str = concat!(
    "UPDATE ll_runs SET status = ?4, started_at = coalesce(started_at, ?3), worker = ?2, dispatched_at = coalesce(dispatched_at, ?3) \
     WHERE id IN (SELECT value FROM json_each(?1)) AND +status = ?5 RETURNING job_snapshot, started_at < ?3 AS resumed, ",
    run_cols!()
);

const MARK_DISPATCHED: &str = "UPDATE ll_runs SET dispatched_at = ?2 WHERE id IN (SELECT value FROM json_each(?1)) AND +status = ?3 AND dispatched_at IS NULL RETURNING id";

/// Claims queued runs for `worker` inside the caller's transaction and returns them with their
/// snapshots; runs no longer queued (cancelled, or already taken) are left out: the guard that
/// makes a run execute at most once.
async fn claim(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    ids: &[String],
    worker: &str,
    now: DateTime<Utc>,
) -> Result<Vec<Handed>, StoreError> {
    let rows = sqlx::query(CLAIM)
        .bind(json_ids(ids))
        .bind(worker)
        .bind(ms(now))
        .bind(RunStatus::Running.as_str())
        .bind(RunStatus::Queued.as_str())
        .fetch_all(&mut **tx)
        .await
        .ctx("claiming runs")?;
    Ok(rows.iter().map(handed_from_row).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn migrated() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("plan.db")).await.expect("open");
        store.migrate().await.expect("migrate");
        (dir, store)
    }

    /// The count of listing changes moves with another process's pause too (a second
    /// connection stands in for it), and not with a heartbeat or a tick.
    #[tokio::test]
    async fn another_process_pausing_a_job_counts_as_a_listing_change() {
        let (dir, store) = migrated().await;
        let n0 = store.listing_changes().await.expect("a count");
        let mut other =
            sqlx::ConnectOptions::connect(&SqliteConnectOptions::new().filename(dir.path().join("plan.db"))).await.expect("open");
        sqlx::query("INSERT INTO ll_job_state (job, paused) VALUES ('b', 1)").execute(&mut other).await.expect("write");
        let n1 = store.listing_changes().await.expect("a count");
        assert_ne!(n1, n0);
        sqlx::query("UPDATE ll_job_state SET last_tick = 5 WHERE job = 'b'").execute(&mut other).await.expect("a tick");
        let me = WorkerId { name: "w".into(), instance: "i".into(), host: "h".into(), pid: 1 };
        store.heartbeat(&me, Duration::from_secs(30), true, Utc::now()).await.expect("heartbeat");
        assert_eq!(store.listing_changes().await, Some(n1), "neither a tick nor a heartbeat changes a listing");
    }

    /// SQLite's plan for `sql` (parameters bound to `null`), one line per step.
    async fn plan(store: &SqliteStore, sql: &str) -> Vec<String> {
        sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
            .fetch_all(&store.pool)
            .await
            .expect("plan")
            .iter()
            .map(|r| r.get::<String, _>("detail"))
            .collect()
    }

    /// Each scheduler pass runs these; with the queue full of dispatched runs, a plan that
    /// leaves the partial index scans every one of them (measured: the 50,000-run queue
    /// drained at half speed).
    #[tokio::test]
    async fn the_scheduler_queries_read_only_undispatched_runs() {
        let (_dir, store) = migrated().await;
        for sql in [DUE_UNDISPATCHED.as_str(), NEXT_DUE.as_str()] {
            let plan = plan(&store, sql).await;
            assert!(plan.iter().any(|d| d.contains("ll_runs_undispatched")), "{sql}\n{plan:#?}");
        }
    }

    /// Batches by id go through the primary key, whatever the number of queued runs.
    #[tokio::test]
    async fn batch_statements_find_runs_by_id() {
        let (_dir, store) = migrated().await;
        for sql in [CLAIM, MARK_DISPATCHED] {
            let plan = plan(&store, sql).await;
            assert!(plan.iter().any(|d| d.contains("sqlite_autoindex_ll_runs_1 (id=?)")), "{sql}\n{plan:#?}");
        }
    }
}
