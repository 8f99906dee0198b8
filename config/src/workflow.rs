//! Workflows, resolved: each step's kind is an enum carrying exactly the fields that kind uses,
//! and every template (`when`, `condition`, `input`, `parameters`, an approval's message) is
//! parsed once, here.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::template::{Template, Templated};

/// A workflow (`workflows.<name>`). Serializable: a run keeps the definition it started with
/// (stored with the run), and listings show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workflow {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The seed's informational `trigger` (e.g. `manual`); jobs are what schedule workflows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    pub steps: Vec<Step>,
}

/// One step. Step ids are unique across the whole workflow, `parallel` children included.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub id: String,
    /// The step runs only when this renders truthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Template>,
    /// The `scheduling.limits` the step holds a slot of while it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<crate::LimitUse>,
    #[serde(flatten)]
    pub kind: StepKind,
}

/// What a step does, in the shape it is written in YAML (`type:` and that type's fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StepKind {
    Agent {
        agent: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<Templated>,
    },
    Plugin {
        plugin: String,
        action: String,
        /// The seed's plugin steps pass a string `input`: it becomes the action's `input`
        /// parameter (validation checks that the action has one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<Templated>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parameters: Option<Templated>,
    },
    Condition {
        condition: Template,
        /// Step ids run when the condition holds …
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        then: Vec<String>,
        /// … and when it does not (`else` in YAML).
        #[serde(default, rename = "else", skip_serializing_if = "Vec::is_empty")]
        otherwise: Vec<String>,
    },
    Approval {
        /// The question put to the approver.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<Templated>,
        #[serde(default, with = "opt_duration", skip_serializing_if = "Option::is_none")]
        timeout: Option<Duration>,
        /// What a timeout decides (default reject).
        #[serde(default)]
        on_timeout: Decision,
    },
    Parallel {
        steps: Vec<Step>,
    },
    GroupChat {
        agents: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<Templated>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_iterations: Option<u32>,
    },
}

/// An approval's decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approve,
    #[default]
    Reject,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Reject => "reject",
        }
    }
}

/// A duration stored as humantime text (`24h`).
mod opt_duration {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?.map(|t| humantime::parse_duration(&t).map_err(serde::de::Error::custom)).transpose()
    }
}

impl Step {
    /// This step and every step nested in it, depth first, in order.
    pub fn walk(&self) -> Vec<&Step> {
        let mut out = vec![self];
        if let StepKind::Parallel { steps } = &self.kind {
            out.extend(steps.iter().flat_map(Step::walk));
        }
        out
    }
}

impl Step {
    /// The limits this step holds while it runs: its own and those of the steps in it, each
    /// once.
    pub fn held_limits(&self) -> Vec<&crate::LimitUse> {
        let mut out: Vec<&crate::LimitUse> = Vec::new();
        for l in self.walk().into_iter().flat_map(|s| &s.limits) {
            if !out.contains(&l) {
                out.push(l);
            }
        }
        out
    }
}

impl Workflow {
    /// Every step, nested ones included, depth first, in order.
    pub fn all_steps(&self) -> Vec<&Step> {
        self.steps.iter().flat_map(Step::walk).collect()
    }
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
