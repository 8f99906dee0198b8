//! Runs: the types are the contract's (`lamplighter-contract`, plain serde values shared with
//! lampctl); what only the engine needs is here: the run state machine ([`Transitions`]) and
//! how a target's work ended ([`Outcome`]).

use chrono::{DateTime, Utc};

pub use lamplighter_contract::{AgentUsage, CallKind, CallRecord, Run, RunStatus, StepRecord, StepStatus, Trigger};

/// The run state machine: which status may follow which. Every write of a status checks it (the
/// store turns it into the `WHERE status IN (…)` guard), so a finished run never changes.
pub(crate) trait Transitions: Sized {
    /// Whether a run in this status may move to `next`.
    fn can_become(self, next: Self) -> bool;
    /// The statuses from which a run may move to `next`.
    fn sources(next: Self) -> impl Iterator<Item = Self>;
    /// The statuses a run is still going in (not final).
    fn active() -> impl Iterator<Item = Self>;
}

impl Transitions for RunStatus {
    fn can_become(self, next: RunStatus) -> bool {
        use RunStatus::*;
        match self {
            // Skipped runs are created final; only a waiting run that is resumed (its approval
            // decided, or its wait over) moves back into `Queued`, to be claimed again.
            Queued => matches!(next, Running | Cancelled),
            Running => matches!(next, WaitingApproval | Succeeded | Failed | Cancelled | TimedOut | Interrupted),
            WaitingApproval => matches!(next, Queued | Failed | Cancelled),
            Succeeded | Failed | Cancelled | TimedOut | Skipped | Interrupted => false,
        }
    }

    fn sources(next: RunStatus) -> impl Iterator<Item = RunStatus> {
        RunStatus::ALL.into_iter().filter(move |s| s.can_become(next))
    }

    fn active() -> impl Iterator<Item = RunStatus> {
        RunStatus::ALL.into_iter().filter(|s| !s.is_final())
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_statuses_never_change_and_runs_only_start_from_queued() {
        for s in RunStatus::ALL {
            for n in RunStatus::ALL {
                if s.is_final() {
                    assert!(!s.can_become(n), "{s} is final but may become {n}");
                }
            }
        }
        assert_eq!(RunStatus::sources(RunStatus::Running).collect::<Vec<_>>(), [RunStatus::Queued]);
        assert_eq!(
            RunStatus::sources(RunStatus::Cancelled).collect::<Vec<_>>(),
            [RunStatus::Queued, RunStatus::Running, RunStatus::WaitingApproval]
        );
        assert_eq!(RunStatus::sources(RunStatus::Interrupted).collect::<Vec<_>>(), [RunStatus::Running]);
        assert_eq!(RunStatus::sources(RunStatus::Queued).collect::<Vec<_>>(), [RunStatus::WaitingApproval]);
        assert_eq!(RunStatus::active().collect::<Vec<_>>(), [RunStatus::Queued, RunStatus::Running, RunStatus::WaitingApproval]);
    }
}
