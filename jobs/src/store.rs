//! Storage: the SQLite database that holds Lamplighter's tables (see `migrations/sqlite`) and
//! apalis's queue. All SQL of the crate lives here; callers get typed values.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow, SqliteSynchronous};

use lamplighter_config::Overlap;

use crate::decide::{TickDecision, TickFacts, decide_tick};
use crate::run::{Run, RunStatus, Trigger};
use crate::target::JobSnapshot;

/// Storage failures. The message says what was being done.
#[derive(Debug, thiserror::Error)]
#[error("storage: {context}: {source}")]
pub struct StoreError {
    context: String,
    #[source]
    source: sqlx::Error,
}

trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, StoreError>;
}

impl<T> Ctx<T> for Result<T, sqlx::Error> {
    fn ctx(self, what: &str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError { context: what.to_string(), source })
    }
}

pub(crate) fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

pub(crate) fn from_ms(v: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(v).unwrap_or_default()
}

/// Persistent per-job state.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct JobState {
    pub(crate) paused: bool,
    pub(crate) pause_reason: Option<String>,
    pub(crate) paused_at: Option<DateTime<Utc>>,
    pub(crate) last_tick: Option<DateTime<Utc>>,
}

/// A run to insert.
#[derive(Debug, Clone)]
pub(crate) struct NewRun {
    pub(crate) job: String,
    pub(crate) trigger: Trigger,
    pub(crate) status: RunStatus,
    pub(crate) scheduled_at: Option<DateTime<Utc>>,
    pub(crate) due_at: DateTime<Utc>,
    pub(crate) attempt: u32,
    pub(crate) input: Option<serde_json::Value>,
    pub(crate) parameters: Option<serde_json::Value>,
    pub(crate) error: Option<String>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) retry_of: Option<String>,
    /// The run identity it continues (`None`: a new one, its own id).
    pub(crate) root_id: Option<String>,
    pub(crate) snapshot: Option<JobSnapshot>,
}

impl NewRun {
    /// The run as it is stored once inserted under `id` at `now` (queued, not yet claimed).
    pub(crate) fn to_run(&self, id: &str, now: DateTime<Utc>) -> Run {
        Run {
            id: id.to_string(),
            job: self.job.clone(),
            trigger: self.trigger,
            status: self.status,
            scheduled_at: self.scheduled_at,
            due_at: self.due_at,
            enqueued_at: now,
            started_at: None,
            finished_at: None,
            attempt: self.attempt,
            input: self.input.clone(),
            parameters: self.parameters.clone(),
            output: None,
            error: self.error.clone(),
            worker: None,
            idempotency_key: self.idempotency_key.clone(),
            root_id: self.root_id.clone().unwrap_or_else(|| id.to_string()),
            retry_of: self.retry_of.clone(),
            next_run_id: None,
            tokens_in: None,
            tokens_out: None,
            cost: None,
        }
    }

    /// The next attempt of `run`: same identity, job snapshot, tick, input and parameters,
    /// attempt + 1.
    pub(crate) fn follow_up(run: &Run, snapshot: Option<JobSnapshot>, due_at: DateTime<Utc>) -> Self {
        NewRun {
            job: run.job.clone(),
            trigger: Trigger::Retry,
            status: RunStatus::Queued,
            scheduled_at: run.scheduled_at,
            due_at,
            attempt: run.attempt + 1,
            input: run.input.clone(),
            parameters: run.parameters.clone(),
            error: None,
            idempotency_key: None,
            retry_of: Some(run.id.clone()),
            root_id: Some(run.root_id.clone()),
            snapshot,
        }
    }
}

/// Filters for listing runs; `before` is a paging cursor (a run id from a previous page).
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub job: Option<String>,
    pub status: Option<RunStatus>,
    pub limit: Option<u32>,
    pub before: Option<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct Store {
    pool: SqlitePool,
}

macro_rules! run_cols {
    () => {
        "id, job, trigger, status, scheduled_at, due_at, enqueued_at, started_at, finished_at, attempt, input, parameters, output, error, worker, idempotency_key, retry_of, next_run_id, tokens_in, tokens_out, cost, coalesce(root_id, id) AS root_id"
    };
}

fn job_state_from_row(r: &SqliteRow) -> JobState {
    JobState {
        paused: r.get::<i64, _>("paused") != 0,
        pause_reason: r.get("pause_reason"),
        paused_at: r.get::<Option<i64>, _>("paused_at").map(from_ms),
        last_tick: r.get::<Option<i64>, _>("last_tick").map(from_ms),
    }
}

fn run_from_row(r: &SqliteRow) -> Run {
    let json = |c: &str| r.get::<Option<String>, _>(c).and_then(|s| serde_json::from_str(&s).ok());
    let opt_t = |c: &str| r.get::<Option<i64>, _>(c).map(from_ms);
    Run {
        id: r.get("id"),
        job: r.get("job"),
        // Rows from a newer or damaged database read as the most cautious value, not a crash.
        trigger: Trigger::from_str(r.get::<&str, _>("trigger")).unwrap_or(Trigger::Api),
        status: RunStatus::from_str(r.get::<&str, _>("status")).unwrap_or(RunStatus::Failed),
        scheduled_at: opt_t("scheduled_at"),
        due_at: from_ms(r.get("due_at")),
        enqueued_at: from_ms(r.get("enqueued_at")),
        started_at: opt_t("started_at"),
        finished_at: opt_t("finished_at"),
        attempt: r.get::<i64, _>("attempt").max(1) as u32,
        input: json("input"),
        parameters: json("parameters"),
        output: json("output"),
        error: r.get("error"),
        worker: r.get("worker"),
        idempotency_key: r.get("idempotency_key"),
        root_id: r.get("root_id"),
        retry_of: r.get("retry_of"),
        next_run_id: r.get("next_run_id"),
        tokens_in: r.get("tokens_in"),
        tokens_out: r.get("tokens_out"),
        cost: r.get("cost"),
    }
}

/// `('queued','running',…)` for a `status IN` guard; status lists come from [`RunStatus`],
/// never from SQL text. The only dynamic SQL in the store, built from the enum's own names
/// (hence `AssertSqlSafe` where it is used).
fn status_list(statuses: impl Iterator<Item = RunStatus>) -> String {
    let names: Vec<String> = statuses.map(|s| format!("'{}'", s.as_str())).collect();
    format!("({})", names.join(","))
}

/// How many due runs one dispatch pass hands over.
pub(crate) const DUE_BATCH: usize = 2000;

/// The statuses of runs still going, as an SQL list.
static ACTIVE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| status_list(RunStatus::active()));

pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

impl Store {
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
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new().max_connections(4).connect_with(opts).await.ctx("opening the database")?;
        Ok(Self { pool })
    }

    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Applies apalis's migrations and ours. Both share sqlx's migrations table, so each
    /// ignores the other's entries.
    pub(crate) async fn migrate(&self) -> Result<(), StoreError> {
        let mut apalis = apalis_sqlite::SqliteStorage::<()>::migrations();
        apalis.set_ignore_missing(true);
        apalis.run(&self.pool).await.map_err(|e| StoreError { context: "applying queue migrations".into(), source: e.into() })?;
        let mut ours = sqlx::migrate!("../migrations/sqlite");
        ours.set_ignore_missing(true);
        ours.run(&self.pool).await.map_err(|e| StoreError { context: "applying lamplighter migrations".into(), source: e.into() })?;
        Ok(())
    }

    /// Closes every connection (rolling back anything left open), so no lock outlives the
    /// engine. Later calls fail with a storage error.
    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }

    pub(crate) async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    pub(crate) async fn job_states(&self) -> Result<HashMap<String, JobState>, StoreError> {
        let rows = sqlx::query("SELECT job, paused, pause_reason, paused_at, last_tick FROM ll_job_state")
            .fetch_all(&self.pool)
            .await
            .ctx("reading job state")?;
        Ok(rows.iter().map(|r| (r.get("job"), job_state_from_row(r))).collect())
    }

    /// One job's state; the default (never paused, never ticked) when it has none yet.
    pub(crate) async fn job_state(&self, job: &str) -> Result<JobState, StoreError> {
        let row = sqlx::query("SELECT job, paused, pause_reason, paused_at, last_tick FROM ll_job_state WHERE job = ?1")
            .bind(job)
            .fetch_optional(&self.pool)
            .await
            .ctx("reading job state")?;
        Ok(row.as_ref().map(job_state_from_row).unwrap_or_default())
    }

    pub(crate) async fn set_paused(&self, job: &str, paused: bool, reason: Option<&str>, now: DateTime<Utc>) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO ll_job_state (job, paused, pause_reason, paused_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (job) DO UPDATE SET paused = ?2, pause_reason = ?3, paused_at = ?4",
        )
        .bind(job)
        .bind(paused as i64)
        .bind(reason)
        .bind(paused.then(|| ms(now)))
        .execute(&self.pool)
        .await
        .ctx("saving pause state")?;
        Ok(())
    }

    pub(crate) async fn set_last_tick(&self, job: &str, tick: DateTime<Utc>) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO ll_job_state (job, last_tick) VALUES (?1, ?2)
             ON CONFLICT (job) DO UPDATE SET last_tick = max(coalesce(last_tick, 0), ?2)",
        )
        .bind(job)
        .bind(ms(tick))
        .execute(&self.pool)
        .await
        .ctx("saving the last tick")?;
        Ok(())
    }

    /// Records every tick of one wake in one transaction, with a fixed number of statements
    /// whatever their number: the tick keys (a tick already recorded yields `None`: it fired
    /// before), the facts `decide_tick` needs, the runs as decided, each job's last tick, and
    /// the queue tasks of runs that go through apalis. Of the runs that can start now, the
    /// first `handoff` are marked for the executors directly (the caller holds a free slot for
    /// each); the rest get a queue task in the same transaction. So a tick is never recorded
    /// without its run being queued, or the reverse.
    pub(crate) async fn fire_ticks(
        &self,
        ticks: Vec<(NewRun, Overlap)>,
        mut handoff: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<Option<TickOutcome>>, StoreError> {
        let mut tx = self.pool.begin().await.ctx("starting a tick")?;
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
        // Decide tick by tick, in order: a run this batch queued is active for the job's
        // later ticks in it (caught-up ticks queue behind each other).
        let mut out = Vec::with_capacity(ticks.len());
        let mut rows: Vec<(String, NewRun, Option<i64>)> = Vec::with_capacity(out.capacity());
        let mut pushed = Vec::new();
        let mut last_ticks: HashMap<String, i64> = HashMap::new();
        for ((mut run, policy), id) in ticks.into_iter().zip(ids) {
            if !fresh.contains(&id) {
                out.push(None);
                continue;
            }
            let tick = ms(run.scheduled_at.unwrap_or(run.due_at));
            let job_active = active.entry(run.job.clone()).or_default();
            let decision = decide_tick(&TickFacts { paused: paused.contains(&run.job), active: job_active, overlap: policy });
            let mut outcome = TickOutcome { run_id: id.clone(), status: run.status, replaced: Vec::new(), handed: None, pushed: false };
            let mut hold = false;
            match decision {
                TickDecision::Start => job_active.push(id.clone()),
                TickDecision::Hold => {
                    hold = true;
                    job_active.push(id.clone());
                }
                TickDecision::Skip(why) => {
                    run.status = RunStatus::Skipped;
                    run.error = Some(why);
                }
                TickDecision::Replace(old) => {
                    outcome.replaced = old;
                    *job_active = vec![id.clone()];
                }
            }
            outcome.status = run.status;
            let mut dispatched = None;
            if run.status == RunStatus::Queued && !hold && run.due_at <= now {
                dispatched = Some(ms(now));
                if handoff > 0 {
                    handoff -= 1;
                    outcome.handed = Some(Handed { run: run.to_run(&id, now), snapshot: run.snapshot.clone() });
                } else {
                    outcome.pushed = true;
                    pushed.push(id.clone());
                }
            }
            let lt = last_ticks.entry(run.job.clone()).or_insert(tick);
            *lt = (*lt).max(tick);
            rows.push((id, run, dispatched));
            out.push(Some(outcome));
        }
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
        push_tasks(&mut tx, &pushed).await?;
        tx.commit().await.ctx("committing ticks")?;
        Ok(out)
    }

    /// Inserts a run (manual trigger, retry). With an idempotency key that was used before for
    /// the job, returns the existing run's id and `false`.
    pub(crate) async fn insert_run(&self, run: NewRun, now: DateTime<Utc>) -> Result<(String, bool), StoreError> {
        let mut tx = self.pool.begin().await.ctx("starting an insert")?;
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
        insert_rows(&mut tx, &[(id.clone(), run.clone(), None)], now).await?;
        if let Some(prev) = &run.retry_of {
            sqlx::query("UPDATE ll_runs SET next_run_id = ?1 WHERE id = ?2")
                .bind(&id)
                .bind(prev)
                .execute(&mut *tx)
                .await
                .ctx("linking a retry")?;
        }
        tx.commit().await.ctx("committing a run")?;
        Ok((id, true))
    }

    /// Queued runs that are due and not handed to the queue yet, oldest first.
    pub(crate) async fn due_undispatched(&self, now: DateTime<Utc>) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query("SELECT id, job FROM ll_runs WHERE status = ?2 AND dispatched_at IS NULL AND due_at <= ?1 ORDER BY due_at, enqueued_at LIMIT ?3")
            .bind(ms(now))
            .bind(RunStatus::Queued.as_str())
            .bind(DUE_BATCH as i64)
            .fetch_all(&self.pool)
            .await
            .ctx("reading due runs")?;
        Ok(rows.iter().map(|r| (r.get("id"), r.get("job"))).collect())
    }

    /// The earliest due instant of an undispatched queued run.
    pub(crate) async fn next_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let v: Option<i64> = sqlx::query_scalar("SELECT min(due_at) FROM ll_runs WHERE status = ?1 AND dispatched_at IS NULL")
            .bind(RunStatus::Queued.as_str())
            .fetch_one(&self.pool)
            .await
            .ctx("reading the next due run")?;
        Ok(v.map(from_ms))
    }

    /// True when the job has a run handed to the queue and not finished (for `overlap: queue`).
    pub(crate) async fn has_dispatched_active(&self, job: &str) -> Result<bool, StoreError> {
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

    /// Marks due queued runs dispatched, in one transaction: `handed` go to the executors
    /// directly (the caller holds a slot for each), `queued` get an apalis task. Returns the
    /// handed runs that were still undispatched (another caller may have taken some since
    /// they were read); only those may be submitted.
    pub(crate) async fn dispatch_many(&self, handed: &[String], queued: &[String], now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        let mut tx = self.pool.begin().await.ctx("starting a dispatch")?;
        let mark =
            "UPDATE ll_runs SET dispatched_at = ?2 WHERE id IN (SELECT value FROM json_each(?1)) AND dispatched_at IS NULL RETURNING id";
        let marked: Vec<String> = sqlx::query_scalar(mark)
            .bind(serde_json::to_string(handed).unwrap_or_default())
            .bind(ms(now))
            .fetch_all(&mut *tx)
            .await
            .ctx("marking runs dispatched")?;
        let to_push: Vec<String> = sqlx::query_scalar(mark)
            .bind(serde_json::to_string(queued).unwrap_or_default())
            .bind(ms(now))
            .fetch_all(&mut *tx)
            .await
            .ctx("marking runs dispatched")?;
        push_tasks(&mut tx, &to_push).await?;
        tx.commit().await.ctx("committing a dispatch")?;
        Ok(marked)
    }

    /// Makes runs that were marked dispatched but never claimed (the claim failed) dispatchable
    /// again.
    pub(crate) async fn undispatch(&self, ids: &[String]) -> Result<(), StoreError> {
        sqlx::query("UPDATE ll_runs SET dispatched_at = NULL WHERE id IN (SELECT value FROM json_each(?1)) AND status = ?2")
            .bind(serde_json::to_string(ids).unwrap_or_default())
            .bind(RunStatus::Queued.as_str())
            .execute(&self.pool)
            .await
            .ctx("re-queueing runs")?;
        Ok(())
    }

    /// Takes queued runs for this worker in one statement and returns the ids it took; runs
    /// no longer queued (cancelled, or already taken) are left out: the guard that makes a run
    /// execute at most once.
    pub(crate) async fn claim_many(&self, ids: &[String], worker: &str, now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar(
            "UPDATE ll_runs SET status = ?4, started_at = ?3, worker = ?2 WHERE id IN (SELECT value FROM json_each(?1)) AND status = ?5 RETURNING id",
        )
        .bind(serde_json::to_string(ids).unwrap_or_default())
        .bind(worker)
        .bind(ms(now))
        .bind(RunStatus::Running.as_str())
        .bind(RunStatus::Queued.as_str())
        .fetch_all(&self.pool)
        .await
        .ctx("claiming runs")
    }

    /// Runs with their job snapshots, by id (for runs claimed without them in hand).
    pub(crate) async fn runs_to_execute(&self, ids: &[String]) -> Result<Vec<(Run, Option<JobSnapshot>)>, StoreError> {
        let rows =
            sqlx::query(concat!("SELECT job_snapshot, ", run_cols!(), " FROM ll_runs WHERE id IN (SELECT value FROM json_each(?1))"))
                .bind(serde_json::to_string(ids).unwrap_or_default())
                .fetch_all(&self.pool)
                .await
                .ctx("reading claimed runs")?;
        // A snapshot that does not parse (a damaged row) reads as none: the run then uses the
        // config in force, as rows from before snapshots do.
        Ok(rows
            .iter()
            .map(|r| {
                let snapshot = r.get::<Option<String>, _>("job_snapshot").and_then(|s| serde_json::from_str(&s).ok());
                (run_from_row(r), snapshot)
            })
            .collect())
    }

    /// Records the end of runs this worker claimed, in one statement. Returns the ids that
    /// were still running (a run cancelled meanwhile keeps its first end).
    pub(crate) async fn finish_many(&self, ends: &[RunEnd<'_>], now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        debug_assert!(ends.iter().all(|e| RunStatus::Running.can_become(e.status)));
        let payload: Vec<serde_json::Value> = ends
            .iter()
            .map(|e| {
                serde_json::json!({
                    "id": e.id, "started_at": e.started_at.map(ms), "status": e.status.as_str(),
                    "output": e.output.map(|o| o.to_string()), "error": e.error,
                })
            })
            .collect();
        // `+ll_runs.status` keeps the planner off the status index: it must drive the update
        // from the batch and find each run by id (driven from the status index, the batch was
        // scanned once per running run: seconds for a thousand ends).
        let done: Vec<String> = sqlx::query_scalar(
            "UPDATE ll_runs SET status = j.status, output = j.output, error = j.error, finished_at = ?2,
                                started_at = coalesce(j.started_at, ll_runs.started_at)
             FROM (SELECT value ->> 'id' AS id, value ->> 'started_at' AS started_at, value ->> 'status' AS status,
                          value ->> 'output' AS output, value ->> 'error' AS error FROM json_each(?1)) AS j
             WHERE ll_runs.id = j.id AND +ll_runs.status = ?3 RETURNING ll_runs.id",
        )
        .bind(serde_json::Value::from(payload).to_string())
        .bind(ms(now))
        .bind(RunStatus::Running.as_str())
        .fetch_all(&self.pool)
        .await
        .ctx("finishing runs")?;
        Ok(done)
    }

    /// Records the end of a running run. False when it was not running any more.
    pub(crate) async fn finish(
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
        let n = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(status.as_str())
            .bind(output.map(|o| o.to_string()))
            .bind(error)
            .bind(ms(now))
            .execute(&self.pool)
            .await
            .ctx("finishing a run")?
            .rows_affected();
        Ok(n == 1)
    }

    /// A run's stored job snapshot (for its follow-up attempt).
    pub(crate) async fn snapshot(&self, id: &str) -> Result<Option<JobSnapshot>, StoreError> {
        let v: Option<Option<String>> = sqlx::query_scalar("SELECT job_snapshot FROM ll_runs WHERE id = ?1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .ctx("reading a run's job snapshot")?;
        Ok(v.flatten().and_then(|s| serde_json::from_str(&s).ok()))
    }

    pub(crate) async fn checkpoint(&self, root_id: &str, step: &str) -> Result<Option<serde_json::Value>, StoreError> {
        let v: Option<String> = sqlx::query_scalar("SELECT value FROM ll_checkpoints WHERE root_id = ?1 AND step = ?2")
            .bind(root_id)
            .bind(step)
            .fetch_optional(&self.pool)
            .await
            .ctx("reading a checkpoint")?;
        Ok(v.and_then(|s| serde_json::from_str(&s).ok()))
    }

    pub(crate) async fn record_checkpoint(
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
        .execute(&self.pool)
        .await
        .ctx("recording a checkpoint")?;
        Ok(())
    }

    pub(crate) async fn get_run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        let row = sqlx::query(concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE id = ?1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .ctx("reading a run")?;
        Ok(row.as_ref().map(run_from_row))
    }

    /// Runs, newest first, with paging by cursor.
    pub(crate) async fn list_runs(&self, f: &RunFilter) -> Result<Vec<Run>, StoreError> {
        let limit = f.limit.unwrap_or(50).clamp(1, 1000) as i64;
        let rows = sqlx::query(concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE (?1 IS NULL OR job = ?1) AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR id < ?3) ORDER BY id DESC LIMIT ?4"))
        .bind(&f.job)
        .bind(f.status.map(RunStatus::as_str))
        .bind(&f.before)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .ctx("listing runs")?;
        Ok(rows.iter().map(run_from_row).collect())
    }

    pub(crate) async fn counts(&self, job: &str) -> Result<HashMap<RunStatus, u64>, StoreError> {
        let rows = sqlx::query("SELECT status, count(*) AS n FROM ll_runs WHERE job = ?1 GROUP BY status")
            .bind(job)
            .fetch_all(&self.pool)
            .await
            .ctx("counting runs")?;
        Ok(rows.iter().filter_map(|r| Some((RunStatus::from_str(r.get::<&str, _>("status")).ok()?, r.get::<i64, _>("n") as u64))).collect())
    }

    /// The latest run of every job, for listings.
    pub(crate) async fn last_runs(&self) -> Result<HashMap<String, Run>, StoreError> {
        let rows = sqlx::query(concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE id IN (SELECT max(id) FROM ll_runs GROUP BY job)"))
            .fetch_all(&self.pool)
            .await
            .ctx("reading last runs")?;
        Ok(rows.iter().map(run_from_row).map(|r| (r.job.clone(), r)).collect())
    }

    pub(crate) async fn queue_depth(&self) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM ll_runs WHERE status = ?1")
            .bind(RunStatus::Queued.as_str())
            .fetch_one(&self.pool)
            .await
            .ctx("counting queued runs")?;
        Ok(n as u64)
    }

    /// After an unclean stop: runs left `running` become `interrupted`, and queued runs that
    /// were handed to the old queue are handed again. Only called with the database lock held,
    /// so no other process can be running anything: every `running` run is an orphan, whatever
    /// worker name it carries (a restart under a configured `worker.name` has the same name).
    /// Returns the interrupted runs.
    pub(crate) async fn recover(&self, now: DateTime<Utc>) -> Result<Vec<Run>, StoreError> {
        let rows = sqlx::query(concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE status = ?1"))
            .bind(RunStatus::Running.as_str())
            .fetch_all(&self.pool)
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
                .execute(&self.pool)
                .await
                .ctx("marking a run interrupted")?;
        }
        sqlx::query("UPDATE ll_runs SET dispatched_at = NULL WHERE status = ?1")
            .bind(RunStatus::Queued.as_str())
            .execute(&self.pool)
            .await
            .ctx("re-queueing runs")?;
        Ok(runs)
    }

    /// Interrupted runs that nobody has followed up with a retry yet.
    pub(crate) async fn interrupted_without_follow_up(&self) -> Result<Vec<Run>, StoreError> {
        let rows = sqlx::query(concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE status = 'interrupted' AND next_run_id IS NULL"))
            .fetch_all(&self.pool)
            .await
            .ctx("reading interrupted runs")?;
        Ok(rows.iter().map(run_from_row).collect())
    }

    pub(crate) async fn mark_no_follow_up(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE ll_runs SET next_run_id = '' WHERE id = ?1")
            .bind(id)
            .execute(&self.pool)
            .await
            .ctx("closing an interrupted run")?;
        Ok(())
    }

    /// Deletes finished runs of a job beyond its retention (count and age), and its old tick keys.
    pub(crate) async fn prune(
        &self,
        job: &str,
        keep: Option<u32>,
        max_age: Option<Duration>,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
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
                .execute(&self.pool)
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
                .execute(&self.pool)
                .await
                .ctx("pruning runs by age")?
                .rows_affected();
        }
        // Tick records only guard against firing twice near now.
        sqlx::query("DELETE FROM ll_ticks WHERE job = ?1 AND scheduled_at < ?2")
            .bind(job)
            .bind(ms(now) - 8 * 24 * 3600 * 1000)
            .execute(&self.pool)
            .await
            .ctx("pruning ticks")?;
        Ok(deleted)
    }

    /// Moves the WAL into the database off the hot path (the automatic checkpoint would
    /// otherwise run, with its fsync, inside whichever commit crosses the threshold: often a
    /// tick's).
    pub(crate) async fn checkpoint_wal(&self) -> Result<(), StoreError> {
        sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&self.pool).await.ctx("checkpointing the WAL")?;
        Ok(())
    }

    /// What pruning of single jobs leaves behind: steps of deleted runs, and finished queue
    /// tasks (apalis keeps them forever; the runs table is the history).
    pub(crate) async fn prune_shared(&self) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM ll_checkpoints WHERE root_id NOT IN (SELECT coalesce(root_id, id) FROM ll_runs)")
            .execute(&self.pool)
            .await
            .ctx("pruning checkpoints")?;
        sqlx::query("DELETE FROM Jobs WHERE job_type = ?1 AND status IN ('Done','Killed','Failed')")
            .bind(crate::executor::QUEUE)
            .execute(&self.pool)
            .await
            .ctx("pruning the queue")?;
        Ok(())
    }
}

/// Pushes one apalis task per run id inside the caller's transaction (one multi-row insert).
/// A new task id per hand-over: after a crash the old task may still sit locked by the dead
/// worker; the claim runs the run once.
async fn push_tasks(tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>, ids: &[String]) -> Result<(), StoreError> {
    use apalis::prelude::{TaskBuilder, TaskId};
    if ids.is_empty() {
        return Ok(());
    }
    let mut tasks: Vec<apalis_sqlite::SqliteTask> = Vec::with_capacity(ids.len());
    for id in ids {
        let args = serde_json::to_vec(&crate::executor::RunTask { run_id: id.clone() })
            .map_err(|e| StoreError { context: "encoding a queue task".into(), source: sqlx::Error::Protocol(e.to_string()) })?;
        tasks.push(TaskBuilder::new(args).task_id(TaskId::from_ulid(ulid::Ulid::generate())).max_attempts(1).build());
    }
    apalis_sqlite::queries::push_tasks(&mut **tx, crate::executor::QUEUE, &tasks).await.map_err(|e| StoreError {
        context: "pushing to the queue".into(),
        source: match e {
            apalis_sqlite::Error::Database(e) => e,
            other => sqlx::Error::Protocol(other.to_string()),
        },
    })
}

/// The end of one claimed run, for [`Store::finish_many`].
#[derive(Debug, Clone)]
pub(crate) struct RunEnd<'a> {
    pub(crate) id: &'a str,
    /// When the target was called; the claim's instant stays when there is none.
    pub(crate) started_at: Option<DateTime<Utc>>,
    pub(crate) status: RunStatus,
    pub(crate) output: Option<&'a serde_json::Value>,
    pub(crate) error: Option<&'a str>,
}

/// Rows per multi-row statement: 17 columns × 1000 stays well under SQLite's 32,766 bound
/// parameters.
const ROWS_PER_STATEMENT: usize = 1000;

/// Inserts runs (id, run, dispatched at) with one multi-row statement per
/// [`ROWS_PER_STATEMENT`]: binding values directly, no JSON to build or parse.
async fn insert_rows(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    rows: &[(String, NewRun, Option<i64>)],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
            "INSERT INTO ll_runs (id, job, trigger, status, scheduled_at, due_at, enqueued_at, dispatched_at, attempt, input, parameters, \
             error, idempotency_key, retry_of, finished_at, root_id, job_snapshot) ",
        );
        q.push_values(chunk, |mut b, (id, r, dispatched_at)| {
            b.push_bind(id.as_str())
                .push_bind(r.job.as_str())
                .push_bind(r.trigger.as_str())
                .push_bind(r.status.as_str())
                .push_bind(r.scheduled_at.map(ms))
                .push_bind(ms(r.due_at))
                .push_bind(ms(now))
                .push_bind(*dispatched_at)
                .push_bind(i64::from(r.attempt))
                .push_bind(r.input.as_ref().map(|v| v.to_string()))
                .push_bind(r.parameters.as_ref().map(|v| v.to_string()))
                .push_bind(r.error.as_deref())
                .push_bind(r.idempotency_key.as_deref())
                .push_bind(r.retry_of.as_deref())
                .push_bind(r.status.is_final().then(|| ms(now)))
                // NULL means "its own root" (reads coalesce): a first attempt stores no copy of its id.
                .push_bind(r.root_id.as_deref().filter(|root| *root != id.as_str()))
                .push_bind(r.snapshot.as_ref().and_then(|s| serde_json::to_string(s).ok()));
        });
        q.build().execute(&mut **tx).await.ctx("inserting runs")?;
    }
    Ok(())
}

/// A run handed to the executors with what they need to run it, so the claim does not read
/// it back.
#[derive(Debug, Clone)]
pub(crate) struct Handed {
    pub(crate) run: Run,
    pub(crate) snapshot: Option<JobSnapshot>,
}

/// The result of a recorded tick.
#[derive(Debug, Clone)]
pub(crate) struct TickOutcome {
    pub(crate) run_id: String,
    pub(crate) status: RunStatus,
    /// Runs to cancel because the job's overlap policy is `replace`.
    pub(crate) replaced: Vec<String>,
    /// The run, when it goes to the executors directly (the caller holds its slot).
    pub(crate) handed: Option<Handed>,
    /// The run went to the apalis queue in the same transaction.
    pub(crate) pushed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick_run(job: &str, at: DateTime<Utc>) -> NewRun {
        NewRun {
            job: job.into(),
            trigger: Trigger::Cron,
            status: RunStatus::Queued,
            scheduled_at: Some(at),
            due_at: at,
            attempt: 1,
            input: None,
            parameters: None,
            error: None,
            idempotency_key: None,
            retry_of: None,
            root_id: None,
            snapshot: None,
        }
    }

    #[tokio::test]
    async fn a_tick_fires_once_even_when_a_batch_repeats_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("t.db")).await.expect("open");
        store.migrate().await.expect("migrate");
        let t = DateTime::from_timestamp(1_800_000_000, 0).expect("instant");
        let first =
            store.fire_ticks(vec![(tick_run("a", t), Overlap::Allow), (tick_run("b", t), Overlap::Allow)], 0, t).await.expect("fire");
        assert!(first.iter().all(Option::is_some));
        // The same ticks again, mixed with a new one: only the new one fires (the insert's
        // count is short, so the store looks up which keys are its own).
        let t2 = t + chrono::Duration::seconds(1);
        let again = store
            .fire_ticks(
                vec![(tick_run("a", t), Overlap::Allow), (tick_run("a", t2), Overlap::Allow), (tick_run("b", t), Overlap::Allow)],
                0,
                t2,
            )
            .await
            .expect("fire again");
        assert_eq!(again.iter().map(Option::is_some).collect::<Vec<_>>(), [false, true, false]);
        let runs = store.list_runs(&RunFilter { limit: Some(10), ..Default::default() }).await.expect("list");
        assert_eq!(runs.len(), 3, "{runs:#?}");
        // Pushed (no slot was offered), and each job's last tick is the newest.
        assert!(again[1].as_ref().is_some_and(|o| o.pushed && o.handed.is_none()));
        assert_eq!(store.job_state("a").await.expect("state").last_tick, Some(t2));
    }
}
