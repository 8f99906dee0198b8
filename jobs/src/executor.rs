//! Execution: the apalis worker that takes runs off the queue and runs their target with a
//! [`RunContext`], the job's timeout and cancellation; the run's end and its retry are decided
//! by `decide` (apalis gets one attempt per task; its own retry has no backoff).

use std::sync::Arc;
use std::time::Duration;

use apalis::prelude::*;
use apalis_sqlite::{Config as QueueConfig, SqliteStorage};
use futures::channel::mpsc;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::decide::{StopReason, next_attempt, settle};
use crate::engine::Shared;
use crate::run::{Run, RunStatus};
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

/// Runs the apalis worker until `stop` is cancelled; in-flight runs are handled by the engine's
/// drain before this returns.
pub(crate) async fn run_worker(
    shared: Arc<Shared>,
    queue: Queue,
    wake: mpsc::UnboundedReceiver<()>,
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
        .build(handle)
        .run_until(async move {
            stop.cancelled_owned().await;
            Ok::<(), std::io::Error>(())
        })
        .await
        .map_err(|e| format!("queue worker stopped: {e}"))
}

async fn handle(task: RunTask, shared: Data<Arc<Shared>>) -> Result<(), BoxDynError> {
    let shared: Arc<Shared> = (*shared).clone();
    // Past the gate before the claim, and holding the pass until the end is recorded: a drain
    // that finds no pass out has nothing left to record. Once the gate is closed the run is
    // not claimed; it stays queued for the next start.
    let Some(_pass) = shared.gate.enter() else {
        return Ok(());
    };
    // The run executes in its own task: a panic there fails the run, not the worker.
    let id = task.run_id.clone();
    let s = shared.clone();
    let res = tokio::spawn(async move { execute(s, &task.run_id).await }).await;
    if let Err(e) = res {
        let now = shared.clock.now();
        let why = format!("the run panicked: {e}");
        match shared.store.finish(&id, RunStatus::Failed, None, Some(&why), now).await {
            Ok(_) => tracing::error!(run = %id, "{why}"),
            Err(e) => tracing::error!(run = %id, error = %e, "cannot record a panicked run"),
        }
        // Its slot is freed whatever the store said.
        shared.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        shared.run_finished(&id);
    }
    Ok(())
}

async fn execute(shared: Arc<Shared>, run_id: &str) {
    let now = shared.clock.now();
    let (run, snapshot) = match shared.store.claim(run_id, &shared.worker_name, now).await {
        Ok(Some(claimed)) => claimed,
        Ok(None) => return, // cancelled while queued, or already taken
        Err(e) => {
            tracing::error!(run = run_id, error = %e, "cannot claim run");
            return;
        }
    };
    let entry = Arc::new(Running { token: CancellationToken::new(), reason: std::sync::Mutex::new(None) });
    shared.running.lock().unwrap_or_else(|e| e.into_inner()).insert(run_id.to_string(), entry.clone());
    tracing::info!(run = run_id, job = %run.job, trigger = run.trigger.as_str(), attempt = run.attempt, lateness_ms = run.lateness().map(|d| d.num_milliseconds()), "run started");

    // The job as it was when the run was created; rows from before snapshots use the config
    // in force.
    let snapshot = snapshot.or_else(|| shared.job(&run.job).map(|j| JobSnapshot::of(&j)));
    let outcome = match snapshot {
        None => Some(crate::run::Outcome::permanent(format!("job \"{}\" is no longer defined", run.job))),
        Some(job) => {
            let job = Arc::new(job);
            let ctx = RunContext::new(
                run.clone(),
                job.clone(),
                entry.token.clone(),
                shared.data_dir(),
                shared.store.clone(),
                shared.clock.clone(),
            );
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
    let end = settle(outcome, stop);
    let now = shared.clock.now();
    if let Err(e) = shared.store.finish(run_id, end.status, end.output.as_ref(), end.error.as_deref(), now).await {
        tracing::error!(run = run_id, error = %e, "cannot record the end of a run");
    }
    // Only now, with the end recorded, does the run leave the running map.
    shared.running.lock().unwrap_or_else(|e| e.into_inner()).remove(run_id);
    tracing::info!(run = run_id, job = %run.job, status = end.status.as_str(), error = end.error.as_deref().unwrap_or(""), "run finished");
    if end.retry {
        schedule_retry(&shared, &run, now).await;
    }
    shared.prune_soon(&run.job);
    shared.run_finished(run_id);
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
