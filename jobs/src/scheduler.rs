//! The scheduler loop: keeps each job's next tick, sleeps until the earliest one (or until told
//! that something changed), fires due ticks through the database's unique tick key, applies
//! catch-up after downtime, and hands due runs to the queue. No polling: an idle scheduler
//! sleeps until its next tick.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use lamplighter_config::{CatchUp, JobConfig, Overlap};

use crate::engine::Shared;
use crate::run::{RunStatus, Trigger};
use crate::schedule::{Schedule, jitter_for};
use crate::store::{NewRun, TickPolicy};

/// A tick later than this is "missed" and follows the job's catch-up policy.
const ON_TIME: chrono::Duration = chrono::Duration::seconds(60);
/// At most this many missed ticks are looked at per job (`catch_up: all` is bounded by it).
const MAX_MISSED: usize = 1000;

struct Entry {
    schedule: Schedule,
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
        let Some(e) = self.entries.get_mut(job) else {
            return;
        };
        if let Some((_, at)) = e.next.take() {
            self.order.remove(&(at, job.to_string()));
        }
        if let Some(tick) = e.schedule.next_after(from) {
            let at =
                tick + chrono::Duration::from_std(cfg.jitter.map(|j| jitter_for(job, tick, j)).unwrap_or_default()).unwrap_or_default();
            e.next = Some((tick, at));
            self.order.insert((at, job.to_string()));
        }
    }
}

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut plan = Plan::default();
    shared.replan.store(true, Ordering::SeqCst);
    loop {
        if shared.replan.swap(false, Ordering::SeqCst) {
            plan = build_plan(&shared).await;
        }
        let now = shared.clock.now();
        fire_due(&shared, &mut plan, now).await;
        dispatch_due(&shared, now).await;
        shared.scheduler_alive.store(true, Ordering::SeqCst);

        let next_tick = plan.order.first().map(|(t, _)| *t);
        let next_due = shared.store.next_due().await.ok().flatten().filter(|t| *t > now);
        let wake_at = [next_tick, next_due].into_iter().flatten().min();
        let sleep = match wake_at {
            Some(t) => shared.clock.sleep_until(t),
            None => Box::pin(std::future::pending()),
        };
        tokio::select! {
            _ = sleep => {}
            _ = shared.wake.notified() => {}
            _ = stop.cancelled() => break,
        }
    }
    shared.scheduler_alive.store(false, Ordering::SeqCst);
}

async fn build_plan(shared: &Shared) -> Plan {
    let jobs = shared.jobs();
    let states = match shared.store.job_states().await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot read job state; scheduling from now");
            HashMap::new()
        }
    };
    let now = shared.clock.now();
    let mut plan = Plan::default();
    for (name, cfg) in jobs.iter() {
        let paused = states.get(name).is_some_and(|s| s.paused);
        if !cfg.enabled || paused {
            continue;
        }
        let Some(spec) = &cfg.schedule else { continue };
        let schedule = match Schedule::from_spec(spec, &cfg.timezone) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(job = %name, error = %e, "job not scheduled");
                continue;
            }
        };
        let last = states.get(name).and_then(|s| s.last_tick);
        plan.entries.insert(name.clone(), Entry { schedule, last, next: None });
        plan.set_next(name, cfg, last.unwrap_or(now).min(now));
        if last.is_none() {
            plan.set_next(name, cfg, now);
        }
    }
    plan
}

async fn fire_due(shared: &Shared, plan: &mut Plan, now: DateTime<Utc>) {
    let jobs = shared.jobs();
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
            let fire_at =
                t + chrono::Duration::from_std(cfg.jitter.map(|j| jitter_for(&job, t, j)).unwrap_or_default()).unwrap_or_default();
            if fire_at > now || ticks.len() >= MAX_MISSED {
                break;
            }
            ticks.push((t, fire_at));
            cur = entry.schedule.next_after(t);
        }
        let (missed, on_time): (Vec<_>, Vec<_>) = ticks.iter().partition(|(_, at)| now - *at > ON_TIME);
        let window_start = now - chrono::Duration::from_std(cfg.catch_up_window).unwrap_or(chrono::Duration::days(1));
        let in_window: Vec<_> = missed.iter().filter(|(t, _)| *t >= window_start).collect();
        let chosen: Vec<&(DateTime<Utc>, DateTime<Utc>)> = match cfg.catch_up {
            CatchUp::Skip => Vec::new(),
            CatchUp::Latest => in_window.last().copied().into_iter().collect(),
            CatchUp::All => in_window,
        };
        if !missed.is_empty() {
            tracing::info!(job = %job, missed = missed.len(), caught_up = chosen.len(), policy = ?cfg.catch_up, "missed ticks");
        }
        for (t, at) in chosen {
            fire(shared, cfg, *t, *at, Trigger::CatchUp, now).await;
        }
        for (t, at) in on_time {
            fire(shared, cfg, t, at, Trigger::Cron, now).await;
        }
        let last = ticks.last().map(|(t, _)| *t);
        if let Some(l) = last
            && let Err(e) = shared.store.set_last_tick(&job, l).await
        {
            tracing::error!(job = %job, error = %e, "cannot save the last tick");
        }
        let entry = plan.entries.get_mut(&job).expect("entry exists");
        entry.last = last.or(entry.last);
        let from = entry.last.unwrap_or(now);
        plan.set_next(&job, cfg, from);
    }
}

/// Catch-up when the scheduler starts: ticks between the last processed tick and now.
async fn fire(shared: &Shared, cfg: &JobConfig, tick: DateTime<Utc>, due: DateTime<Utc>, trigger: Trigger, now: DateTime<Utc>) {
    let policy = match cfg.overlap {
        Overlap::Forbid => TickPolicy::Forbid,
        Overlap::Allow => TickPolicy::Allow,
        Overlap::Replace => TickPolicy::Replace,
        Overlap::Queue => TickPolicy::Queue,
    };
    let run = NewRun {
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
    };
    match shared.store.fire_tick(run, policy, now).await {
        Ok(None) => tracing::debug!(job = %cfg.name, %tick, "tick already fired"),
        Ok(Some(o)) => {
            if o.status == RunStatus::Skipped {
                tracing::info!(job = %cfg.name, %tick, run = %o.run_id, "tick skipped");
            }
            for old in o.replaced {
                shared.stop_run(&old, format!("replaced by run {} (overlap: replace)", o.run_id), now).await;
            }
        }
        Err(e) => tracing::error!(job = %cfg.name, %tick, error = %e, "cannot fire tick"),
    }
}

/// Hands due queued runs to the queue, holding back runs of `overlap: queue` jobs while an
/// earlier run of the same job is going.
pub(crate) async fn dispatch_due(shared: &Shared, now: DateTime<Utc>) {
    let due = match shared.store.due_undispatched(now).await {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "cannot read due runs");
            return;
        }
    };
    let jobs = shared.jobs();
    let mut held: Vec<String> = Vec::new();
    for (id, job) in due {
        let queue_policy = jobs.get(&job).is_some_and(|j| j.overlap == Overlap::Queue);
        if queue_policy {
            if held.contains(&job) || shared.store.has_dispatched_active(&job).await.unwrap_or(false) {
                held.push(job);
                continue;
            }
            held.push(job);
        }
        if let Err(e) = shared.push(&id, now).await {
            tracing::error!(run = %id, error = %e, "cannot hand run to the queue");
        }
    }
}
