//! What the API lists and counts: runs by filter, a job's overview, each job's last run, the queue's depth, the limits' slots.

use std::collections::HashMap;

use async_trait::async_trait;

use super::RunBrief;
use chrono::{DateTime, Utc};

use super::dialect::{ReadSql, Record, Stmt, run_from_row, sql};
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
    /// Each pool's slots held now (run ids, oldest first) and runs waiting for it (run ids, in
    /// line); pools with neither are left out.
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
                "SELECT l.name, l.key, l.run_id FROM ll_run_limits l JOIN ll_runs r ON r.id = l.run_id
                 WHERE r.status = {Running} OR (r.status = {Queued} AND r.dispatched_at IS NOT NULL)
                 ORDER BY l.name, l.key, r.dispatched_at, l.run_id"
            ),
            "reading the slots held",
        );
        let mut states: std::collections::BTreeMap<Pool, PoolState> = std::collections::BTreeMap::new();
        for r in D::fetch_all(&mut c, q).await? {
            let pool = Pool { name: r.text("name"), key: r.text("key") };
            states.entry(pool.clone()).or_insert_with(|| PoolState::new(pool)).holders.push(r.text("run_id"));
        }
        let q = Stmt::new(
            sql!(
                D,
                "SELECT id, limit_wait, limit_wait_since FROM ll_runs
                 WHERE status = {Queued} AND dispatched_at IS NULL AND limit_wait IS NOT NULL
                 ORDER BY limit_wait, due_at, enqueued_at, id"
            ),
            "reading the runs waiting for a limit",
        );
        for r in D::fetch_all(&mut c, q).await? {
            let pool = Pool::decode(r.str("limit_wait"));
            let state = states.entry(pool.clone()).or_insert_with(|| PoolState::new(pool));
            state.waiting.push(r.text("id"));
            let since = r.opt_int("limit_wait_since").map(from_ms);
            state.oldest_wait = state.oldest_wait.min(since).or(state.oldest_wait).or(since);
        }
        Ok(states.into_values().collect())
    }
}

/// One slot pool as it stands.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PoolState {
    pub(crate) pool: Pool,
    /// The runs holding a slot: running, or handed to the queue and about to.
    pub(crate) holders: Vec<String>,
    /// The runs waiting, first in line first.
    pub(crate) waiting: Vec<String>,
    /// Since when the longest of them has waited.
    pub(crate) oldest_wait: Option<DateTime<Utc>>,
}

impl PoolState {
    fn new(pool: Pool) -> Self {
        Self { pool, holders: Vec::new(), waiting: Vec::new(), oldest_wait: None }
    }
}
