//! Runs as the engine knows them: the domain [`Run`], whose owner ([`Owner`]) and follow-up
//! ([`FollowUp`]) are types, turned into the contract's wire struct only at the service edge
//! ([`Run::to_wire`]); the run state machine ([`Transitions`]); how a target's work ended
//! ([`Outcome`]). Statuses, triggers and step records are plain values shared with the wire.

use std::fmt;

use chrono::{DateTime, Utc};

pub use lamplighter_contract::{AgentUsage, CallKind, CallRecord, RunStatus, StepRecord, StepStatus, Trigger};

/// One run as the engine sees it (one execution of a job, or of a target started without one).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub id: String,
    /// Whose run it is.
    pub owner: Owner,
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
    /// The first attempt's id: every retry and recovery of one tick or trigger shares it.
    pub root_id: String,
    pub retry_of: Option<String>,
    /// Whether another attempt follows this one.
    pub follow_up: FollowUp,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
    pub cost: Option<f64>,
    /// The trace of the latest execution (32 hex digits), when spans were exported.
    pub trace_id: Option<String>,
    /// Who started it by hand: the token's name, or the MCP client's (none for scheduled runs).
    pub requested_by: Option<String>,
    /// The limit a queued run waits for a slot of.
    pub limit_wait: Option<crate::limits::LimitWait>,
    /// The limits' pools it holds a slot of while it runs.
    pub pools: Vec<crate::limits::Pool>,
}

impl Run {
    /// Start minus due instant, when started.
    pub fn lateness(&self) -> Option<chrono::Duration> {
        self.started_at.map(|s| s - self.due_at)
    }

    /// The run in a listing of a job's latest runs.
    pub fn brief(&self) -> lamplighter_contract::RunBrief {
        lamplighter_contract::RunBrief {
            id: self.id.clone(),
            status: self.status,
            trigger: self.trigger,
            enqueued_at: self.enqueued_at,
            finished_at: self.finished_at,
        }
    }

    /// The run as the contract shows it: the owner by the name runs are listed under, the
    /// follow-up as `next_run_id` (absent while undecided, empty when none follows).
    pub fn to_wire(&self) -> lamplighter_contract::Run {
        lamplighter_contract::Run {
            id: self.id.clone(),
            job: self.owner.to_string(),
            trigger: self.trigger,
            status: self.status,
            scheduled_at: self.scheduled_at,
            due_at: self.due_at,
            enqueued_at: self.enqueued_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            attempt: self.attempt,
            input: self.input.clone(),
            parameters: self.parameters.clone(),
            output: self.output.clone(),
            error: self.error.clone(),
            worker: self.worker.clone(),
            idempotency_key: self.idempotency_key.clone(),
            root_id: self.root_id.clone(),
            retry_of: self.retry_of.clone(),
            next_run_id: match &self.follow_up {
                FollowUp::Undecided => None,
                FollowUp::None => Some(String::new()),
                FollowUp::Next(id) => Some(id.clone()),
            },
            tokens_in: self.tokens_in,
            tokens_out: self.tokens_out,
            cost: self.cost,
            trace_id: self.trace_id.clone(),
            requested_by: self.requested_by.clone(),
            waiting_for: self.waiting_for(),
        }
    }

    /// What a queued run waits for, as a listing says it (`get_run` names the holders too).
    pub fn waiting_for(&self) -> Option<String> {
        let wait = self.limit_wait.as_ref().filter(|_| self.status == RunStatus::Queued)?;
        Some(format!("waiting for {}", wait.pool.describe()))
    }
}

/// Whose run it is: a job's, or a target's started without a job (by hand, or by a
/// notification). Stored and listed under one name: the job's, or the target's with a prefix
/// config refuses in job names (`workflow:w`, `agent:a`, `pipeline:p`, `group-chat:a,b`,
/// `plugin:p.action`); the store reads that name back into this type, and nothing else does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    Job(String),
    Workflow(String),
    Agent(String),
    Pipeline(String),
    GroupChat(Vec<String>),
    Plugin { plugin: String, action: String },
}

impl Owner {
    pub(crate) const WORKFLOW: &str = "workflow:";
    pub(crate) const AGENT: &str = "agent:";
    pub(crate) const PIPELINE: &str = "pipeline:";
    pub(crate) const GROUP_CHAT: &str = "group-chat:";
    pub(crate) const PLUGIN: &str = "plugin:";

    /// The owner a stored name stands for. A name with a reserved prefix that does not parse
    /// (a damaged row) reads as a job of that name: no job has it, so it is treated as a job
    /// that is gone (not retried, no notices), and it is written back unchanged.
    pub(crate) fn from_stored(name: &str) -> Self {
        let named = |rest: &str| (!rest.is_empty()).then(|| rest.to_string());
        let parsed = if let Some(w) = name.strip_prefix(Self::WORKFLOW) {
            named(w).map(Self::Workflow)
        } else if let Some(a) = name.strip_prefix(Self::AGENT) {
            named(a).map(Self::Agent)
        } else if let Some(p) = name.strip_prefix(Self::PIPELINE) {
            named(p).map(Self::Pipeline)
        } else if let Some(members) = name.strip_prefix(Self::GROUP_CHAT) {
            let agents: Vec<String> = members.split(',').map(str::to_string).collect();
            (!agents.iter().any(String::is_empty)).then_some(Self::GroupChat(agents))
        } else if let Some(pa) = name.strip_prefix(Self::PLUGIN) {
            pa.split_once('.')
                .filter(|(p, a)| !p.is_empty() && !a.is_empty() && !a.contains('.'))
                .map(|(p, a)| Self::Plugin { plugin: p.to_string(), action: a.to_string() })
        } else {
            None
        };
        parsed.unwrap_or_else(|| Self::Job(name.to_string()))
    }

    /// The job's name, for a job's run.
    pub fn job(&self) -> Option<&str> {
        match self {
            Self::Job(name) => Some(name),
            _ => None,
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Job(name) => f.write_str(name),
            Self::Workflow(w) => write!(f, "{}{w}", Self::WORKFLOW),
            Self::Agent(a) => write!(f, "{}{a}", Self::AGENT),
            Self::Pipeline(p) => write!(f, "{}{p}", Self::PIPELINE),
            Self::GroupChat(agents) => write!(f, "{}{}", Self::GROUP_CHAT, agents.join(",")),
            Self::Plugin { plugin, action } => write!(f, "{}{plugin}.{action}", Self::PLUGIN),
        }
    }
}

/// Whether another attempt follows a run. Decided when the run ends for good (none) or when its
/// retry is recorded (the next attempt's id); a run that is going, or was interrupted and not
/// yet looked at by recovery, is undecided.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FollowUp {
    #[default]
    Undecided,
    None,
    Next(String),
}

impl FollowUp {
    /// As stored in `next_run_id`: NULL while undecided, '' when none follows.
    pub(crate) fn from_stored(next_run_id: Option<String>) -> Self {
        match next_run_id {
            None => Self::Undecided,
            Some(id) if id.is_empty() => Self::None,
            Some(id) => Self::Next(id),
        }
    }
}

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
            // Back to `Queued`: a workflow step waits for a limit's slot, in line.
            Running => matches!(next, Queued | WaitingApproval | Succeeded | Failed | Cancelled | TimedOut | Interrupted),
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
    /// A workflow step takes limits the run holds no slot of: the run gives its executor slot
    /// and its limits' slots back and is queued again, in line for `pools` (its job's and the
    /// step's); admitted, it resumes at that step (SPEC §4a).
    WaitingForLimits {
        pools: Vec<crate::limits::Pool>,
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
impl Run {
    /// A first attempt of `owner`, enqueued and due at `at`, for tests to change what they
    /// are about.
    pub(crate) fn for_tests(id: &str, owner: Owner, trigger: Trigger, status: RunStatus, at: DateTime<Utc>) -> Run {
        Run {
            id: id.into(),
            owner,
            trigger,
            status,
            scheduled_at: None,
            due_at: at,
            enqueued_at: at,
            started_at: None,
            finished_at: None,
            attempt: 1,
            input: None,
            parameters: None,
            output: None,
            error: None,
            worker: None,
            idempotency_key: None,
            root_id: id.into(),
            retry_of: None,
            follow_up: FollowUp::Undecided,
            tokens_in: None,
            tokens_out: None,
            cost: None,
            trace_id: None,
            requested_by: None,
            limit_wait: None,
            pools: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_is_stored_under_its_name_and_read_back_as_itself() {
        let s = |x: &str| x.to_string();
        for (owner, name) in [
            (Owner::Job(s("nightly-report")), "nightly-report"),
            (Owner::Workflow(s("etl")), "workflow:etl"),
            (Owner::Agent(s("scribe")), "agent:scribe"),
            (Owner::Pipeline(s("chain")), "pipeline:chain"),
            (Owner::GroupChat(vec![s("a"), s("b")]), "group-chat:a,b"),
            (Owner::Plugin { plugin: s("file-save"), action: s("save") }, "plugin:file-save.save"),
        ] {
            assert_eq!(owner.to_string(), name);
            assert_eq!(Owner::from_stored(name), owner, "{name}");
        }
        // Damaged names read as a job of that name (no job can have it) and are written back as
        // they were.
        for damaged in ["workflow:", "plugin:x", "plugin:.a", "plugin:p.a.b", "group-chat:a,,b", "agent:"] {
            assert_eq!(Owner::from_stored(damaged), Owner::Job(s(damaged)));
            assert_eq!(Owner::from_stored(damaged).to_string(), damaged);
        }
    }

    #[test]
    fn a_follow_up_is_undecided_none_or_the_next_attempt_and_shown_as_next_run_id() {
        assert_eq!(FollowUp::from_stored(None), FollowUp::Undecided);
        assert_eq!(FollowUp::from_stored(Some(String::new())), FollowUp::None);
        assert_eq!(FollowUp::from_stored(Some("r2".into())), FollowUp::Next("r2".into()));
        let t = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("time");
        let run = |follow_up| Run { follow_up, ..Run::for_tests("r1", Owner::Agent("a".into()), Trigger::Manual, RunStatus::Failed, t) };
        let wire = |f| run(f).to_wire();
        assert_eq!(wire(FollowUp::Undecided).next_run_id, None);
        assert_eq!(wire(FollowUp::None).next_run_id.as_deref(), Some(""));
        assert_eq!(wire(FollowUp::Next("r2".into())).next_run_id.as_deref(), Some("r2"));
        assert_eq!(wire(FollowUp::None).job, "agent:a");
    }

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
        assert_eq!(RunStatus::sources(RunStatus::Queued).collect::<Vec<_>>(), [RunStatus::Running, RunStatus::WaitingApproval]);
        assert_eq!(RunStatus::active().collect::<Vec<_>>(), [RunStatus::Queued, RunStatus::Running, RunStatus::WaitingApproval]);
    }
}
