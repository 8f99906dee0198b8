//! Lamplighter's jobs: schedules, the persistent queue and run store, the scheduler, the
//! executor and the job service API. Knows nothing of MCP, HTTP serving or the CLI.

mod clock;
mod decide;
mod engine;
mod executor;
mod gate;
mod run;
mod schedule;
mod scheduler;
mod service;
mod store;
mod target;

pub use clock::{Clock, ManualClock, Sleep, SystemClock};
pub use engine::{Engine, EngineError, EngineOptions, migrate};
pub use run::{Outcome, Run, RunStatus, Trigger};
pub use schedule::{Schedule, ScheduleError, jitter_for};
pub use service::{FireTime, JobDetail, JobPage, JobSummary, RunBrief, RunPage, ServiceError, TriggerRequest, Triggered, WorkerStatus};
pub use store::{RunFilter, StoreError};
pub use target::{BuiltinTargets, JobSnapshot, RunContext, TargetRef, Targets};

use lamplighter_config::{Config, Diagnostic, Target};
use lamplighter_plugins::Registry;

/// Checks what the config crate cannot: schedules parse, and plugin jobs name actions that
/// exist. Returns every problem with its location.
pub fn validate(config: &Config, registry: &Registry) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (name, job) in &config.jobs {
        if let Some(spec) = &job.schedule
            && let Err(e) = Schedule::from_spec(spec, &job.timezone)
        {
            let field = match spec {
                lamplighter_config::ScheduleSpec::Cron(_) => "cron",
                lamplighter_config::ScheduleSpec::Every(_) => "every",
                lamplighter_config::ScheduleSpec::At(_) => "at",
            };
            out.push(Diagnostic::error(config.locate(&["scheduling", "jobs", name, field]), format!("job \"{name}\": {e}")));
        }
        if let Target::Plugin { plugin, action } = &job.target
            && !registry.has_action(plugin, action)
        {
            out.push(Diagnostic::error(
                config.locate(&["scheduling", "jobs", name, "action"]).or_else(|| config.locate(&["scheduling", "jobs", name, "plugin"])),
                match registry.plugins().iter().find(|p| &p.name == plugin).and_then(|p| p.error.as_deref()) {
                    Some(why) => format!(
                        "job \"{name}\" runs plugin action \"{plugin}.{action}\", but plugin \"{plugin}\" could not be loaded: {why}"
                    ),
                    None => format!(
                        "job \"{name}\" runs plugin action \"{plugin}.{action}\", which does not exist; known actions: {}",
                        registry.action_names().join(", ")
                    ),
                },
            ));
        }
    }
    out
}
