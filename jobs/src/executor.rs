//! Execution: `concurrency` slots, and the three steps every run takes through them.
//!
//! - **Claim**: runs arrive by id — handed over by the scheduler or a trigger right after their
//!   transaction (with a slot already reserved), or delivered by the apalis queue (which waits
//!   for a slot). The claimer takes whatever has arrived and claims it in one statement.
//! - **Run**: each claimed run gets its own task with a [`RunContext`], the job's timeout and
//!   cancellation; its target runs in a further task, so a panic fails that run and nothing else.
//! - **Record**: the recorder writes the ends of whatever runs have finished in one statement,
//!   then frees their slots, schedules retries and tells waiters.
//!
//! A run holds a drain [`Pass`] from before its claim until its end is recorded.

use std::sync::Arc;
use std::time::Duration;

use apalis::prelude::*;
use apalis_sqlite::{Config as QueueConfig, SqliteStorage};
use futures::channel::mpsc as fmpsc;
use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::decide::{Settled, StopReason, next_attempt, settle};
use crate::engine::Shared;
use crate::gate::Pass;
use crate::run::{Outcome, Run, RunStatus};
use crate::store::{Handed, RunEnd};
use crate::target::{JobSnapshot, RunContext};

/// The apalis queue name (otherwise it would be the Rust type path).
pub(crate) const QUEUE: &str = "lamplighter-runs";

/// What travels through the queue: only the run id; the run row holds the rest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunTask {
    pub(crate) run_id: String,
}

pub(crate) type Queue = SqliteStorage<RunTask>;

/// apalis's heartbeat only keeps its `Workers` row fresh for its orphan re-enqueue, which
/// Lamplighter does not rely on (one worker per SQLite file, held by a file lock; orphaned runs
/// are recovered from `ll_runs` at start). A daily beat keeps an idle worker asleep.
const QUEUE_HEARTBEAT: Duration = Duration::from_secs(24 * 3600);

/// Claims and ends are written in batches of at most this many runs.
const BATCH: usize = 1024;

pub(crate) fn queue(pool: &apalis_sqlite::SqlitePool, concurrency: usize) -> Queue {
    SqliteStorage::new(pool)
        .with_config(QueueConfig::default().queue(QUEUE).batch_size(concurrency.max(1)).heartbeat_interval(QUEUE_HEARTBEAT))
}

/// One run in progress in this process.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) token: CancellationToken,
    pub(crate) reason: std::sync::Mutex<Option<StopReason>>,
}

impl Running {
    /// Stops the run; the first reason given is the one recorded.
    pub(crate) fn stop(&self, why: StopReason) {
        self.reason.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(why);
        self.token.cancel();
    }
}

/// A run id with the slot it will run in, and the run itself when the caller has it.
struct Submitted {
    id: String,
    slot: OwnedSemaphorePermit,
    known: Option<Handed>,
}

/// A run that ended, on its way to the recorder.
struct Finished {
    run: Run,
    /// When its target was called (the claim recorded when it was claimed).
    started: Option<chrono::DateTime<chrono::Utc>>,
    end: Settled,
    slot: OwnedSemaphorePermit,
    pass: Pass,
}

/// The slots and the way in. Owned by `Shared`; the claimer and recorder tasks hold the other
/// ends of its channels.
#[derive(Debug)]
pub(crate) struct Executors {
    slots: Arc<Semaphore>,
    submit: mpsc::UnboundedSender<Submitted>,
    /// Runs submitted so far, and runs the claimer has dealt with (claimed or dropped).
    submitted: std::sync::atomic::AtomicU64,
    settled: Arc<tokio::sync::watch::Sender<u64>>,
}

impl std::fmt::Debug for Submitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
    }
}

/// The receiving ends, taken by [`start`].
pub(crate) struct Receivers {
    submitted: mpsc::UnboundedReceiver<Submitted>,
    settled: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Executors {
    pub(crate) fn new(concurrency: usize) -> (Self, Receivers) {
        let (submit, submitted) = mpsc::unbounded_channel();
        let settled = Arc::new(tokio::sync::watch::Sender::new(0));
        let executors = Self {
            slots: Arc::new(Semaphore::new(concurrency.max(1))),
            submit,
            submitted: std::sync::atomic::AtomicU64::new(0),
            settled: settled.clone(),
        };
        (executors, Receivers { submitted, settled })
    }

    /// Takes up to `n` free slots, without waiting.
    pub(crate) fn reserve(&self, n: usize) -> Vec<OwnedSemaphorePermit> {
        let mut out = Vec::new();
        while out.len() < n {
            match self.slots.clone().try_acquire_owned() {
                Ok(p) => out.push(p),
                Err(_) => break,
            }
        }
        out
    }

    /// Hands a dispatched run to the claimer, in the slot reserved for it.
    pub(crate) fn submit(&self, id: String, slot: OwnedSemaphorePermit) {
        // The claimer lives as long as the engine; after it stops the run stays queued.
        self.submitted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _ = self.submit.send(Submitted { id, slot, known: None });
    }

    /// As [`Executors::submit`], with the run in hand (just inserted): the claim need not read
    /// it back.
    pub(crate) fn submit_known(&self, handed: Handed, slot: OwnedSemaphorePermit) {
        self.submitted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _ = self.submit.send(Submitted { id: handed.run.id.clone(), slot, known: Some(handed) });
    }

    /// Resolves once the claimer has dealt with every run submitted before the call.
    pub(crate) async fn claims_settled(&self) {
        let n = self.submitted.load(std::sync::atomic::Ordering::SeqCst);
        let mut rx = self.settled.subscribe();
        let _ = rx.wait_for(|done| *done >= n).await;
    }

    async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().acquire_owned().await.ok()
    }
}

/// Starts the claimer and the recorder; they stop when `stop` is cancelled (after the drain).
pub(crate) fn start(shared: &Arc<Shared>, rx: Receivers, stop: CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
    let (finished_tx, finished_rx) = mpsc::unbounded_channel();
    vec![
        tokio::spawn(claimer(shared.clone(), rx.submitted, rx.settled, finished_tx, stop.clone())),
        tokio::spawn(recorder(shared.clone(), finished_rx, stop)),
    ]
}

/// Takes everything that has arrived (up to [`BATCH`]) and claims it in one statement.
async fn claimer(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<Submitted>,
    settled: Arc<tokio::sync::watch::Sender<u64>>,
    finished: mpsc::UnboundedSender<Finished>,
    stop: CancellationToken,
) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => if n == 0 { return },
            () = stop.cancelled() => return,
        }
        let n = batch.len() as u64;
        claim_batch(&shared, &mut batch, &finished).await;
        settled.send_modify(|done| *done += n);
    }
}

/// Claims one batch of submitted runs and starts the claimed ones.
async fn claim_batch(shared: &Arc<Shared>, batch: &mut Vec<Submitted>, finished: &mpsc::UnboundedSender<Finished>) {
    // Past the gate before the claim: once it is closed nothing more is claimed, and the
    // runs stay queued for the next start.
    let mut admitted: Vec<(Submitted, Pass)> = Vec::with_capacity(batch.len());
    for s in batch.drain(..) {
        if let Some(pass) = shared.gate.enter() {
            admitted.push((s, pass));
        }
    }
    if admitted.is_empty() {
        return;
    }
    let ids: Vec<String> = admitted.iter().map(|(s, _)| s.id.clone()).collect();
    let now = shared.clock.now();
    let began = std::time::Instant::now();
    let claimed = shared.store.claim_many(&ids, &shared.worker_name, now).await;
    tracing::debug!(runs = ids.len(), claim_us = began.elapsed().as_micros() as u64, "claimed");
    let claimed = match claimed {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(runs = ids.len(), error = %e, "cannot claim runs; they stay queued");
            if let Err(e) = shared.store.undispatch(&ids).await {
                tracing::error!(error = %e, "cannot re-queue runs; they run at the next start");
            }
            shared.wake_scheduler();
            return;
        }
    };
    let claimed: std::collections::HashSet<String> = claimed.into_iter().collect();
    // Runs delivered by id only are read back; the others are in hand.
    let unknown: Vec<String> =
        admitted.iter().filter(|(s, _)| s.known.is_none() && claimed.contains(&s.id)).map(|(s, _)| s.id.clone()).collect();
    let mut read: std::collections::HashMap<String, (Run, Option<JobSnapshot>)> = std::collections::HashMap::new();
    if !unknown.is_empty() {
        match shared.store.runs_to_execute(&unknown).await {
            Ok(runs) => read = runs.into_iter().map(|(r, s)| (r.id.clone(), (r, s))).collect(),
            // Claimed but unreadable: they are `running` with no task; recovery at the next
            // start interrupts and follows them up.
            Err(e) => tracing::error!(runs = unknown.len(), error = %e, "cannot read claimed runs"),
        }
    }
    for (s, pass) in admitted {
        // Not claimed: cancelled while queued, or already taken. Slot and pass go back.
        if !claimed.contains(&s.id) {
            continue;
        }
        let (mut run, snapshot) = match s.known {
            Some(h) => (h.run, h.snapshot),
            None => match read.remove(&s.id) {
                Some(r) => r,
                None => continue,
            },
        };
        run.status = RunStatus::Running;
        run.started_at = Some(now);
        run.worker = Some(shared.worker_name.clone());
        tokio::spawn(run_one(shared.clone(), run, snapshot, s.slot, pass, finished.clone()));
    }
}

/// One claimed run: its target in a task of its own, so that a panic becomes this run's end.
async fn run_one(
    shared: Arc<Shared>,
    run: Run,
    snapshot: Option<JobSnapshot>,
    slot: OwnedSemaphorePermit,
    pass: Pass,
    finished: mpsc::UnboundedSender<Finished>,
) {
    let entry = Arc::new(Running { token: CancellationToken::new(), reason: std::sync::Mutex::new(None) });
    shared.running.lock().unwrap_or_else(|e| e.into_inner()).insert(run.id.clone(), entry.clone());
    tracing::debug!(run = %run.id, job = %run.job, trigger = run.trigger.as_str(), attempt = run.attempt, lateness_ms = run.lateness().map(|d| d.num_milliseconds()), "run started");
    let started = Arc::new(std::sync::OnceLock::new());
    let end = match tokio::spawn(execute(shared.clone(), run.clone(), snapshot, entry, started.clone())).await {
        Ok(end) => end,
        Err(e) => Settled { status: RunStatus::Failed, output: None, error: Some(format!("the run panicked: {e}")), retry: false },
    };
    // The recorder lives until the drain is over; if it is gone the process is stopping and
    // the run is recovered at the next start.
    let _ = finished.send(Finished { run, started: started.get().copied(), end, slot, pass });
}

async fn execute(
    shared: Arc<Shared>,
    run: Run,
    snapshot: Option<JobSnapshot>,
    entry: Arc<Running>,
    started: Arc<std::sync::OnceLock<chrono::DateTime<chrono::Utc>>>,
) -> Settled {
    // The job as it was when the run was created; rows from before snapshots use the config
    // in force.
    let snapshot = snapshot.or_else(|| shared.job(&run.job).map(|j| JobSnapshot::of(&j)));
    let outcome = match snapshot {
        None => Some(Outcome::permanent(format!("job \"{}\" is no longer defined", run.job))),
        Some(job) => {
            let job = Arc::new(job);
            let ctx = RunContext::new(run, job.clone(), entry.token.clone(), shared.data_dir(), shared.store.clone(), shared.clock.clone());
            // The run's start, as recorded: the moment its target is called.
            let _ = started.set(shared.clock.now());
            let work = shared.targets.run(ctx);
            let limit = async {
                match job.timeout() {
                    Some(t) => tokio::time::sleep(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                o = work => Some(o),
                () = limit => {
                    if let Some(t) = job.timeout() {
                        entry.stop(StopReason::TimedOut(t));
                    }
                    None
                }
                () = entry.token.cancelled() => None,
            }
        }
    };
    let stop = entry.reason.lock().unwrap_or_else(|e| e.into_inner()).clone();
    settle(outcome, stop)
}

/// Writes the ends of whatever runs have finished (up to [`BATCH`]) in one statement, then
/// frees their slots and passes.
async fn recorder(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Finished>, stop: CancellationToken) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => if n == 0 { return },
            () = stop.cancelled() => return,
        }
        let now = shared.clock.now();
        let ends: Vec<RunEnd<'_>> = batch
            .iter()
            .map(|f| RunEnd {
                id: &f.run.id,
                started_at: f.started,
                status: f.end.status,
                output: f.end.output.as_ref(),
                error: f.end.error.as_deref(),
            })
            .collect();
        let mut recorded = false;
        for attempt in 1..=3 {
            let began = std::time::Instant::now();
            let res = shared.store.finish_many(&ends, now).await;
            tracing::debug!(runs = ends.len(), finish_us = began.elapsed().as_micros() as u64, "ends recorded");
            match res {
                Ok(_) => {
                    recorded = true;
                    break;
                }
                Err(e) => {
                    tracing::error!(runs = ends.len(), attempt, error = %e, "cannot record the end of runs");
                    tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
                }
            }
        }
        drop(ends);
        for f in batch.drain(..) {
            // Only now, with the end recorded (or given up on: the run is recovered as
            // interrupted at the next start), does the run leave the running map.
            shared.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&f.run.id);
            if f.end.status == RunStatus::Failed && f.end.error.as_deref().is_some_and(|e| e.starts_with("the run panicked")) {
                tracing::error!(run = %f.run.id, job = %f.run.job, error = f.end.error.as_deref().unwrap_or(""), "run panicked");
            }
            tracing::info!(run = %f.run.id, job = %f.run.job, status = f.end.status.as_str(), error = f.end.error.as_deref().unwrap_or(""), "run finished");
            if recorded && f.end.retry {
                schedule_retry(&shared, &f.run, now).await;
            }
            shared.prune_soon(&f.run.job, now);
            shared.run_finished(&f.run.id);
            drop(f.slot);
            drop(f.pass);
        }
        // Slots are free: the queue may deliver what waits there.
        shared.wake_queue();
    }
}

/// Schedules the next attempt of a failed run after the job's backoff, if its policy allows.
async fn schedule_retry(shared: &Shared, run: &Run, now: chrono::DateTime<chrono::Utc>) {
    let due = next_attempt(run.attempt, shared.job(&run.job).map(|j| j.retries).as_ref(), now);
    match shared.follow_up(run, due, now).await {
        Ok(Some(id)) => tracing::info!(run = %run.id, retry = %id, due = ?due, "retry scheduled"),
        Ok(None) => {}
        Err(e) => tracing::error!(run = %run.id, error = %e, "cannot schedule a retry"),
    }
    shared.wake_scheduler();
}

/// Runs the apalis worker until `stop` is cancelled. It delivers the runs that were not handed
/// over directly: each waits for a free slot, then goes to the claimer.
pub(crate) async fn run_worker(
    shared: Arc<Shared>,
    queue: Queue,
    wake: fmpsc::UnboundedReceiver<()>,
    stop: CancellationToken,
) -> Result<(), String> {
    // apalis refuses to register a worker id seen within its heartbeat window, so a restart
    // under a configured `worker.name` would stall; its id is unique per process instead.
    let name = format!("{}-q-{}", shared.worker_name, ulid::Ulid::generate());
    let concurrency = shared.concurrency;
    WorkerBuilder::new(name)
        .backend(queue.poll_with_stream(wake))
        .data(shared)
        .concurrency(concurrency)
        .build(deliver)
        .run_until(async move {
            stop.cancelled_owned().await;
            Ok::<(), std::io::Error>(())
        })
        .await
        .map_err(|e| format!("queue worker stopped: {e}"))
}

async fn deliver(task: RunTask, shared: Data<Arc<Shared>>) -> Result<(), BoxDynError> {
    let shared: Arc<Shared> = (*shared).clone();
    // Waiting for a slot holds no drain pass: a closed gate ends the wait, and the run stays
    // queued for the next start.
    tokio::select! {
        slot = shared.executors.slot() => {
            if let Some(slot) = slot {
                shared.executors.submit(task.run_id, slot);
            }
        }
        () = shared.gate.closed() => {}
    }
    Ok(())
}
