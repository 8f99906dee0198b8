//! The MCP tools' arguments, and the checks the worker makes on them in its MCP layer: strict
//! deserialization (unknown fields and wrong types are refused, naming the field), ranges,
//! which fields go together, run statuses and cursors. All of it is pure, so [`check`] runs a
//! tool's argument handling without a worker (the fuzz target `mcp_args` drives it). The job
//! service checks the lengths of idempotency keys, comments and `decided_by` itself, for every
//! caller (`jobs/src/service.rs`).
//!
//! A refusal is an [`ArgError`]: the worker answers it as a JSON-RPC invalid-params error
//! (`-32602`) with this message.

use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::RunStatus;

/// Arguments a tool refuses: the message says why and names the field when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError {
    pub message: String,
    /// The field's path (`parameters.x`), when one field is to blame.
    pub field: Option<String>,
}

impl ArgError {
    fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), field: None }
    }
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Reads `tool`'s arguments as `P`, strictly; the error names the tool and the field.
pub fn from_arguments<P: DeserializeOwned>(tool: &str, arguments: Map<String, Value>) -> Result<P, ArgError> {
    serde_path_to_error::deserialize(Value::Object(arguments)).map_err(|e| {
        let path = e.path().to_string();
        // "." is the root: unknown and missing fields name themselves in serde's message.
        let field = (path != ".").then_some(path);
        let detail = match &field {
            Some(f) => format!("field `{f}`: {}", e.inner()),
            None => e.inner().to_string(),
        };
        ArgError { message: format!("invalid arguments for tool \"{tool}\": {detail}"), field }
    })
}

/// `value` when it is within `1..=max`, else an error naming `field`.
pub fn in_range(field: &str, value: u64, max: u64) -> Result<u64, ArgError> {
    if value < 1 || value > max {
        return Err(ArgError {
            message: format!("invalid arguments: field `{field}` must be between 1 and {max}, not {value}"),
            field: Some(field.to_owned()),
        });
    }
    Ok(value)
}

/// The longest wait a tool call may ask for: a day.
pub const MAX_WAIT_SECONDS: u64 = 86_400;

/// A wait's time limit: only with `wait`, 1–86400 seconds.
pub fn wait_timeout(wait: bool, timeout_seconds: Option<u64>) -> Result<Option<Duration>, ArgError> {
    match timeout_seconds {
        Some(_) if !wait => {
            Err(ArgError { message: "timeout_seconds only applies with wait: true".into(), field: Some("timeout_seconds".into()) })
        }
        Some(s) => Ok(Some(Duration::from_secs(in_range("timeout_seconds", s, MAX_WAIT_SECONDS)?))),
        None => Ok(None),
    }
}

/// The seed's tools take the job as `name` or `job_name`.
pub fn seed_job_name(name: Option<String>, job_name: Option<String>) -> Result<String, ArgError> {
    match (name, job_name) {
        (Some(a), Some(b)) if a != b => {
            Err(ArgError::new(format!("invalid arguments: `name` (\"{a}\") and `job_name` (\"{b}\") name different jobs; pass one")))
        }
        (Some(a), _) | (None, Some(a)) => Ok(a),
        (None, None) => Err(ArgError::new("invalid arguments: missing field `name` (or the seed's `job_name`)")),
    }
}

/// No arguments (unknown ones are refused).
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct JobArgs {
    /// The job's name, as in `list_jobs`.
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct GetJobArgs {
    /// The job's name, as in `list_jobs`.
    pub name: String,
    /// How many upcoming fire times to show (1–100, default 5).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 100)))]
    pub next: Option<u32>,
    /// How many of a runtime job's changes to show, newest first (1–1000, default 20).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1000)))]
    pub history: Option<u32>,
}

impl GetJobArgs {
    /// How many changes of a runtime job to show: 1–1000, default 20.
    pub fn history(&self) -> Result<usize, ArgError> {
        Ok(in_range("history", self.history.map_or(20, u64::from), 1000)? as usize)
    }
}

/// How many upcoming fire times `get_job` shows: 1–100, default 5.
pub fn next_fires(next: Option<u32>) -> Result<usize, ArgError> {
    Ok(in_range("next", next.map_or(5, u64::from), 100)? as usize)
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PreviewScheduleArgs {
    /// A cron expression (5 or 6 fields, or a macro such as `@daily`), as in a job's `cron:`.
    pub cron: Option<String>,
    /// A period such as `90s` or `15m`, as in a job's `every:`.
    pub every: Option<String>,
    /// One RFC 3339 instant, as in a job's `at:`.
    pub at: Option<String>,
    /// The IANA zone a cron expression fires in (default: the worker's `scheduling.timezone`).
    pub timezone: Option<String>,
    /// A name of `scheduling.calendars`: only fires on its days (in `timezone`) are kept, and
    /// the days passed over are listed with why.
    pub calendar: Option<String>,
    /// With `calendar`: `previous` or `next` moves a fire on a day off the calendar to the same
    /// local time of the calendar's day before or after, as a job's `calendar: {name, shift}`.
    pub shift: Option<ShiftArg>,
    /// Preview from this RFC 3339 instant instead of now (e.g. `2026-12-20T00:00:00Z`, to see
    /// the year's end).
    pub from: Option<String>,
    /// How many fire times to show (1–100, default 10).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 100)))]
    pub count: Option<u32>,
}

/// Where a fire on a day off a calendar goes.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum ShiftArg {
    /// To the calendar's day before.
    Previous,
    /// To the calendar's day after.
    Next,
}

/// A schedule to preview: exactly one of `cron`, `every` and `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleArg {
    Cron(String),
    Every(String),
    At(String),
}

impl PreviewScheduleArgs {
    /// The schedule given, and how many fire times to show.
    pub fn schedule(&self) -> Result<(ScheduleArg, usize), ArgError> {
        let given: Vec<ScheduleArg> =
            [self.cron.clone().map(ScheduleArg::Cron), self.every.clone().map(ScheduleArg::Every), self.at.clone().map(ScheduleArg::At)]
                .into_iter()
                .flatten()
                .collect();
        let count = in_range("count", self.count.map_or(10, u64::from), 100)? as usize;
        match <[ScheduleArg; 1]>::try_from(given) {
            Ok([one]) => Ok((one, count)),
            Err(given) if given.is_empty() => Err(ArgError::new("give one of `cron`, `every` or `at`")),
            Err(_) => Err(ArgError::new("give only one of `cron`, `every` and `at`")),
        }
    }
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateJobArgs {
    /// The new job's name (letters, digits, `-`, `_` and `.`; not a name the config files use).
    pub name: String,
    /// The job, exactly as its entry under `scheduling.jobs` in YAML: an object (`{"cron": "30 7 * * 1-5", "timezone": "Europe/Berlin", "workflow": "digest"}`) or that entry as YAML text.
    pub definition: Value,
    /// Check and preview only: nothing is saved, and the answer is what would be.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct UpdateJobArgs {
    /// The runtime job's name.
    pub name: String,
    /// The whole new definition (as for `create_job`): fields left out take their defaults.
    pub definition: Value,
    /// The version this change was made from (`origin.version` in `get_job`); a job changed since is refused.
    pub expected_version: u64,
    /// Check and preview only: nothing is saved.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DeleteJobArgs {
    /// The runtime job's name.
    pub name: String,
    /// The version being deleted (`origin.version` in `get_job`); a job changed since is refused.
    pub expected_version: u64,
    /// Also stop the job's queued and running runs (by default they finish).
    #[serde(default)]
    pub cancel_runs: bool,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct BackfillJobArgs {
    /// The job's name (from the files or created at runtime).
    pub name: String,
    /// The window's start (RFC 3339, inclusive).
    pub from: String,
    /// The window's end (RFC 3339, inclusive); not after now.
    pub to: String,
    /// List the ticks that would run, and create nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// An RFC 3339 instant given as `field`.
pub fn instant(field: &str, value: &str) -> Result<chrono::DateTime<chrono::Utc>, ArgError> {
    chrono::DateTime::parse_from_rfc3339(value.trim()).map(|t| t.with_timezone(&chrono::Utc)).map_err(|e| ArgError {
        message: format!(
            "invalid arguments: field `{field}`: \"{value}\" is not an RFC 3339 instant ({e}); write e.g. 2026-11-20T00:00:00Z"
        ),
        field: Some(field.to_owned()),
    })
}

impl BackfillJobArgs {
    /// The window, checked: both instants valid, `from` not after `to`.
    pub fn window(&self) -> Result<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>), ArgError> {
        let (from, to) = (instant("from", &self.from)?, instant("to", &self.to)?);
        if from > to {
            return Err(ArgError {
                message: format!("invalid arguments: `from` ({from}) is after `to` ({to})"),
                field: Some("from".into()),
            });
        }
        Ok((from, to))
    }
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PauseArgs {
    /// The job's name, as in `list_jobs`.
    pub name: Option<String>,
    /// Instead of `name`: every job with this tag, in one transaction with one reason.
    pub tag: Option<String>,
    /// Why it is paused; shown in listings.
    pub reason: Option<String>,
}

impl PauseArgs {
    /// The job, or the tag, the call is for.
    pub fn which(&self) -> Result<Which<'_>, ArgError> {
        which(self.name.as_deref(), self.tag.as_deref())
    }
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ResumeArgs {
    /// The job's name, as in `list_jobs`.
    pub name: Option<String>,
    /// Instead of `name`: every job with this tag, in one transaction.
    pub tag: Option<String>,
}

impl ResumeArgs {
    /// The job, or the tag, the call is for.
    pub fn which(&self) -> Result<Which<'_>, ArgError> {
        which(self.name.as_deref(), self.tag.as_deref())
    }
}

/// Which jobs a call is for: one by its name, or every job with a tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which<'a> {
    Name(&'a str),
    Tag(&'a str),
}

impl Which<'_> {
    /// The job's name, or `tag:NAME`.
    pub fn subject(self) -> String {
        match self {
            Which::Name(name) => name.to_owned(),
            Which::Tag(tag) => format!("tag:{tag}"),
        }
    }
}

fn which<'a>(name: Option<&'a str>, tag: Option<&'a str>) -> Result<Which<'a>, ArgError> {
    match (name, tag) {
        (Some(name), None) => Ok(Which::Name(name)),
        (None, Some(tag)) => Ok(Which::Tag(tag)),
        (Some(_), Some(_)) => Err(ArgError {
            message: "invalid arguments: give `name` (one job) or `tag` (every job with the tag), not both".into(),
            field: Some("tag".into()),
        }),
        (None, None) => Err(ArgError {
            message: "invalid arguments: missing `name` (one job) or `tag` (every job with the tag)".into(),
            field: Some("name".into()),
        }),
    }
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TriggerArgs {
    /// The job's name, as in `list_jobs`. Paused jobs can be triggered too.
    pub name: Option<String>,
    /// Instead of `name`: a run of every job with this tag (not with `wait` or `idempotency_key`).
    pub tag: Option<String>,
    /// Input for this run (any JSON value), instead of the job's configured `input`.
    pub input: Option<Value>,
    /// Parameters for this run (an object of name → value), instead of the job's configured `parameters`.
    pub parameters: Option<Map<String, Value>>,
    /// Makes the trigger safe to retry: a second trigger with the same key returns the first run (1–200 characters).
    pub idempotency_key: Option<String>,
    /// Wait for the run to finish and return it. While waiting, progress notifications are sent if the request has a progress token.
    #[serde(default)]
    pub wait: bool,
    /// With `wait`: stop waiting after this many seconds and return the run as it is (1–86400; default: until it finishes).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86400)))]
    pub timeout_seconds: Option<u64>,
}

/// The most agents a group chat names, and the most rounds it goes.
pub const MAX_CHAT_AGENTS: usize = 20;
pub const MAX_CHAT_ROUNDS: u32 = 20;

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RunAgentArgs {
    /// The agent's name, as in `list_agents`.
    pub name: String,
    /// The agent's task: a string as it is, other JSON as its text (default: the task its instructions describe).
    pub input: Option<Value>,
    /// Makes the call safe to retry: a second call with the same key returns the first run (1–200 characters).
    pub idempotency_key: Option<String>,
    /// Wait for the run to finish and return it (a tool call waiting for approval keeps the wait going). While waiting, progress notifications are sent if the request has a progress token.
    #[serde(default)]
    pub wait: bool,
    /// With `wait`: stop waiting after this many seconds and return the run as it is (1–86400; default: until it finishes).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86400)))]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RunPipelineArgs {
    /// The pipeline's name (config `pipelines`): its agents run in order, each given the previous one's answer.
    pub name: String,
    /// The first agent's input: a string as it is, other JSON as its text.
    pub input: Option<Value>,
    /// Makes the call safe to retry: a second call with the same key returns the first run (1–200 characters).
    pub idempotency_key: Option<String>,
    /// Wait for the run to finish and return it. While waiting, progress notifications are sent if the request has a progress token.
    #[serde(default)]
    pub wait: bool,
    /// With `wait`: stop waiting after this many seconds and return the run as it is (1–86400; default: until it finishes).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86400)))]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RunGroupChatArgs {
    /// The agents, in the order they speak (1–20, as in `list_agents`): each is given the previous one's answer.
    pub agents: Vec<String>,
    /// The first agent's input: a string as it is, other JSON as its text.
    pub input: Option<Value>,
    /// How many times the agents go round (1–20; default 1).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 20)))]
    pub max_iterations: Option<u32>,
    /// Makes the call safe to retry: a second call with the same key returns the first run (1–200 characters).
    pub idempotency_key: Option<String>,
    /// Wait for the run to finish and return it. While waiting, progress notifications are sent if the request has a progress token.
    #[serde(default)]
    pub wait: bool,
    /// With `wait`: stop waiting after this many seconds and return the run as it is (1–86400; default: until it finishes).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86400)))]
    pub timeout_seconds: Option<u64>,
}

impl RunGroupChatArgs {
    /// The agents and rounds, checked.
    pub fn checked(&self) -> Result<(), ArgError> {
        in_range("agents", self.agents.len() as u64, MAX_CHAT_AGENTS as u64)?;
        if let Some(r) = self.max_iterations {
            in_range("max_iterations", u64::from(r), u64::from(MAX_CHAT_ROUNDS))?;
        }
        if let Some(blank) = self.agents.iter().find(|a| a.trim().is_empty()) {
            return Err(ArgError {
                message: format!("invalid arguments: field `agents` holds a blank name ({blank:?})"),
                field: Some("agents".into()),
            });
        }
        Ok(())
    }
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RunWorkflowArgs {
    /// The workflow's name, as in `list_workflows`.
    pub name: String,
    /// The workflow's input (any JSON value): `${input}` and `${input.key}` in its steps.
    pub input: Option<Value>,
    /// Makes the call safe to retry: a second call with the same key returns the first run (1–200 characters).
    pub idempotency_key: Option<String>,
    /// Wait for the run to finish and return it (a run waiting for approval keeps the wait going). While waiting, progress notifications are sent if the request has a progress token.
    #[serde(default)]
    pub wait: bool,
    /// With `wait`: stop waiting after this many seconds and return the run as it is (1–86400; default: until it finishes).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86400)))]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ListJobsArgs {
    /// Page size (1–1000, default 100).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1000)))]
    pub limit: Option<u32>,
    /// `next_cursor` from the previous page.
    pub cursor: Option<String>,
    /// Only jobs with this tag.
    pub tag: Option<String>,
}

impl TriggerArgs {
    /// The job, or the tag, the call is for; a tag's trigger neither waits nor takes a key.
    pub fn which(&self) -> Result<Which<'_>, ArgError> {
        let which = which(self.name.as_deref(), self.tag.as_deref())?;
        if let Which::Tag(tag) = which {
            let alone = |field: &str| ArgError {
                message: format!(
                    "invalid arguments: `{field}` is for one job's run; trigger the jobs of tag \"{tag}\" without it, or each job by `name`"
                ),
                field: Some(field.to_owned()),
            };
            if self.wait {
                return Err(alone("wait"));
            }
            if self.idempotency_key.is_some() {
                return Err(alone("idempotency_key"));
            }
        }
        Ok(which)
    }
}

impl ListJobsArgs {
    /// The page size: 1–1000, default 100.
    pub fn page_size(&self) -> Result<usize, ArgError> {
        Ok(in_range("limit", self.limit.map_or(100, u64::from), 1000)? as usize)
    }
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ListRunsArgs {
    /// Only runs of this job.
    pub job: Option<String>,
    /// Only runs with this status: queued, running, waiting_approval, succeeded, failed, cancelled, timed_out, skipped, interrupted.
    pub status: Option<String>,
    /// Page size (1–200, default 20).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 200)))]
    pub limit: Option<u32>,
    /// `next_cursor` from the previous page.
    pub cursor: Option<String>,
}

/// A `list_runs` query, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunsQuery {
    pub job: Option<String>,
    pub status: Option<RunStatus>,
    /// 1–200.
    pub limit: u32,
    /// A run id as `next_cursor` gives it: runs older than that one.
    pub before: Option<String>,
}

impl ListRunsArgs {
    pub fn query(self) -> Result<RunsQuery, ArgError> {
        let status = match self.status.as_deref() {
            Some(s) => Some(s.parse::<RunStatus>().map_err(|m| ArgError { message: m, field: Some("status".into()) })?),
            None => None,
        };
        let limit = in_range("limit", self.limit.map_or(20, u64::from), 200)? as u32;
        // A cursor is a run id from `next_cursor`; anything else would silently page wrong
        // (ids compare as text, so even another spelling of the same UUID would).
        if let Some(c) = &self.cursor
            && !is_run_id(c)
        {
            return Err(ArgError {
                message: format!("cursor \"{c}\" is not a `next_cursor` from list_runs"),
                field: Some("cursor".into()),
            });
        }
        Ok(RunsQuery { job: self.job, status, limit, before: self.cursor })
    }
}

/// A run id as the worker writes it: a UUID, lower-case and hyphenated.
pub fn is_run_id(s: &str) -> bool {
    s.len() == 36
        && s.bytes()
            .enumerate()
            .all(|(i, b)| if matches!(i, 8 | 13 | 18 | 23) { b == b'-' } else { matches!(b, b'0'..=b'9' | b'a'..=b'f') })
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// The run's id, as returned by `trigger_job` or `list_runs`.
    pub id: String,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DecisionArgs {
    /// The run waiting for approval.
    pub run_id: String,
    /// The approval step's id (default: the step the run is waiting at).
    pub step: Option<String>,
    /// A comment recorded with the decision.
    pub comment: Option<String>,
    /// Who decides, recorded as `decided_by` (default: the MCP client's name).
    pub decided_by: Option<String>,
}

/// The seed worker's job arguments: `name` or `job_name`.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SeedJobArgs {
    /// The job's name.
    pub name: Option<String>,
    /// The job's name (the seed worker's spelling of `name`).
    pub job_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SeedPauseArgs {
    /// The job's name.
    pub name: Option<String>,
    /// The job's name (the seed worker's spelling of `name`).
    pub job_name: Option<String>,
    /// Why it is paused; shown in listings.
    pub reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SeedStatusArgs {
    /// The job's name.
    pub name: Option<String>,
    /// The job's name (the seed worker's spelling of `name`).
    pub job_name: Option<String>,
    /// How many upcoming fire times to show (1–100, default 5).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 100)))]
    pub next: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SeedTriggerArgs {
    /// The job's name.
    pub name: Option<String>,
    /// The job's name (the seed worker's spelling of `name`).
    pub job_name: Option<String>,
    /// Input for this run (any JSON value), instead of the job's configured `input`.
    pub input: Option<Value>,
    /// Parameters for this run (an object of name → value), instead of the job's configured `parameters`.
    pub parameters: Option<Map<String, Value>>,
    /// Makes the trigger safe to retry: a second trigger with the same key returns the first run (1–200 characters).
    pub idempotency_key: Option<String>,
}

/// What a tool's arguments came to once checked, as far as the checks go: the job, run or
/// workflow the call is about (`""` for none) and the page size or fire-time count it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub subject: String,
    pub count: Option<usize>,
    pub timeout: Option<Duration>,
}

/// Every tool the worker serves, in the order `tools/list` gives them.
pub const TOOLS: [&str; 32] = [
    "worker_status",
    "list_jobs",
    "get_job",
    "preview_schedule",
    "create_job",
    "update_job",
    "delete_job",
    "backfill_job",
    "pause_job",
    "resume_job",
    "trigger_job",
    "list_runs",
    "get_run",
    "cancel_run",
    "list_approvals",
    "list_limits",
    "approve_step",
    "reject_step",
    "run_workflow",
    "run_agent",
    "run_pipeline",
    "run_group_chat",
    "list_workflows",
    "list_agents",
    "list_plugins",
    "reload_config",
    "scheduler_list_jobs",
    "scheduler_trigger_job",
    "scheduler_pause_job",
    "scheduler_resume_job",
    "scheduler_job_status",
    "worker_plugin_list",
];

/// The tools that change jobs, served only when `worker.mcp.manage_jobs.enabled` is on.
pub const MANAGE_TOOLS: [&str; 4] = ["create_job", "update_job", "delete_job", "backfill_job"];

/// Runs `tool`'s argument handling as the worker does before it calls the engine: the
/// arguments are read as the tool's type and checked. An unknown tool is an error too.
pub fn check(tool: &str, arguments: Map<String, Value>) -> Result<Checked, ArgError> {
    let plain = |subject: String| Checked { subject, count: None, timeout: None };
    match tool {
        "worker_status"
        | "list_approvals"
        | "list_limits"
        | "list_workflows"
        | "list_agents"
        | "list_plugins"
        | "reload_config"
        | "scheduler_list_jobs"
        | "worker_plugin_list" => from_arguments::<NoArgs>(tool, arguments).map(|_| plain(String::new())),
        "list_jobs" => {
            let a: ListJobsArgs = from_arguments(tool, arguments)?;
            Ok(Checked { subject: a.cursor.clone().unwrap_or_default(), count: Some(a.page_size()?), timeout: None })
        }
        "get_job" => {
            let a: GetJobArgs = from_arguments(tool, arguments)?;
            a.history()?;
            Ok(Checked { count: Some(next_fires(a.next)?), subject: a.name, timeout: None })
        }
        "create_job" => from_arguments::<CreateJobArgs>(tool, arguments).map(|a| plain(a.name)),
        "update_job" => from_arguments::<UpdateJobArgs>(tool, arguments).map(|a| plain(a.name)),
        "delete_job" => from_arguments::<DeleteJobArgs>(tool, arguments).map(|a| plain(a.name)),
        "backfill_job" => {
            let a: BackfillJobArgs = from_arguments(tool, arguments)?;
            a.window()?;
            Ok(plain(a.name))
        }
        "preview_schedule" => {
            let a: PreviewScheduleArgs = from_arguments(tool, arguments)?;
            let (schedule, count) = a.schedule()?;
            let (ScheduleArg::Cron(s) | ScheduleArg::Every(s) | ScheduleArg::At(s)) = schedule;
            Ok(Checked { subject: s, count: Some(count), timeout: None })
        }
        "pause_job" => {
            let a: PauseArgs = from_arguments(tool, arguments)?;
            Ok(plain(a.which()?.subject()))
        }
        "resume_job" => {
            let a: ResumeArgs = from_arguments(tool, arguments)?;
            Ok(plain(a.which()?.subject()))
        }
        "trigger_job" => {
            let a: TriggerArgs = from_arguments(tool, arguments)?;
            let subject = a.which()?.subject();
            Ok(Checked { timeout: wait_timeout(a.wait, a.timeout_seconds)?, subject, count: None })
        }
        "list_runs" => {
            let q = from_arguments::<ListRunsArgs>(tool, arguments)?.query()?;
            Ok(Checked { subject: q.before.unwrap_or_default(), count: Some(q.limit as usize), timeout: None })
        }
        "get_run" | "cancel_run" => from_arguments::<RunArgs>(tool, arguments).map(|a| plain(a.id)),
        "approve_step" | "reject_step" => from_arguments::<DecisionArgs>(tool, arguments).map(|a| plain(a.run_id)),
        "run_workflow" => {
            let a: RunWorkflowArgs = from_arguments(tool, arguments)?;
            Ok(Checked { timeout: wait_timeout(a.wait, a.timeout_seconds)?, subject: a.name, count: None })
        }
        "run_agent" => {
            let a: RunAgentArgs = from_arguments(tool, arguments)?;
            Ok(Checked { timeout: wait_timeout(a.wait, a.timeout_seconds)?, subject: a.name, count: None })
        }
        "run_pipeline" => {
            let a: RunPipelineArgs = from_arguments(tool, arguments)?;
            Ok(Checked { timeout: wait_timeout(a.wait, a.timeout_seconds)?, subject: a.name, count: None })
        }
        "run_group_chat" => {
            let a: RunGroupChatArgs = from_arguments(tool, arguments)?;
            a.checked()?;
            Ok(Checked { timeout: wait_timeout(a.wait, a.timeout_seconds)?, subject: a.agents.join(","), count: None })
        }
        "scheduler_trigger_job" => {
            let a: SeedTriggerArgs = from_arguments(tool, arguments)?;
            seed_job_name(a.name, a.job_name).map(plain)
        }
        "scheduler_pause_job" => {
            let a: SeedPauseArgs = from_arguments(tool, arguments)?;
            seed_job_name(a.name, a.job_name).map(plain)
        }
        "scheduler_resume_job" => {
            let a: SeedJobArgs = from_arguments(tool, arguments)?;
            seed_job_name(a.name, a.job_name).map(plain)
        }
        "scheduler_job_status" => {
            let a: SeedStatusArgs = from_arguments(tool, arguments)?;
            let count = next_fires(a.next)?;
            Ok(Checked { subject: seed_job_name(a.name, a.job_name)?, count: Some(count), timeout: None })
        }
        other => Err(ArgError::new(format!("unknown tool \"{other}\""))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn a_preview_takes_exactly_one_schedule() {
        let ok = check("preview_schedule", args(json!({"cron": "30 7 * * 1-5", "timezone": "Europe/Berlin"}))).expect("ok");
        assert_eq!((ok.subject.as_str(), ok.count), ("30 7 * * 1-5", Some(10)));
        let none = check("preview_schedule", args(json!({"timezone": "UTC"}))).unwrap_err();
        assert_eq!(none.message, "give one of `cron`, `every` or `at`");
        let two = check("preview_schedule", args(json!({"cron": "* * * * *", "every": "1m"}))).unwrap_err();
        assert_eq!(two.message, "give only one of `cron`, `every` and `at`");
        let many = check("preview_schedule", args(json!({"every": "1m", "count": 101}))).unwrap_err();
        assert!(many.message.contains("count"), "{}", many.message);
    }

    #[test]
    fn every_listed_tool_is_checked() {
        for tool in TOOLS {
            let err = check(tool, args(json!({"surely_not_a_field": 1}))).expect_err(tool);
            assert!(err.message.contains("unknown field `surely_not_a_field`"), "{tool}: {err}");
        }
        assert_eq!(check("nope", Map::new()).unwrap_err().message, "unknown tool \"nope\"");
    }

    #[test]
    fn a_group_chat_names_1_to_20_agents_and_goes_1_to_20_rounds() {
        let ok = check("run_group_chat", args(json!({"agents": ["a", "b"], "max_iterations": 3, "wait": true, "timeout_seconds": 5})));
        assert_eq!(ok.map(|c| c.subject), Ok("a,b".to_string()));
        for (bad, field) in [
            (json!({"agents": []}), "agents"),
            (json!({"agents": vec!["a"; 21]}), "agents"),
            (json!({"agents": ["a", " "]}), "agents"),
            (json!({"agents": ["a"], "max_iterations": 0}), "max_iterations"),
            (json!({"agents": ["a"], "max_iterations": 21}), "max_iterations"),
            (json!({"agents": ["a"], "timeout_seconds": 5}), "timeout_seconds"),
            (json!({"agents": "a,b"}), "agents"),
        ] {
            let err = check("run_group_chat", args(bad.clone())).expect_err(&bad.to_string());
            assert_eq!(err.field.as_deref(), Some(field), "{bad}: {err}");
        }
    }

    #[test]
    fn wrong_types_name_the_field() {
        let err = check("trigger_job", args(json!({"name": "a", "parameters": {"x": 1}, "wait": "yes"}))).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("wait"));
        assert!(err.message.starts_with("invalid arguments for tool \"trigger_job\": field `wait`: invalid type"), "{err}");
        let err = check("get_job", args(json!({}))).unwrap_err();
        assert_eq!(err.message, "invalid arguments for tool \"get_job\": missing field `name`");
        // Not rmcp's own wording, which it would turn into a tool result.
        assert!(!err.message.starts_with("failed to deserialize parameters"));
    }

    #[test]
    fn ranges_defaults_and_pairs() {
        assert_eq!(check("list_jobs", Map::new()).unwrap().count, Some(100));
        assert_eq!(check("list_runs", Map::new()).unwrap().count, Some(20));
        assert_eq!(check("get_job", args(json!({"name": "a"}))).unwrap().count, Some(5));
        let err = check("list_jobs", args(json!({"limit": 0}))).unwrap_err();
        assert_eq!(err.message, "invalid arguments: field `limit` must be between 1 and 1000, not 0");
        assert!(check("list_runs", args(json!({"limit": 201}))).is_err());
        assert!(check("trigger_job", args(json!({"name": "a", "timeout_seconds": 5}))).is_err(), "a timeout needs wait");
        let ok = check("trigger_job", args(json!({"name": "a", "wait": true, "timeout_seconds": 86400}))).unwrap();
        assert_eq!(ok.timeout, Some(Duration::from_secs(86_400)));
        assert!(check("run_workflow", args(json!({"name": "a", "wait": true, "timeout_seconds": 86401}))).is_err());
        assert!(check("scheduler_pause_job", args(json!({"name": "a", "job_name": "b"}))).is_err());
        assert_eq!(check("scheduler_pause_job", args(json!({"job_name": "b"}))).unwrap().subject, "b");
        assert_eq!(check("scheduler_pause_job", args(json!({"name": "b", "job_name": "b"}))).unwrap().subject, "b");
        assert!(check("scheduler_resume_job", Map::new()).is_err());
    }

    #[test]
    fn a_backfill_window_is_two_instants_in_order() {
        let ok = check("backfill_job", args(json!({"name": "a", "from": "2026-11-20T00:00:00Z", "to": "2026-11-21T00:00:00+01:00"})));
        assert_eq!(ok.expect("ok").subject, "a");
        let bad = check("backfill_job", args(json!({"name": "a", "from": "yesterday", "to": "2026-11-21T00:00:00Z"}))).unwrap_err();
        assert_eq!(bad.field.as_deref(), Some("from"));
        assert!(bad.message.contains("\"yesterday\" is not an RFC 3339 instant"), "{bad}");
        let reversed = check("backfill_job", args(json!({"name": "a", "from": "2026-11-22T00:00:00Z", "to": "2026-11-21T00:00:00Z"})));
        assert!(reversed.unwrap_err().message.contains("is after `to`"));
        let no_def = check("create_job", args(json!({"name": "a"}))).unwrap_err();
        assert_eq!(no_def.message, "invalid arguments for tool \"create_job\": missing field `definition`");
    }

    #[test]
    fn a_cursor_is_a_run_id_as_written() {
        let id = "01a20bba-b091-71bd-ae74-2ec92bfcf2f7";
        assert_eq!(check("list_runs", args(json!({"cursor": id}))).unwrap().subject, id);
        for bad in
            ["01A20BBA-B091-71BD-AE74-2EC92BFCF2F7", "01a20bbab09171bdae742ec92bfcf2f7", "{01a20bba-b091-71bd-ae74-2ec92bfcf2f7}", "", "ü"]
        {
            let err = check("list_runs", args(json!({"cursor": bad}))).unwrap_err();
            assert_eq!(err.field.as_deref(), Some("cursor"), "{bad}");
        }
        let err = check("list_runs", args(json!({"status": "done"}))).unwrap_err();
        assert!(err.message.starts_with("unknown run status \"done\""), "{err}");
    }
}
