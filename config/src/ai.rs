//! The AI side of the config, resolved: providers and their models, agents, pipelines and the
//! MCP servers agents use. Names are checked across sections when the config compiles; what a
//! model alias means is decided here, once, by [`Config::resolve_model`](crate::Config::resolve_model).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A value that must not be shown: `Debug` prints `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: String) -> Self {
        Self(s)
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// An LLM provider (`ai.providers.<name>`).
#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    pub name: String,
    pub api: ProviderApi,
    pub api_key: Option<Secret>,
    /// By alias. Empty: any model name is passed through as the model id.
    pub models: BTreeMap<String, Model>,
    /// `rate_limits.<provider>` (top level) over `ai.rate_limits.<provider>`.
    pub rate_limit: RateLimit,
    /// How long one model call may take (default [`DEFAULT_CALL_TIMEOUT`]).
    pub timeout: Duration,
    /// Retries of a call that failed with 429, 5xx, a timeout or a dropped connection.
    pub max_retries: u32,
}

/// The default of `ai.providers.<name>.timeout`.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// The default of `ai.providers.<name>.max_retries`.
pub const DEFAULT_MAX_RETRIES: u32 = 3;

/// How a provider is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderApi {
    /// `base_url`: any OpenAI-compatible endpoint (OpenAI, Azure AI Foundry `/openai/v1/`,
    /// Ollama, vLLM, llama.cpp). Wins when `endpoint` is set too.
    OpenAiCompatible { base_url: String },
    /// `endpoint` (+ `api_version`): Azure OpenAI, models addressed by deployment.
    AzureOpenAi { endpoint: String, api_version: Option<String> },
    /// Neither is set; the agent runner refuses it with that reason.
    Unspecified,
}

/// Request and token budgets per minute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimit {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
}

/// Which API a model is called through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ModelApi {
    /// Chat Completions (the default).
    #[default]
    Chat,
    /// The Responses API (`api_type: responses`).
    Responses,
}

/// A model under a provider, by alias.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub alias: String,
    /// What the provider calls it.
    pub id: String,
    pub deployment_name: Option<String>,
    pub description: Option<String>,
    pub api: ModelApi,
    pub max_tokens: Option<u32>,
    pub default_temperature: Option<f64>,
    pub pricing: Option<Pricing>,
}

/// Prices per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pricing {
    pub input: f64,
    pub output: f64,
}

impl Pricing {
    /// What `input` prompt and `output` completion tokens cost.
    pub fn cost(&self, input: u64, output: u64) -> f64 {
        (input as f64 * self.input + output as f64 * self.output) / 1_000_000.0
    }
}

impl Model {
    /// A model a provider without a `models` list is asked for by name.
    pub(crate) fn passthrough(alias: &str) -> Self {
        Self {
            alias: alias.to_string(),
            id: alias.to_string(),
            deployment_name: None,
            description: None,
            api: ModelApi::Chat,
            max_tokens: None,
            default_temperature: None,
            pricing: None,
        }
    }
}

/// A model alias resolved to its provider.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRef {
    pub provider: String,
    pub model: Model,
}

/// Resolves `alias`: under `provider` when given (its `models` must hold the alias, unless it
/// lists none), otherwise under the first provider, by name, that defines it.
pub fn resolve_model(providers: &BTreeMap<String, Provider>, provider: Option<&str>, alias: &str) -> Option<ModelRef> {
    let (name, p) = match provider {
        Some(name) => (name, providers.get(name)?),
        None => providers.iter().find(|(_, p)| p.models.contains_key(alias)).map(|(n, p)| (n.as_str(), p))?,
    };
    let model = if p.models.is_empty() { Model::passthrough(alias) } else { p.models.get(alias)?.clone() };
    Some(ModelRef { provider: name.to_string(), model })
}

/// Where an agent's system prompt comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemPrompt {
    Inline(String),
    /// `system_prompt_file`, resolved against the working directory; read when the agent runs.
    File(PathBuf),
}

/// An agent (`agents.<name>`).
#[derive(Debug, Clone, PartialEq)]
pub struct Agent {
    pub name: String,
    pub description: Option<String>,
    /// The model alias: the agent's own `model`, else `ai.default_model`.
    pub model: Option<String>,
    /// The provider as written (listings show it).
    pub provider: Option<String>,
    /// The alias resolved; `None` when there is no model or the reference is an error.
    pub resolved: Option<ModelRef>,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// Tool-loop iterations before the agent gives up (default 10).
    pub max_iters: u32,
    pub system_prompt: Option<SystemPrompt>,
    pub skills: Vec<String>,
    /// Its plugins: its own, then `plugins.per_agent`'s additions, then `plugins.global`, each
    /// once, less `plugins.per_agent`'s `-name` removals.
    pub plugins: Vec<String>,
    pub mcp_servers: Vec<String>,
    pub allowed_actions: Vec<String>,
    pub allowed_commands: Vec<String>,
    pub working_directory: Option<PathBuf>,
    pub delegates: Vec<String>,
    pub budget: Budget,
    pub tool_approval: ToolApproval,
}

/// Limits on one run of an agent. `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_total: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_ms")]
    pub max_duration: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_budget: Option<OnBudget>,
}

impl Budget {
    /// This budget's limits, falling back to `base`'s field by field.
    pub fn over(&self, base: &Budget) -> Budget {
        Budget {
            max_tokens_total: self.max_tokens_total.or(base.max_tokens_total),
            max_tool_calls: self.max_tool_calls.or(base.max_tool_calls),
            max_cost: self.max_cost.or(base.max_cost),
            max_duration: self.max_duration.or(base.max_duration),
            on_budget: self.on_budget.or(base.on_budget),
        }
    }
}

/// What happens when a run reaches its budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBudget {
    /// The run fails with `budget exceeded: …`.
    #[default]
    Fail,
    /// The run waits for approval to go on with its budget raised by as much again.
    Ask,
}

/// Whether an agent's tool calls need a person.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolApproval {
    pub mode: ApprovalMode,
    /// The tools `mode` applies to (`plugin.action`, `server.tool`, `prefix.*`); empty: all.
    /// Tools not listed run without asking.
    pub tools: Vec<String>,
}

impl ToolApproval {
    /// The mode for the tool named `tool` (`plugin.action`).
    pub fn mode_for(&self, tool: &str) -> ApprovalMode {
        if self.tools.is_empty() || self.tools.iter().any(|p| name_matches(p, tool)) { self.mode } else { ApprovalMode::Auto }
    }
}

/// `auto`: calls run; `deny`: the model is told the call was refused; `ask`: the run waits
/// for a person's decision on the call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ApprovalMode {
    #[default]
    Auto,
    Deny,
    Ask,
}

/// `pattern` is a tool name, or a prefix followed by `*` (`shell-exec.*`, `fs.read*`).
pub fn name_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

mod opt_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

/// The default of `agents.<name>.max_iters`.
pub const DEFAULT_MAX_ITERS: u32 = 10;

/// A sequence of agents (`pipelines.<name>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pipeline {
    pub description: Option<String>,
    pub agents: Vec<String>,
}

/// A skill (`skills.dirs`): a folder with a `SKILL.md` whose front matter names and describes
/// it and whose body holds the instructions; its other files are read when the instructions
/// call for them. Agents list the skills they name and load one with a tool when a task needs
/// it (SPEC §6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    /// The skill's folder (its `SKILL.md` and files).
    pub dir: PathBuf,
}

/// An MCP server agents can use (`mcp.servers.<name>`). `Debug` shows the names of its `env`
/// variables and headers, never their values (they often hold keys).
#[derive(Clone, PartialEq, Eq)]
pub enum McpServer {
    /// A child process speaking MCP over stdio.
    Stdio { command: String, args: Vec<String>, env: BTreeMap<String, String> },
    /// A streamable-HTTP endpoint.
    Http { url: String, headers: BTreeMap<String, String> },
}

impl fmt::Debug for McpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            McpServer::Stdio { command, args, env } => {
                f.debug_struct("Stdio").field("command", command).field("args", args).field("env", &env.keys().collect::<Vec<_>>()).finish()
            }
            McpServer::Http { url, headers } => {
                f.debug_struct("Http").field("url", url).field("headers", &headers.keys().collect::<Vec<_>>()).finish()
            }
        }
    }
}
