//! Lamplighter's internal events, defined in one place (as vector's `internal_events`): what
//! happens to runs, ticks, steps, model and tool calls, plugin actions, MCP calls, approvals and
//! the config. Every log line about them, every span, every metric and every hook is fed from
//! here: no metric or span name is written anywhere else.
//!
//! Two kinds of event:
//! - **operations** ([`Op`]) have a start and an end: [`Observer::begin`] opens their span
//!   (`run` is a root; the rest are children of what runs them) and runs their `before` hooks,
//!   which may cancel; [`Started::end`] records the outcome on the span, counts it, logs it and
//!   runs the `after` or `onerror` hooks;
//! - **point events** ([`Observer::tick_fired`], [`Observer::run_created`], …) are a log line
//!   and a metric.
//!
//! Metrics go to an OpenTelemetry [`Meter`] the worker provides (pushed over OTLP and served
//! at `/metrics`); spans are made with the OpenTelemetry tracer it provides, directly, not
//! through `tracing` spans: an operation's [`Context`] is made current only while its work is
//! polled (`opentelemetry::context::FutureExt::with_context`, a thread-local swap), so that
//! operations begun inside it are its children. Without a tracer or meter everything here
//! still works and costs little. Telemetry never fails or blocks an operation: a hook that
//! fails or times out is logged and counted. Only two answers change what happens: a `before`
//! or `around` hook's `{"cancel": …}`, and an `around` hook's `{"input": …}`, which replaces the
//! input of the operations that have one ([`Observer::begin_with`]: tool uses, plugin actions,
//! MCP calls, session starts).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use lamplighter_config::{Config, HookBinding, Timing};
use lamplighter_plugins::Registry;
use opentelemetry::Context;
use opentelemetry::KeyValue;
use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider as _, UpDownCounter};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _};
use serde_json::{Value, json};

use crate::run::{Run, RunStatus};

/// Metric names (OpenTelemetry style; `/metrics` writes them Prometheus style, e.g.
/// `lamplighter_runs_total`).
pub mod metric {
    /// Runs that ended, by `job` and `status`.
    pub const RUNS: &str = "lamplighter.runs";
    /// Runs created by triggers, retries and recovery, by `job` and `trigger` (ticks count
    /// as [`TICKS`]).
    pub const RUNS_CREATED: &str = "lamplighter.runs.created";
    /// Run duration in seconds (start to end of one execution), by `job` and `status`.
    pub const RUN_DURATION: &str = "lamplighter.run.duration";
    /// Start minus due instant (the tick plus its jitter), seconds, by `job`.
    pub const LATENESS: &str = "lamplighter.schedule.lateness";
    /// Ticks, by `job` and `outcome` (`fired`, `skipped`).
    pub const TICKS: &str = "lamplighter.ticks";
    /// Runs waiting in the queue (all workers), sampled.
    pub const QUEUE_DEPTH: &str = "lamplighter.queue.depth";
    /// Runs executing in this worker.
    pub const RUNNING: &str = "lamplighter.runs.running";
    /// Workflow steps, by `workflow`, `step_type` and `outcome`.
    pub const STEPS: &str = "lamplighter.workflow.steps";
    /// GenAI semantic conventions: model call duration, seconds.
    pub const MODEL_DURATION: &str = "gen_ai.client.operation.duration";
    /// GenAI semantic conventions: tokens per model call, by `gen_ai.token.type`.
    pub const TOKEN_USAGE: &str = "gen_ai.client.token.usage";
    /// Tokens used, by `agent`, `model` and `type` (`input`, `output`).
    pub const TOKENS: &str = "lamplighter.agent.tokens";
    /// Cost of model calls (in the pricing's currency), by `agent` and `model`.
    pub const COST: &str = "lamplighter.agent.cost";
    /// Agent tool calls, by `agent`, `tool` and `outcome`.
    pub const TOOL_CALLS: &str = "lamplighter.agent.tool_calls";
    /// Plugin actions, by `plugin`, `action` and `outcome`.
    pub const PLUGIN_ACTIONS: &str = "lamplighter.plugin.actions";
    /// WASM plugins' calls out of their sandbox (`http_request`, `ai_complete`, `mcp_call`), by
    /// `plugin`, `function` and `outcome`.
    pub const PLUGIN_HOST_CALLS: &str = "lamplighter.plugin.host_calls";
    /// WASM fuel used, by `plugin`.
    pub const WASM_FUEL: &str = "lamplighter.wasm.fuel";
    /// Calls to external MCP servers, by `server`, `tool` and `outcome`.
    pub const MCP_CALLS: &str = "lamplighter.mcp.client.calls";
    /// Requests to the worker's own MCP server, by `tool` and `outcome`.
    pub const MCP_REQUESTS: &str = "lamplighter.mcp.requests";
    /// Approvals, by `event` (`requested`, `approved`, `rejected`).
    pub const APPROVALS: &str = "lamplighter.approvals";
    /// Hook calls, by `hook`, `timing` and `outcome` (`ok`, `cancelled`, `failed`).
    pub const HOOKS: &str = "lamplighter.hook.executions";
    /// Config reloads, by `outcome` (`applied`, `rejected`).
    pub const CONFIG_RELOADS: &str = "lamplighter.config.reloads";
    /// Times this worker fenced itself (its lease could not be renewed in time).
    pub const WORKER_FENCES: &str = "lamplighter.worker.fences";
    /// Ends of runs the fence refused: the worker no longer held them.
    pub const WORKER_FENCED_WRITES: &str = "lamplighter.worker.fenced_writes";
    /// Notification sends, by `event` and `outcome` (`delivered`, `retried`, `abandoned`).
    pub const NOTIFICATIONS: &str = "lamplighter.notifications";
    /// Deadlines missed, by `job` and `deadline` (`start_within`, `finish_within`,
    /// `finish_by`): counted by the worker that told the miss (once across workers).
    pub const DEADLINE_MISSED: &str = "lamplighter.deadline.missed";
    /// Ticks no worker fired on time, by `job`: counted by the worker that told them (once
    /// across workers), whatever catch-up did with them.
    pub const TICKS_MISSED: &str = "lamplighter.ticks.missed";
    /// On PostgreSQL, sampled: the workers whose lease ran out in the last hour without being
    /// given up (a crash, a cut) — no worker renews it. Absent on SQLite.
    pub const WORKERS_LAPSED: &str = "lamplighter.workers.lapsed";
    /// The scheduled jobs this worker plans and offers the ticks of: on PostgreSQL its share of
    /// them, divided between the workers of its group (`lamplighter.schedule.workers`).
    pub const SCHEDULE_SHARE: &str = "lamplighter.schedule.share";
    /// The workers that divide the scheduled jobs between them, this one included (1 on SQLite).
    pub const SCHEDULE_WORKERS: &str = "lamplighter.schedule.workers";
    /// 1 when this worker notices the outcomes of runs (records their notifications, starts
    /// their `after` jobs, asks for their pruning), 0 when another worker of its group does.
    pub const OUTCOMES_NOTICER: &str = "lamplighter.outcomes.noticer";
    /// Per limit (`scheduling.limits`), sampled from the database (all workers): the slots held.
    pub const LIMIT_HELD: &str = "lamplighter.limit.held";
    /// Per limit, sampled: the runs waiting for a slot.
    pub const LIMIT_WAITING: &str = "lamplighter.limit.waiting";
    /// Per limit: how long runs waited for a slot before they got one, seconds.
    pub const LIMIT_WAIT: &str = "lamplighter.limit.wait";
    /// Per job (`telemetry.metrics.per_job`), read from the database every few seconds: when
    /// its last run succeeded (Unix seconds).
    pub const JOB_LAST_SUCCESS: &str = "lamplighter.job.last_success.timestamp";
    /// Per job: its next fire time after the last tick the scheduler processed (Unix seconds).
    /// A scheduler that stopped leaves it in the past: what an outside alert looks for.
    pub const JOB_NEXT_FIRE: &str = "lamplighter.job.next_fire.timestamp";
    /// Per job: its final outcomes that failed in a row (0 after a success).
    pub const JOB_CONSECUTIVE_FAILURES: &str = "lamplighter.job.consecutive_failures";
    /// Per job: how long its oldest run still running has run (seconds; absent when none runs).
    pub const JOB_OLDEST_RUNNING: &str = "lamplighter.job.oldest_running.age";
    /// Per job: how long its oldest wait for a decision has waited (seconds; absent when none).
    pub const JOB_OLDEST_APPROVAL: &str = "lamplighter.job.oldest_approval.age";
}

/// What the per-job gauges show, as last read (see [`metric::JOB_NEXT_FIRE`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct JobGauge {
    pub(crate) last_success: Option<chrono::DateTime<chrono::Utc>>,
    pub(crate) next_fire: Option<chrono::DateTime<chrono::Utc>>,
    pub(crate) consecutive_failures: u32,
    pub(crate) oldest_running: Option<chrono::DateTime<chrono::Utc>>,
    pub(crate) oldest_approval: Option<chrono::DateTime<chrono::Utc>>,
}

/// The per-job gauges' values, shared with their readers; `None` while they are switched off.
/// A reader takes the table as it stands (an `Arc`) and walks it without the lock, so that
/// serving a million jobs' gauges never holds up the next sample.
type JobGauges = Arc<RwLock<Option<Arc<JobTable>>>>;

/// Each job's gauges, in the jobs' (name) order. The names are shared from one reading to
/// the next while the jobs in force stay the same: a million of them were copied every 5 s.
#[derive(Debug, Default)]
pub(crate) struct JobTable {
    names: Arc<Vec<String>>,
    gauges: Vec<JobGauge>,
}

impl JobTable {
    /// The gauges of the jobs `names`, one each, in order.
    pub(crate) fn new(names: Arc<Vec<String>>, gauges: Vec<JobGauge>) -> Self {
        JobTable { names, gauges }
    }

    pub(crate) fn names(&self) -> &Arc<Vec<String>> {
        &self.names
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &JobGauge)> {
        self.names.iter().map(String::as_str).zip(&self.gauges)
    }

    fn len(&self) -> usize {
        self.gauges.len()
    }
}

impl FromIterator<(String, JobGauge)> for JobTable {
    fn from_iter<I: IntoIterator<Item = (String, JobGauge)>>(jobs: I) -> Self {
        let (names, gauges) = jobs.into_iter().unzip();
        JobTable { names: Arc::new(names), gauges }
    }
}

/// Each limit's slots held and runs waiting (all workers), as last sampled.
type LimitGauges = Arc<RwLock<std::collections::BTreeMap<String, (u64, u64)>>>;

/// Registers the per-limit gauges on `meter`, reading `values` at each collection.
fn limit_gauges(meter: &Meter, values: &LimitGauges) {
    type Pick = fn(&(u64, u64)) -> u64;
    let gauges: [(&'static str, &'static str, Pick); 2] = [
        (metric::LIMIT_HELD, "Slots of the limit held (all workers)", |g| g.0),
        (metric::LIMIT_WAITING, "Runs waiting for a slot of the limit (all workers)", |g| g.1),
    ];
    for (name, desc, pick) in gauges {
        let values = values.clone();
        meter
            .u64_observable_gauge(name)
            .with_description(desc)
            .with_callback(move |o| {
                for (limit, g) in values.read().unwrap_or_else(|e| e.into_inner()).iter() {
                    o.observe(pick(g), &[KeyValue::new("limit", limit.clone())]);
                }
            })
            .build();
    }
}

/// One of the per-job gauges (`telemetry.metrics.per_job`): its OpenTelemetry name,
/// description and unit, and what it shows of a job.
#[derive(Debug)]
pub struct JobGaugeKind {
    pub name: &'static str,
    pub description: &'static str,
    /// `s` for timestamps and ages; none for counts.
    pub unit: Option<&'static str>,
    pick: fn(&JobGauge, chrono::DateTime<chrono::Utc>) -> Option<f64>,
}

impl JobGaugeKind {
    /// Each job of `table` this gauge has a value for, and the value at `now`.
    fn values<'a>(&self, table: &'a JobTable, now: chrono::DateTime<chrono::Utc>) -> impl Iterator<Item = (&'a str, f64)> {
        let pick = self.pick;
        table.iter().filter_map(move |(job, g)| pick(g, now).map(|v| (job, v)))
    }
}

/// The per-job gauges' table as it stands; none while they are off.
fn job_table(jobs: &JobGauges) -> Option<Arc<JobTable>> {
    jobs.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The per-job gauges, in the order they are served.
pub(crate) const JOB_GAUGES: [JobGaugeKind; 5] = [
    JobGaugeKind {
        name: metric::JOB_LAST_SUCCESS,
        description: "When the job's last run succeeded",
        unit: Some("s"),
        pick: |g, _| g.last_success.map(secs),
    },
    JobGaugeKind {
        name: metric::JOB_NEXT_FIRE,
        description: "The job's next fire time after the last tick processed",
        unit: Some("s"),
        pick: |g, _| g.next_fire.map(secs),
    },
    JobGaugeKind {
        name: metric::JOB_CONSECUTIVE_FAILURES,
        description: "The job's final outcomes that failed in a row",
        unit: None,
        pick: |g, _| Some(f64::from(g.consecutive_failures)),
    },
    JobGaugeKind {
        name: metric::JOB_OLDEST_RUNNING,
        description: "How long the job's oldest running run has run",
        unit: Some("s"),
        pick: |g, now| g.oldest_running.map(|t| (now - t).as_seconds_f64().max(0.0)),
    },
    JobGaugeKind {
        name: metric::JOB_OLDEST_APPROVAL,
        description: "How long the job's oldest wait for a decision has waited",
        unit: Some("s"),
        pick: |g, now| g.oldest_approval.map(|t| (now - t).as_seconds_f64().max(0.0)),
    },
];

fn secs(t: chrono::DateTime<chrono::Utc>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}

/// The instruments, created once from the meter.
#[derive(Debug, Clone)]
struct Instruments {
    runs: Counter<u64>,
    runs_created: Counter<u64>,
    run_duration: Histogram<f64>,
    lateness: Histogram<f64>,
    ticks: Counter<u64>,
    running: UpDownCounter<i64>,
    steps: Counter<u64>,
    model_duration: Histogram<f64>,
    token_usage: Histogram<u64>,
    tokens: Counter<u64>,
    cost: Counter<f64>,
    tool_calls: Counter<u64>,
    plugin_actions: Counter<u64>,
    host_calls: Counter<u64>,
    wasm_fuel: Counter<u64>,
    mcp_calls: Counter<u64>,
    mcp_requests: Counter<u64>,
    approvals: Counter<u64>,
    hooks: Counter<u64>,
    reloads: Counter<u64>,
    fences: Counter<u64>,
    fenced_writes: Counter<u64>,
    notifications: Counter<u64>,
    deadline_missed: Counter<u64>,
    ticks_missed: Counter<u64>,
    limit_wait: Histogram<f64>,
}

/// Buckets for durations and lateness, in seconds: 1 ms to an hour.
const SECONDS: &[f64] = &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];
/// Buckets for tokens per call.
const TOKEN_BUCKETS: &[f64] = &[1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0];

impl Instruments {
    fn new(meter: &Meter, queue_depth: Arc<AtomicI64>, lapsed: Arc<AtomicI64>, share: Arc<[AtomicI64; 3]>) -> Self {
        let s = |name: &'static str, desc: &'static str| {
            meter.f64_histogram(name).with_unit("s").with_description(desc).with_boundaries(SECONDS.to_vec()).build()
        };
        let c = |name: &'static str, desc: &'static str| meter.u64_counter(name).with_description(desc).build();
        meter
            .i64_observable_gauge(metric::QUEUE_DEPTH)
            .with_description("Runs waiting in the queue")
            .with_callback(move |o| {
                let v = queue_depth.load(Ordering::Relaxed);
                if v >= 0 {
                    o.observe(v, &[]);
                }
            })
            .build();
        meter
            .i64_observable_gauge(metric::WORKERS_LAPSED)
            .with_description("Workers whose lease ran out in the last hour without being given up (PostgreSQL)")
            .with_callback(move |o| {
                let v = lapsed.load(Ordering::Relaxed);
                if v >= 0 {
                    o.observe(v, &[]);
                }
            })
            .build();
        for (i, (name, desc)) in [
            (metric::SCHEDULE_SHARE, "Scheduled jobs this worker plans (its share of them)"),
            (metric::SCHEDULE_WORKERS, "Workers dividing the scheduled jobs, this one included"),
            (metric::OUTCOMES_NOTICER, "1 when this worker notices the outcomes of runs, 0 when another worker of its group does"),
        ]
        .into_iter()
        .enumerate()
        {
            let share = share.clone();
            meter
                .i64_observable_gauge(name)
                .with_description(desc)
                .with_callback(move |o| {
                    let v = share[i].load(Ordering::Relaxed);
                    if v >= 0 {
                        o.observe(v, &[]);
                    }
                })
                .build();
        }
        Self {
            runs: c(metric::RUNS, "Runs that ended, by job and status"),
            runs_created: c(metric::RUNS_CREATED, "Runs created, by job and trigger"),
            run_duration: s(metric::RUN_DURATION, "How long runs ran"),
            lateness: s(metric::LATENESS, "Start minus due instant of scheduled runs"),
            ticks: c(metric::TICKS, "Schedule ticks, fired or skipped"),
            running: meter.i64_up_down_counter(metric::RUNNING).with_description("Runs executing in this worker").build(),
            steps: c(metric::STEPS, "Workflow steps that ended"),
            model_duration: s(metric::MODEL_DURATION, "GenAI operation duration"),
            token_usage: meter
                .u64_histogram(metric::TOKEN_USAGE)
                .with_unit("{token}")
                .with_description("Tokens used per model call")
                .with_boundaries(TOKEN_BUCKETS.to_vec())
                .build(),
            tokens: c(metric::TOKENS, "Tokens used by agents"),
            cost: meter.f64_counter(metric::COST).with_description("Cost of model calls").build(),
            tool_calls: c(metric::TOOL_CALLS, "Agent tool calls"),
            plugin_actions: c(metric::PLUGIN_ACTIONS, "Plugin actions"),
            host_calls: c(metric::PLUGIN_HOST_CALLS, "WASM plugins' calls out of their sandbox"),
            wasm_fuel: c(metric::WASM_FUEL, "WASM fuel used"),
            mcp_calls: c(metric::MCP_CALLS, "Calls to external MCP servers"),
            mcp_requests: c(metric::MCP_REQUESTS, "Requests to the worker's MCP server"),
            approvals: c(metric::APPROVALS, "Approvals requested and decided"),
            hooks: c(metric::HOOKS, "Hook calls"),
            reloads: c(metric::CONFIG_RELOADS, "Config reloads"),
            fences: c(metric::WORKER_FENCES, "Times the worker fenced itself, its lease not renewed in time"),
            fenced_writes: c(metric::WORKER_FENCED_WRITES, "Ends of runs the fence refused: the worker no longer held them"),
            notifications: c(metric::NOTIFICATIONS, "Notification sends, by event and outcome"),
            deadline_missed: c(metric::DEADLINE_MISSED, "Deadlines missed, by job and deadline (told once across workers)"),
            ticks_missed: c(metric::TICKS_MISSED, "Ticks no worker fired on time, by job (told once across workers)"),
            limit_wait: s(metric::LIMIT_WAIT, "How long runs waited for a limit's slot"),
        }
    }
}

/// An operation that hooks, spans and metrics see begin and end.
#[derive(Debug, Clone)]
pub enum Op {
    /// One execution of a run: the root span; hooks `scheduler:<job>:job-execute:*`.
    Run { job: String, trigger: &'static str, attempt: u32 },
    /// A workflow step: hooks `workflow:<name>:step:*`.
    Step { workflow: String, step: String, kind: &'static str },
    /// A model call (GenAI conventions): hooks `agent:<name>:model-call:*`.
    ModelCall { agent: String, provider: String, model: String },
    /// An agent's tool call: hooks `agent:<name>:tool-use:*`.
    ToolUse { agent: String, tool: String },
    /// A plugin action: hooks `plugin:<name>:action:*`.
    PluginAction { plugin: String, action: String },
    /// A tool call to an external MCP server: hooks `mcp:<server>:tool-call:*`.
    McpCall { server: String, tool: String },
    /// A group chat: hooks `orchestration:group-chat:start` (before) and `…:end` (after).
    GroupChat { step: String, agents: Vec<String> },
    /// A new agent conversation (not one resumed from its records): hooks
    /// `agent:<name>:session-start:*`, whose input is the conversation's first message.
    SessionStart { agent: String, conversation: String, depth: u32 },
    /// A WASM plugin's call out of its sandbox (`function`: `http_request`, `ai_complete`,
    /// `mcp_call`; `target`: the host, model or `server.tool`): hooks
    /// `plugin:<name>:http-request:*` (`ai-complete`, `mcp-call`).
    HostCall { plugin: String, function: &'static str, target: String },
}

impl Op {
    /// `domain:component:action` of its hook events on one side (`before`: the start); a group
    /// chat ends as `…:end`.
    fn hook_event(&self, before: bool) -> [&str; 3] {
        match self {
            Op::Run { job, .. } => ["scheduler", job, "job-execute"],
            Op::Step { workflow, .. } => ["workflow", workflow, "step"],
            Op::ModelCall { agent, .. } => ["agent", agent, "model-call"],
            Op::ToolUse { agent, .. } => ["agent", agent, "tool-use"],
            Op::PluginAction { plugin, .. } => ["plugin", plugin, "action"],
            Op::McpCall { server, .. } => ["mcp", server, "tool-call"],
            Op::GroupChat { .. } if before => ["orchestration", "group-chat", "start"],
            Op::GroupChat { .. } => ["orchestration", "group-chat", "end"],
            Op::SessionStart { agent, .. } => ["agent", agent, "session-start"],
            Op::HostCall { plugin, function, .. } => ["plugin", plugin, hook_action(function)],
        }
    }

    /// Starts the span: its name, kind and attributes (GenAI conventions for model and tool
    /// calls), as a child of `parent`; returns `parent` with the span in it.
    fn start(&self, tracer: &BoxedTracer, parent: &Context, owner: RunRef<'_>) -> Context {
        let (name, kind) = match self {
            Op::Run { job, .. } => (format!("run {job}"), SpanKind::Internal),
            Op::Step { step, .. } => (format!("step {step}"), SpanKind::Internal),
            Op::ModelCall { model, .. } => (format!("chat {model}"), SpanKind::Client),
            Op::ToolUse { tool, .. } => (format!("execute_tool {tool}"), SpanKind::Internal),
            Op::PluginAction { plugin, action } => (format!("plugin {plugin}.{action}"), SpanKind::Internal),
            Op::McpCall { server, tool } => (format!("mcp {server}.{tool}"), SpanKind::Client),
            Op::GroupChat { step, .. } => (format!("group_chat {step}"), SpanKind::Internal),
            Op::SessionStart { agent, .. } => (format!("session {agent}"), SpanKind::Internal),
            Op::HostCall { function, target, .. } => (format!("{function} {target}"), SpanKind::Client),
        };
        let mut attributes = self.attributes();
        if let Op::Run { .. } = self {
            attributes.push(KeyValue::new("lamplighter.run.id", owner.run_id.to_string()));
        }
        let span = tracer.span_builder(name).with_kind(kind).with_attributes(attributes).start_with_context(tracer, parent);
        parent.with_span(span)
    }

    fn attributes(&self) -> Vec<KeyValue> {
        let s = |k: &'static str, v: &str| KeyValue::new(k, v.to_string());
        match self {
            Op::Run { job, trigger, attempt } => {
                vec![
                    s("lamplighter.job", job),
                    s("lamplighter.trigger", trigger),
                    KeyValue::new("lamplighter.attempt", i64::from(*attempt)),
                ]
            }
            Op::Step { workflow, step, kind } => {
                vec![s("lamplighter.workflow", workflow), s("lamplighter.step", step), s("lamplighter.step.type", kind)]
            }
            Op::ModelCall { agent, provider, model } => vec![
                s("gen_ai.operation.name", "chat"),
                s("gen_ai.request.model", model),
                s("gen_ai.provider.name", provider),
                s("gen_ai.agent.name", agent),
            ],
            Op::ToolUse { agent, tool } => {
                vec![s("gen_ai.operation.name", "execute_tool"), s("gen_ai.tool.name", tool), s("gen_ai.agent.name", agent)]
            }
            Op::PluginAction { plugin, action } => vec![s("lamplighter.plugin", plugin), s("lamplighter.action", action)],
            Op::McpCall { server, tool } => vec![s("mcp.server", server), s("gen_ai.tool.name", tool)],
            Op::GroupChat { step, agents } => vec![s("lamplighter.step", step), s("lamplighter.agents", &agents.join(","))],
            Op::SessionStart { agent, conversation, .. } => vec![s("gen_ai.agent.name", agent), s("gen_ai.conversation.id", conversation)],
            Op::HostCall { plugin, function, target } => {
                vec![s("lamplighter.plugin", plugin), s("lamplighter.host_function", function), s("lamplighter.host_target", target)]
            }
        }
    }

    /// The operation's own fields, for hook payloads.
    fn fields(&self) -> Value {
        match self {
            Op::Run { job, trigger, attempt } => json!({"job": job, "trigger": trigger, "attempt": attempt}),
            Op::Step { workflow, step, kind } => json!({"workflow": workflow, "step": step, "type": kind}),
            Op::ModelCall { agent, provider, model } => json!({"agent": agent, "provider": provider, "model": model}),
            Op::ToolUse { agent, tool } => json!({"agent": agent, "tool": tool}),
            Op::PluginAction { plugin, action } => json!({"plugin": plugin, "action": action}),
            Op::McpCall { server, tool } => json!({"server": server, "tool": tool}),
            Op::GroupChat { step, agents } => json!({"step": step, "agents": agents}),
            Op::SessionStart { agent, conversation, depth } => json!({"agent": agent, "conversation": conversation, "depth": depth}),
            Op::HostCall { plugin, function, target } => json!({"plugin": plugin, "function": function, "target": target}),
        }
    }
}

/// A host function's name as the action of its hook events (`http_request` → `http-request`).
fn hook_action(function: &str) -> &'static str {
    match function {
        "http_request" => "http-request",
        "ai_complete" => "ai-complete",
        "mcp_call" => "mcp-call",
        _ => "host-call",
    }
}

/// How an operation ended, with what it used.
#[derive(Debug, Clone, Default)]
pub struct Ended<'a> {
    /// `None`: it succeeded.
    pub error: Option<&'a str>,
    /// A run's recorded status (runs only).
    pub status: Option<RunStatus>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost: Option<f64>,
    /// WASM fuel (plugin actions).
    pub fuel: u64,
    /// Prompt and completion, recorded on the span only with `enable_sensitive_data`.
    pub prompt: Option<&'a str>,
    pub completion: Option<&'a str>,
}

impl<'a> Ended<'a> {
    pub fn ok() -> Self {
        Self::default()
    }

    pub fn failed(error: &'a str) -> Self {
        Self { error: Some(error), ..Self::default() }
    }

    pub fn of<T, E: AsRef<str>>(r: &'a Result<T, E>) -> Self {
        match r {
            Ok(_) => Self::ok(),
            Err(e) => Self::failed(e.as_ref()),
        }
    }

    /// `failed`, `succeeded`, or the status given (a run's, or a step's `waiting_approval`).
    fn outcome(&self) -> &'static str {
        match (self.status, self.error) {
            (Some(s), _) => s.as_str(),
            (None, Some(_)) => "failed",
            (None, None) => "succeeded",
        }
    }
}

/// A `before` hook cancelled the operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancelled(pub String);

impl std::fmt::Display for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who an operation belongs to, for hook payloads and logs.
#[derive(Debug, Clone, Copy)]
pub struct RunRef<'a> {
    pub run_id: &'a str,
    pub owner: &'a crate::run::Owner,
    pub attempt: u32,
}

impl<'a> From<&'a Run> for RunRef<'a> {
    fn from(r: &'a Run) -> Self {
        Self { run_id: &r.id, owner: &r.owner, attempt: r.attempt }
    }
}

/// A begun operation: its span (in its context), and what its end needs.
#[derive(Debug)]
pub struct Started {
    op: Op,
    cx: Context,
    began: Instant,
    run_id: String,
    owner: crate::run::Owner,
    attempt: u32,
}

impl Started {
    /// The operation's context: run its work `.with_context(started.context())` (operations
    /// begun inside are its children), or pass it as the parent of later ones (tool calls on
    /// the model call that asked for them).
    pub fn context(&self) -> Context {
        self.cx.clone()
    }

    /// The trace id (32 hex digits), when spans are exported.
    pub fn trace_id(&self) -> Option<String> {
        let sc = self.cx.span().span_context().clone();
        sc.is_valid().then(|| sc.trace_id().to_string())
    }

    /// Records the end: span status and attributes, metrics, a log line, then the `after` (or
    /// `onerror`) hooks.
    pub async fn end(self, obs: &Observer, ended: Ended<'_>) {
        let secs = self.began.elapsed().as_secs_f64();
        let m = &obs.m;
        let span = self.cx.span();
        let kv = |k: &'static str, v: &str| KeyValue::new(k, v.to_string());
        let outcome = kv("outcome", ended.outcome());
        match &self.op {
            Op::Run { job, .. } => {
                let status = ended.outcome();
                let attrs = [kv("job", job), kv("status", status)];
                m.run_duration.record(secs, &attrs);
                m.runs.add(1, &attrs);
                span.set_attribute(KeyValue::new("lamplighter.run.status", status));
            }
            Op::Step { workflow, kind, .. } => m.steps.add(1, &[kv("workflow", workflow), kv("step_type", kind), outcome]),
            Op::ModelCall { agent, provider, model } => {
                let mut attrs =
                    vec![kv("gen_ai.operation.name", "chat"), kv("gen_ai.request.model", model), kv("gen_ai.provider.name", provider)];
                if ended.error.is_some() {
                    attrs.push(kv("error.type", "model_call_failed"));
                }
                m.model_duration.record(secs, &attrs);
                attrs.truncate(3);
                if ended.error.is_none() {
                    for (t, n) in [("input", ended.input_tokens), ("output", ended.output_tokens)] {
                        let mut a = attrs.clone();
                        a.push(kv("gen_ai.token.type", t));
                        m.token_usage.record(n, &a);
                        m.tokens.add(n, &[kv("agent", agent), kv("model", model), kv("type", t)]);
                    }
                    if let Some(c) = ended.cost {
                        m.cost.add(c, &[kv("agent", agent), kv("model", model)]);
                    }
                }
                span.set_attribute(KeyValue::new("gen_ai.usage.input_tokens", ended.input_tokens as i64));
                span.set_attribute(KeyValue::new("gen_ai.usage.output_tokens", ended.output_tokens as i64));
                if obs.sensitive.load(Ordering::Relaxed) {
                    if let Some(p) = ended.prompt {
                        span.set_attribute(KeyValue::new("gen_ai.input.messages", p.to_string()));
                    }
                    if let Some(c) = ended.completion {
                        span.set_attribute(KeyValue::new("gen_ai.output.messages", c.to_string()));
                    }
                }
            }
            Op::ToolUse { agent, tool } => m.tool_calls.add(1, &[kv("agent", agent), kv("tool", tool), outcome]),
            Op::PluginAction { plugin, action } => {
                m.plugin_actions.add(1, &[kv("plugin", plugin), kv("action", action), outcome]);
                if ended.fuel > 0 {
                    m.wasm_fuel.add(ended.fuel, &[kv("plugin", plugin)]);
                    span.set_attribute(KeyValue::new("lamplighter.wasm.fuel", ended.fuel as i64));
                }
            }
            Op::McpCall { server, tool } => m.mcp_calls.add(1, &[kv("server", server), kv("tool", tool), outcome]),
            Op::HostCall { plugin, function, .. } => m.host_calls.add(1, &[kv("plugin", plugin), kv("function", function), outcome]),
            Op::GroupChat { .. } | Op::SessionStart { .. } => {}
        }
        if let Some(e) = ended.error {
            span.set_status(Status::error(e.to_string()));
        } else {
            span.set_status(Status::Ok);
        }
        span.end();
        let ms = (secs * 1000.0) as u64;
        match &self.op {
            Op::Run { .. } => {} // logged by the recorder, with the end as recorded
            op => match ended.error {
                None => tracing::debug!(run = %self.run_id, what = ?op, duration_ms = ms, "operation finished"),
                Some(e) => tracing::debug!(run = %self.run_id, what = ?op, duration_ms = ms, error = e, "operation failed"),
            },
        }
        let timing = if ended.error.is_some() { Timing::OnError } else { Timing::After };
        let owner = RunRef { run_id: &self.run_id, owner: &self.owner, attempt: self.attempt };
        let fill = |payload: &mut Value| {
            payload["outcome"] = json!(ended.outcome());
            payload["duration_ms"] = json!(ms);
            if let Some(e) = ended.error {
                payload["error"] = json!(e);
            }
        };
        let _ = obs.run_hooks(&self.op, timing, false, owner, None, fill).await;
        let around = |payload: &mut Value| {
            fill(payload);
            payload["phase"] = json!("after");
        };
        let _ = obs.run_hooks(&self.op, Timing::Around, false, owner, None, around).await;
    }
}

/// A hook binding whose plugin exports the hook.
#[derive(Debug, Clone)]
struct Bound {
    binding: HookBinding,
    label: String,
}

/// The one place events go: metrics, hooks, spans and their logs.
pub struct Observer {
    m: Instruments,
    /// Where [`InternalEvent`]s go besides the log: to whoever subscribed.
    /// Made by the first subscriber: its buffer ([`INTERNAL_EVENTS_KEPT`] events, 0.7 MB,
    /// written whole as it is made) is not held by a worker that nobody follows.
    internal: std::sync::OnceLock<tokio::sync::broadcast::Sender<InternalEvent>>,
    /// Where spans go; none: no spans.
    tracer: Option<BoxedTracer>,
    /// Bindings in priority order, swapped on reload.
    hooks: RwLock<Vec<Bound>>,
    registry: Option<Arc<Registry>>,
    sensitive: AtomicBool,
    queue_depth: Arc<AtomicI64>,
    lapsed_workers: Arc<AtomicI64>,
    /// The jobs this worker plans, and the workers dividing them.
    share: Arc<[AtomicI64; 3]>,
    jobs: JobGauges,
    /// How many jobs' gauges an exporter keeps ([`Observer::export_job_gauges`]; 0: none), and
    /// whether the worker has said that it has more jobs than that.
    jobs_exported: std::sync::atomic::AtomicUsize,
    jobs_past_export: AtomicBool,
    limits: LimitGauges,
}

/// How many internal events a subscriber may fall behind before it misses some.
const INTERNAL_EVENTS_KEPT: usize = 4096;

/// The run core's stages as typed values (as vector's internal events): each is written as a
/// debug log line of its name and handed to whoever subscribes ([`Observer::internal_events`]:
/// tests, and `lamplighter run --internal-events FILE`, which the benches read).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum InternalEvent {
    /// One tick transaction of a scheduler pass: `ticks` fired for the instant `tick_ms`
    /// (Unix ms), each stage in µs after that instant (negative: before it, as a transaction
    /// done ahead of its instant is) — the scheduler woke, planned the batch, had the
    /// transaction ready to commit (held ahead), committed it, and launched the claimed runs.
    /// `transaction`: where the transaction's own time went (none when it was let go or failed).
    TickBurst {
        ticks: usize,
        tick_ms: i64,
        woke_us: i64,
        planned_us: i64,
        ready_us: Option<i64>,
        committed_us: Option<i64>,
        launched_us: i64,
        transaction: Option<TxTimings>,
    },
    /// A batch of runs' ends recorded, with `claimed` queued runs claimed in the same write to
    /// take their slots; it took `finish_us`, and was recorded at `at_ms` (Unix ms). `write`:
    /// where the write's time went, when it claimed too.
    EndsRecorded { runs: usize, claimed: usize, finish_us: u64, at_ms: i64, write: Option<EndsWrite> },
    /// The intake claimed `runs` queued runs from `tasks` queue tasks, `asked` for; it took
    /// `claim_us`.
    ClaimedFromQueue { asked: usize, tasks: usize, runs: usize, claim_us: u64 },
}

/// How a write of ends and claims went, in µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EndsWrite {
    /// One statement (PostgreSQL) or one script (SQLite), after waiting `writer_wait_us` for
    /// the writing connection (SQLite).
    OneStatement { statement_us: u64, writer_wait_us: Option<u64> },
    /// A transaction, statement by statement: begun, ends written (and the steps they close),
    /// lease, take and claims, committed.
    Transaction { begin_us: u64, ends_us: u64, claim_us: u64, commit_us: u64 },
}

/// Where a tick transaction's time went, in µs per part: begun, tick keys recorded, pause
/// state and active runs read, runs inserted, last ticks and queue tasks saved, held until its
/// instant, committed; and the whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TxTimings {
    pub begin_us: u64,
    pub keys_us: u64,
    pub reads_us: u64,
    pub runs_us: u64,
    pub state_us: u64,
    pub held_us: u64,
    pub commit_us: u64,
    pub total_us: u64,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").field("hooks", &self.hooks.read().map(|h| h.len()).unwrap_or(0)).finish_non_exhaustive()
    }
}

impl Observer {
    /// Records metrics on `meter` and spans with `tracer`; hooks call plugins of `registry`.
    /// The per-job gauges are not on `meter`: read them with [`Observer::read_job_gauges`], or
    /// put them on a meter of their own with [`Observer::export_job_gauges`].
    pub fn new(meter: &Meter, tracer: Option<BoxedTracer>, registry: Option<Arc<Registry>>) -> Arc<Self> {
        let queue_depth = Arc::new(AtomicI64::new(-1));
        let lapsed_workers = Arc::new(AtomicI64::new(-1));
        let share = Arc::new([AtomicI64::new(-1), AtomicI64::new(-1), AtomicI64::new(-1)]);
        let jobs = JobGauges::default();
        let limits = LimitGauges::default();
        limit_gauges(meter, &limits);
        Arc::new(Self {
            m: Instruments::new(meter, queue_depth.clone(), lapsed_workers.clone(), share.clone()),
            tracer,
            hooks: RwLock::new(Vec::new()),
            registry,
            sensitive: AtomicBool::new(false),
            queue_depth,
            lapsed_workers,
            share,
            jobs,
            jobs_exported: Default::default(),
            jobs_past_export: AtomicBool::new(false),
            limits,
            internal: std::sync::OnceLock::new(),
        })
    }

    /// The run core's internal events from now on (see [`InternalEvent`]). A subscriber that
    /// falls more than a few thousand events behind is told so (`Lagged`) and misses them.
    pub fn internal_events(&self) -> tokio::sync::broadcast::Receiver<InternalEvent> {
        self.internal.get_or_init(|| tokio::sync::broadcast::channel(INTERNAL_EVENTS_KEPT).0).subscribe()
    }

    /// Writes `event` as a debug line of its name and hands it to the subscribers, if any.
    pub(crate) fn emit(&self, event: InternalEvent) {
        match &event {
            InternalEvent::TickBurst { ticks, tick_ms, woke_us, planned_us, ready_us, committed_us, launched_us, transaction } => {
                tracing::debug!(
                    ticks,
                    tick_ms,
                    woke_us,
                    planned_us,
                    ready_us,
                    committed_us,
                    launched_us,
                    tx_total_us = transaction.map(|t| t.total_us),
                    "tick burst"
                );
            }
            InternalEvent::EndsRecorded { runs, claimed, finish_us, at_ms, write } => {
                tracing::debug!(runs, claimed, finish_us, at_ms, write = ?write, "ends recorded");
            }
            InternalEvent::ClaimedFromQueue { asked, tasks, runs, claim_us } => {
                tracing::debug!(asked, tasks, runs, claim_us, "claimed from the queue");
            }
        }
        if let Some(internal) = self.internal.get().filter(|i| i.receiver_count() > 0) {
            let _ = internal.send(event);
        }
    }

    /// No metrics kept, no hooks: for embedding and tests that look at none of it.
    pub fn none() -> Arc<Self> {
        Self::new(&opentelemetry::metrics::noop::NoopMeterProvider::new().meter("lamplighter"), None, None)
    }

    /// Takes the hook bindings and `enable_sensitive_data` of `config` (at start and on
    /// reload). A binding whose plugin does not export its hook (or did not load) is left out
    /// and named in the log; `config validate` reports it.
    pub fn configure(&self, config: &Config) {
        self.sensitive.store(config.telemetry.sensitive_data, Ordering::Relaxed);
        {
            let mut jobs = self.jobs.write().unwrap_or_else(|e| e.into_inner());
            match (config.telemetry.metrics_per_job, jobs.is_some()) {
                (true, false) => *jobs = Some(Default::default()),
                (false, _) => *jobs = None,
                (true, true) => {}
            }
        }
        let mut bound = Vec::new();
        for b in &config.hooks {
            let label = b.label();
            match &self.registry {
                Some(r) if r.has_hook(&b.plugin, &b.hook) => bound.push(Bound { binding: b.clone(), label }),
                _ => {
                    tracing::warn!(hook = %label, event = %b.event, "hook binding disabled: the plugin does not export this hook or did not load")
                }
            }
        }
        *self.hooks.write().unwrap_or_else(|e| e.into_inner()) = bound;
    }

    /// Begins an operation: opens its span (a child of the current span, or of `parent`),
    /// then runs its `before` and `around` hooks. A hook that cancels ends the span and returns
    /// why.
    pub async fn begin(&self, op: Op, owner: RunRef<'_>, parent: Option<&Context>) -> Result<Started, Cancelled> {
        self.open(op, owner, parent, None).await
    }

    /// [`Observer::begin`] for an operation with an input: hooks see it (`input` in their
    /// event), and an `around` hook may answer `{"input": …}` to replace it for the hooks after
    /// it and for the operation, which gets the input as the hooks left it.
    pub async fn begin_with(
        &self,
        op: Op,
        owner: RunRef<'_>,
        parent: Option<&Context>,
        mut input: Value,
    ) -> Result<(Started, Value), Cancelled> {
        let started = self.open(op, owner, parent, Some(&mut input)).await?;
        Ok((started, input))
    }

    async fn open(&self, op: Op, owner: RunRef<'_>, parent: Option<&Context>, mut input: Option<&mut Value>) -> Result<Started, Cancelled> {
        let cx = match (&self.tracer, &op) {
            (None, _) => Context::new(),
            // A run is the root of its trace.
            (Some(t), Op::Run { .. }) => op.start(t, &Context::new(), owner),
            (Some(t), _) => op.start(t, &parent.cloned().unwrap_or_else(Context::current), owner),
        };
        if let Op::GroupChat { .. } = &op {
            tracing::info!(run = %owner.run_id, "group chat started");
        }
        let started =
            Started { op, cx, began: Instant::now(), run_id: owner.run_id.to_string(), owner: owner.owner.clone(), attempt: owner.attempt };
        let mut hooks = self.run_hooks(&started.op, Timing::Before, true, owner, input.as_deref_mut(), |_| {}).await;
        if hooks.is_ok() {
            hooks = self.run_hooks(&started.op, Timing::Around, true, owner, input, |p| p["phase"] = json!("before")).await;
        }
        if let Err(c) = hooks {
            started.cx.span().set_status(Status::error(c.0.clone()));
            started.cx.span().end();
            return Err(c);
        }
        Ok(started)
    }

    fn payload(op: &Op, timing: Timing, before: bool, owner: RunRef<'_>) -> Value {
        let [d, c, a] = op.hook_event(before);
        json!({
            "event": format!("{d}:{c}:{a}:{}", timing.as_str()),
            "domain": d, "component": c, "action": a, "timing": timing.as_str(),
            "run": {"id": owner.run_id, "job": owner.owner.to_string(), "attempt": owner.attempt},
            "data": op.fields(),
        })
    }

    /// Runs the hooks bound to `op` at `timing` on one side of it (`before`: `around` bindings
    /// are called on both), in priority order. Before the operation the first hook that
    /// answers `{"cancel": true, "reason": …}` (or `{"cancel": "<reason>"}`) stops the rest and
    /// cancels it; there, an `around` hook's `{"input": …}` replaces `input` (when the operation
    /// has one). A failing hook is logged and counted, nothing more. The event's JSON
    /// (`Self::payload`, `input`, then `fill`) is built only when a binding matches.
    async fn run_hooks(
        &self,
        op: &Op,
        timing: Timing,
        before: bool,
        owner: RunRef<'_>,
        mut input: Option<&mut Value>,
        fill: impl FnOnce(&mut Value),
    ) -> Result<(), Cancelled> {
        let Some(registry) = &self.registry else { return Ok(()) };
        let event = op.hook_event(before);
        let hooks: Vec<Bound> = {
            let all = self.hooks.read().unwrap_or_else(|e| e.into_inner());
            all.iter().filter(|b| b.binding.event.matches(event, timing)).cloned().collect()
        };
        if hooks.is_empty() {
            return Ok(());
        }
        let mut payload = Self::payload(op, timing, before, owner);
        if let Some(i) = input.as_deref() {
            payload["input"] = i.clone();
        }
        fill(&mut payload);
        for b in &hooks {
            let reply = registry.invoke_hook(&b.binding.plugin, &b.binding.hook, payload.clone()).await;
            let kv = |o: &str| {
                [KeyValue::new("hook", b.label.clone()), KeyValue::new("timing", timing.as_str()), KeyValue::new("outcome", o.to_string())]
            };
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => {
                    self.m.hooks.add(1, &kv("failed"));
                    tracing::warn!(hook = %b.label, event = %payload["event"], error = %e, "hook failed; the operation goes on");
                    continue;
                }
            };
            if let Some(why) = cancel_reason(&reply) {
                if before {
                    self.m.hooks.add(1, &kv("cancelled"));
                    let why = format!("cancelled by hook {}: {why}", b.label);
                    tracing::info!(hook = %b.label, event = %payload["event"], "{why}");
                    return Err(Cancelled(why));
                }
                tracing::warn!(hook = %b.label, event = %payload["event"], "hook asked to cancel after the fact; only before and around hooks can, before the operation");
            }
            if let Some(new) = reply.get("input") {
                match (&mut input, timing == Timing::Around && before) {
                    (Some(i), true) => {
                        tracing::info!(hook = %b.label, event = %payload["event"], "hook replaced the operation's input");
                        **i = new.clone();
                        payload["input"] = new.clone();
                    }
                    (None, true) => {
                        tracing::warn!(hook = %b.label, event = %payload["event"], "hook answered an input, but this operation's input cannot be replaced; ignored")
                    }
                    (_, false) => {
                        tracing::warn!(hook = %b.label, event = %payload["event"], "hook answered an input; only around hooks, before the operation, replace it; ignored")
                    }
                }
            }
            self.m.hooks.add(1, &kv("ok"));
            tracing::debug!(hook = %b.label, event = %payload["event"], reply = %reply, "hook called");
        }
        Ok(())
    }

    /// The workers whose lease lapsed, as `lamplighter.workers.lapsed` reports it (sampled on
    /// PostgreSQL).
    pub(crate) fn set_lapsed_workers(&self, n: usize) {
        self.lapsed_workers.store(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    /// The scheduler planned `jobs` scheduled jobs, its share of them among `workers`.
    pub(crate) fn set_schedule_share(&self, jobs: usize, workers: usize) {
        self.share[0].store(i64::try_from(jobs).unwrap_or(i64::MAX), Ordering::Relaxed);
        self.share[1].store(i64::try_from(workers).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    /// Whether this worker notices its group's run outcomes now.
    pub(crate) fn set_noticer(&self, noticing: bool) {
        self.share[2].store(i64::from(noticing), Ordering::Relaxed);
    }

    /// The queue depth the `lamplighter.queue.depth` gauge reports (sampled by the engine).
    pub(crate) fn set_queue_depth(&self, n: u64) {
        self.queue_depth.store(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    /// Whether the per-job gauges are on (`telemetry.metrics.per_job`).
    pub(crate) fn per_job(&self) -> bool {
        self.jobs.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Calls `each` with every per-job gauge and its jobs' values as last read (a job the
    /// gauge has no value for is left out); nothing while they are off. `/metrics` serves them
    /// from here, every job however many: OpenTelemetry's instruments keep a bounded number
    /// of series each (see [`Observer::export_job_gauges`]).
    /// `each` says whether to go on; the answer is whether every gauge was read.
    pub fn read_job_gauges(&self, mut each: impl FnMut(&JobGaugeKind, &mut dyn Iterator<Item = (&str, f64)>) -> bool) -> bool {
        let now = chrono::Utc::now();
        let Some(table) = job_table(&self.jobs) else { return true };
        JOB_GAUGES.iter().all(|kind| each(kind, &mut kind.values(&table, now)))
    }

    /// Registers the per-job gauges on `meter`, read from the same values at each collection:
    /// for a pushing exporter (OTLP), whose meter's provider keeps the series of at most
    /// `limit` jobs. With more jobs than that, the worker says so (once).
    pub fn export_job_gauges(&self, meter: &Meter, limit: usize) {
        self.jobs_exported.store(limit, Ordering::Relaxed);
        for kind in &JOB_GAUGES {
            let jobs = self.jobs.clone();
            let mut b = meter.f64_observable_gauge(kind.name).with_description(kind.description).with_callback(move |o| {
                for (job, v) in job_table(&jobs).iter().flat_map(|t| kind.values(t, chrono::Utc::now())) {
                    o.observe(v, &[KeyValue::new("job", job.to_string())]);
                }
            });
            if let Some(unit) = kind.unit {
                b = b.with_unit(unit);
            }
            b.build();
        }
    }

    /// The names of the jobs the per-job gauges were last read for (none while they are off).
    pub(crate) fn job_gauge_names(&self) -> Option<Arc<Vec<String>>> {
        job_table(&self.jobs).map(|t| t.names().clone())
    }

    /// The per-job gauges' values, read afresh (kept only while they are on).
    pub(crate) fn set_job_gauges(&self, values: JobTable) {
        let limit = self.jobs_exported.load(Ordering::Relaxed);
        if limit > 0 && values.len() > limit && !self.jobs_past_export.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                jobs = values.len(),
                limit,
                "OTLP carries the per-job gauges of {limit} jobs; the other jobs' are summed into one series labelled otel.metric.overflow. /metrics has every job's"
            );
        }
        let mut jobs = self.jobs.write().unwrap_or_else(|e| e.into_inner());
        if jobs.is_some() {
            *jobs = Some(Arc::new(values));
        }
    }

    /// Each limit's slots held and runs waiting, as sampled (every limit in force: 0 when
    /// none).
    pub(crate) fn set_limit_gauges(&self, values: std::collections::BTreeMap<String, (u64, u64)>) {
        *self.limits.write().unwrap_or_else(|e| e.into_inner()) = values;
    }

    /// A run that waited for a slot of `limit` got one after `waited`.
    pub(crate) fn limit_waited(&self, limit: &str, waited: std::time::Duration) {
        self.m.limit_wait.record(waited.as_secs_f64(), &[KeyValue::new("limit", limit.to_string())]);
    }

    /// A notification send ended: `outcome` is `delivered`, `retried` or `abandoned`.
    pub(crate) fn notification(&self, event: &str, outcome: &'static str) {
        self.m.notifications.add(1, &[KeyValue::new("event", event.to_string()), KeyValue::new("outcome", outcome)]);
    }

    /// A deadline of `job` was missed (told once, by this worker).
    pub(crate) fn deadline_missed(&self, job: &str, deadline: &'static str) {
        self.m.deadline_missed.add(1, &[KeyValue::new("job", job.to_string()), KeyValue::new("deadline", deadline)]);
    }

    /// `count` ticks of `job` were missed (told once, by this worker).
    pub(crate) fn ticks_missed(&self, job: &str, count: usize) {
        self.m.ticks_missed.add(count as u64, &[KeyValue::new("job", job.to_string())]);
    }

    // Point events.

    /// The worker fenced itself, stopping `runs` runs.
    pub(crate) fn fenced(&self, runs: usize) {
        self.m.fences.add(1, &[]);
        tracing::debug!(runs, "fenced");
    }

    /// `left` ends were not recorded; `refused` of them because the fence refused this
    /// worker's write (the runs still `running`, under a lease it no longer holds); the others
    /// were no longer running (cancelled or taken over meanwhile).
    pub(crate) fn ends_refused(&self, left: usize, refused: &[String]) {
        if left > refused.len() {
            tracing::debug!(runs = left - refused.len(), "ends not recorded: the runs were no longer running here");
        }
        if !refused.is_empty() {
            self.m.fenced_writes.add(refused.len() as u64, &[]);
            tracing::warn!(
                runs = ?refused,
                "the fence refused the end of runs: this worker no longer holds them (its lease ran out or its epoch is gone); \
                 they are recovered as interrupted and retried by their policy"
            );
        }
    }

    /// A run was created outside a tick (a trigger, a retry, a recovery); ticks count as
    /// [`Self::tick_fired`].
    pub(crate) fn run_created(&self, owner: &crate::run::Owner, trigger: crate::run::Trigger, run_id: &str) {
        self.m.runs_created.add(1, &[KeyValue::new("job", owner.to_string()), KeyValue::new("trigger", trigger.as_str())]);
        tracing::debug!(run = run_id, job = %owner, trigger = trigger.as_str(), "run created");
    }

    /// A run began executing here (`lateness`: start minus due, for scheduled runs).
    pub(crate) fn run_started(&self, run: &Run, lateness: Option<chrono::Duration>, resumed: bool) {
        self.m.running.add(1, &[]);
        if let Some(l) = lateness.filter(|_| !resumed && run.scheduled_at.is_some()) {
            self.m.lateness.record(l.num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6, &[KeyValue::new("job", run.owner.to_string())]);
        }
        tracing::debug!(run = %run.id, job = %run.owner, trigger = run.trigger.as_str(), attempt = run.attempt, lateness_ms = lateness.map(|d| d.num_milliseconds()), resumed, "run started");
    }

    /// A run's end was recorded.
    pub(crate) fn run_finished(
        &self,
        run: &Run,
        status: RunStatus,
        error: Option<&str>,
        waiting_until: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        self.m.running.add(-1, &[]);
        match status {
            RunStatus::WaitingApproval => {
                tracing::info!(run = %run.id, job = %run.owner, until = ?waiting_until, "run waits for approval; its slot is free")
            }
            RunStatus::Queued => {
                tracing::info!(run = %run.id, job = %run.owner, "a step of the run waits for a limit's slot; the run is queued again")
            }
            _ => tracing::info!(run = %run.id, job = %run.owner, status = status.as_str(), error = error.unwrap_or(""), "run finished"),
        }
    }

    pub(crate) fn tick_fired(&self, job: &str, tick: chrono::DateTime<chrono::Utc>, run_id: &str) {
        self.m.ticks.add(1, &[KeyValue::new("job", job.to_string()), KeyValue::new("outcome", "fired")]);
        tracing::debug!(job, %tick, run = run_id, "tick fired");
    }

    /// A tick recorded as a skipped run (paused job, or an overlap policy).
    pub(crate) fn tick_skipped(&self, job: &str, tick: chrono::DateTime<chrono::Utc>, run_id: &str) {
        self.m.ticks.add(1, &[KeyValue::new("job", job.to_string()), KeyValue::new("outcome", "skipped")]);
        tracing::info!(job, %tick, run = run_id, "tick skipped");
    }

    pub(crate) fn approval_requested(&self, run: &Run, step: &str) {
        self.m.approvals.add(1, &[KeyValue::new("event", "requested")]);
        tracing::info!(run = %run.id, job = %run.owner, step, "approval requested");
    }

    pub(crate) fn approval_decided(&self, run_id: &str, step: &str, approved: bool, by: &str) {
        self.m.approvals.add(1, &[KeyValue::new("event", if approved { "approved" } else { "rejected" })]);
        tracing::info!(run = run_id, step, approved, decided_by = by, "approval decided");
    }

    /// A config reload was applied (`Ok(jobs)`) or rejected.
    pub fn config_reloaded(&self, result: Result<usize, &str>) {
        match result {
            Ok(jobs) => {
                self.m.reloads.add(1, &[KeyValue::new("outcome", "applied")]);
                tracing::info!(jobs, "config reloaded");
            }
            Err(why) => {
                self.m.reloads.add(1, &[KeyValue::new("outcome", "rejected")]);
                tracing::error!("config reload rejected; the running config is kept: {why}");
            }
        }
    }

    /// A request to the worker's own MCP server (the control surface).
    pub fn mcp_request(&self, tool: &str, ok: bool) {
        self.m.mcp_requests.add(1, &[KeyValue::new("tool", tool.to_string()), KeyValue::new("outcome", if ok { "ok" } else { "error" })]);
    }
}

/// `{"cancel": true, "reason": "…"}` or `{"cancel": "<reason>"}` → the reason.
fn cancel_reason(reply: &Value) -> Option<String> {
    match reply.get("cancel")? {
        Value::Bool(true) => Some(reply.get("reason").and_then(Value::as_str).unwrap_or("no reason given").to_string()),
        Value::String(s) => Some(if s.is_empty() { "no reason given".into() } else { s.clone() }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_events_are_buffered_only_once_someone_follows_them() {
        let obs = Observer::none();
        let event = InternalEvent::ClaimedFromQueue { asked: 4, tasks: 2, runs: 2, claim_us: 10 };
        obs.emit(event.clone());
        // A worker nobody follows holds no buffer of them (0.7 MB, written whole when made).
        assert!(obs.internal.get().is_none());
        let mut rx = obs.internal_events();
        obs.emit(event.clone());
        assert_eq!(rx.try_recv().expect("the event emitted after subscribing"), event);
        assert!(rx.try_recv().is_err(), "the event before subscribing is not kept");
    }

    #[test]
    fn the_per_job_gauges_read_every_job_with_a_value_and_nothing_while_off() {
        let obs = Observer::none();
        let read = |obs: &Observer| {
            let mut seen = Vec::new();
            obs.read_job_gauges(|kind, jobs| {
                seen.push((kind.name, jobs.map(|(j, v)| (j.to_string(), v)).collect::<Vec<_>>()));
                true
            });
            seen
        };
        assert!(read(&obs).is_empty(), "off until configured");
        *obs.jobs.write().unwrap() = Some(Default::default());
        let t = |s| chrono::DateTime::from_timestamp(s, 0).unwrap();
        let mut values = std::collections::BTreeMap::new();
        for i in 0..3_000 {
            values.insert(format!("j{i:04}"), JobGauge { next_fire: Some(t(2_000_000_000 + i)), ..Default::default() });
        }
        values.get_mut("j0001").unwrap().last_success = Some(t(1_700_000_000));
        values.get_mut("j0002").unwrap().oldest_running = Some(chrono::Utc::now() - chrono::Duration::seconds(90));
        obs.set_job_gauges(values.into_iter().collect());
        let seen: std::collections::BTreeMap<_, _> = read(&obs).into_iter().collect();
        assert_eq!(seen.len(), 5, "each gauge, even one no job has a value of");
        assert_eq!(seen[metric::JOB_NEXT_FIRE].len(), 3_000, "every job, past OpenTelemetry's 2,000 series");
        assert_eq!(seen[metric::JOB_NEXT_FIRE][2999], ("j2999".to_string(), 2_000_002_999.0));
        assert_eq!(seen[metric::JOB_CONSECUTIVE_FAILURES].len(), 3_000);
        assert_eq!(seen[metric::JOB_LAST_SUCCESS], vec![("j0001".to_string(), 1_700_000_000.0)], "only jobs with a value");
        let running = &seen[metric::JOB_OLDEST_RUNNING];
        assert!(running.len() == 1 && running[0].0 == "j0002" && (89.0..120.0).contains(&running[0].1), "{running:?}");
        assert!(seen[metric::JOB_OLDEST_APPROVAL].is_empty());
        assert!(!obs.jobs_past_export.load(Ordering::Relaxed), "no exporter bounds them");
        let meter = opentelemetry::metrics::noop::NoopMeterProvider::new().meter("test");
        obs.export_job_gauges(&meter, 2_999);
        obs.set_job_gauges(Default::default());
        assert!(!obs.jobs_past_export.load(Ordering::Relaxed));
        obs.set_job_gauges((0..3_000).map(|i| (format!("j{i:04}"), JobGauge::default())).collect());
        assert!(obs.jobs_past_export.load(Ordering::Relaxed), "3,000 jobs, an exporter that keeps 2,999: said");
        *obs.jobs.write().unwrap() = None;
        assert!(read(&obs).is_empty(), "nothing once switched off");
    }

    #[test]
    fn a_hook_cancels_only_with_a_cancel_field() {
        assert_eq!(cancel_reason(&json!({"cancel": true, "reason": "maintenance"})), Some("maintenance".into()));
        assert_eq!(cancel_reason(&json!({"cancel": "freeze"})), Some("freeze".into()));
        assert_eq!(cancel_reason(&json!({"cancel": true})), Some("no reason given".into()));
        for keep in [json!({"cancel": false}), json!({}), json!("cancel"), json!({"action": "hook:x", "input": {"cancel": true}})] {
            assert_eq!(cancel_reason(&keep), None, "{keep}");
        }
    }

    #[test]
    fn hook_events_are_named_by_the_spec() {
        let name = |op: &Op, t: Timing| op.hook_event(t == Timing::Before).join(":");
        let s = String::from;
        assert_eq!(name(&Op::Run { job: s("nightly"), trigger: "schedule", attempt: 1 }, Timing::Before), "scheduler:nightly:job-execute");
        assert_eq!(name(&Op::Step { workflow: s("w"), step: s("a"), kind: "plugin" }, Timing::After), "workflow:w:step");
        assert_eq!(name(&Op::ModelCall { agent: s("x"), provider: s("p"), model: s("m") }, Timing::Before), "agent:x:model-call");
        assert_eq!(name(&Op::ToolUse { agent: s("x"), tool: s("t") }, Timing::OnError), "agent:x:tool-use");
        assert_eq!(name(&Op::PluginAction { plugin: s("file-read"), action: s("read") }, Timing::After), "plugin:file-read:action");
        assert_eq!(name(&Op::McpCall { server: s("fs"), tool: s("ls") }, Timing::After), "mcp:fs:tool-call");
        let chat = Op::GroupChat { step: s("c"), agents: vec![] };
        assert_eq!(name(&chat, Timing::Before), "orchestration:group-chat:start");
        assert_eq!(name(&chat, Timing::After), "orchestration:group-chat:end");
    }
}
