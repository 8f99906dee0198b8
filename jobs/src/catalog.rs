//! The agents part of the config in force — agents, providers, pipelines, MCP servers, skills, and the
//! agents that cannot run — swapped whole on reload; a run keeps the one it started with.

use std::collections::BTreeMap;

use lamplighter_config::{Agent, Config, McpServer, Pipeline, Provider, Skill};

/// The agents part of the config, swapped whole on reload.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    pub(crate) agents: BTreeMap<String, Agent>,
    pub(crate) providers: BTreeMap<String, Provider>,
    pub(crate) pipelines: BTreeMap<String, Pipeline>,
    pub(crate) mcp_servers: BTreeMap<String, McpServer>,
    pub(crate) skills: BTreeMap<String, Skill>,
    /// `ai.default_model`: what a plugin's `ai_complete` gets when it names no model.
    pub(crate) default_model: Option<String>,
    /// Agents that cannot run (their key is unset, …), with why.
    pub(crate) disabled: BTreeMap<String, String>,
    /// Providers that cannot be called (their key is unset), with why.
    pub(crate) providers_down: BTreeMap<String, String>,
}

impl Catalog {
    pub(crate) fn of(config: &Config) -> Self {
        let disabled = config.disabled.iter().filter_map(|(what, why)| Some((what.agent()?.to_owned(), why.clone()))).collect();
        let providers_down = config
            .disabled
            .iter()
            .filter_map(|(what, why)| match what {
                lamplighter_config::Disabled::Provider(name) => Some((name.clone(), why.clone())),
                _ => None,
            })
            .collect();
        Self {
            agents: config.agents.clone(),
            providers: config.providers.clone(),
            pipelines: config.pipelines.clone(),
            mcp_servers: config.mcp_servers.clone(),
            skills: config.skills.clone(),
            default_model: config.default_model.clone(),
            disabled,
            providers_down,
        }
    }
}
