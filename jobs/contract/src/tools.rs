//! What the tools answer that the job service does not: a trigger's outcome, the catalog
//! (workflows, agents, plugins) and a reload's summary, and the lists the tools wrap.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::run::Run;
use crate::views::{Approval, JobSummary};

/// What `reload_config` (and SIGHUP) answers when the new config was applied.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ReloadSummary {
    /// Jobs in the new config.
    pub jobs: usize,
    /// Warnings found while loading, each with its `file:line:col` when known.
    pub warnings: Vec<String>,
}

/// What `pause_job` and `resume_job` answer: the job (by `name`), or with `tag` what the call
/// changed and every job of the tag.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct JobsChanged {
    #[serde(flatten)]
    pub job: Option<JobSummary>,
    #[serde(flatten)]
    pub group: Option<TagChange>,
}

/// A pause or resume of every job with a tag.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TagChange {
    pub tag: String,
    /// The jobs whose state this call changed (paused, or resumed), by name.
    pub changed: Vec<String>,
    /// Every job of the tag, as it is now.
    pub jobs: Vec<JobSummary>,
}

/// What `trigger_job` answers: the run (by `name`), or with `tag` a run of each job of the tag.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TriggerAnswer {
    #[serde(flatten)]
    pub run: Option<TriggerOutcome>,
    #[serde(flatten)]
    pub group: Option<TagTriggered>,
}

/// The runs a trigger by tag started, and the jobs of the tag it could not start.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TagTriggered {
    pub tag: String,
    /// One run a job, by job name.
    pub runs: Vec<TaggedRun>,
    /// Jobs of the tag that cannot run here, with why (a plugin that did not load, say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<TaggedRefusal>,
}

#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TaggedRun {
    pub job: String,
    pub run_id: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TaggedRefusal {
    pub job: String,
    pub reason: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct JobList {
    pub jobs: Vec<JobSummary>,
}

#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TriggerOutcome {
    /// The run started (or, with a repeated idempotency key, the earlier run).
    pub run_id: String,
    /// False when the idempotency key matched an earlier trigger.
    pub created: bool,
    /// With `wait`: the run as it stands when the call returns.
    pub run: Option<Run>,
    /// With `wait`: true when the run reached a final status before the call returned.
    pub finished: bool,
    /// Why waiting stopped before the run finished (timeout, the caller cancelled, shutdown).
    pub note: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ApprovalList {
    /// Steps waiting for a decision, oldest run first.
    pub approvals: Vec<Approval>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LimitList {
    /// Every limit of `scheduling.limits`, by name, and any a waiting or running run still
    /// takes after a reload removed it.
    pub limits: Vec<LimitView>,
}

/// One limit: its slots, who holds them and who waits, per key of a keyed limit.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LimitView {
    pub name: String,
    /// Slots per key; none: no longer configured (its runs are no longer held back).
    pub slots: Option<u32>,
    /// Slots held, over every key.
    pub held: usize,
    /// Runs waiting, over every key.
    pub waiting: usize,
    /// Each key with holders or waiters (one, with key `""`, for a limit without keys).
    pub keys: Vec<LimitKeyView>,
}

/// One key of a limit (its N slots count apart).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LimitKeyView {
    pub key: String,
    /// Runs holding a slot: running, or handed to the queue and about to start (the first 100).
    pub holders: Vec<String>,
    /// Runs waiting for a slot, first in line first (the first 100).
    pub waiting: Vec<String>,
    /// How many wait in all.
    pub waiting_count: usize,
    /// Since when the longest of them has waited.
    pub waiting_since: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct WorkflowInfo {
    pub name: String,
    pub description: Option<String>,
    /// `manual` or `scheduled`, as written in the config (informational).
    pub trigger: Option<String>,
    /// The steps in order (a `parallel`'s children under it).
    pub steps: Vec<StepOutline>,
    /// Why it cannot run, when it cannot.
    pub disabled: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StepOutline {
    pub id: String,
    /// plugin, agent, condition, approval, parallel or group_chat.
    #[serde(rename = "type")]
    pub step_type: String,
    /// What it runs: `plugin.action`, the agent, the condition and its branches, the approval's timeout.
    pub does: String,
    /// Runs only when this renders true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepOutline>,
}

#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct WorkflowList {
    pub workflows: Vec<WorkflowInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AgentInfo {
    pub name: String,
    pub description: Option<String>,
    /// The model alias it uses (its own `model`, else `ai.default_model`).
    pub model: Option<String>,
    /// The provider the alias resolved to.
    pub provider: Option<String>,
    /// What the provider calls the model.
    pub model_id: Option<String>,
    pub plugins: Vec<String>,
    pub mcp_servers: Vec<String>,
    /// The tools it is offered (`plugin.action`; `server.*` for all of an MCP server's tools).
    pub tools: Vec<String>,
    /// Agents it may delegate to.
    pub delegates: Vec<String>,
    /// `auto`, `deny` or `ask`.
    pub tool_approval: String,
    pub enabled: bool,
    /// Why it cannot run, when it cannot.
    pub disabled: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AgentList {
    pub agents: Vec<AgentInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ActionView {
    pub name: String,
    pub description: String,
    /// JSON Schema of the action's parameters.
    pub parameters: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PluginView {
    pub name: String,
    pub version: String,
    /// `builtin`, `wasm` or `native`.
    pub kind: String,
    pub description: String,
    pub actions: Vec<ActionView>,
    /// Why the plugin cannot be used, when it cannot.
    pub error: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PluginList {
    pub plugins: Vec<PluginView>,
}
