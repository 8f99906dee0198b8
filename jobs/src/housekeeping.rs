//! The engine's background upkeep, off the run path: retention (pruning run history), the
//! runtime jobs kept in force as the store has them, and the gauges read from the database.
//! Each task is handed only what it uses.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::events::{JobTable, Observer};
use crate::in_force::{InForce, JobsConfig};
use crate::retention::{PruneQueue, prune_after};
use crate::scheduler::Scheduler;
use crate::signals::{Signal, Signals};
use crate::store::{Definitions, Listings, Notices, Retain, StoreError, Upkeep};

/// Pruning waits when a tick is this close, and until this long after it.
const PRUNE_CLEARANCE_MS: i64 = 250;

/// How many jobs' retention one transaction applies: a few milliseconds of the write lock
/// (well inside the clearance kept before a tick), and a commit per chunk rather than per
/// statement.
const PRUNE_CHUNK: usize = 64;

/// How often the gauges read from the database are sampled.
const GAUGES_SAMPLED_EVERY: Duration = Duration::from_secs(5);

/// What retention is handed.
pub(crate) struct Pruner {
    pub(crate) upkeep: Arc<dyn Upkeep>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) signals: Arc<dyn Signals>,
    pub(crate) config: Arc<InForce>,
    pub(crate) retention: Arc<PruneQueue>,
    /// When the next tick is due (background writes keep clear of it).
    pub(crate) scheduler: Arc<Scheduler>,
}

impl Pruner {
    /// Applies retention off the run path: woken when the notifier has noticed runs' outcomes
    /// (only a noticed run may be pruned), then waits [`crate::retention::PRUNE_EVERY`] from
    /// the first of them's end so one pass covers every run that finished meanwhile, and prunes
    /// the jobs that gathered enough runs (or waited long enough). No timer while nothing waits;
    /// a stop prunes whatever waits (the queue is only in memory).
    pub(crate) async fn run(self, stop: CancellationToken) {
        loop {
            // Due after the batch's first request (not after this wake: a clock that moved on
            // meanwhile must not push the batch further out).
            let Some(due) = self.retention.next_due() else {
                tokio::select! {
                    () = self.retention.requested() => continue,
                    () = stop.cancelled() => break,
                }
            };
            tokio::select! {
                () = self.clock.sleep_until(due) => self.prune_now(false).await,
                // A new batch may be due sooner than the runs left waiting.
                () = self.retention.requested() => {}
                () = stop.cancelled() => {
                    self.prune_now(true).await;
                    break;
                }
            }
        }
    }

    /// Background writes wait while a tick is about to fire (they would hold SQLite's write
    /// lock while the tick's runs are claimed).
    async fn clear_of_ticks(&self) {
        let until_tick = self.scheduler.next_wake_ms().saturating_sub(self.clock.now().timestamp_millis());
        if (0..PRUNE_CLEARANCE_MS).contains(&until_tick) {
            let now = self.clock.now();
            self.clock.sleep_until(now + chrono::Duration::milliseconds(until_tick + PRUNE_CLEARANCE_MS)).await;
        }
    }

    /// Applies retention to the jobs due ([`PruneQueue::take_due`]; `all`: every job waiting),
    /// [`PRUNE_CHUNK`] jobs a transaction, then tidies the database. Nothing due, nothing done.
    async fn prune_now(&self, all: bool) {
        let jobs = self.config.jobs();
        let now = self.clock.now();
        // A job no longer in force is dropped from the queue with nothing to prune.
        let due = self
            .retention
            .take_due(now, |name, waiting| all || jobs.get(name).is_none_or(|job| waiting.runs >= prune_after(job.retention.max_runs)));
        if due.is_empty() {
            return;
        }
        let retain: Vec<Retain<'_>> = due
            .iter()
            .filter_map(|name| {
                let job = jobs.get(name)?;
                Some(Retain { job: name, keep: job.retention.max_runs, max_age: job.retention.max_age })
            })
            .collect();
        for chunk in retain.chunks(PRUNE_CHUNK) {
            self.clear_of_ticks().await;
            if let Err(e) = self.upkeep.prune(chunk, now).await {
                let (first, last) = (chunk[0].job, chunk[chunk.len() - 1].job);
                tracing::warn!(jobs = chunk.len(), first, last, error = %e, "cannot prune run history (it is tried again within a minute)");
                for r in chunk {
                    self.retention.prune_soon(r.job, now, 0);
                }
            }
        }
        self.clear_of_ticks().await;
        if let Err(e) = self.upkeep.housekeeping().await {
            tracing::warn!(error = %e, "cannot tidy the database");
        }
        self.signals.publish(Signal::RunsChanged);
    }
}

/// What keeps the runtime jobs in force is handed.
pub(crate) struct DefinitionFollower {
    pub(crate) definitions: Arc<dyn Definitions>,
    pub(crate) signals: Arc<dyn Signals>,
    pub(crate) config: Arc<InForce>,
}

impl DefinitionFollower {
    /// Keeps the runtime jobs in force as the store has them: one job read again when a worker
    /// says it changed, all of them when signals may have been missed.
    pub(crate) async fn run(self, mut signals: crate::signals::Receiver, stop: CancellationToken) {
        // After a failed read, everything is read again (a second later, and again until it
        // works): a change must not stay unheard because the database was briefly away.
        let mut behind = false;
        loop {
            let signal = if behind {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(1)) => Some(Signal::Lagged),
                    s = signals.recv() => s,
                }
            } else {
                tokio::select! {
                    () = stop.cancelled() => return,
                    s = signals.recv() => s,
                }
            };
            let result = match signal {
                None => return,
                Some(Signal::DefinitionChanged(_) | Signal::Lagged) if behind => self.refresh_jobs().await,
                Some(Signal::DefinitionChanged(name)) => self.refresh_job(&name).await,
                Some(Signal::Lagged) => self.refresh_jobs().await,
                Some(_) => continue,
            };
            behind = match result {
                Ok(()) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the runtime jobs again; retrying");
                    true
                }
            };
        }
    }

    /// Reads a runtime job again (it was saved or deleted, here or by another worker) and
    /// swaps in the config with it; the scheduler replans.
    async fn refresh_job(&self, name: &str) -> Result<(), StoreError> {
        let stored = self.definitions.runtime_job(name).await?;
        // Already in force (this worker saved it): nothing to replan.
        if let Some(changed) = self.config.set_runtime_job(name, stored) {
            self.signals.publish(Signal::jobs_changed(changed));
        }
        Ok(())
    }

    /// Reads every runtime job again (a signal may have been missed).
    async fn refresh_jobs(&self) -> Result<(), StoreError> {
        let jobs = self.definitions.runtime_jobs().await?;
        if self.config.set_runtime(jobs) {
            self.signals.publish(Signal::JobChanged);
        }
        Ok(())
    }
}

/// What samples the gauges read from the database is handed.
pub(crate) struct GaugeSampler {
    pub(crate) listings: Arc<dyn Listings>,
    pub(crate) notices: Arc<dyn Notices>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) observer: Arc<Observer>,
    pub(crate) config: Arc<InForce>,
    /// On a shared database, where lapsed leases of other workers are read from.
    pub(crate) leases: Option<Arc<dyn crate::store::Leases>>,
    /// Where those are told for `/readyz`.
    pub(crate) health: Arc<crate::health::Health>,
    /// This worker's name (its own lease is not another's).
    pub(crate) worker: String,
}

/// How far back a worker whose lease ran out is reported (`/readyz`, the gauge).
const LAPSED_SHOWN: Duration = Duration::from_secs(3600);

/// What `/readyz` says of a worker whose lease lapsed.
fn lapsed_note(w: &crate::store::WorkerLease, now: DateTime<Utc>) -> String {
    format!(
        "worker \"{}\" (host {}, pid {}) has not renewed its lease since {} (it ran out {} s ago): it crashed or lost the database; its runs are taken over by the live workers",
        w.name,
        w.host,
        w.pid,
        w.heartbeat_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        (now - w.lease_until).num_seconds().max(0)
    )
}

impl GaugeSampler {
    /// Samples what the gauges read from the database: the number of queued runs (all
    /// workers), and the per-job gauges while they are on.
    pub(crate) async fn run(self, stop: CancellationToken) {
        loop {
            match self.listings.queue_depth().await {
                Ok(n) => self.observer.set_queue_depth(n),
                Err(e) => tracing::debug!(error = %e, "cannot count queued runs"),
            }
            let sizes = self.config.get().limits.clone();
            if !sizes.is_empty() {
                match self.listings.pools().await {
                    Ok(pools) => {
                        let mut values: BTreeMap<String, (u64, u64)> = sizes.keys().map(|k| (k.clone(), (0, 0))).collect();
                        for p in pools {
                            let v = values.entry(p.pool.name).or_default();
                            v.0 += p.holders.len() as u64;
                            v.1 += p.waiting_count as u64;
                        }
                        self.observer.set_limit_gauges(values);
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot read the limits' slots"),
                }
            }
            if let Some(leases) = &self.leases {
                let now = self.clock.now();
                match leases.lapsed(LAPSED_SHOWN, now).await {
                    Ok(gone) => {
                        let gone: Vec<_> = gone.into_iter().filter(|w| w.name != self.worker).collect();
                        self.observer.set_lapsed_workers(gone.len());
                        self.health.set_notes(gone.iter().map(|w| lapsed_note(w, now)).collect());
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot read lapsed leases"),
                }
            }
            if self.observer.per_job() {
                match self.notices.job_health().await {
                    Ok(health) => {
                        // Every job's next fire time, computed again: a quarter of a second at a
                        // million jobs, so off the runtime's threads, which fire the ticks.
                        let (config, now, observer) = (self.config.get(), self.clock.now(), self.observer.clone());
                        let made = tokio::task::spawn_blocking(move || {
                            let names = observer.job_gauge_names();
                            observer.set_job_gauges(job_gauges(&config, health, now, names));
                        });
                        if let Err(e) = made.await {
                            tracing::warn!(error = %e, "cannot compute the per-job gauges");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot read the jobs' health"),
                }
            }
            tokio::select! {
                () = tokio::time::sleep(GAUGES_SAMPLED_EVERY) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

/// The per-job gauges of the jobs in force, from what the database says of them. The next fire
/// time is the schedule's next after the last tick processed (after `now` for a job that has
/// none yet); a paused or disabled job has none. The last reading's names (`last`) are kept
/// while they are the jobs' own, compared rather than copied again. The jobs come in name
/// order, and so are the few with a stored health walked beside them, not looked up a job at
/// a time (a million hashes of names).
fn job_gauges(
    config: &JobsConfig,
    health: HashMap<String, crate::store::JobHealth>,
    now: DateTime<Utc>,
    last: Option<Arc<Vec<String>>>,
) -> JobTable {
    let same = last.filter(|names| names.len() == config.jobs.len() && names.iter().eq(config.jobs.keys()));
    let names = same.unwrap_or_else(|| Arc::new(config.jobs.keys().cloned().collect()));
    let mut gauges = Vec::with_capacity(config.jobs.len());
    let mut health: Vec<_> = health.into_iter().collect();
    health.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut health = health.into_iter().peekable();
    for (name, job) in config.jobs.iter() {
        // Past the stored health of jobs no longer in force, to this job's own if it has one.
        while health.next_if(|(n, _)| n < name).is_some() {}
        let h = health.next_if(|(n, _)| n == name).map(|(_, h)| h).unwrap_or_default();
        let next_fire = match &job.schedule {
            Some(s) if job.enabled && !h.paused => s.next_after(h.last_tick.unwrap_or(now)),
            _ => None,
        };
        gauges.push(crate::events::JobGauge {
            last_success: h.last_success,
            next_fire,
            consecutive_failures: h.consecutive_failures,
            oldest_running: h.oldest_running,
            oldest_approval: h.oldest_wait,
        });
    }
    JobTable::new(names, gauges)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jobs `names` (each on 1 January), as the config in force has them.
    fn jobs(dir: &std::path::Path, names: &[&str]) -> JobsConfig {
        let job = "      cron: \"0 0 1 1 *\"\n      type: plugin\n      plugin: file-save\n      action: save\n";
        let yaml: String = names.iter().map(|n| format!("    {n}:\n{job}")).collect();
        std::fs::write(dir.join("lamplighter.yaml"), format!("scheduling:\n  jobs:\n{yaml}")).expect("write");
        let opts =
            lamplighter_config::LoadOptions { path: Some(dir.join("lamplighter.yaml")), cwd: Some(dir.into()), ..Default::default() };
        let config = lamplighter_config::load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}")).config;
        JobsConfig::of(&config, &lamplighter_plugins::Registry::builtin())
    }

    /// The gauges keep the last reading's names while the jobs in force are the same ones, and
    /// take the jobs' own once they change; each job's values are its own either way (job `c`
    /// paused: no next fire).
    #[test]
    fn the_gauges_keep_the_names_while_the_jobs_are_the_same() {
        let dir = tempfile::tempdir().expect("tempdir");
        let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).expect("instant");
        // Job `c` paused, and the health of two jobs no longer in force, one between the others.
        let paused = || {
            let gone = crate::store::JobHealth { paused: true, ..Default::default() };
            HashMap::from([("c".to_string(), gone.clone()), ("0-gone".to_string(), gone.clone()), ("bb-gone".to_string(), gone)])
        };
        let next_fires = |t: &JobTable| t.iter().map(|(job, g)| (job.to_string(), g.next_fire.is_some())).collect::<Vec<_>>();
        let abc = jobs(dir.path(), &["a", "b", "c"]);
        let first = job_gauges(&abc, paused(), now, None);
        let again = job_gauges(&abc, paused(), now, Some(first.names().clone()));
        assert!(Arc::ptr_eq(first.names(), again.names()), "the same jobs: the same names");
        assert_eq!(next_fires(&again), [("a".into(), true), ("b".into(), true), ("c".into(), false)]);
        for (names, want) in [
            (&["a", "c", "d"][..], vec![("a".to_string(), true), ("c".into(), false), ("d".into(), true)]),
            (&["a", "b"][..], vec![("a".into(), true), ("b".into(), true)]),
        ] {
            let changed = job_gauges(&jobs(dir.path(), names), paused(), now, Some(again.names().clone()));
            assert!(!Arc::ptr_eq(changed.names(), again.names()));
            assert_eq!(next_fires(&changed), want);
        }
    }
}
