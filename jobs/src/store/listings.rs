//! What the API lists and counts: runs by filter, a job's overview, each job's last run, the queue's depth, the limits' slots.

use std::collections::HashMap;

use async_trait::async_trait;

use super::RunBrief;
use chrono::{DateTime, Utc};

use super::dialect::{ReadSql, Record, Stmt, run_from_row, sql};
use super::scripts::HOLDING;
use super::{JobOverview, RunFilter, StoreError, from_ms};
use crate::limits::Pool;
use crate::run::Run;

#[async_trait]
pub(crate) trait Listings: Send + Sync + std::fmt::Debug {
    /// Runs, newest first, with paging by cursor.
    async fn list_runs(&self, f: &RunFilter) -> Result<Vec<Run>, StoreError>;
    /// One job's state, its `recent` newest runs and its run counts by status, read together
    /// (a job's detail page).
    async fn job_overview(&self, job: &str, recent: u32) -> Result<JobOverview, StoreError>;
    /// The latest run of each of `jobs` that has one (one index lookup per job: a listing asks
    /// for one page of jobs, never a scan of the whole history).
    async fn last_runs(&self, jobs: &[&str]) -> Result<HashMap<String, RunBrief>, StoreError>;
    /// A count that moves whenever what a job listing shows may have changed (a run's brief, a
    /// job's pause), by any writer, and stays while it has not; `None` when the backend cannot
    /// tell cheaply (PostgreSQL). A kept listing depends on it (`Engine::listing_version`).
    async fn listing_changes(&self) -> Option<u64> {
        None
    }
    /// Runs waiting to start.
    async fn queue_depth(&self) -> Result<u64, StoreError>;
    /// Each pool's slots held now (run ids, oldest first) and runs waiting for it (how many,
    /// and the first [`WAITING_SHOWN`] in line); pools with neither are left out.
    async fn pools(&self) -> Result<Vec<PoolState>, StoreError>;
}

#[async_trait]
impl<D: ReadSql> Listings for D {
    /// Runs, newest first, with paging by cursor.
    async fn list_runs(&self, f: &RunFilter) -> Result<Vec<Run>, StoreError> {
        Ok(D::fetch_all(&mut *self.reader().await?, f.query(&D::SPELLING)).await?.iter().map(run_from_row).collect())
    }

    async fn job_overview(&self, job: &str, recent: u32) -> Result<JobOverview, StoreError> {
        ReadSql::job_overview(self, job, recent).await
    }

    async fn last_runs(&self, jobs: &[&str]) -> Result<HashMap<String, RunBrief>, StoreError> {
        ReadSql::last_runs(self, jobs).await
    }

    async fn listing_changes(&self) -> Option<u64> {
        ReadSql::listing_changes(self).await
    }

    async fn queue_depth(&self) -> Result<u64, StoreError> {
        let q = Stmt::new(sql!(D, "SELECT count(*) AS n FROM ll_runs WHERE status = {Queued}"), "counting queued runs");
        Ok(D::fetch_optional(&mut *self.reader().await?, q).await?.map_or(0, |r| r.int("n")) as u64)
    }

    async fn pools(&self) -> Result<Vec<PoolState>, StoreError> {
        let mut c = self.reader().await?;
        let q = Stmt::new(
            sql!(
                D,
                format!(
                    "SELECT CASE WHEN l.key = '' THEN l.name ELSE l.name || ':' || l.key END AS pool, l.run_id, h.dispatched_at
                     FROM ll_run_limits l JOIN ll_runs h ON h.id = l.run_id WHERE {HOLDING}
                     UNION
                     SELECT h.limit_hold, h.id, h.dispatched_at FROM ll_runs h WHERE h.limit_hold IS NOT NULL AND {HOLDING}
                     ORDER BY 1, 3, 2"
                )
            ),
            "reading the slots held",
        );
        let mut states: std::collections::BTreeMap<Pool, PoolState> = std::collections::BTreeMap::new();
        for r in D::fetch_all(&mut c, q).await? {
            let pool = Pool::decode(r.str("pool"));
            states.entry(pool.clone()).or_insert_with(|| PoolState::new(pool)).holders.push(r.text("run_id"));
        }
        // How many wait on each pool, and since when (an index-only read of the waiters), then
        // the first of each line.
        let q = Stmt::new(
            sql!(
                D,
                "SELECT limit_wait, count(*) AS n, min(limit_wait_since) AS since FROM ll_runs {limit_waits}
                 WHERE status = {Queued} AND dispatched_at IS NULL AND limit_wait IS NOT NULL GROUP BY limit_wait"
            ),
            "counting the runs waiting for a limit",
        );
        for r in D::fetch_all(&mut c, q).await? {
            let pool = Pool::decode(r.str("limit_wait"));
            let state = states.entry(pool.clone()).or_insert_with(|| PoolState::new(pool));
            state.waiting_count = r.int("n").max(0) as usize;
            state.oldest_wait = r.opt_int("since").map(from_ms);
        }
        for state in states.values_mut().filter(|s| s.waiting_count > 0) {
            let q = Stmt::new(super::handover::limit_wait_reads::<D>()[1], "reading the runs waiting for a limit");
            let rows = D::fetch_all(&mut c, q.bind(state.pool.encode()).bind(WAITING_SHOWN as i64)).await?;
            state.waiting = rows.iter().map(|r| r.text("id")).collect();
        }
        Ok(states.into_values().collect())
    }
}

/// Runs waiting for a pool that [`Listings::pools`] names.
pub(crate) const WAITING_SHOWN: usize = 100;

/// One slot pool as it stands.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PoolState {
    pub(crate) pool: Pool,
    /// The runs holding a slot: running, or handed to the queue and about to.
    pub(crate) holders: Vec<String>,
    /// The first [`WAITING_SHOWN`] runs waiting, first in line first.
    pub(crate) waiting: Vec<String>,
    /// How many wait in all.
    pub(crate) waiting_count: usize,
    /// Since when the longest of them has waited.
    pub(crate) oldest_wait: Option<DateTime<Utc>>,
}

impl PoolState {
    fn new(pool: Pool) -> Self {
        Self { pool, holders: Vec::new(), waiting: Vec::new(), waiting_count: 0, oldest_wait: None }
    }
}
