//! The durable peer of the SQLite drain bench: apalis-sqlite 1.0's own worker draining the
//! same number of no-op jobs from a database file on disk, in this process, in the same run
//! as Lamplighter's drain (`runcore -- queue`).
//!
//! Set up as a user of the library would for a durable queue: WAL, `synchronous = NORMAL` on
//! every connection (apalis's `setup` turns it OFF on the one connection it uses, so the pool
//! that drains is opened afresh after it), the worker's concurrency 32 like Lamplighter's and
//! a fetch of 32. Each task reads a 2-byte file, as the Lamplighter jobs' `file-read` does. The
//! jobs are pushed before the clock starts.
//!
//! The library's ack slows as its table fills with finished tasks: `ack.sql` finds the rows by
//! `lock_by` (the worker's index, which keeps every task the worker ever finished) and scans
//! the batch's JSON for each, so a drain of 50,000 runs at a few hundred tasks a second after
//! the first thousands and needs many minutes. The bench therefore reports the peer's rate over
//! its first `FIRST` tasks — its best stretch, the figure Lamplighter is compared with — and
//! over the whole window it is given (`WINDOW`), with how many it finished. A task counts as
//! done when its handler returns; apalis records the ack after, in batches, so the peer's
//! figures are, if anything, better than a durable count would be.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use apalis::prelude::*;
use apalis_sqlite::{Config, SqliteStorage};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

/// The stretch at the start of the drain the best rate is measured over.
pub(crate) const FIRST: usize = 5_000;
/// How long the peer may drain before the bench stops it.
pub(crate) const WINDOW: Duration = Duration::from_secs(180);

#[derive(Clone)]
struct Drain {
    /// The file each task reads.
    file: PathBuf,
    n: usize,
    done: Arc<AtomicUsize>,
    first_start: Arc<AtomicI64>,
    last_finish: Arc<AtomicI64>,
    /// When the `FIRST`th task finished.
    first_done: Arc<AtomicI64>,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

async fn handle(_task: u32, d: Data<Drain>, worker: WorkerContext) -> Result<(), BoxDynError> {
    d.first_start.fetch_min(now_ms(), Ordering::SeqCst);
    tokio::fs::read(&d.file).await?;
    d.last_finish.fetch_max(now_ms(), Ordering::SeqCst);
    let done = d.done.fetch_add(1, Ordering::SeqCst) + 1;
    if done == FIRST {
        d.first_done.store(now_ms(), Ordering::SeqCst);
    }
    if done == d.n {
        worker.stop()?;
    }
    Ok(())
}

/// What one drain did.
pub(crate) struct Drained {
    /// Tasks finished within the window.
    pub(crate) done: usize,
    /// First start → last finish, ms.
    pub(crate) span_ms: i64,
    /// First start → the `FIRST`th finish, ms.
    pub(crate) first_ms: i64,
    /// Finished tasks in the database once the worker stopped (its acks written).
    pub(crate) acked: i64,
}

/// Pushes `n` tasks into a fresh database in `dir`, then drains them with one worker of
/// `concurrency` fetching as many at a time, for at most `WINDOW`.
pub(crate) fn drain(n: usize, concurrency: usize, dir: &Path) -> Drained {
    assert!(n >= FIRST, "the peer's drain needs at least {FIRST} tasks");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let db = dir.join("apalis.db");
    let file = dir.join("tiny.txt");
    std::fs::write(&file, "ok").expect("tiny file");
    rt.block_on(async {
        let opts = SqliteConnectOptions::new()
            .filename(&db)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let setup = SqlitePoolOptions::new().max_connections(1).connect_with(opts.clone()).await.expect("open the peer's db");
        SqliteStorage::setup(&setup).await.expect("apalis setup");
        setup.close().await;
        let pool = SqlitePoolOptions::new().connect_with(opts).await.expect("open the peer's db");
        let config = Config::default().queue("drain").batch_size(concurrency);
        let mut storage: SqliteStorage<u32> = SqliteStorage::new(&pool).with_config(config);
        storage.push_bulk((0..n as u32).collect()).await.expect("push the peer's tasks");
        let d = Drain {
            file,
            n,
            done: Arc::default(),
            first_start: Arc::new(AtomicI64::new(i64::MAX)),
            last_finish: Arc::new(AtomicI64::new(0)),
            first_done: Arc::new(AtomicI64::new(0)),
        };
        let worker = WorkerBuilder::new("peer-drain").backend(storage).data(d.clone()).concurrency(concurrency).build(handle);
        // Past the window the worker's future is dropped: the bench reports what it finished.
        if let Ok(run) = tokio::time::timeout(WINDOW, worker.run()).await {
            run.expect("peer worker");
        }
        let acked: i64 = sqlx::query_scalar("SELECT count(*) FROM Jobs WHERE status = 'Done'").fetch_one(&pool).await.expect("count acks");
        let first_start = d.first_start.load(Ordering::SeqCst);
        let first_done = d.first_done.load(Ordering::SeqCst);
        assert!(first_done > 0, "the peer did not finish {FIRST} tasks within {WINDOW:?}");
        Drained {
            done: d.done.load(Ordering::SeqCst),
            span_ms: d.last_finish.load(Ordering::SeqCst) - first_start,
            first_ms: first_done - first_start,
            acked,
        }
    })
}
