//! The storage's own life: migrations, readiness, closing, retention and housekeeping.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::dialect::{Stmt, UpkeepSql, sql};
use super::{ACTIVE, StoreError, TICK_KEYS_KEPT, ms};

#[async_trait]
pub(crate) trait Upkeep: Send + Sync + std::fmt::Debug {
    /// Applies the queue's migrations and ours.
    async fn migrate(&self) -> Result<(), StoreError>;
    /// Closes every connection; later calls fail with a storage error.
    async fn close(&self);
    /// The storage answers and is the one this worker opened; else what is wrong, for
    /// `/readyz`.
    async fn check(&self) -> Result<(), String>;
    /// Deletes each job's finished runs beyond its retention (count and age), and its tick
    /// keys older than [`TICK_KEYS_KEPT`], in one transaction (one commit for them all, not
    /// one a statement); the runs deleted. Active runs are never deleted.
    async fn prune(&self, jobs: &[Retain<'_>], now: DateTime<Utc>) -> Result<u64, StoreError>;
    /// What pruning single jobs leaves behind (checkpoints of deleted runs, consumed queue
    /// tasks), and the backend's own upkeep.
    async fn housekeeping(&self) -> Result<(), StoreError>;
}

#[async_trait]
impl<D: UpkeepSql> Upkeep for D {
    async fn migrate(&self) -> Result<(), StoreError> {
        UpkeepSql::migrate(self).await
    }

    async fn close(&self) {
        UpkeepSql::close(self).await
    }

    async fn check(&self) -> Result<(), String> {
        UpkeepSql::check(self).await
    }

    async fn prune(&self, jobs: &[Retain<'_>], now: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let mut deleted = 0;
        for job in jobs {
            deleted += prune_job::<D>(&mut tx, job, now).await?;
        }
        D::commit(tx).await?;
        Ok(deleted)
    }

    async fn housekeeping(&self) -> Result<(), StoreError> {
        // The output of runs that are gone (pruned).
        let q = Stmt::new(
            sql!(D, "DELETE FROM ll_run_output WHERE NOT EXISTS (SELECT 1 FROM ll_runs WHERE ll_runs.id = ll_run_output.run_id)"),
            "pruning output",
        );
        D::execute(&mut *self.writer().await?, q).await?;
        // Notifications about runs that are gone (pruned), once they are done with.
        let q = Stmt::new(
            sql!(
                D,
                "DELETE FROM ll_notifications WHERE status IN ('delivered', 'abandoned')
                 AND NOT EXISTS (SELECT 1 FROM ll_runs WHERE ll_runs.id = ll_notifications.root_id)"
            ),
            "pruning notifications",
        );
        D::execute(&mut *self.writer().await?, q).await?;
        UpkeepSql::housekeeping(self).await
    }
}

/// A job's retention, as [`Upkeep::prune`] applies it: the finished runs to keep, by count
/// and by age (none: no bound).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retain<'a> {
    pub(crate) job: &'a str,
    pub(crate) keep: Option<u32>,
    pub(crate) max_age: Option<Duration>,
}

/// One job's retention, on `c` (the pruning transaction).
async fn prune_job<D: UpkeepSql>(c: &mut D::Conn, r: &Retain<'_>, now: DateTime<Utc>) -> Result<u64, StoreError> {
    let Retain { job, keep, max_age } = *r;
    let mut deleted = 0;
    if let Some(keep) = keep {
        // Older than the newest `keep` finished runs: at or below the next one's id. One read
        // of those `keep` runs (by `(job, id)`, newest first) finds it; a `NOT IN` the newest
        // `keep` read them and then every finished run of the job, about three times the pages
        // (the largest statement of a worker keeping 100 runs for each of 1,000 per-second jobs).
        let q = Stmt::new(
            sql!(
                D,
                format!(
                    "DELETE FROM ll_runs WHERE job = $1 AND status NOT IN {a} AND outcome_seen IS NOT NULL AND id <=
                     (SELECT id FROM ll_runs WHERE job = $1 AND status NOT IN {a} ORDER BY id DESC LIMIT 1 OFFSET $2)",
                    a = *ACTIVE
                )
            ),
            "pruning runs by count",
        );
        deleted += D::execute(c, q.bind(job).bind(i64::from(keep))).await?;
    }
    if let Some(age) = max_age {
        let q = Stmt::new(
            sql!(
                D,
                format!(
                    "DELETE FROM ll_runs WHERE job = $1 AND status NOT IN {} AND outcome_seen IS NOT NULL AND finished_at < $2",
                    *ACTIVE
                )
            ),
            "pruning runs by age",
        );
        deleted += D::execute(c, q.bind(job).bind(ms(now) - age.as_millis() as i64)).await?;
    }
    let q = Stmt::new(sql!(D, "DELETE FROM ll_ticks WHERE job = $1 AND scheduled_at < $2"), "pruning ticks");
    D::execute(c, q.bind(job).bind(ms(now) - TICK_KEYS_KEPT.as_millis() as i64)).await?;
    Ok(deleted)
}
