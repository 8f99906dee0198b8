//! Storage: what the run core asks of a database, one trait per concern, each in its own file
//! and implemented once for every backend ([`dialect::Dialect`]): [`Ticks`], [`JobStates`],
//! [`Handover`], [`Ends`], [`Records`], [`Leases`], [`Notices`], [`Deadlines`], [`Missed`], [`Definitions`],
//! [`Listings`], [`Upkeep`]. Each part of the engine is handed only the traits it uses;
//! [`RunStore`] is all of them, for the composition root and the contract suite. Everything
//! here is typed: runs, statuses and outcomes go in and come out as
//! the domain types of [`crate::run`], and no scheduling policy lives in SQL — the tick
//! decision is [`crate::decide::decide_tick`], called by the store inside its transaction, and
//! every status list is built from [`RunStatus`].
//!
//! A backend is one unit, in a folder of its own with its SQL, its apalis adapter and what else
//! it needs; nothing outside it names its types. [`open`] is the one place that chooses one
//! from the config, and returns everything it provides as a [`Backend`].
//!
//! - [`sqlite`]: the embedded backend (one worker per database file, held by a file lock).
//! - [`postgres`]: the shared backend (any number of workers; leases, `LISTEN`/`NOTIFY`).
//! - `contract` (tests only): the suite every implementation must pass.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};

pub(crate) use crate::definitions::{ChangeRequest, Changed, JobChangeRecord, Refused, StoredJob};
pub(crate) use crate::intake::{Claim, Dispatch, Handed, NewRun, TickOutcome};
pub(crate) use lamplighter_contract::RunBrief;
pub use lamplighter_contract::WorkerLease;

use crate::run::{RunStatus, StepRecord, StepStatus, Transitions, Trigger};

#[cfg(test)]
mod contract;
mod deadlines;
mod definitions;
pub(crate) mod dialect;
mod ends;
mod handover;
mod job_state;
mod leases;
mod listings;
mod missed;
mod notices;
mod postgres;
mod records;
mod scripts;
mod sqlite;
mod ticks;
mod upkeep;

pub(crate) use deadlines::Deadlines;
pub(crate) use definitions::Definitions;
pub(crate) use ends::Ends;
pub(crate) use handover::{Due, Handover, LimitPass};
pub(crate) use job_state::JobStates;
pub(crate) use leases::Leases;
pub(crate) use listings::{Listings, WAITING_SHOWN};
pub(crate) use missed::Missed;
pub(crate) use notices::Notices;
pub(crate) use records::Records;
pub(crate) use ticks::Ticks;
pub(crate) use upkeep::{Retain, Upkeep};

/// Which backend a worker runs on: named in the status answer, and what the engine may rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StorageKind {
    Sqlite = 0,
    Postgres = 1,
}

impl StorageKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }

    /// Several workers share the database, so a live worker takes over the runs of a worker
    /// whose lease ran out. (On SQLite the file lock serves one worker: every run left
    /// `running` is an orphan at start, and there is nobody else to take over from.)
    pub(crate) fn takes_over_from_others(self) -> bool {
        self == Self::Postgres
    }
}

/// Everything a backend provides to a worker: the store (migrated), the signals between the
/// engine's parts (and, on a shared database, between workers), and what keeps the database
/// this worker's while it lives (SQLite's file lock).
pub(crate) struct Backend {
    pub(crate) store: std::sync::Arc<dyn RunStore>,
    pub(crate) signals: std::sync::Arc<dyn crate::signals::Signals>,
    pub(crate) lock: Option<std::fs::File>,
    pub(crate) kind: StorageKind,
}

/// Why storage could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another worker holds the database (SQLite).
    #[error("{0}")]
    Locked(String),
}

/// Opens the configured storage for worker `worker`: locked where the backend serves one
/// worker, migrated, its signals listening (until `stop`).
pub(crate) async fn open(
    config: &lamplighter_config::StorageConfig,
    worker: &str,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<Backend, OpenError> {
    use lamplighter_config::StorageConfig;
    match config {
        StorageConfig::Sqlite { path } => sqlite::backend(path).await,
        StorageConfig::Postgres { url, pool_size, statement_timeout } => {
            postgres::backend(url.expose(), *pool_size, *statement_timeout, worker, stop).await
        }
    }
}

/// Applies the configured storage's migrations and closes it, starting nothing
/// (`lamplighter migrate`). Returns where: the SQLite file, or the PostgreSQL URL without its
/// password.
pub(crate) async fn migrate(config: &lamplighter_config::StorageConfig) -> Result<String, StoreError> {
    use lamplighter_config::StorageConfig;
    let (store, place): (Box<dyn RunStore>, String) = match config {
        StorageConfig::Sqlite { path } => (Box::new(sqlite::SqliteStore::open(path).await?), path.display().to_string()),
        StorageConfig::Postgres { url, pool_size, statement_timeout } => (
            Box::new(postgres::PgStore::connect(url.expose(), *pool_size, *statement_timeout).await?),
            lamplighter_config::mask_url_password(url.expose()).unwrap_or_else(|| url.expose().to_string()),
        ),
    };
    store.migrate().await?;
    store.close().await;
    Ok(place)
}

/// A consistent copy of a live SQLite database at `to` (a new file), taken while the worker
/// runs: one read transaction (`VACUUM INTO`), so it holds every commit before it and none
/// after. PostgreSQL has its own tools for this; the error says which.
pub(crate) async fn backup(config: &lamplighter_config::StorageConfig, to: &std::path::Path) -> Result<u64, BackupError> {
    use lamplighter_config::StorageConfig;
    match config {
        StorageConfig::Sqlite { path } => {
            if !path.exists() {
                return Err(BackupError::Refused(format!("there is no database at {} to back up", path.display())));
            }
            if to.exists() {
                return Err(BackupError::Refused(format!("{} exists; back up into a new file", to.display())));
            }
            Ok(sqlite::backup(path, to).await?)
        }
        StorageConfig::Postgres { .. } => Err(BackupError::Refused(
            "the database is PostgreSQL: back it up with its own tools (pg_dump for a logical copy, pg_basebackup or your \
             provider's snapshots for a physical one); see README \"Back up and restore\""
                .into(),
        )),
    }
}

/// Why a backup was not made.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Storage failures, decided where they arise ([`StoreError::new`] classifies the driver's
/// error once): callers match the variant, never the message. Each says what was being done.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The fence refused a write for run `run`: this worker no longer holds it (its lease ran
    /// out, or another worker took the run over).
    #[error(
        "storage: recording for run {run}: this worker no longer holds the run: its lease ran out or another worker took the run over; the write is refused"
    )]
    Fenced { run: String },
    /// The database cannot be reached for now (a connection lost, a server restarting, no
    /// connection free in time): it may answer again by itself.
    #[error("storage: {context}: {source}")]
    Transient {
        context: String,
        #[source]
        source: sqlx::Error,
    },
    /// The storage itself refuses: full, read-only, failing I/O, gone or damaged. It heals from
    /// outside (space freed, the file system repaired); meanwhile the worker is not ready.
    #[error("storage: {context}: {source}")]
    Fault {
        context: String,
        fault: StorageFault,
        #[source]
        source: sqlx::Error,
    },
    /// A unique constraint refused the write: another writer got there first.
    #[error("storage: {context}: {source}")]
    Conflict {
        context: String,
        #[source]
        source: sqlx::Error,
    },
    /// Anything else: a bug, or a database in a state this version does not know.
    #[error("storage: {context}: {source}")]
    Other {
        context: String,
        #[source]
        source: sqlx::Error,
    },
}

/// What is wrong with the storage itself ([`StoreError::Fault`]), as its backend reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFault {
    /// The disk is full (SQLite `SQLITE_FULL`, PostgreSQL SQLSTATE 53100).
    Full { server: bool },
    /// Writes are refused: a read-only file or file system (SQLite `SQLITE_READONLY`), a
    /// read-only server (PostgreSQL 25006).
    ReadOnly { server: bool },
    /// Reads or writes fail (SQLite `SQLITE_IOERR`).
    Io,
    /// The database file cannot be opened (SQLite `SQLITE_CANTOPEN`).
    CannotOpen,
    /// The database file is damaged (SQLite `SQLITE_CORRUPT`).
    Damaged,
}

impl std::fmt::Display for StorageFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

impl StorageFault {
    /// Why the worker is not ready, for `/readyz`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Full { server: true } => "the database server's disk is full",
            Self::Full { server: false } => "the disk is full (SQLITE_FULL)",
            Self::ReadOnly { server: true } => "the database server is read-only",
            Self::ReadOnly { server: false } => "the database is read-only (SQLITE_READONLY)",
            Self::Io => "the database cannot be read or written (SQLITE_IOERR)",
            Self::CannotOpen => "the database file cannot be opened (SQLITE_CANTOPEN)",
            Self::Damaged => "the database file is damaged (SQLITE_CORRUPT)",
        }
    }

    /// The fault a driver's error reports, if it reports one.
    fn of(source: &sqlx::Error) -> Option<Self> {
        let db = source.as_database_error()?;
        if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_none() {
            // PostgreSQL's SQLSTATE.
            return match db.code()?.as_ref() {
                "53100" => Some(Self::Full { server: true }),
                "25006" => Some(Self::ReadOnly { server: true }),
                _ => None,
            };
        }
        // SQLite's result codes: the primary code is the low byte of an extended one.
        let code: i64 = db.code()?.parse().ok()?;
        match code & 0xff {
            13 => Some(Self::Full { server: false }),
            8 => Some(Self::ReadOnly { server: false }),
            10 => Some(Self::Io),
            14 => Some(Self::CannotOpen),
            11 => Some(Self::Damaged),
            _ => None,
        }
    }
}

impl StoreError {
    /// The error of `source` while doing `context`, classified: the one place that reads the
    /// driver's errors.
    pub(crate) fn new(context: impl Into<String>, source: sqlx::Error) -> Self {
        let context = context.into();
        if let Some(fault) = StorageFault::of(&source) {
            return Self::Fault { context, fault, source };
        }
        if source.as_database_error().is_some_and(|e| e.is_unique_violation()) {
            return Self::Conflict { context, source };
        }
        let unreachable = match &source {
            sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => true,
            sqlx::Error::Database(db) => db.code().is_some_and(|c| c.starts_with("08") || c.starts_with("57P0")),
            _ => false,
        };
        if unreachable { Self::Transient { context, source } } else { Self::Other { context, source } }
    }

    /// A write for run `run` that the fence refused.
    pub(crate) fn fenced(run: &str) -> Self {
        Self::Fenced { run: run.to_owned() }
    }

    /// A unique constraint refused the write (another writer got there first).
    pub(crate) fn is_unique_violation(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }

    /// A failure that may heal by itself: the storage refusing writes ([`StoreError::Fault`]),
    /// or the database unreachable for now ([`StoreError::Transient`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient { .. } | Self::Fault { .. })
    }

    /// The fence refused the write ([`StoreError::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Fenced { .. })
    }

    /// What is wrong with the storage itself, when that is what failed.
    pub fn fault(&self) -> Option<StorageFault> {
        match self {
            Self::Fault { fault, .. } => Some(*fault),
            _ => None,
        }
    }
}

/// The apalis queue name (otherwise it would be the Rust type path). Runs that cannot start at
/// once wait in the queue as tasks that carry only the run id; the `ll_runs` row stays the
/// truth about the run. Each backend's adapter (`sqlite/queue.rs`, `postgres/queue.rs`) pushes
/// tasks inside the transaction that makes a run due, and takes them inside the claim.
pub(crate) const QUEUE: &str = "lamplighter-runs";

/// What travels through the queue: only the run id; the run row holds the rest.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct RunTask {
    pub(crate) run_id: String,
}

impl RunTask {
    /// The payload of run `id`'s task.
    pub(crate) fn encode(id: &str) -> Result<Vec<u8>, StoreError> {
        serde_json::to_vec(&RunTask { run_id: id.to_owned() })
            .map_err(|e| StoreError::new("encoding a queue task", sqlx::Error::Protocol(e.to_string())))
    }

    /// The run ids of taken tasks' payloads. A payload that does not decode cannot name its
    /// run: it is dropped (logged). Its run, still queued and handed over, is handed over again
    /// by recovery on SQLite; on PostgreSQL it stays queued.
    pub(crate) fn run_ids<'p>(payloads: impl Iterator<Item = &'p [u8]>) -> Vec<String> {
        payloads
            .filter_map(|p| match serde_json::from_slice::<RunTask>(p) {
                Ok(task) => Some(task.run_id),
                Err(e) => {
                    tracing::error!(error = %e, "a queue task does not decode; dropped");
                    None
                }
            })
            .collect()
    }
}

/// A storage error's context: `result.ctx("reading job state")`.
pub(crate) trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, StoreError>;
}

impl<T> Ctx<T> for Result<T, sqlx::Error> {
    fn ctx(self, what: &str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::new(what, source))
    }
}

/// SQL text with its status values filled in from the enums: `{Queued}` (a [`RunStatus`], by
/// variant name) and `{step:Running}` (a [`StepStatus`]) become the quoted names the store
/// writes, so no status is spelled in SQL, and every statement keeps the literal its partial
/// indexes were written for. A placeholder naming no variant is left as it is, which the
/// database refuses, and `statuses_in_sql_come_from_the_enums` finds in the source first.
/// Call sites use [`sql!`], which does this once per statement.
pub(crate) fn fill_statuses(text: &str) -> String {
    static NAMES: std::sync::LazyLock<Vec<(String, String)>> = std::sync::LazyLock::new(|| {
        let runs = RunStatus::ALL.into_iter().map(|s| (format!("{{{s:?}}}"), format!("'{}'", s.as_str())));
        let steps = crate::run::StepStatus::ALL.into_iter().map(|s| (format!("{{step:{s:?}}}"), format!("'{}'", s.as_str())));
        runs.chain(steps).collect()
    });
    let mut out = text.to_owned();
    for (placeholder, name) in NAMES.iter() {
        if out.contains(placeholder.as_str()) {
            out = out.replace(placeholder.as_str(), name);
        }
    }
    out
}

/// What the open (running or waiting) steps of a run that ended `status` become: a run that
/// did not succeed closes them, `interrupted` when it was, otherwise `cancelled`.
pub(crate) fn steps_closed_by(status: RunStatus) -> Option<StepStatus> {
    match status {
        RunStatus::Interrupted => Some(StepStatus::Interrupted),
        s if s.is_final() && s != RunStatus::Succeeded => Some(StepStatus::Cancelled),
        _ => None,
    }
}

/// The names of `statuses`, quoted and in parentheses, for a `status IN` guard.
pub(crate) fn status_list(statuses: impl Iterator<Item = RunStatus>) -> String {
    let names: Vec<String> = statuses.map(|s| format!("'{}'", s.as_str())).collect();
    format!("({})", names.join(","))
}

/// `{cancel_wins}`: the end `j.status` of a run whose cancel was asked for (`ll_runs.cancel_requested`)
/// is recorded as the cancel instead: [`crate::decide::end_with_cancel`], as SQL over the
/// statuses it turns into `cancelled`.
pub(crate) static CANCEL_WINS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let cancelled = RunStatus::ALL.into_iter().filter(|s| {
        let recorded = crate::decide::end_with_cancel(*s, true);
        assert!(recorded == *s || recorded == RunStatus::Cancelled, "a cancel turns {s:?} into {recorded:?}: not SQL's CASE");
        recorded == RunStatus::Cancelled && *s != RunStatus::Cancelled
    });
    format!("(ll_runs.cancel_requested IS NOT NULL AND j.status IN {})", status_list(cancelled))
});

/// The statuses of runs still going, as an SQL list.
pub(crate) static ACTIVE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| status_list(RunStatus::active()));

pub(crate) fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

pub(crate) fn from_ms(v: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(v).unwrap_or_default()
}

pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// How many due runs one dispatch pass hands over.
pub(crate) const DUE_BATCH: usize = 2000;

/// How long a tick's key (`job`, scheduled instant) is kept after the tick. The scheduler never
/// plans a tick at or before a job's stored last tick, so the key only matters when a clock is
/// stepped back (or, on a shared database, runs behind another worker's): within this window a
/// tick still fires once. Bounded, because at one tick a second per job the keys add up (a
/// thousand such jobs would keep 3.6 million rows for one hour).
pub(crate) const TICK_KEYS_KEPT: Duration = Duration::from_secs(3600);

/// Persistent per-job state.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct JobState {
    pub(crate) paused: bool,
    pub(crate) pause_reason: Option<String>,
    pub(crate) paused_at: Option<DateTime<Utc>>,
    pub(crate) last_tick: Option<DateTime<Utc>>,
}

/// A run's brief as both backends read it: id, status, trigger, enqueued, finished.
pub(crate) type BriefRow = (String, String, String, i64, Option<i64>);

/// A brief from its columns (an unknown status or trigger reads as `run_from_row` reads it).
pub(crate) fn brief((id, status, trigger, enqueued_at, finished_at): BriefRow) -> RunBrief {
    use std::str::FromStr;
    RunBrief {
        id,
        status: RunStatus::from_str(&status).unwrap_or(RunStatus::Failed),
        trigger: Trigger::from_str(&trigger).unwrap_or(Trigger::Api),
        enqueued_at: from_ms(enqueued_at),
        finished_at: finished_at.map(from_ms),
    }
}

/// What a job's detail shows from the database: [`Listings::job_overview`].
#[derive(Debug, Clone, Default)]
pub(crate) struct JobOverview {
    pub(crate) state: JobState,
    /// Newest first.
    pub(crate) recent: Vec<RunBrief>,
    pub(crate) counts: HashMap<RunStatus, u64>,
}

/// This worker process, as its lease records it.
#[derive(Debug, Clone)]
pub(crate) struct WorkerId {
    pub(crate) name: String,
    /// Unique per process: tells a restart under a configured name from the process it replaced.
    pub(crate) instance: String,
    pub(crate) host: String,
    pub(crate) pid: u32,
}

/// Filters for listing runs; `before` is a paging cursor (a run id from a previous page).
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub job: Option<String>,
    pub status: Option<RunStatus>,
    pub limit: Option<u32>,
    pub before: Option<String>,
}

impl RunFilter {
    /// The `WHERE` clause of the filters that are set, with placeholders numbered from 1 in the
    /// order job, before (bind them in that order, then the limit as the next one). The status
    /// is written in, as every statement's is ([`fill_statuses`]): PostgreSQL's partial index
    /// of active runs serves an active status only when the planner sees it (a prepared
    /// statement's generic plan does not); a final status alone is read newest first from the
    /// primary key.
    /// Only the set filters appear: `(? IS NULL OR job = ?)` would keep the planner from the
    /// `(job, id)` index and read the whole history for one job's ten latest runs.
    fn where_clause(&self) -> (String, usize) {
        let mut n = 0;
        let mut placeholder = |compared: &str| {
            n += 1;
            format!("{compared} ${n}")
        };
        let mut conditions: Vec<String> = Vec::new();
        if self.job.is_some() {
            conditions.push(placeholder("job ="));
        }
        if let Some(status) = self.status {
            conditions.push(format!("status = {{{status:?}}}"));
        }
        if self.before.is_some() {
            conditions.push(placeholder("id <"));
        }
        (if conditions.is_empty() { String::new() } else { format!(" WHERE {}", conditions.join(" AND ")) }, n)
    }

    /// The limit asked for, within 1..=1000 (50 when none).
    fn bounded_limit(&self) -> i64 {
        i64::from(self.limit.unwrap_or(50).clamp(1, 1000))
    }

    /// The whole query: the set filters, newest first, the limit as the last placeholder.
    fn sql(&self, spelling: &dialect::Spelling) -> String {
        let (clause, n) = self.where_clause();
        let text = format!("SELECT {} FROM ll_runs{clause} ORDER BY id DESC LIMIT ${}", dialect::run_cols!(), n + 1);
        dialect::numbered(&fill_statuses(&text), spelling)
    }

    /// The query as `spelling` spells it, with its values bound in the order [`Self::where_clause`] numbers
    /// them.
    pub(crate) fn query(&self, spelling: &dialect::Spelling) -> dialect::Stmt<'_> {
        let mut q = dialect::Stmt::built(self.sql(spelling), "listing runs");
        if let Some(job) = &self.job {
            q = q.bind(job);
        }
        if let Some(before) = &self.before {
            q = q.bind(before);
        }
        q.bind(self.bounded_limit())
    }
}

/// A lease taken or renewed ([`Leases::heartbeat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    /// Raised whenever the lease is taken afresh; the fence of the runs claimed under it.
    pub(crate) epoch: i64,
    /// The time on the clock leases are measured by (the database server's; on SQLite the
    /// caller's `now`), when the renewal was written.
    pub(crate) server_now: DateTime<Utc>,
}

/// The end of one claimed run, for [`Ends::finish_many`].
#[derive(Debug, Clone)]
pub(crate) struct RunEnd<'a> {
    pub(crate) id: &'a str,
    /// When the target was called; the claim's instant stays when there is none.
    pub(crate) started_at: Option<DateTime<Utc>>,
    /// When the run ended (its `finished_at`, if its status is final); none: the write's `now`.
    pub(crate) ended_at: Option<DateTime<Utc>>,
    pub(crate) status: RunStatus,
    pub(crate) output: Option<&'a serde_json::Value>,
    pub(crate) error: Option<&'a str>,
    /// For `waiting_approval`: when the wait ends by itself.
    pub(crate) wait_until: Option<DateTime<Utc>>,
    /// The execution's trace, when its spans were exported.
    pub(crate) trace_id: Option<&'a str>,
    /// A failure no attempt follows (its policy gives it no retry): its end is the run's
    /// outcome, recorded as such (`next_run_id` = '') in the same statement.
    pub(crate) last: bool,
    /// For a run queued again (`status` queued: a workflow step waits for limits): the pools
    /// it waits for, as `ll_runs.limits` stores them.
    pub(crate) limits: Option<&'a str>,
    /// A success whose end is also its outcome's notice: noticing it could do nothing else
    /// ([`crate::decide::noticed_at_end`]), so it is marked noticed and its job's streak and last
    /// success moved in the end's own write, and no notice pass reads it again. Ignored for
    /// any other status (a cancel that wins included).
    pub(crate) noticed: bool,
}

/// The rules of the job named, as the config in force has them; `None` for runs that are no
/// configured job's (workflows and agents run by hand, and the runs notifications start).
pub(crate) type RulesOf<'a> = &'a (dyn Fn(&str) -> Option<Vec<lamplighter_config::NotifyRule>> + Send + Sync);

/// The jobs that run after a job, as a notice pass needs them ([`Notices::notice`]): the
/// enabled ones that can run here.
pub(crate) type AfterOf<'a> = &'a (dyn Fn(&str) -> Vec<Downstream> + Send + Sync);

/// A job that runs after another.
#[derive(Debug, Clone)]
pub(crate) struct Downstream {
    pub(crate) after: lamplighter_config::After,
    /// The run it starts, as the job has it (queued, trigger `after`, its snapshot, input and
    /// parameters); the pass adds `upstream` to the input.
    pub(crate) run: NewRun,
}

/// What one pass over ended runs did ([`Notices::notice`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Noticed {
    /// Runs marked as noticed.
    pub(crate) runs: usize,
    /// Notifications recorded (new keys).
    pub(crate) recorded: usize,
    /// The pass took a full batch and noticed some of it: more may be waiting.
    pub(crate) more: bool,
    /// When a failure left unnoticed (its retry may still be recorded) is to be looked at again.
    pub(crate) recheck_at: Option<DateTime<Utc>>,
    /// The jobs of the runs marked as noticed (which retention may now prune).
    pub(crate) prunable: BTreeMap<String, Ended>,
    /// The runs started after their upstream jobs' outcomes: (job, run id).
    pub(crate) started: Vec<(String, String)>,
}

/// A job's runs marked as noticed in one pass ([`Noticed::prunable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ended {
    /// The earliest end among them.
    pub(crate) earliest: DateTime<Utc>,
    pub(crate) runs: u32,
}

/// What the per-job gauges show of a job, as the database has it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct JobHealth {
    pub(crate) paused: bool,
    pub(crate) consecutive_failures: u32,
    pub(crate) last_success: Option<DateTime<Utc>>,
    /// The last tick the scheduler processed: the next fire time is the schedule's next after it.
    pub(crate) last_tick: Option<DateTime<Utc>>,
    /// When its oldest run still running started.
    pub(crate) oldest_running: Option<DateTime<Utc>>,
    /// When its oldest wait for a decision began.
    pub(crate) oldest_wait: Option<DateTime<Utc>>,
}

/// What [`Ends::claim_queued`] (or [`Ends::finish_and_claim`]) took.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    /// Tasks consumed (fewer than asked: the queue is empty for now).
    pub(crate) tasks: usize,
    /// Their runs that were still queued, now claimed.
    pub(crate) runs: Vec<Handed>,
    /// How the write went, when it recorded ends too ([`Ends::finish_and_claim`]).
    pub(crate) write: Option<crate::events::EndsWrite>,
    /// Of `runs`, the first this many were admitted to their limits ([`Ends::finish_and_admit`]).
    pub(crate) admitted: usize,
    /// Runs admitted to their limits and queued (no slot here was left for them).
    pub(crate) pushed: usize,
    /// Of the runs admitted, the limits they waited on, and how long.
    pub(crate) waited: Vec<(String, std::time::Duration)>,
    /// The ends are recorded, but what was to follow them in a second write (admissions to
    /// the pools they freed, claims from the queue) failed: the scheduler and the intake must
    /// look.
    pub(crate) unfinished: bool,
}

/// What a held tick transaction waits for before it commits (true) or rolls back (false).
pub(crate) type Hold<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>>;

/// A person's (or a tool's) decision on a waiting approval step, for [`Records::record_decision`].
#[derive(Debug, Clone)]
pub(crate) struct StepDecision<'a> {
    pub(crate) run_id: &'a str,
    /// Which waiting step; may be left out when the run waits on exactly one.
    pub(crate) step: Option<&'a str>,
    pub(crate) approve: bool,
    pub(crate) comment: Option<&'a str>,
    pub(crate) decided_by: &'a str,
}

/// What [`Records::record_decision`] did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decided {
    NoSuchRun,
    /// The run is not waiting for a decision (never was, or already decided).
    NotWaiting(RunStatus),
    /// The step named is not one the run waits on (`waiting`: those it does wait on).
    NotWaitingStep {
        waiting: Vec<String>,
    },
    /// No step named, and the run waits on several.
    WhichStep {
        waiting: Vec<String>,
    },
    /// Recorded on the step. `run`: the run's status now — `queued` (resumed), still
    /// `waiting_approval` (other steps wait), or `failed` (rejected).
    Recorded {
        step: StepRecord,
        run: RunStatus,
    },
}

/// What the run core asks of a database, by concern: each part of the engine is handed only
/// the traits it uses. Every method is one transaction (or one statement); a failed call changes
/// nothing. Implementations must pass the contract suite (`store/contract.rs`).
pub(crate) trait RunStore:
    Ticks + JobStates + Handover + Ends + Records + Leases + Notices + Deadlines + Missed + Definitions + Listings + Upkeep
{
}

impl<T: Ticks + JobStates + Handover + Ends + Records + Leases + Notices + Deadlines + Missed + Definitions + Listings + Upkeep + ?Sized>
    RunStore for T
{
}

#[cfg(test)]
mod sql_text {
    use super::*;
    use crate::run::StepStatus;

    /// Every source file under `store/` (found on disk, so a new file is checked too), as
    /// (path, text).
    fn sources() -> Vec<(String, String)> {
        fn walk(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
            for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    out.push((path.display().to_string(), text));
                }
            }
        }
        let mut out = Vec::new();
        walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store"), &mut out);
        assert!(out.len() >= 15, "the store's sources were not found: {:?}", out.iter().map(|(p, _)| p).collect::<Vec<_>>());
        out
    }

    /// The two backends once drifted here: PostgreSQL spelled 22 statuses in its SQL where
    /// SQLite took them from `RunStatus`. Neither may spell one, and every placeholder must name
    /// a variant.
    #[test]
    fn statuses_in_sql_come_from_the_enums() {
        let mut names: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).chain(StepStatus::ALL.iter().map(|s| s.as_str())).collect();
        names.sort_unstable();
        names.dedup();
        let runs: Vec<String> = RunStatus::ALL.iter().map(|s| format!("{s:?}")).collect();
        let steps: Vec<String> = StepStatus::ALL.iter().map(|s| format!("{s:?}")).collect();
        let mut found = Vec::new();
        for (file, text) in sources() {
            // Not the contract suite's fixtures, and up to these tests, whose examples name
            // unknown statuses on purpose.
            if file.ends_with("contract.rs") {
                continue;
            }
            let text = text.split("mod sql_text {").next().unwrap_or(&text);
            let text = text.split("mod tests {").next().unwrap_or(text);
            for (n, line) in text.lines().enumerate() {
                for name in &names {
                    if line.contains(&format!("'{name}'")) {
                        found.push(format!("{file}:{}: the status '{name}' is spelled out: {}", n + 1, line.trim()));
                    }
                }
                // `{Word}` and `{step:Word}` (CamelCase: format arguments are snake or SCREAMING case).
                for part in line.split('{').skip(1) {
                    let Some((inner, _)) = part.split_once('}') else { continue };
                    let (list, word) = match inner.strip_prefix("step:") {
                        Some(w) => (&steps, w),
                        None => (&runs, inner),
                    };
                    let camel = word.starts_with(|c: char| c.is_ascii_uppercase())
                        && word.chars().all(|c| c.is_ascii_alphanumeric())
                        && word.chars().any(|c| c.is_ascii_lowercase());
                    if camel && !list.iter().any(|v| v == word) {
                        found.push(format!("{file}:{}: {{{inner}}} names no status: {}", n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(found.is_empty(), "{}", found.join("\n"));
    }

    /// Each backend's words, and SQLite's numbered placeholders (it takes `$n` for a name).
    #[test]
    fn each_backend_spells_its_words() {
        use dialect::render;
        let text = "SELECT id FROM ll_runs {undispatched} WHERE status = {Queued} AND job {in $1} AND n = {greatest}(a, $2) {lock}";
        assert_eq!(
            render(text, &sqlite::SPELLING),
            "SELECT id FROM ll_runs INDEXED BY ll_runs_undispatched WHERE status = 'queued' AND job IN (SELECT value FROM json_each(?1)) AND n = max(a, ?2) "
        );
        assert_eq!(
            render(text, &postgres::SPELLING),
            "SELECT id FROM ll_runs  WHERE status = 'queued' AND job = ANY($1) AND n = greatest(a, $2) FOR UPDATE"
        );
    }

    #[test]
    fn placeholders_become_the_names_the_store_writes() {
        assert_eq!(
            fill_statuses("status = {Queued} OR status IN ({WaitingApproval}, {TimedOut}) AND s = {step:Running}"),
            "status = 'queued' OR status IN ('waiting_approval', 'timed_out') AND s = 'running'"
        );
        assert_eq!(fill_statuses("{Nope} {step:Queued}"), "{Nope} {step:Queued}", "unknown placeholders stay, for the database to refuse");
    }
}
