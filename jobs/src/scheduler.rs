//! The scheduler loop: keeps each job's next tick, sleeps until the earliest one (or until told
//! that something changed), fires due ticks through the database's unique tick key, applies
//! catch-up after downtime, and hands due runs to the queue. No polling: an idle scheduler
//! sleeps until its next tick.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use lamplighter_config::{CatchUp, JobConfig, Overlap, Schedule};

use crate::engine::{JobsConfig, Shared};
use crate::run::{RunStatus, Trigger};
use crate::schedule::jitter_for;
use crate::signals::{Receiver, Signal};
use crate::store::{Claim, DUE_BATCH, NewRun};

/// A tick later than this is "missed" and follows the job's catch-up policy.
const ON_TIME: chrono::Duration = chrono::Duration::seconds(60);
/// At most this many missed ticks are looked at per job (`catch_up: all` is bounded by it).
const MAX_MISSED: usize = 1000;

struct Entry {
    schedule: Arc<Schedule>,
    /// The last tick processed (fired, skipped or caught up).
    last: Option<DateTime<Utc>>,
    /// The next tick and when it fires (tick + jitter).
    next: Option<(DateTime<Utc>, DateTime<Utc>)>,
}

#[derive(Default)]
struct Plan {
    entries: HashMap<String, Entry>,
    order: BTreeSet<(DateTime<Utc>, String)>,
}

impl Plan {
    fn set_next(&mut self, job: &str, cfg: &JobConfig, from: DateTime<Utc>) {
        let next = self.entries.get(job).and_then(|e| e.schedule.next_after(from));
        self.set_next_tick(job, cfg, next);
    }

    /// Plans `tick` (already computed) as the job's next one.
    fn set_next_tick(&mut self, job: &str, cfg: &JobConfig, tick: Option<DateTime<Utc>>) {
        let Some(e) = self.entries.get_mut(job) else {
            return;
        };
        if let Some((_, at)) = e.next.take() {
            self.order.remove(&(at, job.to_string()));
        }
        if let Some(tick) = tick {
            let at = tick + jitter(cfg, job, tick);
            e.next = Some((tick, at));
            self.order.insert((at, job.to_string()));
        }
    }
}

pub(crate) async fn run(shared: Arc<Shared>, mut signals: Receiver, stop: CancellationToken) {
    let mut plan = Plan::default();
    let mut replan = true;
    // The earliest due run or end of a wait seen by the last pass (at start: anything, since
    // waits may have ended while the worker was down).
    let mut due_seen = Some(DateTime::<Utc>::MIN_UTC);
    loop {
        if replan {
            plan = build_plan(&shared).await;
            replan = false;
        }
        let now = shared.clock().now();
        fire_due(&shared, &mut plan, now).await;
        if due_seen.is_some_and(|t| t <= now) {
            resume_waits_over(&shared, now).await;
        }
        // A backlog larger than one batch: hand over the next batch at once.
        let more = dispatch_due(&shared, now).await;
        shared.scheduler_alive(true);
        let next_tick = plan.order.first().map(|(t, _)| *t);
        due_seen = shared.store().next_due().await.ok().flatten();
        let next_due = due_seen.filter(|t| *t > now);
        let wake_at = [next_tick, next_due].into_iter().flatten().min();
        shared.pass_done(now, wake_at);
        if more {
            continue;
        }
        let sleep = match wake_at {
            Some(t) => shared.clock().sleep_until(t),
            None => Box::pin(std::future::pending()),
        };
        tokio::select! {
            () = sleep => {}
            woken = next_for_scheduler(&mut signals) => match woken {
                Some(r) => replan |= r,
                None => break,
            },
            () = stop.cancelled() => break,
        }
        // Every signal so far is covered by the next pass.
        replan |= signals.drain().iter().any(|s| for_scheduler(s) == Some(true));
    }
    shared.scheduler_alive(false);
}

/// Whether a signal concerns the scheduler: `Some(true)` when its plan must be rebuilt,
/// `Some(false)` when a pass may hand something over (a wake; a run's end frees a held
/// `overlap: queue` run). Runs it started itself, queue pushes and stops are not its business.
fn for_scheduler(s: &Signal) -> Option<bool> {
    match s {
        Signal::JobChanged | Signal::Lagged => Some(true),
        Signal::Wake | Signal::RunFinished(_) => Some(false),
        Signal::TasksPushed | Signal::RunsChanged | Signal::RunProgress(_) | Signal::CancelRequested { .. } => None,
    }
}

/// The next signal that concerns the scheduler (see [`for_scheduler`]); `None` once the
/// signals are gone.
async fn next_for_scheduler(signals: &mut Receiver) -> Option<bool> {
    loop {
        if let Some(replan) = for_scheduler(&signals.recv().await?) {
            return Some(replan);
        }
    }
}

async fn build_plan(shared: &Shared) -> Plan {
    let snapshot = shared.snapshot();
    let jobs = &snapshot.jobs;
    let states = match shared.store().job_states().await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot read job state; scheduling from now");
            HashMap::new()
        }
    };
    let now = shared.clock().now();
    let mut plan = Plan::default();
    for (name, cfg) in jobs.iter() {
        let paused = states.get(name).is_some_and(|s| s.paused);
        if !cfg.enabled || paused || snapshot.unavailable.contains_key(name) {
            continue;
        }
        let Some(schedule) = cfg.schedule.clone() else { continue };
        let last = states.get(name).and_then(|s| s.last_tick);
        plan.entries.insert(name.clone(), Entry { schedule, last, next: None });
        plan.set_next(name, cfg, last.unwrap_or(now).min(now));
    }
    plan
}

async fn fire_due(shared: &Arc<Shared>, plan: &mut Plan, now: DateTime<Utc>) {
    let began = std::time::Instant::now();
    let config = shared.snapshot();
    let jobs = &config.jobs;
    // Every tick due now, of every job, goes to the database in one transaction.
    let mut batch: Vec<(NewRun, Overlap)> = Vec::new();
    // Jobs whose last processed tick was skipped (catch-up), so no run records it.
    let mut skipped_last: Vec<(String, DateTime<Utc>)> = Vec::new();
    // Each fired job's next tick, planned once the runs are handed over (off the hot path).
    let mut next_ticks: Vec<(String, Option<DateTime<Utc>>)> = Vec::new();
    while let Some((at, job)) = plan.order.first().cloned() {
        if at > now {
            break;
        }
        plan.order.remove(&(at, job.clone()));
        let Some(cfg) = jobs.get(&job) else {
            plan.entries.remove(&job);
            continue;
        };
        let Some(entry) = plan.entries.get_mut(&job) else {
            continue;
        };
        // Every tick of this job that is due now: the planned one and any after it (after a
        // suspend or downtime there can be many).
        let mut ticks = Vec::new();
        let mut cur = entry.next.take().map(|(t, _)| t);
        while let Some(t) = cur {
            let fire_at = t + jitter(cfg, &job, t);
            if fire_at > now || ticks.len() >= MAX_MISSED {
                break;
            }
            ticks.push((t, fire_at));
            cur = entry.schedule.next_after(t);
        }
        let chosen = choose(cfg, &ticks, now);
        let missed = ticks.iter().filter(|(_, at)| now - *at > ON_TIME).count();
        if missed > 0 {
            let caught_up = chosen.iter().filter(|(_, _, tr)| *tr == Trigger::CatchUp).count();
            tracing::info!(job = %job, missed, caught_up, policy = ?cfg.catch_up, "missed ticks");
        }
        let last = ticks.last().map(|(t, _)| *t);
        if let Some(l) = last
            && chosen.last().map(|(t, _, _)| *t) != Some(l)
        {
            skipped_last.push((job.clone(), l));
        }
        // Caught-up ticks run one after another, and the on-time tick after them: under
        // `forbid` or `replace` they would otherwise skip or cancel each other at once.
        let catching_up = chosen.iter().any(|(_, _, tr)| *tr == Trigger::CatchUp);
        let tick_policy = if catching_up && cfg.overlap != Overlap::Allow { Overlap::Queue } else { cfg.overlap };
        for (t, at, trigger) in chosen {
            batch.push((new_tick_run(&config, cfg, t, at, trigger), tick_policy));
        }
        entry.last = last.or(entry.last);
        // `cur` is the first tick after the last one taken: the job's next tick.
        next_ticks.push((job, if ticks.is_empty() { entry.schedule.next_after(entry.last.unwrap_or(now)) } else { cur }));
    }
    if !batch.is_empty() {
        let planned = began.elapsed();
        let n = batch.len();
        fire_batch(shared, batch, now).await;
        tracing::debug!(ticks = n, plan_us = planned.as_micros() as u64, total_us = began.elapsed().as_micros() as u64, "ticks fired");
    }
    for (job, next) in next_ticks {
        if let Some(cfg) = jobs.get(&job) {
            plan.set_next_tick(&job, cfg, next);
        }
    }
    for (job, tick) in skipped_last {
        if let Err(e) = shared.store().set_last_tick(&job, tick).await {
            tracing::error!(job = %job, error = %e, "cannot save the last tick");
        }
    }
}

fn jitter(cfg: &JobConfig, job: &str, tick: DateTime<Utc>) -> chrono::Duration {
    chrono::Duration::from_std(cfg.jitter.map(|j| jitter_for(job, tick, j)).unwrap_or_default()).unwrap_or_default()
}

/// Which of a job's due ticks fire: on-time ones always; missed ones (more than [`ON_TIME`]
/// late) as the job's `catch_up` policy and `catch_up_window` say.
fn choose(cfg: &JobConfig, ticks: &[(DateTime<Utc>, DateTime<Utc>)], now: DateTime<Utc>) -> Vec<(DateTime<Utc>, DateTime<Utc>, Trigger)> {
    let (missed, on_time): (Vec<_>, Vec<_>) = ticks.iter().partition(|(_, at)| now - *at > ON_TIME);
    let window_start = now - chrono::Duration::from_std(cfg.catch_up_window).unwrap_or(chrono::Duration::days(1));
    let in_window: Vec<_> = missed.into_iter().filter(|(t, _)| *t >= window_start).collect();
    let caught: Vec<_> = match cfg.catch_up {
        CatchUp::Skip => Vec::new(),
        CatchUp::Latest => in_window.last().copied().into_iter().collect(),
        CatchUp::All => in_window,
    };
    caught.into_iter().map(|(t, at)| (t, at, Trigger::CatchUp)).chain(on_time.into_iter().map(|(t, at)| (t, at, Trigger::Cron))).collect()
}

fn new_tick_run(jobs: &JobsConfig, cfg: &JobConfig, tick: DateTime<Utc>, due: DateTime<Utc>, trigger: Trigger) -> NewRun {
    NewRun {
        job: cfg.name.clone(),
        trigger,
        status: RunStatus::Queued,
        scheduled_at: Some(tick),
        due_at: due,
        attempt: 1,
        input: cfg.input.clone(),
        parameters: cfg.parameters.clone(),
        error: None,
        idempotency_key: None,
        retry_of: None,
        root_id: None,
        snapshot: Some(jobs.snapshot_of(cfg)),
    }
}

async fn fire_batch(shared: &Arc<Shared>, batch: Vec<(NewRun, Overlap)>, now: DateTime<Utc>) {
    let keys: Vec<(String, DateTime<Utc>)> = batch.iter().map(|(r, _)| (r.job.clone(), r.scheduled_at.unwrap_or(r.due_at))).collect();
    // Free slots now: that many of the runs are claimed in the tick's own transaction and
    // start right after its commit.
    let tickets = shared.executors().tickets(shared.gate(), batch.len());
    let began = std::time::Instant::now();
    let claim = Claim { worker: shared.worker_name(), slots: tickets.len() };
    let outcomes = shared.store().fire_ticks(batch, claim, now).await;
    tracing::debug!(tx_us = began.elapsed().as_micros() as u64, "tick transaction");
    let outcomes = match outcomes {
        Ok(o) => o,
        Err(e) => {
            // Nothing was recorded: rebuild the plan from the stored last ticks, so these
            // ticks are fired again (or caught up) once the database answers.
            tracing::error!(ticks = keys.len(), error = %e, "cannot fire ticks; retrying in 1 s");
            drop(tickets);
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            shared.job_changed();
            return;
        }
    };
    let mut handed = Vec::new();
    let mut later = Vec::new();
    let mut pushed = false;
    for ((job, tick), outcome) in keys.into_iter().zip(outcomes) {
        let Some(o) = outcome else {
            tracing::debug!(job = %job, %tick, "tick already fired");
            continue;
        };
        handed.extend(o.handed);
        pushed |= o.pushed;
        later.push((job, tick, o.run_id, o.status, o.replaced));
    }
    // Started before anything else is looked at.
    let launched = !handed.is_empty();
    crate::executor::launch(shared, handed, tickets);
    if !launched {
        // Queued or skipped runs were created all the same.
        shared.runs_changed();
    }
    if pushed {
        shared.tasks_pushed();
    }
    for (job, tick, run_id, status, replaced) in later {
        if status != RunStatus::Skipped {
            shared.observer().tick_fired(&job, tick, &run_id);
        } else {
            shared.observer().tick_skipped(&job, tick, &run_id);
            // A skipped tick is a finished run too: a paused job's history is kept bounded.
            shared.prune_soon(&job, now);
        }
        for old in replaced {
            shared.stop_run(&old, format!("replaced by run {run_id} (overlap: replace)"), now).await;
        }
    }
}

/// Runs waiting for an approval whose timeout passed are queued again; the workflow applies the
/// step's `on_timeout` when it resumes.
async fn resume_waits_over(shared: &Arc<Shared>, now: DateTime<Utc>) {
    match shared.store().wake_waiting(now).await {
        Ok(ids) => {
            for id in &ids {
                tracing::info!(run = %id, "approval wait is over; the run resumes to apply on_timeout");
            }
        }
        Err(e) => tracing::error!(error = %e, "cannot resume runs whose approval wait is over"),
    }
}

/// Hands due queued runs over (claimed into free slots, the rest through the queue), holding
/// back runs of `overlap: queue` jobs while an earlier run of the same job is going. Returns
/// true when it stopped at its batch limit and more may be due.
pub(crate) async fn dispatch_due(shared: &Arc<Shared>, now: DateTime<Utc>) -> bool {
    let due = match shared.store().due_undispatched(now).await {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "cannot read due runs");
            return false;
        }
    };
    let more = due.len() >= DUE_BATCH;
    let jobs = shared.jobs();
    let mut held: Vec<String> = Vec::new();
    let mut ready: Vec<String> = Vec::with_capacity(due.len());
    for (id, job) in due {
        let queue_policy = jobs.get(&job).is_some_and(|j| j.overlap == Overlap::Queue);
        if queue_policy {
            if held.contains(&job) || shared.store().has_dispatched_active(&job).await.unwrap_or(false) {
                held.push(job);
                continue;
            }
            held.push(job);
        }
        ready.push(id);
    }
    if ready.is_empty() {
        return more;
    }
    let tickets = shared.executors().tickets(shared.gate(), ready.len());
    let queued = ready.split_off(tickets.len());
    match shared.store().dispatch(&ready, &queued, shared.worker_name(), now).await {
        Ok(claimed) => {
            crate::executor::launch(shared, claimed, tickets);
            if !queued.is_empty() {
                shared.tasks_pushed();
            }
        }
        Err(e) => tracing::error!(runs = ready.len() + queued.len(), error = %e, "cannot hand runs over"),
    }
    more
}
