//! The engine composes the run core: it opens storage, hands the executor, the scheduler, the
//! lease keeper, the housekeepers and the job service their handles, starts their tasks, and
//! does what is the whole worker's — start, reload, readiness, drain. Nothing it composes
//! imports it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use lamplighter_config::Config;
use lamplighter_plugins::Registry;

use crate::clock::{Clock, ServerClock};
use crate::context::Targets;
use crate::decide::StopReason;
use crate::events::Observer;
use crate::executor::{self, Executor, ExecutorEnv};
use crate::health::Health;
use crate::housekeeping::{DefinitionFollower, GaugeSampler, Pruner};
use crate::in_force::{InForce, JobsConfig};
use crate::lease::LeaseKeeper;
use crate::retention::PruneQueue;
use crate::scheduler::{Scheduler, SchedulerEnv};
use crate::service::{JobService, WorkerFacts};
use crate::signals::{Signal, Signals};
use crate::store::{Backend, OpenError, StoreError, Upkeep, WorkerId};

/// Engine start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Locked(String),
}

/// A running engine: it composed the run core and owns its tasks; [`Engine::service`] is what a
/// person or a client asks of it. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    service: JobService,
    upkeep: Arc<dyn Upkeep>,
    clock: Arc<dyn Clock>,
    signals: Arc<dyn Signals>,
    observer: Arc<Observer>,
    config: Arc<InForce>,
    executor: Arc<Executor>,
    scheduler: Arc<Scheduler>,
    lease: Arc<LeaseKeeper>,
    /// Faults that make the worker not ready until they heal.
    health: Arc<Health>,
    tasks: Arc<Mutex<Option<Tasks>>>,
    /// SQLite: the lock that makes this the database's one worker.
    _lock: Option<Arc<std::fs::File>>,
}

struct Tasks {
    /// The scheduler and the housekeepers.
    stop_scheduler: CancellationToken,
    /// The queue worker, the recorder, the canceller, the lease keeper and the signal
    /// listener: after the drain.
    stop_runs: CancellationToken,
    scheduler: tokio::task::JoinHandle<()>,
    housekeeper: tokio::task::JoinHandle<()>,
    runs: Vec<tokio::task::JoinHandle<()>>,
}

/// How to start the engine.
pub struct EngineOptions {
    pub worker_name: String,
    pub clock: Arc<dyn Clock>,
    /// What runs execute ([`crate::BuiltinTargets`] in the worker).
    pub targets: Arc<dyn Targets>,
    /// Where events go ([`Observer::none`] when nothing looks).
    pub observer: Arc<Observer>,
    /// The plugins loaded, for the catalog listings (the targets hold their own).
    pub registry: Arc<Registry>,
}

/// Applies migrations without starting anything (`lamplighter migrate`); returns where (the
/// SQLite file, or the PostgreSQL URL without its password).
/// Copies the live SQLite database to `to` (see `lamplighter backup`); the copy's size in bytes.
pub async fn backup(config: &Config, to: &std::path::Path) -> Result<u64, crate::store::BackupError> {
    crate::store::backup(&config.storage, to).await
}

pub async fn migrate(config: &Config) -> Result<String, EngineError> {
    Ok(crate::store::migrate(&config.storage).await?)
}

impl From<OpenError> for EngineError {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Store(e) => Self::Store(e),
            OpenError::Locked(why) => Self::Locked(why),
        }
    }
}

/// This process's identity for its lease.
fn worker_id(name: String) -> WorkerId {
    let host = std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()).filter(|h| !h.is_empty());
    WorkerId { name, instance: uuid::Uuid::new_v4().to_string(), host: host.unwrap_or_else(|| "localhost".into()), pid: std::process::id() }
}

impl Engine {
    /// Opens storage, applies migrations, recovers runs of a worker that died, and starts the
    /// scheduler and the queue worker.
    pub async fn start(config: &Config, opts: EngineOptions) -> Result<Engine, EngineError> {
        let stop_scheduler = CancellationToken::new();
        let stop_runs = CancellationToken::new();
        let Backend { store, signals, lock, kind: storage } = crate::store::open(&config.storage, &opts.worker_name, &stop_runs).await?;
        // On a shared database the worker keeps the server's time (leases are measured on it,
        // and every worker must agree when a tick is due).
        let server_clock = (storage.takes_over_from_others() && opts.clock.is_system()).then(|| Arc::new(ServerClock::new()));
        let clock: Arc<dyn Clock> = match &server_clock {
            Some(c) => c.clone(),
            None => opts.clock.clone(),
        };
        let worker = worker_id(opts.worker_name.clone());
        // The lease first: from here on no other worker takes this one's runs.
        let renewed = std::time::Instant::now();
        let first_lease = store.heartbeat(&worker, config.worker.lease, true, clock.now()).await?;
        let now = clock.now();
        opts.observer.configure(config);
        let in_force = Arc::new(InForce::new(JobsConfig::of(config, &opts.registry), opts.registry.clone()));
        // Subscribed before the runtime jobs are read: a change committed elsewhere from here on
        // is heard of, and read again.
        let definition_signals = signals.subscribe();
        // The runtime jobs before the first pass: they are scheduled like the files' jobs.
        let _ = in_force.set_runtime(store.runtime_jobs().await?);
        let retention = Arc::new(PruneQueue::default());
        let health = Arc::new(Health::default());
        let (executor, recorder_rx) = Executor::new(
            config.worker.concurrency,
            ExecutorEnv {
                ends: store.clone(),
                records: store.clone(),
                clock: clock.clone(),
                targets: opts.targets,
                observer: opts.observer.clone(),
                signals: signals.clone(),
                config: in_force.clone(),
                worker: opts.worker_name.clone(),
                health: health.clone(),
                retention: retention.clone(),
            },
        );
        // Every job until the first reading of the group (a shared database) says otherwise.
        let (share, shares) = tokio::sync::watch::channel(crate::share::Share::everything());
        let notifier_share = shares.clone();
        let scheduler = Scheduler::new(SchedulerEnv {
            ticks: store.clone(),
            states: store.clone(),
            handover: store.clone(),
            missed: store.clone(),
            clock: clock.clone(),
            observer: opts.observer.clone(),
            signals: signals.clone(),
            config: in_force.clone(),
            executor: executor.clone(),
            retention: retention.clone(),
            worker: opts.worker_name.clone(),
            health: health.clone(),
            share: shares,
            takeover_within: chrono::Duration::from_std(config.worker.lease * 3 / 2).unwrap_or(chrono::Duration::days(1)),
        });
        let lease = Arc::new(LeaseKeeper {
            leases: store.clone(),
            clock: clock.clone(),
            server_clock,
            signals: signals.clone(),
            observer: opts.observer.clone(),
            config: in_force.clone(),
            executor: executor.clone(),
            health: health.clone(),
            worker: worker.clone(),
            lease: config.worker.lease,
            storage,
            share,
            scheduling: std::sync::atomic::AtomicBool::new(true),
            shares: tokio::sync::Mutex::new(Default::default()),
        });
        if let Some(first) = first_lease {
            lease.server_time(renewed, first.server_now);
        }
        lease.recover(now, true).await?;
        // Subscribed before joining, so that a change made from here on is read again.
        let lease_signals = signals.subscribe();
        // Join the group that shares the schedule before the first pass, so that this worker
        // plans only its share from the start (the others go on firing it until they read
        // the join; the tick's key lets one win).
        if let Err(e) = lease.divide(true).await {
            tracing::warn!(error = %e, "cannot read the worker's share of the schedule; it plans every job until it can");
        }
        let service = JobService {
            records: store.clone(),
            listings: store.clone(),
            states: store.clone(),
            definitions: store.clone(),
            notices: store.clone(),
            deadlines: store.clone(),
            missed: store.clone(),
            ticks: store.clone(),
            leases: store.clone(),
            clock: clock.clone(),
            signals: signals.clone(),
            observer: opts.observer.clone(),
            config: in_force.clone(),
            executor: executor.clone(),
            scheduler: scheduler.clone(),
            worker: WorkerFacts { name: worker.name.clone(), storage, started_at: now },
        };
        // Subscribed before any task runs, so no signal sent from here on is missed.
        let queue_signals = signals.subscribe();
        let cancel_signals = signals.subscribe();
        let scheduler_signals = signals.subscribe();
        let notifier_signals = signals.subscribe();
        let notifier = crate::notifier::NotifierEnv {
            notices: store.clone(),
            records: store.clone(),
            clock: clock.clone(),
            signals: signals.clone(),
            config: in_force.clone(),
            observer: opts.observer.clone(),
            retention: retention.clone(),
            worker: worker.name.clone(),
            share: notifier_share,
            draining: stop_scheduler.clone(),
            // A killed noticer's role moves within about 1½ L; past twice that, it is stuck.
            stale_after: chrono::Duration::from_std(config.worker.lease * 2).unwrap_or(chrono::Duration::days(1)),
        };
        let gauges = GaugeSampler {
            listings: store.clone(),
            notices: store.clone(),
            clock: clock.clone(),
            observer: opts.observer.clone(),
            config: in_force.clone(),
            leases: storage.takes_over_from_others().then(|| store.clone() as Arc<dyn crate::store::Leases>),
            health: health.clone(),
            worker: worker.name.clone(),
        };
        let pruner = Pruner {
            upkeep: store.clone(),
            clock: clock.clone(),
            signals: signals.clone(),
            config: in_force.clone(),
            retention,
            scheduler: scheduler.clone(),
        };
        let deadlines = crate::deadline::WatcherEnv {
            deadlines: store.clone(),
            clock: clock.clone(),
            config: in_force.clone(),
            observer: opts.observer.clone(),
            executor: executor.clone(),
        };
        let definitions = DefinitionFollower { definitions: store.clone(), signals: signals.clone(), config: in_force.clone() };
        let runs = vec![
            tokio::spawn(executor::recorder(executor.clone(), recorder_rx, stop_runs.clone())),
            tokio::spawn(executor::intake(executor.clone(), queue_signals, stop_runs.clone())),
            tokio::spawn(executor::canceller(executor.clone(), cancel_signals, stop_runs.clone())),
            tokio::spawn(lease.clone().run(renewed, lease_signals, stop_runs.clone())),
            tokio::spawn(gauges.run(stop_runs.clone())),
            tokio::spawn(crate::notifier::run(notifier, notifier_signals, stop_runs.clone())),
            tokio::spawn(crate::deadline::watch(deadlines, stop_runs.clone())),
        ];
        let scheduler_task = tokio::spawn(crate::scheduler::run(scheduler.clone(), scheduler_signals, stop_scheduler.clone()));
        let housekeeper = tokio::spawn(pruner.run(stop_scheduler.clone()));
        tokio::spawn(definitions.run(definition_signals, stop_scheduler.clone()));
        Ok(Engine {
            service,
            upkeep: store,
            clock,
            signals,
            observer: opts.observer,
            config: in_force,
            executor,
            scheduler,
            lease,
            health,
            tasks: Arc::new(Mutex::new(Some(Tasks { stop_scheduler, stop_runs, scheduler: scheduler_task, housekeeper, runs }))),
            _lock: lock.map(Arc::new),
        })
    }

    /// The operations a person or a client asks for (see [`JobService`]).
    pub fn service(&self) -> &JobService {
        &self.service
    }

    #[cfg(test)]
    pub(crate) fn scheduler(&self) -> &Arc<Scheduler> {
        &self.scheduler
    }

    /// Swaps in a new config; the scheduler replans at once, off its loop (ticks due meanwhile
    /// fire from the plan it had, not those of a job whose schedule changed). Refused, changing
    /// nothing, when one of its jobs takes the name of a job created at runtime (the reason
    /// says which).
    pub fn reload(&self, config: &Config) -> Result<(), String> {
        self.config.reload(JobsConfig::of(config, self.config.registry()))?;
        self.signals.publish(Signal::JobChanged);
        self.observer.configure(config);
        Ok(())
    }

    /// Waits for the scheduler's first pass (recovery done, due ticks fired, the plan built):
    /// from then on the worker is ready, as `/readyz` says.
    pub async fn first_pass(&self) {
        let mut rx = self.scheduler.passes();
        let _ = rx.wait_for(|p| *p > DateTime::<Utc>::MIN_UTC).await;
    }

    /// Runs a scheduler pass now and waits until a pass at or after the clock's current time
    /// has completed — every tick due by then fired, every run that could start claimed and
    /// started. With a manual clock this is how a test knows that nothing happened *because
    /// nothing was due*, without sleeping.
    pub async fn scheduled_through_now(&self) {
        let t = self.clock.now();
        let mut rx = self.scheduler.passes();
        self.signals.publish(Signal::Wake);
        let _ = rx.wait_for(|p| *p >= t).await;
    }

    /// The instant whose tick transaction the scheduler has done ahead and holds until it
    /// comes (every statement done, not committed), as it changes; `None` when none is held.
    pub fn tick_held(&self) -> tokio::sync::watch::Receiver<Option<DateTime<Utc>>> {
        self.scheduler.held()
    }

    /// Wakes the scheduler and waits until a pass completes after this call: whatever the wall
    /// clock does meanwhile (a step backwards must not make a live loop look stuck), this
    /// resolves only if the loop is turning. The systemd watchdog pings on it. While a whole
    /// plan is built (a third of a second at a million jobs), passes from the old plan do not
    /// count: the next one after the new plan is in does.
    pub async fn next_pass(&self) {
        // A new receiver has seen the current value: `changed` waits for the next pass.
        let mut rx = self.scheduler.passes();
        self.signals.publish(Signal::Wake);
        let _ = rx.changed().await;
    }

    /// Storage reachable and taking writes, migrations applied, scheduler running, lease
    /// held.
    pub async fn ready(&self) -> bool {
        self.readiness().await.is_ok()
    }

    /// [`Engine::ready`], or why not (every reason, one per line).
    pub async fn readiness(&self) -> Result<(), String> {
        let mut problems = self.health.problems();
        if !self.scheduler.alive() {
            problems.push("the scheduler has not completed its first pass".into());
        }
        if let Err(e) = self.upkeep.check().await {
            problems.push(e);
        }
        if problems.is_empty() { Ok(()) } else { Err(problems.join("\n")) }
    }

    /// What a ready worker says besides: on a shared database, each other worker whose lease
    /// ran out in the last hour without being given up, one a line (as the gauges last sampled
    /// them: a probe of `/readyz` reads no more of the database than the readiness check).
    pub fn notes(&self) -> Vec<String> {
        self.health.notes()
    }

    pub fn worker_name(&self) -> &str {
        &self.lease.worker.name
    }

    /// Waits until no run executes in this process (a waiting run holds none).
    pub async fn idle(&self) {
        self.executor.idle().await;
    }

    /// Number of runs executing in this process.
    pub fn running_count(&self) -> usize {
        self.executor.running_count()
    }

    /// Stops scheduling and new claims, lets running work finish for `grace`, then interrupts
    /// what is left (recorded `interrupted`, retried at next start). Returns once every run
    /// that was claimed has its end recorded; storage is closed then, and the engine answers
    /// no more queries.
    pub async fn shutdown(&self, grace: Duration) {
        let Some(tasks) = self.tasks.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        // No new claims from here on: runs not yet claimed stay queued for the next start.
        // The queue worker keeps running (it stops claiming at the closed gate) until the
        // drain is over: stopping it could cut a claim off mid-transaction, and the write lock
        // that claim holds would block the drained runs' own writes.
        self.executor.gate().close();
        tasks.stop_scheduler.cancel();
        // Every scheduler write is one transaction, so a scheduler stopped mid-write loses
        // nothing (the transaction rolls back and the ticks fire again at the next start);
        // it is given a moment to finish, then aborted, so a slow database cannot hold the drain.
        // One deadline for both (and for the run tasks below): a task stuck in a call to a hung
        // database is given up on at the same moment as the others, not one after another.
        let stopping = [tasks.scheduler, tasks.housekeeper];
        let aborts: Vec<_> = stopping.iter().map(tokio::task::JoinHandle::abort_handle).collect();
        // Meanwhile the worker leaves the group sharing the schedule, so the others take its
        // jobs now (each tick due since their last one fires), not when its lease is given up.
        let leaving = futures::future::join(futures::future::join_all(stopping), self.lease.leave_shares());
        if tokio::time::timeout(STOP_TASK, leaving).await.is_err() {
            aborts.iter().for_each(tokio::task::AbortHandle::abort);
        }
        let gate = self.executor.gate();
        if tokio::time::timeout(grace, gate.idle()).await.is_err() {
            let left = self.executor.stop_all(&StopReason::Shutdown);
            tracing::warn!(runs = left, "grace period over; interrupting runs");
            // An interrupted run records its end at once (its target is dropped, not awaited).
            if tokio::time::timeout(RECORD_INTERRUPTED, gate.idle()).await.is_err() {
                tracing::error!(runs = gate.passes(), "runs did not record their end; they will be recovered at next start");
            }
        }
        tasks.stop_runs.cancel();
        let _ = tokio::time::timeout(STOP_TASK, futures::future::join_all(tasks.runs)).await;
        // Every run it claimed has its end recorded: nothing is left for others to take over.
        if gate.passes() == 0
            && let Err(e) = self.lease.leases.release(&self.lease.worker).await
        {
            tracing::warn!(error = %e, "cannot give up the worker's lease; it runs out by itself");
        }
        // A transaction abandoned mid-way (a fetch cut off by the stop) is rolled back only
        // when its connection is used again; closing the store (its pool, its writing
        // connection) rolls it back now, so no write lock outlives the engine.
        if tokio::time::timeout(STOP_TASK, self.upkeep.close()).await.is_err() {
            tracing::warn!("storage did not close in time");
        }
    }
}

/// How long a background task may take to notice that it must stop.
const STOP_TASK: Duration = Duration::from_secs(2);

/// How long interrupted runs may take to record their end after the grace period.
const RECORD_INTERRUPTED: Duration = Duration::from_secs(10);
