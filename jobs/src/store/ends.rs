//! Claims from the queue and the ends of runs: recorded behind the fence, followed up or not, cancels asked for.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::dialect::{QueueSql, Record, RunSql, Stmt, handed_from_row, sql};
use super::scripts::*;
use super::{Dispatch, LimitPass, NewRun, RunEnd, StoreError, Taken, ms, new_id, status_list};
use crate::events::EndsWrite;
use crate::run::{Run, RunStatus, Transitions};

#[async_trait]
pub(crate) trait Ends: Send + Sync + std::fmt::Debug {
    /// Takes up to `n` tasks from the queue and claims their runs for `worker`, in one
    /// transaction. Tasks whose run is no longer queued (cancelled) are consumed and skipped.
    async fn claim_queued(&self, n: usize, worker: &str, now: DateTime<Utc>) -> Result<Taken, StoreError>;
    /// Records the end of runs this worker claimed, in one statement (a run that waits for
    /// approval is not finished: it keeps no `finished_at` and gets its `wait_until`). A run
    /// whose cancel was asked for meanwhile ends `cancelled` unless it succeeded. Returns the
    /// ids recorded as asked: still running, this worker's, and not cancelled instead (a run
    /// whose worker's lease ran out, or that was claimed under an earlier epoch of the lease, is
    /// fenced and left to whoever takes it over). Steps
    /// of runs that failed, were stopped or interrupted and are still open are closed.
    async fn finish_many(&self, ends: &[RunEnd<'_>], now: DateTime<Utc>) -> Result<Vec<String>, StoreError>;
    /// How long ends that claim nothing may wait for more ends to join their write
    /// ([`Dialect::ENDS_GATHER`](super::dialect::Dialect::ENDS_GATHER)).
    fn ends_gather(&self) -> std::time::Duration;
    /// [`Ends::finish_many`] and then [`Ends::claim_queued`] of up to `n` runs, in one
    /// transaction: the slots the ends free are filled again without a second write (the
    /// single writer alternated between small claims and small batches of ends).
    async fn finish_and_claim(
        &self,
        ends: &[RunEnd<'_>],
        n: usize,
        worker: &str,
        now: DateTime<Utc>,
    ) -> Result<(Vec<String>, Taken), StoreError>;
    /// The ends of runs that held limits' slots, and in the same transaction the admission of
    /// the runs waiting for the pools of `limits.freed` (claimed into `limits.spare` of the
    /// slots the ends free, the rest queued), then a claim of up to `n` queued runs (the slots
    /// left). The runs admitted come first in [`Taken::runs`].
    async fn finish_and_admit(
        &self,
        ends: &[RunEnd<'_>],
        limits: LimitPass<'_>,
        n: usize,
        worker: &str,
        now: DateTime<Utc>,
    ) -> Result<(Vec<String>, Taken), StoreError>;
    /// Ends a run that is not running (queued, or waiting for approval), if its status allows
    /// it ([`Transitions::can_become`]). False when it did not: a running run's end is its
    /// worker's to record ([`Ends::finish_many`], fenced), after it has stopped the work;
    /// others ask for it ([`Ends::request_cancel`]). Steps of the run still open are
    /// closed (cancelled).
    async fn finish(
        &self,
        id: &str,
        status: RunStatus,
        output: Option<&serde_json::Value>,
        error: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError>;
    /// Those of `ids` still `running`: an end for them that was not recorded was refused by
    /// the fence, not by a change of status.
    async fn still_running(&self, ids: &[&str]) -> Result<Vec<String>, StoreError>;
    /// Keeps a cancel asked for a running run (`why`), for the worker running it to find if it
    /// misses the signal; false when the run is not running.
    async fn request_cancel(&self, id: &str, why: &str) -> Result<bool, StoreError>;
    /// The runs `worker` runs whose cancel was asked for: (id, why).
    async fn cancels_requested(&self, worker: &str) -> Result<Vec<(String, String)>, StoreError>;
    /// Inserts the next attempt of `run` (same root, its job snapshot copied), due at `due_at`,
    /// and links it from `run`. `None` when `run` already has a follow-up.
    async fn follow_up(&self, run: &Run, due_at: DateTime<Utc>, now: DateTime<Utc>) -> Result<Option<String>, StoreError>;
    /// Marks `run` as having no follow-up (its policy gives it none).
    async fn mark_no_follow_up(&self, id: &str) -> Result<(), StoreError>;
}

/// What follows the hand-off of the slots ends freed, in `tx`: the pools it `left` admitted
/// under their locks (into `limits.spare` slots, the rest queued), then claims from the queue
/// into what is left of `n` slots once `taken`'s admitted runs have theirs; added to `taken`.
async fn admit_left_and_claim<D: RunSql + QueueSql>(
    tx: &mut D::Conn,
    left: &[crate::limits::Pool],
    limits: LimitPass<'_>,
    n: usize,
    worker: &str,
    now: DateTime<Utc>,
    taken: &mut Taken,
) -> Result<(), StoreError> {
    if !left.is_empty() {
        let handed = super::handover::hand_over_in::<D>(tx, &[], &[], LimitPass { freed: left, ..limits }, worker, now).await?;
        taken.admitted += handed.claimed.len();
        taken.pushed += handed.pushed;
        taken.waited.extend(handed.waited);
        taken.runs.extend(handed.claimed);
    }
    let n = n.saturating_sub(taken.admitted);
    if n > 0 {
        let more = take_and_claim::<D>(tx, n, worker, now).await?;
        taken.tasks = more.tasks;
        taken.runs.extend(more.runs);
    }
    Ok(())
}

#[async_trait]
impl<D: RunSql + QueueSql> Ends for D {
    /// The tasks taken are this transaction's alone, so their runs are locked by nobody else
    /// but a concurrent cancel: the claim waits for it and then leaves the run out.
    async fn claim_queued(&self, n: usize, worker: &str, now: DateTime<Utc>) -> Result<Taken, StoreError> {
        let mut tx = self.begin().await?;
        let taken = take_and_claim::<D>(&mut tx, n, worker, now).await?;
        D::commit(tx).await?;
        Ok(taken)
    }

    fn ends_gather(&self) -> std::time::Duration {
        D::ENDS_GATHER
    }

    async fn finish_many(&self, ends: &[RunEnd<'_>], now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        debug_assert!(ends.iter().all(|e| RunStatus::Running.can_become(e.status)));
        let as_asked = |done: &[(String, RunStatus)]| recorded_as_asked(ends, done);
        if let Some(written) = self.ends_at_once(ends, ms(now)).await {
            return Ok(as_asked(&written?));
        }
        // Only a batch with steps to close needs a transaction around both statements (a run
        // ended `cancelled` instead, its cancel asked for meanwhile, has its steps closed after).
        // So does a batch with successes noticed at their end (their jobs' state moves with them).
        if !ends.iter().any(|e| (e.status.is_final() && e.status != RunStatus::Succeeded) || e.noticed) {
            let done = finish_runs::<D>(&mut *self.recording().await?, ends, ms(now)).await?;
            let cancelled: Vec<(&str, RunStatus)> =
                done.iter().filter(|(_, s)| *s == RunStatus::Cancelled).map(|(id, s)| (id.as_str(), *s)).collect();
            if !cancelled.is_empty() {
                close_steps::<D>(&mut *self.recording().await?, &cancelled, now).await?;
            }
            return Ok(as_asked(&done));
        }
        let mut tx = self.begin_recording().await?;
        let done = finish_runs::<D>(&mut tx, ends, ms(now)).await?;
        notice_successes::<D>(&mut tx, &noticed_of(ends, &done)).await?;
        let ended: Vec<(&str, RunStatus)> = done.iter().map(|(id, s)| (id.as_str(), *s)).collect();
        close_steps::<D>(&mut tx, &ended, now).await?;
        D::commit(tx).await?;
        Ok(as_asked(&done))
    }

    async fn finish_and_claim(
        &self,
        ends: &[RunEnd<'_>],
        n: usize,
        worker: &str,
        now: DateTime<Utc>,
    ) -> Result<(Vec<String>, Taken), StoreError> {
        if n == 0 {
            return Ok((self.finish_many(ends, now).await?, Taken::default()));
        }
        // Where the write's time goes (the executor's `EndsRecorded` event carries it).
        let mut lap = std::time::Instant::now();
        if let Some(written) = self.ends_and_claims_at_once(ends, n, worker, ms(now)).await {
            let (done, tasks, rows, writer_wait_us) = written?;
            let statement_us = lap.elapsed().as_micros() as u64;
            let write = Some(EndsWrite::OneStatement { statement_us, writer_wait_us });
            let taken = Taken { tasks, runs: rows.iter().map(handed_from_row).collect(), write, ..Taken::default() };
            return Ok((recorded_as_asked(ends, &done), taken));
        }
        let mut split = move || {
            let now = std::time::Instant::now();
            now.duration_since(std::mem::replace(&mut lap, now)).as_micros() as u64
        };
        let mut tx = self.begin().await?;
        let begin_us = split();
        let done = finish_runs::<D>(&mut tx, ends, ms(now)).await?;
        notice_successes::<D>(&mut tx, &noticed_of(ends, &done)).await?;
        let ended: Vec<(&str, RunStatus)> = done.iter().map(|(id, s)| (id.as_str(), *s)).collect();
        close_steps::<D>(&mut tx, &ended, now).await?;
        let ends_us = split();
        // The lease, the take and the claim, as `claim_queued` makes them.
        let mut taken = take_and_claim::<D>(&mut tx, n, worker, now).await?;
        let claim_us = split();
        D::commit(tx).await?;
        taken.write = Some(EndsWrite::Transaction { begin_us, ends_us, claim_us, commit_us: split() });
        Ok((recorded_as_asked(ends, &done), taken))
    }

    async fn finish_and_admit(
        &self,
        ends: &[RunEnd<'_>],
        limits: LimitPass<'_>,
        n: usize,
        worker: &str,
        now: DateTime<Utc>,
    ) -> Result<(Vec<String>, Taken), StoreError> {
        if let Some(written) = self.ends_and_hand_offs_at_once(ends, limits.sizes, limits.spare, worker, ms(now)).await {
            let written = written?;
            let mut taken = Taken { runs: written.claimed.iter().map(handed_from_row).collect(), ..Taken::default() };
            taken.admitted = taken.runs.len();
            let claimed: std::collections::HashSet<&str> = taken.runs.iter().map(|h| h.run.id.as_str()).collect();
            taken.waited = written
                .taken
                .iter()
                .filter(|(id, ..)| claimed.contains(id.as_str()))
                .map(|(_, limit, since)| (limit.clone(), super::handover::waited_since(*since, now)))
                .collect();
            // What the statement did not serve, in a transaction of its own: the pools it
            // left to the admission under their locks, and claims from the queue into the
            // slots still free. The ends and the claims made are committed: a failure here is
            // not the ends' (their write is not retried, the runs claimed are started), and
            // the caller has the scheduler and the intake look instead.
            let left: Vec<crate::limits::Pool> = written.left.iter().map(|p| crate::limits::Pool::decode(p)).collect();
            let spare = limits.spare.saturating_sub(taken.admitted);
            let n = n.saturating_sub(taken.admitted);
            if !left.is_empty() || n > 0 {
                let rest = async {
                    let mut tx = self.begin().await?;
                    let mut more = Taken::default();
                    admit_left_and_claim::<D>(&mut tx, &left, LimitPass { spare, ..limits }, n, worker, now, &mut more).await?;
                    D::commit(tx).await?;
                    Ok::<_, StoreError>(more)
                };
                match rest.await {
                    Ok(more) => {
                        taken.admitted += more.admitted;
                        taken.pushed = more.pushed;
                        taken.waited.extend(more.waited);
                        taken.runs.extend(more.runs);
                        taken.tasks = more.tasks;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, pools = left.len(), "the ends are recorded; admitting the runs waiting for what they freed is left to the next look");
                        taken.unfinished = true;
                    }
                }
            }
            return Ok((recorded_as_asked(ends, &written.done), taken));
        }
        let mut tx = self.begin().await?;
        let done = finish_runs::<D>(&mut tx, ends, ms(now)).await?;
        notice_successes::<D>(&mut tx, &noticed_of(ends, &done)).await?;
        let ended: Vec<(&str, RunStatus)> = done.iter().map(|(id, s)| (id.as_str(), *s)).collect();
        close_steps::<D>(&mut tx, &ended, now).await?;
        // The slots of the runs ended go to the heads of their lines; what is left of the
        // pools freed (a head that takes other limits too) is admitted under their locks.
        let ended: Vec<&str> = ended.iter().map(|(id, _)| *id).collect();
        let off = super::handover::hand_off::<D>(&mut tx, &ended, limits.sizes, now).await?;
        let into = limits.spare.min(off.ids.len());
        // The heads first: claimed (or queued), they hold the slots they were given when the
        // admission of the pools left counts the holders (unclaimed, their rows are stale).
        let none = LimitPass { due: &[], waiters: false, freed: &[], spare: 0, ..limits };
        let heads = super::handover::hand_over_in::<D>(&mut tx, &off.ids[..into], &off.ids[into..], none, worker, now).await?;
        let mut taken =
            Taken { admitted: heads.claimed.len(), pushed: heads.pushed, waited: off.waited, runs: heads.claimed, ..Taken::default() };
        let rest = LimitPass { spare: limits.spare - into, ..limits };
        admit_left_and_claim::<D>(&mut tx, &off.left, rest, n, worker, now, &mut taken).await?;
        D::commit(tx).await?;
        Ok((recorded_as_asked(ends, &done), taken))
    }

    async fn finish(
        &self,
        id: &str,
        status: RunStatus,
        output: Option<&serde_json::Value>,
        error: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let sources: Vec<RunStatus> = RunStatus::sources(status).filter(|s| *s != RunStatus::Running).collect();
        if sources.is_empty() {
            return Ok(false);
        }
        let sql = super::dialect::numbered(
            &format!(
                "UPDATE ll_runs SET status = $2, output = $3, error = $4, finished_at = $5,
                                   next_run_id = CASE WHEN $6 THEN coalesce(next_run_id, '') ELSE next_run_id END
                 WHERE id = $1 AND status IN {}",
                status_list(sources.into_iter())
            ),
            &D::SPELLING,
        );
        let mut tx = self.begin().await?;
        let q = Stmt::built(sql, "finishing a run")
            .bind(id)
            .bind(status.as_str())
            .bind(output.map(|o| o.to_string()))
            .bind(error)
            .bind(ms(now))
            // A failure ended here has no attempt to follow: it is the run's outcome.
            .bind(matches!(status, RunStatus::Failed | RunStatus::TimedOut | RunStatus::Interrupted));
        let n = D::execute(&mut tx, q).await?;
        if n == 1 {
            close_steps::<D>(&mut tx, &[(id, status)], now).await?;
        }
        D::commit(tx).await?;
        Ok(n == 1)
    }

    async fn still_running(&self, ids: &[&str]) -> Result<Vec<String>, StoreError> {
        let q =
            Stmt::new(sql!(D, "SELECT id FROM ll_runs WHERE id {in $1} AND status = {Running} ORDER BY id"), "reading runs still running");
        Ok(D::fetch_all(&mut *self.reader().await?, q.bind_list(ids.iter().copied())).await?.iter().map(|r| r.text("id")).collect())
    }

    async fn request_cancel(&self, id: &str, why: &str) -> Result<bool, StoreError> {
        let q =
            Stmt::new(sql!(D, "UPDATE ll_runs SET cancel_requested = $2 WHERE id = $1 AND status = {Running}"), "keeping a cancel request");
        Ok(D::execute(&mut *self.writer().await?, q.bind(id).bind(why)).await? == 1)
    }

    async fn cancels_requested(&self, worker: &str) -> Result<Vec<(String, String)>, StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT id, cancel_requested FROM ll_runs WHERE worker = $1 AND status = {Running} AND cancel_requested IS NOT NULL"),
            "reading cancel requests",
        );
        Ok(D::fetch_all(&mut *self.reader().await?, q.bind(worker))
            .await?
            .iter()
            .map(|r| (r.text("id"), r.text("cancel_requested")))
            .collect())
    }

    async fn follow_up(&self, run: &Run, due_at: DateTime<Utc>, now: DateTime<Utc>) -> Result<Option<String>, StoreError> {
        let mut tx = self.begin().await?;
        let id = new_id();
        // Claims the link first: a run is followed up at most once, whichever worker asks.
        let q = Stmt::new(
            sql!(D, "UPDATE ll_runs SET next_run_id = $1 WHERE id = $2 AND next_run_id IS NULL RETURNING job_snapshot"),
            "linking a follow-up",
        );
        let Some(linked) = D::fetch_optional(&mut tx, q.bind(id.as_str()).bind(run.id.as_str())).await? else {
            D::rollback(tx).await?;
            return Ok(None);
        };
        let mut next = NewRun::follow_up(run, due_at);
        next.snapshot = linked.json("job_snapshot");
        insert_runs::<D>(&mut tx, &[(id.clone(), next, Dispatch::No)], None, now).await?;
        D::commit(tx).await?;
        Ok(Some(id))
    }

    async fn mark_no_follow_up(&self, id: &str) -> Result<(), StoreError> {
        let q =
            Stmt::new(sql!(D, "UPDATE ll_runs SET next_run_id = '' WHERE id = $1 AND next_run_id IS NULL"), "closing an interrupted run");
        D::execute(&mut *self.writer().await?, q.bind(id)).await?;
        Ok(())
    }
}
