//! What the API lists and counts: runs by filter, a job's overview, each job's last run, the queue's depth.

use std::collections::HashMap;

use async_trait::async_trait;

use super::RunBrief;
use super::dialect::{ReadSql, Record, Stmt, run_from_row, sql};
use super::{JobOverview, RunFilter, StoreError};
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
}
