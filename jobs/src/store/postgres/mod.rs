//! The PostgreSQL backend: Lamplighter's tables (`migrations/postgres`, apalis-postgres's schema
//! `apalis` migrated beside them) in one database, shared by any number of workers. The queue
//! is the runs' own rows ([`queue`]). Its [`Dialect`] is what sharing adds to the statements
//! written once:
//! - **No writer to queue behind**: concurrent writers meet at row locks. Statements that take
//!   many rows take them in one order (ticks by job and instant, job state by job), or skip
//!   rows another transaction holds where someone else taking them is fine
//!   (`FOR UPDATE SKIP LOCKED`: runs taken from the queue, runs handed over by a scheduler pass).
//! - **Ticks of one job are decided one transaction at a time** (a transaction-scoped advisory
//!   lock per job), so two workers firing different ticks of a job both see each other's run
//!   when they apply the overlap policy.
//! - **A decision locks its run** (`{lock}`), so of two concurrent decisions the second finds
//!   it decided.
//! - **Leases on the server's clock** (`ll_workers`): recovery interrupts only the runs of
//!   workers whose lease ran out, never a live worker's.
//! - Batches are bound as arrays (`unnest`, `= ANY`).

mod queue;
mod signals;

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, Row, Transaction};
use tokio_util::sync::CancellationToken;

use super::dialect::{
    Arg, Batch, Column, Dialect, EndsAndClaims, HandOffs, LeaseSql, QueueSql, ReadSql, Record, RowsBind, RunSql, Spelling, Stmt, UpkeepSql,
    job_state_from_row, record_for, run_cols, sql,
};
use super::scripts::{FINISH_RUNS, HOLDING, claim_update, end_rows, noticed_at_end};
use super::{Backend, Ctx, JobOverview, JobState, OpenError, RunBrief, RunEnd, RunFilter, StorageKind, StoreError, WorkerId, brief};
use crate::run::RunStatus;

record_for!(PgRow);

/// How PostgreSQL spells what the dialects spell differently.
pub(super) const SPELLING: Spelling = Spelling {
    greatest: "greatest",
    lock: "FOR UPDATE",
    lock_skip: "FOR UPDATE SKIP LOCKED",
    undispatched: "",
    limit_waits: "",
    in_list: |param| format!("= ANY({param})"),
    // An array a column (see [`RowsBind::PerColumn`]).
    rows: |params, alias, cols| {
        let arrays: Vec<String> = params.iter().zip(cols).map(|(p, (_, t))| format!("{p}::{t}[]")).collect();
        let names: Vec<&str> = cols.iter().map(|(c, _)| *c).collect();
        format!("unnest({}) AS {alias}({})", arrays.join(", "), names.join(", "))
    },
    rows_bind: RowsBind::PerColumn,
    batch: Batch::RowSet,
    // A condition on `'' || status` is not one the status index answers: the planner, which
    // reckons ten rows from an `unnest` and a handful running from stale statistics, took
    // `ll_runs_running` (every running run, and the dead entries of the last bursts: 20,000
    // read to end 187) and joined the batch by a filter; the key finds each run at once.
    by_id: "'' || ",
    // Several workers claim at once: the runs are locked in id order first (so two claims
    // never wait on each other crosswise), and a claim that may skip leaves the locked ones.
    claim_pick: |which, skip| {
        let skip = if skip { "SKIP LOCKED" } else { "" };
        (
            format!(
                "WITH picked AS MATERIALIZED (SELECT id AS pick FROM ll_runs WHERE {which} AND (status = {{Queued}}) IS TRUE ORDER BY id FOR UPDATE {skip})"
            ),
            "FROM picked".into(),
            "ll_runs.id = picked.pick".into(),
        )
    },
    lease_live: "AND w.lease_until > (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
    // A serial column (migration 0009).
    notification_seq: "seq",
    param: '$',
};

/// The server's clock, in Unix milliseconds (leases are measured on it).
const DB_NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// What the open steps of a run whose status is `status` (an expression) become, as
/// [`super::steps_closed_by`] says, in SQL: NULL where they stay open.
/// The first parts of the one-statement writes of ends: the ends ([`finish_runs_sql`]) as
/// `ended` (id, status taken), and the open steps of those that did not succeed closed.
/// The array column `col` of the one-row summary the ends statements return (NULL: empty).
fn array<T>(row: &PgRow, col: &str) -> Result<Vec<T>, StoreError>
where
    Vec<T>: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    Ok(row.try_get::<Option<Vec<T>>, _>(col).ctx("reading the ends written")?.unwrap_or_default())
}

/// The columns of an ends statement's summary row that [`runs_ended`] reads, from its `ended`.
const ENDED: &str = "(SELECT array_agg(id ORDER BY id) FROM ended) AS ended_ids,
                     (SELECT array_agg(status ORDER BY id) FROM ended) AS ended_statuses";

/// The runs an ends statement ended, with the status each was given, from its summary row.
fn runs_ended(row: &PgRow) -> Result<Vec<(String, RunStatus)>, StoreError> {
    let ids: Vec<String> = array(row, "ended_ids")?;
    let statuses: Vec<String> = array(row, "ended_statuses")?;
    Ok(ids.into_iter().zip(statuses).map(|(id, s)| (id, RunStatus::from_str(&s).unwrap_or(RunStatus::Failed))).collect())
}

fn ends_and_closed_steps() -> String {
    format!(
        "WITH ended AS ({FINISH_RUNS} RETURNING ll_runs.id, ll_runs.status, ll_runs.limit_hold, ll_runs.job, ll_runs.worker, ll_runs.finished_at,
                                                (j.noticed AND ll_runs.outcome_seen IS NOT NULL) AS noticed),
         closed AS (UPDATE ll_steps SET status = {closing}, finished_at = coalesce(e.finished_at, $2)
                    FROM ended e
                    WHERE ll_steps.run_id = e.id AND ({closing}) IS NOT NULL AND ll_steps.status IN ({{step:Running}}, {{step:WaitingApproval}})),
         noticed AS ({noticed})",
        closing = steps_closed_as("e.status"),
        // The worker's own rows of its jobs' successes: no other worker's end waits for them.
        noticed = noticed_at_end("SELECT job, worker, max(finished_at) FROM ended WHERE noticed GROUP BY job, worker ORDER BY job, worker"),
    )
}

fn steps_closed_as(status: &str) -> String {
    let cases: String = RunStatus::ALL
        .into_iter()
        .filter_map(|r| super::steps_closed_by(r).map(|s| format!(" WHEN '{}' THEN '{}'", r.as_str(), s.as_str())))
        .collect();
    format!("CASE {status}{cases} END")
}

/// How long a call waits for a connection before it fails (the server is down or every
/// connection is busy); readiness answers within it.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The namespace of Lamplighter's advisory locks (the first key of the two-key form).
const TICK_LOCKS: i32 = 0x4c4c_5449; // "LLTI"
/// The namespace of the slot pools' advisory locks: apart from the jobs', so a pool named as
/// a job never waits for its ticks.
const LIMIT_LOCKS: i32 = 0x4c4c_4c4d; // "LLLM"

#[derive(Debug)]
pub(crate) struct PgStore {
    pool: PgPool,
    /// The recorder's: the write of ends and claims, one at a time, retried by its caller until
    /// it goes through. Its connections are pinged before a use only after
    /// [`RECORDER_PING_AFTER`] idle, where the pool's are pinged before every use (a round trip
    /// to the server before every statement, which a drain makes every 2 ms): a connection lost
    /// while idle is found within the acquire's timeout, not by a write sent into a dead
    /// connection. Two, so that one is ready while sqlx pings the last one used on its way back.
    ///
    /// Its statements are planned once a connection (`plan_cache_mode=force_generic_plan`).
    /// Left to choose, the server planned the ends-and-claims statement anew at every call (the
    /// generic plan's cost, the claim's `LIMIT` unknown, reckoned above the custom plans'): a
    /// quarter of the statement's time on a drain's small batches, for the same plan either
    /// way (each run found by its key, the queue read in its index's order). Every statement
    /// it runs finds runs by key, so a sequential scan is planned there only where nothing else
    /// can be (`enable_seqscan=off`): a plan made while the table was small, kept until
    /// autovacuum next analyzes it, scanned thousands of runs for each end (a custom plan for
    /// a batch of 700 ends, 219 ms, seen at 1,000 runs a second on the pool's connections).
    recorder: PgPool,
    /// Where this worker's last pick of the queue with its ends ended ([`queue::pick_from`]);
    /// none: a pick starts at the head.
    queue_head: std::sync::Mutex<Option<QueueHead>>,
}

/// A place in the queue, by hand-over time and run id, and when (ms) the pick that started
/// from the head was made. It is a hint: a run behind it is still taken when those ahead do
/// not fill a pick, and the place is forgotten [`QUEUE_HEAD_KEPT_MS`] after that pick (or when
/// the clock steps back), so that such a run waits no longer than that while a backlog goes on
/// ahead of it. Runs land behind it as a matter of course with several workers: a hand-over's
/// time is stamped before its transaction commits, and a pick passes over runs another
/// transaction holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct QueueHead {
    at: i64,
    id: String,
    since: i64,
}

/// How long a [`QueueHead`] is used.
const QUEUE_HEAD_KEPT_MS: i64 = 250;

impl QueueHead {
    /// Still the place for a pick at `now`.
    fn holds_at(&self, now: i64) -> bool {
        (self.since..=self.since.saturating_add(QUEUE_HEAD_KEPT_MS)).contains(&now)
    }
}

/// The recorder's connections ([`PgStore::recorder`]).
const RECORDER_CONNECTIONS: u32 = 2;

/// A recorder's connection idle this long is pinged before it is used.
const RECORDER_PING_AFTER: Duration = Duration::from_secs(10);

/// `q` with `args` bound. A row set's first column is bound at its place and its others after
/// every argument, as [`RowsBind::PerColumn`] numbers them.
fn bound<'q>(
    mut q: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    args: Vec<Arg<'_>>,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    let mut later = Vec::new();
    for a in args {
        q = match a {
            Arg::Int(v) => q.bind(v),
            Arg::Real(v) => q.bind(v),
            Arg::Bool(v) => q.bind(v),
            Arg::Text(v) => q.bind(v),
            Arg::Texts(v) => q.bind(v),
            Arg::Rows(cols) => {
                let mut cols = cols.into_iter();
                let first = cols.next();
                later.extend(cols);
                first.into_iter().fold(q, bind_column)
            }
        };
    }
    later.into_iter().fold(q, bind_column)
}

/// One column of a row set, as an array.
fn bind_column<'q>(
    q: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    col: Column<'_>,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    match col {
        Column::Texts(v) => q.bind(v.iter().map(|t| t.as_deref()).collect::<Vec<Option<&str>>>()),
        Column::Ints(v) => q.bind(v),
        Column::Bools(v) => q.bind(v),
    }
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
            .connect_with(opts.clone())
            .await
            .ctx("connecting to the database")?;
        let recorder = PgPoolOptions::new()
            .max_connections(RECORDER_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .before_acquire(|c, meta| {
                Box::pin(async move {
                    if meta.idle_for >= RECORDER_PING_AFTER {
                        sqlx::Connection::ping(c).await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy_with(opts.options([("plan_cache_mode", "force_generic_plan"), ("enable_seqscan", "off")]));
        Ok(Self { pool, recorder, queue_head: std::sync::Mutex::new(None) })
    }
}

impl Dialect for PgStore {
    type Conn = PgConnection;
    type Row = PgRow;
    type Tx = Transaction<'static, Postgres>;
    type Pooled = PoolConnection<Postgres>;

    const KIND: StorageKind = StorageKind::Postgres;
    const SPELLING: Spelling = SPELLING;
    const QUEUED_BY_INSERT: bool = true;
    const ENDS_GATHER: Duration = Duration::from_millis(5);

    async fn begin(&self) -> Result<Self::Tx, StoreError> {
        self.pool.begin().await.ctx("starting a transaction")
    }

    async fn commit(tx: Self::Tx) -> Result<(), StoreError> {
        tx.commit().await.ctx("committing")
    }

    async fn rollback(tx: Self::Tx) -> Result<(), StoreError> {
        tx.rollback().await.ctx("ending a transaction")
    }

    async fn reader(&self) -> Result<Self::Pooled, StoreError> {
        self.pool.acquire().await.ctx("connecting to the database")
    }

    async fn writer(&self) -> Result<Self::Pooled, StoreError> {
        self.pool.acquire().await.ctx("connecting to the database")
    }

    async fn begin_recording(&self) -> Result<Self::Tx, StoreError> {
        self.recorder.begin().await.ctx("starting a transaction")
    }

    async fn recording(&self) -> Result<Self::Pooled, StoreError> {
        self.recorder.acquire().await.ctx("connecting to the database")
    }

    async fn execute(c: &mut PgConnection, q: Stmt<'_>) -> Result<u64, StoreError> {
        Ok(bound(sqlx::query(q.sql), q.args).execute(c).await.ctx(q.what)?.rows_affected())
    }

    async fn fetch_all(c: &mut PgConnection, q: Stmt<'_>) -> Result<Vec<PgRow>, StoreError> {
        bound(sqlx::query(q.sql), q.args).fetch_all(c).await.ctx(q.what)
    }

    async fn fetch_optional(c: &mut PgConnection, q: Stmt<'_>) -> Result<Option<PgRow>, StoreError> {
        bound(sqlx::query(q.sql), q.args).fetch_optional(c).await.ctx(q.what)
    }

    /// A transaction-scoped advisory lock per job, taken in job order (no deadlock).
    async fn lock_jobs(c: &mut PgConnection, jobs: &[&str]) -> Result<(), StoreError> {
        sqlx::query("SELECT count(pg_advisory_xact_lock($2, hashtext(j))) FROM (SELECT j FROM unnest($1::text[]) j ORDER BY j) s")
            .bind(jobs)
            .bind(TICK_LOCKS)
            .execute(c)
            .await
            .ctx("locking jobs for their ticks")?;
        Ok(())
    }

    /// A transaction-scoped advisory lock per pool, taken in order (no deadlock); a statement
    /// of its own, so that the count that follows sees what the last holder committed.
    async fn lock_limits(c: &mut PgConnection, pools: &[String]) -> Result<(), StoreError> {
        sqlx::query("SELECT count(pg_advisory_xact_lock($2, hashtext(p))) FROM (SELECT p FROM unnest($1::text[]) p ORDER BY p) s")
            .bind(pools)
            .bind(LIMIT_LOCKS)
            .execute(c)
            .await
            .ctx("locking limits")?;
        Ok(())
    }
}

impl RunSql for PgStore {
    /// In (job, instant) order, so that workers firing the same ticks lock them in the same
    /// order; a key another worker holds makes this one wait for its commit, then find it
    /// taken.
    async fn record_ticks(c: &mut PgConnection, mut keys: Vec<(&str, i64, &str)>) -> Result<HashSet<String>, StoreError> {
        keys.sort_unstable();
        let fresh: Vec<String> = sqlx::query_scalar(
            "INSERT INTO ll_ticks (job, scheduled_at, run_id)
             SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[]) ON CONFLICT DO NOTHING RETURNING run_id",
        )
        .bind(keys.iter().map(|k| k.0).collect::<Vec<_>>())
        .bind(keys.iter().map(|k| k.1).collect::<Vec<_>>())
        .bind(keys.iter().map(|k| k.2).collect::<Vec<_>>())
        .fetch_all(c)
        .await
        .ctx("recording ticks")?;
        Ok(fresh.into_iter().collect())
    }

    /// One statement, its own transaction, as [`PgStore::ends_and_claims_at_once`] without the
    /// claim: 1,000 per-second jobs on three workers end about 30 runs a write, where the
    /// transaction of statements (`BEGIN`, ends, successes, steps, `COMMIT`) was five round
    /// trips and read the ended runs twice.
    async fn ends_at_once(&self, ends: &[RunEnd<'_>], now: i64) -> Option<Result<Vec<(String, RunStatus)>, StoreError>> {
        let sql = sql!(
            PgStore,
            format!(
                "{ended}
                 SELECT {ENDED}",
                ended = ends_and_closed_steps(),
            )
        );
        let written = async {
            let args = vec![Arg::Rows(end_rows(ends)), now.into()];
            let row = bound(sqlx::query(sql), args).fetch_one(&self.recorder).await.ctx("recording ends")?;
            runs_ended(&row)
        };
        Some(written.await)
    }

    /// One statement, its own transaction, so one round trip: in `cargo bench … postgres --
    /// drain` the six statements of the script's transaction (`BEGIN`, ends, lease, take,
    /// claim, `COMMIT`) took 1.5–1.8 ms for 15 ends and 15 claims, most of it round trips to a
    /// server on the same cores. The parts are those statements' own:
    /// [`finish_runs_sql`](super::scripts::finish_runs_sql), the open steps of runs that did
    /// not succeed closed ([`super::steps_closed_by`]), the lease read live, the take's pick
    /// ([`queue::pick_from`]: runs handed over, from where this worker's last pick ended, only
    /// under a live lease) and [`claim_update`] of what it picked. Data-modifying CTEs all run
    /// to completion, on one snapshot; the ended runs are running and the claimed ones
    /// queued, so no row is written twice. The steps closed are those of the snapshot: a run's
    /// own step writes are awaited before its end is handed to the recorder.
    async fn ends_and_claims_at_once(
        &self,
        ends: &[RunEnd<'_>],
        n: usize,
        worker: &str,
        now: i64,
    ) -> Option<Result<EndsAndClaims<PgRow>, StoreError>> {
        let sql = sql!(
            PgStore,
            format!(
                "{ended},
                 lease AS (SELECT epoch FROM ll_workers w WHERE w.name = $3 {{lease_live}}),
                 {pick},
                 claimed AS ({claim})
                 SELECT s.*, c.* FROM
                     (SELECT (SELECT count(*) FROM picked) AS tasks_taken,
                             (SELECT dispatched_at FROM picked ORDER BY dispatched_at DESC, id DESC LIMIT 1) AS head_at,
                             (SELECT id FROM picked ORDER BY dispatched_at DESC, id DESC LIMIT 1) AS head_id,
                             {ENDED}) s
                     LEFT JOIN claimed c ON true",
                ended = ends_and_closed_steps(),
                pick = queue::pick_from("$4", "AND EXISTS (SELECT 1 FROM lease)", "$5::bigint", "$6::text"),
                // Locked by the pick already, and queued: the ended runs are running, so no
                // row is written twice. Found by key, whatever the plan reckons the pick holds.
                claim = claim_update(
                    "",
                    "ll_runs.id = ANY(ARRAY(SELECT id FROM picked)) AND (ll_runs.status = {Queued}) IS TRUE",
                    "$3",
                    "$2",
                    "(SELECT epoch FROM lease)",
                    "NULL"
                ),
            )
        );
        let written = async {
            let from = self.queue_head.lock().unwrap_or_else(|e| e.into_inner()).clone().filter(|h| h.holds_at(now));
            // The place kept its `since`; none: before every run (`''` sorts first).
            let since = from.as_ref().map_or(now, |h| h.since);
            let (at, id) = from.map_or((i64::MIN, String::new()), |h| (h.at, h.id));
            let args = vec![Arg::Rows(end_rows(ends)), now.into(), worker.into(), (n.max(1) as i64).into(), at.into(), id.into()];
            let rows = bound(sqlx::query(sql), args).fetch_all(&self.recorder).await.ctx("recording ends and claiming runs")?;
            let Some(first) = rows.first() else {
                return Err(StoreError::new("recording ends and claiming runs", sqlx::Error::RowNotFound));
            };
            // Where the next pick starts: after the last run this one took (none taken: the
            // place stays; only runs behind it taken: it moves back), until
            // `QUEUE_HEAD_KEPT_MS` after the pick that started from the head.
            let head_at = first.try_get::<Option<i64>, _>("head_at").ok().flatten();
            if let (Some(at), Some(id)) = (head_at, first.try_get::<Option<String>, _>("head_id").ok().flatten()) {
                *self.queue_head.lock().unwrap_or_else(|e| e.into_inner()) = Some(QueueHead { at, id, since });
            }
            let done = runs_ended(first)?;
            let tasks = first.int("tasks_taken").max(0) as usize;
            // Without claims, the one row has no run.
            let claimed = rows.into_iter().filter(|r| r.try_get::<Option<String>, _>("id").ok().flatten().is_some()).collect();
            Ok((done, tasks, claimed, None))
        };
        Some(written.await)
    }

    /// One statement, its own transaction, as [`PgStore::ends_and_claims_at_once`]: the ends
    /// ([`finish_runs_sql`](super::scripts::finish_runs_sql), open steps closed), the slots of the
    /// runs ended deleted, and `handover::hand_off` written in SQL — per pool freed, as many
    /// heads of its line as it freed slots, locked (others held elsewhere passed over), taken
    /// while each takes that pool alone and the pool is within its size (the slots held,
    /// counted on the statement's snapshot, which still has the ended runs as holders), at most
    /// `spare` of them first in line first, and claimed under the live lease, each holding its
    /// slot in its own row (`limit_hold`: no slot row is written, nor deleted at its end). The freed pools it did not serve are named for the admission under
    /// their locks.
    async fn ends_and_hand_offs_at_once(
        &self,
        ends: &[RunEnd<'_>],
        sizes: &crate::limits::Sizes,
        spare: usize,
        worker: &str,
        now: i64,
    ) -> Option<Result<HandOffs<PgRow>, StoreError>> {
        let sql = sql!(
            PgStore,
            format!(
                "{ended},
                 dropped AS (DELETE FROM ll_run_limits l USING ended e WHERE l.run_id = e.id RETURNING l.run_id, l.name, l.key),
                 freed AS (SELECT run_id, name, key FROM dropped
                           UNION
                           SELECT e.id, split_part(e.limit_hold, ':', 1),
                                  CASE WHEN strpos(e.limit_hold, ':') = 0 THEN '' ELSE substr(e.limit_hold, strpos(e.limit_hold, ':') + 1) END
                           FROM ended e WHERE e.limit_hold IS NOT NULL),
                 pools AS (SELECT f.name, f.key, count(*) AS n, min(s.size) AS size,
                                  CASE WHEN f.key = '' THEN f.name ELSE f.name || ':' || f.key END AS wait,
                                  (SELECT count(*) FROM (
                                       SELECT a.run_id FROM ll_run_limits a JOIN ll_runs h ON h.id = a.run_id
                                       WHERE a.name = f.name AND a.key = f.key AND {holding}
                                       UNION
                                       SELECT h.id FROM ll_runs h
                                       WHERE h.limit_hold = CASE WHEN f.key = '' THEN f.name ELSE f.name || ':' || f.key END AND {holding}) x) AS held
                           FROM freed f LEFT JOIN {{rows $4 AS s(name text, size bigint)}} ON s.name = f.name
                           GROUP BY f.name, f.key),
                 heads AS (SELECT p.name AS pool_name, p.key AS pool_key, h.*,
                                  h.limits::jsonb = jsonb_build_array(jsonb_build_array(p.name, p.key)) AS single
                           FROM pools p CROSS JOIN LATERAL (
                               SELECT r.id, r.limits, r.due_at, r.enqueued_at, r.limit_wait_since FROM ll_runs r
                               WHERE r.limit_wait = p.wait AND r.limit_wait IS NOT NULL AND r.status = {{Queued}} AND r.dispatched_at IS NULL
                               ORDER BY r.due_at, r.enqueued_at, r.id LIMIT least(p.n, greatest(p.size - (p.held - p.n), 0)) FOR UPDATE SKIP LOCKED) h
                           WHERE p.size IS NOT NULL),
                 eligible AS (SELECT hd.*, row_number() OVER (ORDER BY hd.due_at, hd.enqueued_at, hd.id) AS g FROM heads hd
                              WHERE NOT EXISTS (SELECT 1 FROM heads x WHERE x.pool_name = hd.pool_name AND x.pool_key = hd.pool_key AND NOT x.single)),
                 taken AS MATERIALIZED (SELECT * FROM eligible WHERE g <= $5),
                 lease AS (SELECT epoch FROM ll_workers w WHERE w.name = $3 {{lease_live}}),
                 claimed AS ({claim})
                 SELECT s.*, c.* FROM
                     (SELECT {ENDED},
                             (SELECT array_agg(id ORDER BY g) FROM taken) AS taken_ids,
                             (SELECT array_agg(pool_name ORDER BY g) FROM taken) AS taken_limits,
                             (SELECT array_agg(coalesce(limit_wait_since, $2) ORDER BY g) FROM taken) AS taken_since,
                             (SELECT array_agg(p.wait ORDER BY p.wait) FROM pools p
                              WHERE p.size IS NULL
                                 OR EXISTS (SELECT 1 FROM heads r WHERE r.pool_name = p.name AND r.pool_key = p.key AND NOT r.single)
                                 OR EXISTS (SELECT 1 FROM eligible e WHERE e.pool_name = p.name AND e.pool_key = p.key AND e.g > $5)) AS left_pools) s
                     LEFT JOIN claimed c ON true",
                ended = ends_and_closed_steps(),
                holding = HOLDING,
                // The heads are locked already (`heads`), skipping those locked elsewhere: the
                // statement waits for no lock, so it cannot deadlock with another. Each is found
                // by its key (`= ANY(ARRAY(…))`): as `IN (SELECT …)` the plan, which reckons
                // thousands of heads, joined them to a scan of the whole table at every write.
                claim = claim_update(
                    "",
                    "ll_runs.id = ANY(ARRAY(SELECT id FROM taken)) AND (ll_runs.status = {Queued}) IS TRUE AND EXISTS (SELECT 1 FROM lease)",
                    "$3",
                    "$2",
                    "(SELECT epoch FROM lease)",
                    "ll_runs.limit_wait"
                ),
            )
        );
        let written = async {
            let limits = vec![
                Column::Texts(sizes.keys().map(|n| Some(n.as_str().into())).collect()),
                Column::Ints(sizes.values().map(|&n| Some(i64::from(n))).collect()),
            ];
            let args = vec![Arg::Rows(end_rows(ends)), now.into(), worker.into(), Arg::Rows(limits), (spare as i64).into()];
            let rows = bound(sqlx::query(sql), args).fetch_all(&self.recorder).await.ctx("recording ends and handing their slots on")?;
            let Some(first) = rows.first() else {
                return Err(StoreError::new("recording ends and handing their slots on", sqlx::Error::RowNotFound));
            };
            let done = runs_ended(first)?;
            let since: Vec<i64> = array(first, "taken_since")?;
            let taken = array::<String>(first, "taken_ids")?
                .into_iter()
                .zip(array::<String>(first, "taken_limits")?)
                .zip(since)
                .map(|((id, limit), since)| (id, limit, since))
                .collect();
            let left = array(first, "left_pools")?;
            // Without claims, the one row has no run.
            let claimed = rows.into_iter().filter(|r| r.try_get::<Option<String>, _>("id").ok().flatten().is_some()).collect();
            Ok(HandOffs { done, claimed, taken, left })
        };
        Some(written.await)
    }

    /// The rows to take are picked once (a materialized CTE: see `queue::take`), in id order,
    /// by the primary key alone: `(status = …) IS TRUE` keeps the planner off the status
    /// index. With statistics from before a burst it took 50,000 queued rows from that index to
    /// AND them with the batch's ids (0.8 ms of each claim, seen with `auto_explain` in `cargo
    /// bench … postgres -- drain`).
    /// By the primary key alone, as a claim (the undispatched index, driven by
    /// stale statistics, was read whole: 7 ms a batch).
    async fn mark_dispatched(c: &mut PgConnection, ids: &[String], now: i64) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar(sql!(
            "WITH picked AS MATERIALIZED (
                     SELECT id FROM ll_runs WHERE id = ANY($1) AND (status = {Queued} AND dispatched_at IS NULL) IS TRUE
                     ORDER BY id FOR UPDATE SKIP LOCKED)
                 UPDATE ll_runs SET dispatched_at = $2, limit_wait = NULL, limit_wait_since = NULL, limit_hold = NULL
                 FROM picked WHERE ll_runs.id = picked.id RETURNING ll_runs.id"
        ))
        .bind(ids)
        .bind(now)
        .fetch_all(c)
        .await
        .ctx("marking runs dispatched")
    }
}

impl QueueSql for PgStore {
    async fn push(c: &mut PgConnection, ids: &[String]) -> Result<(), StoreError> {
        queue::push(c, ids).await
    }

    async fn take(c: &mut PgConnection, n: usize) -> Result<(usize, Vec<String>), StoreError> {
        queue::take(c, n).await
    }

    async fn forget_queue(c: &mut PgConnection) -> Result<(), StoreError> {
        queue::forget_all(c).await
    }
}

impl LeaseSql for PgStore {
    async fn heartbeat(&self, me: &WorkerId, lease: Duration, take_over: bool, _now: i64) -> Result<Option<(i64, i64)>, StoreError> {
        // A renewal keeps the epoch only while the lease is live and the same process holds
        // it: a lease that ran out, or a new process under the name, starts a new epoch, and
        // whatever was claimed under the old one can no longer be written. A new process under
        // the name is in no group sharing the schedule until it joins one itself.
        sqlx::query_as(sql!(format!(
            "INSERT INTO ll_workers (name, instance, host, pid, started_at, heartbeat_at, lease_until, takeover_at, epoch)
             VALUES ($1, $2, $3, $4, {now}, {now}, {now} + $5, {now} + $5 + $7, 1)
             ON CONFLICT (name) DO UPDATE SET instance = excluded.instance, host = excluded.host, pid = excluded.pid,
                 shares = CASE WHEN ll_workers.instance = excluded.instance THEN ll_workers.shares END,
                 started_at = CASE WHEN ll_workers.instance = excluded.instance THEN ll_workers.started_at ELSE excluded.started_at END,
                 heartbeat_at = excluded.heartbeat_at, lease_until = excluded.lease_until, takeover_at = excluded.takeover_at,
                 epoch = CASE WHEN ll_workers.instance = excluded.instance AND ll_workers.lease_until > {now}
                              THEN ll_workers.epoch ELSE ll_workers.epoch + 1 END,
                 fenced_until = CASE WHEN ll_workers.instance = excluded.instance AND ll_workers.lease_until > {now}
                                     THEN ll_workers.fenced_until ELSE ll_workers.takeover_at END
             WHERE $6 OR ll_workers.instance = excluded.instance
             RETURNING epoch, {now} AS server_now",
            now = DB_NOW_MS
        )))
        .bind(&me.name)
        .bind(&me.instance)
        .bind(&me.host)
        .bind(i64::from(me.pid))
        .bind(lease.as_millis() as i64)
        .bind(take_over)
        .bind(crate::decide::fencing(lease).margin.as_millis() as i64)
        .fetch_optional(&self.pool)
        .await
        .ctx("renewing the worker's lease")
    }

    async fn live_leases(c: &mut PgConnection, _now: i64) -> Result<Vec<PgRow>, StoreError> {
        sqlx::query(sql!(format!("SELECT * FROM ll_workers WHERE lease_until > {DB_NOW_MS} ORDER BY name")))
            .fetch_all(c)
            .await
            .ctx("reading worker leases")
    }

    /// Runs left `running` by `starting` (an earlier process under its name), by a worker
    /// whose lease ran out more than its margin ago (`takeover_at`: by then it has stopped
    /// them itself), or claimed under an epoch their worker no longer holds — once the old
    /// lease's takeover time has passed (`fenced_until`), however soon the worker renewed. A
    /// live worker's runs are never touched.
    async fn interrupt_orphans(c: &mut PgConnection, starting: Option<&str>, now: i64) -> Result<Vec<PgRow>, StoreError> {
        sqlx::query(sql!(format!(
            "UPDATE ll_runs SET status = CASE WHEN cancel_requested IS NULL THEN {{Interrupted}} ELSE {{Cancelled}} END, finished_at = $2,
                     error = coalesce(cancel_requested, 'worker \"' || coalesce(worker, '?') || '\" stopped while the run was going (or lost its lease)')
                 WHERE status = {{Running}} AND (worker IS NULL OR worker = $1
                       OR (NOT EXISTS (SELECT 1 FROM ll_workers w WHERE w.name = ll_runs.worker
                                           AND w.epoch = coalesce(ll_runs.epoch, w.epoch)
                                           AND greatest(w.takeover_at, w.lease_until) > {DB_NOW_MS})
                           AND NOT EXISTS (SELECT 1 FROM ll_workers w WHERE w.name = ll_runs.worker
                                           AND w.fenced_until > {DB_NOW_MS})))
                 RETURNING {}",
            run_cols!()
        )))
        .bind(starting)
        .bind(now)
        .fetch_all(c)
        .await
        .ctx("interrupting orphaned runs")
    }
}

impl ReadSql for PgStore {
    async fn job_states(&self) -> Result<HashMap<String, JobState>, StoreError> {
        let rows = sqlx::query("SELECT job, paused, pause_reason, paused_at, last_tick FROM ll_job_state")
            .fetch_all(&self.pool)
            .await
            .ctx("reading job state")?;
        Ok(rows.iter().map(|r| (r.text("job"), job_state_from_row(r))).collect())
    }

    /// The state, the recent runs and the counts, read at once on three connections.
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
        let (state, recent, counts) =
            tokio::try_join!(super::JobStates::job_state(self, job), super::Listings::list_runs(self, &filter), counts)?;
        Ok(JobOverview { state, recent: recent.iter().map(crate::run::Run::brief).collect(), counts })
    }

    /// Each job's newest run straight from the `(job, id)` index.
    async fn last_runs(&self, jobs: &[&str]) -> Result<HashMap<String, RunBrief>, StoreError> {
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
}

impl UpkeepSql for PgStore {
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

    async fn close(&self) {
        self.recorder.close().await;
        self.pool.close().await;
    }

    async fn check(&self) -> Result<(), String> {
        match tokio::time::timeout(Duration::from_secs(2), sqlx::query("SELECT 1").execute(&self.pool)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("the database does not answer: {e}")),
            Err(_) => Err("the database does not answer within 2s".into()),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::contract::tick;
    use crate::store::{Claim, Ends, Leases, NewRun, Records, Ticks, Upkeep};
    use chrono::{DateTime, Utc};
    use lamplighter_config::Overlap;

    async fn store(cluster: &lamplighter_tests::pg::Cluster) -> PgStore {
        store_of(cluster, 4).await
    }

    /// A migrated store whose pool holds `connections`.
    async fn store_of(cluster: &lamplighter_tests::pg::Cluster, connections: u32) -> PgStore {
        let store = PgStore::connect(&cluster.url(), connections, Duration::from_secs(30)).await.expect("connect");
        UpkeepSql::migrate(&store).await.expect("migrate");
        store
    }

    fn worker(name: &str) -> WorkerId {
        WorkerId { name: name.into(), instance: format!("{name}-1"), host: "h".into(), pid: 1 }
    }

    /// A migrated store whose worker `a` holds a live lease from the time returned.
    async fn leased(cluster: &lamplighter_tests::pg::Cluster) -> (PgStore, DateTime<Utc>) {
        lease(store(cluster).await).await
    }

    /// `s`, its worker `a` holding a live lease from the time returned.
    async fn lease(s: PgStore) -> (PgStore, DateTime<Utc>) {
        let t0 = Utc::now();
        assert!(Leases::heartbeat(&s, &worker("a"), Duration::from_secs(60), true, t0).await.expect("lease").is_some());
        (s, t0)
    }

    /// `n` ticks of as many jobs, due a second before `t0`, queued.
    async fn queue_ticks(s: &PgStore, n: usize, t0: DateTime<Utc>) {
        let batch: Vec<(NewRun, Overlap)> =
            (0..n).map(|i| (tick(&format!("job-{i}"), t0 - chrono::Duration::seconds(1)), Overlap::Allow)).collect();
        s.fire_ticks(batch, Claim { worker: "a", slots: 0 }, t0).await.expect("fire");
    }

    /// A statement prepared on one of the recorder's connections.
    struct Prepared {
        statement: String,
        /// What each call of it runs (the recorder's plans are generic: the arguments, all NULL
        /// here, do not matter).
        plan: String,
        /// Calls so far that ran the generic plan, and those planned for their arguments.
        generic: i64,
        custom: i64,
    }

    /// Every statement prepared on the recorder's connections, both held at once and each
    /// asked about its own.
    async fn recorder_statements(s: &PgStore) -> Vec<Prepared> {
        let (mut one, mut two) = (s.recorder.acquire().await.expect("a connection"), s.recorder.acquire().await.expect("another"));
        let mut all = Vec::new();
        for c in [&mut *one, &mut *two] {
            let prepared: Vec<(String, String, i32, i64, i64)> = sqlx::query_as(
                "SELECT name, statement, cardinality(parameter_types), generic_plans, custom_plans
                 FROM pg_prepared_statements WHERE statement NOT LIKE '%pg_prepared_statements%'",
            )
            .fetch_all(&mut *c)
            .await
            .expect("the connection's statements");
            for (name, statement, params, generic, custom) in prepared {
                let args = if params == 0 { String::new() } else { format!("({})", vec!["NULL"; params as usize].join(", ")) };
                let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN EXECUTE \"{name}\"{args}")))
                    .fetch_all(&mut *c)
                    .await
                    .expect("the plan");
                all.push(Prepared { statement, plan: plan.join("\n"), generic, custom });
            }
        }
        all
    }

    /// Fails on the first of `prepared` whose plan reads `ll_runs` whole ([`scans_by_key`]).
    fn assert_found_by_key(prepared: &[Prepared]) {
        for p in prepared {
            if let Err(scan) = scans_by_key(&p.plan) {
                panic!("a write reads ll_runs whole ({scan}):\n{}\n{}", p.statement, p.plan);
            }
        }
    }

    /// The nodes of `plan` (EXPLAIN's text): each node's line without its arrow, and its own
    /// lines (conditions, counts) up to the next node.
    fn plan_nodes(plan: &str) -> Vec<(&str, Vec<&str>)> {
        let lines: Vec<&str> = plan.lines().collect();
        let own = |i: usize| lines[i + 1..].iter().take_while(|l| !l.contains("->")).copied().collect();
        let nodes = lines.iter().enumerate().filter(|(i, l)| *i == 0 || l.contains("->"));
        nodes.map(|(i, l)| (l.trim_start().trim_start_matches("->").trim_start(), own(i))).collect()
    }

    /// Whether every scan of `ll_runs` in `plan` (EXPLAIN's text) finds its rows by an index
    /// condition: no sequential scan, and no index read whole. Errs with the first that does not.
    fn scans_by_key(plan: &str) -> Result<(), String> {
        for (node, own) in plan_nodes(plan) {
            let Some(at) = node.find(" on ll_runs ") else { continue };
            let kind = &node[..at];
            if ["Update", "Insert", "Delete", "Bitmap Heap Scan"].iter().any(|k| kind.starts_with(k)) {
                continue;
            }
            let keyed =
                (kind.starts_with("Index Scan") || kind.starts_with("Index Only Scan")) && own.iter().any(|l| l.contains("Index Cond:"));
            if !keyed {
                return Err(node.to_string());
            }
        }
        Ok(())
    }

    #[test]
    fn a_scan_by_key_is_told_from_a_whole_read() {
        let keyed = "Nested Loop\n  ->  Index Scan using ll_runs_pkey on ll_runs ll_runs_2  (cost=1)\n        Index Cond: (id = x)\n";
        assert_eq!(scans_by_key(keyed), Ok(()));
        let whole = "Merge Join\n  ->  Index Scan using ll_runs_pkey on ll_runs  (cost=1)\n        Filter: (status = 'queued')\n  ->  Sort\n        Sort Key: x\n";
        assert!(scans_by_key(whole).is_err(), "an index read whole");
        assert!(scans_by_key("Hash Join\n  ->  Seq Scan on ll_runs ll_runs_1  (cost=1)\n").is_err(), "a sequential scan");
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
        for name in names {
            assert!(Leases::heartbeat(&stores[0], &worker(name), Duration::from_secs(60), true, t0).await.expect("lease").is_some());
        }
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
        let tasks: i64 = sqlx::query_scalar(sql!("SELECT count(*) FROM ll_runs WHERE status = {Queued} AND dispatched_at IS NOT NULL"))
            .fetch_one(&stores[0].pool)
            .await
            .expect("count");
        let running: i64 = sqlx::query_scalar(sql!("SELECT count(*) FROM ll_runs WHERE status = {Running}"))
            .fetch_one(&stores[0].pool)
            .await
            .expect("count");
        assert_eq!((tasks + running) as usize, ticks.len(), "every run is either claimed or handed to the queue");

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

    /// Two workers drain the queue the recorder's way, each write ending its last batch and
    /// claiming the next (one statement on PostgreSQL): every run is claimed once and ended,
    /// nobody takes more than it asked for, and a run cancelled while in the queue is not taken.
    #[tokio::test]
    async fn ends_and_claims_in_one_statement_take_each_run_once() {
        let cluster = lamplighter_tests::pg::Cluster::start();
        let stores = [store(&cluster).await, store(&cluster).await];
        let t0 = Utc::now();
        let names = ["a", "b"];
        for name in names {
            assert!(Leases::heartbeat(&stores[0], &worker(name), Duration::from_secs(60), true, t0).await.expect("lease").is_some());
        }
        let batch: Vec<(NewRun, Overlap)> =
            (0..40).map(|i| (tick(&format!("job-{i}"), t0 - chrono::Duration::seconds(1)), Overlap::Allow)).collect();
        stores[0].fire_ticks(batch, Claim { worker: "a", slots: 0 }, t0).await.expect("fire");
        let first: String = sqlx::query_scalar("SELECT min(id) FROM ll_runs").fetch_one(&stores[0].pool).await.expect("a run");
        assert!(stores[0].finish(&first, RunStatus::Cancelled, None, Some("asked"), t0).await.expect("cancel"));
        let later = t0 + chrono::Duration::seconds(1);
        let drains = stores.iter().zip(names).map(|(s, name)| async move {
            let (mut mine, mut tasks, mut last) = (Vec::new(), 0, Vec::<String>::new());
            loop {
                let ends: Vec<RunEnd<'_>> = last.iter().map(|id| crate::store::contract::end(id, RunStatus::Succeeded)).collect();
                let (done, taken) = s.finish_and_claim(&ends, 3, name, later).await.expect("ends and claims");
                assert_eq!(done.len(), ends.len(), "{name}'s ends recorded");
                assert!(taken.tasks <= 3, "{name} asked for 3 and took {}", taken.tasks);
                tasks += taken.tasks;
                last = taken.runs.into_iter().map(|h| h.run.id).collect();
                if taken.tasks == 0 {
                    return (mine, tasks);
                }
                mine.extend(last.iter().cloned());
            }
        });
        let drained = futures::future::join_all(drains).await;
        let tasks: usize = drained.iter().map(|(_, n)| n).sum();
        let claimed: Vec<&String> = drained.iter().flat_map(|(m, _)| m).collect();
        let unique: HashSet<&String> = claimed.iter().copied().collect();
        assert_eq!((tasks, claimed.len(), unique.len()), (39, 39, 39), "every run taken once; the cancelled one not at all");
        let count = |status: RunStatus| {
            let pool = stores[0].pool.clone();
            async move {
                let n: i64 = sqlx::query_scalar("SELECT count(*) FROM ll_runs WHERE status = $1")
                    .bind(status.as_str())
                    .fetch_one(&pool)
                    .await
                    .expect("count");
                n
            }
        };
        assert_eq!((count(RunStatus::Succeeded).await, count(RunStatus::Queued).await, count(RunStatus::Cancelled).await), (39, 0, 1));
    }

    /// A pick with ends starts where this worker's last one ended, not at the head of the
    /// queue's index (whose entries of runs claimed stay until vacuum); a run handed over behind
    /// that place is taken once those ahead do not fill a pick, or once 250 ms have passed since
    /// the pick that started from the head.
    #[tokio::test]
    async fn a_pick_starts_where_the_last_one_ended_and_still_takes_runs_behind_it() {
        let cluster = lamplighter_tests::pg::Cluster::start();
        let (s, t0) = leased(&cluster).await;
        queue_ticks(&s, 6, t0).await;
        // The six runs in hand-over order r1..r6 (1001..1006).
        sqlx::query("UPDATE ll_runs SET dispatched_at = 1000 + r.n FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM ll_runs) r WHERE ll_runs.id = r.id")
            .execute(&s.pool)
            .await
            .expect("order the queue");
        let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM ll_runs ORDER BY dispatched_at").fetch_all(&s.pool).await.expect("runs");
        // Run `i` queued, handed over at `at`.
        let requeue = |i: usize, at: i64| {
            let (pool, id) = (s.pool.clone(), ids[i].clone());
            async move {
                sqlx::query("UPDATE ll_runs SET status = 'queued', dispatched_at = $2 WHERE id = $1")
                    .bind(id)
                    .bind(at)
                    .execute(&pool)
                    .await
                    .expect("queue again")
            }
        };
        let take = |n: usize, at_ms: i64| {
            let s = &s;
            async move {
                let (_, taken) = s.finish_and_claim(&[], n, "a", t0 + chrono::Duration::milliseconds(at_ms)).await.expect("claims");
                let mut got: Vec<String> = taken.runs.into_iter().map(|h| h.run.id).collect();
                got.sort();
                got
            }
        };
        let want = |i: &[usize]| {
            let mut w: Vec<String> = i.iter().map(|&i| ids[i].clone()).collect();
            w.sort();
            w
        };
        assert_eq!(take(2, 0).await, want(&[0, 1]), "the first pick starts at the head");
        // r6 is handed over again behind the place the last pick ended at (r2).
        requeue(5, 500).await;
        assert_eq!(take(1, 10).await, want(&[2]), "the next starts after r2, not at r6 (first in the index)");
        assert_eq!(take(3, 20).await, want(&[3, 4, 5]), "those ahead (r4, r5) do not fill it: r6 too");
        // The place is r5's (the last in order), kept from the pick at 0 ms. r3 is queued again
        // ahead of it, r1 behind it.
        requeue(2, 2000).await;
        requeue(0, 100).await;
        assert_eq!(take(1, 240).await, want(&[2]), "within 250 ms of the pick from the head, the run ahead first");
        requeue(1, 3000).await;
        assert_eq!(take(1, 251).await, want(&[0]), "past 250 ms, the place is forgotten: r1 (behind) first");
        assert_eq!(take(5, 260).await, want(&[1]), "and the place is r1's again: r2 ahead of it");
        assert_eq!(take(5, 270).await, Vec::<String>::new(), "nothing left");
    }

    /// The recorder's statements are planned once a connection: a drain of small batches is not
    /// planned again at every write (left to choose, with the table's statistics analyzed, the
    /// server did: a quarter of the write's time).
    #[tokio::test]
    async fn the_recorder_plans_its_statements_once() {
        let cluster = lamplighter_tests::pg::Cluster::start();
        let (s, t0) = leased(&cluster).await;
        queue_ticks(&s, 30, t0).await;
        sqlx::query("ANALYZE ll_runs").execute(&s.pool).await.expect("analyze");
        let (mut writes, mut last) = (0, Vec::<String>::new());
        loop {
            let ends: Vec<RunEnd<'_>> = last.iter().map(|id| crate::store::contract::end(id, RunStatus::Succeeded)).collect();
            let (done, taken) = s.finish_and_claim(&ends, 2, "a", t0).await.expect("ends and claims");
            assert_eq!(done.len(), ends.len(), "ends recorded");
            writes += 1;
            if taken.tasks == 0 {
                break;
            }
            last = taken.runs.into_iter().map(|h| h.run.id).collect();
        }
        assert!(writes > 10, "enough writes for the server to settle on a plan: {writes}");
        let writes_prepared = recorder_statements(&s).await.into_iter().filter(|p| p.statement.starts_with("WITH ended AS"));
        let plans = writes_prepared.fold((0, 0), |(g, c), p| (g + p.generic, c + p.custom));
        assert_eq!(plans.1, 0, "no write planned for its arguments ({} generic)", plans.0);
        assert!(plans.0 >= writes, "every write ran a prepared generic plan: {} of {writes}", plans.0);
    }

    /// A tick's batch inserts are one statement text whatever their number of rows, so a
    /// connection prepares each once (and the server settles on a generic plan after five): as
    /// `VALUES` lists (a parameter a value), the server planned a tick's 1,000 runs anew at
    /// every tick, 3.5 ms a tick in the shares bench.
    #[tokio::test]
    async fn a_ticks_inserts_are_one_statement_whatever_the_number_of_runs() {
        let cluster = lamplighter_tests::pg::Cluster::start();
        // One connection in the pool, where ticks are written: its statements are all of them.
        let (s, t0) = lease(store_of(&cluster, 1).await).await;
        let sizes = [3usize, 5, 8, 13, 2, 7];
        for (second, n) in sizes.into_iter().enumerate() {
            let at = t0 + chrono::Duration::seconds(second as i64);
            let batch: Vec<(NewRun, Overlap)> = (0..n).map(|i| (tick(&format!("job-{i}"), at), Overlap::Allow)).collect();
            let fired = s.fire_ticks(batch, Claim { worker: "a", slots: 2 }, at).await.expect("fire");
            assert_eq!(fired.iter().filter(|o| o.is_some()).count(), n, "every tick of second {second} fired");
        }
        let (runs, claimed): (i64, i64) = sqlx::query_as("SELECT count(*), count(*) FILTER (WHERE status = 'running') FROM ll_runs")
            .fetch_one(&s.pool)
            .await
            .expect("runs");
        assert_eq!((runs, claimed), (sizes.iter().sum::<usize>() as i64, 2 * sizes.len() as i64), "runs inserted, two claimed a tick");
        let prepared: Vec<String> = sqlx::query_scalar("SELECT statement FROM pg_prepared_statements")
            .fetch_all(&mut *s.pool.acquire().await.expect("the pool's connection"))
            .await
            .expect("its statements");
        for table in ["INSERT INTO ll_runs", "INSERT INTO ll_job_state"] {
            let texts: std::collections::HashSet<&str> = prepared.iter().filter(|p| p.starts_with(table)).map(String::as_str).collect();
            assert_eq!(texts.len(), 1, "{table}: one text for batches of 2 to 13 rows, not {}", texts.len());
        }
    }

    /// The recorder's statements find the runs they claim by key, whatever the table holds: as
    /// `IN (SELECT …)`, the hand-off's plan (which reckons thousands of heads) joined them to a
    /// scan of the whole table at every write, 3.5 ms a write with 20,000 runs waiting.
    #[tokio::test]
    async fn the_recorders_claims_find_their_runs_by_key_in_a_large_table() {
        let cluster = lamplighter_tests::pg::Cluster::start();
        let (s, t0) = leased(&cluster).await;
        // A history and a line: 20,000 runs ended, 20,000 waiting for a pool's slots, analyzed.
        sqlx::query(
            "INSERT INTO ll_runs (id, job, trigger, status, due_at, enqueued_at, attempt, limits, limit_wait, limit_wait_since)
             SELECT lpad(i::text, 12, '0'), 'j', 'manual', CASE WHEN i % 2 = 0 THEN 'succeeded' ELSE 'queued' END, 1, 1, 1,
                    CASE WHEN i % 2 = 0 THEN NULL ELSE '[[\"pool\",\"\"]]' END, CASE WHEN i % 2 = 0 THEN NULL ELSE 'pool' END, 1
             FROM generate_series(1, 40000) i",
        )
        .execute(&s.pool)
        .await
        .expect("runs");
        sqlx::query("ANALYZE ll_runs").execute(&s.pool).await.expect("analyze");
        let now = t0.timestamp_millis();
        let sizes: crate::limits::Sizes = [("pool".to_string(), 2)].into();
        // Each statement prepared on the recorder's connections (nothing to end: nothing taken).
        for _ in 0..2 {
            s.ends_and_claims_at_once(&[], 1, "a", now).await.expect("a statement").expect("ends and claims");
            s.ends_and_hand_offs_at_once(&[], &sizes, 1, "a", now).await.expect("a statement").expect("ends and hand-offs");
        }
        let prepared = recorder_statements(&s).await;
        assert_found_by_key(&prepared);
        for part in ["picked AS MATERIALIZED", "dropped AS"] {
            assert!(prepared.iter().any(|p| p.statement.contains(part)), "no statement with {part} explained");
        }
    }

    /// A tick reads the active runs of the jobs it fires by their job, whichever plan the
    /// server keeps for it. With the active runs indexed by status, a plan read them all, or
    /// (the generic plan a pool's connection settled on in the shares bench) joined them to
    /// every kept run of those jobs through `ll_runs_by_job_id`: 5.4 ms a tick for 1,000 jobs
    /// keeping 100 runs, growing with the history kept.
    #[tokio::test]
    async fn a_ticks_read_of_active_runs_does_not_read_the_jobs_history() {
        let cluster = lamplighter_tests::pg::Cluster::start();
        let s = store(&cluster).await;
        // 300 jobs keeping 100 runs each, the last of every tenth job running; analyzed.
        sqlx::query(
            "INSERT INTO ll_runs (id, job, trigger, status, due_at, enqueued_at, attempt, finished_at, outcome_seen)
             SELECT lpad(i::text, 12, '0'), 'j' || (i % 300), 'cron', CASE WHEN running THEN 'running' ELSE 'succeeded' END,
                    i, i, 1, CASE WHEN running THEN NULL ELSE i END, CASE WHEN running THEN NULL ELSE 1 END
             FROM (SELECT i, i > 29700 AND i % 10 = 0 AS running FROM generate_series(1, 30000) i) g",
        )
        .execute(&s.pool)
        .await
        .expect("runs");
        sqlx::query("ANALYZE ll_runs").execute(&s.pool).await.expect("analyze");
        let mut c = s.pool.acquire().await.expect("a connection");
        let statement = crate::store::scripts::active_runs_sql::<PgStore>();
        sqlx::query(sqlx::AssertSqlSafe(format!("PREPARE active(text[], text, boolean) AS {statement}")))
            .execute(&mut *c)
            .await
            .expect("prepare");
        // A third of the jobs fire (a worker's share of three).
        let jobs = (0..100).map(|i| format!("j{i}")).collect::<Vec<_>>().join(",");
        for mode in ["force_generic_plan", "force_custom_plan"] {
            sqlx::query(sqlx::AssertSqlSafe(format!("SET plan_cache_mode = {mode}"))).execute(&mut *c).await.expect("mode");
            let plan: Vec<String> =
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN ANALYZE EXECUTE active('{{{jobs}}}', 'backfill', false)")))
                    .fetch_all(&mut *c)
                    .await
                    .expect("the plan");
            let plan = plan.join("\n");
            assert!(!plan.contains("ll_runs_by_job_id"), "{mode}: the read goes through the jobs' history:\n{plan}");
            // The active runs' index, its own condition by job, and what it found.
            let nodes = plan_nodes(&plan);
            let scan = nodes.iter().find(|(node, _)| node.contains(" ll_runs_active "));
            assert!(
                scan.is_some_and(|(node, own)| node.contains("rows=10 loops=1") && own.iter().any(|l| l.contains("Index Cond: (job = ANY"))),
                "{mode}: the ten running runs of the jobs fired are not found by job:\n{plan}"
            );
        }
    }

    /// A lease renewal's read of the interrupted runs not followed up, and the gauges' count
    /// of the queued runs, look them up by status: behind a backlog of 20,000 queued runs and
    /// a history of 80,000, a renewal does not read the backlog. (With the active runs keyed by
    /// job alone, both read every active run.)
    #[tokio::test]
    async fn the_renewals_and_the_gauges_reads_find_runs_by_status_behind_a_backlog() {
        let cluster = lamplighter_tests::pg::Cluster::start();
        let s = store(&cluster).await;
        sqlx::query(
            "INSERT INTO ll_runs (id, job, trigger, status, due_at, enqueued_at, attempt, dispatched_at)
             SELECT lpad(i::text, 12, '0'), 'j' || (i % 50), 'manual',
                    CASE WHEN i <= 2 THEN 'interrupted' WHEN i <= 20000 THEN 'queued' ELSE 'succeeded' END, 1, 1, 1, 1
             FROM generate_series(1, 100000) i",
        )
        .execute(&s.pool)
        .await
        .expect("runs");
        sqlx::query("VACUUM ANALYZE ll_runs").execute(&s.pool).await.expect("analyze");
        // How often the index was read, as the server counts (its counts reach the view within
        // a second or so of the reading transaction's end).
        let scans = || async {
            sqlx::query("SELECT pg_stat_clear_snapshot()").execute(&s.pool).await.expect("fresh stats");
            sqlx::query_scalar::<_, i64>("SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'll_runs_unfollowed'")
                .fetch_one(&s.pool)
                .await
                .expect("the index's reads")
        };
        let before = scans().await;
        let interrupted = Leases::interrupted_without_follow_up(&s).await.expect("interrupted runs");
        assert_eq!(interrupted.len(), 2);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while scans().await <= before {
            assert!(std::time::Instant::now() < deadline, "the interrupted runs were not read by their index");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The count of the queued runs finds them by status in the active runs' index.
        let mut c = s.pool.acquire().await.expect("a connection");
        let plan: Vec<String> = sqlx::query_scalar("EXPLAIN ANALYZE SELECT count(*) AS n FROM ll_runs WHERE status = 'queued'")
            .fetch_all(&mut *c)
            .await
            .expect("the plan");
        let plan = plan.join("\n");
        assert!(
            plan.contains("ll_runs_active") && plan.contains("Index Cond: (status = 'queued'::text)"),
            "the queued runs are not found by status:\n{plan}"
        );
        assert_eq!(crate::store::Listings::queue_depth(&s).await.expect("the depth"), 19_998);
    }

    /// The ends the recorder writes without claims run on its connections too, and none of its
    /// plans scans a table, not even one made while the table was small and kept since (the
    /// server makes another only when autovacuum next analyzes the table).
    #[tokio::test]
    async fn the_recorders_plans_made_on_a_small_table_find_runs_by_key_once_it_has_grown() {
        let cluster = lamplighter_tests::pg::Cluster::start();
        let (s, t0) = leased(&cluster).await;
        queue_ticks(&s, 4, t0).await;
        let (_, taken) = s.finish_and_claim(&[], 4, "a", t0).await.expect("claims");
        let ids: Vec<String> = taken.runs.into_iter().map(|h| h.run.id).collect();
        assert_eq!(ids.len(), 4, "the runs claimed");
        // Ends without claims, a plain one and one whose success is noticed: one statement.
        let plain = crate::store::contract::end(&ids[0], RunStatus::Succeeded);
        let noticed = RunEnd { noticed: true, ..crate::store::contract::end(&ids[1], RunStatus::Succeeded) };
        assert_eq!(s.finish_many(&[plain], t0).await.expect("an end").len(), 1);
        assert_eq!(s.finish_many(&[noticed], t0).await.expect("a noticed end").len(), 1);
        s.ends_and_claims_at_once(&[], 1, "a", t0.timestamp_millis()).await.expect("a statement").expect("ends and claims");
        // The table grows, and is not analyzed again.
        sqlx::query(
            "INSERT INTO ll_runs (id, job, trigger, status, due_at, enqueued_at, attempt, worker)
             SELECT lpad(i::text, 12, '0'), 'j', 'manual', CASE WHEN i % 10 = 0 THEN 'running' ELSE 'succeeded' END, 1, 1, 1, 'a'
             FROM generate_series(1, 40000) i",
        )
        .execute(&s.pool)
        .await
        .expect("runs");
        let prepared = recorder_statements(&s).await;
        assert_found_by_key(&prepared);
        let explained: Vec<&str> = prepared.iter().map(|p| p.statement.trim_start()).collect();
        // Ends alone, and ends with claims: each one statement (prepared on either connection).
        let ends_statements = explained.iter().filter(|e| e.starts_with("WITH ended AS")).collect::<std::collections::HashSet<_>>().len();
        assert_eq!(ends_statements, 2, "the ends' statements on the recorder's connections: {explained:?}");
    }

    /// A database an earlier version used has an apalis task for each run it handed to the
    /// queue: the runs are claimed from their rows all the same, each once, and the
    /// housekeeping drops the tasks.
    #[tokio::test]
    async fn an_earlier_versions_tasks_are_dropped_and_their_runs_claimed() {
        use apalis::prelude::{TaskBuilder, TaskId};
        let cluster = lamplighter_tests::pg::Cluster::start();
        let (s, t0) = leased(&cluster).await;
        let batch: Vec<(NewRun, Overlap)> = (0..5).map(|i| (tick(&format!("job-{i}"), t0), Overlap::Allow)).collect();
        s.fire_ticks(batch, Claim { worker: "a", slots: 0 }, t0).await.expect("fire");
        let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM ll_runs").fetch_all(&s.pool).await.expect("runs");
        // As the earlier version pushed them (apalis's `push_tasks`, a `RunTask` each).
        let tasks: Vec<apalis_postgres::PgTask> = ids
            .iter()
            .map(|id| {
                TaskBuilder::new(crate::store::RunTask::encode(id).expect("encode"))
                    .task_id(TaskId::from_ulid(ulid::Ulid::generate()))
                    .build()
            })
            .collect();
        apalis_postgres::queries::push_tasks(&mut *s.pool.acquire().await.expect("connection"), crate::store::QUEUE, tasks)
            .await
            .expect("push");
        let taken = s.claim_queued(10, "a", t0).await.expect("claim");
        let mut claimed: Vec<String> = taken.runs.into_iter().map(|h| h.run.id).collect();
        claimed.sort();
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!((taken.tasks, claimed), (5, expected));
        assert_eq!(s.claim_queued(10, "a", t0).await.expect("claim").tasks, 0, "each once");
        Upkeep::housekeeping(&s).await.expect("housekeeping");
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM apalis.jobs").fetch_one(&s.pool).await.expect("count");
        assert_eq!(left, 0);
    }

    /// A tick transaction holds the states of the jobs it fires until their instant, and another
    /// worker's end holds its own row of the job's successes. A success noticed at its end waits
    /// for neither (its run would stay active past that tick, and `overlap: forbid` skip it;
    /// three workers ending one job's runs would take turns): the end is written and noticed at
    /// once, by each of the recorder's statements (ends alone, ends with claims), and the
    /// job's health folds both workers' successes.
    #[tokio::test]
    async fn a_success_noticed_at_its_end_waits_for_no_other_writer_of_its_job() {
        use crate::store::contract::{end, no_after, no_rules_of_q};
        use crate::store::{Hold, Notices};
        let cluster = lamplighter_tests::pg::Cluster::start();
        let (s, t0) = leased(&cluster).await;
        let batch: Vec<(NewRun, Overlap)> = (0..2).map(|i| (tick("q", t0 - chrono::Duration::seconds(2 - i)), Overlap::Allow)).collect();
        let fired = s.fire_ticks(batch, Claim { worker: "a", slots: 2 }, t0).await.expect("fire");
        let ids: Vec<String> = fired.iter().map(|o| o.as_ref().expect("fresh").run_id.clone()).collect();
        let noticed = |id| RunEnd { last: true, noticed: true, ..end(id, RunStatus::Succeeded) };

        // Worker b's end of a later success of q, not yet committed.
        let later = crate::store::from_ms(crate::store::ms(t0) + 500);
        let mut other = s.pool.begin().await.expect("b's transaction");
        sqlx::query("INSERT INTO ll_job_successes (job, worker, at) VALUES ('q', 'b', $1)")
            .bind(crate::store::ms(later))
            .execute(&mut *other)
            .await
            .expect("b's success");
        let (ready, held) = tokio::sync::oneshot::channel();
        let (go, answer) = tokio::sync::oneshot::channel::<bool>();
        let hold: Hold<'_> = Box::pin(async move {
            ready.send(()).expect("the ends wait for the hold");
            answer.await.expect("an answer")
        });
        let next = t0 + chrono::Duration::seconds(1);
        let fire = s.fire_ticks_held(vec![(tick("q", next), Overlap::Allow)], Claim { worker: "a", slots: 0 }, next, Some(hold));
        let ends = async {
            held.await.expect("the tick transaction reached its hold");
            let written = async {
                let one = s.finish_many(&[noticed(&ids[0])], t0).await.expect("end");
                let (two, _) = s.finish_and_claim(&[noticed(&ids[1])], 1, "a", t0).await.expect("end and claim");
                (one, two)
            };
            // Waiting for the tick's locks, or b's, would wait for ever: both are let go below.
            let written = tokio::time::timeout(Duration::from_secs(30), written).await.expect("the ends wait for nobody");
            go.send(true).expect("the tick waits");
            written
        };
        let (fired, (one, two)) = tokio::join!(fire, ends);
        assert!(fired.expect("fire").is_some(), "the tick committed");
        assert_eq!((one, two), (vec![ids[0].clone()], vec![ids[1].clone()]), "both ends recorded");
        assert_eq!(s.unnoticed_since().await.expect("unnoticed"), None, "noticed at their end");
        let state = || async { s.job_health().await.expect("health").remove("q").map(|h| (h.consecutive_failures, h.last_success)) };
        assert_eq!(state().await, Some((0, Some(crate::store::from_ms(crate::store::ms(t0))))), "a's successes");
        other.commit().await.expect("b commits");
        assert_eq!(state().await, Some((0, Some(later))), "the later of both workers' successes");
        assert_eq!(s.notice(&no_rules_of_q, &no_after, false, next).await.expect("notice").runs, 0, "nothing left to the pass");
    }

    /// Recovery by another worker leaves a live worker's runs alone, and takes a dead one's
    /// once its lease has run out.
    #[tokio::test]
    async fn recovery_takes_only_runs_of_workers_whose_lease_ran_out() {
        let cluster = lamplighter_tests::pg::Cluster::start();
        let s = store(&cluster).await;
        let now = Utc::now();
        let (live, dead) = (worker("live"), worker("dead"));
        assert!(Leases::heartbeat(&s, &live, Duration::from_secs(60), true, now).await.expect("lease").is_some());
        let epoch = Leases::heartbeat(&s, &dead, Duration::from_secs(60), true, now).await.expect("lease").expect("taken").epoch;
        let a = s.fire_ticks(vec![(tick("a", now), Overlap::Allow)], Claim { worker: "live", slots: 1 }, now).await.expect("fire");
        let b = s.fire_ticks(vec![(tick("b", now), Overlap::Allow)], Claim { worker: "dead", slots: 1 }, now).await.expect("fire");
        let (a, b) = (a[0].as_ref().expect("fresh").run_id.clone(), b[0].as_ref().expect("fresh").run_id.clone());
        assert!(s.recover(None, now).await.expect("recover").is_empty(), "both leases are live");
        // The dead worker's lease runs out, on the server's clock; the margin its runs need to
        // stop has not passed yet: nobody takes them, and it can no longer write for them.
        let expire = |column: &'static str| {
            sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE ll_workers SET {column} = {DB_NOW_MS} - 1 WHERE name = 'dead'")))
                .execute(&s.pool)
        };
        expire("lease_until").await.expect("lease runs out");
        assert!(s.recover(None, now).await.expect("recover").is_empty(), "within the margin, nobody takes over");
        let end = RunEnd {
            id: &b,
            started_at: None,
            ended_at: None,
            status: RunStatus::Succeeded,
            output: None,
            error: None,
            wait_until: None,
            trace_id: None,
            last: true,
            limits: None,
            noticed: true,
        };
        assert!(s.finish_many(&[end], now).await.expect("finish").is_empty(), "a lapsed lease's write is refused");
        let step = crate::run::StepRecord {
            step: "s".into(),
            status: crate::run::StepStatus::Running,
            attempt: 1,
            run_id: b.clone(),
            started_at: Some(now),
            finished_at: None,
            output: None,
            error: None,
            resumes_on_reject: false,
        };
        assert!(s.record_steps(&b, &[step]).await.expect_err("fenced").is_fenced());
        let workers: Vec<String> = s.workers(now).await.expect("workers").into_iter().map(|w| w.name).collect();
        assert_eq!(workers, ["live"], "only live leases are listed");
        // The worker comes back and renews: a new epoch, whose runs are its own; the old
        // epoch's runs keep their margin to stop (the old lease's takeover time), then go.
        let again = Leases::heartbeat(&s, &dead, Duration::from_secs(60), false, now).await.expect("renew").expect("held");
        assert_eq!(again.epoch, epoch + 1, "renewing a lease that ran out starts a new epoch");
        assert!(s.recover(None, now).await.expect("recover").is_empty(), "the old epoch's runs keep their margin");
        expire("fenced_until").await.expect("margin passes");
        let taken: Vec<String> = s.recover(None, now).await.expect("recover").into_iter().map(|r| r.id).collect();
        assert_eq!(taken, vec![b.clone()]);
        let live_run = s.get_run(&a).await.expect("get").expect("run");
        assert_eq!(live_run.status, RunStatus::Running, "a live worker's run is never touched");
        // The lease says the server's time, whatever the caller's clock said (`now` is ignored).
        let skewed = now + chrono::Duration::hours(3);
        let lease = Leases::heartbeat(&s, &dead, Duration::from_secs(60), false, skewed).await.expect("renew").expect("held");
        assert!((lease.server_now - Utc::now()).num_seconds().abs() < 5, "{:?}", lease.server_now);
    }
}
