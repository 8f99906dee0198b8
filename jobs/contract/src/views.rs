//! What the job service answers with: jobs, runs with their steps, approvals, decisions and
//! the worker's status.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::run::{AgentUsage, CallRecord, Notification, OutputLine, Run, RunStatus, StepRecord, StepStatus, Trigger};

/// A job as listings show it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct JobSummary {
    pub name: String,
    pub description: Option<String>,
    /// `workflow`, `agent` or `plugin`.
    pub target_type: String,
    /// e.g. `plugin shell-exec.run`.
    pub target: String,
    /// The schedule as written (`cron: 0 2 * * *`), or none for manual-only jobs.
    pub schedule: Option<String>,
    pub timezone: String,
    /// `enabled: false` in config.
    pub enabled: bool,
    /// Why the worker cannot run this job (e.g. its plugin did not load); it is not
    /// scheduled and cannot be triggered until a restart fixes that.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<String>,
    /// Paused at run time (persisted).
    pub paused: bool,
    pub pause_reason: Option<String>,
    pub paused_at: Option<DateTime<Utc>>,
    pub next_fire: Option<DateTime<Utc>>,
    pub last_run: Option<RunBrief>,
    /// Where the job is defined: a config file, or at runtime by an MCP client.
    pub origin: JobOrigin,
    /// Its `tags`, for handling jobs as a group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// Where a job is defined.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JobOrigin {
    /// In the config files (read-only over MCP): `file:line:col` when known.
    File { location: Option<String> },
    /// Created at runtime (`create_job`): stored in the database, changed by `update_job`.
    Runtime {
        /// Counts every change of the name (pass it as `expected_version`).
        version: u64,
        created_by: String,
        created_at: DateTime<Utc>,
        updated_by: String,
        updated_at: DateTime<Utc>,
    },
    /// Created at runtime and since deleted: it no longer fires; its runs and history stay.
    Deleted { version: u64, deleted_by: String, deleted_at: DateTime<Utc> },
}

/// One change of a runtime job, as its history keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct JobChange {
    /// The version this change made.
    pub version: u64,
    /// `create`, `update` or `delete`.
    pub action: String,
    pub actor: String,
    pub at: DateTime<Utc>,
    /// The definition before the change (none for a create).
    pub before: Option<serde_json::Value>,
    /// The definition after the change (none for a delete).
    pub after: Option<serde_json::Value>,
}

/// What `create_job` and `update_job` answer: the job as it is (or, with `dry_run`, would be)
/// saved, and what its schedule does.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct JobSaved {
    pub name: String,
    /// False for a dry run: nothing was saved.
    pub saved: bool,
    /// The version saved (with `dry_run`: the version it would get).
    pub version: u64,
    /// The definition as stored (JSON; YAML text given is parsed).
    pub definition: serde_json::Value,
    /// The job as the worker compiled it.
    pub job: JobSummary,
    /// Its next fire times in its zone and UTC, the daylight-saving changes they cross, and
    /// warnings about the schedule; none for a job without one.
    pub preview: Option<SchedulePreview>,
    /// What compiles but looks wrong, each naming its field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// What `delete_job` answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct JobDeleted {
    pub name: String,
    /// The version the delete made (the history's last entry).
    pub version: u64,
    /// Runs of the job asked to stop (`cancel_runs`); others in flight finish.
    pub cancelled_runs: Vec<String>,
}

/// One tick of a backfill.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BackfillTick {
    pub scheduled_at: DateTime<Utc>,
    /// The same instant, RFC 3339 in the job's time zone.
    #[serde(default)]
    pub local: String,
    /// The run created for it (none on a dry run, or when it already had one).
    pub run_id: Option<String>,
    /// The tick already had a run (it is not run again).
    pub existing: bool,
}

/// What `backfill_job` answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Backfill {
    pub name: String,
    pub dry_run: bool,
    /// Every tick of the window, in order.
    pub ticks: Vec<BackfillTick>,
    /// Runs created (would be, on a dry run).
    pub created: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RunBrief {
    pub id: String,
    pub status: RunStatus,
    pub trigger: Trigger,
    pub enqueued_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl From<&Run> for RunBrief {
    fn from(r: &Run) -> Self {
        Self { id: r.id.clone(), status: r.status, trigger: r.trigger, enqueued_at: r.enqueued_at, finished_at: r.finished_at }
    }
}

/// One upcoming fire time, in UTC and in the job's zone.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FireTime {
    pub utc: DateTime<Utc>,
    /// RFC 3339 in the job's time zone.
    pub local: String,
}

/// What a schedule does, before any job uses it (`preview_schedule`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SchedulePreview {
    /// The schedule as given: `cron: 30 7 * * 1-5`.
    pub schedule: String,
    /// The zone its fire times are read in (UTC for `every` and `at`).
    pub timezone: String,
    /// The next fire times, in UTC and in the zone.
    pub next_fires: Vec<FireTime>,
    /// Daylight-saving changes those fire times cross.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// What looks like a mistake: it fires very often, or never.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct JobDetail {
    #[serde(flatten)]
    pub summary: JobSummary,
    pub next_fires: Vec<FireTime>,
    /// The days its calendar passes over or moves a fire on before the last of `next_fires`,
    /// and why (`2026-12-25 skipped: in calendar "holidays" (Christmas Day)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calendar_days: Vec<String>,
    pub counts: BTreeMap<String, u64>,
    pub recent_runs: Vec<RunBrief>,
    pub catch_up: String,
    pub overlap: String,
    pub timeout_seconds: Option<u64>,
    pub max_retries: u32,
    /// A runtime job's definition, as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<serde_json::Value>,
    /// A runtime job's changes, newest first (the last 20; `lampctl jobs history` shows all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<JobChange>,
    /// The jobs it runs after, and what of theirs it waits for now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<AfterView>,
    /// The jobs that run after it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub downstream: Vec<String>,
    /// The last ticks no worker fired on time (none was up, or the database was away), as the
    /// worker that next saw them told them (the event `missed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_missed: Option<MissedTicks>,
}

/// Ticks of a job no worker fired on time, and what its catch-up did with them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MissedTicks {
    pub first_tick: DateTime<Utc>,
    /// The last missed tick.
    pub last_tick: DateTime<Utc>,
    /// How many (at least: a long downtime of a frequent job is not walked tick by tick).
    pub count: u64,
    /// Fired late, as `catch_up` runs.
    pub caught_up: u64,
    /// Passed over by `catch_up` (`latest` fires only the newest, `skip` none).
    pub skipped: u64,
    /// Older than `catch_up_window`: never fired.
    pub outside_window: u64,
    /// When a worker saw and told them.
    pub told_at: DateTime<Utc>,
}

/// A job's `after`: what it runs after, and where it stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AfterView {
    /// The upstream jobs.
    pub jobs: Vec<String>,
    /// `success`, `failure` or `finished`: which of their outcomes count.
    pub on: String,
    /// How long an outcome waits for the others' (none: for ever).
    pub within_seconds: Option<u64>,
    /// Upstream outcomes that count and are not used yet, oldest first.
    pub pending: Vec<UpstreamOutcome>,
    /// Outcomes that waited out `within` without the others': nothing runs for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expired: Vec<UpstreamOutcome>,
    /// The upstream jobs it still waits for (none pending): the next run starts when each has one.
    pub waiting_for: Vec<String>,
}

/// An upstream run's outcome a job running `after` has not used yet.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UpstreamOutcome {
    pub job: String,
    pub run_id: String,
    pub status: String,
    pub finished_at: DateTime<Utc>,
    /// When it stops counting if the others have not come (`within`).
    pub expires_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Triggered {
    pub run_id: String,
    /// False when the idempotency key matched an earlier trigger (its run is returned).
    pub created: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct JobPage {
    pub jobs: Vec<JobSummary>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RunPage {
    pub runs: Vec<Run>,
    /// Pass as `before` to get the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// A run with its workflow steps, as `get_run` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: Run,
    /// The workflow it runs, if it runs one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// Every step of the workflow in order (a `parallel`'s children under it), with what was
    /// recorded for it by any attempt of the run; empty for other targets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepView>,
    /// What agents waited on in this run (a tool call under `tool_approval: ask`, more
    /// budget), with the decisions: steps that are not the workflow's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_waits: Vec<StepRecord>,
    /// The agent transcript: every model and tool call of the run, by conversation and order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<CallRecord>,
    /// Totals over `calls`, when there are any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<AgentUsage>,
    /// What the job's `notify:` rules sent about this run (every attempt's), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notifications: Vec<Notification>,
    /// The job's deadlines this run (any of its attempts) missed, as they were told.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deadlines_missed: Vec<DeadlineMissed>,
    /// This attempt's live output (what its commands printed), line by line as it came; the
    /// first 1 MiB, then a line saying what was left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log: Vec<OutputLine>,
}

/// A deadline a run missed (`deadline:` of its job), told once while it waited or ran.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DeadlineMissed {
    /// `start_within`, `finish_within` or `finish_by`.
    pub deadline: String,
    /// When it had to have started or finished.
    pub due_at: DateTime<Utc>,
    /// When the miss was seen and told (a pass runs every second).
    pub told_at: DateTime<Utc>,
    /// How late it was when told, seconds.
    pub late_seconds: i64,
    /// The tick it is measured from, for a run a tick started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tick: Option<DateTime<Utc>>,
    /// The attempt that was waiting or running then.
    pub run_id: String,
    /// `notify`, or `cancel` when the miss stopped the run (`on_miss: cancel`).
    pub action: String,
}

/// One workflow step of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StepView {
    pub id: String,
    /// `plugin`, `agent`, `condition`, `approval`, `parallel` or `group_chat`.
    #[serde(rename = "type")]
    pub step_type: String,
    /// None: not reached (yet).
    pub status: Option<StepStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Capped at 1 MiB of JSON when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<serde_json::Value>,
    /// Why it failed, or a note on why it was skipped or cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepView>,
}

/// A step waiting for a decision.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Approval {
    pub run_id: String,
    /// The job, or `workflow:<name>` for a workflow run by hand.
    pub job: String,
    pub step: String,
    /// The step's `input`, rendered: what is to be approved.
    pub question: Option<serde_json::Value>,
    pub waiting_since: Option<DateTime<Utc>>,
    /// When `on_timeout` decides, if the step has a `timeout`.
    pub timeout_at: Option<DateTime<Utc>>,
    /// `approve` or `reject`.
    pub on_timeout: Option<String>,
}

/// A decision as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Decision {
    pub run_id: String,
    pub step: String,
    pub approved: bool,
    /// The step's record: its output is `{approved, comment, decided_by, decided_at}`.
    pub record: StepRecord,
    /// The run's status after the decision: `queued` (it continues), `waiting_approval`
    /// (other steps still wait) or `failed` (rejected).
    pub run_status: RunStatus,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct WorkerStatus {
    pub worker: String,
    pub version: String,
    pub started_at: DateTime<Utc>,
    pub uptime_seconds: i64,
    pub jobs: usize,
    pub running: usize,
    pub queue_depth: u64,
    /// `sqlite` or `postgres`.
    pub storage: String,
    /// The workers sharing the database whose lease is live (on SQLite, this one), with the
    /// runs each is running.
    pub workers: Vec<WorkerLease>,
}

/// A live worker: its lease and the runs it is running.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct WorkerLease {
    pub name: String,
    pub host: String,
    pub pid: u32,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    /// Its runs are taken over by the others if no heartbeat comes before this.
    pub lease_until: DateTime<Utc>,
    pub running: Vec<String>,
}
