//! The SQLite backend: Lamplighter's tables (`migrations/sqlite`) and apalis-sqlite's queue in
//! one database file, served to one worker (the engine holds a file lock). Its [`Dialect`]:
//! one connection writes, so transactions never meet and nothing needs locking; batches are
//! bound as one JSON array each; leases run on the application's clock; listings read many
//! rows as one JSON row.

mod queue;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Sqlite;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};

use super::dialect::{
    Arg, Batch, Column, Dialect, EndsAndClaims, LeaseSql, QueueSql, ReadSql, Record, RowsBind, RunSql, Spelling, Stmt, UpkeepSql,
    record_for, run_cols, sql,
};
use super::scripts::{FINISH_RUNS, claim_sql, end_cols, end_rows, noticed_at_end};
use super::{
    Backend, BriefRow, Ctx, JobOverview, JobState, OpenError, RunBrief, RunEnd, StorageKind, StoreError, WorkerId, brief, from_ms,
};
use crate::run::RunStatus;
use crate::signals::Local;

/// How SQLite spells what the dialects spell differently.
pub(super) const SPELLING: Spelling = Spelling {
    greatest: "max",
    // One connection writes: a transaction's reads are already its own.
    lock: "",
    lock_skip: "",
    // Without statistics the planner prefers the status index, which holds every queued run;
    // `INDEXED BY` makes it use the partial index (migration 0003) and fails loudly if it ever
    // cannot. The statements spell the index's guard out, so the planner can prove their rows
    // lie inside it.
    undispatched: "INDEXED BY ll_runs_undispatched",
    limit_waits: "INDEXED BY ll_runs_limit_waits",
    in_list: |param| format!("IN (SELECT value FROM json_each({param}))"),
    // A JSON array of arrays ([`rows_json`]), one parameter.
    rows: |params, alias, cols| {
        let cols: Vec<String> = cols.iter().enumerate().map(|(i, (c, _))| format!("value ->> '$[{i}]' AS {c}")).collect();
        format!("(SELECT {} FROM json_each({})) AS {alias}", cols.join(", "), params[0])
    },
    rows_bind: RowsBind::One,
    batch: Batch::Values,
    // `+status`: the planner drives such a statement from the batch and finds each run by id
    // (driven from the status index, the batch was scanned once per running run: seconds for a
    // thousand ends).
    by_id: "+",
    // One connection writes: nothing to lock. `+status`: as `by_id` (on the status index a
    // claim walked every queued run: 7 ms per claim with 50,000 queued).
    claim_pick: |which, _| (String::new(), String::new(), format!("{which} AND +status = {{Queued}}")),
    // The file lock keeps every other worker out: nobody can take this one's runs over.
    lease_live: "",
    // The table's own: a new row takes one larger than every row there.
    notification_seq: "rowid",
    param: '?',
};

record_for!(SqliteRow);

/// A job's state as `job_states` aggregates it: job, paused, reason, paused at, last tick.
type JobStateRow = (String, i64, Option<String>, Option<i64>, Option<i64>);

/// No `$n` placeholder in `sql` (for the debug checks above each statement).
fn numbered_as_sqlite(sql: &str) -> bool {
    !sql.as_bytes().windows(2).any(|w| w[0] == b'$' && w[1].is_ascii_digit())
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

/// A JSON array of texts, as `json_each` reads a list.
fn json_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    serde_json::to_string(&items.into_iter().collect::<Vec<_>>()).unwrap_or_else(|_| "[]".into())
}

/// A row set as a JSON array of arrays, a row an array of its columns' values in order: how
/// SQLite's `{rows}` reads it.
fn rows_json(cols: &[Column<'_>]) -> String {
    let n = cols.first().map_or(0, Column::len);
    let mut out: Vec<u8> = Vec::with_capacity(2 + n * cols.len() * 12);
    out.push(b'[');
    for row in 0..n {
        out.extend_from_slice(if row == 0 { b"[" } else { b",[" });
        for (i, col) in cols.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            // Strings, integers and flags always serialize.
            let _ = match col {
                Column::Texts(v) => serde_json::to_writer(&mut out, &v[row]),
                Column::Ints(v) => serde_json::to_writer(&mut out, &v[row]),
                Column::Bools(v) => serde_json::to_writer(&mut out, &v[row]),
            };
        }
        out.push(b']');
    }
    out.push(b']');
    // serde_json writes UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// `q` with `args` bound. Its text numbers placeholders `?n`: a `$n` here would be looked up by
/// name (see [`Spelling::param`]), which the tests refuse.
fn bound<'q>(
    mut q: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments>,
    args: Vec<Arg<'_>>,
) -> sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments> {
    for a in args {
        q = match a {
            Arg::Int(v) => q.bind(v),
            Arg::Real(v) => q.bind(v),
            Arg::Bool(v) => q.bind(v),
            Arg::Text(v) => q.bind(v),
            Arg::Texts(v) => q.bind(json_list(v)),
            Arg::Rows(cols) => q.bind(rows_json(&cols)),
        };
    }
    q
}

#[derive(Debug)]
pub(crate) struct SqliteStore {
    /// Readers (WAL: they never wait for the writer).
    pool: SqlitePool,
    /// The one writing connection. Writes queue for it in the process, in order, instead of
    /// meeting at SQLite's lock, whose busy handler sleeps 10–25 ms per retry (measured: a
    /// claim and a batch of ends taking turns this way held the queue to ~900 runs/s).
    write: Writer,
}

/// The longest a write waits for the writing connection before it fails (sqlx's pool default).
const WRITER_WAIT: Duration = Duration::from_secs(30);

/// The writing connection, held by the store rather than by a pool of one: sqlx pings a pooled
/// connection whenever it goes back to its pool, a round trip to the connection's thread in a
/// task of its own, and the next write waits for that ping. Every transaction paid it.
#[derive(Debug)]
struct Writer {
    slot: Arc<tokio::sync::Mutex<Slot>>,
    opts: SqliteConnectOptions,
    /// The database file, and which file it was when opened (device, inode).
    path: std::path::PathBuf,
    identity: (u64, u64),
}

#[derive(Debug)]
enum Slot {
    Open(SqliteConnection),
    /// A transaction failed and took the connection with it: the next write closes it (its
    /// transaction rolls back, its lock goes) and opens the file again, if it is still the file
    /// opened at start.
    Reopen(Option<SqliteConnection>),
    /// The store was closed: writes fail.
    Closed,
}

impl Writer {
    async fn acquire(&self) -> Result<Writing, StoreError> {
        const WHAT: &str = "connecting to the database";
        let mut held = tokio::time::timeout(WRITER_WAIT, self.slot.clone().lock_owned())
            .await
            .map_err(|_| StoreError::new(WHAT, sqlx::Error::PoolTimedOut))?;
        match &mut *held {
            Slot::Open(_) => {}
            Slot::Closed => return Err(StoreError::new(WHAT, sqlx::Error::PoolClosed)),
            Slot::Reopen(old) => {
                // After its statements still queued: the new connection's `BEGIN IMMEDIATE`
                // would otherwise wait for the old one's lock.
                if let Some(old) = old.take() {
                    let _ = sqlx::Connection::close(old).await;
                }
                // Looked at before opening too: opening a file put in the database's place
                // would touch the WAL and shared memory files the database's readers use. An
                // I/O error: a fault from outside, retried until the file is back.
                let refused = || {
                    StoreError::new(
                        WHAT,
                        sqlx::Error::Io(std::io::Error::other(format!(
                            "{} is not the file the worker opened (moved, replaced or gone); put it back, or restart the worker",
                            self.path.display()
                        ))),
                    )
                };
                let same = || matches!(file_identity(&self.path), Ok(now) if now == self.identity);
                if !same() {
                    return Err(refused());
                }
                let c = sqlx::ConnectOptions::connect(&self.opts).await.ctx(WHAT)?;
                if !same() {
                    let _ = sqlx::Connection::close(c).await;
                    return Err(refused());
                }
                *held = Slot::Open(c);
            }
        }
        Ok(Writing(held))
    }

    /// Closes the connection (rolling back anything left open); later writes fail.
    async fn close(&self) {
        if let Slot::Open(c) | Slot::Reopen(Some(c)) = std::mem::replace(&mut *self.slot.lock().await, Slot::Closed) {
            let _ = sqlx::Connection::close(c).await;
        }
    }
}

/// The writing connection, this caller's until dropped. Only made while the slot is open.
#[derive(Debug)]
pub(crate) struct Writing(tokio::sync::OwnedMutexGuard<Slot>);

impl Writing {
    /// Gives the connection up, and whatever transaction it had open with it: the next write
    /// closes it and opens another.
    fn discard(&mut self) {
        if let Slot::Open(c) = std::mem::replace(&mut *self.0, Slot::Reopen(None)) {
            *self.0 = Slot::Reopen(Some(c));
        }
    }
}

impl std::ops::Deref for Writing {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        match &*self.0 {
            Slot::Open(c) => c,
            _ => unreachable!("a Writing is only made, and kept, with its connection open"),
        }
    }
}

impl std::ops::DerefMut for Writing {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match &mut *self.0 {
            Slot::Open(c) => c,
            _ => unreachable!("a Writing is only made, and kept, with its connection open"),
        }
    }
}

/// A connection of the store's: a reader from the pool, or the writing connection.
#[derive(Debug)]
pub(crate) enum Held {
    Read(PoolConnection<Sqlite>),
    Write(Writing),
}

impl std::ops::Deref for Held {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        match self {
            Held::Read(c) => c,
            Held::Write(c) => c,
        }
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match self {
            Held::Read(c) => c,
            Held::Write(c) => c,
        }
    }
}

fn file_identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// A transaction on the writing connection, begun and ended by hand. SQLite may roll a
/// transaction back by itself when its COMMIT fails (the disk full, an I/O error); sqlx's own
/// `Transaction` then tries a ROLLBACK that fails and goes on counting the transaction as open,
/// and the writing connection's later transactions never reach the disk. Here an end that
/// fails, or a transaction dropped without one (an error on the way), closes the connection
/// instead: the transaction goes with it, and the next write opens a fresh one ([`Writer`]).
#[derive(Debug)]
pub(crate) struct WriteTx(Option<Writing>);

impl WriteTx {
    /// `COMMIT` or `ROLLBACK`. The connection stays the transaction's until the statement has
    /// gone through: if it fails, or the caller gives up meanwhile, the transaction is dropped
    /// and takes the connection with it (closing it rolls back whatever is left).
    async fn end(mut self, sql: &'static str, what: &'static str) -> Result<(), StoreError> {
        let Some(c) = self.0.as_mut() else { return Ok(()) };
        sqlx::query(sql).execute(&mut **c).await.map_err(|e| StoreError::new(what, e))?;
        self.0 = None;
        Ok(())
    }

    /// The statements run through the connection ended the transaction themselves
    /// (`COMMIT`): the connection goes back to the writer as it is.
    fn ended_by_its_script(mut self) {
        self.0 = None;
    }
}

impl std::ops::Deref for WriteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        self.0.as_deref().expect("a transaction not yet ended")
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.0.as_deref_mut().expect("a transaction not yet ended")
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            c.discard();
        }
    }
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

/// The writing connection's page cache, in pages. Reads come from the mapped file
/// (`mmap_size`), so its cache holds little more than the pages a transaction changed; past
/// nine tenths of it, SQLite writes the oldest of them to the WAL as the transaction goes
/// (spills them) instead of all at its commit. A tick's transaction, done ahead of its instant
/// and committed at it, then has a few dozen pages to write at the instant rather than every
/// one it changed (a burst of 1,000 runs changes ~150).
const WRITER_CACHE_PAGES: &str = "32";

impl SqliteStore {
    /// Opens (creating if needed) the database with the pragmas every connection needs:
    /// WAL, `synchronous=FULL`, a busy timeout, foreign keys.
    ///
    /// FULL syncs the WAL at each commit: a commit that returned is on the disk. NORMAL syncs
    /// only at checkpoints, so a power loss, a kernel crash or a file system the kernel turns
    /// read-only after an error drops every commit since the last one that reached the disk
    /// (seconds of them: `faults.rs` lost the ticks since the start that way), and a tick whose
    /// record is lost fires again. A commit costs ~0.4 ms more here (BENCHMARKS.md); the hot
    /// paths commit in batches.
    pub(crate) async fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            // The housekeeper checkpoints after each pass; this is the safety net (~40 MB).
            .pragma("wal_autocheckpoint", "10000")
            // Reads map the file instead of copying each page through a read() into every
            // connection's own cache, which a write elsewhere empties: a listing of 1,000 jobs
            // touches ~1,000 scattered pages of the history.
            .pragma("mmap_size", "268435456")
            .foreign_keys(true);
        // Created here if missing; from then on every connection (the writer is opened again
        // after a failed transaction) must find the very file opened now, not a new empty one
        // where it was moved away, nor one put in its place.
        // The connection that creates it is the writing one.
        let write_opts = opts.clone().pragma("cache_size", WRITER_CACHE_PAGES);
        let first = sqlx::ConnectOptions::connect(&write_opts).await.ctx("opening the database")?;
        let identity = file_identity(path).map_err(|e| StoreError::new("opening the database", sqlx::Error::Io(e)))?;
        let opts = opts.create_if_missing(false);
        let write = Writer {
            slot: Arc::new(tokio::sync::Mutex::new(Slot::Open(first))),
            opts: write_opts.create_if_missing(false),
            path: path.to_path_buf(),
            identity,
        };
        // No ping before each use (sqlx's default): a file has no connection to lose, and the
        // ping is a round trip to the connection's thread before every read.
        let pool =
            SqlitePoolOptions::new().max_connections(4).test_before_acquire(false).connect_with(opts).await.ctx("opening the database")?;
        Ok(Self { pool, write })
    }
}

/// `VACUUM INTO` a new file from a connection of its own: it reads one snapshot while the worker
/// goes on writing (WAL), and the copy is compact. Returns the copy's size in bytes.
pub(crate) async fn backup(from: &Path, to: &Path) -> Result<u64, StoreError> {
    let opts = SqliteConnectOptions::new().filename(from).busy_timeout(Duration::from_secs(10));
    let mut conn = sqlx::ConnectOptions::connect(&opts).await.ctx("opening the database to back it up")?;
    let target =
        to.to_str().ok_or_else(|| StoreError::new("backing up", sqlx::Error::Protocol(format!("{} is not UTF-8", to.display()))))?;
    sqlx::query("VACUUM INTO ?1").bind(target).execute(&mut conn).await.ctx("copying the database")?;
    let _ = sqlx::Connection::close(conn).await;
    Ok(std::fs::metadata(to).map(|m| m.len()).unwrap_or(0))
}

impl Dialect for SqliteStore {
    type Conn = SqliteConnection;
    type Row = SqliteRow;
    type Tx = WriteTx;
    type Pooled = Held;

    const KIND: StorageKind = StorageKind::Sqlite;
    const SPELLING: Spelling = SPELLING;

    async fn begin(&self) -> Result<Self::Tx, StoreError> {
        // The transaction holds the connection from before its `BEGIN`: dropped before it is
        // handed out (`BEGIN` failed, or the caller gave up meanwhile), it takes the connection
        // with it, and no later write finds a transaction already open.
        let mut tx = WriteTx(Some(self.write.acquire().await?));
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *tx).await.ctx("starting a transaction")?;
        Ok(tx)
    }

    async fn commit(tx: Self::Tx) -> Result<(), StoreError> {
        tx.end("COMMIT", "committing").await
    }

    async fn rollback(tx: Self::Tx) -> Result<(), StoreError> {
        tx.end("ROLLBACK", "ending a transaction").await
    }

    /// Syncs the WAL file to the disk: the pages the transaction already spilled into it are
    /// written there now rather than by its commit's sync (`synchronous = FULL`). Frames past
    /// the last commit are ignored by SQLite's recovery, so a transaction rolled back after
    /// this leaves nothing behind.
    async fn ahead_of_commit(&self, _tx: &mut Self::Tx) -> Result<(), StoreError> {
        let mut wal = self.write.path.clone().into_os_string();
        wal.push("-wal");
        let synced = tokio::task::spawn_blocking(move || std::fs::File::open(wal).and_then(|f| f.sync_data()))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        synced.map_err(|e| StoreError::new("syncing the WAL ahead of a commit", sqlx::Error::Io(e)))
    }

    async fn reader(&self) -> Result<Self::Pooled, StoreError> {
        Ok(Held::Read(self.pool.acquire().await.ctx("connecting to the database")?))
    }

    async fn writer(&self) -> Result<Self::Pooled, StoreError> {
        Ok(Held::Write(self.write.acquire().await?))
    }

    async fn execute(c: &mut SqliteConnection, q: Stmt<'_>) -> Result<u64, StoreError> {
        debug_assert!(numbered_as_sqlite(q.sql.as_str()), "{}", q.sql.as_str());
        Ok(bound(sqlx::query(q.sql), q.args).execute(c).await.ctx(q.what)?.rows_affected())
    }

    async fn fetch_all(c: &mut SqliteConnection, q: Stmt<'_>) -> Result<Vec<SqliteRow>, StoreError> {
        debug_assert!(numbered_as_sqlite(q.sql.as_str()), "{}", q.sql.as_str());
        bound(sqlx::query(q.sql), q.args).fetch_all(c).await.ctx(q.what)
    }

    async fn fetch_optional(c: &mut SqliteConnection, q: Stmt<'_>) -> Result<Option<SqliteRow>, StoreError> {
        debug_assert!(numbered_as_sqlite(q.sql.as_str()), "{}", q.sql.as_str());
        bound(sqlx::query(q.sql), q.args).fetch_optional(c).await.ctx(q.what)
    }

    /// One connection writes: the transaction is the only one deciding.
    async fn lock_jobs(_: &mut SqliteConnection, _: &[&str]) -> Result<(), StoreError> {
        Ok(())
    }

    /// One writer at a time (`BEGIN IMMEDIATE`): nothing more to lock.
    async fn lock_limits(_: &mut SqliteConnection, _: &[String]) -> Result<(), StoreError> {
        Ok(())
    }
}

impl RunSql for SqliteStore {
    /// Without RETURNING (1,000 returned rows cost more than the insert): when every key was
    /// new, which is the rule, all ticks are fresh; otherwise look up which keys hold our run
    /// ids.
    async fn record_ticks(c: &mut SqliteConnection, keys: Vec<(&str, i64, &str)>) -> Result<HashSet<String>, StoreError> {
        let mut fresh = HashSet::with_capacity(keys.len());
        for chunk in keys.chunks(ROWS_PER_STATEMENT) {
            let mut q = sqlx::QueryBuilder::<Sqlite>::new("INSERT INTO ll_ticks (job, scheduled_at, run_id) ");
            q.push_values(chunk, |mut b, (job, at, id)| {
                b.push_bind(*job).push_bind(*at).push_bind(*id);
            });
            q.push(" ON CONFLICT DO NOTHING");
            let inserted = q.build().execute(&mut *c).await.ctx("recording ticks")?.rows_affected();
            if inserted as usize == chunk.len() {
                fresh.extend(chunk.iter().map(|(_, _, id)| id.to_string()));
                continue;
            }
            let mut q = sqlx::QueryBuilder::<Sqlite>::new("SELECT run_id FROM ll_ticks WHERE (job, scheduled_at, run_id) IN (VALUES ");
            let mut list = q.separated(", ");
            for (job, at, id) in chunk {
                list.push("(").push_bind_unseparated(*job).push_unseparated(", ");
                list.push_bind_unseparated(*at).push_unseparated(", ");
                list.push_bind_unseparated(*id).push_unseparated(")");
            }
            q.push(")");
            let ours: Vec<String> = q.build_query_scalar().fetch_all(&mut *c).await.ctx("reading tick keys")?;
            fresh.extend(ours);
        }
        Ok(fresh)
    }

    /// A batch whose ends all succeeded (the rule: a drain's, a burst's) is one script
    /// ([`ends_and_claims_script`]), one round trip to the connection's thread. The six of the
    /// transaction it replaces (`BEGIN`, ends, lease, take, claim, `COMMIT`) were a third of a
    /// write in `cargo bench … runcore -- queue`. Any other end may need its run's steps closed,
    /// which the script does not do: that batch is written as the transaction of statements.
    ///
    /// The script is a prepared statement of several statements, which sqlx-sqlite runs in
    /// order, each with the numbered parameters it names. sqlx has deprecated that (its issue
    /// 3108) without a date; if a later sqlx drops it, the store contract's ends-and-claims
    /// check fails.
    async fn ends_and_claims_at_once(
        &self,
        ends: &[RunEnd<'_>],
        n: usize,
        worker: &str,
        now: i64,
    ) -> Option<Result<EndsAndClaims<SqliteRow>, StoreError>> {
        if !ends.iter().all(|e| e.status == RunStatus::Succeeded) {
            return None;
        }
        let written = async {
            // The script's own transaction: the connection goes with it if it stops half way
            // (an error, or the caller giving up), and the transaction left open with it.
            let asked = std::time::Instant::now();
            let mut tx = WriteTx(Some(self.write.acquire().await?));
            // What of the write was the wait for the writer.
            let writer_wait_us = asked.elapsed().as_micros() as u64;
            let args = vec![Arg::Rows(end_rows(ends)), now.into(), worker.into(), super::QUEUE.into(), (n.max(1) as i64).into()];
            let rows = bound(sqlx::query(sql!(SqliteStore, ends_and_claims_script())), args)
                .fetch_all(&mut *tx)
                .await
                .ctx("recording ends and claiming runs")?;
            tx.ended_by_its_script();
            // Committed: from here on nothing fails the write (its caller would write the ends
            // again, find them recorded, and leave the runs claimed here unstarted).
            let (mut done, mut claimed, mut tasks, mut undecoded) = (Vec::new(), Vec::new(), 0, 0);
            for row in rows {
                match row.str("part") {
                    "ended" => done.push((row.text("id"), RunStatus::from_str(row.str("status")).unwrap_or(RunStatus::Failed))),
                    "taken" => {
                        tasks += 1;
                        undecoded += usize::from(row.opt_text("run_id").is_none());
                    }
                    "claimed" => claimed.push(row),
                    other => tracing::error!(part = other, "a row the script of ends and claims does not make; ignored"),
                }
            }
            if undecoded > 0 {
                tracing::error!(tasks = undecoded, "queue tasks that do not name a run were taken and dropped");
            }
            Ok((done, tasks, claimed, Some(writer_wait_us)))
        };
        Some(written.await)
    }

    async fn mark_dispatched(c: &mut SqliteConnection, ids: &[String], now: i64) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar(sql!(MARK_DISPATCHED))
            .bind(json_list(ids.iter().map(String::as_str)))
            .bind(now)
            .fetch_all(c)
            .await
            .ctx("marking runs dispatched")
    }
}

impl QueueSql for SqliteStore {
    async fn push(c: &mut SqliteConnection, ids: &[String]) -> Result<(), StoreError> {
        queue::push(c, ids).await
    }

    async fn take(c: &mut SqliteConnection, n: usize) -> Result<(usize, Vec<String>), StoreError> {
        queue::take(c, n).await
    }

    async fn forget_queue(c: &mut SqliteConnection) -> Result<(), StoreError> {
        queue::forget_all(c).await
    }
}

impl LeaseSql for SqliteStore {
    async fn heartbeat(&self, me: &WorkerId, lease: Duration, take_over: bool, now: i64) -> Result<Option<(i64, i64)>, StoreError> {
        let lease_until = now + lease.as_millis() as i64;
        let epoch: Option<i64> = sqlx::query_scalar(HEARTBEAT)
            .bind(&me.name)
            .bind(&me.instance)
            .bind(&me.host)
            .bind(i64::from(me.pid))
            .bind(now)
            .bind(lease_until)
            .bind(take_over)
            .bind(lease_until + crate::decide::fencing(lease).margin.as_millis() as i64)
            .fetch_optional(&mut *self.write.acquire().await?)
            .await
            .ctx("renewing the worker's lease")?;
        Ok(epoch.map(|e| (e, now)))
    }

    async fn live_leases(c: &mut SqliteConnection, now: i64) -> Result<Vec<SqliteRow>, StoreError> {
        sqlx::query("SELECT * FROM ll_workers WHERE lease_until > ?1 ORDER BY name")
            .bind(now)
            .fetch_all(c)
            .await
            .ctx("reading worker leases")
    }

    /// Only called with the database lock held, so no other process can be running anything:
    /// every `running` run is an orphan, whatever worker name it carries (a restart under a
    /// configured `worker.name` has the same name).
    async fn interrupt_orphans(c: &mut SqliteConnection, _: Option<&str>, now: i64) -> Result<Vec<SqliteRow>, StoreError> {
        sqlx::query(sql!(concat!(
            "UPDATE ll_runs SET status = CASE WHEN cancel_requested IS NULL THEN {Interrupted} ELSE {Cancelled} END, finished_at = ?1,
                 error = coalesce(cancel_requested, 'worker \"' || coalesce(worker, '?') || '\" stopped while the run was going')
             WHERE status = {Running} RETURNING ",
            run_cols!()
        )))
        .bind(now)
        .fetch_all(c)
        .await
        .ctx("interrupting orphaned runs")
    }
}

impl ReadSql for SqliteStore {
    async fn job_states(&self) -> Result<HashMap<String, JobState>, StoreError> {
        // One JSON row for every job's state (see `parse_aggregate`).
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!("SELECT json_group_array(json_array({}, last_tick)) FROM ll_job_state", LISTED_STATE_COLUMNS.join(", "))
        });
        let text: Option<String> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(SQL.as_str())).fetch_one(&self.pool).await.ctx("reading job state")?;
        let rows: Vec<JobStateRow> = parse_aggregate(text, "reading job state")?;
        Ok(rows
            .into_iter()
            .map(|(job, paused, pause_reason, paused_at, last_tick)| {
                (job, JobState { paused: paused != 0, pause_reason, paused_at: paused_at.map(from_ms), last_tick: last_tick.map(from_ms) })
            })
            .collect())
    }

    async fn job_overview(&self, job: &str, recent: u32) -> Result<JobOverview, StoreError> {
        // One statement, one JSON row (see `parse_aggregate`): three reads would each cross
        // sqlx's connection thread and back, which is most of a `get_job`.
        let text: String = sqlx::query_scalar(
            "SELECT json_array(
                json((SELECT json_array(paused, pause_reason, paused_at, last_tick) FROM ll_job_state WHERE job = ?1)),
                json((SELECT json_group_array(json_array(id, status, trigger, enqueued_at, finished_at) ORDER BY id DESC)
                      FROM (SELECT id, status, trigger, enqueued_at, finished_at FROM ll_runs WHERE job = ?1 ORDER BY id DESC LIMIT +?2))),
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
        // Each job's newest run's rowid straight from the `(job, id)` index (its entries hold
        // the rowid), then its row: two seeks a job. All of them in one JSON row (see
        // `parse_aggregate`).
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            let brief: Vec<String> = LISTED_RUN_COLUMNS.iter().map(|c| format!("r.{c}")).collect();
            format!(
                "SELECT json_group_array(json_array(r.job, json_array({})))
                 FROM json_each(?1) j JOIN ll_runs r ON r.rowid = (SELECT rowid FROM ll_runs WHERE job = j.value ORDER BY id DESC LIMIT 1)",
                brief.join(", ")
            )
        });
        let text: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(SQL.as_str()))
            .bind(json_list(jobs.iter().copied()))
            .fetch_one(&self.pool)
            .await
            .ctx("reading last runs")?;
        let rows: Vec<(String, BriefRow)> = parse_aggregate(text, "reading last runs")?;
        Ok(rows.into_iter().map(|(job, row)| (job, brief(row))).collect())
    }

    /// Kept by the triggers of migration 0010.
    async fn listing_changes(&self) -> Option<u64> {
        let n: i64 = sqlx::query_scalar("SELECT n FROM ll_listing_changes WHERE id = 1").fetch_one(&self.pool).await.ok()?;
        Some(n as u64)
    }
}

impl UpkeepSql for SqliteStore {
    /// Applies apalis's migrations and ours. Both share sqlx's migrations table, so each
    /// ignores the other's entries.
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut apalis = apalis_sqlite::SqliteStorage::<()>::migrations();
        apalis.set_ignore_missing(true);
        // Through the readers' pool: the migrator over the borrowed writing connection does not
        // compile in this async fn (`Acquire` is "not general enough"). At open nothing else
        // writes yet, and the writing connection sees the new schema.
        apalis.run(&self.pool).await.map_err(|e| StoreError::new("applying queue migrations", e.into()))?;
        let mut ours = sqlx::migrate!("../migrations/sqlite");
        ours.set_ignore_missing(true);
        ours.run(&self.pool).await.map_err(|e| StoreError::new("applying lamplighter migrations", e.into()))?;
        Ok(())
    }

    /// Closes every connection (rolling back anything left open), so no lock outlives the
    /// engine. Later calls fail with a storage error.
    async fn close(&self) {
        self.write.close().await;
        self.pool.close().await;
    }

    async fn check(&self) -> Result<(), String> {
        sqlx::query("SELECT 1").execute(&self.pool).await.map_err(|e| format!("the database does not answer: {e}"))?;
        // An open file that was removed or replaced still answers, but what is written to it
        // is lost with the process.
        let path = &self.write.path;
        match file_identity(path) {
            Ok(now) if now == self.write.identity => Ok(()),
            Ok(_) => Err(format!(
                "{} was replaced underneath the worker; what it writes goes to the file it opened, which is no longer there: \
                 put the file back, or restart the worker to use the new one",
                path.display()
            )),
            Err(e) => Err(format!(
                "{} is gone ({e}); what the worker writes is lost when it stops: put the file back, or restart it",
                path.display()
            )),
        }
    }

    /// Checkpoints, steps and calls of deleted runs, consumed queue tasks, and a WAL
    /// checkpoint: it moves the WAL into the database off the hot path (the automatic
    /// checkpoint would otherwise run, with its fsync, inside whichever commit crosses the
    /// threshold: often a tick's).
    async fn housekeeping(&self) -> Result<(), StoreError> {
        for (table, what) in
            [("ll_checkpoints", "pruning checkpoints"), ("ll_steps", "pruning workflow steps"), ("ll_agent_calls", "pruning agent calls")]
        {
            let sql = format!("DELETE FROM {table} WHERE root_id NOT IN (SELECT coalesce(root_id, id) FROM ll_runs)");
            sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut *self.write.acquire().await?).await.ctx(what)?;
        }
        queue::prune(&mut *self.write.acquire().await?).await?;
        sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&mut *self.write.acquire().await?).await.ctx("checkpointing the WAL")?;
        Ok(())
    }
}

/// What a job listing reads of a job's state (with `last_tick`, which only plans: a tick's
/// bookkeeping is not a change a listing shows) and of its last run (a [`BriefRow`], by `job`).
/// Migration 0010's triggers count a change to any of these, which a kept listing relies on;
/// `every_column_a_listing_reads_moves_the_count` holds the two together.
const LISTED_STATE_COLUMNS: [&str; 4] = ["job", "paused", "pause_reason", "paused_at"];
const LISTED_RUN_COLUMNS: [&str; 5] = ["id", "status", "trigger", "enqueued_at", "finished_at"];

/// Takes or renews a lease: ?1 name, ?2 instance, ?3 host, ?4 pid, ?5 now, ?6 lease end,
/// ?7 take over a row another instance left, ?8 takeover time. Returns the epoch. A new
/// process under the name starts a new epoch; a lease that ran out does not (the file lock
/// keeps every other process out, and the engine's clock may jump in tests and in life).
const HEARTBEAT: &str = "INSERT INTO ll_workers (name, instance, host, pid, started_at, heartbeat_at, lease_until, takeover_at, epoch)
     VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?8, 1)
     ON CONFLICT (name) DO UPDATE SET instance = excluded.instance, host = excluded.host, pid = excluded.pid,
         started_at = CASE WHEN ll_workers.instance = excluded.instance THEN ll_workers.started_at ELSE excluded.started_at END,
         heartbeat_at = excluded.heartbeat_at, lease_until = excluded.lease_until, takeover_at = excluded.takeover_at,
         epoch = CASE WHEN ll_workers.instance = excluded.instance THEN ll_workers.epoch ELSE ll_workers.epoch + 1 END
     WHERE ?7 OR ll_workers.instance = excluded.instance
     RETURNING epoch";

/// Rows per multi-row statement: 3 columns × 1000 stays well under SQLite's 32,766 bound
/// parameters.
const ROWS_PER_STATEMENT: usize = 1000;

/// `ll_workers w` holds worker `?3`'s lease.
const LEASED: &str = "EXISTS (SELECT 1 FROM ll_workers w WHERE w.name = ?3 {lease_live})";

/// The claim of the runs the first `?5` tasks of queue `?4` name, for worker `?3` under its
/// lease, at `?2` ([`ends_and_claims_script`]).
fn claim_from_queue() -> String {
    claim_sql(
        &SPELLING,
        &format!("{LEASED} AND id IN (SELECT {} FROM Jobs WHERE ROWID IN ({}))", queue::RUN_ID_OF_PAYLOAD, queue::pick("?4", "?5")),
        false,
        "?3",
        "?2",
        "(SELECT epoch FROM ll_workers w WHERE w.name = ?3)",
        "NULL",
    )
}

/// Ends that all succeeded and the claims that take their slots, as one script: `BEGIN`,
/// [`finish_runs_sql`](super::scripts::finish_runs_sql), the job state of the successes noticed at their end, the claim of the runs the first `?5` tasks of queue `?4` name, the take of
/// those tasks, `COMMIT`. Each part answers rows marked with its name (`part`). One round trip
/// to the connection's thread where the transaction of statements took six; see
/// [`SqliteStore::ends_and_claims_at_once`].
///
/// The claim reads the tasks before the take deletes them, by the same pick: nothing writes
/// between the two (one connection writes), and the pick's order is total. Both need this
/// worker's lease row (`?3`), as `take_and_claim` does.
///
/// The parameters are numbered and shared by every statement, but sqlx-sqlite binds a
/// statement's unused lower numbers (the claim's `?1`, the take's `?1` and `?2`) as positional
/// ones, from a count that moves along from statement to statement; once that count passes the
/// five values bound, the rest of that statement's parameters stay unbound (NULL). These three
/// gaps keep it within five; the store contract's ends-and-claims check fails if a change does
/// not.
fn ends_and_claims_script() -> String {
    format!(
        "BEGIN IMMEDIATE;
         {finish} RETURNING ll_runs.id, ll_runs.status, 'ended' AS part;
         {noticed};
         {claim}, 'claimed' AS part;
         DELETE FROM Jobs WHERE ROWID IN ({pick}) AND {LEASED} RETURNING {run_id} AS run_id, 'taken' AS part;
         COMMIT",
        finish = FINISH_RUNS,
        claim = claim_from_queue(),
        noticed = noticed_at_end(concat!(
            "SELECT r.job, r.worker, MAX(r.finished_at) FROM {rows $1 AS j(",
            end_cols!(),
            ")} JOIN ll_runs r ON r.id = j.id
             WHERE j.noticed AND r.status = {Succeeded} AND r.outcome_seen IS NOT NULL AND r.finished_at = coalesce(j.ended_at, $2) GROUP BY r.job, r.worker ORDER BY r.job, r.worker"
        )),
        pick = queue::pick("?4", "?5"),
        run_id = queue::RUN_ID_OF_PAYLOAD,
    )
}

const MARK_DISPATCHED: &str = "UPDATE ll_runs SET dispatched_at = ?2, limit_wait = NULL, limit_wait_since = NULL, limit_hold = NULL WHERE id IN (SELECT value FROM json_each(?1)) AND +status = {Queued} AND dispatched_at IS NULL RETURNING id";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Ends, Handover, Leases, Records, Upkeep};
    use sqlx::Row;

    #[test]
    fn a_row_set_is_a_json_array_of_arrays_for_sqlite() {
        let cols = vec![
            Column::Texts(vec![Some("a".into()), Some("b\"c".into())]),
            Column::Ints(vec![Some(1), None]),
            Column::Bools(vec![true, false]),
        ];
        assert_eq!(rows_json(&cols), r#"[["a",1,true],["b\"c",null,false]]"#);
        assert_eq!(rows_json(&[]), "[]");
    }

    async fn migrated() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("plan.db")).await.expect("open");
        Upkeep::migrate(&store).await.expect("migrate");
        (dir, store)
    }

    /// A task is claimable as soon as it is pushed, whatever the wall clock does after: its
    /// due time is not the clock at the push (a task pushed while the clock ran 25 s ahead,
    /// then stepped back, stayed unclaimed).
    #[tokio::test]
    async fn a_pushed_task_is_due_whatever_the_clock_does() {
        let (_dir, store) = migrated().await;
        let mut c = store.write.acquire().await.expect("a connection");
        queue::push(&mut c, &["run-1".to_string()]).await.expect("push");
        let run_at: i64 = sqlx::query("SELECT run_at FROM Jobs").fetch_one(&mut *c).await.expect("the task").get(0);
        assert_eq!(run_at, 0, "due at the epoch, not at the push's wall clock");
        // The claim's condition (apalis's `run_at <= now`) holds even with the clock a day back.
        let due: i64 = sqlx::query("SELECT count(*) FROM Jobs WHERE run_at <= CAST(strftime('%s', 'now') AS INTEGER) - 86400")
            .fetch_one(&mut *c)
            .await
            .expect("a count")
            .get(0);
        assert_eq!(due, 1);
    }

    /// The batched push writes the row apalis's own `push_tasks` writes for the same task,
    /// column for column; the take hands each run back once (in task id order, which within
    /// one millisecond is not the push's).
    #[tokio::test]
    async fn a_batched_push_writes_apalis_rows_and_a_take_consumes_them_in_order() {
        use apalis::prelude::{TaskBuilder, TaskId};
        let (_dir, store) = migrated().await;
        let mut c = store.write.acquire().await.expect("a connection");
        let ours: Vec<String> = (1..=3).map(|i| format!("run-{i}")).collect();
        queue::push(&mut c, &ours).await.expect("our push");
        let theirs = TaskBuilder::new(crate::store::RunTask::encode("run-4").expect("encode"))
            .task_id(TaskId::from_ulid(ulid::Ulid::generate()))
            .max_attempts(1)
            .run_at_timestamp(0)
            .build();
        apalis_sqlite::queries::push_tasks(&mut *c, crate::store::QUEUE, &[theirs]).await.expect("apalis's push");
        let cols = "job_type, status, attempts, max_attempts, run_at, last_result, lock_at, lock_by, done_at, priority, \
                    metadata, idempotency_key, typeof(job), typeof(run_at), typeof(priority), typeof(metadata)";
        let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT json_array({cols}) FROM Jobs ORDER BY id")))
            .fetch_all(&mut *c)
            .await
            .expect("the rows");
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().all(|r| *r == rows[3]), "ours {:?}, apalis's {}", &rows[..3], rows[3]);
        let (n, mut ids) = queue::take(&mut c, 3).await.expect("take");
        let (m, more) = queue::take(&mut c, 10).await.expect("take");
        ids.extend(more);
        ids.sort();
        assert_eq!((n, m, ids), (3, 1, (1..=4).map(|i| format!("run-{i}")).collect::<Vec<_>>()));
        assert_eq!(queue::take(&mut c, 10).await.expect("take").0, 0, "each task is taken once");
    }

    /// A tick transaction held for its instant has written most pages it changed into the WAL
    /// before its hold ends (the writer's small cache spills them), so that its commit at the
    /// instant has little left to write.
    #[tokio::test]
    async fn a_held_tick_transaction_has_spilled_its_pages_before_its_commit() {
        use crate::store::Ticks;
        let (dir, store) = migrated().await;
        let wal = dir.path().join("plan.db-wal");
        let t = crate::store::contract::t0();
        let ticks: Vec<_> =
            (0..1000).map(|i| (crate::store::contract::tick(&format!("job-{i:04}"), t), lamplighter_config::Overlap::Allow)).collect();
        let wal_len = || std::fs::metadata(&wal).expect("the WAL").len();
        let before = wal_len();
        let (ready, held) = tokio::sync::oneshot::channel();
        let (go, answer) = tokio::sync::oneshot::channel::<bool>();
        let hold: crate::store::Hold<'_> = Box::pin(async move {
            ready.send(()).expect("the check waits");
            answer.await.expect("an answer")
        });
        let fire = store.fire_ticks_held(ticks, crate::store::Claim { worker: "w", slots: 0 }, t, Some(hold));
        let check = async {
            held.await.expect("the transaction reached its hold");
            let at_hold = wal_len();
            go.send(true).expect("the transaction waits");
            at_hold
        };
        let (out, at_hold) = tokio::join!(fire, check);
        assert!(out.expect("fire").is_some(), "committed");
        // 1,000 runs change ~150 pages of 4 KiB: most are in the WAL before the commit.
        assert!(at_hold >= before + 64 * 4096, "the WAL grew by {} bytes before the commit", at_hold - before);
    }

    /// A database that refuses writes (here `query_only`, as a read-only file or mount would)
    /// is a storage fault, named for `/readyz`; a write that goes through again clears it.
    #[tokio::test]
    async fn a_read_only_database_is_a_named_fault_that_clears_when_writes_go_through() {
        let (_dir, store) = migrated().await;
        let me = WorkerId { name: "w".into(), instance: "i".into(), host: "h".into(), pid: 1 };
        let health = crate::health::Health::default();
        sqlx::query("PRAGMA query_only = ON").execute(&mut *store.write.acquire().await.expect("the writer")).await.expect("pragma");
        let e = crate::store::Leases::heartbeat(&store, &me, Duration::from_secs(30), true, chrono::Utc::now()).await.expect_err("refused");
        assert_eq!(e.fault(), Some(crate::store::StorageFault::ReadOnly { server: false }), "{e}");
        assert!(health.storage_failed(&e));
        assert!(health.problems()[0].starts_with("the database is read-only"), "{:?}", health.problems());
        sqlx::query("PRAGMA query_only = OFF").execute(&mut *store.write.acquire().await.expect("the writer")).await.expect("pragma");
        crate::store::Leases::heartbeat(&store, &me, Duration::from_secs(30), true, chrono::Utc::now()).await.expect("writes again");
        health.storage_ok();
        assert!(health.problems().is_empty());
    }

    /// The script of ends and claims stopped half way (here its take refused, by a trigger of
    /// the writing connection's own) leaves nothing written and no transaction open: the end
    /// and the claim both go through on the next try, on a fresh connection.
    #[tokio::test]
    async fn a_script_of_ends_and_claims_that_fails_half_way_leaves_nothing() {
        let (_dir, store) = migrated().await;
        let (t, me) = (chrono::Utc::now(), WorkerId { name: "w".into(), instance: "i".into(), host: "h".into(), pid: 1 });
        Leases::heartbeat(&store, &me, Duration::from_secs(60), true, t).await.expect("lease");
        let manual =
            || crate::store::NewRun { trigger: crate::run::Trigger::Manual, scheduled_at: None, ..crate::store::contract::tick("m", t) };
        let (running, _) = store.insert_run(manual(), t).await.expect("insert");
        store.dispatch(std::slice::from_ref(&running), &[], "w", t).await.expect("claim");
        let (queued, _) = store.insert_run(manual(), t).await.expect("insert");
        store.dispatch(&[], std::slice::from_ref(&queued), "w", t).await.expect("hand over");
        sqlx::query("CREATE TEMP TRIGGER refuse BEFORE DELETE ON Jobs BEGIN SELECT RAISE(ABORT, 'refused'); END")
            .execute(&mut *store.write.acquire().await.expect("the writer"))
            .await
            .expect("trigger");
        let ends = [crate::store::contract::end(&running, RunStatus::Succeeded)];
        let e = store.finish_and_claim(&ends, 1, "w", t).await.expect_err("the take is refused");
        assert!(e.to_string().contains("refused"), "{e}");
        let status = |id: String| {
            let store = &store;
            async move { store.get_run(&id).await.expect("read").expect("the run").status }
        };
        assert_eq!(
            (status(running.clone()).await, status(queued.clone()).await),
            (RunStatus::Running, RunStatus::Queued),
            "nothing written"
        );
        let (done, taken) = store.finish_and_claim(&ends, 1, "w", t).await.expect("the next try");
        assert_eq!((done, taken.tasks), (vec![running.clone()], 1));
        assert_eq!(taken.runs.iter().map(|h| h.run.id.clone()).collect::<Vec<_>>(), std::slice::from_ref(&queued));
        assert_eq!((status(running).await, status(queued).await), (RunStatus::Succeeded, RunStatus::Running));
    }

    /// A transaction dropped on the way (an error in one of its statements) takes the writing
    /// connection, and what it wrote, with it; the next write opens the file again. A file put
    /// in the database's place meanwhile is refused, not written to.
    #[tokio::test]
    async fn a_transaction_given_up_on_leaves_nothing_and_the_next_write_reopens_the_same_file() {
        let (dir, store) = migrated().await;
        let pause = "INSERT INTO ll_job_state (job, paused) VALUES (?1, 1)";
        let paused = || async {
            let rows: Vec<String> = sqlx::query_scalar("SELECT job FROM ll_job_state ORDER BY job")
                .fetch_all(&mut *store.reader().await.expect("a reader"))
                .await
                .expect("read");
            rows
        };
        let mut tx = store.begin().await.expect("begin");
        sqlx::query(pause).bind("dropped").execute(&mut *tx).await.expect("write");
        drop(tx);
        assert!(matches!(*store.write.slot.lock().await, Slot::Reopen(Some(_))), "the connection went with the transaction");
        let mut tx = store.begin().await.expect("a fresh connection");
        sqlx::query(pause).bind("kept").execute(&mut *tx).await.expect("write");
        SqliteStore::commit(tx).await.expect("commit");
        assert_eq!(paused().await, ["kept"]);

        // The file replaced while no connection writes to it.
        drop(store.begin().await.expect("begin"));
        let db = dir.path().join("plan.db");
        std::fs::rename(&db, dir.path().join("moved.db")).expect("move the file away");
        std::fs::write(&db, b"").expect("a file in its place");
        let e = store.begin().await.expect_err("not the file opened");
        assert!(e.to_string().contains("is not the file the worker opened"), "{e}");
        assert!(e.is_transient(), "retried until the file is back: {e}");
        assert_eq!(std::fs::metadata(&db).expect("the stand-in").len(), 0, "the stand-in was not opened");
        std::fs::rename(dir.path().join("moved.db"), &db).expect("put the file back");
        let mut tx = store.begin().await.expect("the file is back");
        sqlx::query(pause).bind("after").execute(&mut *tx).await.expect("write");
        SqliteStore::commit(tx).await.expect("commit");
        assert_eq!(paused().await, ["after", "kept"]);
    }

    /// A caller that gives up on `begin` after its `BEGIN` went out (a stop, a timeout) leaves no
    /// transaction open on the writing connection for the next write to trip over.
    #[tokio::test]
    async fn a_begin_given_up_on_leaves_no_transaction_open() {
        let (_dir, store) = migrated().await;
        let mut abandoned = Box::pin(store.begin());
        // Polled once (`BEGIN` goes to the connection's thread at the first poll), then
        // dropped; a transaction already begun by then is dropped as well.
        let _ = futures::poll!(abandoned.as_mut());
        drop(abandoned);
        let mut tx = store.begin().await.expect("a transaction of its own");
        sqlx::query("INSERT INTO ll_job_state (job, paused) VALUES ('after', 1)").execute(&mut *tx).await.expect("write");
        SqliteStore::commit(tx).await.expect("commit");
    }

    /// Writes queue for the one connection, each whole, in the order they asked (the test's
    /// runtime polls the tasks in the order they were spawned); after the store is closed they
    /// fail instead of opening it again.
    #[tokio::test]
    async fn writes_take_turns_on_the_one_connection_and_fail_once_it_is_closed() {
        let (_dir, store) = migrated().await;
        let store = Arc::new(store);
        let writers: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut tx = store.begin().await.expect("begin");
                    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM ll_job_state").fetch_one(&mut *tx).await.expect("count");
                    tokio::task::yield_now().await;
                    sqlx::query("INSERT INTO ll_job_state (job, paused) VALUES (?1, 0)")
                        .bind(format!("job-{n}-{i}"))
                        .execute(&mut *tx)
                        .await
                        .expect("write");
                    SqliteStore::commit(tx).await.expect("commit");
                })
            })
            .collect();
        for w in writers {
            w.await.expect("a writer");
        }
        let jobs: Vec<String> = sqlx::query_scalar("SELECT job FROM ll_job_state")
            .fetch_all(&mut *store.reader().await.expect("a reader"))
            .await
            .expect("read");
        let mut seen: Vec<(u32, u32)> = jobs
            .iter()
            .map(|j| {
                let mut parts = j.split('-').skip(1).map(|p| p.parse::<u32>().expect("a number"));
                (parts.next().expect("a count"), parts.next().expect("an index"))
            })
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..8).map(|i| (i, i)).collect::<Vec<_>>(), "the i-th writer saw the i before it: {jobs:?}");
        Upkeep::close(&*store).await;
        let e = store.begin().await.expect_err("closed");
        assert!(matches!(e, StoreError::Other { source: sqlx::Error::PoolClosed, .. }), "{e}");
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
        crate::store::Leases::heartbeat(&store, &me, Duration::from_secs(30), true, chrono::Utc::now()).await.expect("heartbeat");
        assert_eq!(store.listing_changes().await, Some(n1), "neither a tick nor a heartbeat changes a listing");
    }

    /// A listing kept while the count stands must see every change to what it read: each
    /// column the listing reads, changed alone by another process, moves the count.
    #[tokio::test]
    async fn every_column_a_listing_reads_moves_the_count() {
        let (dir, store) = migrated().await;
        let mut other =
            sqlx::ConnectOptions::connect(&SqliteConnectOptions::new().filename(dir.path().join("plan.db"))).await.expect("open");
        let now = chrono::Utc::now();
        let run = crate::store::contract::tick("a", now);
        let (id, _) = crate::store::Records::insert_run(&store, run, now).await.expect("insert");
        crate::store::JobStates::set_paused(&store, "a", true, Some("why"), now).await.expect("pause");
        // Another value of the same type, whatever the column holds (NULL becomes a number).
        let change = |table: &str, col: &str, key: &str, value: &str| {
            format!(
                "UPDATE {table} SET {col} = CASE WHEN {col} IS NULL THEN 1 WHEN typeof({col}) = 'integer' THEN {col} + 1 ELSE {col} || '-' END
                 WHERE {key} = '{value}'"
            )
        };
        let runs = LISTED_RUN_COLUMNS.iter().chain(&["job"]).map(|c| ("ll_runs", *c, "id", id.clone()));
        let states = LISTED_STATE_COLUMNS.iter().map(|c| ("ll_job_state", *c, "job", "a".to_string()));
        for (table, col, key, value) in runs.chain(states) {
            let before = store.listing_changes().await.expect("a count");
            let sql = change(table, col, key, &value);
            let changed = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut other).await.expect("an update").rows_affected();
            assert_eq!(changed, 1, "{table}.{col} was changed");
            assert_ne!(store.listing_changes().await, Some(before), "{table}.{col} is read by a listing but does not move the count");
            // Its key may have been the column just changed.
            if col == key {
                sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE {table} SET {col} = '{value}' WHERE {col} = '{value}-'")))
                    .execute(&mut other)
                    .await
                    .expect("back");
            }
        }
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
        for sql in crate::store::scripts::scheduler_reads::<SqliteStore>() {
            let plan = plan(&store, sql).await;
            assert!(plan.iter().any(|d| d.contains("ll_runs_undispatched")), "{sql}\n{plan:#?}");
        }
        // The due runs come in the index's order, so the read stops at its batch: sorting
        // them read every run queued at the same instant (all 50,000 of a backlog).
        let plan = plan(&store, crate::store::scripts::scheduler_reads::<SqliteStore>()[0]).await;
        assert!(!plan.iter().any(|d| d.contains("TEMP B-TREE")), "{plan:#?}");
    }

    /// The reads of a limit's line go through the waiters' index, in its order: on the status
    /// index they read and sorted every queued run (a backlog of 50,000), each pass.
    #[tokio::test]
    async fn the_waiters_are_read_through_their_index() {
        let (_dir, store) = migrated().await;
        for sql in crate::store::handover::limit_wait_reads::<SqliteStore>() {
            let plan = plan(&store, sql).await;
            assert!(plan.iter().any(|d| d.contains("ll_runs_limit_waits")), "{sql}\n{plan:#?}");
            assert!(!plan.iter().any(|d| d.contains("TEMP B-TREE") || d.contains("ll_runs_by_status")), "{sql}\n{plan:#?}");
        }
    }

    /// Batches by id go through the primary key, whatever the number of queued runs.
    #[tokio::test]
    async fn batch_statements_find_runs_by_id() {
        let (_dir, store) = migrated().await;
        let claim = sql!(SqliteStore, claim_sql(&SPELLING, "id {in $1}", false, "$2", "$3", "$4", "NULL"));
        let finish = sql!(SqliteStore, format!("{FINISH_RUNS} RETURNING ll_runs.id"));
        for sql in [claim, finish, sql!(MARK_DISPATCHED), sql!(SqliteStore, claim_from_queue())] {
            let plan = plan(&store, sql).await;
            assert!(plan.iter().any(|d| d.contains("sqlite_autoindex_ll_runs_1 (id=?)")), "{sql}\n{plan:#?}");
        }
    }
}
