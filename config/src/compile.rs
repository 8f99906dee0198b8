//! `compile`: raw config → resolved, validated config. Collects every error with its location;
//! checks names across sections; decides what is disabled (e.g. an agent whose provider key is
//! unset) and why.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;

use crate::ai::{
    Agent, ApprovalMode, Budget, DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_ITERS, DEFAULT_MAX_RETRIES, McpServer, Model, ModelApi, ModelRef,
    OnBudget, Pipeline, Pricing, Provider, ProviderApi, RateLimit, Secret, SystemPrompt, ToolApproval, resolve_model,
};
use crate::diag::{Diagnostic, Severity, did_you_mean, quoted_list};
use crate::load::{Loaded, SourceMap, keys};
use crate::observe::{DEFAULT_HOOK_PRIORITY, EventPattern, Exporter, HookBinding, SignalConfig, TelemetryConfig};
use crate::raw;
use crate::schedule::{self, Schedule, ScheduleError, ScheduleSpec};
use crate::template::{Template, Templated, Var};
use crate::workflow::{Decision, Step, StepKind, StepType, Workflow};
use crate::yaml::{Seg, YamlPath};

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
    /// The seed's default: 60 s, 300 s, 900 s.
    Steps(Vec<Duration>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max: u32,
    pub backoff: Backoff,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { max: 3, backoff: Backoff::Steps(vec![Duration::from_secs(60), Duration::from_secs(300), Duration::from_secs(900)]) }
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

/// A validated job definition.
#[derive(Debug, Clone, PartialEq)]
pub struct JobConfig {
    pub name: String,
    pub description: Option<String>,
    pub target: Target,
    pub input: Option<serde_json::Value>,
    pub parameters: Option<serde_json::Value>,
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
    pub allowed_commands: Vec<String>,
    /// Limits on each run of an agent job, over the agent's own.
    pub budget: Budget,
}

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
    Bearer { token: String },
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
}

/// Limits and grants for WASM plugins (`plugins.wasm`).
#[derive(Debug, Clone, PartialEq)]
pub struct WasmConfig {
    pub fuel: u64,
    pub memory_bytes: u64,
    pub timeout: Duration,
    pub capabilities: Vec<String>,
    pub plugin_config: BTreeMap<String, serde_json::Value>,
}

/// Capabilities a WASM plugin can be granted (`plugins.wasm.capabilities`).
pub const WASM_CAPABILITIES: &[&str] = &["config-read", "fs-read", "fs-write", "http-request", "ai", "mcp"];

/// The resolved configuration the rest of the program uses.
#[derive(Debug, Clone)]
pub struct Config {
    pub root: PathBuf,
    pub name: String,
    pub data_dir: PathBuf,
    /// A `tracing` filter directive (`info`, `debug`, …).
    pub log_level: Option<String>,
    pub default_timezone: String,
    pub storage: StorageConfig,
    pub jobs: BTreeMap<String, JobConfig>,
    /// `ai.default_model`: the alias of agents that name none.
    pub default_model: Option<String>,
    pub providers: BTreeMap<String, Provider>,
    pub agents: BTreeMap<String, Agent>,
    pub pipelines: BTreeMap<String, Pipeline>,
    pub workflows: BTreeMap<String, Workflow>,
    pub mcp_servers: BTreeMap<String, McpServer>,
    pub plugin_dirs: Vec<PathBuf>,
    pub wasm: WasmConfig,
    pub worker: WorkerConfig,
    pub telemetry: TelemetryConfig,
    /// `hooks.bindings`, in priority order (lower first; ties keep the file's order).
    pub hooks: Vec<HookBinding>,
    /// Things that are defined but cannot work, e.g. `agent "x"` → why.
    pub disabled: BTreeMap<String, String>,
    pub sources: SourceMap,
    /// The merged YAML, for `config show`.
    pub merged: serde_yaml::Value,
}

impl Config {
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

struct Compiler<'a> {
    loaded: &'a Loaded,
    diags: Vec<Diagnostic>,
    disabled: BTreeMap<String, String>,
}

/// Consumes the loaded tree: the merged YAML and source map move into the result (a large
/// config must not be held twice); the raw tree is dropped once compiled.
pub(crate) fn compile(mut loaded: Loaded, cwd: &Path) -> (Option<Config>, Vec<Diagnostic>) {
    // The jobs are moved, not copied: with thousands of jobs a copy doubles the peak.
    let sched = loaded.raw.scheduling.take().unwrap_or_default();
    let (mut config, diags) = compile_borrowed(&loaded, sched, cwd);
    config.sources = loaded.sources;
    config.merged = loaded.merged;
    config.root = loaded.root;
    (Some(config), diags)
}

fn compile_borrowed(loaded: &Loaded, sched: raw::Scheduling, cwd: &Path) -> (Config, Vec<Diagnostic>) {
    let mut c = Compiler { loaded, diags: Vec::new(), disabled: BTreeMap::new() };
    let raw = &loaded.raw;
    let fw = raw.framework.clone().unwrap_or_default();
    let data_dir = cwd.join(fw.data_dir.as_deref().unwrap_or("./data"));
    let log_level = fw.log_level.as_deref().and_then(|l| c.log_level(l));
    let default_timezone = sched.timezone.clone().unwrap_or_else(|| "UTC".to_string());
    let default_tz = schedule::parse_tz(&default_timezone);
    if let Err(e) = &default_tz {
        c.err(&["scheduling", "timezone"], e.to_string());
    }
    let storage = c.storage(sched.storage.as_ref(), &data_dir, cwd);
    c.check_unset_vars();
    let ai = raw.ai.clone().unwrap_or_default();
    let providers = c.providers();
    let mcp_servers = c.mcp_servers();
    let agents = c.agents(&providers, ai.default_model.as_deref(), cwd);
    let workflows = c.workflows();
    let pipelines = c.pipelines();
    let mut jobs = BTreeMap::new();
    for (name, mut job) in sched.jobs.into_iter().flatten() {
        if let Some(j) = c.job(&name, &mut job, (&default_timezone, &default_tz), cwd) {
            jobs.insert(name.clone(), j);
        }
    }
    let worker = c.worker(raw.worker.as_ref());
    let telemetry = c.telemetry(raw.telemetry.as_ref());
    let hooks = c.hooks(raw.hooks.as_ref());
    let wasm = c.wasm(raw.plugins.as_ref().and_then(|p| p.wasm.as_ref()));
    let plugin_dirs = raw.plugins.as_ref().and_then(|p| p.dirs.clone()).unwrap_or_default().iter().map(|d| cwd.join(d)).collect();
    let config = Config {
        root: PathBuf::new(),
        name: fw.name.unwrap_or_else(|| "lamplighter".to_string()),
        data_dir,
        log_level,
        default_timezone,
        storage,
        jobs,
        default_model: ai.default_model,
        providers,
        agents,
        pipelines,
        workflows,
        mcp_servers,
        plugin_dirs,
        wasm,
        worker,
        telemetry,
        hooks,
        disabled: c.disabled,
        sources: SourceMap::default(),
        merged: serde_yaml::Value::Null,
    };
    (config, c.diags)
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("\"{s}\" is not a duration ({e}); write e.g. \"90s\", \"15m\", \"24h\""))
}

impl<'a> Compiler<'a> {
    fn telemetry(&mut self, t: Option<&raw::Telemetry>) -> TelemetryConfig {
        let Some(t) = t else { return TelemetryConfig::default() };
        let signal = |c: &mut Self, name: &str, s: Option<&raw::Signal>| {
            let s = s.cloned().unwrap_or_default();
            let exporter = s.exporter.as_deref().and_then(|e| {
                Exporter::parse(e, name).map_err(|e| c.err(&["telemetry", name, "exporter"], format!("telemetry.{name}.exporter {e}"))).ok()
            });
            if let Some(url) = &s.endpoint
                && !(url.starts_with("http://") || url.starts_with("https://"))
            {
                c.err(
                    &["telemetry", name, "endpoint"],
                    format!(
                        "telemetry.{name}.endpoint \"{url}\" is not an http(s) URL (OTLP over HTTP, e.g. http://localhost:4318/v1/{name})"
                    ),
                );
            }
            SignalConfig { exporter, endpoint: s.endpoint }
        };
        let traces = signal(self, "traces", t.traces.as_ref());
        let metrics = signal(self, "metrics", t.metrics.as_ref());
        let logs = signal(self, "logs", t.logs.as_ref());
        let raw_traces = t.traces.clone().unwrap_or_default();
        let sample_ratio = raw_traces.sampling.as_ref().and_then(|s| match (s.strategy.as_deref(), s.ratio) {
            (None | Some("ratio") | Some("traceidratio") | Some("parentbased_traceidratio"), Some(r)) if (0.0..=1.0).contains(&r) => {
                Some(r)
            }
            (None | Some("ratio") | Some("traceidratio") | Some("parentbased_traceidratio"), r) => {
                self.err(
                    &["telemetry", "traces", "sampling", "ratio"],
                    format!("telemetry.traces.sampling.ratio must be between 0 and 1, not {r:?}"),
                );
                None
            }
            (Some("always_on"), _) => Some(1.0),
            (Some("always_off"), _) => Some(0.0),
            (Some(o), _) => {
                self.err(
                    &["telemetry", "traces", "sampling", "strategy"],
                    format!("telemetry.traces.sampling.strategy \"{o}\" is not one of always_on, always_off, ratio"),
                );
                None
            }
        });
        let metrics_interval = t.metrics.as_ref().and_then(|m| m.export_interval_ms).map(|ms| {
            if ms < 100 {
                self.err(
                    &["telemetry", "metrics", "export_interval_ms"],
                    format!("telemetry.metrics.export_interval_ms must be at least 100, not {ms}"),
                );
            }
            Duration::from_millis(ms.max(100))
        });
        for (name, s) in [("metrics", &t.metrics), ("logs", &t.logs)] {
            if s.as_ref().is_some_and(|s| s.enable_sensitive_data.is_some()) {
                self.warn(
                    &["telemetry", name, "enable_sensitive_data"],
                    format!("telemetry.{name}.enable_sensitive_data has no effect; it belongs under telemetry.traces"),
                );
            }
        }
        TelemetryConfig {
            enabled: t.enabled.unwrap_or(false),
            service_name: t.service_name.clone(),
            service_version: t.service_version.clone(),
            resource_attributes: t.resource_attributes.clone().unwrap_or_default(),
            traces,
            metrics,
            logs,
            sensitive_data: raw_traces.enable_sensitive_data.unwrap_or(false),
            sample_ratio,
            metrics_interval,
        }
    }

    /// Hook bindings, sorted by priority. Whether the plugin exports the hook is the worker's
    /// check: plugins are discovered at run time.
    fn hooks(&mut self, h: Option<&raw::Hooks>) -> Vec<HookBinding> {
        let mut out = Vec::new();
        for (i, b) in h.and_then(|h| h.bindings.clone()).unwrap_or_default().into_iter().enumerate() {
            let at = |key: Option<&str>| {
                let mut p = [keys(&["hooks", "bindings"]), vec![Seg::Index(i)]].concat();
                p.extend(key.map(|k| Seg::Key(k.to_string())));
                p
            };
            let event = match EventPattern::parse(&b.event) {
                Ok(p) => p,
                Err(e) => {
                    let loc = self.loaded.sources.locate(&at(Some("event")));
                    self.diags.push(Diagnostic::error(loc, e));
                    continue;
                }
            };
            if b.plugin.trim().is_empty() || b.hook.trim().is_empty() {
                let loc = self.loaded.sources.locate(&at(None));
                self.diags.push(Diagnostic::error(loc, format!("hook binding for \"{}\" needs a plugin and a hook", b.event)));
                continue;
            }
            out.push(HookBinding { event, plugin: b.plugin, hook: b.hook, priority: b.priority.unwrap_or(DEFAULT_HOOK_PRIORITY) });
        }
        out.sort_by_key(|b| b.priority);
        out
    }

    fn err(&mut self, path: &[&str], msg: String) {
        let loc = self.loaded.sources.locate(&keys(path));
        self.diags.push(Diagnostic::error(loc, msg));
    }

    fn warn(&mut self, path: &[&str], msg: String) {
        let loc = self.loaded.sources.locate(&keys(path));
        self.diags.push(Diagnostic::warning(loc, msg));
    }

    fn log_level(&mut self, l: &str) -> Option<String> {
        let v = match l.to_ascii_lowercase().as_str() {
            "trace" => "trace",
            "debug" => "debug",
            "info" | "information" => "info",
            "warn" | "warning" => "warn",
            "error" | "critical" => "error",
            "none" | "off" => "off",
            _ => {
                self.err(&["framework", "log_level"], format!("log level \"{l}\" is not one of trace, debug, info, warn, error, off"));
                return None;
            }
        };
        Some(v.to_string())
    }

    fn storage(&mut self, s: Option<&raw::Storage>, data_dir: &Path, cwd: &Path) -> StorageConfig {
        let provider = s.and_then(|s| s.provider.clone()).unwrap_or_else(|| "sqlite".into());
        // Blank is unset: `connection_string: ${DATABASE_URL:-}` with nothing set means the default.
        let conn = s.and_then(|s| s.connection_string.clone()).filter(|c| !c.trim().is_empty());
        match provider.to_ascii_lowercase().as_str() {
            "sqlite" => {
                let path = match conn.as_deref() {
                    None => data_dir.join("lamplighter.db"),
                    Some(c) => {
                        let c = c.trim();
                        let p = c
                            .strip_prefix("Data Source=")
                            .or_else(|| c.strip_prefix("sqlite://"))
                            .or_else(|| c.strip_prefix("sqlite:"))
                            .unwrap_or(c);
                        let p = p.split(['?', ';']).next().unwrap_or(p);
                        cwd.join(p)
                    }
                };
                StorageConfig::Sqlite { path }
            }
            "postgres" | "postgresql" => {
                let at = |k: &'static str| -> Vec<&str> { vec!["scheduling", "storage", k] };
                let url = match conn.as_deref().map(str::trim) {
                    Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => u.to_string(),
                    Some(u) => {
                        let shown = if u.starts_with("Data Source=") { "a SQLite \"Data Source=…\"" } else { "not a postgres:// URL" };
                        self.err(
                            &at("connection_string"),
                            format!("storage provider \"postgres\" needs a postgres:// URL in connection_string; this is {shown}"),
                        );
                        String::new()
                    }
                    None => {
                        self.err(
                            &at("provider"),
                            "storage provider \"postgres\" needs scheduling.storage.connection_string (a postgres:// URL, e.g. ${DATABASE_URL})"
                                .into(),
                        );
                        String::new()
                    }
                };
                let pool_size = match s.and_then(|s| s.pool_size) {
                    None => DEFAULT_PG_POOL_SIZE,
                    Some(n) if (1..=1000).contains(&n) => n,
                    Some(n) => {
                        self.err(&at("pool_size"), format!("pool_size {n} is outside 1–1000"));
                        DEFAULT_PG_POOL_SIZE
                    }
                };
                let statement_timeout = match s.and_then(|s| s.statement_timeout.as_deref()).map(duration) {
                    None => DEFAULT_PG_STATEMENT_TIMEOUT,
                    Some(Ok(d)) if !d.is_zero() => d,
                    Some(Ok(_)) => {
                        self.err(&at("statement_timeout"), "statement_timeout must be more than 0s".into());
                        DEFAULT_PG_STATEMENT_TIMEOUT
                    }
                    Some(Err(e)) => {
                        self.err(&at("statement_timeout"), format!("statement_timeout {e}"));
                        DEFAULT_PG_STATEMENT_TIMEOUT
                    }
                };
                StorageConfig::Postgres { url: Secret::new(url), pool_size, statement_timeout }
            }
            other => {
                self.err(
                    &["scheduling", "storage", "provider"],
                    format!("storage provider \"{other}\" is not supported; use \"sqlite\" or \"postgres\""),
                );
                StorageConfig::Sqlite { path: data_dir.join("lamplighter.db") }
            }
        }
    }

    /// An unset `${VAR}` disables what needs it where that is safe (provider keys, MCP server
    /// settings); anywhere else the value is needed, so it is an error.
    fn check_unset_vars(&mut self) {
        for (path, var) in &self.loaded.unset_vars {
            let k: Vec<&str> = path.iter().map(|s| if let Seg::Key(k) = s { k.as_str() } else { "" }).collect();
            match k.as_slice() {
                ["ai", "providers", p, ..] => {
                    self.disabled.insert(format!("provider \"{p}\""), format!("${{{var}}} is not set"));
                }
                ["mcp", "servers", s, ..] => {
                    self.disabled.insert(format!("MCP server \"{s}\""), format!("${{{var}}} is not set"));
                }
                ["dataverse", ..] => {}
                _ => {
                    let loc = self.loaded.sources.locate(path);
                    self.diags.push(Diagnostic::error(
                        loc,
                        format!(
                            "\"{}\" uses ${{{var}}}, which is not set; set it or give a default with ${{{var}:-value}}",
                            crate::yaml::path_string(path)
                        ),
                    ));
                }
            }
        }
    }

    fn providers(&mut self) -> BTreeMap<String, Provider> {
        let ai = self.loaded.raw.ai.clone().unwrap_or_default();
        let limits = |name: &str| {
            let top = self.loaded.raw.rate_limits.as_ref().and_then(|l| l.get(name));
            let ai = ai.rate_limits.as_ref().and_then(|l| l.get(name));
            top.or(ai).map(|l| RateLimit { requests_per_minute: l.requests_per_minute, tokens_per_minute: l.tokens_per_minute })
        };
        let mut out = BTreeMap::new();
        for (name, p) in ai.providers.iter().flatten() {
            let api = match (&p.base_url, &p.endpoint) {
                (Some(base_url), _) => ProviderApi::OpenAiCompatible { base_url: base_url.clone() },
                (None, Some(endpoint)) => ProviderApi::AzureOpenAi { endpoint: endpoint.clone(), api_version: p.api_version.clone() },
                (None, None) => ProviderApi::Unspecified,
            };
            let mut models = BTreeMap::new();
            for (alias, m) in p.models.iter().flatten() {
                let api = match m.api_type.as_deref() {
                    None | Some("chat") | Some("chat_completions") => ModelApi::Chat,
                    Some("responses") => ModelApi::Responses,
                    Some(other) => {
                        self.err(
                            &["ai", "providers", name, "models", alias, "api_type"],
                            format!("model \"{alias}\" of provider \"{name}\": api_type \"{other}\" is not one of chat, responses"),
                        );
                        ModelApi::Chat
                    }
                };
                let model = Model {
                    alias: alias.clone(),
                    id: m.id.clone(),
                    deployment_name: m.deployment_name.clone(),
                    description: m.description.clone(),
                    api,
                    max_tokens: m.max_tokens,
                    default_temperature: m.default_temperature,
                    pricing: m.pricing.as_ref().map(|p| Pricing { input: p.input, output: p.output }),
                };
                if let Some(p) = &m.pricing
                    && [p.input, p.output].iter().any(|v| v.is_nan() || *v < 0.0)
                {
                    self.err(
                        &["ai", "providers", name, "models", alias, "pricing"],
                        format!("model \"{alias}\" of provider \"{name}\": prices must be zero or more"),
                    );
                }
                models.insert(alias.clone(), model);
            }
            let timeout = match p.timeout.as_deref().map(duration) {
                None => DEFAULT_CALL_TIMEOUT,
                Some(Ok(t)) if !t.is_zero() => t,
                Some(Ok(_)) => {
                    self.err(&["ai", "providers", name, "timeout"], format!("provider \"{name}\": timeout must be more than 0s"));
                    DEFAULT_CALL_TIMEOUT
                }
                Some(Err(e)) => {
                    self.err(&["ai", "providers", name, "timeout"], format!("provider \"{name}\": timeout {e}"));
                    DEFAULT_CALL_TIMEOUT
                }
            };
            let rate_limit = limits(name).unwrap_or_default();
            for (field, v) in [("requests_per_minute", rate_limit.requests_per_minute), ("tokens_per_minute", rate_limit.tokens_per_minute)]
            {
                if v == Some(0) {
                    let section = if self.loaded.raw.rate_limits.as_ref().is_some_and(|l| l.contains_key(name)) {
                        vec!["rate_limits"]
                    } else {
                        vec!["ai", "rate_limits"]
                    };
                    self.err(
                        &[section.as_slice(), &[name.as_str(), field]].concat(),
                        format!("rate limit of provider \"{name}\": {field} must be more than 0 (leave it out for no limit)"),
                    );
                }
            }
            let provider = Provider {
                name: name.clone(),
                api,
                api_key: p.api_key.clone().map(Secret::new),
                models,
                rate_limit,
                timeout,
                max_retries: p.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
            };
            out.insert(name.clone(), provider);
        }
        out
    }

    fn mcp_servers(&mut self) -> BTreeMap<String, McpServer> {
        let mut out = BTreeMap::new();
        let servers = self.loaded.raw.mcp.as_ref().and_then(|m| m.servers.clone()).unwrap_or_default();
        for (name, s) in servers {
            let server = match (s.command, s.url) {
                (Some(command), None) => McpServer::Stdio { command, args: s.args.unwrap_or_default(), env: s.env.unwrap_or_default() },
                (None, Some(url)) => McpServer::Http { url, headers: s.headers.unwrap_or_default() },
                (Some(_), Some(_)) => {
                    self.err(&["mcp", "servers", &name, "url"], format!("MCP server \"{name}\" sets both command and url; keep one"));
                    continue;
                }
                (None, None) => {
                    self.err(
                        &["mcp", "servers", &name],
                        format!("MCP server \"{name}\" needs \"command\" (a stdio server) or \"url\" (a streamable-HTTP server)"),
                    );
                    continue;
                }
            };
            out.insert(name, server);
        }
        out
    }

    /// Agents, with their model resolved. Names are checked against the raw key sets: an item
    /// left out for its own error must not also be reported as "not defined".
    fn agents(&mut self, providers: &BTreeMap<String, Provider>, default_model: Option<&str>, cwd: &Path) -> BTreeMap<String, Agent> {
        let servers: Vec<String> =
            self.loaded.raw.mcp.as_ref().and_then(|m| m.servers.as_ref()).map(|s| s.keys().cloned().collect()).unwrap_or_default();
        let agents = self.loaded.raw.agents.clone().unwrap_or_default();
        let agent_names: Vec<String> = agents.keys().cloned().collect();
        let mut out = BTreeMap::new();
        for (name, a) in agents {
            let model = a.model.clone().or_else(|| default_model.map(str::to_string));
            let provider = match (&a.provider, &model) {
                (Some(p), _) => {
                    if !providers.contains_key(p) {
                        let hint = did_you_mean(p, providers.keys().map(String::as_str));
                        self.err(
                            &["agents", &name, "provider"],
                            format!(
                                "agent \"{name}\" uses provider \"{p}\", which is not defined{hint} (defined providers: {})",
                                quoted_list(providers.keys().map(String::as_str))
                            ),
                        );
                        None
                    } else {
                        Some(p.clone())
                    }
                }
                (None, Some(m)) => providers.iter().find(|(_, p)| p.models.contains_key(m)).map(|(n, _)| n.clone()),
                (None, None) => None,
            };
            let mut resolved = None;
            match (&model, &provider) {
                (None, _) => {
                    self.disabled.insert(format!("agent \"{name}\""), "no model: set agents.<name>.model or ai.default_model".into());
                }
                (Some(m), Some(p)) => {
                    resolved = resolve_model(providers, Some(p), m);
                    if resolved.is_none() {
                        let models = &providers[p].models;
                        let hint = did_you_mean(m, models.keys().map(String::as_str));
                        self.err(
                            &["agents", &name, "model"],
                            format!(
                                "agent \"{name}\" uses model \"{m}\", which provider \"{p}\" does not define{hint} (its models: {})",
                                quoted_list(models.keys().map(String::as_str))
                            ),
                        );
                    }
                    if let Some(reason) = self.disabled.get(&format!("provider \"{p}\"")).cloned() {
                        self.disabled.insert(format!("agent \"{name}\""), format!("its provider \"{p}\" is disabled: {reason}"));
                    }
                }
                (Some(m), None) if a.provider.is_none() => {
                    let all: Vec<&str> = providers.values().flat_map(|p| p.models.keys().map(String::as_str)).collect();
                    let hint = did_you_mean(m, all.iter().copied());
                    self.err(&["agents", &name, "model"], format!("agent \"{name}\" uses model \"{m}\", which no provider defines{hint}; add it under ai.providers.<provider>.models or set agents.{name}.provider"));
                }
                _ => {}
            }
            for (i, s) in a.mcp_servers.iter().flatten().enumerate() {
                if !servers.contains(s) {
                    let hint = did_you_mean(s, servers.iter().map(String::as_str));
                    let loc = self.loaded.sources.locate(&[keys(&["agents", &name, "mcp_servers"]), vec![Seg::Index(i)]].concat());
                    self.diags.push(Diagnostic::error(
                        loc,
                        format!("agent \"{name}\" uses MCP server \"{s}\", which is not defined under mcp.servers{hint}"),
                    ));
                } else if let Some(reason) = self.disabled.get(&format!("MCP server \"{s}\"")).cloned() {
                    self.disabled.entry(format!("agent \"{name}\"")).or_insert(format!("its MCP server \"{s}\" is disabled: {reason}"));
                }
            }
            for (i, d) in a.delegates.iter().flatten().enumerate() {
                if !agent_names.contains(d) {
                    let hint = did_you_mean(d, agent_names.iter().map(String::as_str));
                    let loc = self.loaded.sources.locate(&[keys(&["agents", &name, "delegates"]), vec![Seg::Index(i)]].concat());
                    self.diags
                        .push(Diagnostic::error(loc, format!("agent \"{name}\" delegates to agent \"{d}\", which is not defined{hint}")));
                }
            }
            if let Some(t) = a.temperature
                && !(0.0..=2.0).contains(&t)
            {
                self.err(&["agents", &name, "temperature"], format!("agent \"{name}\": temperature {t} is outside 0.0–2.0"));
            }
            let system_prompt = match (a.system_prompt, a.system_prompt_file) {
                (Some(_), Some(_)) => {
                    self.err(
                        &["agents", &name, "system_prompt_file"],
                        format!("agent \"{name}\" sets both system_prompt and system_prompt_file; keep one"),
                    );
                    None
                }
                (Some(p), None) => Some(SystemPrompt::Inline(p)),
                (None, Some(f)) => Some(SystemPrompt::File(cwd.join(f))),
                (None, None) => None,
            };
            let budget = self.budget(&["agents", &name, "budget"], a.budget.as_ref());
            let tool_approval = self.tool_approval(&name, a.tool_approval.as_ref());
            let agent = Agent {
                name: name.clone(),
                description: a.description,
                model,
                provider: a.provider,
                resolved,
                temperature: a.temperature,
                max_tokens: a.max_tokens,
                max_iters: a.max_iters.unwrap_or(DEFAULT_MAX_ITERS),
                system_prompt,
                skills: a.skills.unwrap_or_default(),
                plugins: a.plugins.unwrap_or_default(),
                mcp_servers: a.mcp_servers.unwrap_or_default(),
                allowed_actions: a.allowed_actions.unwrap_or_default(),
                allowed_commands: a.allowed_commands.unwrap_or_default(),
                working_directory: a.working_directory.map(|w| cwd.join(w)),
                delegates: a.delegates.unwrap_or_default(),
                budget,
                tool_approval,
            };
            out.insert(name, agent);
        }
        out
    }

    /// A `budget:` map (of an agent or a job) checked.
    pub(crate) fn budget(&mut self, at: &[&str], b: Option<&raw::Budget>) -> Budget {
        let Some(b) = b else { return Budget::default() };
        let field = |f: &'static str| -> Vec<&str> { [at, &[f]].concat() };
        let max_duration = match b.max_duration.as_deref().map(duration) {
            None => None,
            Some(Ok(d)) => Some(d),
            Some(Err(e)) => {
                self.err(&field("max_duration"), format!("max_duration {e}"));
                None
            }
        };
        if let Some(c) = b.max_cost
            && (c.is_nan() || c <= 0.0)
        {
            self.err(&field("max_cost"), format!("max_cost must be more than 0, not {c}"));
        }
        // A zero limit could never be met, and with `on_budget: ask` would ask forever.
        if b.max_tokens_total == Some(0) {
            self.err(&field("max_tokens_total"), "max_tokens_total must be more than 0".into());
        }
        if b.max_tool_calls == Some(0) {
            self.err(&field("max_tool_calls"), "max_tool_calls must be more than 0".into());
        }
        if max_duration.is_some_and(|d| d.is_zero()) {
            self.err(&field("max_duration"), "max_duration must be more than 0s".into());
        }
        let on_budget = match b.on_budget.as_deref() {
            None => None,
            Some("fail") => Some(OnBudget::Fail),
            Some("ask") => Some(OnBudget::Ask),
            Some(other) => {
                self.err(&field("on_budget"), format!("on_budget \"{other}\" is not one of fail, ask"));
                None
            }
        };
        Budget { max_tokens_total: b.max_tokens_total, max_tool_calls: b.max_tool_calls, max_cost: b.max_cost, max_duration, on_budget }
    }

    fn tool_approval(&mut self, agent: &str, t: Option<&raw::ToolApproval>) -> ToolApproval {
        let (mode, tools, at) = match t {
            None => return ToolApproval::default(),
            Some(raw::ToolApproval::Mode(m)) => (m, Vec::new(), vec!["agents", agent, "tool_approval"]),
            Some(raw::ToolApproval::Listed { mode, tools }) => {
                (mode, tools.clone().unwrap_or_default(), vec!["agents", agent, "tool_approval", "mode"])
            }
        };
        let mode = match mode.as_str() {
            "auto" => ApprovalMode::Auto,
            "deny" => ApprovalMode::Deny,
            "ask" => ApprovalMode::Ask,
            other => {
                self.err(&at, format!("agent \"{agent}\": tool_approval \"{other}\" is not one of auto, deny, ask"));
                ApprovalMode::Auto
            }
        };
        ToolApproval { mode, tools }
    }

    /// Workflows with their steps typed and templates parsed. A workflow with an error is left
    /// out (the config then fails to load, so only partial configs see the difference).
    fn workflows(&mut self) -> BTreeMap<String, Workflow> {
        let agents: Vec<String> = self.loaded.raw.agents.as_ref().map(|a| a.keys().cloned().collect()).unwrap_or_default();
        let workflows = self.loaded.raw.workflows.clone().unwrap_or_default();
        let mut out = BTreeMap::new();
        for (wname, wf) in workflows {
            let errors_before = self.diags.len();
            let mut ids: Vec<String> = Vec::new();
            let base = keys(&["workflows", &wname, "steps"]);
            let steps = self.steps(&wname, &wf.steps, &base, &agents, &mut ids);
            if wf.steps.is_empty() {
                self.err(&["workflows", &wname, "steps"], format!("workflow \"{wname}\" has no steps"));
            }
            // `then`/`else` must name steps of the same workflow.
            collect_refs(&wf.steps, &mut |sid, target| {
                if !ids.iter().any(|i| i == target) {
                    let hint = did_you_mean(target, ids.iter().map(String::as_str));
                    self.diags.push(Diagnostic::error(
                        self.loaded.sources.locate(&keys(&["workflows", &wname])),
                        format!("workflow \"{wname}\": step \"{sid}\" names step \"{target}\", which does not exist{hint}"),
                    ));
                }
            });
            if self.diags[errors_before..].iter().all(|d| d.severity != Severity::Error) {
                let all: Vec<String> = steps.iter().flat_map(Step::walk).map(|s| s.id.clone()).collect();
                let mut done = Vec::new();
                for (i, step) in steps.iter().enumerate() {
                    self.step_refs(&wname, step, &at_index(&base, i), &mut done, &all);
                }
                let workflow = Workflow { name: wname.clone(), description: wf.description, trigger: wf.trigger, steps };
                out.insert(wname, workflow);
            }
        }
        out
    }

    /// Warns about `${steps.<id>.output}` references in `step` that cannot resolve when it runs:
    /// to a step that does not exist, or to one that has not finished by then (it comes later,
    /// or runs alongside in the same `parallel`). Such a reference stays as written at run time.
    /// `done`: the steps finished before this one; it gains `step` and its children.
    fn step_refs(&mut self, wname: &str, step: &Step, path: &YamlPath, done: &mut Vec<String>, all: &[String]) {
        let mut vars: Vec<&Var> = step.when.iter().flat_map(Template::vars).collect();
        match &step.kind {
            StepKind::Agent { input, .. } | StepKind::Approval { input, .. } | StepKind::GroupChat { input, .. } => {
                vars.extend(input.iter().flat_map(Templated::vars));
            }
            StepKind::Plugin { input, parameters, .. } => {
                vars.extend(input.iter().chain(parameters).flat_map(Templated::vars));
            }
            StepKind::Condition { condition, .. } => vars.extend(condition.vars()),
            StepKind::Parallel { .. } => {}
        }
        let mut seen: Vec<&str> = Vec::new();
        for var in vars {
            let Var::StepOutput { step: target, .. } = var else { continue };
            if seen.contains(&target.as_str()) {
                continue;
            }
            seen.push(target);
            let why = if !all.contains(target) {
                let hint = did_you_mean(target, all.iter().map(String::as_str));
                format!("step \"{target}\" does not exist{hint}")
            } else if *target == step.id {
                "a step cannot use its own output".to_string()
            } else if !done.contains(target) {
                format!("step \"{target}\" has not finished when \"{}\" runs (it comes later, or runs alongside it)", step.id)
            } else {
                continue;
            };
            self.diags.push(Diagnostic::warning(
                self.loaded.sources.locate(path),
                format!("workflow \"{wname}\": step \"{}\" uses ${{steps.{target}.output}}, but {why}; it will stay as written", step.id),
            ));
        }
        if let StepKind::Parallel { steps } = &step.kind {
            // Children see what finished before the parallel step, not each other.
            let before = done.clone();
            let mut children_path = path.clone();
            children_path.push(Seg::Key("steps".into()));
            for (i, child) in steps.iter().enumerate() {
                let mut d = before.clone();
                self.step_refs(wname, child, &at_index(&children_path, i), &mut d, all);
            }
            done.extend(step.walk().iter().map(|s| s.id.clone()));
        } else {
            done.push(step.id.clone());
        }
    }

    /// The steps that are valid, in order; every error is reported on the way.
    fn steps(&mut self, wname: &str, steps: &[raw::Step], base: &YamlPath, agents: &[String], ids: &mut Vec<String>) -> Vec<Step> {
        let mut out = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            let mut path = base.clone();
            path.push(Seg::Index(i));
            let at = |p: &YamlPath, k: &str| {
                let mut p = p.clone();
                p.push(Seg::Key(k.into()));
                p
            };
            if ids.contains(&s.id) {
                let loc = self.loaded.sources.locate(&at(&path, "id"));
                self.diags.push(Diagnostic::error(
                    loc,
                    format!("workflow \"{wname}\": step id \"{}\" is used twice; step ids must be unique", s.id),
                ));
            }
            if s.id.contains(':') || s.id.is_empty() {
                let loc = self.loaded.sources.locate(&at(&path, "id"));
                self.diags.push(Diagnostic::error(
                    loc,
                    format!("workflow \"{wname}\": step id \"{}\" must be non-empty and without \":\" (reserved for agent waits)", s.id),
                ));
            }
            ids.push(s.id.clone());
            let need = |field: &str, v: &Option<String>, this: &mut Self| -> Option<String> {
                if v.is_none() {
                    let loc = this.loaded.sources.locate(&path);
                    this.diags.push(Diagnostic::error(
                        loc,
                        format!("workflow \"{wname}\": step \"{}\" of type {} needs \"{field}\"", s.id, s.kind),
                    ));
                }
                v.clone()
            };
            let templated = |v: &Option<raw::Any>| v.as_ref().map(Templated::parse);
            let kind = match StepType::parse(&s.kind) {
                Some(StepType::Agent) => {
                    let agent = need("agent", &s.agent, self);
                    if let Some(a) = &agent
                        && !agents.contains(a)
                    {
                        let hint = did_you_mean(a, agents.iter().map(String::as_str));
                        let loc = self.loaded.sources.locate(&at(&path, "agent"));
                        self.diags.push(Diagnostic::error(
                            loc,
                            format!(
                                "workflow \"{wname}\": step \"{}\" uses agent \"{a}\", which is not defined{hint} (defined agents: {})",
                                s.id,
                                quoted_list(agents.iter().map(String::as_str))
                            ),
                        ));
                    }
                    agent.map(|agent| StepKind::Agent { agent, input: templated(&s.input) })
                }
                Some(StepType::Plugin) => {
                    let plugin = need("plugin", &s.plugin, self);
                    let action = need("action", &s.action, self);
                    plugin.zip(action).map(|(plugin, action)| StepKind::Plugin {
                        plugin,
                        action,
                        input: templated(&s.input),
                        parameters: templated(&s.parameters),
                    })
                }
                Some(StepType::Condition) => need("condition", &s.condition, self).map(|c| StepKind::Condition {
                    condition: Template::parse(&c),
                    then: s.then.clone().unwrap_or_default(),
                    otherwise: s.otherwise.clone().unwrap_or_default(),
                }),
                Some(StepType::Parallel) => {
                    if let Some(children) = &s.steps {
                        let steps = self.steps(wname, children, &at(&path, "steps"), agents, ids);
                        Some(StepKind::Parallel { steps })
                    } else {
                        let loc = self.loaded.sources.locate(&path);
                        self.diags
                            .push(Diagnostic::error(loc, format!("workflow \"{wname}\": parallel step \"{}\" needs \"steps\"", s.id)));
                        None
                    }
                }
                Some(StepType::GroupChat) => {
                    for a in s.agents.iter().flatten() {
                        if !agents.contains(a) {
                            let loc = self.loaded.sources.locate(&at(&path, "agents"));
                            self.diags.push(Diagnostic::error(
                                loc,
                                format!("workflow \"{wname}\": group chat step \"{}\" uses agent \"{a}\", which is not defined", s.id),
                            ));
                        }
                    }
                    Some(StepKind::GroupChat {
                        agents: s.agents.clone().unwrap_or_default(),
                        input: templated(&s.input),
                        max_iterations: s.max_iterations,
                    })
                }
                Some(StepType::Approval) => {
                    let timeout = match s.timeout.as_deref().map(duration) {
                        None => Ok(None),
                        Some(Ok(d)) => Ok(Some(d)),
                        Some(Err(e)) => {
                            let loc = self.loaded.sources.locate(&at(&path, "timeout"));
                            self.diags.push(Diagnostic::error(loc, format!("workflow \"{wname}\": step \"{}\": timeout {e}", s.id)));
                            Err(())
                        }
                    };
                    let on_timeout = match s.on_timeout.as_deref() {
                        None | Some("reject") => Ok(Decision::Reject),
                        Some("approve") => Ok(Decision::Approve),
                        Some(other) => {
                            let loc = self.loaded.sources.locate(&at(&path, "on_timeout"));
                            self.diags.push(Diagnostic::error(
                                loc,
                                format!(
                                    "workflow \"{wname}\": step \"{}\": on_timeout \"{other}\" is not a decision; use approve or reject",
                                    s.id
                                ),
                            ));
                            Err(())
                        }
                    };
                    timeout.ok().zip(on_timeout.ok()).map(|(timeout, on_timeout)| StepKind::Approval {
                        input: templated(&s.input),
                        timeout,
                        on_timeout,
                    })
                }
                None => {
                    let kinds = StepType::ALL.map(StepType::as_str);
                    let hint = did_you_mean(&s.kind, kinds.iter().copied());
                    let loc = self.loaded.sources.locate(&at(&path, "type"));
                    self.diags.push(Diagnostic::error(
                        loc,
                        format!(
                            "workflow \"{wname}\": step \"{}\" has unknown type \"{}\"{hint}; use one of {}",
                            s.id,
                            s.kind,
                            kinds.join(", ")
                        ),
                    ));
                    None
                }
            };
            if let Some(kind) = kind {
                out.push(Step { id: s.id.clone(), when: s.when.as_deref().map(Template::parse), kind });
            }
        }
        out
    }

    fn pipelines(&mut self) -> BTreeMap<String, Pipeline> {
        let agents: Vec<String> = self.loaded.raw.agents.as_ref().map(|a| a.keys().cloned().collect()).unwrap_or_default();
        let mut out = BTreeMap::new();
        for (name, p) in self.loaded.raw.pipelines.clone().unwrap_or_default() {
            for a in &p.steps {
                if !agents.contains(a) {
                    let hint = did_you_mean(a, agents.iter().map(String::as_str));
                    self.err(&["pipelines", &name, "steps"], format!("pipeline \"{name}\" uses agent \"{a}\", which is not defined{hint}"));
                }
            }
            out.insert(name, Pipeline { description: p.description, agents: p.steps });
        }
        out
    }

    fn wasm(&mut self, w: Option<&raw::WasmPlugins>) -> WasmConfig {
        let path = |k: &'static str| ["plugins", "wasm", k];
        let w = w.cloned().unwrap_or_default();
        let timeout = match w.timeout.as_deref().map(duration) {
            None => Duration::from_secs(5),
            Some(Ok(d)) if !d.is_zero() => d,
            Some(Ok(_)) => {
                self.err(&path("timeout"), "plugins.wasm.timeout must be more than zero".to_string());
                Duration::from_secs(5)
            }
            Some(Err(e)) => {
                self.err(&path("timeout"), e);
                Duration::from_secs(5)
            }
        };
        if w.fuel == Some(0) {
            self.err(&path("fuel"), "plugins.wasm.fuel must be more than zero".to_string());
        }
        let memory_mb = w.memory_mb.unwrap_or(16);
        if !(1..=4096).contains(&memory_mb) {
            self.err(&path("memory_mb"), format!("plugins.wasm.memory_mb must be between 1 and 4096, not {memory_mb}"));
        }
        let capabilities = w.capabilities.unwrap_or_default();
        for cap in &capabilities {
            if !WASM_CAPABILITIES.contains(&cap.as_str()) {
                let hint = did_you_mean(cap, WASM_CAPABILITIES.iter().copied());
                self.err(&path("capabilities"), format!("unknown capability \"{cap}\"{hint}; known: {}", WASM_CAPABILITIES.join(", ")));
            }
        }
        WasmConfig {
            fuel: w.fuel.filter(|f| *f > 0).unwrap_or(1_000_000),
            memory_bytes: memory_mb.clamp(1, 4096) * 1024 * 1024,
            timeout,
            capabilities,
            plugin_config: w.config.unwrap_or_default(),
        }
    }

    fn job(&mut self, name: &str, j: &mut raw::Job, default_tz: (&String, &Result<Tz, ScheduleError>), cwd: &Path) -> Option<JobConfig> {
        let p = |k: &'static str| ["scheduling", "jobs", name, k];
        let mut ok = true;
        // Borrowed from the loaded config, not from `self`, so errors can still be recorded.
        let loaded: &'a Loaded = self.loaded;
        if name.starts_with("workflow:") {
            let loc = self.loaded.sources.locate(&keys(&["scheduling", "jobs", name]));
            self.diags.push(Diagnostic::error(
                loc,
                format!("job \"{name}\": job names cannot start with \"workflow:\" (runs of workflows started by hand are listed under it); rename the job"),
            ));
            ok = false;
        }
        let empty_workflows = BTreeMap::new();
        let empty_agents = BTreeMap::new();
        let workflows = loaded.raw.workflows.as_ref().unwrap_or(&empty_workflows);
        let agents = loaded.raw.agents.as_ref().unwrap_or(&empty_agents);
        let kind = j.kind.clone().or_else(|| {
            // Infer the type from the one target field given.
            match (&j.workflow, &j.agent, &j.plugin) {
                (Some(_), None, None) => Some("workflow".into()),
                (None, Some(_), None) => Some("agent".into()),
                (None, None, Some(_)) => Some("plugin".into()),
                _ => None,
            }
        });
        let target = match kind.as_deref() {
            Some("workflow") => match &j.workflow {
                Some(w) if workflows.contains_key(w) => Some(Target::Workflow(w.clone())),
                Some(w) => {
                    let hint = did_you_mean(w, workflows.keys().map(String::as_str));
                    self.err(
                        &p("workflow"),
                        format!(
                            "job \"{name}\" runs workflow \"{w}\", which is not defined{hint} (defined workflows: {})",
                            quoted_list(workflows.keys().map(String::as_str))
                        ),
                    );
                    None
                }
                None => {
                    self.err(&p("type"), format!("job \"{name}\" is of type workflow but names no \"workflow\""));
                    None
                }
            },
            Some("agent") => match &j.agent {
                Some(a) if agents.contains_key(a) => Some(Target::Agent(a.clone())),
                Some(a) => {
                    let hint = did_you_mean(a, agents.keys().map(String::as_str));
                    self.err(
                        &p("agent"),
                        format!(
                            "job \"{name}\" runs agent \"{a}\", which is not defined{hint} (defined agents: {})",
                            quoted_list(agents.keys().map(String::as_str))
                        ),
                    );
                    None
                }
                None => {
                    self.err(&p("type"), format!("job \"{name}\" is of type agent but names no \"agent\""));
                    None
                }
            },
            Some("plugin") => match (&j.plugin, &j.action) {
                (Some(plugin), Some(action)) => Some(Target::Plugin { plugin: plugin.clone(), action: action.clone() }),
                (Some(plugin), None) => match plugin.split_once('.') {
                    Some((pl, ac)) => Some(Target::Plugin { plugin: pl.into(), action: ac.into() }),
                    None => {
                        self.err(&p("plugin"), format!("job \"{name}\" runs plugin \"{plugin}\" but names no \"action\""));
                        None
                    }
                },
                _ => {
                    self.err(&p("type"), format!("job \"{name}\" is of type plugin but names no \"plugin\""));
                    None
                }
            },
            Some(other) => {
                let hint = did_you_mean(other, ["workflow", "agent", "plugin"]);
                self.err(&p("type"), format!("job \"{name}\" has unknown type \"{other}\"{hint}; use workflow, agent or plugin"));
                None
            }
            None => {
                self.err(
                    &["scheduling", "jobs", name],
                    format!("job \"{name}\" needs \"type\" (workflow, agent or plugin) and its target"),
                );
                None
            }
        };
        ok &= target.is_some();
        let schedules: Vec<ScheduleSpec> =
            [j.cron.clone().map(ScheduleSpec::Cron), j.every.clone().map(ScheduleSpec::Every), j.at.clone().map(ScheduleSpec::At)]
                .into_iter()
                .flatten()
                .collect();
        if schedules.len() > 1 {
            self.err(&["scheduling", "jobs", name], format!("job \"{name}\" sets more than one of cron, every, at; keep one"));
            ok = false;
        }
        let (timezone, tz) = match &j.timezone {
            None => (default_tz.0.clone(), default_tz.1.clone()),
            Some(own) => {
                let tz = schedule::parse_tz(own);
                if tz.is_err() {
                    self.err(
                        &p("timezone"),
                        format!("job \"{name}\": time zone \"{own}\" is not an IANA zone name (e.g. \"Europe/Berlin\")"),
                    );
                    ok = false;
                }
                (own.clone(), tz)
            }
        };
        let mut dur = |this: &mut Self, k: &'static str, v: &Option<String>| -> Option<Duration> {
            let s = v.as_ref()?;
            match duration(s) {
                Ok(d) => Some(d),
                Err(e) => {
                    this.err(&p(k), format!("job \"{name}\": {k} {e}"));
                    ok = false;
                    None
                }
            }
        };
        let catch_up_window = dur(self, "catch_up_window", &j.catch_up_window).unwrap_or(Duration::from_secs(24 * 3600));
        let timeout = dur(self, "timeout", &j.timeout);
        let jitter = dur(self, "jitter", &j.jitter);
        let catch_up = match j.catch_up.as_deref() {
            None | Some("latest") => CatchUp::Latest,
            Some("skip") => CatchUp::Skip,
            Some("all") => CatchUp::All,
            Some(o) => {
                self.err(
                    &p("catch_up"),
                    format!(
                        "job \"{name}\": catch_up \"{o}\" is not one of skip, latest, all{}",
                        did_you_mean(o, ["skip", "latest", "all"])
                    ),
                );
                ok = false;
                CatchUp::Latest
            }
        };
        let overlap = match j.overlap.as_deref() {
            None | Some("forbid") => Overlap::Forbid,
            Some("allow") => Overlap::Allow,
            Some("replace") => Overlap::Replace,
            Some("queue") => Overlap::Queue,
            Some(o) => {
                self.err(
                    &p("overlap"),
                    format!(
                        "job \"{name}\": overlap \"{o}\" is not one of forbid, allow, replace, queue{}",
                        did_you_mean(o, ["forbid", "allow", "replace", "queue"])
                    ),
                );
                ok = false;
                Overlap::Forbid
            }
        };
        let retries = match &j.retries {
            None => RetryPolicy::default(),
            Some(r) => {
                let rp = |k: &'static str| ["scheduling", "jobs", name, "retries", k];
                let mut d = |this: &mut Self, k: &'static str, v: &Option<String>, dflt: u64| match v {
                    None => Duration::from_secs(dflt),
                    Some(s) => duration(s).unwrap_or_else(|e| {
                        this.err(&rp(k), format!("job \"{name}\": retries.{k} {e}"));
                        ok = false;
                        Duration::from_secs(dflt)
                    }),
                };
                let initial = d(self, "initial", &r.initial, 60);
                let max_delay = d(self, "max_delay", &r.max_delay, 3600);
                let backoff = match r.backoff.as_deref() {
                    None | Some("exponential") => Backoff::Exponential { initial, max_delay },
                    Some("fixed") => Backoff::Fixed(initial),
                    Some(o) => {
                        self.err(&rp("backoff"), format!("job \"{name}\": retries.backoff \"{o}\" is not one of exponential, fixed"));
                        ok = false;
                        Backoff::Fixed(initial)
                    }
                };
                RetryPolicy { max: r.max.unwrap_or(3), backoff }
            }
        };
        let retention = match &j.retention {
            None => Retention { max_runs: Some(100), max_age: None },
            Some(r) => {
                let max_age = match &r.max_age {
                    None => None,
                    Some(s) => match duration(s) {
                        Ok(d) => Some(d),
                        Err(e) => {
                            self.err(
                                &["scheduling", "jobs", name, "retention", "max_age"],
                                format!("job \"{name}\": retention.max_age {e}"),
                            );
                            ok = false;
                            None
                        }
                    },
                };
                Retention { max_runs: r.max_runs, max_age }
            }
        };
        if !ok {
            return None;
        }
        // Parsed only once the job is otherwise valid, as before: a job with other errors
        // reports those. A job whose only error is its schedule is still returned, without a
        // schedule, so the checks after compiling (plugin actions) report theirs too.
        let schedule = schedules.into_iter().next().and_then(|spec| {
            let field = spec.field();
            match Schedule::build(spec, &tz) {
                Ok(s) => Some(Arc::new(s)),
                Err(e) => {
                    self.err(&p(field), format!("job \"{name}\": {e}"));
                    None
                }
            }
        });
        let budget = self.budget(&["scheduling", "jobs", name, "budget"], j.budget.as_ref());
        Some(JobConfig {
            name: name.to_string(),
            description: j.description.clone(),
            target: target?,
            input: j.input.take(),
            parameters: j.parameters.take(),
            schedule,
            timezone,
            enabled: j.enabled.unwrap_or(true),
            catch_up,
            catch_up_window,
            overlap,
            retries,
            timeout,
            jitter,
            retention,
            working_directory: j.working_directory.as_ref().map(|w| cwd.join(w)),
            allowed_commands: j.allowed_commands.clone().unwrap_or_default(),
            budget,
        })
    }

    fn worker(&mut self, w: Option<&raw::Worker>) -> WorkerConfig {
        let w = w.cloned().unwrap_or_default();
        let mcp = w.mcp.clone().unwrap_or_default();
        let shutdown_grace = match &w.shutdown_grace {
            None => Duration::from_secs(30),
            Some(s) => duration(s).unwrap_or_else(|e| {
                self.err(&["worker", "shutdown_grace"], format!("worker.shutdown_grace {e}"));
                Duration::from_secs(30)
            }),
        };
        let lease = match w.lease.as_deref().map(duration) {
            None => DEFAULT_LEASE,
            Some(Ok(d)) if d >= Duration::from_secs(1) => d,
            Some(Ok(_)) => {
                self.err(&["worker", "lease"], "worker.lease must be at least 1s".into());
                DEFAULT_LEASE
            }
            Some(Err(e)) => {
                self.err(&["worker", "lease"], format!("worker.lease {e}"));
                DEFAULT_LEASE
            }
        };
        let transport = match mcp.transport.as_deref() {
            None | Some("http") | Some("streamable-http") | Some("streamable_http") => McpTransport::Http,
            Some("stdio") => McpTransport::Stdio,
            Some(o) => {
                self.err(&["worker", "mcp", "transport"], format!("worker.mcp.transport \"{o}\" is not one of http, stdio"));
                McpTransport::Http
            }
        };
        let auth = match mcp.auth.as_ref().and_then(|a| a.kind.clone()).as_deref() {
            None | Some("none") => McpAuth::None,
            Some("bearer") => match mcp.auth.as_ref().and_then(|a| a.token.clone()) {
                Some(t) if !t.is_empty() && !t.contains("${") => McpAuth::Bearer { token: t },
                _ => {
                    self.err(
                        &["worker", "mcp", "auth"],
                        "worker.mcp.auth of type bearer needs a non-empty \"token\" (e.g. token: ${LAMPLIGHTER_TOKEN})".into(),
                    );
                    McpAuth::None
                }
            },
            Some(o) => {
                self.err(&["worker", "mcp", "auth", "type"], format!("worker.mcp.auth.type \"{o}\" is not one of none, bearer"));
                McpAuth::None
            }
        };
        let host = mcp.host.clone().unwrap_or_else(|| "127.0.0.1".into());
        let host = if host == "localhost" { "127.0.0.1".to_string() } else { host };
        if host.parse::<IpAddr>().is_err() {
            self.err(
                &["worker", "mcp", "host"],
                format!("worker.mcp.host \"{host}\" is not an IP address (use 127.0.0.1, ::1 or 0.0.0.0)"),
            );
        }
        let concurrency = w.concurrency.unwrap_or(4) as usize;
        if concurrency == 0 {
            self.err(&["worker", "concurrency"], "worker.concurrency must be at least 1".into());
        }
        if let Some(n) = &w.name
            && n.trim().is_empty()
        {
            self.warn(&["worker", "name"], "worker.name is empty; a unique name is generated".into());
        }
        WorkerConfig {
            name: w.name.filter(|n| !n.trim().is_empty()),
            concurrency: concurrency.max(1),
            shutdown_grace,
            lease,
            host,
            port: mcp.port.unwrap_or(5100),
            transport,
            auth,
        }
    }
}

fn at_index(p: &YamlPath, i: usize) -> YamlPath {
    let mut p = p.clone();
    p.push(Seg::Index(i));
    p
}

/// Calls `f(step id, named step)` for every `then`/`else` reference.
/// Calls `f(step, target)` for each step named in a `then`/`else`, nested steps included. Reads
/// the raw steps: a condition step with an error of its own still has its names checked.
fn collect_refs(steps: &[raw::Step], f: &mut dyn FnMut(&str, &str)) {
    for s in steps {
        for t in s.then.iter().flatten().chain(s.otherwise.iter().flatten()) {
            f(&s.id, t);
        }
        if let Some(children) = &s.steps {
            collect_refs(children, f);
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
}
