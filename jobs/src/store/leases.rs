//! Who owns running runs: the workers' leases and epochs, and the recovery of what workers that are gone left.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::dialect::{LeaseSql, QueueSql, Record, RunSql, Stmt, leases_with_runs, run_cols, run_from_row, sql};
use super::scripts::*;
use super::{Lease, StoreError, WorkerId, WorkerLease, from_ms, ms};
use crate::run::{Run, RunStatus};

#[async_trait]
pub(crate) trait Leases: Send + Sync + std::fmt::Debug {
    /// Takes or renews `me`'s lease until `lease` from now (the database server's clock where
    /// it has one, else `now`). With `take_over`, a row under the same name left by an earlier
    /// process is taken over (a restart under a configured name); without, `None` means another
    /// process holds the name now. Returns the lease's epoch: a new one whenever the lease is
    /// taken afresh (a new process, or on a shared database a lease that had run out). Others
    /// may take its runs over from the lease's end plus [`crate::decide::Fencing::margin`].
    async fn heartbeat(&self, me: &WorkerId, lease: Duration, take_over: bool, now: DateTime<Utc>) -> Result<Option<Lease>, StoreError>;
    /// Gives the lease up (a clean stop).
    async fn release(&self, me: &WorkerId) -> Result<(), StoreError>;
    /// Writes `digest` (the scheduled jobs `me` knows, [`crate::share::digest`]; `None`: it
    /// takes no share of them) with `me`'s lease, and reads the group it is in: the workers
    /// with a live lease and the same digest, by name, `me` included while it has one. Where
    /// one worker holds the database (SQLite), that worker alone.
    async fn share(&self, me: &WorkerId, digest: Option<&str>) -> Result<Vec<String>, StoreError>;
    /// Workers whose lease has not run out, with their running runs, by name.
    async fn workers(&self, now: DateTime<Utc>) -> Result<Vec<WorkerLease>, StoreError>;
    /// Runs left `running` by workers that are gone become `interrupted` (their open steps
    /// with them), and queued runs handed to them are handed over again. Gone: on a shared
    /// database, every worker whose lease ran out, and `starting` (a worker that starts runs
    /// nothing yet, whatever an earlier process under its name left); on SQLite, one worker per
    /// file, every worker. Returns the interrupted runs.
    async fn recover(&self, starting: Option<&str>, now: DateTime<Utc>) -> Result<Vec<Run>, StoreError>;
    /// Interrupted runs nobody has followed up yet.
    async fn interrupted_without_follow_up(&self) -> Result<Vec<Run>, StoreError>;
    /// Workers whose lease ran out within `within` before `now` and that never gave it up (a
    /// crash, a cut from the database): no worker renews it, by name.
    async fn lapsed(&self, within: Duration, now: DateTime<Utc>) -> Result<Vec<WorkerLease>, StoreError>;
}

#[async_trait]
impl<D: LeaseSql + RunSql + QueueSql> Leases for D {
    async fn heartbeat(&self, me: &WorkerId, lease: Duration, take_over: bool, now: DateTime<Utc>) -> Result<Option<Lease>, StoreError> {
        let row = LeaseSql::heartbeat(self, me, lease, take_over, ms(now)).await?;
        Ok(row.map(|(epoch, server_now)| Lease { epoch, server_now: from_ms(server_now) }))
    }

    async fn release(&self, me: &WorkerId) -> Result<(), StoreError> {
        let q = Stmt::new(sql!(D, "DELETE FROM ll_workers WHERE name = $1 AND instance = $2"), "giving up the worker's lease");
        D::execute(&mut *self.writer().await?, q.bind(me.name.as_str()).bind(me.instance.as_str())).await?;
        Ok(())
    }

    async fn share(&self, me: &WorkerId, digest: Option<&str>) -> Result<Vec<String>, StoreError> {
        if !D::KIND.takes_over_from_others() {
            return Ok(vec![me.name.clone()]);
        }
        // The others as they committed, this worker as it writes itself, in one round trip; the
        // row is written only when the digest changed (a renewal writes it already).
        let q = Stmt::new(
            sql!(
                D,
                "WITH mine AS (UPDATE ll_workers SET shares = $3 WHERE name = $1 AND instance = $2 AND shares IS DISTINCT FROM $3)
                 SELECT w.name FROM ll_workers w WHERE w.shares = $3 AND w.name <> $1 {lease_live}
                 UNION SELECT $1 WHERE $3 IS NOT NULL
                 ORDER BY 1"
            ),
            "writing the worker's share of the schedule",
        );
        let q = q.bind(me.name.as_str()).bind(me.instance.as_str()).bind(digest);
        Ok(D::fetch_all(&mut *self.writer().await?, q).await?.iter().map(|r| r.text("name")).collect())
    }

    async fn lapsed(&self, within: Duration, now: DateTime<Utc>) -> Result<Vec<WorkerLease>, StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT * FROM ll_workers WHERE lease_until <= $1 AND lease_until > $2 ORDER BY name"),
            "reading lapsed worker leases",
        );
        let since = now - chrono::Duration::from_std(within).unwrap_or(chrono::Duration::days(1));
        let rows = D::fetch_all(&mut *self.reader().await?, q.bind(ms(now)).bind(ms(since))).await?;
        Ok(leases_with_runs(&rows, &Vec::<D::Row>::new()))
    }

    async fn workers(&self, now: DateTime<Utc>) -> Result<Vec<WorkerLease>, StoreError> {
        let mut c = self.reader().await?;
        let leases = D::live_leases(&mut c, ms(now)).await?;
        let q = Stmt::new(
            sql!(D, "SELECT worker, id FROM ll_runs WHERE status = {Running} AND worker IS NOT NULL ORDER BY id"),
            "reading running runs",
        );
        let running = D::fetch_all(&mut c, q).await?;
        Ok(leases_with_runs(&leases, &running))
    }

    /// The orphans and their open steps are interrupted together, in one transaction. Where a
    /// backend serves one worker, every queued run is then handed over again (the tasks that
    /// carried them are dropped); on a shared database queue tasks are not owned by workers (a
    /// task is consumed in the transaction that claims its run), so nothing is handed over.
    async fn recover(&self, starting: Option<&str>, now: DateTime<Utc>) -> Result<Vec<Run>, StoreError> {
        let mut tx = self.begin().await?;
        let runs: Vec<Run> = D::interrupt_orphans(&mut tx, starting, ms(now)).await?.iter().map(run_from_row).collect();
        // Interrupted, or cancelled when a cancel had been asked for.
        let interrupted: Vec<(&str, RunStatus)> = runs.iter().map(|r| (r.id.as_str(), r.status)).collect();
        close_steps::<D>(&mut tx, &interrupted, now).await?;
        // A notification claimed by a worker that is gone was being sent when it stopped: it
        // goes again now, with the same key, instead of when the claim would have run out. On
        // SQLite the lock says the one before this process is gone; on PostgreSQL, a lease
        // that is no longer live.
        let gone = if D::KIND.takes_over_from_others() {
            "NOT EXISTS (SELECT 1 FROM ll_workers w WHERE w.name = ll_notifications.claimed_by {lease_live})"
        } else {
            "claimed_by <> $2"
        };
        let q = Stmt::new(
            sql!(D, format!("UPDATE ll_notifications SET status = 'pending', next_at = $1 WHERE status = 'sending' AND {gone}")),
            "releasing the notifications of workers that are gone",
        );
        let q = q.bind(ms(now));
        let q = if D::KIND.takes_over_from_others() { q } else { q.bind(starting.unwrap_or_default()) };
        D::execute(&mut tx, q).await?;
        D::commit(tx).await?;
        if !D::KIND.takes_over_from_others() {
            let mut tx = self.begin().await?;
            let q = Stmt::new(sql!(D, "UPDATE ll_runs SET dispatched_at = NULL WHERE status = {Queued}"), "re-queueing runs");
            D::execute(&mut tx, q).await?;
            D::forget_queue(&mut tx).await?;
            D::commit(tx).await?;
        }
        Ok(runs)
    }

    async fn interrupted_without_follow_up(&self) -> Result<Vec<Run>, StoreError> {
        let q = Stmt::new(
            sql!(D, concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE status = {Interrupted} AND next_run_id IS NULL")),
            "reading interrupted runs",
        );
        Ok(D::fetch_all(&mut *self.reader().await?, q).await?.iter().map(run_from_row).collect())
    }
}
