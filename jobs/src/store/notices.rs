//! Outcomes noticed and notifications recorded, claimed and sent; the per-job health the gauges read.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::dialect::{Dialect, Record, Stmt, run_cols, run_from_row, sql};
use super::scripts::*;
use super::{AfterOf, Dispatch, Downstream, Ended, JobHealth, Noticed, RulesOf, StoreError, from_ms, ms, new_id};
use crate::decide::{
    Finality, OutcomeKind, PendingOutcome, RETRY_RECORDED_WITHIN, Streak, after_counts, fan_in, finality, notify_on_outcome,
    upstream_input, with_upstream,
};
use crate::notify::{Claimed, NewNotification, Notification, NotificationStatus, Sent};
use crate::run::Run;

#[async_trait]
pub(crate) trait Notices: Send + Sync + std::fmt::Debug {
    /// Notices the outcomes of runs that ended (at most a batch, oldest first), in one
    /// transaction (one at a time across workers): each final outcome moves its job's failure
    /// streak and last success, and records the notifications its job's rules fire
    /// ([`crate::decide::notify_on_outcome`]); a failed attempt that a retry follows is noticed
    /// as nothing. With `waits`, records the notifications of runs waiting for a decision too
    /// ([`crate::decide::notify_on_wait`]). An event's notification is recorded once, whatever
    /// happens to the pass: its key is the event's.
    ///
    /// An outcome that counts for a job that runs `after` its job is recorded for it, and a
    /// downstream job whose every upstream now has one gets its run ([`crate::decide::fan_in`]),
    /// in the same transaction: once per outcome, whatever happens to the pass.
    async fn notice(&self, rules: RulesOf<'_>, after: AfterOf<'_>, waits: bool, now: DateTime<Utc>) -> Result<Noticed, StoreError>;
    /// Claims up to `n` notifications due at `now` for `worker`, for `hold` (one left `sending`
    /// by a worker that stopped is claimed again once its hold passed). A job's notifications
    /// are claimed in the order they were recorded, one at a time: to one target, each after
    /// the one before it is delivered or given up; to another, after it was tried once.
    async fn claim_notifications(
        &self,
        worker: &str,
        n: usize,
        hold: Duration,
        now: DateTime<Utc>,
    ) -> Result<Vec<crate::notify::Claimed>, StoreError>;
    /// Records how the send of a claimed notification ended (only while `worker` holds it).
    async fn notification_sent(&self, key: &str, worker: &str, sent: &crate::notify::Sent, now: DateTime<Utc>) -> Result<(), StoreError>;
    /// Hands back the notifications a worker of this name left `sending` (it stopped mid-send:
    /// this process starts under its name, so that one is gone); they are due at once.
    async fn release_claims(&self, worker: &str, now: DateTime<Utc>) -> Result<u64, StoreError>;
    /// When the next notification that may be claimed is due (or a claim on one runs out).
    async fn next_notification(&self) -> Result<Option<DateTime<Utc>>, StoreError>;
    /// When the run that ended first of those not noticed yet ended.
    async fn unnoticed_since(&self) -> Result<Option<DateTime<Utc>>, StoreError>;
    /// The notifications about the run identity `root_id`, oldest first.
    async fn notifications(&self, root_id: &str) -> Result<Vec<crate::notify::Notification>, StoreError>;
    /// The upstream outcomes `job` has not used yet, oldest first.
    async fn pending_after(&self, job: &str) -> Result<Vec<PendingOutcome>, StoreError>;
    /// Every job's pause, streak, last success and last tick, and the starts of its oldest
    /// running run and oldest wait for a decision.
    async fn job_health(&self) -> Result<HashMap<String, JobHealth>, StoreError>;
}

#[async_trait]
impl<D: Dialect> Notices for D {
    async fn notice(&self, rules: RulesOf<'_>, after: AfterOf<'_>, waits: bool, now: DateTime<Utc>) -> Result<Noticed, StoreError> {
        let mut tx = self.begin().await?;
        // One pass at a time across workers: a streak moves in order.
        D::lock_jobs(&mut tx, &[NOTICE_LOCK]).await?;
        let q = Stmt::new(
            sql!(
                D,
                concat!(
                    "SELECT ",
                    run_cols!(),
                    " FROM ll_runs WHERE outcome_seen IS NULL AND finished_at IS NOT NULL ORDER BY finished_at, id LIMIT $1"
                )
            ),
            "reading ended runs to notice",
        );
        let runs: Vec<Run> = D::fetch_all(&mut tx, q.bind(NOTICE_BATCH as i64)).await?.iter().map(run_from_row).collect();
        let more = runs.len() == NOTICE_BATCH;
        // The names runs are stored under, which streaks and rules are kept by.
        let names: Vec<String> = runs.iter().map(|r| r.owner.to_string()).collect();
        let jobs: BTreeSet<&str> = names.iter().map(String::as_str).collect();
        let mut streaks: HashMap<String, Streak> = HashMap::new();
        let mut last_success: HashMap<String, DateTime<Utc>> = HashMap::new();
        let mut recheck_at: Option<DateTime<Utc>> = None;
        // Per job, the success noticed at its end this pass folds into the state.
        let mut folded: HashMap<String, i64> = HashMap::new();
        // The jobs whose state row this pass read (and holds: nothing changes it under the pass).
        let mut read: HashSet<String> = HashSet::new();
        if !jobs.is_empty() {
            let q = Stmt::new(
                // Locked (PostgreSQL): a write of the state meanwhile (a tick's, an earlier
                // version's success noticed at its end) lands after this pass, not under it.
                sql!(
                    D,
                    "SELECT job, consecutive_failures, streak_ends, streak_peak, last_success_at FROM ll_job_state WHERE job {in $1} ORDER BY job {lock}"
                ),
                "reading failure streaks",
            );
            for r in D::fetch_all(&mut tx, q.bind_list(jobs.iter().copied())).await? {
                read.insert(r.text("job"));
                streaks.insert(r.text("job"), streak_from_row(&r));
                if let Some(at) = r.opt_int("last_success_at") {
                    last_success.insert(r.text("job"), from_ms(at));
                }
            }
            // Successes noticed at their end since the state last counted: each ends its job's
            // streak, as if it had been noticed first, but for failures counted already that
            // ended after it ([`Streak::succeeded`]). One noticed after this read is folded by
            // the next pass (its end did not wait for this one).
            for (job, at) in successes_at_end::<D>(&mut tx, Some(&jobs)).await? {
                if last_success.get(&job).is_none_or(|known| at > *known) {
                    streaks.entry(job.clone()).or_default().succeeded(ms(at));
                    last_success.insert(job.clone(), at);
                    folded.insert(job, ms(at));
                }
            }
        }
        let mut of_job: HashMap<&str, Option<Vec<lamplighter_config::NotifyRule>>> = HashMap::new();
        let mut seen: Vec<&str> = Vec::new();
        // Per job: the last success and the last end this pass counted.
        let mut states: BTreeMap<&str, (Option<i64>, i64)> = BTreeMap::new();
        let mut new: Vec<NewNotification> = Vec::new();
        // Per upstream job, the jobs that run after it (asked once a pass); per downstream job,
        // the outcomes this pass found for it.
        let mut after_of: HashMap<&str, Vec<Downstream>> = HashMap::new();
        let mut downstream: BTreeMap<String, (Downstream, Vec<PendingOutcome>)> = BTreeMap::new();
        for (run, job) in runs.iter().zip(&names) {
            let finished = run.finished_at.unwrap_or(now);
            let kind = match finality(run.status, &run.follow_up, finished, last_success.get(job).copied(), now) {
                Finality::Undecided => {
                    // Its retry may still be recorded: looked at again then, at the latest.
                    let at = finished + RETRY_RECORDED_WITHIN;
                    recheck_at = Some(recheck_at.map_or(at, |r| r.min(at)));
                    continue;
                }
                Finality::Retried => {
                    seen.push(run.id.as_str());
                    continue;
                }
                Finality::Outcome(kind) => kind,
            };
            seen.push(run.id.as_str());
            if matches!(run.owner, crate::run::Owner::Job(_)) {
                let counting = after_of.entry(job.as_str()).or_insert_with(|| after(job));
                for d in counting.iter().filter(|d| after_counts(d.after.on, run.status, kind)) {
                    let outcome = PendingOutcome {
                        upstream: job.clone(),
                        run_id: run.id.clone(),
                        status: run.status,
                        output: run.output.clone(),
                        finished_at: finished,
                    };
                    downstream.entry(d.run.owner.to_string()).or_insert_with(|| (d.clone(), Vec::new())).1.push(outcome);
                }
            }
            let Some(rules) = of_job.entry(job.as_str()).or_insert_with(|| rules(job)) else { continue };
            let streak = streaks.entry(job.clone()).or_default();
            let fired = notify_on_outcome(kind, ms(finished), streak, rules);
            new.extend(fired.rules.into_iter().map(|(i, on)| notification(run, on, None, i, &rules[i].to, fired.failures)));
            let success = (kind == OutcomeKind::Success).then(|| ms(finished));
            if kind == OutcomeKind::Success {
                // Never back: a success folded in above may be the later one.
                let known = last_success.entry(job.clone()).or_insert(finished);
                *known = (*known).max(finished);
            }
            let state = states.entry(job.as_str()).or_insert((None, ms(finished)));
            *state = (success.or(state.0), state.1.max(ms(finished)));
        }
        if waits {
            new.extend(waiting_notifications::<D>(&mut tx, rules).await?);
        }
        let mut started = Vec::new();
        for (job, (d, found)) in downstream {
            for id in start_after::<D>(&mut tx, &job, d, found, now).await? {
                started.push((job.clone(), id));
            }
        }
        let mut recorded = 0;
        for n in &new {
            recorded += record_notification::<D>(&mut tx, n, now).await? as usize;
        }
        let no_streak = Streak::default();
        for (job, (success, last)) in &states {
            // The streak as counted here, a success noticed at its end folded in; or, for a job
            // that had no state when this pass read it, if an earlier version has since written
            // a later success there, the state's (its failures' ends unknown). A row the pass
            // read is held: the pass's count stands. The last success never moves back.
            let streak = streaks.get(*job).unwrap_or(&no_streak);
            let q = Stmt::new(
                sql!(
                    D,
                    "INSERT INTO ll_job_state (job, consecutive_failures, last_success_at, streak_ends, streak_peak) VALUES ($1, $2, $3, $5, $7)
                     ON CONFLICT (job) DO UPDATE SET
                         consecutive_failures = CASE WHEN $6 AND ll_job_state.last_success_at > $4 THEN ll_job_state.consecutive_failures ELSE $2 END,
                         streak_ends = CASE WHEN $6 AND ll_job_state.last_success_at > $4 THEN NULL ELSE $5 END,
                         streak_peak = CASE WHEN $6 AND ll_job_state.last_success_at > $4 THEN NULL ELSE $7 END,
                         last_success_at = {greatest}(coalesce(ll_job_state.last_success_at, $3), coalesce($3, ll_job_state.last_success_at))"
                ),
                "recording a job's failure streak",
            );
            let success = (*success).max(folded.get(*job).copied());
            let unread = !read.contains(*job);
            let q = q
                .bind(*job)
                .bind(i64::from(streak.count))
                .bind(success)
                .bind(*last)
                .bind(streak.stored_ends())
                .bind(unread)
                .bind(i64::from(streak.peak));
            D::execute(&mut tx, q).await?;
        }
        if !seen.is_empty() {
            let q = Stmt::new(sql!(D, "UPDATE ll_runs SET outcome_seen = 1 WHERE id {in $1}"), "marking runs noticed");
            D::execute(&mut tx, q.bind_list(seen.iter().copied())).await?;
        }
        D::commit(tx).await?;
        let seen_ids: HashSet<&str> = seen.iter().copied().collect();
        let mut prunable: BTreeMap<String, Ended> = BTreeMap::new();
        for (run, job) in runs.iter().zip(names).filter(|(r, _)| seen_ids.contains(r.id.as_str())) {
            let ended = run.finished_at.unwrap_or(now);
            let e = prunable.entry(job).or_insert(Ended { earliest: ended, runs: 0 });
            e.earliest = e.earliest.min(ended);
            e.runs += 1;
        }
        // A full batch with nothing in it to notice (failures waiting for their retries) is not
        // "more": the pass would only read it again.
        Ok(Noticed { runs: seen.len(), recorded, more: more && !seen.is_empty(), recheck_at, prunable, started })
    }

    async fn pending_after(&self, job: &str) -> Result<Vec<PendingOutcome>, StoreError> {
        pending_outcomes::<D>(&mut *self.reader().await?, job).await
    }

    async fn claim_notifications(&self, worker: &str, n: usize, hold: Duration, now: DateTime<Utc>) -> Result<Vec<Claimed>, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                format!(
                    "UPDATE ll_notifications SET status = 'sending', claimed_by = $1, attempts = attempts + 1, next_at = $2
                     WHERE key IN (SELECT key FROM ll_notifications n WHERE status IN ('pending', 'sending') AND next_at <= $3 AND {FIRST_IN_LINE}
                                   ORDER BY next_at LIMIT $4)
                       AND status IN ('pending', 'sending') AND next_at <= $3
                     RETURNING key, job, event, target, target_id, payload, attempts, created_at"
                )
            ),
            "claiming notifications",
        );
        let until = ms(now) + hold.as_millis() as i64;
        let rows = D::fetch_all(&mut *self.writer().await?, q.bind(worker).bind(until).bind(ms(now)).bind(n as i64)).await?;
        Ok(rows
            .iter()
            .map(|r| Claimed {
                key: r.text("key"),
                job: r.text("job"),
                event: r.text("event"),
                target: r.text("target"),
                target_id: r.text("target_id"),
                payload: r.json("payload").unwrap_or(serde_json::Value::Null),
                attempts: stored_u32(r.int("attempts")),
                created_at: from_ms(r.int("created_at")),
            })
            .collect())
    }

    async fn notification_sent(&self, key: &str, worker: &str, sent: &Sent, now: DateTime<Utc>) -> Result<(), StoreError> {
        let q = match sent {
            Sent::Delivered(what) => Stmt::new(
                sql!(
                    D,
                    "UPDATE ll_notifications SET status = 'delivered', delivered = $3, sent_at = $4, last_error = NULL
                     WHERE key = $1 AND claimed_by = $2 AND status = 'sending'"
                ),
                "recording a notification sent",
            )
            .bind(key)
            .bind(worker)
            .bind(what.as_str())
            .bind(ms(now)),
            Sent::Failed { error, retry_at } => Stmt::new(
                sql!(
                    D,
                    "UPDATE ll_notifications SET status = $3, last_error = $4, next_at = $5
                     WHERE key = $1 AND claimed_by = $2 AND status = 'sending'"
                ),
                "recording a notification that was not taken",
            )
            .bind(key)
            .bind(worker)
            .bind(if retry_at.is_some() { NotificationStatus::Pending } else { NotificationStatus::Abandoned }.as_str())
            .bind(error.as_str())
            .bind(ms(retry_at.unwrap_or(now))),
        };
        D::execute(&mut *self.writer().await?, q).await?;
        Ok(())
    }

    async fn release_claims(&self, worker: &str, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let q = Stmt::new(
            sql!(D, "UPDATE ll_notifications SET status = 'pending', next_at = $2 WHERE status = 'sending' AND claimed_by = $1"),
            "handing back notifications left mid-send",
        );
        D::execute(&mut *self.writer().await?, q.bind(worker).bind(ms(now))).await
    }

    async fn next_notification(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                format!("SELECT min(next_at) AS at FROM ll_notifications n WHERE status IN ('pending', 'sending') AND {FIRST_IN_LINE}")
            ),
            "reading when the next notification is due",
        );
        Ok(D::fetch_optional(&mut *self.reader().await?, q).await?.and_then(|r| r.opt_int("at")).map(from_ms))
    }

    async fn unnoticed_since(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT min(finished_at) AS at FROM ll_runs WHERE outcome_seen IS NULL AND finished_at IS NOT NULL"),
            "reading when the oldest run not noticed yet ended",
        );
        Ok(D::fetch_optional(&mut *self.reader().await?, q).await?.and_then(|r| r.opt_int("at")).map(from_ms))
    }

    async fn notifications(&self, root_id: &str) -> Result<Vec<Notification>, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                "SELECT key, event, target, status, attempts, run_id, created_at, next_at, sent_at, delivered, last_error
                 FROM ll_notifications WHERE root_id = $1 ORDER BY created_at, key"
            ),
            "reading a run's notifications",
        );
        let rows = D::fetch_all(&mut *self.reader().await?, q.bind(root_id)).await?;
        Ok(rows
            .iter()
            .map(|r| {
                let status: NotificationStatus = r.str("status").parse().unwrap_or(NotificationStatus::Pending);
                let waiting = matches!(status, NotificationStatus::Pending | NotificationStatus::Sending);
                Notification {
                    key: r.text("key"),
                    event: r.text("event"),
                    target: r.text("target"),
                    status,
                    attempts: stored_u32(r.int("attempts")),
                    run_id: r.text("run_id"),
                    created_at: from_ms(r.int("created_at")),
                    next_at: waiting.then(|| from_ms(r.int("next_at"))),
                    sent_at: r.opt_int("sent_at").map(from_ms),
                    delivered: r.opt_text("delivered"),
                    error: r.opt_text("last_error"),
                }
            })
            .collect())
    }

    async fn job_health(&self) -> Result<HashMap<String, JobHealth>, StoreError> {
        let mut c = self.reader().await?;
        let q = Stmt::new(
            sql!(D, "SELECT job, paused, consecutive_failures, streak_ends, streak_peak, last_success_at, last_tick FROM ll_job_state"),
            "reading the jobs' health",
        );
        let rows = D::fetch_all(&mut c, q).await?;
        // A success noticed at its end that the state has not folded yet ends the streak (as
        // the notice pass will fold it); only such a job's stored streak is read whole.
        let mut unfolded: HashMap<String, DateTime<Utc>> = successes_at_end::<D>(&mut c, None).await?.into_iter().collect();
        let mut out: HashMap<String, JobHealth> = HashMap::with_capacity(rows.len());
        for r in &rows {
            let job = r.text("job");
            let last_success = r.opt_int("last_success_at").map(from_ms);
            let success = unfolded.remove(&job).filter(|at| last_success.is_none_or(|known| *at > known));
            let consecutive_failures = match success {
                Some(at) => {
                    let mut streak = streak_from_row(r);
                    streak.succeeded(ms(at));
                    streak.count
                }
                None => stored_u32(r.int("consecutive_failures")),
            };
            let health = JobHealth {
                paused: r.flag("paused"),
                consecutive_failures,
                last_success: success.or(last_success),
                last_tick: r.opt_int("last_tick").map(from_ms),
                oldest_running: None,
                oldest_wait: None,
            };
            out.insert(job, health);
        }
        // Jobs with no state yet: their success ended no streak.
        for (job, at) in unfolded {
            out.insert(job, JobHealth { last_success: Some(at), ..JobHealth::default() });
        }
        let q = Stmt::new(
            sql!(D, "SELECT job, min(started_at) AS oldest FROM ll_runs WHERE status = {Running} GROUP BY job"),
            "reading the oldest running runs",
        );
        for r in D::fetch_all(&mut c, q).await? {
            out.entry(r.text("job")).or_default().oldest_running = r.opt_int("oldest").map(from_ms);
        }
        let q = Stmt::new(
            sql!(
                D,
                "SELECT r.job AS job, min(s.started_at) AS since FROM ll_steps s JOIN ll_runs r ON r.id = s.run_id
                 WHERE s.status = {step:WaitingApproval} AND r.status = {WaitingApproval} GROUP BY r.job"
            ),
            "reading the oldest waits for a decision",
        );
        for r in D::fetch_all(&mut c, q).await? {
            out.entry(r.text("job")).or_default().oldest_wait = r.opt_int("since").map(from_ms);
        }
        Ok(out)
    }
}

/// The upstream outcomes `job` has not used yet, oldest first.
async fn pending_outcomes<D: Dialect>(c: &mut D::Conn, job: &str) -> Result<Vec<PendingOutcome>, StoreError> {
    let q = Stmt::new(
        sql!(
            D,
            "SELECT upstream, run_id, status, output, finished_at FROM ll_after_outcomes
             WHERE downstream = $1 ORDER BY finished_at, run_id"
        ),
        "reading pending upstream outcomes",
    );
    Ok(D::fetch_all(c, q.bind(job))
        .await?
        .iter()
        .map(|r| PendingOutcome {
            upstream: r.text("upstream"),
            run_id: r.text("run_id"),
            status: std::str::FromStr::from_str(r.str("status")).unwrap_or(crate::run::RunStatus::Failed),
            output: r.json("output"),
            finished_at: from_ms(r.int("finished_at")),
        })
        .collect())
}

/// Decides what the upstream outcomes of `job` do now ([`fan_in`]) — those kept from earlier
/// passes and those this pass `found` — and records it in the pass's transaction: one run per
/// set (skipped, saying so, while the job is paused), the outcomes dropped told in the log, and
/// only what still waits kept (`ll_after_outcomes`). The ids of the runs started.
async fn start_after<D: Dialect>(
    tx: &mut D::Tx,
    job: &str,
    d: Downstream,
    found: Vec<PendingOutcome>,
    now: DateTime<Utc>,
) -> Result<Vec<String>, StoreError> {
    let kept = pending_outcomes::<D>(tx, job).await?;
    let kept_ids: HashSet<String> = kept.iter().map(|p| p.run_id.clone()).collect();
    let mut pending = kept;
    pending.extend(found);
    pending.sort_by(|a, b| (a.finished_at, &a.run_id).cmp(&(b.finished_at, &b.run_id)));
    let decision = fan_in(&d.after, &pending, now);
    for &i in &decision.expired {
        let p = &pending[i];
        let why = if d.after.jobs.contains(&p.upstream) {
            "the other upstream jobs had no outcome within its window"
        } else {
            "the job no longer runs after it"
        };
        tracing::warn!(job, upstream = %p.upstream, run = %p.run_id, "an upstream outcome is dropped, nothing runs for it: {why}");
    }
    let mut rows = Vec::with_capacity(decision.fire.len());
    if !decision.fire.is_empty() {
        let q = Stmt::new(sql!(D, "SELECT paused, pause_reason FROM ll_job_state WHERE job = $1"), "reading pause state");
        let paused = D::fetch_optional(tx, q.bind(job)).await?.filter(|r| r.flag("paused")).map(|r| r.opt_text("pause_reason"));
        for set in &decision.fire {
            let used: Vec<&PendingOutcome> = set.iter().map(|&i| &pending[i]).collect();
            let mut run = d.run.clone();
            run.input = Some(with_upstream(run.input.take(), upstream_input(&used)));
            if let Some(reason) = &paused {
                run.status = crate::run::RunStatus::Skipped;
                let why = reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
                run.error = Some(format!("job paused{why}: its upstream outcomes were used without running it"));
            }
            rows.push((new_id(), run, Dispatch::No));
        }
        insert_runs::<D>(tx, &rows, None, now).await?;
    }
    // Used or dropped, an outcome is gone (it is noticed once): deleted if kept, not kept if new.
    let gone: HashSet<usize> = decision.fire.iter().flatten().chain(&decision.expired).copied().collect();
    let forgotten: Vec<&str> = gone.iter().map(|&i| pending[i].run_id.as_str()).filter(|id| kept_ids.contains(*id)).collect();
    if !forgotten.is_empty() {
        let q = Stmt::new(sql!(D, "DELETE FROM ll_after_outcomes WHERE downstream = $1 AND run_id {in $2}"), "using upstream outcomes");
        D::execute(tx, q.bind(job).bind_list(forgotten.iter().copied())).await?;
    }
    let waiting = pending.iter().enumerate().filter(|(i, p)| !gone.contains(i) && !kept_ids.contains(&p.run_id)).map(|(_, p)| p);
    for p in waiting {
        let q = Stmt::new(
            sql!(
                D,
                "INSERT INTO ll_after_outcomes (downstream, upstream, run_id, status, output, finished_at)
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (downstream, run_id) DO NOTHING"
            ),
            "keeping an upstream outcome",
        );
        let output = p.output.as_ref().map(|o| o.to_string());
        let q = q.bind(job).bind(p.upstream.as_str()).bind(p.run_id.as_str()).bind(p.status.as_str()).bind(output);
        D::execute(tx, q.bind(ms(p.finished_at))).await?;
    }
    let skipped = rows.first().is_some_and(|(_, run, _)| run.status == crate::run::RunStatus::Skipped);
    Ok(if skipped { Vec::new() } else { rows.into_iter().map(|(id, _, _)| id).collect() })
}

/// The latest success noticed at its end of each job (of `jobs`, or of every job), over the
/// workers' rows ([`super::scripts::noticed_at_end`]).
async fn successes_at_end<D: Dialect>(c: &mut D::Conn, jobs: Option<&BTreeSet<&str>>) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
    let rows = match jobs {
        Some(jobs) => {
            let q = Stmt::new(
                sql!(D, "SELECT job, max(at) AS at FROM ll_job_successes WHERE job {in $1} GROUP BY job"),
                "reading the successes noticed at their end",
            );
            D::fetch_all(c, q.bind_list(jobs.iter().copied())).await?
        }
        None => {
            let q = Stmt::new(
                sql!(D, "SELECT job, max(at) AS at FROM ll_job_successes GROUP BY job"),
                "reading the successes noticed at their end",
            );
            D::fetch_all(c, q).await?
        }
    };
    Ok(rows.iter().map(|r| (r.text("job"), from_ms(r.int("at")))).collect())
}

/// A job's failure streak as `ll_job_state` keeps it.
fn streak_from_row(r: &impl Record) -> Streak {
    Streak::from_stored(
        stored_u32(r.int("consecutive_failures")),
        r.opt_text("streak_ends").as_deref(),
        r.opt_int("streak_peak").map(stored_u32),
    )
}

/// A stored count (failures, attempts), within `u32`.
fn stored_u32(n: i64) -> u32 {
    n.clamp(0, i64::from(u32::MAX)) as u32
}
