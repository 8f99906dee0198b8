//! The raw config model: serde types that mirror the YAML exactly, with the seed's field names.
//! Nothing here is validated; `compile` turns these into the resolved model.
//!
//! Every struct denies unknown fields so that the generated JSON Schema says so, and the
//! unknown-key pass in `schema.rs` can answer a typo with "did you mean".

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A free-form YAML value (job input, plugin parameters).
pub type Any = serde_json::Value;

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Lamplighter configuration")]
pub struct RawConfig {
    pub framework: Option<Framework>,
    pub ai: Option<Ai>,
    /// Per-provider limits (also accepted as `ai.rate_limits`, as in the seed).
    pub rate_limits: Option<BTreeMap<String, RateLimit>>,
    pub agents: Option<BTreeMap<String, Agent>>,
    pub pipelines: Option<BTreeMap<String, Pipeline>>,
    pub workflows: Option<BTreeMap<String, Workflow>>,
    pub scheduling: Option<Scheduling>,
    pub plugins: Option<Plugins>,
    pub hooks: Option<Hooks>,
    pub mcp: Option<Mcp>,
    pub worker: Option<Worker>,
    pub telemetry: Option<Telemetry>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Framework {
    pub name: Option<String>,
    pub version: Option<String>,
    /// Minimum log level: trace, debug, info, warn, error (the seed's .NET names are accepted).
    pub log_level: Option<String>,
    /// Working data directory; relative paths resolve against the process working directory.
    pub data_dir: Option<String>,
    /// More YAML files to merge, relative to the importing file; globs allowed.
    pub imports: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Ai {
    pub default_model: Option<String>,
    pub providers: Option<BTreeMap<String, Provider>>,
    pub rate_limits: Option<BTreeMap<String, RateLimit>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    /// Azure OpenAI resource endpoint.
    pub endpoint: Option<String>,
    /// Any OpenAI-compatible base URL.
    pub base_url: Option<String>,
    pub api_key: Option<String>,
    pub api_version: Option<String>,
    pub models: Option<BTreeMap<String, Model>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Model {
    pub id: String,
    pub deployment_name: Option<String>,
    pub description: Option<String>,
    pub api_type: Option<String>,
    pub max_tokens: Option<u32>,
    pub default_temperature: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    pub name: Option<String>,
    pub description: Option<String>,
    pub model: Option<String>,
    pub provider: Option<String>,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    pub max_iters: Option<u32>,
    pub system_prompt: Option<String>,
    pub system_prompt_file: Option<String>,
    pub skills: Option<Vec<String>>,
    pub plugins: Option<Vec<String>>,
    pub mcp_servers: Option<Vec<String>>,
    pub allowed_actions: Option<Vec<String>>,
    pub allowed_commands: Option<Vec<String>>,
    pub working_directory: Option<String>,
    pub delegates: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pipeline {
    pub description: Option<String>,
    /// Agent names, run in order; each gets the previous one's output.
    pub steps: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Workflow {
    pub name: Option<String>,
    pub description: Option<String>,
    /// `manual` or `scheduled` (informational, as in the seed).
    pub trigger: Option<String>,
    pub steps: Vec<Step>,
}

/// One workflow step. Flat, as in the seed: which fields apply depends on `type`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub agent: Option<String>,
    pub plugin: Option<String>,
    pub action: Option<String>,
    pub input: Option<Any>,
    pub parameters: Option<Any>,
    pub condition: Option<String>,
    pub then: Option<Vec<String>>,
    #[serde(rename = "else")]
    pub otherwise: Option<Vec<String>>,
    pub when: Option<String>,
    pub steps: Option<Vec<Step>>,
    pub agents: Option<Vec<String>>,
    pub max_iterations: Option<u32>,
    pub timeout: Option<String>,
    pub default_decision: Option<String>,
    pub on_reject: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Scheduling {
    pub storage: Option<Storage>,
    /// Default IANA time zone for jobs (default UTC).
    ///
    /// Across daylight-saving changes (as cronie does it): a cron job whose seconds, minute or
    /// hour field starts with `*` (`*/15 * * * *`, `0 * * * *`) follows real time — it fires at
    /// every instant whose local time matches, so it keeps running through both passes of the
    /// repeated autumn hour and simply continues across the spring gap. Every other cron job
    /// (a fixed time of day such as `30 2 * * *`, lists, ranges) fires a repeated local time
    /// once, at its first occurrence, and a local time inside the spring gap at the same offset
    /// after it (02:30 → 03:30); two entries landing on one instant fire once. `every:` and
    /// `at:` are instants and are unaffected.
    pub timezone: Option<String>,
    pub jobs: Option<BTreeMap<String, Job>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Storage {
    /// `sqlite` (default) or `postgres`.
    pub provider: Option<String>,
    /// A sqlx URL (`sqlite://…`, `postgres://…`) or the seed's `Data Source=…` form.
    pub connection_string: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub description: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub workflow: Option<String>,
    pub agent: Option<String>,
    pub plugin: Option<String>,
    pub action: Option<String>,
    pub input: Option<Any>,
    pub parameters: Option<Any>,
    /// 5-field cron (minute resolution), 6-field with seconds, or a macro such as `@daily`.
    pub cron: Option<String>,
    /// A fixed interval such as `90s` or `15m`.
    pub every: Option<String>,
    /// A one-shot RFC 3339 instant.
    pub at: Option<String>,
    /// IANA time zone; defaults to `scheduling.timezone`, then UTC.
    ///
    /// Across daylight-saving changes (as cronie does it): a cron job whose seconds, minute or
    /// hour field starts with `*` (`*/15 * * * *`, `0 * * * *`) follows real time — it fires at
    /// every instant whose local time matches, so it keeps running through both passes of the
    /// repeated autumn hour and simply continues across the spring gap. Every other cron job
    /// (a fixed time of day such as `30 2 * * *`, lists, ranges) fires a repeated local time
    /// once, at its first occurrence, and a local time inside the spring gap at the same offset
    /// after it (02:30 → 03:30); two entries landing on one instant fire once. `every:` and
    /// `at:` are instants and are unaffected.
    pub timezone: Option<String>,
    pub enabled: Option<bool>,
    /// `skip`, `latest` (default) or `all`.
    pub catch_up: Option<String>,
    pub catch_up_window: Option<String>,
    /// `forbid` (default), `allow`, `replace` or `queue`.
    pub overlap: Option<String>,
    pub retries: Option<Retries>,
    pub timeout: Option<String>,
    pub jitter: Option<String>,
    pub retention: Option<Retention>,
    pub working_directory: Option<String>,
    pub allowed_commands: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Retries {
    /// Retries after the first attempt.
    pub max: Option<u32>,
    /// `exponential` or `fixed`.
    pub backoff: Option<String>,
    pub initial: Option<String>,
    pub max_delay: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    pub max_runs: Option<u32>,
    pub max_age: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Plugins {
    pub dirs: Option<Vec<String>>,
    pub native_trust_dirs: Option<Vec<String>>,
    pub global: Option<Vec<String>>,
    pub per_agent: Option<BTreeMap<String, Vec<String>>>,
    /// Limits and grants for WASM plugins (Lamplighter's addition to the seed's section).
    pub wasm: Option<WasmPlugins>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WasmPlugins {
    /// Fuel per call, about one unit per instruction (default 1000000).
    pub fuel: Option<u64>,
    /// Most linear memory per call in MiB (default 16).
    pub memory_mb: Option<u64>,
    /// Wall time per call, e.g. "5s" (default 5s).
    pub timeout: Option<String>,
    /// Capabilities plugins may be granted when their manifest asks: config-read, fs-read,
    /// fs-write, http-request, ai, mcp (default none).
    pub capabilities: Option<Vec<String>>,
    /// What `config_get` answers, per plugin name.
    pub config: Option<BTreeMap<String, serde_json::Value>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Hooks {
    pub bindings: Option<Vec<HookBinding>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HookBinding {
    pub event: String,
    pub plugin: String,
    pub hook: String,
    pub priority: Option<i32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Mcp {
    pub servers: Option<BTreeMap<String, McpServer>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub url: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Worker {
    /// Unique worker name; default `<host>-<pid>-<random>`.
    pub name: Option<String>,
    pub concurrency: Option<u32>,
    pub shutdown_grace: Option<String>,
    pub mcp: Option<WorkerMcp>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerMcp {
    /// `http` (default) or `stdio`; the HTTP listener always serves health checks.
    pub transport: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub auth: Option<Auth>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    /// `none` or `bearer`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub token: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Telemetry {
    pub enabled: Option<bool>,
    pub service_name: Option<String>,
    pub service_version: Option<String>,
    pub resource_attributes: Option<BTreeMap<String, String>>,
    pub traces: Option<Signal>,
    pub metrics: Option<Signal>,
    pub logs: Option<Signal>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Signal {
    pub exporter: Option<String>,
    pub endpoint: Option<String>,
    pub enable_sensitive_data: Option<bool>,
    pub sampling: Option<Sampling>,
    pub export_interval_ms: Option<u64>,
    pub min_level: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    pub strategy: Option<String>,
    pub ratio: Option<f64>,
}
