//! Lamplighter's jobs: schedules, the persistent queue and run store, the scheduler, the
//! executor and the job service API. Knows nothing of MCP, HTTP serving or the CLI.

mod clock;
mod decide;
mod engine;
mod executor;
mod gate;
mod queue;
mod run;
mod schedule;
mod scheduler;
mod service;
mod signals;
mod store;
mod target;

pub use clock::{Clock, ManualClock, Sleep, SystemClock};
pub use engine::{Changes, Engine, EngineError, EngineOptions, migrate};
pub use lamplighter_config::{Schedule, ScheduleError};
pub use run::{Outcome, Run, RunStatus, Trigger};
pub use schedule::jitter_for;
pub use service::{FireTime, JobDetail, JobPage, JobSummary, RunBrief, RunPage, ServiceError, TriggerRequest, Triggered, WorkerStatus};
pub use store::{RunFilter, StoreError};
pub use target::{BuiltinTargets, JobSnapshot, RunContext, TargetRef, Targets};

use lamplighter_config::{Config, Diagnostic, Target};
use lamplighter_plugins::Registry;

/// What the scheduler and the plugins find in a config.
#[derive(Debug, Default)]
pub struct Checked {
    /// Mistakes in the config: a worker refuses to start (or reload) with any.
    pub errors: Vec<Diagnostic>,
    /// Jobs the environment breaks (their plugin did not load): a running worker disables
    /// them with the reason and runs the rest; `config validate` reports them as errors.
    pub unavailable: Vec<Unavailable>,
}

/// A job the environment breaks.
#[derive(Debug, Clone)]
pub struct Unavailable {
    pub job: String,
    pub reason: String,
    pub diagnostic: Diagnostic,
}

/// Checks what the config crate cannot: plugin jobs name actions that exist and plugins that
/// loaded.
pub fn check(config: &Config, registry: &Registry) -> Checked {
    let mut out = Checked::default();
    for (name, job) in &config.jobs {
        if let Target::Plugin { plugin, action } = &job.target
            && !registry.has_action(plugin, action)
        {
            let at =
                config.locate(&["scheduling", "jobs", name, "action"]).or_else(|| config.locate(&["scheduling", "jobs", name, "plugin"]));
            match registry.plugins().iter().find(|p| &p.name == plugin).and_then(|p| p.error.as_deref()) {
                Some(why) => {
                    let reason = format!("plugin \"{plugin}\" could not be loaded: {why}");
                    out.unavailable.push(Unavailable {
                        job: name.clone(),
                        diagnostic: Diagnostic::error(at, format!("job \"{name}\" runs plugin action \"{plugin}.{action}\", but {reason}")),
                        reason,
                    });
                }
                None => out.errors.push(Diagnostic::error(
                    at,
                    format!(
                        "job \"{name}\" runs plugin action \"{plugin}.{action}\", which does not exist; known actions: {}",
                        registry.action_names().join(", ")
                    ),
                )),
            }
        }
    }
    out
}

/// Every problem [`check`] finds, as `config validate` reports them (jobs the environment
/// breaks are errors there too).
pub fn validate(config: &Config, registry: &Registry) -> Vec<Diagnostic> {
    let checked = check(config, registry);
    let mut out = checked.errors;
    out.extend(checked.unavailable.into_iter().map(|u| u.diagnostic));
    out
}
