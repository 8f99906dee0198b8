//! Execution: the apalis worker that takes runs off the queue and runs their target, with the
//! job's timeout, cancellation, and retries decided by Lamplighter (apalis gets one attempt
//! per task; its own retry has no backoff).

use std::sync::Arc;
use std::time::Duration;

use apalis::prelude::*;
use apalis_sqlite::{Config as QueueConfig, SqliteStorage};
use futures::channel::mpsc;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use lamplighter_config::Target;
use lamplighter_plugins::{ActionContext, ActionError};

use crate::engine::Shared;
use crate::run::RunStatus;

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

/// Why a running run was stopped from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StopReason {
    Cancelled(String),
    Shutdown,
}

/// One run in progress in this process.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) token: CancellationToken,
    pub(crate) reason: std::sync::Mutex<Option<StopReason>>,
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
    // The run executes in its own task: a panic there fails the run, not the worker.
    let id = task.run_id.clone();
    let s = shared.clone();
    let res = tokio::spawn(async move { execute(s, &task.run_id).await }).await;
    if let Err(e) = res {
        let now = shared.clock.now();
        let _ = shared.store.finish(&id, RunStatus::Failed, None, Some(&format!("the run panicked: {e}")), now).await;
        shared.run_finished(&id);
    }
    Ok(())
}

async fn execute(shared: Arc<Shared>, run_id: &str) {
    let now = shared.clock.now();
    let run = match shared.store.claim(run_id, &shared.worker_name, now).await {
        Ok(Some(run)) => run,
        Ok(None) => return, // cancelled while queued, or already taken
        Err(e) => {
            tracing::error!(run = run_id, error = %e, "cannot claim run");
            return;
        }
    };
    let job = shared.job(&run.job);
    let entry = Arc::new(Running { token: CancellationToken::new(), reason: std::sync::Mutex::new(None) });
    shared.running.lock().unwrap_or_else(|e| e.into_inner()).insert(run_id.to_string(), entry.clone());
    tracing::info!(run = run_id, job = %run.job, trigger = run.trigger.as_str(), lateness_ms = run.lateness().map(|d| d.num_milliseconds()), "run started");

    let outcome: Result<serde_json::Value, (RunStatus, String, bool)> = match &job {
        None => Err((RunStatus::Failed, format!("job \"{}\" is no longer defined", run.job), true)),
        Some(job) => {
            let timeout = job.timeout;
            let fut = run_target(&shared, job, &run, entry.token.clone());
            let timed = async {
                match timeout {
                    Some(t) => match tokio::time::timeout(t, fut).await {
                        Ok(r) => r,
                        Err(_) => {
                            entry.token.cancel();
                            Err((RunStatus::TimedOut, format!("timed out after {}", humantime::format_duration(t)), false))
                        }
                    },
                    None => fut.await,
                }
            };
            tokio::select! {
                r = timed => r,
                _ = entry.token.cancelled() => Err((RunStatus::Cancelled, String::new(), true)),
            }
        }
    };
    shared.running.lock().unwrap_or_else(|e| e.into_inner()).remove(run_id);
    let stop = entry.reason.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let now = shared.clock.now();
    let (status, output, error, permanent) = match (outcome, stop) {
        (_, Some(StopReason::Shutdown)) => {
            (RunStatus::Interrupted, None, Some("the worker shut down before the run finished".to_string()), true)
        }
        (_, Some(StopReason::Cancelled(why))) => (RunStatus::Cancelled, None, Some(why), true),
        (Ok(v), None) => (RunStatus::Succeeded, Some(v), None, true),
        (Err((s, e, permanent)), None) => (s, None, Some(e), permanent),
    };
    if let Err(e) = shared.store.finish(run_id, status, output.as_ref(), error.as_deref(), now).await {
        tracing::error!(run = run_id, error = %e, "cannot record the end of a run");
    }
    tracing::info!(run = run_id, job = %run.job, status = status.as_str(), error = error.as_deref().unwrap_or(""), "run finished");
    if matches!(status, RunStatus::Failed | RunStatus::TimedOut)
        && !permanent
        && let Some(job) = &job
    {
        schedule_retry(&shared, job, &run, now).await;
    }
    if let Some(job) = &job {
        shared.prune_soon(&job.name);
    }
    shared.run_finished(run_id);
}

/// Schedules the next attempt of a failed run after the job's backoff, if its policy allows.
pub(crate) async fn schedule_retry(
    shared: &Shared,
    job: &lamplighter_config::JobConfig,
    run: &crate::Run,
    now: chrono::DateTime<chrono::Utc>,
) {
    let delay = job.retries.delay(run.attempt);
    match shared.follow_up(run, now + chrono::Duration::from_std(delay).unwrap_or_default(), now).await {
        Ok(Some(id)) => tracing::info!(run = %run.id, retry = %id, in_s = delay.as_secs(), "retry scheduled"),
        Ok(None) => {}
        Err(e) => tracing::error!(run = %run.id, error = %e, "cannot schedule a retry"),
    }
    shared.wake_scheduler();
}

async fn run_target(
    shared: &Shared,
    job: &lamplighter_config::JobConfig,
    run: &crate::Run,
    cancel: CancellationToken,
) -> Result<serde_json::Value, (RunStatus, String, bool)> {
    match &job.target {
        Target::Plugin { plugin, action } => {
            let dir = job.working_directory.clone().unwrap_or_else(|| shared.data_dir());
            if let Err(e) = std::fs::create_dir_all(&dir) {
                return Err((RunStatus::Failed, format!("cannot create working directory {}: {e}", dir.display()), false));
            }
            let ctx = ActionContext { working_directory: dir, allowed_commands: job.allowed_commands.clone(), cancel };
            let params = run.parameters.clone().or_else(|| job.parameters.clone()).unwrap_or_else(|| serde_json::json!({}));
            shared.registry.invoke(plugin, action, params, &ctx).await.map_err(|e| {
                let status = if matches!(e, ActionError::Timeout { .. }) { RunStatus::TimedOut } else { RunStatus::Failed };
                (status, e.to_string(), e.is_permanent())
            })
        }
        Target::Workflow(w) => Err((
            RunStatus::Failed,
            format!(
                "workflow jobs are not supported yet: job \"{}\" runs workflow \"{w}\", and the workflow engine has not landed",
                job.name
            ),
            true,
        )),
        Target::Agent(a) => Err((
            RunStatus::Failed,
            format!("agent jobs are not supported yet: job \"{}\" runs agent \"{a}\", and the agent runner has not landed", job.name),
            true,
        )),
    }
}
