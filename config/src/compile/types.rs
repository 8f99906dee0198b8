//! The resolved config that compiling produces: [`Config`], its sections' types, and [`Disabled`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::ai::{Agent, Budget, McpServer, ModelRef, Pipeline, Provider, Secret, resolve_model};
use crate::load::{SourceMap, keys};
use crate::observe::{HookBinding, TelemetryConfig};
use crate::schedule::Schedule;
use crate::workflow::Workflow;

/// What a job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Workflow(String),
    Agent(String),
    Plugin { plugin: String, action: String },
}

impl Target {
    pub fn kind(&self) -> &'static str {
        match self {
            Target::Workflow(_) => "workflow",
            Target::Agent(_) => "agent",
            Target::Plugin { .. } => "plugin",
        }
    }

    /// `workflow:x`, `agent:x`, `plugin:p.a`: what `worker.mcp.manage_jobs.targets` patterns
    /// match.
    pub fn pattern_name(&self) -> String {
        match self {
            Target::Workflow(w) => format!("workflow:{w}"),
            Target::Agent(a) => format!("agent:{a}"),
            Target::Plugin { plugin, action } => format!("plugin:{plugin}.{action}"),
        }
    }

    /// `workflow "x"`, `plugin action "p.a"` — for messages and listings.
    pub fn describe(&self) -> String {
        match self {
            Target::Workflow(w) => format!("workflow {w}"),
            Target::Agent(a) => format!("agent {a}"),
            Target::Plugin { plugin, action } => format!("plugin {plugin}.{action}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUp {
    Skip,
    #[default]
    Latest,
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    #[default]
    Forbid,
    Allow,
    Replace,
    Queue,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backoff {
    /// `initial × 2^n`, capped at `max_delay`.
    Exponential {
        initial: Duration,
        max_delay: Duration,
    },
    Fixed(Duration),
    /// The seed's default: 60 s, 300 s, 900 s. Shared: every job without `retries:` holds the
    /// same steps.
    Steps(Arc<[Duration]>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max: u32,
    pub backoff: Backoff,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        static SEED_STEPS: LazyLock<Arc<[Duration]>> =
            LazyLock::new(|| Arc::from([Duration::from_secs(60), Duration::from_secs(300), Duration::from_secs(900)]));
        Self { max: 3, backoff: Backoff::Steps(SEED_STEPS.clone()) }
    }
}

impl RetryPolicy {
    /// The delay before retry number `n` (1-based).
    pub fn delay(&self, n: u32) -> Duration {
        let n = n.max(1);
        match &self.backoff {
            Backoff::Fixed(d) => *d,
            Backoff::Exponential { initial, max_delay } => {
                let factor = 2u32.checked_pow(n - 1).unwrap_or(u32::MAX);
                initial.checked_mul(factor).unwrap_or(*max_delay).min(*max_delay)
            }
            Backoff::Steps(steps) => steps.get(n as usize - 1).or(steps.last()).copied().unwrap_or_default(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retention {
    pub max_runs: Option<u32>,
    pub max_age: Option<Duration>,
}

/// A JSON value kept as its compact text. A job's parameters are read once a run, and a small
/// object as a `serde_json` map takes a whole map node (640 bytes for two keys, measured); as
/// text it takes its length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonText(Box<str>);

impl JsonText {
    pub fn new(value: &serde_json::Value) -> Self {
        JsonText(value.to_string().into_boxed_str())
    }

    /// The value again. The text was written from a value nested at most as deep as YAML
    /// allows (128 levels, within serde_json's own limit), so it reads back whole.
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or_else(|e| serde_json::Value::String(format!("unreadable parameters ({e}): {}", self.0)))
    }
}

/// A validated job definition.
#[derive(Debug, Clone, PartialEq)]
pub struct JobConfig {
    pub name: String,
    pub description: Option<String>,
    pub target: Target,
    /// Boxed, as most jobs have none: the map of 10,000 jobs holds each one inline.
    pub input: Option<Box<serde_json::Value>>,
    /// Kept as JSON text: a run takes its own copy as a value ([`JsonText::value`]).
    pub parameters: Option<JsonText>,
    /// Parsed once, here; `None` for a job that is only triggered by hand (or, in a config
    /// that failed to load, one whose schedule is an error).
    pub schedule: Option<Arc<Schedule>>,
    /// IANA zone name as written, or the `scheduling.timezone` default.
    pub timezone: String,
    pub enabled: bool,
    pub catch_up: CatchUp,
    pub catch_up_window: Duration,
    pub overlap: Overlap,
    pub retries: RetryPolicy,
    pub timeout: Option<Duration>,
    pub jitter: Option<Duration>,
    pub retention: Retention,
    pub working_directory: Option<PathBuf>,
    pub allowed_commands: Box<[String]>,
    /// Limits on each run of an agent job, over the agent's own; `None` when it sets none (most
    /// jobs: boxed, for the same reason as `input`).
    pub budget: Option<Box<Budget>>,
    /// Its own `notify:` rules; `None` takes `scheduling.notify` ([`Config::notify`]).
    pub notify: Option<Vec<crate::NotifyRule>>,
    /// Its tags and `after` (most jobs have neither: boxed).
    pub together: Option<Box<Together>>,
}

impl JobConfig {
    /// Its `tags`, each once, in the order written.
    pub fn tags(&self) -> &[String] {
        self.together.as_ref().map_or(&[], |t| &t.tags)
    }

    /// What it runs after, if anything.
    pub fn after(&self) -> Option<&After> {
        self.together.as_ref().and_then(|t| t.after.as_ref())
    }

    /// The limits its runs hold a slot of, each once, in the order written.
    pub fn limits(&self) -> &[LimitUse] {
        self.together.as_ref().map_or(&[], |t| &t.limits)
    }

    /// Its deadlines (its own, or `scheduling.deadline`), if it has any.
    pub fn deadline(&self) -> Option<&Deadline> {
        self.together.as_ref().and_then(|t| t.deadline.as_ref()).filter(|d| !d.is_empty())
    }
}

/// How a job works with others: its tags, and the jobs it runs after.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Together {
    pub tags: Vec<String>,
    pub after: Option<After>,
    pub limits: Vec<LimitUse>,
    pub deadline: Option<Deadline>,
}

/// When a job's tick must have started, or its run finished (SPEC §4a), and what a miss does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deadline {
    /// After the tick's scheduled instant (ticks only: cron, every, at, catch-up).
    pub start_within: Option<Duration>,
    /// After the tick, or after the run was asked for (any other trigger); retries count.
    pub finish_within: Option<Duration>,
    /// The first such local time (the job's zone) after the tick, or after the run was asked for.
    pub finish_by: Option<chrono::NaiveTime>,
    pub on_miss: OnMiss,
}

/// What a missed deadline does besides being told.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnMiss {
    #[default]
    Notify,
    /// Stops a run past `finish_within` or `finish_by` (cancelled).
    Cancel,
}

impl Deadline {
    /// Sets none: a job that opts out of `scheduling.deadline` with `deadline: {}`.
    pub fn is_empty(&self) -> bool {
        self.start_within.is_none() && self.finish_within.is_none() && self.finish_by.is_none()
    }
}

/// One entry of a job's `limits:`: a slot of `scheduling.limits.<name>`, per distinct `key`
/// (a template over the run's input; `None`: one pool for every run).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LimitUse {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// `after:` — a run once every job named has a new qualifying outcome (one run per set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct After {
    /// The upstream jobs, each once, in the order written.
    pub jobs: Vec<String>,
    pub on: AfterOn,
    /// How long an outcome waits for the others'; `None`: for ever.
    pub within: Option<Duration>,
}

/// Which outcomes of an upstream job count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterOn {
    Success,
    Failure,
    /// Any outcome of a run that ran: succeeded, failed, timed out, cancelled, interrupted.
    Finished,
}

impl AfterOn {
    pub fn as_str(self) -> &'static str {
        match self {
            AfterOn::Success => "success",
            AfterOn::Failure => "failure",
            AfterOn::Finished => "finished",
        }
    }
}

// A config of 10,000 jobs holds 10,000 of these inline in its map's nodes: what most jobs leave
// unset is boxed (`input`, `budget`), and this keeps it so.
const _: () = assert!(std::mem::size_of::<JobConfig>() <= 360);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageConfig {
    Sqlite {
        path: PathBuf,
    },
    /// `url` may hold a password: `Debug` redacts it.
    Postgres {
        url: Secret,
        pool_size: u32,
        statement_timeout: Duration,
    },
}

/// The default of `worker.lease`.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The default of `scheduling.storage.pool_size`.
pub const DEFAULT_PG_POOL_SIZE: u32 = 10;
/// The default of `scheduling.storage.statement_timeout`.
pub const DEFAULT_PG_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpAuth {
    None,
    Bearer {
        tokens: Vec<ApiToken>,
    },
    /// An OAuth 2.1 resource server (SPEC §8a): access tokens of `oauth.issuer`, and the
    /// static `tokens` beside them (lampctl, CI), possibly none.
    OAuth {
        oauth: OAuthSettings,
        tokens: Vec<ApiToken>,
    },
}

impl McpAuth {
    /// The static bearer tokens, of either kind of auth.
    pub fn tokens(&self) -> &[ApiToken] {
        match self {
            McpAuth::None => &[],
            McpAuth::Bearer { tokens } | McpAuth::OAuth { tokens, .. } => tokens,
        }
    }
}

/// `worker.mcp.auth.oauth`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthSettings {
    /// As the provider writes it (`iss` must equal it).
    pub issuer: String,
    /// The MCP endpoint's public URL: the resource, and the `aud` a token must carry.
    pub audience: String,
    /// The scope of each role, in [`Role::ALL`] order.
    pub scopes: [String; 3],
    pub leeway: Duration,
    /// Other `aud` values accepted besides `audience`.
    pub token_audiences: Vec<String>,
}

impl OAuthSettings {
    /// The scope that gives `role`.
    pub fn scope_of(&self, role: Role) -> &str {
        &self.scopes[role as usize]
    }
}

/// What a token may do over MCP, each role including the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Lists, gets, follow, resources.
    Read,
    /// + pause, resume, trigger, cancel, approve, reject, run workflows.
    Operate,
    /// + create, change, delete and backfill jobs; reload.
    Manage,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Read, Role::Operate, Role::Manage];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
            Role::Manage => "manage",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Role::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| format!("\"{s}\" is not a role; roles: read, operate, manage"))
    }
}

/// A bearer token with its holder's name and role. `Debug` does not show the token.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken {
    pub name: String,
    pub token: String,
    pub role: Role,
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiToken").field("name", &self.name).field("token", &"<redacted>").field("role", &self.role).finish()
    }
}

/// TLS on the worker's listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpTls {
    /// Plain HTTP: loopback only, unless a proxy in front ends TLS.
    Off,
    /// The worker serves TLS with these files (PEM), re-read on reload.
    Files { cert_file: PathBuf, key_file: PathBuf, client_ca_file: Option<PathBuf> },
    /// `terminated_by_proxy: true`: a proxy in front ends TLS; the worker speaks plain HTTP.
    Proxy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpTransport {
    Http,
    Stdio,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    pub name: Option<String>,
    pub concurrency: usize,
    pub shutdown_grace: Duration,
    /// How long the worker's runs stay its own without a heartbeat (`worker.lease`).
    pub lease: Duration,
    pub host: String,
    pub port: u16,
    pub transport: McpTransport,
    pub auth: McpAuth,
    pub tls: McpTls,
    /// `worker.mcp.allowed_hosts`: names the worker may be reached by beyond loopback and `host`.
    pub allowed_hosts: Vec<String>,
    /// `worker.mcp.manage_jobs`: what MCP clients may do to jobs at runtime.
    pub manage_jobs: ManageJobs,
}

/// `worker.mcp.manage_jobs`: whether MCP clients may create, change, delete and backfill jobs,
/// and within what bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManageJobs {
    pub enabled: bool,
    /// Patterns over `workflow:NAME`, `agent:NAME` and `plugin:PLUGIN.ACTION` (`*` matches any
    /// run of characters); `None`: the default (every workflow, agent and plugin action but
    /// `shell-exec`'s).
    pub targets: Option<Vec<String>>,
    pub max_jobs: u32,
    pub max_definition_bytes: usize,
    pub max_backfill: u32,
    /// The most a runtime job may allow `shell-exec` to run; empty: no bound.
    pub allowed_commands: Vec<String>,
    /// Folders a runtime job's working directory may be in (absolute).
    pub working_directories: Vec<PathBuf>,
}

impl ManageJobs {
    pub const DEFAULT_MAX_JOBS: u32 = 1000;
    pub const DEFAULT_MAX_DEFINITION_BYTES: usize = 65536;
    pub const DEFAULT_MAX_BACKFILL: u32 = 100;
    /// The patterns in force when none are configured, as a message shows them.
    pub const DEFAULT_TARGETS: &str = "workflow:*, agent:*, and plugin:* but shell-exec";

    /// Off, with the defaults, working directories in `data_dir`.
    pub fn off(data_dir: &std::path::Path) -> Self {
        Self {
            enabled: false,
            targets: None,
            max_jobs: Self::DEFAULT_MAX_JOBS,
            max_definition_bytes: Self::DEFAULT_MAX_DEFINITION_BYTES,
            max_backfill: Self::DEFAULT_MAX_BACKFILL,
            allowed_commands: Vec::new(),
            working_directories: vec![data_dir.to_path_buf()],
        }
    }

    /// Whether a runtime job may run `target`.
    pub fn allows(&self, target: &Target) -> bool {
        let name = target.pattern_name();
        match &self.targets {
            Some(patterns) => patterns.iter().any(|p| glob(p, &name)),
            None => !matches!(target, Target::Plugin { plugin, .. } if plugin == "shell-exec"),
        }
    }

    /// The allowlist as a message shows it.
    pub fn targets_text(&self) -> String {
        match &self.targets {
            Some(p) if p.is_empty() => "none".into(),
            Some(p) => p.join(", "),
            None => Self::DEFAULT_TARGETS.into(),
        }
    }
}

/// `*` matches any run of characters (none included); everything else matches itself.
fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || !text[first.len()..].ends_with(last) || text.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Limits and grants for WASM plugins (`plugins.wasm`).
#[derive(Debug, Clone, PartialEq)]
pub struct WasmConfig {
    pub fuel: u64,
    pub memory_bytes: u64,
    pub timeout: Duration,
    pub capabilities: Vec<String>,
    pub plugin_config: BTreeMap<String, serde_json::Value>,
    /// `http.allowed_hosts`: `host` or `*.suffix`.
    pub http_allowed_hosts: Vec<String>,
    pub http_timeout: Duration,
    pub http_max_response_bytes: usize,
    /// `ai.models`: aliases `ai_complete` may ask for (empty: the default model only).
    pub ai_models: Vec<String>,
    pub ai_max_tokens: u32,
    /// `mcp.tools`: `server.tool` or `server.*` patterns `mcp_call` may call.
    pub mcp_tools: Vec<String>,
}

/// Capabilities a WASM plugin can be granted (`plugins.wasm.capabilities`).
pub const WASM_CAPABILITIES: &[&str] = &["config-read", "fs-read", "fs-write", "http-request", "ai", "mcp"];

/// The resolved configuration the rest of the program uses.
#[derive(Debug, Clone)]
pub struct Config {
    pub root: PathBuf,
    /// What the config's relative paths are read from (the working directory it was loaded in).
    pub base_dir: PathBuf,
    /// `framework.name` and `framework.version`: which config this is (`config validate` says).
    pub name: String,
    pub version: Option<String>,
    pub data_dir: PathBuf,
    /// A `tracing` filter directive (`info`, `debug`, …).
    pub log_level: Option<String>,
    pub default_timezone: String,
    pub storage: StorageConfig,
    /// Shared, not copied, with what the engine keeps of the config in force: a config of many
    /// jobs is resident once.
    pub jobs: Arc<BTreeMap<String, JobConfig>>,
    /// `scheduling.notify`: the rules of every job that sets none.
    pub notify: Vec<crate::NotifyRule>,
    /// `scheduling.limits`: each limit's slots, by name.
    pub limits: BTreeMap<String, u32>,
    /// `scheduling.calendars`, resolved, by name.
    pub calendars: BTreeMap<String, Arc<crate::Calendar>>,
    /// `scheduling.deadline`: the deadline of every job that sets none.
    pub deadline: Option<Deadline>,
    /// `ai.default_model`: the alias of agents that name none.
    pub default_model: Option<String>,
    pub providers: BTreeMap<String, Provider>,
    pub agents: BTreeMap<String, Agent>,
    pub pipelines: BTreeMap<String, Pipeline>,
    pub workflows: BTreeMap<String, Workflow>,
    pub mcp_servers: BTreeMap<String, McpServer>,
    /// The skills of `skills.dirs`, by name.
    pub skills: BTreeMap<String, crate::ai::Skill>,
    pub plugin_dirs: Vec<PathBuf>,
    pub wasm: WasmConfig,
    pub worker: WorkerConfig,
    pub telemetry: TelemetryConfig,
    /// `hooks.bindings`, in priority order (lower first; ties keep the file's order).
    pub hooks: Vec<HookBinding>,
    /// Things that are defined but cannot work, e.g. `agent "x"` → why.
    pub disabled: BTreeMap<Disabled, String>,
    pub sources: SourceMap,
    /// The merged YAML, for `config show` and for locating what validation finds; a running
    /// worker drops it ([`Config::drop_merged`]).
    pub merged: serde_yaml::Value,
}

impl Config {
    /// Drops the merged YAML (as large as the rest of the config together), once validation is
    /// over: findings made without it are located at the item they are about.
    pub fn drop_merged(&mut self) {
        self.merged = serde_yaml::Value::Null;
    }

    /// The notification rules of `job` (its own, or the default).
    pub fn notify_rules<'c>(&'c self, job: &'c JobConfig) -> &'c [crate::NotifyRule] {
        job.notify.as_deref().unwrap_or(&self.notify)
    }

    /// `file:line:col` of a path such as `["scheduling","jobs","x","cron"]`.
    pub fn locate(&self, path: &[&str]) -> Option<crate::Location> {
        self.sources.locate(&keys(path))
    }

    /// A model alias resolved to its provider and model, by the rule validation applies:
    /// under `provider` when given, else under the first provider (by name) defining it.
    pub fn resolve_model(&self, provider: Option<&str>, alias: &str) -> Option<ModelRef> {
        resolve_model(&self.providers, provider, alias)
    }
}

/// What [`Config::disabled`] names: a thing that is defined but cannot work here.
///
/// Displayed as the text messages name it (`provider "x"`, `MCP server "x"`, `hook p.h`,
/// `telemetry export`, …). The variants are declared in the order of those texts, so the
/// derived order sorts the kinds as the texts do.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Disabled {
    /// An MCP server under `mcp.servers`, by name.
    McpServer(String),
    /// An agent, by name.
    Agent(String),
    /// A hook binding, by its label (`plugin.hook`).
    Hook(String),
    /// A job, by name (one the environment breaks, e.g. its plugin did not load).
    Job(String),
    /// A provider under `ai.providers`, by name.
    Provider(String),
    /// Telemetry export (the worker found its settings unusable).
    TelemetryExport,
    /// A workflow, by name.
    Workflow(String),
}

impl Disabled {
    /// The agent's name, for an agent.
    pub fn agent(&self) -> Option<&str> {
        match self {
            Disabled::Agent(name) => Some(name),
            _ => None,
        }
    }

    /// The job's name, for a job.
    pub fn job(&self) -> Option<&str> {
        match self {
            Disabled::Job(name) => Some(name),
            _ => None,
        }
    }
}

impl fmt::Display for Disabled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disabled::McpServer(name) => write!(f, "MCP server \"{name}\""),
            Disabled::Agent(name) => write!(f, "agent \"{name}\""),
            Disabled::Hook(label) => write!(f, "hook {label}"),
            Disabled::Job(name) => write!(f, "job \"{name}\""),
            Disabled::Provider(name) => write!(f, "provider \"{name}\""),
            Disabled::TelemetryExport => f.write_str("telemetry export"),
            Disabled::Workflow(name) => write!(f, "workflow \"{name}\""),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_default_retries() {
        let r = RetryPolicy::default();
        assert_eq!(r.max, 3);
        assert_eq!([r.delay(1), r.delay(2), r.delay(3)], [60, 300, 900].map(Duration::from_secs));
    }

    #[test]
    fn exponential_backoff_is_capped() {
        let r =
            RetryPolicy { max: 10, backoff: Backoff::Exponential { initial: Duration::from_secs(10), max_delay: Duration::from_secs(60) } };
        assert_eq!(r.delay(1), Duration::from_secs(10));
        assert_eq!(r.delay(3), Duration::from_secs(40));
        assert_eq!(r.delay(4), Duration::from_secs(60));
        assert_eq!(r.delay(40), Duration::from_secs(60));
    }

    /// The texts are those the disabled items were always named by, and the kinds sort as
    /// those texts do.
    #[test]
    fn disabled_items_read_and_sort_as_their_texts() {
        let items = [
            (Disabled::McpServer("s".into()), "MCP server \"s\""),
            (Disabled::Agent("a".into()), "agent \"a\""),
            (Disabled::Hook("p.h".into()), "hook p.h"),
            (Disabled::Job("j".into()), "job \"j\""),
            (Disabled::Provider("p".into()), "provider \"p\""),
            (Disabled::TelemetryExport, "telemetry export"),
            (Disabled::Workflow("w".into()), "workflow \"w\""),
        ];
        for (item, text) in &items {
            assert_eq!(item.to_string(), *text);
        }
        assert!(items.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
    }
}
