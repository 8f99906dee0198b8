//! The catalog as the listings show it (`list_workflows`, `list_agents`, `list_plugins`): what
//! each workflow does step by step, what each agent is offered, what each plugin provides, and
//! why any of them cannot be used here. Made from the config in force and the loaded plugins;
//! the job service serves it.

use lamplighter_config::{ApprovalMode, Config, Disabled, Step, StepKind};
use lamplighter_contract::{ActionView, AgentInfo, PluginView, StepOutline, WorkflowInfo};
use lamplighter_plugins::Registry;

/// What the catalog listings show, made from the config in force with the plugins loaded:
/// made at start and again on every reload.
#[derive(Debug, Clone, Default)]
pub(crate) struct Listing {
    pub(crate) workflows: Vec<WorkflowInfo>,
    pub(crate) agents: Vec<AgentInfo>,
    pub(crate) plugins: Vec<PluginView>,
}

impl Listing {
    pub(crate) fn of(config: &Config, registry: &Registry) -> Self {
        let disabled = |what: fn(String) -> Disabled, name: &str| config.disabled.get(&what(name.to_string())).cloned();
        let workflows = config
            .workflows
            .iter()
            .map(|(name, w)| WorkflowInfo {
                name: name.clone(),
                description: w.description.clone(),
                trigger: w.trigger.clone(),
                steps: outline(&w.steps),
                disabled: disabled(Disabled::Workflow, name),
            })
            .collect();
        let agents = config
            .agents
            .iter()
            .map(|(name, a)| {
                let disabled = disabled(Disabled::Agent, name);
                AgentInfo {
                    name: name.clone(),
                    description: a.description.clone(),
                    model: a.model.clone(),
                    provider: a.resolved.as_ref().map(|r| r.provider.clone()).or_else(|| a.provider.clone()),
                    model_id: a.resolved.as_ref().map(|r| r.model.id.clone()),
                    plugins: a.plugins.clone(),
                    mcp_servers: a.mcp_servers.clone(),
                    tools: agent_tools(a, registry),
                    delegates: a.delegates.clone(),
                    tool_approval: match a.tool_approval.mode {
                        ApprovalMode::Auto => "auto",
                        ApprovalMode::Deny => "deny",
                        ApprovalMode::Ask => "ask",
                    }
                    .into(),
                    enabled: disabled.is_none(),
                    disabled,
                }
            })
            .collect();
        Self { workflows, agents, plugins: plugins(registry) }
    }
}

/// The tools an agent is offered, as far as the worker knows them without starting its MCP
/// servers: its plugins' actions, and `server.*` (or the `allowed_actions` naming the server).
fn agent_tools(a: &lamplighter_config::Agent, registry: &Registry) -> Vec<String> {
    let allowed = |name: &str| a.allowed_actions.is_empty() || a.allowed_actions.iter().any(|p| lamplighter_config::name_matches(p, name));
    let mut out: Vec<String> = registry
        .plugins()
        .iter()
        .filter(|p| a.plugins.contains(&p.name) && p.error.is_none())
        .flat_map(|p| p.actions.iter().map(move |x| format!("{}.{}", p.name, x.name)))
        .filter(|n| allowed(n))
        .collect();
    for server in &a.mcp_servers {
        let prefix = format!("{server}.");
        let named: Vec<String> = a.allowed_actions.iter().filter(|p| p.starts_with(&prefix)).cloned().collect();
        if a.allowed_actions.is_empty() {
            out.push(format!("{server}.*"));
        } else {
            out.extend(named);
        }
    }
    if !a.delegates.is_empty() {
        out.extend(["delegate_to_agent".to_string(), "delegate_to_multiple_agents".to_string()]);
    }
    out
}

/// Steps as `list_workflows` shows them.
fn outline(steps: &[Step]) -> Vec<StepOutline> {
    steps
        .iter()
        .map(|s| {
            let (does, children) = match &s.kind {
                StepKind::Plugin { plugin, action, .. } => (format!("{plugin}.{action}"), Vec::new()),
                StepKind::Agent { agent, .. } => (agent.clone(), Vec::new()),
                StepKind::GroupChat { agents, .. } => (agents.join(", "), Vec::new()),
                StepKind::Condition { condition, then, otherwise } => {
                    (format!("{condition} ? [{}] : [{}]", then.join(", "), otherwise.join(", ")), Vec::new())
                }
                StepKind::Approval { timeout, on_timeout, .. } => match timeout {
                    Some(t) => (format!("timeout {}, then {}", humantime::format_duration(*t), on_timeout.as_str()), Vec::new()),
                    None => ("waits until decided".into(), Vec::new()),
                },
                StepKind::Parallel { steps } => (format!("{} steps at once", steps.len()), outline(steps)),
            };
            StepOutline {
                id: s.id.clone(),
                step_type: s.kind.step_type().as_str().into(),
                does,
                when: s.when.as_ref().map(ToString::to_string),
                steps: children,
            }
        })
        .collect()
}

/// The plugins the worker knows, loaded or not (then with why).
fn plugins(registry: &Registry) -> Vec<PluginView> {
    registry
        .plugins()
        .iter()
        .map(|p| PluginView {
            name: p.name.clone(),
            version: p.version.clone(),
            kind: p.kind.clone(),
            description: p.description.clone(),
            actions: p
                .actions
                .iter()
                .map(|a| ActionView { name: a.name.clone(), description: a.description.clone(), parameters: a.parameters.clone() })
                .collect(),
            error: p.error.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The catalog `list_agents`/`list_workflows` serve comes from the resolved config: the
    /// default model fills in, disabled reasons show, steps are outlined. The config is in the
    /// seed's shape (`tests/fixtures/seed-shaped`); the seed's own is checked by the `seed` test.
    #[test]
    fn catalog_of_a_seed_shaped_config() {
        let seed = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/seed-shaped/gantri.yaml");
        // Loading reads only; the working directory is where relative paths would point.
        let opts = lamplighter_config::LoadOptions { path: Some(seed), cwd: Some(std::env::temp_dir()), ..Default::default() };
        let config = lamplighter_config::load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}")).config;
        let c = Listing::of(&config, &Registry::builtin());
        assert_eq!((c.agents.len(), c.workflows.len()), (7, 3));
        let digest = c.agents.iter().find(|a| a.name == "digest-writer").expect("listed");
        assert_eq!(digest.model.as_deref(), Some("default"));
        assert!(digest.disabled.as_deref().is_some_and(|d| d.contains("AZURE_OPENAI_API_KEY")), "{digest:?}");
        assert!(!digest.enabled);
        assert_eq!(digest.tools, ["file-save.save", "brave.*"], "its plugin's actions and its MCP server");
        assert_eq!((digest.provider.as_deref(), digest.model_id.as_deref()), (Some("azure-openai"), Some("gpt-5-mini")));
        let review = c.workflows.iter().find(|w| w.name == "article-review").expect("listed");
        let outline: Vec<(&str, &str, &str)> =
            review.steps.iter().map(|s| (s.id.as_str(), s.step_type.as_str(), s.does.as_str())).collect();
        assert_eq!(
            outline,
            [
                ("draft", "agent", "drafter"),
                ("review", "parallel", "2 steps at once"),
                ("final-edit", "agent", "copy-editor"),
                ("approval", "approval", "waits until decided")
            ]
        );
        assert_eq!(review.steps[1].steps.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["copy-check", "claim-check"]);
    }
}
