//! The engine composes the run core: it opens storage, hands the executor and the scheduler
//! their handles, starts their tasks, and does what is the whole worker's — reload, drain,
//! the lease and takeover, housekeeping. Nothing it composes imports it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use lamplighter_config::{Config, JobConfig, Workflow};
use lamplighter_plugins::Registry;

use crate::clock::{Clock, ServerClock};
use crate::context::Targets;
use crate::decide::StopReason;
use crate::events::Observer;
use crate::executor::{self, Executor, ExecutorEnv};
use crate::in_force::{InForce, JobsConfig};
use crate::retention::PruneQueue;
use crate::scheduler::{Scheduler, SchedulerEnv};
use crate::signals::{Signal, Signals};
use crate::store::{Backend, OpenError, RunStore, StorageKind, StoreError, WorkerId};

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

/// What the engine composed, for the job service and the engine's own tasks (start, reload,
/// drain, lease, housekeeping). The executor and the scheduler own their state and were handed
/// narrow handles of their own; they never reach back in here.
pub(crate) struct Shared {
    store: Arc<dyn RunStore>,
    clock: Arc<dyn Clock>,
    signals: Arc<dyn Signals>,
    /// Where events go: metrics, hooks, spans.
    observer: Arc<Observer>,
    worker: WorkerId,
    storage: StorageKind,
    /// How long this worker's runs stay its own without a heartbeat.
    lease: Duration,
    config: Arc<InForce>,
    executor: Arc<Executor>,
    scheduler: Arc<Scheduler>,
    retention: Arc<PruneQueue>,
    started_at: DateTime<Utc>,
    registry: Arc<Registry>,
    /// Faults that make the worker not ready until they heal.
    health: Arc<crate::health::Health>,
}

impl Shared {
    pub(crate) fn store(&self) -> &dyn RunStore {
        &*self.store
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub(crate) fn observer(&self) -> &Arc<Observer> {
        &self.observer
    }

    pub(crate) fn worker_name(&self) -> &str {
        &self.worker.name
    }

    pub(crate) fn storage(&self) -> StorageKind {
        self.storage
    }

    pub(crate) fn started_at(&self) -> DateTime<Utc> {
        self.started_at
    }

    pub(crate) fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    pub(crate) fn jobs(&self) -> Arc<BTreeMap<String, JobConfig>> {
        self.config.jobs()
    }

    /// The jobs (with their parsed schedules) and the data directory, from one config.
    pub(crate) fn snapshot(&self) -> Arc<JobsConfig> {
        self.config.get()
    }

    pub(crate) fn job(&self, name: &str) -> Option<JobConfig> {
        self.config.job(name)
    }

    pub(crate) fn workflow(&self, name: &str) -> Option<Arc<Workflow>> {
        self.config.workflow(name)
    }

    /// Swaps in the files' new config; refused when one of its jobs takes a runtime job's name.
    fn set_config(&self, config: JobsConfig) -> Result<(), String> {
        self.config.reload(config)?;
        self.signals.publish(Signal::JobChanged);
        Ok(())
    }

    /// Reads a runtime job again (it was saved or deleted, here or by another worker) and
    /// swaps in the config with it; the scheduler replans.
    pub(crate) async fn refresh_job(&self, name: &str) -> Result<(), StoreError> {
        let stored = self.store.runtime_job(name).await?;
        // Already in force (this worker saved it): nothing to replan.
        if self.config.set_runtime_job(name, stored) {
            self.signals.publish(Signal::JobChanged);
        }
        Ok(())
    }

    /// Reads every runtime job again (a signal may have been missed).
    async fn refresh_jobs(&self) -> Result<(), StoreError> {
        let jobs = self.store.runtime_jobs().await?;
        if self.config.set_runtime(jobs) {
            self.signals.publish(Signal::JobChanged);
        }
        Ok(())
    }

    /// Puts a runtime job saved (or deleted) here in force at once, and tells every worker.
    pub(crate) fn apply_runtime_job(&self, name: &str, stored: Option<crate::definitions::StoredJob>) {
        if self.config.set_runtime_job(name, stored) {
            self.signals.publish(Signal::JobChanged);
        }
        self.signals.publish(Signal::DefinitionChanged(name.to_owned()));
    }

    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    // Signals.

    pub(crate) fn subscribe(&self) -> crate::signals::Receiver {
        self.signals.subscribe()
    }

    pub(crate) fn wake_scheduler(&self) {
        self.signals.publish(Signal::Wake);
    }

    /// A job changed (paused, resumed): the scheduler rebuilds its plan.
    pub(crate) fn job_changed(&self) {
        self.signals.publish(Signal::JobChanged);
    }

    /// Tasks were pushed to the queue: the queue worker takes them.
    pub(crate) fn tasks_pushed(&self) {
        self.signals.publish(Signal::TasksPushed);
    }

    /// Runs were created, started or deleted.
    pub(crate) fn runs_changed(&self) {
        self.signals.publish(Signal::RunsChanged);
    }

    pub(crate) fn run_finished(&self, id: &str) {
        self.signals.publish(Signal::RunFinished(id.to_string()));
    }

    /// Background writes wait while a tick is about to fire (they would hold SQLite's write lock
    /// while the tick's runs are claimed).
    async fn clear_of_ticks(&self) {
        let until_tick = self.scheduler.next_wake_ms().saturating_sub(self.clock.now().timestamp_millis());
        if (0..PRUNE_CLEARANCE_MS).contains(&until_tick) {
            let now = self.clock.now();
            self.clock.sleep_until(now + chrono::Duration::milliseconds(until_tick + PRUNE_CLEARANCE_MS)).await;
        }
    }

    /// Applies retention to every job waiting for it.
    pub(crate) async fn prune_now(&self) {
        let pending = self.retention.take();
        let jobs = self.jobs();
        let now = self.clock.now();
        for name in pending {
            self.clear_of_ticks().await;
            let Some(job) = jobs.get(&name) else { continue };
            if let Err(e) = self.store.prune(&name, job.retention.max_runs, job.retention.max_age, now).await {
                tracing::warn!(job = %name, error = %e, "cannot prune run history");
            }
        }
        self.clear_of_ticks().await;
        if let Err(e) = self.store.housekeeping().await {
            tracing::warn!(error = %e, "cannot tidy the database");
        }
        self.runs_changed();
    }

    /// Stops a run, wherever it is (see [`Executor::stop_run`]).
    pub(crate) async fn stop_run(&self, id: &str, why: String, now: DateTime<Utc>) -> bool {
        self.executor.stop_run(id, why, now).await
    }
}

/// A running engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(crate) shared: Arc<Shared>,
    tasks: Arc<Mutex<Option<Tasks>>>,
    /// SQLite: the lock that makes this the database's one worker.
    _lock: Option<Arc<std::fs::File>>,
}

struct Tasks {
    /// The scheduler and the housekeeper.
    stop_scheduler: CancellationToken,
    /// The queue worker, the recorder, the canceller, the lease keeper and the signal
    /// listener: after the drain.
    stop_runs: CancellationToken,
    scheduler: tokio::task::JoinHandle<()>,
    housekeeper: tokio::task::JoinHandle<()>,
    runs: Vec<tokio::task::JoinHandle<()>>,
}

/// See [`Engine::changes`].
#[derive(Debug)]
pub struct Changes(crate::signals::Receiver);

impl Changes {
    /// Resolves at the next change (or never, once the engine has stopped).
    pub async fn next(&mut self) {
        if self.0.recv().await.is_none() {
            std::future::pending::<()>().await;
        }
    }

    /// Forgets the changes already signalled, for a caller about to read everything anew.
    pub fn drain(&mut self) {
        self.0.drain();
    }
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
        let lease = store.heartbeat(&worker, config.worker.lease, true, clock.now()).await?;
        if let (Some(c), Some(lease)) = (&server_clock, lease) {
            server_time(c, renewed, lease.server_now, &worker.name);
        }
        let now = clock.now();
        opts.observer.configure(config);
        let in_force = Arc::new(InForce::new(JobsConfig::of(config, &opts.registry), opts.registry.clone()));
        // Subscribed before the runtime jobs are read: a change committed elsewhere from here on
        // is heard of, and read again.
        let definition_signals = signals.subscribe();
        // The runtime jobs before the first pass: they are scheduled like the files' jobs.
        let _ = in_force.set_runtime(store.runtime_jobs().await?);
        let retention = Arc::new(PruneQueue::default());
        let health = Arc::new(crate::health::Health::default());
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
            },
        );
        let scheduler = Scheduler::new(SchedulerEnv {
            ticks: store.clone(),
            states: store.clone(),
            handover: store.clone(),
            clock: clock.clone(),
            observer: opts.observer.clone(),
            signals: signals.clone(),
            config: in_force.clone(),
            executor: executor.clone(),
            retention: retention.clone(),
            worker: opts.worker_name.clone(),
            health: health.clone(),
        });
        let shared = Arc::new(Shared {
            store,
            clock,
            signals,
            observer: opts.observer,
            worker,
            storage,
            lease: config.worker.lease,
            config: in_force,
            executor,
            scheduler,
            retention,
            started_at: now,
            registry: opts.registry,
            health,
        });
        // The lease first: from here on no other worker takes this one's runs.
        recover(&shared, now, true).await?;
        // Subscribed before any task runs, so no signal sent from here on is missed.
        let queue_signals = shared.subscribe();
        let cancel_signals = shared.subscribe();
        let scheduler_signals = shared.subscribe();
        let notifier = crate::notifier::NotifierEnv {
            notices: shared.store.clone(),
            records: shared.store.clone(),
            clock: shared.clock.clone(),
            signals: shared.signals.clone(),
            config: shared.config.clone(),
            observer: shared.observer.clone(),
            retention: shared.retention.clone(),
            worker: shared.worker.name.clone(),
        };
        let notifier_signals = shared.subscribe();
        let runs = vec![
            tokio::spawn(executor::recorder(shared.executor.clone(), recorder_rx, stop_runs.clone())),
            tokio::spawn(executor::intake(shared.executor.clone(), queue_signals, stop_runs.clone())),
            tokio::spawn(executor::canceller(shared.executor.clone(), cancel_signals, stop_runs.clone())),
            tokio::spawn(keep_lease(shared.clone(), server_clock, renewed, stop_runs.clone())),
            tokio::spawn(sample_gauges(shared.clone(), stop_runs.clone())),
            tokio::spawn(crate::notifier::run(notifier, notifier_signals, stop_runs.clone())),
        ];
        let scheduler = tokio::spawn(crate::scheduler::run(shared.scheduler.clone(), scheduler_signals, stop_scheduler.clone()));
        let housekeeper = tokio::spawn(housekeeping(shared.clone(), stop_scheduler.clone()));
        tokio::spawn(follow_definitions(shared.clone(), definition_signals, stop_scheduler.clone()));
        Ok(Engine {
            shared,
            tasks: Arc::new(Mutex::new(Some(Tasks { stop_scheduler, stop_runs, scheduler, housekeeper, runs }))),
            _lock: lock.map(Arc::new),
        })
    }

    /// Swaps in a new config; the scheduler replans at once. Refused, changing nothing, when
    /// one of its jobs takes the name of a job created at runtime (the reason says which).
    pub fn reload(&self, config: &Config) -> Result<(), String> {
        self.shared.set_config(JobsConfig::of(config, &self.shared.registry))?;
        self.shared.observer.configure(config);
        Ok(())
    }

    /// Waits for the scheduler's first pass (recovery done, due ticks fired, the plan built):
    /// from then on the worker is ready, as `/readyz` says.
    pub async fn first_pass(&self) {
        let mut rx = self.shared.scheduler.passes();
        let _ = rx.wait_for(|p| *p > DateTime::<Utc>::MIN_UTC).await;
    }

    /// Runs a scheduler pass now and waits until a pass at or after the clock's current time
    /// has completed — every tick due by then fired, every run that could start claimed and
    /// started. With a manual clock this is how a test knows that nothing happened *because
    /// nothing was due*, without sleeping.
    pub async fn scheduled_through_now(&self) {
        let t = self.shared.clock.now();
        let mut rx = self.shared.scheduler.passes();
        self.shared.wake_scheduler();
        let _ = rx.wait_for(|p| *p >= t).await;
    }

    /// The instant whose tick transaction the scheduler has done ahead and holds until it
    /// comes (every statement done, not committed), as it changes; `None` when none is held.
    pub fn tick_held(&self) -> tokio::sync::watch::Receiver<Option<DateTime<Utc>>> {
        self.shared.scheduler.held()
    }

    /// Wakes the scheduler and waits until a pass completes after this call: whatever the wall
    /// clock does meanwhile (a step backwards must not make a live loop look stuck), this
    /// resolves only if the loop is turning. The systemd watchdog pings on it.
    pub async fn next_pass(&self) {
        // A new receiver has seen the current value: `changed` waits for the next pass.
        let mut rx = self.shared.scheduler.passes();
        self.shared.wake_scheduler();
        let _ = rx.changed().await;
    }

    /// Tells when runs may have changed (created, started, finished, pruned), so a caller can
    /// wait for a state of its runs without polling: take it, read, and wait for the next
    /// change only if what was read is not there yet.
    pub fn changes(&self) -> Changes {
        Changes(self.shared.subscribe())
    }

    /// Storage reachable and taking writes, migrations applied, scheduler running, lease
    /// held.
    pub async fn ready(&self) -> bool {
        self.readiness().await.is_ok()
    }

    /// [`Engine::ready`], or why not (every reason, one per line).
    pub async fn readiness(&self) -> Result<(), String> {
        let mut problems = self.shared.health.problems();
        if !self.shared.scheduler.alive() {
            problems.push("the scheduler has not completed its first pass".into());
        }
        if let Err(e) = self.shared.store.check().await {
            problems.push(e);
        }
        if problems.is_empty() { Ok(()) } else { Err(problems.join("\n")) }
    }

    pub fn worker_name(&self) -> &str {
        &self.shared.worker.name
    }

    /// Waits until no run executes in this process (a waiting run holds none).
    pub async fn idle(&self) {
        self.shared.executor.idle().await;
    }

    /// Number of runs executing in this process.
    pub fn running_count(&self) -> usize {
        self.shared.executor.running_count()
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
        self.shared.executor.gate().close();
        tasks.stop_scheduler.cancel();
        // Every scheduler write is one transaction, so a scheduler stopped mid-write loses
        // nothing (the transaction rolls back and the ticks fire again at the next start);
        // it is given a moment to finish, then aborted, so a slow database cannot hold the drain.
        // One deadline for both (and for the run tasks below): a task stuck in a call to a hung
        // database is given up on at the same moment as the others, not one after another.
        let stopping = [tasks.scheduler, tasks.housekeeper];
        let aborts: Vec<_> = stopping.iter().map(tokio::task::JoinHandle::abort_handle).collect();
        if tokio::time::timeout(STOP_TASK, futures::future::join_all(stopping)).await.is_err() {
            aborts.iter().for_each(tokio::task::AbortHandle::abort);
        }
        let gate = self.shared.executor.gate();
        if tokio::time::timeout(grace, gate.idle()).await.is_err() {
            let left = self.shared.executor.stop_all(&StopReason::Shutdown);
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
            && let Err(e) = self.shared.store.release(&self.shared.worker).await
        {
            tracing::warn!(error = %e, "cannot give up the worker's lease; it runs out by itself");
        }
        // A transaction abandoned mid-way (a fetch cut off by the stop) is rolled back only
        // when its connection is used again; closing the store (its pool, its writing
        // connection) rolls it back now, so no write lock outlives the engine.
        if tokio::time::timeout(STOP_TASK, self.shared.store.close()).await.is_err() {
            tracing::warn!("storage did not close in time");
        }
    }
}

/// Measures the server's time from a renewal sent at `sent` (a monotonic instant), and says so
/// when this machine's clock is more than a second off it.
fn server_time(clock: &ServerClock, sent: std::time::Instant, server: DateTime<Utc>, worker: &str) {
    if let Some(offset) = clock.measure(sent, std::time::Instant::now(), server)
        && offset.abs() > chrono::TimeDelta::seconds(1)
    {
        tracing::warn!(
            worker,
            offset_ms = offset.num_milliseconds(),
            "this machine's clock is {}s off the database server's; the worker keeps the server's time (fix the machine's clock: NTP)",
            -offset.num_milliseconds() as f64 / 1000.0
        );
    }
}

/// How long a background task may take to notice that it must stop.
const STOP_TASK: Duration = Duration::from_secs(2);

/// How long interrupted runs may take to record their end after the grace period.
const RECORD_INTERRUPTED: Duration = Duration::from_secs(10);

/// Pruning waits when a tick is this close, and until this long after it.
const PRUNE_CLEARANCE_MS: i64 = 250;

/// A busy worker prunes at most this often; an idle one not at all.
const PRUNE_EVERY: Duration = Duration::from_secs(5);

/// Keeps the runtime jobs in force as the store has them: one job read again when a worker
/// says it changed, all of them when signals may have been missed.
async fn follow_definitions(shared: Arc<Shared>, mut signals: crate::signals::Receiver, stop: CancellationToken) {
    // After a failed read, everything is read again (a second later, and again until it works):
    // a change must not stay unheard because the database was briefly away.
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
            Some(Signal::DefinitionChanged(_) | Signal::Lagged) if behind => shared.refresh_jobs().await,
            Some(Signal::DefinitionChanged(name)) => shared.refresh_job(&name).await,
            Some(Signal::Lagged) => shared.refresh_jobs().await,
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

/// Applies retention off the run path: woken when the notifier has noticed runs' outcomes
/// (only a noticed run may be pruned), then waits [`PRUNE_EVERY`] from the first of them's end
/// so one pass covers every run that finished meanwhile. No timer while nothing finishes.
async fn housekeeping(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = shared.retention.requested() => {}
            _ = stop.cancelled() => break,
        }
        // Due PRUNE_EVERY after the first request of the batch (not after this wake: a clock
        // that moved on meanwhile must not push the batch further out).
        let since = shared.retention.since();
        let Some(since) = since else { continue };
        let batch_until = since + chrono::Duration::from_std(PRUNE_EVERY).unwrap_or_default();
        tokio::select! {
            () = shared.clock.sleep_until(batch_until) => {}
            () = stop.cancelled() => {}
        }
        shared.prune_now().await;
    }
}

/// After an unclean stop or a shutdown with interrupted runs: mark orphans interrupted and
/// start a follow-up attempt for each where the retry policy allows.
/// `starting`: at start, when whatever runs under this worker's name is an orphan too.
async fn recover(shared: &Shared, now: DateTime<Utc>, starting: bool) -> Result<(), StoreError> {
    let orphans = shared.store.recover(starting.then_some(shared.worker.name.as_str()), now).await?;
    for r in &orphans {
        tracing::warn!(run = %r.id, job = %r.owner, status = r.status.as_str(), "run was left running by a worker that stopped or lost its lease");
    }
    for r in shared.store.interrupted_without_follow_up().await? {
        // Picked up at once, if the policy gives it another attempt at all.
        let due = crate::decide::next_attempt(r.attempt, shared.config.get().retries_for(&r.owner).as_ref(), now).map(|_| now);
        if let Some(id) = shared.executor.follow_up(&r, due, now).await? {
            tracing::info!(run = %r.id, retry = %id, "interrupted run picked up again");
            // Due now: the scheduler hands it over (on a shared database, a takeover happens
            // while the scheduler may be asleep until its next tick).
            shared.wake_scheduler();
        }
    }
    Ok(())
}

/// How often the gauges read from the database are sampled.
const GAUGES_SAMPLED_EVERY: Duration = Duration::from_secs(5);

/// Samples what the gauges read from the database: the number of queued runs (all workers),
/// and the per-job gauges while they are on.
async fn sample_gauges(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        match shared.store.queue_depth().await {
            Ok(n) => shared.observer.set_queue_depth(n),
            Err(e) => tracing::debug!(error = %e, "cannot count queued runs"),
        }
        if shared.observer.per_job() {
            match shared.store.job_health().await {
                Ok(health) => shared.observer.set_job_gauges(job_gauges(&shared.config.get(), health, shared.clock.now())),
                Err(e) => tracing::debug!(error = %e, "cannot read the jobs' health"),
            }
        }
        tokio::select! {
            () = tokio::time::sleep(GAUGES_SAMPLED_EVERY) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// The per-job gauges of the jobs in force, from what the database says of them. The next fire
/// time is the schedule's next after the last tick processed (after `now` for a job that has
/// none yet); a paused or disabled job has none.
fn job_gauges(
    config: &JobsConfig,
    mut health: HashMap<String, crate::store::JobHealth>,
    now: DateTime<Utc>,
) -> BTreeMap<String, crate::events::JobGauge> {
    config
        .jobs
        .iter()
        .map(|(name, job)| {
            let h = health.remove(name).unwrap_or_default();
            let next_fire = match &job.schedule {
                Some(s) if job.enabled && !h.paused => s.next_after(h.last_tick.unwrap_or(now)),
                _ => None,
            };
            let gauge = crate::events::JobGauge {
                last_success: h.last_success,
                next_fire,
                consecutive_failures: h.consecutive_failures,
                oldest_running: h.oldest_running,
                oldest_approval: h.oldest_wait,
            };
            (name.clone(), gauge)
        })
        .collect()
}

/// Renews this worker's lease every quarter of it (sooner after a failure), reporting storage
/// faults the write meets. On a shared database it also fences: when no renewal has gone
/// through for [`Fencing::fence_after`](crate::decide::Fencing), it stops every run it holds
/// and takes no work (not ready) until a renewal goes through; and it takes over the runs of
/// workers whose lease ran out (interrupted, then followed up per policy), as every worker does
/// at start. `renewed`: when the last renewal that went through was sent.
async fn keep_lease(shared: Arc<Shared>, server_clock: Option<Arc<ServerClock>>, mut renewed: std::time::Instant, stop: CancellationToken) {
    let fencing = crate::decide::fencing(shared.lease);
    let fences = shared.storage.takes_over_from_others();
    let mut lost = false;
    let mut failing = false;
    let mut fenced = false;
    loop {
        let wait = if failing || fenced { fencing.retry_every } else { fencing.renew_every };
        let fence_at = tokio::time::Instant::from_std(renewed + fencing.fence_after);
        // A renewal may hang (a cut connection): the fence's deadline runs beside it.
        let renew = async {
            tokio::time::sleep(wait).await;
            let sent = std::time::Instant::now();
            let now = shared.clock.now();
            let result = tokio::time::timeout(fencing.renew_every, shared.store.heartbeat(&shared.worker, shared.lease, false, now)).await;
            if let (Some(c), Ok(Ok(Some(lease)))) = (&server_clock, &result) {
                server_time(c, sent, lease.server_now, &shared.worker.name);
            }
            (sent, now, result)
        };
        let (sent, now, result) = tokio::select! {
            r = renew => r,
            () = tokio::time::sleep_until(fence_at), if fences && !fenced => {
                fenced = true;
                let why = format!(
                    "fenced: the worker could not renew its lease for {}; its runs were stopped so that no other worker runs them \
                     at the same time, and it takes no work until the database takes a renewal",
                    humantime::format_duration(fencing.fence_after)
                );
                let stopped = shared.executor.fence(fencing.fence_after);
                tracing::error!(runs = stopped, "{why}");
                shared.observer.fenced(stopped);
                shared.health.set_fenced(Some(why));
                continue;
            }
            () = stop.cancelled() => return,
        };
        match result {
            Ok(Ok(Some(_lease))) => {
                renewed = sent;
                lost = false;
                failing = false;
                shared.health.storage_ok();
                // Work again once the runs the fence stopped have left (their ends recorded or
                // refused): a run of the old epoch must not be taken over, here or elsewhere,
                // while its attempt still runs.
                if fenced && shared.executor.running_count() == 0 {
                    fenced = false;
                    shared.health.set_fenced(None);
                    shared.executor.unfence();
                    tracing::info!("the lease is renewed; the worker takes work again");
                }
            }
            Ok(Ok(None)) => {
                failing = false;
                if !lost {
                    lost = true;
                    tracing::error!(
                        worker = %shared.worker.name,
                        "another process started under this worker's name and took its lease; worker names must be unique \
                         (worker.name)"
                    );
                }
            }
            Ok(Err(e)) => {
                failing = true;
                shared.health.storage_failed(&e);
                tracing::warn!(error = %e, "cannot renew the worker's lease");
            }
            Err(_) => {
                failing = true;
                tracing::warn!("cannot renew the worker's lease: the database did not answer within {:?}", fencing.renew_every);
            }
        }
        // Bounded: a connection cut mid-way must not keep this loop from watching the fence.
        if shared.storage.takes_over_from_others() && !failing && !fenced {
            match tokio::time::timeout(fencing.renew_every, recover(&shared, now, false)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot check for runs of workers that are gone"),
                Err(_) => tracing::warn!("checking for runs of workers that are gone took too long; trying again later"),
            }
        }
    }
}
