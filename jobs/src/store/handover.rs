//! Handing due runs over: what is due, claimed here or queued, and waits whose time ran out brought back.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::dialect::{Locked, QueueSql, Record, RunSql, Stmt, sql};
use super::scripts::*;
use super::{ACTIVE, DUE_BATCH, Handed, StoreError, from_ms, ms};
use crate::run::Trigger;

#[async_trait]
pub(crate) trait Handover: Send + Sync + std::fmt::Debug {
    /// Queued runs that are due and not handed over yet (id, job), oldest first, at most
    /// [`DUE_BATCH`].
    async fn due_undispatched(&self, now: DateTime<Utc>) -> Result<Vec<(String, String, Trigger)>, StoreError>;
    /// The earliest due instant of a queued run not handed over, or of a waiting run's
    /// `wait_until`.
    async fn next_due(&self) -> Result<Option<DateTime<Utc>>, StoreError>;
    /// True when the job has a run handed over and not finished (for `overlap: queue`).
    async fn has_dispatched_active(&self, job: &str) -> Result<bool, StoreError>;
    /// Hands due queued runs over in one transaction: `handed` are claimed for `worker` (the
    /// caller holds a slot for each) and returned, those another caller took meanwhile left
    /// out; `queued` get a queue task.
    async fn dispatch(&self, handed: &[String], queued: &[String], worker: &str, now: DateTime<Utc>) -> Result<Vec<Handed>, StoreError>;
    /// Waiting runs whose wait ended (`wait_until` passed) are queued again; returns them.
    async fn wake_waiting(&self, now: DateTime<Utc>) -> Result<Vec<String>, StoreError>;
}

#[async_trait]
impl<D: RunSql + QueueSql> Handover for D {
    async fn due_undispatched(&self, now: DateTime<Utc>) -> Result<Vec<(String, String, Trigger)>, StoreError> {
        let q = Stmt::new(due_undispatched_sql::<D>(), "reading due runs").bind(ms(now)).bind(DUE_BATCH as i64);
        Ok(D::fetch_all(&mut *self.reader().await?, q)
            .await?
            .iter()
            .map(|r| (r.text("id"), r.text("job"), r.str("trigger").parse().unwrap_or(Trigger::Api)))
            .collect())
    }

    async fn next_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let row = D::fetch_optional(&mut *self.reader().await?, Stmt::new(next_due_sql::<D>(), "reading the next due run")).await?;
        Ok(row.and_then(|r| r.opt_int("t")).map(from_ms))
    }

    async fn has_dispatched_active(&self, job: &str) -> Result<bool, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                format!(
                    "SELECT EXISTS (SELECT 1 FROM ll_runs WHERE job = $1 AND status IN {} AND (status != {{Queued}} OR dispatched_at IS NOT NULL)) AS found",
                    *ACTIVE
                )
            ),
            "reading active runs",
        );
        Ok(D::fetch_optional(&mut *self.reader().await?, q.bind(job)).await?.is_some_and(|r| r.flag("found")))
    }

    /// Several schedulers may hand the same due runs over at once: rows another one holds are
    /// skipped (it is handing them over), the rest taken.
    async fn dispatch(&self, handed: &[String], queued: &[String], worker: &str, now: DateTime<Utc>) -> Result<Vec<Handed>, StoreError> {
        let mut tx = self.begin().await?;
        // Without a live lease nothing is claimed: the runs stay due, for a worker that has one.
        let epoch = if handed.is_empty() { None } else { live_epoch::<D>(&mut tx, worker).await? };
        let claimed = match epoch {
            Some(epoch) => claim::<D>(&mut tx, handed, worker, epoch, now, Locked::Skip).await?,
            None => Vec::new(),
        };
        let to_push = if queued.is_empty() { Vec::new() } else { D::mark_dispatched(&mut tx, queued, ms(now)).await? };
        D::push(&mut tx, &to_push).await?;
        D::commit(tx).await?;
        Ok(claimed)
    }

    async fn wake_waiting(&self, now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                "UPDATE ll_runs SET status = {Queued}, dispatched_at = NULL, wait_until = NULL
                 WHERE status = {WaitingApproval} AND wait_until <= $1 RETURNING id"
            ),
            "resuming runs whose wait is over",
        );
        Ok(D::fetch_all(&mut *self.writer().await?, q.bind(ms(now))).await?.iter().map(|r| r.text("id")).collect())
    }
}
