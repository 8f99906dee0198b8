//! Runs: the record of one execution of a job, its status and what triggered it; workflow
//! steps and agent calls as recorded.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Where a run is in its life. Stored as its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Queued,
    Running,
    WaitingApproval,
    Succeeded,
    Failed,
    Cancelled,
    TimedOut,
    Skipped,
    Interrupted,
}

impl RunStatus {
    pub const ALL: [RunStatus; 9] = [
        Self::Queued,
        Self::Running,
        Self::WaitingApproval,
        Self::Succeeded,
        Self::Failed,
        Self::Cancelled,
        Self::TimedOut,
        Self::Skipped,
        Self::Interrupted,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::WaitingApproval => "waiting_approval",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::TimedOut => "timed_out",
            Self::Skipped => "skipped",
            Self::Interrupted => "interrupted",
        }
    }

    /// True once the run will not change again.
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Queued | Self::Running | Self::WaitingApproval)
    }
}

impl std::str::FromStr for RunStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| format!("unknown run status \"{s}\"; use one of {}", Self::ALL.map(|x| x.as_str()).join(", ")))
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Cron,
    Manual,
    CatchUp,
    Retry,
    Api,
    /// A past tick run by `backfill_job`.
    Backfill,
    /// The jobs it runs `after` had their outcomes.
    After,
}

impl Trigger {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Cron => "cron",
            Self::Manual => "manual",
            Self::CatchUp => "catch_up",
            Self::Retry => "retry",
            Self::Api => "api",
            Self::Backfill => "backfill",
            Self::After => "after",
        }
    }
}

impl std::str::FromStr for Trigger {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [Self::Cron, Self::Manual, Self::CatchUp, Self::Retry, Self::Api, Self::Backfill, Self::After]
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| format!("unknown trigger \"{s}\""))
    }
}

/// One run, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Run {
    pub id: String,
    pub job: String,
    pub trigger: Trigger,
    pub status: RunStatus,
    /// The tick this run belongs to (cron and catch-up runs).
    pub scheduled_at: Option<DateTime<Utc>>,
    /// When it was allowed to start (tick + jitter, or a retry's backoff).
    pub due_at: DateTime<Utc>,
    pub enqueued_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub attempt: u32,
    pub input: Option<serde_json::Value>,
    pub parameters: Option<serde_json::Value>,
    pub output: Option<serde_json::Value>,
    pub error: Option<String>,
    pub worker: Option<String>,
    pub idempotency_key: Option<String>,
    /// The first attempt's id: every retry and recovery of one tick or trigger shares it, and
    /// checkpoints are kept under it.
    pub root_id: String,
    pub retry_of: Option<String>,
    pub next_run_id: Option<String>,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
    pub cost: Option<f64>,
    /// The trace of the latest execution (32 hex digits), when spans were exported.
    pub trace_id: Option<String>,
    /// Who started it by hand: the token's name, or the MCP client's (none for scheduled runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Why a queued run has not started: `waiting for limit "warehouse": 2 of 2 held by …`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

impl Run {
    /// Start minus due instant, when started.
    pub fn lateness(&self) -> Option<chrono::Duration> {
        self.started_at.map(|s| s - self.due_at)
    }
}

/// Where a workflow step is. Stored as its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Running,
    WaitingApproval,
    Succeeded,
    Failed,
    /// Not run: its `when` was false, or it is in the branch a condition did not take.
    Skipped,
    /// Stopped because a sibling in its `parallel` failed, or the run was cancelled or timed out.
    Cancelled,
    /// The worker stopped while it was running; it runs again when the run is picked up.
    Interrupted,
}

impl StepStatus {
    pub const ALL: [StepStatus; 7] =
        [Self::Running, Self::WaitingApproval, Self::Succeeded, Self::Failed, Self::Skipped, Self::Cancelled, Self::Interrupted];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::WaitingApproval => "waiting_approval",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
            Self::Cancelled => "cancelled",
            Self::Interrupted => "interrupted",
        }
    }

    /// Finished for good: a later attempt of the run keeps it instead of running the step again.
    pub fn is_done(self) -> bool {
        matches!(self, Self::Succeeded | Self::Skipped)
    }
}

impl std::str::FromStr for StepStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|x| x.as_str() == s).ok_or_else(|| format!("unknown step status \"{s}\""))
    }
}

impl std::fmt::Display for StepStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One workflow step of a run, as recorded: kept per run identity (every attempt of the run
/// sees it), so a retry or a recovered run continues from the steps that finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StepRecord {
    pub step: String,
    pub status: StepStatus,
    /// The attempt that recorded it, and its run id.
    pub attempt: u32,
    pub run_id: String,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Capped (see `workflow::OUTPUT_CAP`).
    pub output: Option<serde_json::Value>,
    pub error: Option<String>,
    /// A wait whose rejection resumes the run, which acts on it (an agent's tool call: the
    /// model is told), instead of failing the run naming the step (a workflow approval).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resumes_on_reject: bool,
}

/// One model call or tool call of an agent conversation, as recorded once it returned: kept
/// per run identity, so a run that executes again replays it instead of calling again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CallRecord {
    /// `""` for an agent job, the step id for a workflow step; delegations and group-chat
    /// turns add a suffix to their parent's.
    pub conversation: String,
    /// The call's place in its conversation.
    pub seq: u32,
    pub kind: CallKind,
    /// The model id, or the tool as configured (`plugin.action`, `server.tool`).
    pub name: String,
    /// A tool call's id, as the model gave it.
    pub call_id: Option<String>,
    /// A tool call's arguments; a model call's summary (the messages and tools it was sent).
    pub request: Option<serde_json::Value>,
    /// A model's reply (`content`, `tool_calls`), or a tool's result.
    pub response: Option<serde_json::Value>,
    /// A tool call that failed (the model was told so), or a model call that did not return.
    pub error: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// From the model's `pricing`; `None` when the model has none.
    pub cost: Option<f64>,
    /// The attempt that made the call.
    pub run_id: String,
    pub attempt: u32,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
}

/// What a run's agents used, summed over its call records (every attempt's): what `get_run`
/// shows and what budgets are checked against.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AgentUsage {
    pub model_calls: u64,
    pub tool_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// From the models' `pricing`; `None` when no model called has one.
    pub cost: Option<f64>,
    /// Time spent in model and tool calls (waits for a decision, and time between attempts,
    /// do not count).
    #[serde(skip)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub busy: std::time::Duration,
}

impl AgentUsage {
    pub fn of(calls: &[CallRecord]) -> Self {
        let mut u = AgentUsage::default();
        for c in calls {
            u.busy += (c.finished_at - c.started_at).to_std().unwrap_or_default();
            match c.kind {
                CallKind::Model => {
                    u.model_calls += 1;
                    u.input_tokens = u.input_tokens.saturating_add(c.input_tokens);
                    u.output_tokens = u.output_tokens.saturating_add(c.output_tokens);
                    if let Some(cost) = c.cost {
                        u.cost = Some(u.cost.unwrap_or(0.0) + cost);
                    }
                }
                CallKind::Tool => u.tool_calls += 1,
            }
        }
        u
    }

    /// Prompt and completion tokens together.
    pub fn tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// What a [`CallRecord`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    Model,
    Tool,
}

impl CallKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            CallKind::Model => "model",
            CallKind::Tool => "tool",
        }
    }
}

/// One line of a run's live output (a command's stdout or stderr), recorded as it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct OutputLine {
    /// Its place in the attempt's output, from 1.
    pub seq: u64,
    /// `stdout`, `stderr`, or `lamplighter` (a note of the worker's: what the cap dropped).
    pub stream: String,
    pub at: DateTime<Utc>,
    pub text: String,
}

/// Where a notification is: waiting to be sent (again), being sent, sent, or given up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum NotificationStatus {
    Pending,
    Sending,
    Delivered,
    Abandoned,
}

impl NotificationStatus {
    pub const ALL: [NotificationStatus; 4] = [Self::Pending, Self::Sending, Self::Delivered, Self::Abandoned];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sending => "sending",
            Self::Delivered => "delivered",
            Self::Abandoned => "abandoned",
        }
    }
}

impl std::str::FromStr for NotificationStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|x| x.as_str() == s).ok_or_else(|| format!("unknown notification status \"{s}\""))
    }
}

/// A notification about a run (its `notify:` rules), as recorded: one per event and rule,
/// kept per run identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Notification {
    /// The event's key: sent with it (`Idempotency-Key`), so a receiver can tell a repeat.
    pub key: String,
    /// `failure`, `success`, `recovery`, `approval_waiting` or `budget_asked`.
    pub event: String,
    /// Where it goes: `webhook https://host/…` (the URL's path is not shown), `workflow W`,
    /// `agent A`, `plugin P.X`.
    pub target: String,
    pub status: NotificationStatus,
    /// Sends tried so far.
    pub attempts: u32,
    /// The attempt of the run it reports.
    pub run_id: String,
    pub created_at: DateTime<Utc>,
    /// When it is tried next (pending), or when the send under way gives up (sending).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<DateTime<Utc>>,
    /// What it became: the receiver's HTTP status, or the run it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered: Option<String>,
    /// Why the last send failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_round_trip() {
        for s in RunStatus::ALL {
            assert_eq!(s.as_str().parse::<RunStatus>(), Ok(s));
        }
        assert!("done".parse::<RunStatus>().unwrap_err().contains("use one of queued, running"));
    }
}
