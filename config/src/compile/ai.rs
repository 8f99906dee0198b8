//! Compiles `ai.providers`, `mcp.servers`, `agents` (with their budgets and tool approval), and
//! what unset `${VAR}`s disable.

use std::collections::BTreeMap;
use std::path::Path;

use super::{Compiler, Disabled, duration};
use crate::ai::{
    Agent, ApprovalMode, Budget, DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_ITERS, DEFAULT_MAX_RETRIES, McpServer, Model, ModelApi, OnBudget,
    Pricing, Provider, ProviderApi, RateLimit, Secret, Skill, SystemPrompt, ToolApproval, resolve_model,
};
use crate::diag::{Diagnostic, did_you_mean, quoted_list};
use crate::load::keys;
use crate::raw;
use crate::yaml::Seg;

impl Compiler<'_> {
    /// An unset `${VAR}` disables what needs it where that is safe (provider keys, MCP server
    /// settings); anywhere else the value is needed, so it is an error.
    pub(super) fn check_unset_vars(&mut self) {
        for (path, var) in &self.loaded.unset_vars {
            let k: Vec<&str> = path.iter().map(|s| if let Seg::Key(k) = s { k.as_str() } else { "" }).collect();
            match k.as_slice() {
                ["ai", "providers", p, ..] => {
                    self.disabled.insert(Disabled::Provider(p.to_string()), format!("${{{var}}} is not set"));
                }
                ["mcp", "servers", s, ..] => {
                    self.disabled.insert(Disabled::McpServer(s.to_string()), format!("${{{var}}} is not set"));
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

    pub(super) fn providers(&mut self) -> BTreeMap<String, Provider> {
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

    pub(super) fn mcp_servers(&mut self) -> BTreeMap<String, McpServer> {
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
    pub(super) fn agents(
        &mut self,
        providers: &BTreeMap<String, Provider>,
        default_model: Option<&str>,
        skills: &BTreeMap<String, Skill>,
        cwd: &Path,
    ) -> BTreeMap<String, Agent> {
        let servers: Vec<String> =
            self.loaded.raw.mcp.as_ref().and_then(|m| m.servers.as_ref()).map(|s| s.keys().cloned().collect()).unwrap_or_default();
        let agents = self.loaded.raw.agents.clone().unwrap_or_default();
        let agent_names: Vec<String> = agents.keys().cloned().collect();
        let (global, per_agent) = self.plugin_grants(&agent_names);
        let mut out = BTreeMap::new();
        for (name, a) in agents {
            self.name_matches_key("agents", &name, a.name.as_deref());
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
                    self.disabled.insert(Disabled::Agent(name.clone()), "no model: set agents.<name>.model or ai.default_model".into());
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
                    if let Some(reason) = self.disabled.get(&Disabled::Provider(p.clone())).cloned() {
                        self.disabled.insert(Disabled::Agent(name.clone()), format!("its provider \"{p}\" is disabled: {reason}"));
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
                } else if let Some(reason) = self.disabled.get(&Disabled::McpServer(s.clone())).cloned() {
                    self.disabled.entry(Disabled::Agent(name.clone())).or_insert(format!("its MCP server \"{s}\" is disabled: {reason}"));
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
                skills: self.agent_skills(&name, a.skills.unwrap_or_default(), skills),
                plugins: self.agent_plugins(&name, a.plugins.unwrap_or_default(), &global, per_agent.get(&name)),
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

    /// An agent's `skills`, each a skill of `skills.dirs`.
    fn agent_skills(&mut self, agent: &str, named: Vec<String>, skills: &BTreeMap<String, Skill>) -> Vec<String> {
        for (i, n) in named.iter().enumerate() {
            if !skills.contains_key(n) {
                let hint = did_you_mean(n, skills.keys().map(String::as_str));
                let known = if !hint.is_empty() {
                    String::new()
                } else if skills.is_empty() {
                    " (no skills are defined: put skill folders in a folder listed in skills.dirs)".to_string()
                } else {
                    format!(" (skills: {})", quoted_list(skills.keys().map(String::as_str)))
                };
                let loc = self.loaded.sources.locate(&[keys(&["agents", agent, "skills"]), vec![Seg::Index(i)]].concat());
                self.diags
                    .push(Diagnostic::error(loc, format!("agent \"{agent}\" names skill \"{n}\", which is not defined{hint}{known}")));
            }
        }
        named
    }

    /// The seed's `name:` repeats the key; a different one is said, not dropped in silence.
    pub(super) fn name_matches_key(&mut self, section: &str, key: &str, name: Option<&str>) {
        if let Some(n) = name
            && n != key
        {
            self.warn(
                &[section, key, "name"],
                format!(
                    "{section}.{key} has name: \"{n}\"; the key is its name, so this one is not used (write the same, or leave it out)"
                ),
            );
        }
    }

    /// `plugins.global` (plugins every agent gets) and `plugins.per_agent` (an agent's
    /// additions, and `-name` removals), checked; `plugins.native_trust_dirs` said to do nothing.
    fn plugin_grants(&mut self, agents: &[String]) -> (Vec<String>, BTreeMap<String, Vec<String>>) {
        let Some(p) = self.loaded.raw.plugins.clone() else { return Default::default() };
        if p.native_trust_dirs.as_ref().is_some_and(|d| !d.is_empty()) {
            self.warn(
                &["plugins", "native_trust_dirs"],
                "plugins.native_trust_dirs would load native (.NET) plugins from these folders unchecked; native plugins are not \
                 loaded here at all (only WASM ones, sandboxed): build the plugin for WASM (see plugins/examples); the key has no effect"
                    .into(),
            );
        }
        let per_agent = p.per_agent.unwrap_or_default();
        for (agent, names) in &per_agent {
            if !agents.contains(agent) {
                let hint = did_you_mean(agent, agents.iter().map(String::as_str));
                self.err(
                    &["plugins", "per_agent", agent],
                    format!("plugins.per_agent names agent \"{agent}\", which is not defined{hint}"),
                );
            }
            for (i, n) in names.iter().enumerate() {
                if n.trim_start_matches('-').trim().is_empty() {
                    let loc = self.loaded.sources.locate(&[keys(&["plugins", "per_agent", agent]), vec![Seg::Index(i)]].concat());
                    self.diags.push(Diagnostic::error(loc, format!("plugins.per_agent.{agent} has an empty plugin name")));
                }
            }
        }
        (p.global.unwrap_or_default(), per_agent)
    }

    /// An agent's plugins: its own, then `plugins.per_agent`'s additions, then `plugins.global`,
    /// each once, less the `-name` removals of `plugins.per_agent`.
    fn agent_plugins(&mut self, agent: &str, own: Vec<String>, global: &[String], per_agent: Option<&Vec<String>>) -> Vec<String> {
        let per_agent = per_agent.map(Vec::as_slice).unwrap_or_default();
        let (removed, added): (Vec<&String>, Vec<&String>) = per_agent.iter().partition(|n| n.starts_with('-'));
        let removed: Vec<&str> = removed.iter().map(|n| n.trim_start_matches('-').trim()).collect();
        let mut out: Vec<String> = Vec::new();
        for n in own.iter().chain(added).chain(global) {
            if !out.contains(n) && !removed.contains(&n.as_str()) {
                out.push(n.clone());
            }
        }
        for (i, r) in per_agent.iter().enumerate().filter(|(_, n)| n.starts_with('-')) {
            let name = r.trim_start_matches('-').trim();
            if !name.is_empty() && !own.iter().chain(global).any(|n| n == name) {
                let loc = self.loaded.sources.locate(&[keys(&["plugins", "per_agent", agent]), vec![Seg::Index(i)]].concat());
                self.diags.push(Diagnostic::warning(
                    loc,
                    format!("plugins.per_agent.{agent} removes plugin \"{name}\", which the agent does not have (not its own, not in plugins.global)"),
                ));
            }
        }
        out
    }

    /// A `budget:` map (of an agent or a job) checked.
    pub(super) fn budget(&mut self, at: &[&str], b: Option<&raw::Budget>) -> Budget {
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
}
