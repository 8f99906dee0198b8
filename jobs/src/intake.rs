//! What goes into the store, as values: a run to insert ([`NewRun`]), how it is handed over
//! ([`Dispatch`], [`Claim`]) and what a tick became ([`TickOutcome`], [`Handed`]). A leaf: the
//! store records them and `decide.rs` plans with them, and neither needs the other for it.

use chrono::{DateTime, Utc};

use crate::run::{FollowUp, Owner, Run, RunStatus, Trigger};
use crate::snapshot::JobSnapshot;

/// A run to insert.
#[derive(Debug, Clone)]
pub(crate) struct NewRun {
    pub(crate) owner: Owner,
    pub(crate) trigger: Trigger,
    pub(crate) status: RunStatus,
    pub(crate) scheduled_at: Option<DateTime<Utc>>,
    pub(crate) due_at: DateTime<Utc>,
    pub(crate) attempt: u32,
    pub(crate) input: Option<serde_json::Value>,
    pub(crate) parameters: Option<serde_json::Value>,
    pub(crate) error: Option<String>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) retry_of: Option<String>,
    /// The run identity it continues (`None`: a new one, its own id).
    pub(crate) root_id: Option<String>,
    pub(crate) snapshot: Option<JobSnapshot>,
    /// Who asked for it (a run started by hand).
    pub(crate) requested_by: Option<String>,
    /// Its job's runs need not go one at a time (`overlap` is not `queue`, not a backfill): a
    /// run that takes limits and is due as it is inserted waits in its first pool's line from
    /// the insert, never read as due (no second write marks it waiting).
    pub(crate) in_line: bool,
}

impl NewRun {
    /// A first attempt of `job` asked for at `now` (by hand, through the API, by a
    /// notification), due at once, running `snapshot`; input, parameters, key and asker are
    /// the caller's to set.
    pub(crate) fn asked(owner: Owner, trigger: Trigger, snapshot: JobSnapshot, now: DateTime<Utc>) -> Self {
        NewRun { snapshot: Some(snapshot), ..Self::first(owner, trigger, now) }
    }

    /// A cron tick of `job` at `at`, with nothing else set: the tests' tick.
    #[cfg(test)]
    pub(crate) fn tick(job: &str, at: DateTime<Utc>) -> Self {
        NewRun { scheduled_at: Some(at), ..Self::first(Owner::Job(job.into()), Trigger::Cron, at) }
    }

    /// A queued first attempt due at `due_at`, nothing else set.
    fn first(owner: Owner, trigger: Trigger, due_at: DateTime<Utc>) -> Self {
        NewRun {
            owner,
            trigger,
            status: RunStatus::Queued,
            scheduled_at: None,
            due_at,
            attempt: 1,
            input: None,
            parameters: None,
            error: None,
            idempotency_key: None,
            retry_of: None,
            root_id: None,
            snapshot: None,
            requested_by: None,
            in_line: false,
        }
    }

    /// The run as it is stored once inserted under `id` at `now` (not yet claimed).
    pub(crate) fn to_run(&self, id: &str, now: DateTime<Utc>) -> Run {
        Run {
            id: id.to_string(),
            owner: self.owner.clone(),
            trigger: self.trigger,
            status: self.status,
            scheduled_at: self.scheduled_at,
            due_at: self.due_at,
            enqueued_at: now,
            started_at: None,
            finished_at: None,
            attempt: self.attempt,
            input: self.input.clone(),
            parameters: self.parameters.clone(),
            output: None,
            error: self.error.clone(),
            worker: None,
            idempotency_key: self.idempotency_key.clone(),
            root_id: self.root_id.clone().unwrap_or_else(|| id.to_string()),
            retry_of: self.retry_of.clone(),
            follow_up: FollowUp::Undecided,
            tokens_in: None,
            tokens_out: None,
            cost: None,
            trace_id: None,
            requested_by: self.requested_by.clone(),
            limit_wait: None,
            pools: self.snapshot.as_ref().map(|s| crate::limits::pools_of(&s.limits, self.input.as_ref())).unwrap_or_default(),
        }
    }

    /// The next attempt of `run`: same identity, job snapshot, tick, input and parameters,
    /// attempt + 1. (The store copies the snapshot from the stored run.)
    pub(crate) fn follow_up(run: &Run, due_at: DateTime<Utc>) -> Self {
        NewRun {
            owner: run.owner.clone(),
            trigger: Trigger::Retry,
            status: RunStatus::Queued,
            scheduled_at: run.scheduled_at,
            due_at,
            attempt: run.attempt + 1,
            input: run.input.clone(),
            parameters: run.parameters.clone(),
            error: None,
            idempotency_key: None,
            retry_of: Some(run.id.clone()),
            root_id: Some(run.root_id.clone()),
            snapshot: None,
            requested_by: run.requested_by.clone(),
            in_line: false,
        }
    }
}

/// How a run being inserted is handed over.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dispatch<'a> {
    /// Not by the inserter (not due, held, or skipped; or left to the hand-over). Where the
    /// queue is the runs' rows, a due run that needs no hand-over decision is in the queue
    /// from its insert all the same ([`crate::store::dialect::Dialect::QUEUED_BY_INSERT`]).
    No,
    /// Through the queue (a task is pushed in the same transaction).
    Queued,
    /// Claimed by this worker at once.
    Claimed(&'a str),
}

/// A run claimed for this worker (`running`, its worker and start recorded) with what it
/// needs to execute.
#[derive(Debug, Clone)]
pub(crate) struct Handed {
    pub(crate) run: Run,
    /// The job as it was when the run was created; `None` for rows from before snapshots.
    pub(crate) snapshot: Option<JobSnapshot>,
    /// A run that waited for approval and continues: it keeps its first start.
    pub(crate) resumed: bool,
}

/// The result of a recorded tick.
#[derive(Debug, Clone)]
pub(crate) struct TickOutcome {
    pub(crate) run_id: String,
    pub(crate) status: RunStatus,
    /// Runs to cancel because the job's overlap policy is `replace`.
    pub(crate) replaced: Vec<String>,
    /// The run, claimed for this worker in the tick's own transaction (the caller holds a slot
    /// for it).
    pub(crate) handed: Option<Handed>,
    /// The run went to the queue in the same transaction.
    pub(crate) pushed: bool,
}

/// Runs a tick or a dispatch may claim for this worker in its own transaction: the caller holds
/// a free slot (and a drain pass) for each.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim<'a> {
    pub(crate) worker: &'a str,
    pub(crate) slots: usize,
}
