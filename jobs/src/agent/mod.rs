//! The agent runner: one agent's tool loop — model → tool calls → results → model, until a
//! text answer or `max_iters` — durably.
//!
//! Durability is replay of recorded calls. Every model call and every tool call is recorded
//! under the run's identity (`ll_agent_calls`, by conversation and place) as soon as it
//! returns. A conversation that runs again (a retry, a run recovered after a crash, a run
//! resumed after an approval) rebuilds its messages from those records and goes on from the
//! last one: a model call that returned is never made again, a tool call that finished never
//! runs again. A tool call cut off by a crash has no record and runs again.
//!
//! - Tools: the actions of the agent's `plugins` and the tools of its `mcp_servers`, filtered
//!   by `allowed_actions`; with `delegates`, the delegation tools. A tool error, an unknown
//!   tool or arguments that are not JSON go back to the model as the tool's result.
//! - Budgets count the whole run (every conversation in it): tokens, tool calls, cost,
//!   time spent in model and tool calls (waits for a decision do not count). Reaching one fails the run (`budget exceeded: …`),
//!   or with `on_budget: ask` waits for approval (step `agent:budget-N`) to go on with the budget
//!   raised by as much again.
//! - `tool_approval: ask` records the call as a step waiting for approval
//!   (`agent:[<conversation>/]tool-<n>`); a rejection resumes the run and the model is told the call
//!   was refused. `deny` tells the model at once.

mod budget;
mod host;
mod mcp;
mod model;
pub(crate) use model::connection_error;
mod replay;
mod skills;
mod tools;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use lamplighter_config::{Agent, ApprovalMode, Budget, OnBudget, Provider, SystemPrompt};
use lamplighter_plugins::{ActionContext, Registry};

use opentelemetry::context::FutureExt as _;

use crate::catalog::Catalog;
use crate::context::RunContext;
use crate::events::{Cancelled, Ended, Op, RunRef};
use crate::run::{AgentUsage, CallKind, CallRecord, StepRecord, StepStatus};

use budget::{BudgetCheck, over_budget};
use model::{CallFailed, Endpoint, Limiter, Reply, ToolCall, ToolSpec};
use replay::{Next, Replay, replay, reply_of, unique_call_ids};
use tools::{Delegation, Source, Toolbox};

pub(crate) use host::RunHost;

/// Agent waits are steps of the run named `agent:…` (`agent:budget-N`, `agent:[conv/]tool-N`);
/// workflow step ids may not contain `:`, so the two never meet.
const AGENT_WAIT: &str = "agent:";
const BUDGET_WAIT: &str = "agent:budget-";

/// How deep agents may delegate to agents.
pub const MAX_DELEGATION_DEPTH: u32 = 3;
/// How long an MCP tool call may take.
const MCP_CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// The most of one tool result the model is given (and the transcript keeps).
const TOOL_RESULT_CAP: usize = 100_000;

/// What agents share across runs and reloads: the HTTP client, each provider's rate limiter,
/// and the MCP servers.
#[derive(Debug)]
pub struct AgentRuntime {
    /// Built at the first model call: a client loads and parses the system's TLS roots, which
    /// a worker without agents should not pay for at start. A build that failed (no roots to
    /// load) fails that model call with why, never the process, and is tried again at the next.
    http: OnceLock<reqwest::Client>,
    limiters: Mutex<HashMap<String, Arc<Limiter>>>,
    mcp: mcp::McpPool,
}

impl Default for AgentRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentRuntime {
    /// The HTTP client of model calls, built at the first.
    fn http(&self) -> Result<&reqwest::Client, String> {
        if let Some(client) = self.http.get() {
            return Ok(client);
        }
        let client = reqwest::Client::builder().build().map_err(|e| e.to_string())?;
        Ok(self.http.get_or_init(|| client))
    }

    pub fn new() -> Self {
        Self { http: OnceLock::new(), limiters: Mutex::default(), mcp: mcp::McpPool::default() }
    }

    /// Stops the MCP servers (at shutdown, after running work drained).
    pub async fn shutdown(&self) {
        self.mcp.shutdown().await;
    }

    fn limiter(&self, provider: &Provider) -> Arc<Limiter> {
        let mut l = self.limiters.lock().unwrap_or_else(|e| e.into_inner());
        let entry = l.entry(provider.name.clone()).or_insert_with(|| Arc::new(Limiter::new(provider.rate_limit)));
        if entry.limit() != provider.rate_limit {
            *entry = Arc::new(Limiter::new(provider.rate_limit));
        }
        entry.clone()
    }
}

/// How a conversation ended.
#[derive(Debug)]
pub(crate) enum AgentEnd {
    Answer(String),
    /// Waits for a decision (a tool call or more budget).
    Waiting,
    Failed {
        error: String,
        retry: bool,
    },
}

impl AgentEnd {
    fn failed(error: String, retry: bool) -> Self {
        AgentEnd::Failed { error, retry }
    }
}

/// Why a relay of conversations stopped before its last answer.
pub(crate) enum Stopped {
    /// A turn waits for a decision.
    Waiting,
    /// Turn `turn` (from 0) failed.
    Failed { turn: usize, error: String, retry: bool },
}

/// The agent side of one run: its recorded calls and approval steps, and what it needs to make
/// more. Shared by every conversation of the run (a workflow's agent steps, delegations).
pub(crate) struct Session {
    ctx: RunContext,
    runtime: Arc<AgentRuntime>,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
    /// Every call recorded for the run identity; appended as calls are recorded. Never locked
    /// across an `.await`.
    calls: Mutex<Vec<CallRecord>>,
    /// The run's steps that agents wait on (tool approvals, budget asks), by id.
    steps: Mutex<HashMap<String, StepRecord>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("run", &self.ctx.run().id).finish_non_exhaustive()
    }
}

impl Session {
    /// Reads what earlier attempts of the run recorded.
    pub(crate) async fn open(ctx: RunContext, runtime: Arc<AgentRuntime>, registry: Arc<Registry>) -> Result<Self, String> {
        let calls = ctx.calls().await.map_err(|e| format!("cannot read the recorded agent calls of the run: {e}"))?;
        let steps = ctx.steps().await.map_err(|e| format!("cannot read the recorded steps of the run: {e}"))?;
        let catalog = ctx.agents().clone();
        Ok(Self {
            ctx,
            runtime,
            registry,
            catalog,
            calls: Mutex::new(calls),
            steps: Mutex::new(steps.into_iter().map(|s| (s.step.clone(), s)).collect()),
        })
    }

    fn now(&self) -> DateTime<Utc> {
        self.ctx.clock().now()
    }

    fn conversation(&self, conv: &str) -> Vec<CallRecord> {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let mut mine: Vec<CallRecord> = calls.iter().filter(|c| c.conversation == conv).cloned().collect();
        mine.sort_by_key(|c| c.seq);
        mine
    }

    async fn record(&self, call: CallRecord) -> Result<(), AgentEnd> {
        self.ctx
            .record_call(&call)
            .await
            .map_err(|e| AgentEnd::failed(format!("cannot record {} call {}: {e}", call.kind.as_str(), call.name), true))?;
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        calls.retain(|c| !(c.conversation == call.conversation && c.seq == call.seq));
        calls.push(call);
        Ok(())
    }

    async fn write_step(&self, record: StepRecord) -> Result<(), AgentEnd> {
        self.ctx
            .record_steps(std::slice::from_ref(&record))
            .await
            .map_err(|e| AgentEnd::failed(format!("cannot record step {}: {e}", record.step), true))?;
        self.steps.lock().unwrap_or_else(|e| e.into_inner()).insert(record.step.clone(), record);
        Ok(())
    }

    /// Records a new wait for a decision, as step `id` of the run.
    async fn wait_on(&self, id: &str, output: Value, resumes_on_reject: bool) -> Result<(), AgentEnd> {
        let mut record = crate::run::step_record(self.ctx.run(), id, StepStatus::WaitingApproval, Some(self.now()));
        record.output = Some(output);
        record.resumes_on_reject = resumes_on_reject;
        self.write_step(record).await?;
        self.ctx.observer().approval_requested(self.ctx.run(), id);
        Ok(())
    }

    /// A wait recorded by an earlier attempt goes on for this one (a decision finds a wait by
    /// the run it belongs to).
    async fn still_waiting(&self, waiting: StepRecord) -> Result<(), AgentEnd> {
        let run = self.ctx.run();
        if waiting.run_id == run.id {
            return Ok(());
        }
        self.write_step(StepRecord { run_id: run.id.clone(), attempt: run.attempt, ..waiting }).await
    }

    fn step(&self, id: &str) -> Option<StepRecord> {
        self.steps.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned()
    }

    /// Conversations in turn (`(agent, conversation)`), each given the previous one's answer
    /// (pipelines and group chats, the seed's relay): the last answer, or where it stopped.
    pub(crate) async fn relay(
        &self,
        turns: &[(&str, String)],
        input: String,
        depth: u32,
        cancel: &CancellationToken,
    ) -> Result<String, Stopped> {
        let mut text = input;
        for (turn, (agent, conv)) in turns.iter().enumerate() {
            match self.converse(agent, text, conv.clone(), depth, cancel).await {
                AgentEnd::Answer(a) => text = a,
                AgentEnd::Waiting => return Err(Stopped::Waiting),
                AgentEnd::Failed { error, retry } => return Err(Stopped::Failed { turn, error, retry }),
            }
        }
        Ok(text)
    }

    /// Runs agent `name` on `input` as conversation `conv` (continuing what is recorded under
    /// it), `depth` delegations deep.
    pub(crate) fn converse<'a>(
        &'a self,
        name: &'a str,
        input: String,
        conv: String,
        depth: u32,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, AgentEnd> {
        Box::pin(async move {
            let agent = match self.catalog.agents.get(name) {
                Some(a) => a,
                None => {
                    let known: Vec<&str> = self.catalog.agents.keys().map(String::as_str).collect();
                    return AgentEnd::failed(format!("agent \"{name}\" is not defined (agents: {})", known.join(", ")), false);
                }
            };
            // A conversation that already has its answer needs nothing started or checked.
            if let Some(last) = self.conversation(&conv).into_iter().rev().find(|r| r.kind == CallKind::Model) {
                let (content, calls) = reply_of(&last);
                if calls.is_empty() {
                    return AgentEnd::Answer(content);
                }
            }
            if let Some(why) = self.catalog.disabled.get(name) {
                return AgentEnd::failed(format!("agent \"{name}\" is disabled: {why}"), false);
            }
            let setup = match self.setup(agent, depth).await {
                Ok(s) => s,
                Err(e) => return e,
            };
            let records = self.conversation(&conv);
            let input = match recorded_input(&records) {
                // Resumed: its first message as recorded (a hook may have replaced it).
                Some(recorded) => recorded,
                // New: its session-start hooks may stop it or replace its first message.
                None if records.is_empty() => match self.session_start(agent, &conv, depth, input).await {
                    Ok(input) => input,
                    Err(e) => return e,
                },
                None => input,
            };
            self.tool_loop(agent, &setup, input, conv, depth, cancel).await
        })
    }

    /// A new conversation's `agent:<name>:session-start` operation: its hooks see the first
    /// message (`input`); an `around` hook may replace it, and a cancel stops the conversation.
    async fn session_start(&self, agent: &Agent, conv: &str, depth: u32, input: String) -> Result<String, AgentEnd> {
        let obs = self.ctx.observer();
        let op = Op::SessionStart { agent: agent.name.clone(), conversation: conv.to_string(), depth };
        match obs.begin_with(op, RunRef::from(self.ctx.run()), None, Value::String(input)).await {
            Ok((started, input)) => {
                started.end(obs, Ended::ok()).await;
                Ok(input_text(Some(&input)))
            }
            Err(Cancelled(why)) => {
                Err(AgentEnd::failed(format!("agent \"{}\": the conversation was not started: {why}", agent.name), false))
            }
        }
    }

    /// The endpoint, limiter, tools and system prompt of `agent`.
    async fn setup(&self, agent: &Agent, depth: u32) -> Result<Setup, AgentEnd> {
        let name = &agent.name;
        let Some(resolved) = &agent.resolved else {
            return Err(AgentEnd::failed(format!("agent \"{name}\" has no model it can use"), false));
        };
        let Some(provider) = self.catalog.providers.get(&resolved.provider) else {
            return Err(AgentEnd::failed(format!("agent \"{name}\": provider \"{}\" is not defined", resolved.provider), false));
        };
        let endpoint = Endpoint::new(provider, &resolved.model).map_err(|e| AgentEnd::failed(format!("agent \"{name}\": {e}"), false))?;
        let mut endpoint = endpoint;
        if agent.max_tokens.is_some() {
            endpoint.max_tokens = agent.max_tokens;
        }
        if agent.temperature.is_some() {
            endpoint.temperature = agent.temperature;
        }
        let mut toolbox = Toolbox::default();
        for plugin in &agent.plugins {
            let Some(info) = self.registry.plugins().iter().find(|p| &p.name == plugin) else {
                return Err(AgentEnd::failed(format!("agent \"{name}\" uses plugin \"{plugin}\", which is not loaded"), false));
            };
            if let Some(e) = &info.error {
                return Err(AgentEnd::failed(format!("agent \"{name}\" uses plugin \"{plugin}\", which did not load: {e}"), false));
            }
            for a in &info.actions {
                let source = Source::Plugin { plugin: plugin.clone(), action: a.name.clone() };
                toolbox.add(format!("{plugin}.{}", a.name), a.description.clone(), a.parameters.clone(), source, &agent.allowed_actions);
            }
        }
        for server in &agent.mcp_servers {
            let Some(def) = self.catalog.mcp_servers.get(server) else {
                return Err(AgentEnd::failed(format!("agent \"{name}\" uses MCP server \"{server}\", which is not defined"), false));
            };
            let listed = self.runtime.mcp.tools(server, def).await.map_err(|e| AgentEnd::failed(format!("agent \"{name}\": {e}"), true))?;
            for t in listed {
                let source = Source::Mcp { server: server.clone(), tool: t.name.clone() };
                toolbox.add(format!("{server}.{}", t.name), t.description, t.input_schema, source, &agent.allowed_actions);
            }
        }
        if !agent.delegates.is_empty() && depth < MAX_DELEGATION_DEPTH {
            for (n, d, p, s) in tools::delegation_tools(&agent.delegates, &self.catalog.pipelines) {
                toolbox.add(n, d, p, s, &[]);
            }
        }
        let skills = self.skills_of(agent)?;
        if !skills.is_empty() {
            let (description, schema) = skills::tool(&skills);
            toolbox.add(skills::TOOL.into(), description, schema, Source::Skill, &[]);
        }
        let mut system = match &agent.system_prompt {
            None => None,
            Some(SystemPrompt::Inline(s)) => Some(s.clone()),
            Some(SystemPrompt::File(path)) => Some(std::fs::read_to_string(path).map_err(|e| {
                AgentEnd::failed(format!("agent \"{name}\": cannot read system_prompt_file {}: {e}", path.display()), false)
            })?),
        };
        if !skills.is_empty() {
            let listed = skills::prompt(&skills);
            system = Some(match system {
                Some(s) => format!("{}\n\n{listed}", s.trim_end()),
                None => listed,
            });
        }
        let limiter = self.runtime.limiter(provider);
        let specs = toolbox
            .tools()
            .iter()
            .map(|t| ToolSpec { wire: t.wire.clone(), description: t.description.clone(), parameters: t.parameters.clone() })
            .collect();
        Ok(Setup { endpoint, limiter, toolbox, specs, system, pricing: resolved.model.pricing })
    }

    /// The skills `agent` names (each checked at load; one gone since is a failed run).
    fn skills_of<'c>(&'c self, agent: &Agent) -> Result<Vec<&'c lamplighter_config::Skill>, AgentEnd> {
        agent
            .skills
            .iter()
            .map(|n| {
                self.catalog
                    .skills
                    .get(n)
                    .ok_or_else(|| AgentEnd::failed(format!("agent \"{}\" names skill \"{n}\", which is not defined", agent.name), false))
            })
            .collect()
    }

    async fn tool_loop(&self, agent: &Agent, s: &Setup, input: String, conv: String, depth: u32, cancel: &CancellationToken) -> AgentEnd {
        let name = &agent.name;
        // The span of the model call whose tool calls come next: they are its children.
        let mut model_cx: Option<opentelemetry::Context> = None;
        loop {
            let records = self.conversation(&conv);
            let Replay { messages, model_calls, next } = replay(&records, s.system.as_deref(), &input);
            let next_seq = match next {
                Next::Answer(answer) => return AgentEnd::Answer(answer),
                Next::Tools(owed) => {
                    for (seq, call) in owed {
                        if let Err(end) = self.tool_call(agent, s, &call, &conv, seq, depth, cancel, model_cx.as_ref()).await {
                            return end;
                        }
                    }
                    // The messages are rebuilt with their results.
                    continue;
                }
                Next::Model { seq } => seq,
            };
            if model_calls >= agent.max_iters {
                return AgentEnd::failed(
                    format!("agent \"{name}\" gave no answer within max_iters ({}) model calls", agent.max_iters),
                    false,
                );
            }
            if let Some(end) = self.check_budget(agent, BudgetCheck::ModelCall).await {
                return end;
            }
            if cancel.is_cancelled() {
                return AgentEnd::failed("cancelled".into(), false);
            }
            let http = match self.runtime.http() {
                Ok(http) => http,
                Err(e) => return AgentEnd::failed(format!("agent \"{name}\": cannot make HTTP requests: {e}"), false),
            };
            let started = self.now();
            let obs = self.ctx.observer();
            let op =
                Op::ModelCall { agent: name.clone(), provider: s.endpoint.provider().to_string(), model: s.endpoint.model().to_string() };
            let call = match obs.begin(op, RunRef::from(self.ctx.run()), None).await {
                Ok(c) => c,
                Err(Cancelled(why)) => return AgentEnd::failed(format!("agent \"{name}\": model call not made: {why}"), false),
            };
            let reply = s.endpoint.call(http, &s.limiter, &messages, &s.specs, cancel).with_context(call.context()).await;
            let mut reply = match reply {
                Ok(r) => {
                    let cost = s.pricing.map(|p| p.cost(r.input_tokens, r.output_tokens));
                    let ended = Ended {
                        input_tokens: r.input_tokens,
                        output_tokens: r.output_tokens,
                        cost,
                        prompt: Some(&input),
                        completion: Some(&r.content),
                        ..Ended::ok()
                    };
                    model_cx = Some(call.context());
                    call.end(obs, ended).await;
                    r
                }
                Err(CallFailed { error, retry }) => {
                    call.end(obs, Ended::failed(&error)).await;
                    return AgentEnd::failed(format!("agent \"{name}\": model call failed: {error}"), retry);
                }
            };
            unique_call_ids(&records, &mut reply.calls, next_seq);
            let request = if next_seq == 0 {
                json!({
                    "system": s.system,
                    "input": input,
                    "tools": s.toolbox.tools().iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
                })
            } else {
                json!({ "messages": messages.len() })
            };
            let record = self.model_record(&conv, next_seq, s, started, request, &reply);
            if let Err(e) = self.record(record).await {
                return e;
            }
        }
    }

    fn model_record(&self, conv: &str, seq: u32, s: &Setup, started: DateTime<Utc>, request: Value, reply: &Reply) -> CallRecord {
        let run = self.ctx.run();
        let calls: Vec<Value> = reply
            .calls
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "name": c.name,
                    "tool": s.toolbox.by_wire(&c.name).map(|t| t.name.clone()),
                    "arguments": c.arguments,
                })
            })
            .collect();
        CallRecord {
            conversation: conv.to_string(),
            seq,
            kind: CallKind::Model,
            name: s.endpoint.model().to_string(),
            call_id: None,
            request: Some(request),
            response: Some(json!({
                "content": reply.content,
                "tool_calls": calls,
                "finish_reason": reply.finish_reason,
                "attempts": reply.attempts,
            })),
            error: None,
            input_tokens: reply.input_tokens,
            output_tokens: reply.output_tokens,
            cost: s.pricing.map(|p| p.cost(reply.input_tokens, reply.output_tokens)),
            run_id: run.id.clone(),
            attempt: run.attempt,
            started_at: started,
            finished_at: self.now(),
        }
    }

    /// Runs (or refuses, or asks about) one tool call and records its result.
    #[allow(clippy::too_many_arguments)]
    async fn tool_call(
        &self,
        agent: &Agent,
        s: &Setup,
        call: &ToolCall,
        conv: &str,
        seq: u32,
        depth: u32,
        cancel: &CancellationToken,
        parent: Option<&opentelemetry::Context>,
    ) -> Result<(), AgentEnd> {
        let started = self.now();
        let tool = s.toolbox.by_wire(&call.name);
        let shown = tool.map_or(call.name.clone(), |t| t.name.clone());
        let mut args: Result<Value, String> =
            if call.arguments.trim().is_empty() { Ok(json!({})) } else { serde_json::from_str(&call.arguments).map_err(|e| e.to_string()) };
        // A call that needs a person's approval is asked first, as the model wrote it; once
        // decided, the call (and its hooks) goes on. Nothing runs, and no hook is called, while
        // it waits.
        let approval = match (tool, &args) {
            (Some(t), Ok(a)) if agent.tool_approval.mode_for(&t.name) == ApprovalMode::Ask => {
                match self.ask(agent, &t.name, a, conv, seq).await? {
                    Asked::Waiting => return Err(AgentEnd::Waiting),
                    decided => Some(decided),
                }
            }
            _ => None,
        };
        let obs = self.ctx.observer();
        let op = Op::ToolUse { agent: agent.name.clone(), tool: shown.clone() };
        // Hooks see the arguments; an `around` hook may replace them (what is called and
        // recorded is then its version).
        let given = args.as_ref().map_or(Value::Null, Clone::clone);
        let (op, refused) = match obs.begin_with(op, RunRef::from(self.ctx.run()), parent, given).await {
            Ok((op, replaced)) => {
                if args.as_ref().is_ok_and(|a| *a != replaced) {
                    args = Ok(replaced);
                }
                (Some(op), None)
            }
            Err(Cancelled(why)) => (None, Some(why)),
        };
        let work = async {
            Ok(match (tool, &args, refused) {
                (_, _, Some(why)) => Err(ToolErr::Model(format!("refused: {why}"))),
                (None, _, None) => {
                    let names: Vec<&str> = s.toolbox.tools().iter().map(|t| t.wire.as_str()).collect();
                    Err(ToolErr::Model(format!("there is no tool named \"{}\"; the tools are: {}", call.name, names.join(", "))))
                }
                (Some(_), Err(e), None) => Err(ToolErr::Model(format!("the arguments are not valid JSON ({e}); send a JSON object"))),
                (Some(t), Ok(args), None) => {
                    if let Some(end) = self.check_budget(agent, BudgetCheck::ToolCall).await {
                        return Err(end);
                    }
                    match agent.tool_approval.mode_for(&t.name) {
                        ApprovalMode::Auto => self.invoke(agent, t, args.clone(), conv, seq, depth, cancel).await,
                        ApprovalMode::Deny => {
                            Err(ToolErr::Model(format!("refused: agent \"{}\" may not call {} (tool_approval: deny)", agent.name, t.name)))
                        }
                        ApprovalMode::Ask => match approval {
                            Some(Asked::Approved) => self.invoke(agent, t, args.clone(), conv, seq, depth, cancel).await,
                            Some(Asked::Refused(why)) => Err(ToolErr::Model(why)),
                            Some(Asked::Waiting) | None => return Err(AgentEnd::Waiting),
                        },
                    }
                }
            })
        };
        let result = match &op {
            Some(op) => work.with_context(op.context()).await,
            None => work.await,
        };
        if let Some(op) = op {
            let ended = match &result {
                Ok(Err(ToolErr::Model(e))) => Ended::failed(e),
                Err(AgentEnd::Failed { error, .. }) => Ended::failed(error),
                _ => Ended::ok(),
            };
            op.end(obs, ended).await;
        }
        let result = result?;
        let result = match result {
            Ok(r) => Ok(r),
            // A delegation that waits: nothing is recorded; the call runs again on resume.
            Err(ToolErr::Stop(end)) => return Err(end),
            Err(ToolErr::Model(e)) => Err(e),
        };
        if cancel.is_cancelled() {
            return Err(AgentEnd::failed("cancelled".into(), false));
        }
        let run = self.ctx.run();
        let (text, error) = match result {
            Ok(t) => (cap_text(t), None),
            Err(e) => (cap_text(format!("error: {e}")), Some(e)),
        };
        let record = CallRecord {
            conversation: conv.to_string(),
            seq,
            kind: CallKind::Tool,
            name: shown,
            call_id: Some(call.id.clone()),
            request: Some(args.unwrap_or_else(|_| Value::String(call.arguments.clone()))),
            response: Some(Value::String(text)),
            error,
            input_tokens: 0,
            output_tokens: 0,
            cost: None,
            run_id: run.id.clone(),
            attempt: run.attempt,
            started_at: started,
            finished_at: self.now(),
        };
        self.record(record).await
    }

    /// Calls the tool.
    #[allow(clippy::too_many_arguments)]
    async fn invoke(
        &self,
        agent: &Agent,
        tool: &tools::Tool,
        args: Value,
        conv: &str,
        seq: u32,
        depth: u32,
        cancel: &CancellationToken,
    ) -> Result<String, ToolErr> {
        let model = ToolErr::Model;
        match &tool.source {
            Source::Plugin { plugin, action } => {
                let dir = agent.working_directory.clone().unwrap_or_else(|| self.ctx.working_directory());
                crate::context::make_working_directory(&dir).map_err(model)?;
                let allowed_commands = if agent.allowed_commands.is_empty() {
                    self.ctx.job().allowed_commands.to_vec()
                } else {
                    agent.allowed_commands.clone()
                };
                let actx = ActionContext {
                    working_directory: dir,
                    allowed_commands,
                    cancel: cancel.clone(),
                    usage: Default::default(),
                    output: None,
                    host: self.registry.is_wasm(plugin).then(|| RunHost::for_run(&self.ctx, &self.runtime)),
                };
                match self.ctx.invoke(&self.registry, plugin, action, args, &actx).await {
                    Ok(Value::String(s)) => Ok(s),
                    Ok(v) => Ok(v.to_string()),
                    Err(e) => Err(model(e.to_string())),
                }
            }
            Source::Mcp { server, tool: t } => {
                let Some(def) = self.catalog.mcp_servers.get(server) else {
                    return Err(model(format!("MCP server \"{server}\" is no longer defined")));
                };
                let obs = self.ctx.observer();
                let op = Op::McpCall { server: server.clone(), tool: t.clone() };
                let (call, args) = obs
                    .begin_with(op, RunRef::from(self.ctx.run()), None, args)
                    .await
                    .map_err(|Cancelled(why)| model(format!("refused: {why}")))?;
                let r = self.runtime.mcp.call(server, def, t, args, MCP_CALL_TIMEOUT).with_context(call.context()).await;
                let r = match r {
                    Ok(r) if r.is_error => Err(r.text),
                    Ok(r) => Ok(r.text),
                    Err(e) => Err(e),
                };
                call.end(obs, Ended::of(&r)).await;
                r.map_err(model)
            }
            Source::Delegate(kind) => self.delegate(agent, *kind, &args, conv, seq, depth, cancel).await,
            Source::Skill => {
                let skills = self.skills_of(agent).map_err(ToolErr::Stop)?;
                skills::load(&skills, &args).map_err(model)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn delegate(
        &self,
        agent: &Agent,
        kind: Delegation,
        args: &Value,
        conv: &str,
        seq: u32,
        depth: u32,
        cancel: &CancellationToken,
    ) -> Result<String, ToolErr> {
        let sub = |i: Option<usize>, who: &str| match i {
            None => format!("{conv}/{seq}:{who}"),
            Some(i) => format!("{conv}/{seq}.{i}:{who}"),
        };
        let allowed = |who: &str| -> Result<(), ToolErr> {
            if agent.delegates.iter().any(|d| d == who) {
                Ok(())
            } else {
                Err(ToolErr::Model(format!(
                    "agent \"{}\" may delegate only to {}, not to \"{who}\"",
                    agent.name,
                    agent.delegates.join(", ")
                )))
            }
        };
        let str_arg = |v: &Value, k: &str| {
            v.get(k).and_then(Value::as_str).map(str::to_string).ok_or_else(|| ToolErr::Model(format!("\"{k}\" (a string) is required")))
        };
        let waiting = || ToolErr::Stop(AgentEnd::Waiting);
        match kind {
            Delegation::One => {
                let who = str_arg(args, "agent")?;
                let task = str_arg(args, "task")?;
                allowed(&who)?;
                match self.converse(&who, task, sub(None, &who), depth + 1, cancel).await {
                    AgentEnd::Answer(a) => Ok(a),
                    AgentEnd::Waiting => Err(waiting()),
                    // Unavailable, not refused: nothing is recorded, and a later attempt tries again.
                    AgentEnd::Failed { error, retry: true } => {
                        Err(ToolErr::Stop(AgentEnd::failed(format!("agent \"{who}\" failed: {error}"), true)))
                    }
                    AgentEnd::Failed { error, .. } => Err(ToolErr::Model(format!("agent \"{who}\" failed: {error}"))),
                }
            }
            Delegation::Many => {
                let tasks = args
                    .get("tasks")
                    .and_then(Value::as_array)
                    .ok_or_else(|| ToolErr::Model("\"tasks\" (a list of {agent, task}) is required".into()))?;
                let mut jobs = Vec::new();
                for (i, t) in tasks.iter().enumerate() {
                    let at = |e: ToolErr| match e {
                        ToolErr::Model(m) => ToolErr::Model(format!("tasks[{i}]: {m}")),
                        other => other,
                    };
                    let who = str_arg(t, "agent").map_err(at)?;
                    let task = str_arg(t, "task").map_err(at)?;
                    allowed(&who).map_err(at)?;
                    jobs.push((who, task, i));
                }
                let ends = futures::future::join_all(
                    jobs.iter().map(|(who, task, i)| self.converse(who, task.clone(), sub(Some(*i), who), depth + 1, cancel)),
                )
                .await;
                if ends.iter().any(|e| matches!(e, AgentEnd::Waiting)) {
                    return Err(waiting());
                }
                if let Some((who, error)) = jobs.iter().zip(&ends).find_map(|((who, _, _), e)| match e {
                    AgentEnd::Failed { error, retry: true } => Some((who, error)),
                    _ => None,
                }) {
                    return Err(ToolErr::Stop(AgentEnd::failed(format!("agent \"{who}\" failed: {error}"), true)));
                }
                let labelled: Vec<Value> = jobs
                    .iter()
                    .zip(ends)
                    .map(|((who, _, _), end)| match end {
                        AgentEnd::Answer(a) => json!({"agent": who, "ok": true, "answer": a}),
                        AgentEnd::Failed { error, .. } => json!({"agent": who, "ok": false, "error": error}),
                        AgentEnd::Waiting => Value::Null,
                    })
                    .collect();
                Ok(Value::Array(labelled).to_string())
            }
            Delegation::Pipeline => {
                let name = str_arg(args, "pipeline")?;
                let text = str_arg(args, "input")?;
                let Some(p) = self.catalog.pipelines.get(&name) else {
                    let known: Vec<&str> = self.catalog.pipelines.keys().map(String::as_str).collect();
                    return Err(ToolErr::Model(format!("there is no pipeline \"{name}\" (pipelines: {})", known.join(", "))));
                };
                let turns: Vec<(&str, String)> = p.agents.iter().enumerate().map(|(i, who)| (who.as_str(), sub(Some(i), who))).collect();
                match self.relay(&turns, text, depth + 1, cancel).await {
                    Ok(answer) => Ok(answer),
                    Err(Stopped::Waiting) => Err(waiting()),
                    Err(Stopped::Failed { turn, error, retry }) => {
                        let error = format!("pipeline \"{name}\" stopped at step {} (agent \"{}\"): {error}", turn + 1, turns[turn].0);
                        // Retryable: the run fails and is tried again; otherwise the model is told.
                        Err(if retry { ToolErr::Stop(AgentEnd::failed(error, true)) } else { ToolErr::Model(error) })
                    }
                }
            }
        }
    }

    /// `tool_approval: ask`: the decision recorded for this call, or a new wait for one.
    async fn ask(&self, agent: &Agent, tool: &str, args: &Value, conv: &str, seq: u32) -> Result<Asked, AgentEnd> {
        let id = if conv.is_empty() { format!("{AGENT_WAIT}tool-{seq}") } else { format!("{AGENT_WAIT}{conv}/tool-{seq}") };
        match self.step(&id) {
            Some(r) if r.status == StepStatus::Succeeded => Ok(Asked::Approved),
            Some(r) if r.status == StepStatus::Failed => {
                let o = r.output.unwrap_or_default();
                let by = o.get("decided_by").and_then(Value::as_str).unwrap_or("a person");
                Ok(Asked::Refused(match o.get("comment").and_then(Value::as_str) {
                    Some(c) => format!("refused by {by}: {c}"),
                    None => format!("refused by {by}"),
                }))
            }
            Some(r) if r.status == StepStatus::WaitingApproval => {
                self.still_waiting(r).await?;
                Ok(Asked::Waiting)
            }
            _ => {
                let output = json!({
                    "question": format!("Agent \"{}\" wants to call {tool} with {args}. Allow it?", agent.name),
                    "agent": agent.name,
                    "tool": tool,
                    "arguments": args,
                });
                // A rejection resumes the run: the model is told the call was refused.
                self.wait_on(&id, output, true).await?;
                Ok(Asked::Waiting)
            }
        }
    }

    /// `None` while the run is within its budget (raised by the asks approved so far).
    async fn check_budget(&self, agent: &Agent, check: BudgetCheck) -> Option<AgentEnd> {
        let budget = self.ctx.job().budget.unwrap_or_default().over(&agent.budget);
        if budget == Budget::default() {
            return None;
        }
        // Each approved ask adds the budget again.
        let (approved, open) = {
            let steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
            let mut approved = 0u32;
            let mut open = None;
            for r in steps.iter().filter(|(id, _)| id.starts_with(BUDGET_WAIT)).map(|(_, r)| r) {
                match r.status {
                    StepStatus::Succeeded => approved += 1,
                    StepStatus::WaitingApproval => open = Some(r.clone()),
                    _ => {}
                }
            }
            (approved, open)
        };
        let usage = self.usage();
        let over = over_budget(&budget, &usage, approved, check);
        let why = over?;
        if budget.on_budget != Some(OnBudget::Ask) {
            return Some(AgentEnd::failed(format!("budget exceeded: {why}"), false));
        }
        if let Some(r) = open {
            return Some(self.still_waiting(r).await.err().unwrap_or(AgentEnd::Waiting));
        }
        let output = json!({
            "question": format!("Agent \"{}\" reached its budget ({why}). Approve to go on with the budget raised by as much again.", agent.name),
            "agent": agent.name,
            "usage": usage,
        });
        let id = format!("{BUDGET_WAIT}{}", approved + 1);
        // A rejection ends the run: no more budget.
        Some(self.wait_on(&id, output, false).await.err().unwrap_or(AgentEnd::Waiting))
    }

    fn usage(&self) -> AgentUsage {
        AgentUsage::of(&self.calls.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Why a tool call gave no result: an error the model is told as the call's result, or a stop
/// of the conversation (a delegation that waits) that records nothing.
enum ToolErr {
    Model(String),
    Stop(AgentEnd),
}

enum Asked {
    Approved,
    Refused(String),
    Waiting,
}

struct Setup {
    endpoint: Endpoint,
    limiter: Arc<Limiter>,
    toolbox: Toolbox,
    specs: Vec<ToolSpec>,
    system: Option<String>,
    pricing: Option<lamplighter_config::Pricing>,
}

fn cap_text(s: String) -> String {
    if s.len() <= TOOL_RESULT_CAP {
        return s;
    }
    let cut = s.floor_char_boundary(TOOL_RESULT_CAP);
    format!("{}\n[… {} more bytes not shown]", &s[..cut], s.len() - cut)
}

/// The first message of a conversation, as its first model call recorded it.
fn recorded_input(records: &[CallRecord]) -> Option<String> {
    records.iter().find(|r| r.kind == CallKind::Model && r.seq == 0)?.request.as_ref()?.get("input")?.as_str().map(str::to_owned)
}

/// The text an agent is given from a run's or a step's input: a string as it is, anything
/// else as JSON; no input asks it to do what its instructions say.
pub(crate) fn input_text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "Do the task your instructions describe.".into(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}
