//! Runs: the types are the contract's (`lamplighter-contract`, shared with lampctl); what only
//! the engine needs, how a target's work ended, is here.

use chrono::{DateTime, Utc};

pub use lamplighter_contract::{AgentUsage, CallKind, CallRecord, Run, RunStatus, StepRecord, StepStatus, Trigger};

/// How a target's work ended, as the target sees it. Cancellation, shutdown and the job's
/// timeout are the executor's to decide; it combines them with this into the run's status.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Succeeded {
        output: serde_json::Value,
    },
    /// `retry`: whether another attempt could succeed (false for bad input or policy).
    Failed {
        error: String,
        retry: bool,
    },
    /// The target's own time limit (e.g. a plugin call's), retried like a failure.
    TimedOut {
        error: String,
    },
    /// The run waits for a person (a workflow's approval step): it is recorded
    /// `waiting_approval` and gives its executor slot back. A decision resumes it (queued,
    /// claimed again, same run); so does `until`, when the wait has a time limit.
    Waiting {
        until: Option<DateTime<Utc>>,
    },
}

impl Outcome {
    pub fn failed(error: impl Into<String>) -> Self {
        Self::Failed { error: error.into(), retry: true }
    }

    pub fn permanent(error: impl Into<String>) -> Self {
        Self::Failed { error: error.into(), retry: false }
    }
}

/// A record of `step` by the attempt `run`, with nothing to say yet but its status.
pub(crate) fn step_record(run: &Run, step: &str, status: StepStatus, started_at: Option<DateTime<Utc>>) -> StepRecord {
    StepRecord {
        step: step.to_string(),
        status,
        attempt: run.attempt,
        run_id: run.id.clone(),
        started_at,
        finished_at: None,
        output: None,
        error: None,
        resumes_on_reject: false,
    }
}
