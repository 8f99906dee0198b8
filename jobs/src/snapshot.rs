//! What a run was created to do: the job as it was then ([`JobSnapshot`]) and its target by
//! name ([`TargetRef`]). Stored with the run, so a reload between creation and execution (or
//! between two attempts) never mixes two configs in one run. Pure values: no store, no
//! runtime.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use lamplighter_config::{Budget, JobConfig, LimitUse, Target, Workflow};

/// What a job ran, as it was when the run was created: stored with the run, so a reload
/// between creation and execution (or between two attempts) never mixes two configs in one
/// run. Input and parameters are on the run itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSnapshot {
    pub target: TargetRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_directory: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_commands: Vec<String>,
    /// The job's `budget` (over the agents' own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// The job's `limits`: its runs (every attempt) hold a slot of each while they run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<LimitUse>,
}

/// A job's target, by name; a workflow with its definition, so that every attempt of a run
/// (and a run resumed after an approval or a restart) follows the steps it started with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TargetRef {
    Plugin {
        plugin: String,
        action: String,
    },
    Workflow {
        workflow: String,
        /// `None` in runs stored before definitions were: those follow the config in force.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        definition: Option<Arc<Workflow>>,
    },
    Agent {
        agent: String,
    },
    /// A named pipeline run by hand: its agents as they were, each given the previous answer.
    Pipeline {
        pipeline: String,
        agents: Vec<String>,
    },
    /// A group chat run by hand: the agents in turn, `rounds` times, each given the previous
    /// answer (the seed's `orchestrate group-chat`).
    GroupChat {
        agents: Vec<String>,
        rounds: u32,
    },
}

impl JobSnapshot {
    /// `workflow`: the definition of the workflow the job runs, if it runs one.
    pub fn of(job: &JobConfig, workflow: Option<&Arc<Workflow>>) -> Self {
        Self {
            target: match &job.target {
                Target::Plugin { plugin, action } => TargetRef::Plugin { plugin: plugin.clone(), action: action.clone() },
                Target::Workflow(w) => TargetRef::Workflow { workflow: w.clone(), definition: workflow.cloned() },
                Target::Agent(a) => TargetRef::Agent { agent: a.clone() },
            },
            timeout_ms: job.timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            working_directory: job.working_directory.clone(),
            allowed_commands: job.allowed_commands.to_vec(),
            budget: job.budget.as_deref().copied(),
            limits: job.limits().to_vec(),
        }
    }

    /// What a run without a job executes (a workflow run by hand, a run a notification starts):
    /// its target with a job's defaults.
    pub fn of_target(target: TargetRef) -> Self {
        Self { target, timeout_ms: None, working_directory: None, allowed_commands: Vec::new(), budget: None, limits: Vec::new() }
    }

    pub fn timeout(&self) -> Option<std::time::Duration> {
        self.timeout_ms.map(std::time::Duration::from_millis)
    }
}
