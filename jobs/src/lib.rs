//! Lamplighter's jobs: schedules, the persistent queue and run store, the scheduler, the
//! executor and the job service API. Knows nothing of MCP, HTTP serving or the CLI.

mod agent;
mod catalog;
mod clock;
mod context;
mod deadline;
mod decide;
mod definitions;
mod engine;
pub mod events;
mod executor;
mod gate;
mod health;
mod housekeeping;
mod in_force;
mod intake;
mod lease;
mod limits;
mod listing;
mod live;
mod manage;
mod notifier;
mod notify;
mod reaper;
mod retention;
mod run;
mod schedule;
mod scheduler;
mod service;
mod share;
mod signals;
mod snapshot;
mod store;
mod target;
mod watch;
mod workflow;

pub use agent::{AgentRuntime, MAX_DELEGATION_DEPTH};
pub use clock::{Clock, ManualClock, Sleep, SystemClock};
pub use context::{RunContext, Targets};
pub use engine::{Engine, EngineError, EngineOptions, backup, migrate};
pub use lamplighter_config::{Schedule, ScheduleError, ScheduleSpec};
pub use manage::{Backfill, BackfillTick, JobChange, JobDeleted, JobRequest, JobSaved};
pub use run::{AgentUsage, CallKind, CallRecord, FollowUp, Outcome, Owner, Run, RunStatus, StepRecord, StepStatus, Trigger};
pub use schedule::jitter_for;
pub use service::{
    AgentInfo, Approval, Decision, DecisionRequest, FireTime, Followed, JobDetail, JobOrigin, JobPage, JobService, JobSummary,
    ListingVersion, PluginView, RunBrief, RunDetail, RunFollower, RunPage, SchedulePreview, ServiceError, StepView, TriggerRequest,
    Triggered, WorkerStatus, WorkflowInfo,
};
pub use snapshot::{JobSnapshot, TargetRef};
pub use store::{BackupError, RunFilter, StorageFault, StoreError, WorkerLease};
pub use target::BuiltinTargets;
pub use watch::{Interest, Watch};

use lamplighter_config::{Config, Diagnostic, Disabled, Target};
use lamplighter_plugins::Registry;

/// What the scheduler and the plugins find in a config.
#[derive(Debug, Default)]
pub struct Checked {
    /// Mistakes in the config: a worker refuses to start (or reload) with any.
    pub errors: Vec<Diagnostic>,
    /// Jobs the environment breaks (their plugin did not load): a running worker disables
    /// them with the reason and runs the rest; `config validate` reports them as errors.
    pub unavailable: Vec<Unavailable>,
    /// Other things the environment breaks (a hook whose plugin did not load), as `(what,
    /// why, diagnostic)`: disabled by a running worker, errors for `config validate`.
    pub disabled: Vec<(Disabled, String, Diagnostic)>,
}

/// A job the environment breaks.
#[derive(Debug, Clone)]
pub struct Unavailable {
    pub job: String,
    pub reason: String,
    /// What `config validate` reports, and the job's key it is placed at (`action`: or else
    /// `plugin`).
    message: String,
    key: &'static str,
}

impl Unavailable {
    /// The error `config validate` reports. Placed only when asked for: a running worker keeps
    /// the reason alone, and a place inside a job of a large file parses the file again.
    pub fn diagnostic(&self, config: &Config) -> Diagnostic {
        let at = |key: &str| config.locate(&["scheduling", "jobs", &self.job, key]);
        let at = if self.key == "action" { at("action").or_else(|| at("plugin")) } else { at(self.key) };
        Diagnostic::error(at, self.message.clone())
    }
}

/// Checks what the config crate cannot: plugin jobs and workflow plugin steps name actions that
/// exist and plugins that loaded, and a plugin step's seed-style `input` goes to an action that
/// takes one.
pub fn check(config: &Config, registry: &Registry) -> Checked {
    let mut out = Checked::default();
    // Hook bindings name a hook their plugin exports.
    for (i, b) in config.hooks.iter().enumerate() {
        let path = [lamplighter_config::keys(&["hooks", "bindings"]), vec![lamplighter_config::Seg::Index(i)]].concat();
        let at = config.sources.locate(&path).or_else(|| config.locate(&["hooks"]));
        let label = b.label();
        match registry.plugins().iter().find(|p| p.name == b.plugin) {
            None => {
                let known: Vec<&str> = registry.plugins().iter().filter(|p| !p.hooks.is_empty()).map(|p| p.name.as_str()).collect();
                out.errors.push(Diagnostic::error(
                    at,
                    format!(
                        "hook binding \"{}\" names plugin \"{}\", which does not exist; plugins with hooks: {}",
                        b.event,
                        b.plugin,
                        list(&known)
                    ),
                ));
            }
            Some(p) if p.error.is_some() => {
                let why = format!("its plugin \"{}\" could not be loaded: {}", b.plugin, p.error.as_deref().unwrap_or_default());
                let diag = Diagnostic::error(at, format!("hook {label} for \"{}\": {why}", b.event));
                out.disabled.push((Disabled::Hook(label), why, diag));
            }
            Some(p) if !p.hooks.contains(&b.hook) => {
                out.errors.push(Diagnostic::error(
                    at,
                    format!(
                        "plugin \"{}\" has no hook \"{}\"; its hooks: {}",
                        b.plugin,
                        b.hook,
                        list(&p.hooks.iter().map(String::as_str).collect::<Vec<_>>())
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    let health = health(config, registry, &mut out);
    for (name, job) in config.jobs.iter() {
        let at = |key: &str| config.locate(&["scheduling", "jobs", name, key]);
        match health.job_problem(job, registry) {
            None => {}
            Some((key, JobProblem::Unavailable { message, reason })) => {
                out.unavailable.push(Unavailable { job: name.clone(), reason, message, key });
            }
            Some((_, JobProblem::Unknown(message))) => {
                out.errors.push(Diagnostic::error(at("action").or_else(|| at("plugin")), message));
            }
        }
    }
    // Notifications that run a plugin action name one that exists (one whose plugin did not
    // load fails its runs, visibly, like a job's).
    let lists = std::iter::once((None, &config.notify)).chain(config.jobs.iter().filter_map(|(n, j)| Some((Some(n), j.notify.as_ref()?))));
    for (job, rules) in lists {
        for rule in rules {
            let lamplighter_config::NotifyTarget::Plugin { plugin, action } = &rule.to else { continue };
            if let Err(Missing::Unknown(which)) = find_action(registry, plugin, action) {
                let (at, who) = match job {
                    Some(n) => (config.locate(&["scheduling", "jobs", n, "notify"]), format!("job \"{n}\"")),
                    None => (config.locate(&["scheduling", "notify"]), "scheduling.notify".to_owned()),
                };
                out.errors.push(Diagnostic::error(at, format!("{who} notifies plugin action \"{plugin}.{action}\", {which}")));
            }
        }
    }
    out
}

/// Runs `work` on the blocking pool, off the runtime's threads that fire ticks (a walk of a
/// million jobs takes tens of ms): its result, or `None` when the runtime is shutting down. A
/// panic in `work` goes on in the caller.
pub(crate) async fn off_the_runtime<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => Some(done),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => None,
    }
}

/// What cannot run here, found once per config: agents (a plugin that did not load, a disabled
/// provider or MCP server) and workflows (a step that needs one of those), each with the reason.
/// The files' jobs and the runtime jobs are checked against it.
#[derive(Debug, Default, Clone)]
pub(crate) struct Health {
    agents_down: std::collections::HashMap<String, String>,
    broken: std::collections::HashMap<String, String>,
}

/// Why a job cannot run here.
pub(crate) enum JobProblem {
    /// The environment breaks it: it is disabled with the reason.
    Unavailable { message: String, reason: String },
    /// It names an action no plugin has: a config error.
    Unknown(String),
}

impl Health {
    /// Why agent `name` cannot run here, if it cannot.
    pub(crate) fn agent_down(&self, name: &str) -> Option<&str> {
        self.agents_down.get(name).map(String::as_str)
    }

    /// Why workflow `name` cannot run here (a step's agent or plugin action), if it cannot.
    pub(crate) fn workflow_down(&self, name: &str) -> Option<&str> {
        self.broken.get(name).map(String::as_str)
    }

    /// What keeps `job` from running here, with the field to blame.
    pub(crate) fn job_problem(&self, job: &lamplighter_config::JobConfig, registry: &Registry) -> Option<(&'static str, JobProblem)> {
        let name = &job.name;
        let unavailable =
            |reason: &String| JobProblem::Unavailable { message: format!("job \"{name}\" runs {reason}"), reason: reason.clone() };
        match &job.target {
            Target::Workflow(w) => self.broken.get(w.as_str()).map(|r| ("workflow", unavailable(r))),
            Target::Agent(a) => self.agents_down.get(a.as_str()).map(|r| ("agent", unavailable(r))),
            Target::Plugin { plugin, action } => {
                let what = format!("job \"{name}\" runs plugin action \"{plugin}.{action}\"");
                match find_action(registry, plugin, action) {
                    Ok(_) => None,
                    Err(Missing::Unloaded(reason)) => {
                        Some(("action", JobProblem::Unavailable { message: format!("{what}, but {reason}"), reason }))
                    }
                    Err(Missing::Unknown(which)) => Some(("action", JobProblem::Unknown(format!("{what}, {which}")))),
                }
            }
        }
    }
}

/// Where an agent's plugin was named: its own `plugins`, `plugins.per_agent.<agent>` or
/// `plugins.global` (the path of the item, and which of the three).
fn plugin_written_at(config: &Config, agent: &str, plugin: &str) -> Option<(Vec<lamplighter_config::Seg>, &'static str)> {
    use lamplighter_config::{Seg, keys};
    let index_in = |path: &[&str]| {
        let mut v = &config.merged;
        for k in path {
            v = v.get(k)?;
        }
        v.as_sequence()?.iter().position(|n| n.as_str() == Some(plugin))
    };
    [
        (vec!["agents", agent, "plugins"], "agent"),
        (vec!["plugins", "per_agent", agent], "plugins.per_agent"),
        (vec!["plugins", "global"], "plugins.global"),
    ]
    .into_iter()
    .find_map(|(path, whose)| index_in(&path).map(|i| ([keys(&path), vec![Seg::Index(i)]].concat(), whose)))
}

/// Finds what cannot run here; hook, agent and workflow errors go to `out`.
pub(crate) fn health(config: &Config, registry: &Registry, out: &mut Checked) -> Health {
    // Agents that cannot run here (a plugin that did not load, a disabled provider or MCP
    // server), with the reason: what runs them is disabled.
    let mut agents_down: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut global_reported = std::collections::HashSet::new();
    for (name, agent) in &config.agents {
        if let Some(why) = config.disabled.get(&Disabled::Agent(name.clone())) {
            agents_down.insert(name.clone(), format!("agent \"{name}\", which is disabled: {why}"));
        }
        for plugin in &agent.plugins {
            match registry.plugins().iter().find(|p| &p.name == plugin) {
                None => {
                    let known: Vec<&str> = registry.plugins().iter().map(|p| p.name.as_str()).collect();
                    // Where the name was written: the agent's own list, `plugins.per_agent`, or
                    // `plugins.global` (said once, not for every agent).
                    let (path, whose) =
                        plugin_written_at(config, name, plugin).unwrap_or_else(|| (lamplighter_config::keys(&["agents", name]), "agent"));
                    if whose == "plugins.global" && !global_reported.insert(plugin.clone()) {
                        continue;
                    }
                    let at = config.sources.locate(&path);
                    let who = if whose == "plugins.global" { "plugins.global names".to_string() } else { format!("agent \"{name}\" uses") };
                    out.errors.push(Diagnostic::error(
                        at.or_else(|| config.locate(&["agents", name])),
                        format!("{who} plugin \"{plugin}\", which does not exist; known plugins: {}", known.join(", ")),
                    ));
                }
                Some(p) => {
                    if let Some(why) = &p.error {
                        agents_down
                            .entry(name.clone())
                            .or_insert_with(|| format!("agent \"{name}\", whose plugin \"{plugin}\" could not be loaded: {why}"));
                    }
                }
            }
        }
    }
    // Workflows whose steps cannot run here, with the reason (their jobs are disabled).
    let mut broken: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for (wname, workflow) in &config.workflows {
        for step in workflow.all_steps() {
            let agents: Vec<&String> = match &step.kind {
                lamplighter_config::StepKind::Agent { agent, .. } => vec![agent],
                lamplighter_config::StepKind::GroupChat { agents, .. } => agents.iter().collect(),
                _ => Vec::new(),
            };
            for a in agents {
                if let Some(reason) = agents_down.get(a.as_str()) {
                    broken.entry(wname.clone()).or_insert_with(|| format!("workflow \"{wname}\": step \"{}\" needs {reason}", step.id));
                }
            }
        }
        for step in workflow.all_steps() {
            let lamplighter_config::StepKind::Plugin { plugin, action, input, .. } = &step.kind else { continue };
            let at = config.locate(&["workflows", wname]);
            let what = format!("workflow \"{wname}\": step \"{}\" runs plugin action \"{plugin}.{action}\"", step.id);
            match find_action(registry, plugin, action) {
                Ok(schema) => {
                    let takes_input = schema.get("properties").and_then(|p| p.get("input")).is_some();
                    if input.is_some() && !takes_input {
                        out.errors.push(Diagnostic::error(
                            at,
                            format!(
                                "{what}, which takes no \"input\" parameter; pass what it needs in \"parameters\" instead of \"input\""
                            ),
                        ));
                    }
                }
                Err(Missing::Unloaded(reason)) => {
                    broken.entry(wname.clone()).or_insert_with(|| format!("{what}, but {reason}"));
                }
                Err(Missing::Unknown(which)) => out.errors.push(Diagnostic::error(at, format!("{what}, {which}"))),
            }
        }
    }
    Health { agents_down, broken }
}

/// Why a plugin action cannot run here.
enum Missing {
    /// Its plugin is known but did not load: what depends on it is disabled (the reason).
    Unloaded(String),
    /// No plugin has it: a config error (the rest of the message, with the known actions).
    Unknown(String),
}

/// The action's parameter schema, or why it cannot run here.
fn find_action<'r>(registry: &'r Registry, plugin: &str, action: &str) -> Result<&'r serde_json::Value, Missing> {
    registry.action_parameters(plugin, action).ok_or_else(|| {
        match registry.plugins().iter().find(|p| p.name == plugin).and_then(|p| p.error.as_deref()) {
            Some(why) => Missing::Unloaded(format!("plugin \"{plugin}\" could not be loaded: {why}")),
            None => Missing::Unknown(format!("which does not exist; known actions: {}", registry.action_names().join(", "))),
        }
    })
}

/// Every problem [`check`] finds, as `config validate` reports them (jobs the environment
/// breaks are errors there too).
pub fn validate(config: &Config, registry: &Registry) -> Vec<Diagnostic> {
    let checked = check(config, registry);
    let mut out = checked.errors;
    out.extend(checked.unavailable.iter().map(|u| u.diagnostic(config)));
    out
}

fn list(names: &[&str]) -> String {
    if names.is_empty() { "none".into() } else { names.join(", ") }
}
