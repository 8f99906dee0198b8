//! The built-in targets: plugin actions through the registry, workflows through
//! [`crate::workflow`], agents through [`crate::agent`]. The dispatcher only: what a target is
//! handed is in [`crate::context`], what a run was created to do in [`crate::snapshot`].

use std::sync::Arc;

use futures::future::BoxFuture;

use lamplighter_plugins::{ActionContext, ActionError, Registry};

use crate::agent::{AgentRuntime, RunHost, Session, Stopped, input_text};
use crate::context::{RunContext, Targets};
use crate::events::{Cancelled, Ended, Op, RunRef};
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
                    if let Err(e) = crate::context::make_working_directory(&dir) {
                        return Outcome::failed(e);
                    }
                    let actx = ActionContext {
                        working_directory: dir,
                        allowed_commands: ctx.job().allowed_commands.to_vec(),
                        cancel: ctx.cancelled().clone(),
                        usage: Default::default(),
                        output: Some(ctx.output().sink()),
                        host: registry.is_wasm(&plugin).then(|| RunHost::for_run(&ctx, &agents)),
                    };
                    let params = ctx.run().parameters.clone().unwrap_or_else(|| serde_json::json!({}));
                    match ctx.invoke(&registry, &plugin, &action, params, &actx).await {
                        Ok(output) => Outcome::Succeeded { output },
                        Err(e @ ActionError::Timeout { .. }) => Outcome::TimedOut { error: e.to_string() },
                        Err(e) => Outcome::Failed { retry: !e.is_permanent(), error: e.to_string() },
                    }
                }
                TargetRef::Workflow { workflow, definition } => match definition {
                    Some(definition) => Box::pin(crate::workflow::run(ctx, definition, registry, agents)).await,
                    None => Outcome::permanent(format!("workflow \"{workflow}\" is no longer defined")),
                },
                // Boxed, so that a plugin action's run does not carry an agent's state.
                TargetRef::Agent { agent } => Box::pin(relay(ctx, agents, registry, Relay::Agent(agent))).await,
                TargetRef::Pipeline { pipeline, agents: steps } => {
                    Box::pin(relay(ctx, agents, registry, Relay::Pipeline { pipeline, steps })).await
                }
                TargetRef::GroupChat { agents: members, rounds } => {
                    Box::pin(relay(ctx, agents, registry, Relay::Chat { members, rounds })).await
                }
            }
        })
    }
}

/// What a run of agents is: one agent, a pipeline, or a group chat.
enum Relay {
    Agent(String),
    Pipeline { pipeline: String, steps: Vec<String> },
    Chat { members: Vec<String>, rounds: u32 },
}

/// Runs agents on the run's input, each turn a conversation of its own (an agent alone is the
/// conversation `""`; a pipeline's steps `step-N:agent`; a chat's turns `round-R.N:agent`), each
/// given the previous answer. A group chat is the `orchestration:group-chat` operation (hooks).
async fn relay(ctx: RunContext, runtime: Arc<AgentRuntime>, registry: Arc<Registry>, what: Relay) -> Outcome {
    let input = input_text(ctx.run().input.as_ref());
    let cancel = ctx.cancelled().clone();
    let obs = ctx.observer().clone();
    let run = ctx.run().clone();
    let owner = RunRef::from(&run);
    let turns: Vec<(String, String)> = match &what {
        Relay::Agent(a) => vec![(a.clone(), String::new())],
        Relay::Pipeline { steps, .. } => steps.iter().enumerate().map(|(i, a)| (a.clone(), format!("step-{}:{a}", i + 1))).collect(),
        Relay::Chat { members, rounds } => (1..=(*rounds).max(1))
            .flat_map(|r| members.iter().enumerate().map(move |(i, a)| (a.clone(), format!("round-{r}.{}:{a}", i + 1))))
            .collect(),
    };
    let session = match Session::open(ctx, runtime, registry).await {
        Ok(s) => s,
        Err(e) => return Outcome::failed(e),
    };
    let chat = match &what {
        Relay::Chat { members, .. } => match obs.begin(Op::GroupChat { step: String::new(), agents: members.clone() }, owner, None).await {
            Ok(c) => Some(c),
            Err(Cancelled(why)) => return Outcome::permanent(format!("the group chat was not started: {why}")),
        },
        _ => None,
    };
    let borrowed: Vec<(&str, String)> = turns.iter().map(|(a, c)| (a.as_str(), c.clone())).collect();
    let end = session.relay(&borrowed, input, 0, &cancel).await;
    let outcome = match end {
        Ok(answer) => Outcome::Succeeded { output: serde_json::Value::String(answer) },
        Err(Stopped::Waiting) => Outcome::Waiting { until: None },
        Err(Stopped::Failed { turn, error, retry }) => {
            let error = match &what {
                Relay::Agent(_) => error,
                Relay::Pipeline { pipeline, .. } => {
                    format!("pipeline \"{pipeline}\" stopped at step {} (agent \"{}\"): {error}", turn + 1, turns[turn].0)
                }
                Relay::Chat { .. } => format!("the group chat stopped at turn {} (agent \"{}\"): {error}", turn + 1, turns[turn].0),
            };
            Outcome::Failed { error, retry }
        }
    };
    if let Some(chat) = chat {
        let ended = match &outcome {
            Outcome::Failed { error, .. } => Ended::failed(error),
            Outcome::Waiting { .. } => Ended { status: Some(crate::run::RunStatus::WaitingApproval), ..Ended::ok() },
            _ => Ended::ok(),
        };
        chat.end(&obs, ended).await;
    }
    outcome
}
