//! The engine: owns the store, the scheduler, the queue worker, the recorder and the shared
//! state they use. Start, reload and shutdown go through here.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use lamplighter_config::{Config, JobConfig, RetryPolicy, Workflow};

use crate::clock::Clock;
use crate::context::Targets;
use crate::decide::StopReason;
use crate::events::Observer;
use crate::executor::{self, Executors, Running};
use crate::gate::Gate;
use crate::run::{Run, RunStatus};
use crate::signals::{Signal, Signals};
use crate::snapshot::JobSnapshot;
use crate::store::{Backend, OpenError, RunStore, StorageKind, StoreError, WorkerId};

/// Runs of a workflow started by hand (`run_workflow`), not by a job, are recorded under the
/// job name `workflow:<name>` (a prefix config refuses in job names). They have a job's default
/// policies: the default retry policy, no retention limit.
pub(crate) const WORKFLOW_RUNS: &str = "workflow:";

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

/// State shared by the scheduler, the executors, the queue worker and the service; each
/// reaches it through the methods below.
///
/// Locking rule: the `std` locks here guard plain data and are never held across `.await`.
pub(crate) struct Shared {
    store: Arc<dyn RunStore>,
    clock: Arc<dyn Clock>,
    targets: Arc<dyn Targets>,
    signals: Arc<dyn Signals>,
    /// Where events go: metrics, hooks, spans.
    observer: Arc<Observer>,
    worker: WorkerId,
    storage: StorageKind,
    /// How long this worker's runs stay its own without a heartbeat.
    lease: Duration,
    config: RwLock<Arc<JobsConfig>>,
    /// Runs executing in this process, by id.
    running: Mutex<HashMap<String, Arc<Running>>>,
    /// Every run from before its claim until its end is recorded; closed by the drain.
    gate: Arc<Gate>,
    /// The `worker.concurrency` slots and the way to the recorder.
    executors: Executors,
    /// Jobs whose history may need pruning; the housekeeper takes them in batches.
    prune_pending: Mutex<PrunePending>,
    prune_wake: Notify,
    started_at: DateTime<Utc>,
    scheduler_alive: AtomicBool,
    /// When the scheduler wakes next (ms since the epoch; `i64::MAX`: nothing planned), so
    /// background work can keep out of the way of ticks.
    next_wake_ms: AtomicI64,
    /// The clock instant of the scheduler's last completed pass.
    passes: tokio::sync::watch::Sender<DateTime<Utc>>,
}

/// The part of the config the engine needs, swapped whole on reload.
#[derive(Debug, Clone)]
pub(crate) struct JobsConfig {
    pub(crate) jobs: Arc<BTreeMap<String, JobConfig>>,
    pub(crate) workflows: Arc<BTreeMap<String, Arc<Workflow>>>,
    /// Jobs the environment broke (e.g. their plugin did not load), with the reason: not
    /// scheduled, not triggerable, shown with the reason.
    pub(crate) unavailable: Arc<HashMap<String, String>>,
    pub(crate) data_dir: PathBuf,
    /// Agents, providers, pipelines and MCP servers, for the agent runner.
    pub(crate) agents: Arc<crate::catalog::Catalog>,
}

impl JobsConfig {
    fn of(config: &Config) -> Self {
        // The worker records them as `job "<name>"` in the config's disabled items.
        let unavailable = config
            .disabled
            .iter()
            .filter_map(|(what, why)| Some((what.strip_prefix("job \"")?.strip_suffix('"')?.to_string(), why.clone())))
            .filter(|(name, _)| config.jobs.contains_key(name))
            .collect();
        Self {
            jobs: Arc::new(config.jobs.clone()),
            workflows: Arc::new(config.workflows.iter().map(|(k, w)| (k.clone(), Arc::new(w.clone()))).collect()),
            unavailable: Arc::new(unavailable),
            data_dir: config.data_dir.clone(),
            agents: Arc::new(crate::catalog::Catalog::of(config)),
        }
    }

    /// What a run of `job` executes, as it is now (its workflow's definition included).
    pub(crate) fn snapshot_of(&self, job: &JobConfig) -> JobSnapshot {
        let workflow = match &job.target {
            lamplighter_config::Target::Workflow(w) => self.workflows.get(w),
            _ => None,
        };
        JobSnapshot::of(job, workflow)
    }
}

impl Shared {
    pub(crate) fn store(&self) -> &dyn RunStore {
        &*self.store
    }

    pub(crate) fn store_handle(&self) -> Arc<dyn RunStore> {
        self.store.clone()
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub(crate) fn targets(&self) -> &dyn Targets {
        &*self.targets
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

    pub(crate) fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    pub(crate) fn executors(&self) -> &Executors {
        &self.executors
    }

    pub(crate) fn jobs(&self) -> Arc<BTreeMap<String, JobConfig>> {
        self.config.read().unwrap_or_else(|e| e.into_inner()).jobs.clone()
    }

    /// The jobs (with their parsed schedules) and the data directory, from one config.
    pub(crate) fn snapshot(&self) -> Arc<JobsConfig> {
        self.config.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn job(&self, name: &str) -> Option<JobConfig> {
        self.config.read().unwrap_or_else(|e| e.into_inner()).jobs.get(name).cloned()
    }

    pub(crate) fn workflow(&self, name: &str) -> Option<Arc<Workflow>> {
        self.config.read().unwrap_or_else(|e| e.into_inner()).workflows.get(name).cloned()
    }

    /// The retry policy of runs recorded under `job`: the job's, the default for workflows run
    /// by hand, none for a job that is no longer defined (its runs are not retried).
    pub(crate) fn retries_for(&self, job: &str) -> Option<RetryPolicy> {
        match self.job(job) {
            Some(j) => Some(j.retries),
            None => job.strip_prefix(WORKFLOW_RUNS).and_then(|w| self.workflow(w)).map(|_| RetryPolicy::default()),
        }
    }

    pub(crate) fn data_dir(&self) -> PathBuf {
        self.config.read().unwrap_or_else(|e| e.into_inner()).data_dir.clone()
    }

    /// The agents of the config in force.
    pub(crate) fn agents(&self) -> Arc<crate::catalog::Catalog> {
        self.config.read().unwrap_or_else(|e| e.into_inner()).agents.clone()
    }

    fn set_config(&self, config: JobsConfig) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        self.signals.publish(Signal::JobChanged);
    }

    // Signals.

    pub(crate) fn subscribe(&self) -> crate::signals::Receiver {
        self.signals.subscribe()
    }

    pub(crate) fn signals_handle(&self) -> Arc<dyn Signals> {
        self.signals.clone()
    }

    pub(crate) fn wake_scheduler(&self) {
        self.signals.publish(Signal::Wake);
    }

    /// A job changed (paused, resumed): the scheduler rebuilds its plan.
    pub(crate) fn job_changed(&self) {
        self.signals.publish(Signal::JobChanged);
    }

    /// Tasks were pushed: the queue worker takes them into free slots.
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

    // The scheduler's state, for readiness and for background work.

    pub(crate) fn scheduler_alive(&self, alive: bool) {
        self.scheduler_alive.store(alive, Ordering::SeqCst);
    }

    /// A scheduler pass through `now` is complete; it wakes next at `next` (none: nothing
    /// planned).
    pub(crate) fn pass_done(&self, now: DateTime<Utc>, next: Option<DateTime<Utc>>) {
        self.next_wake_ms.store(next.map_or(i64::MAX, |t| t.timestamp_millis()), Ordering::SeqCst);
        self.passes.send_replace(now);
    }

    // Runs executing here.

    /// Registers a run that starts executing here.
    pub(crate) fn track(&self, id: &str) -> Arc<Running> {
        let entry = Arc::new(Running::default());
        self.running.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_string(), entry.clone());
        entry
    }

    /// Forgets a run whose end is recorded (or given up on).
    pub(crate) fn untrack(&self, id: &str) {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }

    /// Stops a run if it executes here.
    pub(crate) fn stop_here(&self, id: &str, why: String) -> bool {
        match self.tracked(id) {
            Some(r) => {
                r.stop(StopReason::Cancelled(why));
                true
            }
            None => false,
        }
    }

    fn tracked(&self, id: &str) -> Option<Arc<Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned()
    }

    /// Creates the next attempt of a failed or interrupted run, due at `due_at` (as decided by
    /// [`crate::decide::next_attempt`]), with the same identity and job snapshot; with no
    /// `due_at`, marks the run as having none.
    pub(crate) async fn follow_up(
        &self,
        run: &Run,
        due_at: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<Option<String>, StoreError> {
        match due_at {
            Some(due) => {
                let id = self.store.follow_up(run, due, now).await?;
                if let Some(id) = &id {
                    self.observer.run_created(&run.job, run.trigger, id);
                }
                Ok(id)
            }
            None => {
                self.store.mark_no_follow_up(&run.id).await?;
                Ok(None)
            }
        }
    }

    /// Asks the housekeeper to apply the job's retention soon (batched, off the run path).
    /// `at`: the engine-clock instant of what asked (a run's end, a skipped tick).
    pub(crate) fn prune_soon(&self, job: &str, at: DateTime<Utc>) {
        let mut p = self.prune_pending.lock().unwrap_or_else(|e| e.into_inner());
        p.jobs.insert(job.to_string());
        // The batch is due [`PRUNE_EVERY`] after its first request, on the engine's clock.
        p.since = Some(p.since.map_or(at, |s| s.min(at)));
        drop(p);
        self.prune_wake.notify_one();
    }

    /// Background writes wait while a tick is about to fire (they would hold SQLite's write lock
    /// while the tick's runs are claimed).
    async fn clear_of_ticks(&self) {
        let until_tick = self.next_wake_ms.load(Ordering::SeqCst).saturating_sub(self.clock.now().timestamp_millis());
        if (0..PRUNE_CLEARANCE_MS).contains(&until_tick) {
            let now = self.clock.now();
            self.clock.sleep_until(now + chrono::Duration::milliseconds(until_tick + PRUNE_CLEARANCE_MS)).await;
        }
    }

    /// Applies retention to every job waiting for it.
    pub(crate) async fn prune_now(&self) {
        let pending = std::mem::take(&mut *self.prune_pending.lock().unwrap_or_else(|e| e.into_inner())).jobs;
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

    /// Stops a run: a queued one is marked cancelled; a running one is told to stop and
    /// records the reason itself.
    pub(crate) async fn stop_run(&self, id: &str, why: String, now: DateTime<Utc>) -> bool {
        if self.stop_here(id, why.clone()) {
            return true;
        }
        let done = self.store.finish(id, RunStatus::Cancelled, None, Some(&why), now).await.unwrap_or(false);
        if done {
            self.run_finished(id);
            return true;
        }
        // Running, but not here: whichever worker runs it stops it.
        match self.store.get_run(id).await {
            Ok(Some(run)) if run.status == RunStatus::Running => {
                self.signals.publish(Signal::CancelRequested { run: id.to_string(), why });
                true
            }
            _ => false,
        }
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
}

/// Applies migrations without starting anything (`lamplighter migrate`); returns where (the
/// SQLite file, or the PostgreSQL URL without its password).
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
        let (executors, recorder_rx) = Executors::new(config.worker.concurrency);
        let now = opts.clock.now();
        opts.observer.configure(config);
        let shared = Arc::new(Shared {
            store,
            clock: opts.clock,
            targets: opts.targets,
            signals,
            observer: opts.observer,
            worker: worker_id(opts.worker_name),
            storage,
            lease: config.worker.lease,
            config: RwLock::new(Arc::new(JobsConfig::of(config))),
            running: Mutex::new(HashMap::new()),
            gate: Arc::new(Gate::new()),
            executors,
            prune_pending: Mutex::new(PrunePending::default()),
            prune_wake: Notify::new(),
            started_at: now,
            scheduler_alive: AtomicBool::new(false),
            next_wake_ms: AtomicI64::new(i64::MAX),
            passes: tokio::sync::watch::Sender::new(DateTime::<Utc>::MIN_UTC),
        });
        // The lease first: from here on no other worker takes this one's runs.
        shared.store.heartbeat(&shared.worker, shared.lease, true, now).await?;
        recover(&shared, now, true).await?;
        // Subscribed before any task runs, so no signal sent from here on is missed.
        let queue_signals = shared.subscribe();
        let cancel_signals = shared.subscribe();
        let scheduler_signals = shared.subscribe();
        let runs = vec![
            tokio::spawn(executor::recorder(shared.clone(), recorder_rx, stop_runs.clone())),
            tokio::spawn(executor::intake(shared.clone(), queue_signals, stop_runs.clone())),
            tokio::spawn(executor::canceller(shared.clone(), cancel_signals, stop_runs.clone())),
            tokio::spawn(keep_lease(shared.clone(), stop_runs.clone())),
            tokio::spawn(sample_queue(shared.clone(), stop_runs.clone())),
        ];
        let scheduler = tokio::spawn(crate::scheduler::run(shared.clone(), scheduler_signals, stop_scheduler.clone()));
        let housekeeper = tokio::spawn(housekeeping(shared.clone(), stop_scheduler.clone()));
        Ok(Engine {
            shared,
            tasks: Arc::new(Mutex::new(Some(Tasks { stop_scheduler, stop_runs, scheduler, housekeeper, runs }))),
            _lock: lock.map(Arc::new),
        })
    }

    /// Swaps in a new set of jobs; the scheduler replans at once.
    pub fn reload(&self, config: &Config) {
        self.shared.observer.configure(config);
        self.shared.set_config(JobsConfig::of(config));
    }

    /// Waits for the scheduler's first pass (recovery done, due ticks fired, the plan built):
    /// from then on the worker is ready, as `/readyz` says.
    pub async fn first_pass(&self) {
        let mut rx = self.shared.passes.subscribe();
        let _ = rx.wait_for(|p| *p > DateTime::<Utc>::MIN_UTC).await;
    }

    /// Runs a scheduler pass now and waits until a pass at or after the clock's current time
    /// has completed — every tick due by then fired, every run that could start claimed and
    /// started. With a manual clock this is how a test knows that nothing happened *because
    /// nothing was due*, without sleeping.
    pub async fn scheduled_through_now(&self) {
        let t = self.shared.clock.now();
        let mut rx = self.shared.passes.subscribe();
        self.shared.wake_scheduler();
        let _ = rx.wait_for(|p| *p >= t).await;
    }

    /// Wakes the scheduler and waits until a pass completes after this call: whatever the wall
    /// clock does meanwhile (a step backwards must not make a live loop look stuck), this
    /// resolves only if the loop is turning. The systemd watchdog pings on it.
    pub async fn next_pass(&self) {
        // A new receiver has seen the current value: `changed` waits for the next pass.
        let mut rx = self.shared.passes.subscribe();
        self.shared.wake_scheduler();
        let _ = rx.changed().await;
    }

    /// Tells when runs may have changed (created, started, finished, pruned), so a caller can
    /// wait for a state of its runs without polling: take it, read, and wait for the next
    /// change only if what was read is not there yet.
    pub fn changes(&self) -> Changes {
        Changes(self.shared.subscribe())
    }

    /// Storage reachable, migrations applied, scheduler running.
    pub async fn ready(&self) -> bool {
        self.shared.scheduler_alive.load(Ordering::SeqCst) && self.shared.store.ping().await
    }

    pub fn worker_name(&self) -> &str {
        &self.shared.worker.name
    }

    /// Number of runs executing in this process.
    pub fn running_count(&self) -> usize {
        self.shared.running.lock().unwrap_or_else(|e| e.into_inner()).len()
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
        self.shared.gate.close();
        tasks.stop_scheduler.cancel();
        // Every scheduler write is one transaction, so a scheduler stopped mid-write loses
        // nothing (the transaction rolls back and the ticks fire again at the next start);
        // it is given a moment to finish, then aborted, so a slow database cannot hold the drain.
        for task in [tasks.scheduler, tasks.housekeeper] {
            let abort = task.abort_handle();
            if tokio::time::timeout(STOP_TASK, task).await.is_err() {
                abort.abort();
            }
        }
        if tokio::time::timeout(grace, self.shared.gate.idle()).await.is_err() {
            let left: Vec<Arc<Running>> = self.shared.running.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
            tracing::warn!(runs = left.len(), "grace period over; interrupting runs");
            for r in left {
                r.stop(StopReason::Shutdown);
            }
            // An interrupted run records its end at once (its target is dropped, not awaited).
            if tokio::time::timeout(RECORD_INTERRUPTED, self.shared.gate.idle()).await.is_err() {
                tracing::error!(runs = self.shared.gate.passes(), "runs did not record their end; they will be recovered at next start");
            }
        }
        tasks.stop_runs.cancel();
        for t in tasks.runs {
            let _ = tokio::time::timeout(STOP_TASK, t).await;
        }
        // Every run it claimed has its end recorded: nothing is left for others to take over.
        if self.shared.gate.passes() == 0
            && let Err(e) = self.shared.store.release(&self.shared.worker).await
        {
            tracing::warn!(error = %e, "cannot give up the worker's lease; it runs out by itself");
        }
        // A transaction abandoned mid-way (a fetch cut off by the stop) is rolled back only
        // when its connection is used again; closing the pool rolls it back now, so no write
        // lock outlives the engine.
        if tokio::time::timeout(STOP_TASK, self.shared.store.close()).await.is_err() {
            tracing::warn!("storage did not close in time");
        }
    }
}

/// How long a background task may take to notice that it must stop.
const STOP_TASK: Duration = Duration::from_secs(2);

/// How long interrupted runs may take to record their end after the grace period.
const RECORD_INTERRUPTED: Duration = Duration::from_secs(10);

/// Jobs whose history may need pruning, and when the first of them asked.
#[derive(Debug, Default)]
struct PrunePending {
    jobs: BTreeSet<String>,
    since: Option<DateTime<Utc>>,
}

/// Pruning waits when a tick is this close, and until this long after it.
const PRUNE_CLEARANCE_MS: i64 = 250;

/// A busy worker prunes at most this often; an idle one not at all.
const PRUNE_EVERY: Duration = Duration::from_secs(5);

/// Applies retention off the run path: woken when runs finish, then waits [`PRUNE_EVERY`] so
/// one pass covers every run that finished meanwhile. No timer while nothing finishes.
async fn housekeeping(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = shared.prune_wake.notified() => {}
            _ = stop.cancelled() => break,
        }
        // Due PRUNE_EVERY after the first request of the batch (not after this wake: a clock
        // that moved on meanwhile must not push the batch further out).
        let since = shared.prune_pending.lock().unwrap_or_else(|e| e.into_inner()).since;
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
        tracing::warn!(run = %r.id, job = %r.job, "run was left running by a worker that stopped; marked interrupted");
    }
    for r in shared.store.interrupted_without_follow_up().await? {
        // Picked up at once, if the policy gives it another attempt at all.
        let due = crate::decide::next_attempt(r.attempt, shared.retries_for(&r.job).as_ref(), now).map(|_| now);
        if let Some(id) = shared.follow_up(&r, due, now).await? {
            tracing::info!(run = %r.id, retry = %id, "interrupted run picked up again");
        }
    }
    Ok(())
}

/// How often the queue depth gauge is sampled.
const QUEUE_SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Samples the number of queued runs (all workers) for the queue depth gauge.
async fn sample_queue(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        match shared.store.queue_depth().await {
            Ok(n) => shared.observer.set_queue_depth(n),
            Err(e) => tracing::debug!(error = %e, "cannot count queued runs"),
        }
        tokio::select! {
            () = tokio::time::sleep(QUEUE_SAMPLE_EVERY) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Renews this worker's lease every third of it. On a shared database it also takes over the
/// runs of workers whose lease ran out (interrupted, then followed up per policy), as every
/// worker does at start.
async fn keep_lease(shared: Arc<Shared>, stop: CancellationToken) {
    let every = shared.lease / 3;
    let mut lost = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
        let now = shared.clock.now();
        match shared.store.heartbeat(&shared.worker, shared.lease, false, now).await {
            Ok(true) => lost = false,
            Ok(false) if !lost => {
                lost = true;
                tracing::error!(
                    worker = %shared.worker.name,
                    "another process started under this worker's name and took its lease; worker names must be unique \
                     (worker.name)"
                );
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "cannot renew the worker's lease"),
        }
        if shared.storage.takes_over_from_others()
            && let Err(e) = recover(&shared, now, false).await
        {
            tracing::warn!(error = %e, "cannot check for runs of workers that are gone");
        }
    }
}
