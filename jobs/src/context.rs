//! What a target is handed: the [`Targets`] interface the engine calls once per run, and the
//! [`RunContext`] — the run, its [`JobSnapshot`], cancellation, and the run's durable records
//! (checkpoints, workflow steps, agent calls) through the store.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use opentelemetry::context::FutureExt as _;
use tokio_util::sync::CancellationToken;

use lamplighter_plugins::{ActionContext, ActionError, Registry};

use crate::catalog::Catalog;
use crate::clock::Clock;
use crate::events::{Cancelled, Ended, Observer, Op, RunRef};
use crate::run::{CallRecord, Outcome, Run, StepRecord};
use crate::snapshot::JobSnapshot;
use crate::store::{Records, StoreError};

/// Runs targets. The engine calls it once per run, on its own task; a panic in it fails that
/// run and nothing else.
pub trait Targets: Send + Sync + 'static {
    fn run(&self, ctx: RunContext) -> BoxFuture<'static, Outcome>;
}

/// Everything a target gets: its run, the job as it was when the run was created, a
/// cancellation token (cancelled on cancel, replace, timeout and shutdown), and durable
/// checkpoints shared by every attempt of the run.
#[derive(Clone)]
pub struct RunContext {
    run: Run,
    job: Arc<JobSnapshot>,
    cancel: CancellationToken,
    env: RunEnv,
    output: Arc<crate::live::LiveOutput>,
}

/// What every run of an engine shares: the data directory, the store, the clock, the agent
/// catalog in force and where events go.
#[derive(Clone)]
pub(crate) struct RunEnv {
    pub(crate) data_dir: PathBuf,
    pub(crate) records: Arc<dyn Records>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) agents: Arc<Catalog>,
    pub(crate) observer: Arc<Observer>,
    /// Tells followers of the run (resource subscriptions) that it recorded progress.
    pub(crate) signals: Arc<dyn crate::signals::Signals>,
}

impl std::fmt::Debug for RunContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunContext").field("run", &self.run.id).field("job", &self.job).finish_non_exhaustive()
    }
}

impl RunContext {
    /// `resumed`: the run executed before (it waited for a decision, and goes on).
    pub(crate) fn new(run: Run, resumed: bool, job: Arc<JobSnapshot>, cancel: CancellationToken, env: RunEnv) -> Self {
        let output = crate::live::LiveOutput::new(&run.id, resumed, env.records.clone(), env.signals.clone(), cancel.clone());
        Self { run, job, cancel, env, output }
    }

    /// The run's live output log: its plugin actions' commands print into it.
    pub(crate) fn output(&self) -> &Arc<crate::live::LiveOutput> {
        &self.output
    }

    /// Where this run's events go.
    pub fn observer(&self) -> &Arc<Observer> {
        &self.env.observer
    }

    /// Calls a plugin action for this run, as an operation: its span, its metrics (fuel
    /// included) and its hooks; a `before` or `around` hook that cancels refuses the call, and
    /// an `around` hook may replace its parameters.
    pub(crate) async fn invoke(
        &self,
        registry: &Registry,
        plugin: &str,
        action: &str,
        params: serde_json::Value,
        actx: &ActionContext,
    ) -> Result<serde_json::Value, ActionError> {
        let op = Op::PluginAction { plugin: plugin.to_string(), action: action.to_string() };
        let (started, params) = match self.env.observer.begin_with(op, RunRef::from(&self.run), None, params).await {
            Ok(s) => s,
            Err(Cancelled(reason)) => return Err(ActionError::Refused { action: format!("{plugin}.{action}"), reason }),
        };
        let result = registry.invoke(plugin, action, params, actx).with_context(started.context()).await;
        let error = result.as_ref().err().map(ToString::to_string);
        started.end(&self.env.observer, Ended { error: error.as_deref(), fuel: actx.usage.fuel(), ..Ended::ok() }).await;
        result
    }

    pub fn run(&self) -> &Run {
        &self.run
    }

    pub fn job(&self) -> &JobSnapshot {
        &self.job
    }

    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The job's `working_directory`, or the data directory.
    pub fn working_directory(&self) -> PathBuf {
        self.job.working_directory.clone().unwrap_or_else(|| self.env.data_dir.clone())
    }

    /// The value recorded under `step` by this attempt or an earlier one of the same run.
    pub async fn checkpoint(&self, step: &str) -> Result<Option<serde_json::Value>, StoreError> {
        self.env.records.checkpoint(&self.run.root_id, step).await
    }

    /// Records `value` under `step` for this run and every later attempt of it (replacing an
    /// earlier value). Durable when this returns.
    pub async fn record_checkpoint(&self, step: &str, value: &serde_json::Value) -> Result<(), StoreError> {
        self.durably("a checkpoint", || {
            self.env.records.record_checkpoint(&self.run.root_id, step, &self.run.id, value, self.env.clock.now())
        })
        .await
    }

    async fn durably<F, W>(&self, what: &str, write: W) -> Result<(), StoreError>
    where
        W: FnMut() -> F,
        F: std::future::Future<Output = Result<(), StoreError>>,
    {
        durably(&self.run.id, &self.cancel, what, write).await
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.env.clock
    }

    /// The workflow steps recorded by this attempt or an earlier one.
    pub(crate) async fn steps(&self) -> Result<Vec<StepRecord>, StoreError> {
        self.env.records.steps(&self.run.root_id).await
    }

    /// Records workflow steps for this run identity; durable when this returns.
    pub(crate) async fn record_steps(&self, steps: &[StepRecord]) -> Result<(), StoreError> {
        self.durably("workflow steps", || self.env.records.record_steps(&self.run.root_id, steps)).await?;
        self.env.signals.publish(crate::signals::Signal::RunProgress(self.run.id.clone()));
        Ok(())
    }

    /// A workflow step's limits are no longer held: their slots are given back (the run keeps
    /// `kept`, its job's own), durable when this returns; the runs waiting for them are looked
    /// for at once.
    pub(crate) async fn release_limits(&self, kept: &[crate::limits::Pool], freed: &[crate::limits::Pool]) -> Result<(), StoreError> {
        self.durably("the release of a step's limits", || self.env.records.release_limits(&self.run.id, kept, freed)).await?;
        self.env.signals.publish(crate::signals::Signal::Wake);
        Ok(())
    }

    /// The agent calls recorded by this attempt or an earlier one.
    pub(crate) async fn calls(&self) -> Result<Vec<CallRecord>, StoreError> {
        self.env.records.calls(&self.run.root_id).await
    }

    /// Records an agent call for this run identity; durable when this returns.
    pub(crate) async fn record_call(&self, call: &CallRecord) -> Result<(), StoreError> {
        self.durably("an agent call", || self.env.records.record_call(&self.run.root_id, call)).await?;
        // Followers show each model and tool call as it returns.
        self.env.signals.publish(crate::signals::Signal::RunProgress(self.run.id.clone()));
        Ok(())
    }

    /// The agents of the config in force when the run started.
    pub(crate) fn agents(&self) -> &Arc<Catalog> {
        &self.env.agents
    }
}

/// Runs a record's write until it goes through. A storage fault or an unreachable database (a
/// full disk, a server restarting) is waited out, as a run's end is: the run keeps what it has
/// done meanwhile. A fence's refusal, any other error, or the run being stopped (`cancel`)
/// ends the wait with the error.
async fn durably<F, W>(run: &str, cancel: &CancellationToken, what: &str, write: W) -> Result<(), StoreError>
where
    W: FnMut() -> F,
    F: std::future::Future<Output = Result<(), StoreError>>,
{
    let heals = |e: &StoreError, attempt: u32| {
        let heals = !e.is_fenced() && e.is_transient();
        if heals && (attempt == 1 || attempt.is_multiple_of(10)) {
            tracing::warn!(run, attempt, error = %e, "cannot record {what}; retrying");
        }
        heals
    };
    retry_write(cancel, heals, write).await.map(|_| ())
}

/// Tries `write` until it goes through, waiting 100 ms longer after each failure (up to 5 s).
/// `heals` is told of each error and its attempt (from 1), and says whether to try again; the
/// last error is returned when it says no or `stop` fires. Returns the value and the attempts.
pub(crate) async fn retry_write<T, F, W>(
    stop: &CancellationToken,
    mut heals: impl FnMut(&StoreError, u32) -> bool,
    mut write: W,
) -> Result<(T, u32), StoreError>
where
    W: FnMut() -> F,
    F: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let e = match write().await {
            Ok(v) => return Ok((v, attempt)),
            Err(e) => e,
        };
        if !heals(&e, attempt) {
            return Err(e);
        }
        let backoff = std::time::Duration::from_millis(100 * u64::from(attempt.min(50)));
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.cancelled() => return Err(e),
        }
    }
}

/// Makes a plugin action's working directory if it is not there yet ([`lamplighter_plugins::make_dir`]);
/// the error says which and why. Every plugin run, step and agent tool call passes here.
pub(crate) fn make_working_directory(dir: &Path) -> Result<(), String> {
    lamplighter_plugins::make_dir(dir).map_err(|e| format!("cannot create working directory {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> StoreError {
        StoreError::new("recording", sqlx::Error::Io(std::io::Error::other("connection reset")))
    }

    /// A record waits out an unreachable database, but never a fence's refusal, an error that
    /// will not heal, or a stop.
    #[tokio::test(start_paused = true)]
    async fn a_record_waits_out_a_fault_that_heals_and_nothing_else() {
        let cancel = CancellationToken::new();
        let tries = std::sync::atomic::AtomicU32::new(0);
        let flaky = || async { if tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 3 { Err(io()) } else { Ok(()) } };
        durably("r", &cancel, "a step", flaky).await.expect("recorded once the database answers");
        assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 4);

        for (e, why) in [(StoreError::fenced("r"), "fenced"), (StoreError::new("x", sqlx::Error::RowNotFound), "not transient")] {
            let once = std::sync::atomic::AtomicU32::new(0);
            let err = std::sync::Mutex::new(Some(e));
            let write = || async {
                once.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Err(err.lock().unwrap().take().expect("called once"))
            };
            assert!(durably("r", &cancel, "a step", write).await.is_err(), "{why}");
            assert_eq!(once.load(std::sync::atomic::Ordering::SeqCst), 1, "{why}: not retried");
        }

        cancel.cancel();
        let failing = || async { Err(io()) };
        assert!(durably("r", &cancel, "a step", failing).await.is_err(), "a stopped run stops waiting");
    }
}
