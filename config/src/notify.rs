//! Notifications, resolved: who is told what when a job's runs fail, recover, succeed or wait
//! for a person (`notify:` on a job, and `scheduling.notify` for every job that sets none).
//! What an event is, and when a rule fires, is decided in the run core; this is the config.

use crate::ai::Secret;

/// One `notify:` entry: on which event, after how many failures in a row, to whom.
#[derive(Debug, Clone, PartialEq)]
pub struct NotifyRule {
    pub on: NotifyOn,
    /// `failure`: fires from the Nth failure in a row on (default 1: every failure).
    /// `recovery`: fires only when at least N failures came before the success.
    pub after_consecutive: u32,
    pub to: NotifyTarget,
}

/// The events a rule can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NotifyOn {
    /// A run's final outcome (after its retries) is failed, timed out or interrupted.
    Failure,
    Success,
    /// The first success after failures.
    Recovery,
    /// A run waits for a person's decision (a workflow approval, an agent's tool call).
    ApprovalWaiting,
    /// An agent with `on_budget: ask` ran out and asks for more.
    BudgetAsked,
    /// A tick not started, or a run not finished, by its job's `deadline` (told once, while it
    /// still waits or runs).
    DeadlineMissed,
    /// Ticks no worker fired on time (none was up, or the database was away), told once when a
    /// worker next sees them, whatever its `catch_up` does with them.
    Missed,
}

impl NotifyOn {
    pub const ALL: [NotifyOn; 7] =
        [Self::Failure, Self::Success, Self::Recovery, Self::ApprovalWaiting, Self::BudgetAsked, Self::DeadlineMissed, Self::Missed];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Failure => "failure",
            Self::Success => "success",
            Self::Recovery => "recovery",
            Self::ApprovalWaiting => "approval_waiting",
            Self::BudgetAsked => "budget_asked",
            Self::DeadlineMissed => "deadline_missed",
            Self::Missed => "missed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

/// Where a notification goes.
#[derive(Debug, Clone, PartialEq)]
pub enum NotifyTarget {
    /// An HTTP POST of the event.
    Webhook(Webhook),
    /// A run of the workflow, the event as its input.
    Workflow(String),
    /// A run of the agent, the event as its input.
    Agent(String),
    /// A run of the plugin action, the event as its parameters' `event`.
    Plugin { plugin: String, action: String },
}

impl NotifyTarget {
    /// How messages and listings name it (`webhook https://host/…`, `workflow page-oncall`).
    /// A webhook is shown by its scheme and host only: its path and query often are the
    /// secret (a Slack webhook's are).
    pub fn describe(&self) -> String {
        match self {
            Self::Webhook(w) => {
                let (scheme, rest) = w.url.split_once("://").unwrap_or(("http", &w.url));
                let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
                let host = host.rsplit('@').next().unwrap_or_default();
                format!("webhook {scheme}://{host}/…")
            }
            Self::Workflow(w) => format!("workflow {w}"),
            Self::Agent(a) => format!("agent {a}"),
            Self::Plugin { plugin, action } => format!("plugin {plugin}.{action}"),
        }
    }
}

/// `to: {webhook: URL}` or `to: {webhook: {url, headers, format}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Webhook {
    pub url: String,
    /// Sent with each request; values may come from `${ENV}` and are never shown.
    pub headers: Vec<(String, Secret)>,
    pub format: WebhookFormat,
}

/// The body a webhook is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookFormat {
    /// The event as JSON: `event`, `job`, `run_id`, `status`, `error`, `duration_ms`,
    /// `attempt`, `command`, …
    Generic,
    /// `{"text": "…"}`, what a Slack incoming webhook takes.
    Slack,
}
