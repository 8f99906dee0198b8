//! The run core's decisions, as pure functions of state: what a tick does (paused, forbid,
//! allow, replace, queue), how a run's end is recorded, and whether a failed run gets another
//! attempt. No SQL, no tokio: the store and the executor record what these decide.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use lamplighter_config::{NotifyOn, NotifyRule, Overlap, RetryPolicy};

use crate::intake::{Claim, Dispatch, Handed, NewRun, TickOutcome};
use crate::run::{FollowUp, Outcome, RunStatus};

/// What is known about a job when one of its ticks fires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TickFacts<'a> {
    pub(crate) paused: bool,
    /// The job's runs still going, oldest first.
    pub(crate) active: &'a [String],
    pub(crate) overlap: Overlap,
}

/// What a tick's run does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TickDecision {
    /// Queued, and handed to an executor when due.
    Start,
    /// Queued, and held until the job's earlier runs end (`overlap: queue`).
    Hold,
    /// Recorded `skipped` with the reason.
    Skip(String),
    /// Queued; these runs are cancelled in its favour (`overlap: replace`).
    Replace(Vec<String>),
}

pub(crate) fn decide_tick(f: &TickFacts<'_>) -> TickDecision {
    if f.paused {
        return TickDecision::Skip("job is paused".into());
    }
    let Some(oldest) = f.active.first() else {
        return TickDecision::Start;
    };
    match f.overlap {
        Overlap::Forbid => TickDecision::Skip(format!("previous run {oldest} is still going (overlap: forbid)")),
        Overlap::Allow => TickDecision::Start,
        Overlap::Replace => TickDecision::Replace(f.active.to_vec()),
        Overlap::Queue => TickDecision::Hold,
    }
}

/// Why a running run was stopped from outside its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StopReason {
    Cancelled(String),
    Shutdown,
    /// The job's `timeout`.
    TimedOut(std::time::Duration),
    /// The worker could not renew its lease for this long and fenced itself.
    Fenced(std::time::Duration),
}

/// The times of a lease on a shared database, as fractions of `worker.lease` (L).
///
/// A worker renews every `renew_every` (L/4), and a failed renewal is tried again every
/// `retry_every`. If no renewal has gone through for `fence_after` (2L/3, counted on the worker's
/// own monotonic clock from when the last successful renewal was *sent*, which is no later than
/// the moment the server measured the lease from), it stops every run it holds. Others take the
/// runs over only once the server's clock passes the lease's end plus `margin` (L/3). So the
/// fenced worker's runs have stopped before anyone else starts them as long as
/// `2L/3 + stop time < 4L/3 × (1 − drift)`: with a clock rate drift of up to 1 %, stopping may
/// take up to 0.65 L (19 s at the default 30 s; a killed process group takes milliseconds). The
/// fence does not rest on timing alone: every write for a run is refused by the database once
/// the lease it was claimed under ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fencing {
    pub(crate) renew_every: std::time::Duration,
    pub(crate) fence_after: std::time::Duration,
    pub(crate) margin: std::time::Duration,
    /// How soon a failed renewal is tried again.
    pub(crate) retry_every: std::time::Duration,
}

pub(crate) fn fencing(lease: std::time::Duration) -> Fencing {
    Fencing {
        renew_every: lease / 4,
        fence_after: lease * 2 / 3,
        margin: lease / 3,
        retry_every: (lease / 10).clamp(std::time::Duration::from_millis(100), std::time::Duration::from_secs(1)),
    }
}

/// A run's end, ready to record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settled {
    pub(crate) status: RunStatus,
    /// What ended it.
    pub(crate) cause: EndCause,
    pub(crate) output: Option<serde_json::Value>,
    pub(crate) error: Option<String>,
    /// Another attempt could succeed (the retry policy decides whether there is one).
    pub(crate) retry: bool,
    /// A waiting run is resumed at this instant if nobody decided before.
    pub(crate) wait_until: Option<DateTime<Utc>>,
    /// A run queued again to wait for a workflow step's limits: the pools it waits for.
    pub(crate) pools: Option<Vec<crate::limits::Pool>>,
}

/// What ended a run, typed (never read back from its error's text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndCause {
    /// Its target's own outcome.
    Outcome,
    /// A stop from outside its target ([`StopReason`]).
    Stopped,
    /// Its target panicked: the panic became this run's end.
    Panicked,
    /// Its target returned no outcome.
    NoOutcome,
}

/// The end of a run whose target panicked with `message`: a failure, not retried (the same
/// input would panic again).
pub(crate) fn panicked(message: &str) -> Settled {
    Settled {
        status: RunStatus::Failed,
        cause: EndCause::Panicked,
        output: None,
        error: Some(format!("the run panicked: {message}")),
        retry: false,
        wait_until: None,
        pools: None,
    }
}

/// Combines the target's outcome (none when it was stopped before it ended) with the reason
/// it was stopped. A stop wins over a late outcome: the run ended because it was stopped.
pub(crate) fn settle(outcome: Option<Outcome>, stop: Option<StopReason>) -> Settled {
    let cause = match (&stop, &outcome) {
        (Some(_), _) => EndCause::Stopped,
        (None, Some(_)) => EndCause::Outcome,
        (None, None) => EndCause::NoOutcome,
    };
    let ended =
        |status, error: String, retry| Settled { status, cause, output: None, error: Some(error), retry, wait_until: None, pools: None };
    match (stop, outcome) {
        (Some(StopReason::Shutdown), _) => {
            // Retried at the next start (recovery follows interrupted runs up).
            ended(RunStatus::Interrupted, "the worker shut down before the run finished".into(), false)
        }
        (Some(StopReason::Fenced(after)), _) => ended(
            RunStatus::Interrupted,
            format!(
                "the worker could not renew its lease for {} and stopped the run, so that no other worker runs it at the same time",
                humantime::format_duration(after)
            ),
            // Followed up by recovery, here or by the worker that takes it over.
            false,
        ),
        (Some(StopReason::Cancelled(why)), _) => ended(RunStatus::Cancelled, why, false),
        (Some(StopReason::TimedOut(t)), _) => {
            ended(RunStatus::TimedOut, format!("timed out after {}", humantime::format_duration(t)), true)
        }
        (None, Some(Outcome::Succeeded { output })) => {
            Settled { status: RunStatus::Succeeded, cause, output: Some(output), error: None, retry: false, wait_until: None, pools: None }
        }
        (None, Some(Outcome::Waiting { until })) => {
            Settled { status: RunStatus::WaitingApproval, cause, output: None, error: None, retry: false, wait_until: until, pools: None }
        }
        (None, Some(Outcome::WaitingForLimits { pools })) => {
            Settled { status: RunStatus::Queued, cause, output: None, error: None, retry: false, wait_until: None, pools: Some(pools) }
        }
        (None, Some(Outcome::Failed { error, retry })) => ended(RunStatus::Failed, error, retry),
        (None, Some(Outcome::TimedOut { error })) => ended(RunStatus::TimedOut, error, true),
        (None, None) => ended(RunStatus::Failed, "the run ended without an outcome".into(), false),
    }
}

/// When attempt `attempt + 1` is due, if the policy gives the run one. `policy` is `None` when
/// the job is no longer defined: a removed job is not retried.
pub(crate) fn next_attempt(attempt: u32, policy: Option<&RetryPolicy>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let policy = policy?;
    (attempt <= policy.max).then(|| now + chrono::Duration::from_std(policy.delay(attempt)).unwrap_or_default())
}

/// How a claimed run's end is recorded when a cancel was asked for while it ran: a success
/// stands (its work is done, its effects are real); any other end — a failure, a timeout, an
/// interruption, a wait for a decision — becomes the cancel (with the cancel's reason as its
/// error, and no wait). The stores render this as SQL (`store::CANCEL_WINS`), so that one
/// statement decides it for a batch of ends.
pub(crate) fn end_with_cancel(asked: RunStatus, cancel_requested: bool) -> RunStatus {
    if cancel_requested && asked != RunStatus::Succeeded { RunStatus::Cancelled } else { asked }
}

/// Which waiting step a decision is about: the one named, or the only one when none is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StepChoice<'a> {
    Step(&'a str),
    /// The step named is not one the run waits on.
    NotWaiting,
    /// No step named, and the run waits on several (or none).
    Which,
}

/// `open`: the run's waiting steps.
pub(crate) fn choose_step<'a>(named: Option<&'a str>, open: &'a [String]) -> StepChoice<'a> {
    match (named, open) {
        (Some(s), _) if open.iter().any(|o| o == s) => StepChoice::Step(s),
        (Some(_), _) => StepChoice::NotWaiting,
        (None, [only]) => StepChoice::Step(only),
        (None, _) => StepChoice::Which,
    }
}

/// What a decision records on its step: the output (`approved`, `comment`, `decided_by`,
/// `decided_at`) and, for a rejection, the error.
pub(crate) fn decision_record(
    approve: bool,
    comment: Option<&str>,
    decided_by: &str,
    now: DateTime<Utc>,
) -> (serde_json::Value, Option<String>) {
    let output = serde_json::json!({
        "approved": approve,
        "comment": comment,
        "decided_by": decided_by,
        "decided_at": now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    });
    let error = (!approve).then(|| match comment {
        Some(c) => format!("rejected by {decided_by}: {c}"),
        None => format!("rejected by {decided_by}"),
    });
    (output, error)
}

/// What a recorded decision does to its run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AfterDecision {
    /// Other steps still wait: the run keeps waiting.
    Wait,
    /// Queued again, to go on.
    Resume,
    /// Failed, with this error; its other waiting steps are cancelled.
    Fail(String),
}

/// After a decision on `step` (one of `open_steps` waiting steps): an approval resumes the
/// run once no other step waits; so does a rejection of a wait that asked "may this go on?"
/// (`resumes_on_reject`: an agent's tool call, whose run acts on the rejection itself); any
/// other rejection fails the run, naming the step and the decision's `error`.
pub(crate) fn after_decision(approve: bool, resumes_on_reject: bool, open_steps: usize, step: &str, error: Option<&str>) -> AfterDecision {
    if approve || resumes_on_reject {
        if open_steps > 1 { AfterDecision::Wait } else { AfterDecision::Resume }
    } else {
        AfterDecision::Fail(format!("step \"{step}\" was {}", error.unwrap_or("rejected")))
    }
}

/// How a run's final outcome counts for its job: the streak of failures notifications and
/// alerts go by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutcomeKind {
    Success,
    /// Failed, timed out or interrupted, with no attempt to follow.
    Failure,
    /// Cancelled or skipped: a person's or the schedule's choice, which neither breaks nor
    /// extends a streak.
    Neutral,
}

/// How long after its run ended an end is written, as a rule: its write may wait for more ends
/// (up to 100 ms on PostgreSQL) and for ticks being fired (up to 500 ms), and then goes.
pub(crate) const ENDS_RECORDED_WITHIN: chrono::TimeDelta = chrono::TimeDelta::seconds(1);

/// How long a failed attempt may wait for its retry to be recorded before its failure is taken
/// as final (the worker that would have scheduled the retry stopped in between).
pub(crate) const RETRY_RECORDED_WITHIN: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// What an ended run is, for the streak and the notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finality {
    /// Not known yet: a failure whose retry may still be recorded (look again later).
    Undecided,
    /// An attempt follows: this one is not the run's outcome.
    Retried,
    /// The run's outcome.
    Outcome(OutcomeKind),
}

/// What a run that ended is, by whether another attempt follows it. A failure that ended before the job's last success (noticed
/// late: its retry was waited for) is superseded: it counts for nothing.
pub(crate) fn finality(
    status: RunStatus,
    follow_up: &FollowUp,
    finished_at: DateTime<Utc>,
    last_success: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Finality {
    let kind = match status {
        RunStatus::Succeeded => OutcomeKind::Success,
        RunStatus::Cancelled | RunStatus::Skipped => OutcomeKind::Neutral,
        RunStatus::Failed | RunStatus::TimedOut | RunStatus::Interrupted => OutcomeKind::Failure,
        RunStatus::Queued | RunStatus::Running | RunStatus::WaitingApproval => return Finality::Undecided,
    };
    if kind != OutcomeKind::Failure {
        return Finality::Outcome(kind);
    }
    let superseded = last_success.is_some_and(|s| s >= finished_at);
    let kind = if superseded { OutcomeKind::Neutral } else { kind };
    match follow_up {
        FollowUp::Next(_) => Finality::Retried,
        FollowUp::None => Finality::Outcome(kind),
        FollowUp::Undecided if now - finished_at >= RETRY_RECORDED_WITHIN => Finality::Outcome(kind),
        FollowUp::Undecided => Finality::Undecided,
    }
}

/// Whether an upstream run's outcome counts for a job that runs after it with `on`. A skipped
/// run never ran, and counts for nothing.
pub(crate) fn after_counts(on: lamplighter_config::AfterOn, status: RunStatus, kind: OutcomeKind) -> bool {
    use lamplighter_config::AfterOn;
    match on {
        AfterOn::Success => status == RunStatus::Succeeded,
        AfterOn::Failure => kind == OutcomeKind::Failure,
        AfterOn::Finished => status != RunStatus::Skipped,
    }
}

/// An upstream outcome a job running `after` has not used yet.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PendingOutcome {
    pub(crate) upstream: String,
    pub(crate) run_id: String,
    pub(crate) status: RunStatus,
    pub(crate) output: Option<serde_json::Value>,
    pub(crate) finished_at: DateTime<Utc>,
}

/// What the pending outcomes of a job's upstreams do at `now` ([`fan_in`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Fanin {
    /// One run starts for each of these sets (by index): the oldest outcome of each upstream
    /// job still in its window, then the next oldest, as long as every upstream has one.
    pub(crate) fire: Vec<Vec<usize>>,
    /// These waited longer than `within` for the others and are dropped (nothing fires for
    /// them).
    pub(crate) expired: Vec<usize>,
}

/// Fan-in: a job that runs after several jobs starts once each of them has a new qualifying
/// outcome, and each run uses one outcome of each (the oldest first): one run per set, so
/// every outcome is used exactly once — with one upstream job, one run per outcome, whenever
/// it is noticed. With `within`, the outcomes of a set end at most that far apart: an oldest
/// outcome the others' cannot reach is dropped, as is one still alone once `within` and
/// [`ENDS_RECORDED_WITHIN`] have passed since it ended (an outcome still to come ended later,
/// or is recorded by then: a run's `finished_at` is its own end, which its write follows).
/// Outcomes of a job no longer named are dropped.
pub(crate) fn fan_in(after: &lamplighter_config::After, pending: &[PendingOutcome], now: DateTime<Utc>) -> Fanin {
    use std::collections::VecDeque;
    let mut decision =
        Fanin { fire: Vec::new(), expired: (0..pending.len()).filter(|&i| !after.jobs.contains(&pending[i].upstream)).collect() };
    if after.jobs.is_empty() {
        return decision;
    }
    // A window only pairs outcomes: with one upstream job there is nothing to wait for.
    let window = after.within.filter(|_| after.jobs.len() > 1).map(|w| chrono::Duration::from_std(w).unwrap_or(chrono::TimeDelta::MAX));
    // `pending` is oldest first: each upstream job's queue of outcomes, in order.
    let mut queues: Vec<VecDeque<usize>> =
        after.jobs.iter().map(|job| (0..pending.len()).filter(|&i| pending[i].upstream == *job).collect()).collect();
    let ended = |i: usize| pending[i].finished_at;
    while queues.iter().all(|q| !q.is_empty()) {
        let heads: Vec<usize> = queues.iter().filter_map(|q| q.front().copied()).collect();
        let oldest = heads.iter().copied().min_by_key(|&i| (ended(i), i)).unwrap_or(heads[0]);
        let newest = heads.iter().copied().map(ended).max().unwrap_or(ended(oldest));
        match window {
            // The newest head is the earliest its job can offer: the oldest cannot be paired.
            Some(w) if newest - ended(oldest) > w => {
                decision.expired.push(oldest);
                queues.iter_mut().for_each(|q| q.retain(|&i| i != oldest));
            }
            _ => decision.fire.push(queues.iter_mut().filter_map(VecDeque::pop_front).collect()),
        }
    }
    if let Some(w) = window {
        // Alone past the window, and past the time an end within it takes to be written: what
        // is still to come ends later, too late for it.
        for q in &queues {
            decision.expired.extend(q.iter().copied().filter(|&i| now - ended(i) > w + ENDS_RECORDED_WITHIN));
        }
    }
    decision.expired.sort_unstable();
    decision
}

/// The downstream run's `upstream` input: each upstream job's outcome in the set (the latest,
/// were there several).
pub(crate) fn upstream_input(used: &[&PendingOutcome]) -> serde_json::Value {
    let mut latest: BTreeMap<&str, &PendingOutcome> = BTreeMap::new();
    for p in used {
        let newer = latest.get(p.upstream.as_str()).is_none_or(|l| (p.finished_at, &p.run_id) > (l.finished_at, &l.run_id));
        if newer {
            latest.insert(&p.upstream, p);
        }
    }
    serde_json::Value::Object(
        latest
            .into_iter()
            .map(|(job, p)| {
                let outcome = serde_json::json!({"run_id": p.run_id, "status": p.status.as_str(), "output": p.output});
                (job.to_owned(), outcome)
            })
            .collect(),
    )
}

/// A job's input with `upstream` added: into an object, or beside a value that is not one
/// (`{"input": value, "upstream": …}`).
pub(crate) fn with_upstream(input: Option<serde_json::Value>, upstream: serde_json::Value) -> serde_json::Value {
    match input {
        None | Some(serde_json::Value::Null) => serde_json::json!({ "upstream": upstream }),
        Some(serde_json::Value::Object(mut map)) => {
            map.insert("upstream".into(), upstream);
            serde_json::Value::Object(map)
        }
        Some(other) => serde_json::json!({ "input": other, "upstream": upstream }),
    }
}

/// What a final outcome that ended at `ended` (Unix ms) does, given its job's failure streak
/// and `notify:` rules: moves the streak ([`Streak`]) and answers the rules that fire (by
/// index, with the event each stands for) and the count the event reports. `failure` fires
/// from the Nth failure in a row on; `recovery` on a success that ends a streak that reached
/// at least N (not on one that ended before failures already counted, which stand after it);
/// `success` on every success.
pub(crate) fn notify_on_outcome(kind: OutcomeKind, ended: i64, streak: &mut Streak, rules: &[NotifyRule]) -> Fired {
    let peak = streak.peak;
    match kind {
        OutcomeKind::Success => streak.succeeded(ended),
        OutcomeKind::Failure => streak.failed(ended),
        OutcomeKind::Neutral => return Fired::default(),
    }
    let after = streak.count;
    let rules = rules
        .iter()
        .enumerate()
        .filter(|(_, r)| match (kind, r.on) {
            (OutcomeKind::Failure, NotifyOn::Failure) => after >= r.after_consecutive,
            (OutcomeKind::Success, NotifyOn::Success) => true,
            (OutcomeKind::Success, NotifyOn::Recovery) => after == 0 && peak >= r.after_consecutive,
            _ => false,
        })
        .map(|(i, r)| (i, r.on))
        .collect();
    // A failure reports the streak it is part of; a success that ends one, the streak it
    // ended (as high as it went); one that leaves failures standing, those.
    let failures = match kind {
        OutcomeKind::Success if after == 0 => peak,
        _ => after,
    };
    Fired { rules, failures }
}

/// The rules an outcome fires ([`notify_on_outcome`]) and the failures in a row its events
/// report (`consecutive_failures`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Fired {
    pub(crate) rules: Vec<(usize, NotifyOn)>,
    pub(crate) failures: u32,
}

/// A job's failure streak as the notice pass keeps it: how many failures in a row, and when
/// the last of them ended (those within [`ENDS_RECORDED_WITHIN`] of the latest, Unix ms). A
/// run's recorded end is its own, and its write may come up to that long after it: a success
/// written after failures already counted may have ended before some of them, and takes back
/// only the failures it came before. The streak's peak is kept until it ends, so that the
/// success that ends it answers an alert sent at a count a late success took back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Streak {
    pub(crate) count: u32,
    /// `None`: a state written before the ends were kept; a success then ends the streak.
    pub(crate) ends: Option<Vec<i64>>,
    /// The highest count since the streak was last 0 (never below `count`).
    pub(crate) peak: u32,
}

impl Streak {
    /// A failure that ended at `at` extends the streak.
    pub(crate) fn failed(&mut self, at: i64) {
        self.count = self.count.saturating_add(1);
        self.peak = self.peak.max(self.count);
        let ends = self.ends.get_or_insert_with(Vec::new);
        ends.push(at);
        let latest = ends.iter().copied().max().unwrap_or(at);
        ends.retain(|&e| e >= latest - ENDS_RECORDED_WITHIN.num_milliseconds());
    }

    /// A success that ended at `at` ends the streak, but for the failures counted that ended
    /// after it. Failures kept ended within the bound of the latest; those before them ended
    /// before a success inside the bound. A success older than every kept end, past the
    /// bound, cannot tell which came first: the streak stands.
    pub(crate) fn succeeded(&mut self, at: i64) {
        let Some(ends) = self.ends.as_mut() else {
            *self = Self { count: 0, ends: Some(Vec::new()), peak: 0 };
            return;
        };
        if ends.iter().max().is_none_or(|&latest| at >= latest - ENDS_RECORDED_WITHIN.num_milliseconds()) {
            ends.retain(|&e| e > at);
            // Never more than it was: a count and ends that disagree (a state an earlier
            // version wrote) are taken the lower.
            self.count = self.count.min(ends.len() as u32);
        }
        if self.count == 0 {
            self.peak = 0;
        }
    }

    /// The kept ends as stored (`ll_job_state.streak_ends`, a JSON array).
    pub(crate) fn stored_ends(&self) -> Option<String> {
        self.ends.as_ref().and_then(|e| serde_json::to_string(e).ok())
    }

    /// A streak read back; damaged ends read as not kept, a peak not kept (a state written
    /// before it was) as the count. A count of 0 has no peak: an earlier version that ended
    /// the streak left the peak behind, and it would answer an alert nobody was sent.
    pub(crate) fn from_stored(count: u32, ends: Option<&str>, peak: Option<u32>) -> Self {
        let peak = if count == 0 { 0 } else { peak.unwrap_or(count).max(count) };
        Self { count, ends: ends.and_then(|e| serde_json::from_str(e).ok()), peak }
    }
}

/// Whether a run's end is also its outcome's notice (the end's `noticed`, written with it): a
/// success of a configured job (`rules`: its rules; `None` for runs that are no job's) that no
/// rule tells of a success (`success`, `recovery`) and that no job runs after. Noticing it
/// could only end its job's failure streak and move its last success, which the end's own
/// write does; every other outcome is the notice pass's to decide.
pub(crate) fn noticed_at_end(status: RunStatus, rules: Option<&[NotifyRule]>, has_downstream: bool) -> bool {
    status == RunStatus::Succeeded
        && !has_downstream
        && rules.is_some_and(|rules| rules.iter().all(|r| !matches!(r.on, NotifyOn::Success | NotifyOn::Recovery)))
}

/// The rules a wait for a decision fires: `budget_asked` for an agent asking for more budget
/// (its step is `agent:budget-N`), `approval_waiting` for any other.
pub(crate) fn notify_on_wait(step: &str, rules: &[NotifyRule]) -> Vec<(usize, NotifyOn)> {
    let last = step.rsplit('/').next().unwrap_or(step);
    let on = if last.starts_with("agent:budget-") { NotifyOn::BudgetAsked } else { NotifyOn::ApprovalWaiting };
    rules.iter().enumerate().filter(|(_, r)| r.on == on).map(|(i, _)| (i, on)).collect()
}

/// A wake's tick decisions, for the store to write in its transaction.
pub(crate) struct TickPlan<'a> {
    /// Per tick, in order: `None` for a tick another caller recorded first.
    pub(crate) out: Vec<Option<TickOutcome>>,
    /// The runs to insert, with how each is handed over.
    pub(crate) rows: Vec<(String, NewRun, Dispatch<'a>)>,
    /// Runs that go to the queue.
    pub(crate) pushed: Vec<String>,
    /// Each job's latest tick, by job (in job order: the order writers lock them in).
    pub(crate) last_ticks: BTreeMap<String, i64>,
}

/// Decides the ticks of one wake (`ids[i]` is tick `i`'s new run id; `fresh`: the ids whose
/// tick key this caller recorded), with the pause state and active runs the store read in its
/// transaction; the first `claim.slots` runs that can start now are claimed for
/// `claim.worker`. The same for every backend: the stores differ only in how they read the
/// facts and write the plan.
pub(crate) fn plan_ticks<'a>(
    ticks: Vec<(NewRun, Overlap)>,
    ids: Vec<String>,
    fresh: &HashSet<String>,
    paused: &HashSet<String>,
    mut active: HashMap<String, Vec<String>>,
    claim: Claim<'a>,
    now: DateTime<Utc>,
) -> TickPlan<'a> {
    let mut handoff = claim.slots;
    // Decide tick by tick, in order: a run this batch queued is active for the job's
    // later ticks in it (caught-up ticks queue behind each other).
    let mut out = Vec::with_capacity(ticks.len());
    let mut rows: Vec<(String, NewRun, Dispatch<'a>)> = Vec::with_capacity(out.capacity());
    let mut pushed = Vec::new();
    let mut last_ticks: BTreeMap<String, i64> = BTreeMap::new();
    for ((mut run, policy), id) in ticks.into_iter().zip(ids) {
        if !fresh.contains(&id) {
            out.push(None);
            continue;
        }
        let tick = run.scheduled_at.unwrap_or(run.due_at).timestamp_millis();
        let job = run.owner.to_string();
        let job_active = active.entry(job.clone()).or_default();
        let decision = decide_tick(&TickFacts { paused: paused.contains(&job), active: job_active, overlap: policy });
        let mut outcome = TickOutcome { run_id: id.clone(), status: run.status, replaced: Vec::new(), handed: None, pushed: false };
        let mut hold = false;
        match decision {
            TickDecision::Start => job_active.push(id.clone()),
            TickDecision::Hold => {
                hold = true;
                run.in_line = false;
                job_active.push(id.clone());
            }
            TickDecision::Skip(why) => {
                run.status = RunStatus::Skipped;
                run.error = Some(why);
            }
            TickDecision::Replace(old) => {
                outcome.replaced = old;
                *job_active = vec![id.clone()];
            }
        }
        let mut dispatched = Dispatch::No;
        // A run that takes a limit's slot is admitted by the hand-over, in line, which follows
        // in the same pass.
        let limited = run.snapshot.as_ref().is_some_and(|s| !s.limits.is_empty());
        if run.status == RunStatus::Queued && !hold && !limited && run.due_at <= now {
            if handoff > 0 {
                // Claimed here, in the tick's transaction: no second round trip before
                // the run starts.
                handoff -= 1;
                dispatched = Dispatch::Claimed(claim.worker);
                run.status = RunStatus::Running;
                let mut handed = run.to_run(&id, now);
                handed.started_at = Some(now);
                handed.worker = Some(claim.worker.to_string());
                outcome.handed = Some(Handed { run: handed, snapshot: run.snapshot.clone(), resumed: false });
            } else {
                dispatched = Dispatch::Queued;
                outcome.pushed = true;
                pushed.push(id.clone());
            }
        }
        outcome.status = run.status;
        let lt = last_ticks.entry(job).or_insert(tick);
        *lt = (*lt).max(tick);
        rows.push((id, run, dispatched));
        out.push(Some(outcome));
    }
    TickPlan { out, rows, pushed, last_ticks }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a success whose notice could change nothing but its job's state is noticed at its
    /// end: a failure, a rule on success or recovery, a job run after it, or no job keeps it
    /// for the notice pass.
    #[test]
    fn a_success_that_tells_nobody_is_noticed_at_its_end() {
        let rule = |on| NotifyRule { on, after_consecutive: 1, to: lamplighter_config::NotifyTarget::Workflow("page".into()) };
        let failure = [rule(NotifyOn::Failure), rule(NotifyOn::ApprovalWaiting), rule(NotifyOn::BudgetAsked)];
        let cases: &[(RunStatus, Option<&[NotifyRule]>, bool, bool)] = &[
            (RunStatus::Succeeded, Some(&[]), false, true),
            (RunStatus::Succeeded, Some(&failure), false, true),
            (RunStatus::Succeeded, Some(&[rule(NotifyOn::Success)]), false, false),
            (RunStatus::Succeeded, Some(&[rule(NotifyOn::Failure), rule(NotifyOn::Recovery)]), false, false),
            (RunStatus::Succeeded, Some(&[]), true, false),
            (RunStatus::Succeeded, None, false, false),
            (RunStatus::Failed, Some(&[]), false, false),
            (RunStatus::Cancelled, Some(&[]), false, false),
            (RunStatus::Skipped, Some(&[]), false, false),
            (RunStatus::WaitingApproval, Some(&[]), false, false),
        ];
        for &(status, rules, downstream, expected) in cases {
            assert_eq!(noticed_at_end(status, rules, downstream), expected, "{status:?} {rules:?} downstream {downstream}");
        }
    }

    /// A success recorded after failures already counted leaves in the streak only the failures
    /// that ended after it; within the recording bound it can tell, past it the streak stands.
    #[test]
    fn a_late_success_leaves_only_the_failures_that_ended_after_it() {
        let streak = |ends: &[i64]| {
            let mut s = Streak::default();
            for &e in ends {
                s.failed(e);
            }
            s
        };
        // (failures counted, the late success's end) → the streak after it.
        let cases: &[(&[i64], i64, u32)] = &[
            (&[9_000, 10_000], 9_900, 1),
            (&[9_000, 10_000], 10_001, 0),
            (&[10_000, 9_950], 9_900, 2),
            (&[1_000, 2_000, 10_000], 9_500, 1),
            // At the bound: every failure kept ended after it, every other before it.
            (&[8_500, 10_000], 9_000, 1),
            // Past the bound of the latest: which came first is not known.
            (&[9_000, 10_000], 8_999, 2),
            (&[9_000, 10_000], 8_000, 2),
            (&[], 5_000, 0),
        ];
        for &(ends, at, expected) in cases {
            let mut s = streak(ends);
            s.succeeded(at);
            assert_eq!(s.count, expected, "failures {ends:?}, success at {at}");
            assert!(s.ends.iter().flatten().all(|&e| e > at || expected == ends.len() as u32), "{ends:?} at {at}: {s:?}");
        }
        // Ends an earlier version left behind a count it reset: a success never raises it.
        let mut s = Streak::from_stored(0, Some("[10500]"), None);
        s.succeeded(10_200);
        assert_eq!(s.count, 0);
        // Interleaved on two workers, each success written after the next failure: the
        // streak stays one, it never grows.
        let mut s = Streak::default();
        for i in 0..5 {
            s.failed(i * 1_000 + 50);
            s.succeeded(i * 1_000);
            assert_eq!(s.count, 1);
        }
        // Kept as stored; a state from before the ends were kept ends on any success.
        assert_eq!(Streak::from_stored(2, s.stored_ends().as_deref(), Some(2)).ends, s.ends);
        let mut old = Streak::from_stored(3, None, None);
        assert_eq!(old.peak, 3, "a peak not kept is the count");
        old.succeeded(1);
        assert_eq!((old.count, old.peak), (0, 0));
        assert_eq!(Streak::from_stored(3, Some("garbage"), Some(1)).ends, None);
        assert_eq!(Streak::from_stored(3, None, Some(1)).peak, 3, "never below the count");
        // A streak an earlier version ended (it writes no peak) and that starts again: the peak
        // it left behind answers nothing.
        let mut s = Streak::from_stored(0, Some("[]"), Some(3));
        s.failed(20_000);
        assert_eq!((s.count, s.peak), (1, 1));
    }

    /// An alert sent at the Nth failure, which a late success then took back (by the runs' own
    /// ends the streak never reached N), is answered by the success that ends the streak: the
    /// peak is kept until then, and the recovery reports it.
    #[test]
    fn the_success_that_ends_a_streak_answers_an_alert_a_late_success_took_back() {
        use NotifyOn as N;
        let rules = [rule(N::Failure, 3), rule(N::Recovery, 3), rule(N::Success, 1)];
        let mut s = Streak::default();
        let fired = |s: &mut Streak, kind, at| notify_on_outcome(kind, at, s, &rules);
        assert!(fired(&mut s, OutcomeKind::Failure, 10_000).rules.is_empty());
        assert!(fired(&mut s, OutcomeKind::Failure, 10_400).rules.is_empty());
        assert_eq!(fired(&mut s, OutcomeKind::Failure, 10_800), Fired { rules: vec![(0, N::Failure)], failures: 3 });
        // Ended between the second and the third, written after the third: no recovery, the
        // third failure stands, and the success reports it.
        assert_eq!(fired(&mut s, OutcomeKind::Success, 10_600), Fired { rules: vec![(2, N::Success)], failures: 1 });
        assert_eq!((s.count, s.peak), (1, 3));
        // Kept as stored.
        let mut s = Streak::from_stored(s.count, s.stored_ends().as_deref(), Some(s.peak));
        assert!(fired(&mut s, OutcomeKind::Failure, 11_000).rules.is_empty(), "two in a row by their ends");
        assert_eq!(
            fired(&mut s, OutcomeKind::Success, 12_000),
            Fired { rules: vec![(1, N::Recovery), (2, N::Success)], failures: 3 },
            "the alert sent at three is answered"
        );
        assert_eq!((s.count, s.peak), (0, 0));
        // A streak that ends below the alert's count never sent it: no recovery.
        fired(&mut s, OutcomeKind::Failure, 13_000);
        fired(&mut s, OutcomeKind::Failure, 14_000);
        assert_eq!(fired(&mut s, OutcomeKind::Success, 15_000), Fired { rules: vec![(2, N::Success)], failures: 2 });
    }

    fn pending(upstream: &str, run: &str, ended: i64) -> PendingOutcome {
        PendingOutcome {
            upstream: upstream.into(),
            run_id: run.into(),
            status: RunStatus::Succeeded,
            output: None,
            finished_at: DateTime::from_timestamp(ended, 0).expect("instant"),
        }
    }

    /// Fan-in by table: a run once each upstream has an outcome within the window of `now`,
    /// using every pending one; outcomes older than the window (or of a job no longer named)
    /// are dropped.
    #[test]
    fn fan_in_waits_for_every_upstream_within_the_window() {
        use lamplighter_config::{After, AfterOn};
        let after = After { jobs: vec!["a".into(), "b".into()], on: AfterOn::Success, within: Some(std::time::Duration::from_secs(60)) };
        let at = |s: i64| DateTime::from_timestamp(s, 0).expect("instant");
        // (pending, now, sets fired, expired)
        type Case = (Vec<PendingOutcome>, i64, Vec<Vec<usize>>, Vec<usize>);
        let cases: Vec<Case> = vec![
            (vec![pending("a", "a1", 0)], 10, vec![], vec![]),
            (vec![pending("a", "a1", 0), pending("b", "b1", 30)], 31, vec![vec![0, 1]], vec![]),
            (vec![pending("a", "a1", 0), pending("a", "a2", 20), pending("b", "b1", 30)], 31, vec![vec![0, 2]], vec![]),
            (
                vec![pending("a", "a1", 0), pending("b", "b1", 10), pending("a", "a2", 20), pending("b", "b2", 30)],
                31,
                vec![vec![0, 1], vec![2, 3]],
                vec![],
            ),
            (vec![pending("a", "a1", 0), pending("b", "b1", 90)], 91, vec![], vec![0]),
            (vec![pending("a", "a1", 0), pending("a", "a2", 50), pending("b", "b1", 90)], 91, vec![vec![1, 2]], vec![0]),
            (vec![pending("gone", "g1", 0), pending("a", "a1", 0)], 1, vec![], vec![0]),
            // Noticed late, still 30 s apart: a set.
            (vec![pending("a", "a1", 0), pending("b", "b1", 30)], 500, vec![vec![0, 1]], vec![]),
            // Alone just past the window: kept while an end within it may still be written
            // (ENDS_RECORDED_WITHIN), dropped after.
            (vec![pending("a", "a1", 0)], 61, vec![], vec![]),
            (vec![pending("a", "a1", 0)], 62, vec![], vec![0]),
        ];
        for (pending, now, fire, expired) in cases {
            assert_eq!(fan_in(&after, &pending, at(now)), Fanin { fire: fire.clone(), expired: expired.clone() }, "{pending:?} at {now}");
        }
        let forever = After { within: None, ..after };
        assert_eq!(fan_in(&forever, &[pending("a", "a1", 0), pending("b", "b1", 1_000_000)], at(1_000_001)).fire, vec![vec![0, 1]]);
        // One upstream job: a run per outcome, however many a pass notices at once, however late.
        let one = After { jobs: vec!["a".into()], on: AfterOn::Success, within: Some(std::time::Duration::from_secs(1)) };
        let three = [pending("a", "a1", 0), pending("a", "a2", 1), pending("a", "a3", 2)];
        assert_eq!(fan_in(&one, &three, at(3)).fire, vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn which_outcomes_count_and_what_the_downstream_input_holds() {
        use lamplighter_config::AfterOn::*;
        assert!(after_counts(Success, RunStatus::Succeeded, OutcomeKind::Success));
        assert!(!after_counts(Success, RunStatus::Failed, OutcomeKind::Failure));
        assert!(after_counts(Failure, RunStatus::TimedOut, OutcomeKind::Failure));
        assert!(!after_counts(Failure, RunStatus::Failed, OutcomeKind::Neutral), "a failure a later success superseded");
        assert!(after_counts(Finished, RunStatus::Cancelled, OutcomeKind::Neutral));
        assert!(!after_counts(Finished, RunStatus::Skipped, OutcomeKind::Neutral), "a skipped tick never ran");
        let (a1, a2, b1) = (pending("a", "a1", 0), pending("a", "a2", 5), pending("b", "b1", 3));
        let upstream = upstream_input(&[&a2, &b1, &a1]);
        assert_eq!(upstream["a"]["run_id"], "a2", "the latest of each");
        assert_eq!(with_upstream(None, upstream.clone()), serde_json::json!({"upstream": upstream}));
        assert_eq!(with_upstream(Some(serde_json::json!({"x": 1})), serde_json::json!(1)), serde_json::json!({"x": 1, "upstream": 1}));
        assert_eq!(with_upstream(Some(serde_json::json!("t")), serde_json::json!(1)), serde_json::json!({"input": "t", "upstream": 1}));
    }

    #[test]
    fn a_cancel_asked_for_while_a_run_ran_wins_over_every_end_but_a_success() {
        for asked in RunStatus::ALL {
            let recorded = end_with_cancel(asked, true);
            let want = if asked == RunStatus::Succeeded { RunStatus::Succeeded } else { RunStatus::Cancelled };
            assert_eq!(recorded, want, "{asked:?}");
            assert_eq!(end_with_cancel(asked, false), asked, "no cancel: {asked:?} as asked");
        }
    }

    use lamplighter_config::Backoff;

    /// One wake's ticks, decided in order: a tick another writer recorded is none of this
    /// caller's; a paused job's is skipped; `forbid` skips a tick behind one of the same wake;
    /// the first runs that can start are claimed (as many as there are slots), the rest
    /// queued; each job's last tick is its latest.
    #[test]
    fn a_wakes_ticks_are_decided_in_order_and_claimed_up_to_the_slots() {
        let t = Utc::now();
        let tick = |job: &str, s: i64| NewRun::tick(job, t + chrono::TimeDelta::seconds(s));
        let ticks = vec![
            (tick("a", -2), Overlap::Allow),
            (tick("a", -1), Overlap::Allow),
            (tick("paused", -1), Overlap::Allow),
            (tick("seen", -1), Overlap::Allow),
            (tick("f", -2), Overlap::Forbid),
            (tick("f", -1), Overlap::Forbid),
            (tick("later", 60), Overlap::Allow),
        ];
        let ids: Vec<String> = (0..ticks.len()).map(|i| format!("r{i}")).collect();
        let fresh: HashSet<String> = ids.iter().filter(|id| *id != "r3").cloned().collect();
        let paused: HashSet<String> = ["paused".to_owned()].into();
        let plan = plan_ticks(ticks, ids, &fresh, &paused, HashMap::new(), Claim { worker: "w", slots: 2 }, t);
        let out: Vec<Option<(RunStatus, bool, bool)>> =
            plan.out.iter().map(|o| o.as_ref().map(|o| (o.status, o.handed.is_some(), o.pushed))).collect();
        assert_eq!(
            out,
            [
                Some((RunStatus::Running, true, false)),
                Some((RunStatus::Running, true, false)),
                Some((RunStatus::Skipped, false, false)),
                None,
                Some((RunStatus::Queued, false, true)),
                Some((RunStatus::Skipped, false, false)),
                Some((RunStatus::Queued, false, false)),
            ],
            "claimed, claimed, paused, recorded elsewhere, queued (no slot left), forbidden, not due"
        );
        assert_eq!(plan.pushed, ["r4"]);
        assert_eq!(plan.rows.len(), 6, "a run for each tick this caller recorded");
        assert_eq!(plan.last_ticks.get("a"), Some(&(t - chrono::TimeDelta::seconds(1)).timestamp_millis()));
        assert_eq!(plan.last_ticks.get("later"), Some(&(t + chrono::TimeDelta::seconds(60)).timestamp_millis()));
    }
    use std::time::Duration;

    fn rule(on: NotifyOn, after: u32) -> NotifyRule {
        NotifyRule { on, after_consecutive: after, to: lamplighter_config::NotifyTarget::Workflow("w".into()) }
    }

    #[test]
    fn notifications_by_the_table() {
        use NotifyOn as N;
        use OutcomeKind as K;
        let rules = [rule(N::Failure, 2), rule(N::Recovery, 2), rule(N::Success, 1), rule(N::Failure, 1)];
        // (outcome, streak before) → (rules fired, streak after)
        let cases: Vec<(OutcomeKind, u32, Vec<usize>, u32)> = vec![
            (K::Failure, 0, vec![3], 1),
            (K::Failure, 1, vec![0, 3], 2),
            (K::Failure, 5, vec![0, 3], 6),
            (K::Success, 2, vec![1, 2], 0),
            (K::Success, 1, vec![2], 0),
            (K::Success, 0, vec![2], 0),
            (K::Neutral, 3, vec![], 3),
        ];
        for (kind, streak, fired, after) in cases {
            let mut s = Streak { count: streak, ends: None, peak: streak };
            let got = notify_on_outcome(kind, 0, &mut s, &rules);
            assert_eq!((got.rules.into_iter().map(|(i, _)| i).collect::<Vec<_>>(), s.count), (fired, after), "{kind:?} after {streak}");
        }
        let waits = [rule(N::ApprovalWaiting, 1), rule(N::BudgetAsked, 1)];
        assert_eq!(notify_on_wait("review", &waits), vec![(0, N::ApprovalWaiting)]);
        assert_eq!(notify_on_wait("agent:budget-2", &waits), vec![(1, N::BudgetAsked)]);
        assert_eq!(notify_on_wait("draft/agent:budget-1", &waits), vec![(1, N::BudgetAsked)]);
    }

    #[test]
    fn a_failure_is_an_outcome_once_no_attempt_follows() {
        let t = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let soon = t + chrono::TimeDelta::seconds(5);
        use Finality::*;
        assert_eq!(finality(RunStatus::Failed, &FollowUp::Undecided, t, None, soon), Undecided, "its retry may still be recorded");
        assert_eq!(finality(RunStatus::Failed, &FollowUp::Next("r2".into()), t, None, soon), Retried, "the retry's outcome counts");
        assert_eq!(finality(RunStatus::TimedOut, &FollowUp::None, t, None, soon), Outcome(OutcomeKind::Failure));
        let late = t + RETRY_RECORDED_WITHIN;
        assert_eq!(finality(RunStatus::Failed, &FollowUp::Undecided, t, None, late), Outcome(OutcomeKind::Failure));
        assert_eq!(
            finality(RunStatus::Failed, &FollowUp::Undecided, t, Some(soon), late),
            Outcome(OutcomeKind::Neutral),
            "a failure noticed after a later success is superseded"
        );
        assert_eq!(finality(RunStatus::Succeeded, &FollowUp::Undecided, t, None, soon), Outcome(OutcomeKind::Success));
        assert_eq!(finality(RunStatus::Cancelled, &FollowUp::Undecided, t, None, soon), Outcome(OutcomeKind::Neutral));
        assert_eq!(finality(RunStatus::WaitingApproval, &FollowUp::Undecided, t, None, soon), Undecided);
    }

    #[test]
    fn tick_decisions_by_the_table() {
        let none: Vec<String> = vec![];
        let one = vec!["r1".to_string()];
        let two = vec!["r1".to_string(), "r2".to_string()];
        let cases: Vec<(bool, &[String], Overlap, TickDecision)> = vec![
            (true, &none, Overlap::Allow, TickDecision::Skip("job is paused".into())),
            (true, &one, Overlap::Queue, TickDecision::Skip("job is paused".into())),
            (false, &none, Overlap::Forbid, TickDecision::Start),
            (false, &none, Overlap::Queue, TickDecision::Start),
            (false, &none, Overlap::Replace, TickDecision::Start),
            (false, &one, Overlap::Forbid, TickDecision::Skip("previous run r1 is still going (overlap: forbid)".into())),
            (false, &two, Overlap::Allow, TickDecision::Start),
            (false, &two, Overlap::Replace, TickDecision::Replace(two.clone())),
            (false, &one, Overlap::Queue, TickDecision::Hold),
        ];
        for (paused, active, overlap, want) in cases {
            assert_eq!(decide_tick(&TickFacts { paused, active, overlap }), want, "paused={paused} active={active:?} {overlap:?}");
        }
    }

    #[test]
    fn a_stop_wins_over_the_outcome_and_says_why() {
        let ok = || Some(Outcome::Succeeded { output: serde_json::json!(1) });
        assert_eq!(settle(ok(), Some(StopReason::Shutdown)).status, RunStatus::Interrupted);
        let c = settle(ok(), Some(StopReason::Cancelled("replaced by run r2".into())));
        assert_eq!((c.status, c.error.as_deref(), c.retry), (RunStatus::Cancelled, Some("replaced by run r2"), false));
        let t = settle(None, Some(StopReason::TimedOut(Duration::from_secs(90))));
        assert_eq!((t.status, t.error.as_deref(), t.retry), (RunStatus::TimedOut, Some("timed out after 1m 30s"), true));
        let s = settle(ok(), None);
        assert_eq!((s.status, s.output, s.error), (RunStatus::Succeeded, Some(serde_json::json!(1)), None));
        let f = settle(Some(Outcome::permanent("bad parameter")), None);
        assert_eq!((f.status, f.retry), (RunStatus::Failed, false));
        let f = settle(Some(Outcome::failed("connection refused")), None);
        assert_eq!((f.status, f.retry), (RunStatus::Failed, true));
        assert_eq!(settle(Some(Outcome::TimedOut { error: "x".into() }), None).status, RunStatus::TimedOut);
        assert_eq!(settle(None, None).status, RunStatus::Failed);
        let until = DateTime::from_timestamp(1_000_000, 0);
        let w = settle(Some(Outcome::Waiting { until }), None);
        assert_eq!((w.status, w.wait_until, w.retry), (RunStatus::WaitingApproval, until, false));
        assert_eq!(settle(Some(Outcome::Waiting { until }), Some(StopReason::Shutdown)).status, RunStatus::Interrupted, "a stop wins");
        let gpu = vec![crate::limits::Pool { name: "gpu".into(), key: String::new() }];
        let l = settle(Some(Outcome::WaitingForLimits { pools: gpu.clone() }), None);
        assert_eq!((l.status, l.pools, l.retry), (RunStatus::Queued, Some(gpu.clone()), false), "queued again, in line");
        let stopped = settle(Some(Outcome::WaitingForLimits { pools: gpu }), Some(StopReason::Cancelled("by hand".into())));
        assert_eq!(stopped.status, RunStatus::Cancelled, "a stop wins");
        let fenced = settle(ok(), Some(StopReason::Fenced(Duration::from_secs(15))));
        assert_eq!((fenced.status, fenced.retry), (RunStatus::Interrupted, false), "recovery follows a fenced run up, once");
        assert!(fenced.error.as_deref().is_some_and(|e| e.contains("could not renew its lease for 15s")), "{fenced:?}");
    }

    /// The guarantee `Fencing` states, checked at the default lease and at the bounds a user
    /// may set: the runs are stopped, with room for the stop and a 1 % clock rate drift, before
    /// the server's clock lets anyone else take them.
    #[test]
    fn a_fenced_worker_stops_before_anyone_may_take_over() {
        for lease in [Duration::from_secs(1), Duration::from_secs(30), Duration::from_secs(3600)] {
            let f = fencing(lease);
            assert!(f.renew_every < f.fence_after, "{lease:?}: a single late renewal does not fence");
            assert!(f.retry_every < f.fence_after - f.renew_every, "{lease:?}: a failed renewal is retried before the fence");
            // The fenced worker's last moment, on its own clock, against the takeover's on the
            // server's, running 1 % slower.
            let stop_budget = lease * 6 / 10;
            let fenced_by = f.fence_after + stop_budget;
            let takeover = (lease + f.margin).mul_f64(0.99);
            assert!(fenced_by < takeover, "{lease:?}: stopped by {fenced_by:?}, taken over from {takeover:?}");
        }
    }

    #[test]
    fn retries_follow_the_policy_and_stop_after_max() {
        let now = DateTime::from_timestamp(1_000_000, 0).unwrap();
        let p =
            RetryPolicy { max: 2, backoff: Backoff::Exponential { initial: Duration::from_secs(10), max_delay: Duration::from_secs(15) } };
        assert_eq!(next_attempt(1, Some(&p), now), Some(now + chrono::Duration::seconds(10)));
        assert_eq!(next_attempt(2, Some(&p), now), Some(now + chrono::Duration::seconds(15)), "capped at max_delay");
        assert_eq!(next_attempt(3, Some(&p), now), None, "two retries after the first attempt");
        assert_eq!(next_attempt(1, None, now), None, "a removed job is not retried");
        let none = RetryPolicy { max: 0, backoff: Backoff::Fixed(Duration::from_secs(1)) };
        assert_eq!(next_attempt(1, Some(&none), now), None);
    }

    #[test]
    fn the_step_a_decision_is_about_by_the_table() {
        let none: Vec<String> = vec![];
        let one = vec!["a".to_string()];
        let two = vec!["a".to_string(), "b".to_string()];
        let cases: Vec<(Option<&str>, &[String], StepChoice)> = vec![
            (Some("a"), &one, StepChoice::Step("a")),
            (None, &one, StepChoice::Step("a")),
            (Some("b"), &two, StepChoice::Step("b")),
            (Some("c"), &two, StepChoice::NotWaiting),
            (Some("a"), &none, StepChoice::NotWaiting),
            (None, &two, StepChoice::Which),
            (None, &none, StepChoice::Which),
        ];
        for (named, open, want) in cases {
            assert_eq!(choose_step(named, open), want, "named={named:?} open={open:?}");
        }
    }

    #[test]
    fn what_a_decision_does_to_its_run_by_the_table() {
        let fail = |s: &str| AfterDecision::Fail(s.into());
        let cases = [
            (true, false, 1, None, AfterDecision::Resume),
            (true, false, 2, None, AfterDecision::Wait),
            (false, true, 1, Some("rejected by ann"), AfterDecision::Resume),
            (false, true, 3, Some("rejected by ann"), AfterDecision::Wait),
            (false, false, 1, Some("rejected by ann: no"), fail("step \"deploy\" was rejected by ann: no")),
            (false, false, 2, Some("rejected by ann"), fail("step \"deploy\" was rejected by ann")),
            (false, false, 1, None, fail("step \"deploy\" was rejected")),
        ];
        for (approve, resumes, open, error, want) in cases {
            assert_eq!(after_decision(approve, resumes, open, "deploy", error), want, "approve={approve} resumes={resumes} open={open}");
        }
    }

    #[test]
    fn a_decision_records_who_decided_and_why() {
        let now = DateTime::from_timestamp(1_000_000, 0).unwrap();
        let (out, err) = decision_record(true, None, "ann", now);
        assert_eq!(
            out,
            serde_json::json!({"approved": true, "comment": null, "decided_by": "ann", "decided_at": "1970-01-12T13:46:40.000Z"})
        );
        assert_eq!(err, None);
        assert_eq!(decision_record(false, Some("too late"), "bob", now).1.as_deref(), Some("rejected by bob: too late"));
        assert_eq!(decision_record(false, None, "bob", now).1.as_deref(), Some("rejected by bob"));
    }
}
