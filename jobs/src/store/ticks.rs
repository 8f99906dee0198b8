//! Firing ticks: one wake's ticks in one transaction (keys, decisions, runs, claims, queue tasks), and what a backfill reads of a job's ticks.

use std::collections::{BTreeSet, HashMap, HashSet};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use lamplighter_config::Overlap;

use super::dialect::{QueueSql, Record, RunSql, Stmt, insert_rows, sql};
use super::scripts::*;
use super::{Claim, Hold, NewRun, StoreError, TickOutcome, from_ms, ms, new_id};
use crate::decide::{TickPlan, plan_ticks};
use crate::events::TxTimings;
use crate::run::Trigger;

#[async_trait]
pub(crate) trait Ticks: Send + Sync + std::fmt::Debug {
    /// Records every tick of one wake in one transaction: the tick keys (a tick already
    /// recorded yields `None`: it fired before), the tick decision for each (pause state and
    /// the job's active runs read in the same transaction), the runs, each job's last tick, and
    /// queue tasks for the runs that do not go to `claim.slots` directly. The first
    /// `claim.slots` runs that can start now are claimed for `claim.worker` in the same
    /// transaction. A tick is never recorded without its run being queued or claimed.
    async fn fire_ticks(
        &self,
        ticks: Vec<(NewRun, Overlap)>,
        claim: Claim<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<Option<TickOutcome>>, StoreError> {
        Ok(self.fire_ticks_held(ticks, claim, now, None).await?.map(|(outcomes, _)| outcomes).unwrap_or_default())
    }
    /// [`Ticks::fire_ticks`] with its commit held until `hold` answers, every statement
    /// done: true commits, false rolls back and answers `None` (nothing was recorded). The
    /// scheduler does a tick's work just before its instant and commits at it. Also says where
    /// the transaction's time went.
    async fn fire_ticks_held(
        &self,
        ticks: Vec<(NewRun, Overlap)>,
        claim: Claim<'_>,
        now: DateTime<Utc>,
        hold: Option<Hold<'_>>,
    ) -> Result<Option<(Vec<Option<TickOutcome>>, TxTimings)>, StoreError>;
    /// How many runs `job` has, and the instant of its oldest (its tick, or when it was queued).
    async fn run_span(&self, job: &str) -> Result<(u64, Option<DateTime<Utc>>), StoreError>;
    /// The ticks in `from..=to` of `job` that have a run (of any attempt or trigger).
    async fn ticks_with_runs(&self, job: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> Result<HashSet<i64>, StoreError>;
}

#[async_trait]
impl<D: RunSql + QueueSql> Ticks for D {
    async fn fire_ticks_held(
        &self,
        ticks: Vec<(NewRun, Overlap)>,
        claim: Claim<'_>,
        now: DateTime<Utc>,
        hold: Option<Hold<'_>>,
    ) -> Result<Option<(Vec<Option<TickOutcome>>, TxTimings)>, StoreError> {
        // Where the transaction's time goes (the scheduler's `TickBurst` event carries it).
        let began = std::time::Instant::now();
        let mut lap = began;
        let mut split = move || {
            let now = std::time::Instant::now();
            now.duration_since(std::mem::replace(&mut lap, now)).as_micros() as u64
        };
        let mut tx = self.begin().await?;
        let begin_us = split();
        let ids: Vec<String> = ticks.iter().map(|_| new_id()).collect();
        let names: Vec<String> = ticks.iter().map(|(r, _)| r.owner.to_string()).collect();
        let keys = ticks
            .iter()
            .zip(&ids)
            .zip(&names)
            .map(|(((r, _), id), job)| (job.as_str(), ms(r.scheduled_at.unwrap_or(r.due_at)), id.as_str()))
            .collect();
        let fresh = D::record_ticks(&mut tx, keys).await?;
        let keys_us = split();
        let jobs: Vec<&str> = names
            .iter()
            .zip(&ids)
            .filter(|(_, id)| fresh.contains(*id))
            .map(|(job, _)| job.as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        D::lock_jobs(&mut tx, &jobs).await?;
        let q = Stmt::new(sql!(D, "SELECT job FROM ll_job_state WHERE paused AND job {in $1}"), "reading pause state");
        let paused: HashSet<String> =
            D::fetch_all(&mut tx, q.bind_list(jobs.iter().copied())).await?.iter().map(|r| r.text("job")).collect();
        // A backfill's runs are a stream of their own: they hold each other back (a backfill
        // batch sees them), but never count against a live tick's overlap policy, which would
        // otherwise skip live ticks while a backfill drains, or cancel it (`replace`).
        let backfill = ticks.iter().any(|(r, _)| r.trigger == Trigger::Backfill);
        let q = Stmt::new(active_runs_sql::<D>(), "reading active runs");
        let mut active: HashMap<String, Vec<String>> = HashMap::new();
        for row in D::fetch_all(&mut tx, q.bind_list(jobs.iter().copied()).bind(Trigger::Backfill.as_str()).bind(backfill)).await? {
            active.entry(row.text("job")).or_default().push(row.text("id"));
        }
        // Claims need a live lease: they record its epoch, the fence of the runs' writes. A
        // worker without one leaves its runs to the queue, for a worker that has.
        let mut claim = claim;
        let mut epoch = None;
        if claim.slots > 0 {
            epoch = live_epoch::<D>(&mut tx, claim.worker).await?;
            if epoch.is_none() {
                claim.slots = 0;
            }
        }
        let reads_us = split();
        let TickPlan { out, rows, pushed, last_ticks } = plan_ticks(ticks, ids, &fresh, &paused, active, claim, now);
        insert_runs::<D>(&mut tx, &rows, epoch, now).await?;
        let runs_us = split();
        // In job order (a BTreeMap), as the jobs were locked.
        let last: Vec<(&String, &i64)> = last_ticks.iter().collect();
        for chunk in last.chunks(ROWS_PER_STATEMENT) {
            let tail =
                sql!(D, "ON CONFLICT (job) DO UPDATE SET last_tick = {greatest}(coalesce(ll_job_state.last_tick, 0), excluded.last_tick)");
            let rows = chunk.iter().map(|(job, at)| vec![job.as_str().into(), (**at).into()]).collect();
            let q =
                insert_rows(&D::SPELLING, "ll_job_state", &[("job", "text"), ("last_tick", "bigint")], rows, tail, "saving the last ticks");
            D::execute(&mut tx, q).await?;
        }
        D::push(&mut tx, &pushed).await?;
        // Only to make the commit at the instant shorter: the commit syncs what this did not.
        if hold.is_some()
            && let Err(e) = self.ahead_of_commit(&mut tx).await
        {
            tracing::debug!(error = %e, "cannot sync a held tick transaction ahead of its commit");
        }
        let state_us = split();
        if let Some(hold) = hold
            && !hold.await
        {
            D::rollback(tx).await?;
            return Ok(None);
        }
        let held_us = split();
        D::commit(tx).await?;
        let timings = TxTimings {
            begin_us,
            keys_us,
            reads_us,
            runs_us,
            state_us,
            held_us,
            commit_us: split(),
            total_us: began.elapsed().as_micros() as u64,
        };
        Ok(Some((out, timings)))
    }

    async fn run_span(&self, job: &str) -> Result<(u64, Option<DateTime<Utc>>), StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT count(*) AS n, min(coalesce(scheduled_at, enqueued_at)) AS oldest FROM ll_runs WHERE job = $1"),
            "reading a job's runs",
        );
        let row = D::fetch_optional(&mut *self.reader().await?, q.bind(job)).await?;
        Ok(row.map_or((0, None), |r| (r.int("n").max(0) as u64, r.opt_int("oldest").map(from_ms))))
    }

    async fn ticks_with_runs(&self, job: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> Result<HashSet<i64>, StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT DISTINCT scheduled_at FROM ll_runs WHERE job = $1 AND scheduled_at >= $2 AND scheduled_at <= $3"),
            "reading a job's ticks",
        );
        let rows = D::fetch_all(&mut *self.reader().await?, q.bind(job).bind(ms(from)).bind(ms(to))).await?;
        let mut out: HashSet<i64> = rows.iter().filter_map(|r| r.opt_int("scheduled_at")).collect();
        // Tick keys are kept for an hour after their runs may be pruned.
        let q = Stmt::new(
            sql!(D, "SELECT scheduled_at FROM ll_ticks WHERE job = $1 AND scheduled_at >= $2 AND scheduled_at <= $3"),
            "reading a job's tick keys",
        );
        out.extend(
            D::fetch_all(&mut *self.reader().await?, q.bind(job).bind(ms(from)).bind(ms(to))).await?.iter().map(|r| r.int("scheduled_at")),
        );
        Ok(out)
    }
}
