//! The built-in targets: plugin actions through the registry, workflows through
//! [`crate::workflow`], agents through [`crate::agent`]. The dispatcher only: what a target is
//! handed is in [`crate::context`], what a run was created to do in [`crate::snapshot`].

use std::sync::Arc;

use futures::future::BoxFuture;

use lamplighter_plugins::{ActionContext, ActionError, Registry};

use crate::agent::{AgentEnd, AgentRuntime, Session, input_text};
use crate::context::{RunContext, Targets};
use crate::run::Outcome;
use crate::snapshot::TargetRef;

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
                        output: Some(ctx.output().sink()),
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
