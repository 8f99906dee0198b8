//! What a run executes: the [`Targets`] interface, the [`RunContext`] every target is handed,
//! and the built-in targets (plugin actions and workflows; agents fail loudly until their
//! runner lands).

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use opentelemetry::context::FutureExt as _;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use lamplighter_config::{Budget, JobConfig, Target, Workflow};
use lamplighter_plugins::{ActionContext, ActionError, Registry};

use crate::agent::{AgentEnd, AgentRuntime, Catalog, Session, input_text};
use crate::clock::Clock;
use crate::events::{Cancelled, Ended, Observer, Op, Owner};
use crate::run::{CallRecord, Outcome, Run, StepRecord};
use crate::store::{RunStore, StoreError};

/// Runs targets. The engine calls it once per run, on its own task; a panic in it fails that
/// run and nothing else.
pub trait Targets: Send + Sync + 'static {
    fn run(&self, ctx: RunContext) -> BoxFuture<'static, Outcome>;
}

/// What a job ran, as it was when the run was created: stored with the run, so a reload
/// between creation and execution (or between two attempts) never mixes two configs in one
/// run. Input and parameters are on the run itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSnapshot {
    pub target: TargetRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_directory: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_commands: Vec<String>,
    /// The job's `budget` (over the agents' own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
}

/// A job's target, by name; a workflow with its definition, so that every attempt of a run
/// (and a run resumed after an approval or a restart) follows the steps it started with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TargetRef {
    Plugin {
        plugin: String,
        action: String,
    },
    Workflow {
        workflow: String,
        /// `None` in runs stored before definitions were: those follow the config in force.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        definition: Option<Arc<Workflow>>,
    },
    Agent {
        agent: String,
    },
}

impl JobSnapshot {
    /// `workflow`: the definition of the workflow the job runs, if it runs one.
    pub fn of(job: &JobConfig, workflow: Option<&Arc<Workflow>>) -> Self {
        Self {
            target: match &job.target {
                Target::Plugin { plugin, action } => TargetRef::Plugin { plugin: plugin.clone(), action: action.clone() },
                Target::Workflow(w) => TargetRef::Workflow { workflow: w.clone(), definition: workflow.cloned() },
                Target::Agent(a) => TargetRef::Agent { agent: a.clone() },
            },
            timeout_ms: job.timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            working_directory: job.working_directory.clone(),
            allowed_commands: job.allowed_commands.clone(),
            budget: (job.budget != Budget::default()).then_some(job.budget),
        }
    }

    pub fn timeout(&self) -> Option<std::time::Duration> {
        self.timeout_ms.map(std::time::Duration::from_millis)
    }
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
}

/// What every run of an engine shares: the data directory, the store, the clock, the agent
/// catalog in force and where events go.
#[derive(Clone)]
pub(crate) struct RunEnv {
    pub(crate) data_dir: PathBuf,
    pub(crate) store: Arc<dyn RunStore>,
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
    pub(crate) fn new(run: Run, job: Arc<JobSnapshot>, cancel: CancellationToken, env: RunEnv) -> Self {
        Self { run, job, cancel, env }
    }

    /// Where this run's events go.
    pub fn observer(&self) -> &Arc<Observer> {
        &self.env.observer
    }

    /// Calls a plugin action for this run, as an operation: its span, its metrics (fuel
    /// included) and its hooks; a `before` hook that cancels refuses the call.
    pub(crate) async fn invoke(
        &self,
        registry: &Registry,
        plugin: &str,
        action: &str,
        params: serde_json::Value,
        actx: &ActionContext,
    ) -> Result<serde_json::Value, ActionError> {
        let op = Op::PluginAction { plugin: plugin.to_string(), action: action.to_string() };
        let started = match self.env.observer.begin(op, Owner::from(&self.run), None).await {
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
        self.env.store.checkpoint(&self.run.root_id, step).await
    }

    /// Records `value` under `step` for this run and every later attempt of it (replacing an
    /// earlier value). Durable when this returns.
    pub async fn record_checkpoint(&self, step: &str, value: &serde_json::Value) -> Result<(), StoreError> {
        self.env.store.record_checkpoint(&self.run.root_id, step, &self.run.id, value, self.env.clock.now()).await
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.env.clock
    }

    /// The workflow steps recorded by this attempt or an earlier one.
    pub(crate) async fn steps(&self) -> Result<Vec<StepRecord>, StoreError> {
        self.env.store.steps(&self.run.root_id).await
    }

    /// Records workflow steps for this run identity; durable when this returns.
    pub(crate) async fn record_steps(&self, steps: &[StepRecord]) -> Result<(), StoreError> {
        self.env.store.record_steps(&self.run.root_id, steps).await?;
        self.env.signals.publish(crate::signals::Signal::RunProgress(self.run.id.clone()));
        Ok(())
    }

    /// The agent calls recorded by this attempt or an earlier one.
    pub(crate) async fn calls(&self) -> Result<Vec<CallRecord>, StoreError> {
        self.env.store.calls(&self.run.root_id).await
    }

    /// Records an agent call for this run identity; durable when this returns.
    pub(crate) async fn record_call(&self, call: &CallRecord) -> Result<(), StoreError> {
        self.env.store.record_call(&self.run.root_id, call).await
    }

    /// The agents of the config in force when the run started.
    pub(crate) fn agents(&self) -> &Arc<Catalog> {
        &self.env.agents
    }
}

/// Plugin actions through the registry, workflows through [`crate::workflow`], agents through
/// [`crate::agent`].
#[derive(Debug)]
pub struct BuiltinTargets {
    registry: Arc<Registry>,
    agents: Arc<AgentRuntime>,
}

impl BuiltinTargets {
    pub fn new(registry: Arc<Registry>) -> Self {
        Self { registry, agents: Arc::new(AgentRuntime::new()) }
    }

    /// Stops what agents started (MCP servers); call after running work drained.
    pub async fn shutdown(&self) {
        self.agents.shutdown().await;
    }
}

impl Targets for BuiltinTargets {
    fn run(&self, ctx: RunContext) -> BoxFuture<'static, Outcome> {
        let registry = self.registry.clone();
        let agents = self.agents.clone();
        Box::pin(async move {
            match ctx.job().target.clone() {
                TargetRef::Plugin { plugin, action } => {
                    let dir = ctx.working_directory();
                    if let Err(e) = std::fs::create_dir_all(&dir) {
                        return Outcome::failed(format!("cannot create working directory {}: {e}", dir.display()));
                    }
                    let actx = ActionContext {
                        working_directory: dir,
                        allowed_commands: ctx.job().allowed_commands.clone(),
                        cancel: ctx.cancelled().clone(),
                        usage: Default::default(),
                    };
                    let params = ctx.run().parameters.clone().unwrap_or_else(|| serde_json::json!({}));
                    match ctx.invoke(&registry, &plugin, &action, params, &actx).await {
                        Ok(output) => Outcome::Succeeded { output },
                        Err(e @ ActionError::Timeout { .. }) => Outcome::TimedOut { error: e.to_string() },
                        Err(e) => Outcome::Failed { retry: !e.is_permanent(), error: e.to_string() },
                    }
                }
                TargetRef::Workflow { workflow, definition } => match definition {
                    Some(definition) => crate::workflow::run(ctx, definition, registry, agents).await,
                    None => Outcome::permanent(format!("workflow \"{workflow}\" is no longer defined")),
                },
                TargetRef::Agent { agent } => {
                    let input = input_text(ctx.run().input.as_ref());
                    let cancel = ctx.cancelled().clone();
                    let session = match Session::open(ctx, agents, registry).await {
                        Ok(s) => s,
                        Err(e) => return Outcome::failed(e),
                    };
                    match session.converse(&agent, input, String::new(), 0, &cancel).await {
                        AgentEnd::Answer(a) => Outcome::Succeeded { output: serde_json::Value::String(a) },
                        AgentEnd::Waiting => Outcome::Waiting { until: None },
                        AgentEnd::Failed { error, retry } => Outcome::Failed { error, retry },
                    }
                }
            }
        })
    }
}
