//! Workflows, resolved: each step's kind is an enum carrying exactly the fields that kind uses,
//! and every template (`when`, `condition`, `input`, `parameters`, an approval's message) is
//! parsed once, here.

use std::time::Duration;

use crate::template::{Template, Templated};

/// A workflow (`workflows.<name>`).
#[derive(Debug, Clone, PartialEq)]
pub struct Workflow {
    pub name: String,
    pub description: Option<String>,
    /// The seed's informational `trigger` (e.g. `manual`); jobs are what schedule workflows.
    pub trigger: Option<String>,
    pub steps: Vec<Step>,
}

/// One step. Step ids are unique across the whole workflow, `parallel` children included.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub id: String,
    /// The step runs only when this renders truthy.
    pub when: Option<Template>,
    pub kind: StepKind,
}

/// What a step does.
#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    Agent {
        agent: String,
        input: Option<Templated>,
    },
    Plugin {
        plugin: String,
        action: String,
        /// The seed's plugin steps pass an `input` too.
        input: Option<Templated>,
        parameters: Option<Templated>,
    },
    Condition {
        condition: Template,
        /// Step ids run when the condition holds …
        then: Vec<String>,
        /// … and when it does not (`else` in YAML).
        otherwise: Vec<String>,
    },
    Approval {
        /// The question put to the approver.
        input: Option<Templated>,
        timeout: Option<Duration>,
        /// As written (`approve`/`reject`); interpreted by the workflow engine.
        default_decision: Option<String>,
        on_reject: Option<String>,
    },
    Parallel {
        steps: Vec<Step>,
    },
    GroupChat {
        agents: Vec<String>,
        input: Option<Templated>,
        max_iterations: Option<u32>,
    },
}

impl StepKind {
    /// The kind, as written in `type:`.
    pub fn step_type(&self) -> StepType {
        match self {
            StepKind::Agent { .. } => StepType::Agent,
            StepKind::Plugin { .. } => StepType::Plugin,
            StepKind::Condition { .. } => StepType::Condition,
            StepKind::Approval { .. } => StepType::Approval,
            StepKind::Parallel { .. } => StepType::Parallel,
            StepKind::GroupChat { .. } => StepType::GroupChat,
        }
    }
}

/// A step's `type:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepType {
    Agent,
    Plugin,
    Condition,
    Approval,
    Parallel,
    GroupChat,
}

impl StepType {
    /// Every type, in the order messages list them.
    pub const ALL: [StepType; 6] =
        [StepType::Agent, StepType::Plugin, StepType::Condition, StepType::Approval, StepType::Parallel, StepType::GroupChat];

    pub fn as_str(self) -> &'static str {
        match self {
            StepType::Agent => "agent",
            StepType::Plugin => "plugin",
            StepType::Condition => "condition",
            StepType::Approval => "approval",
            StepType::Parallel => "parallel",
            StepType::GroupChat => "group_chat",
        }
    }

    /// Exact and case-sensitive, as users write it.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}
