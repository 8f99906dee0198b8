//! The job service: the operations a person needs (list, inspect, pause, resume, trigger,
//! follow and cancel runs), with typed results and errors that name the job. The MCP layer
//! wraps these one to one; nothing here knows about the wire.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lamplighter_config::{JobConfig, JsonText, Overlap, Schedule, ScheduleSpec, Shift, Step, StepKind, Workflow};

use crate::clock::Clock;
use crate::events::Observer;
use crate::executor::Executor;
use crate::in_force::{InForce, JobsConfig};
use crate::scheduler::Scheduler;
use crate::signals::Signals;
use crate::store::{Definitions, JobStates, Leases, Listings, Notices, Records, StorageKind, Ticks};
use crate::watch::{Interest, Watch};
use lamplighter_contract as wire;
use lamplighter_contract::args::{MAX_CHAT_AGENTS, MAX_CHAT_ROUNDS};
pub use lamplighter_contract::{
    AgentInfo, Approval, Decision, FireTime, JobDetail, JobOrigin, JobPage, JobSummary, PluginView, RunBrief, RunDetail, RunPage,
    SchedulePreview, StepView, Triggered, WorkerStatus, WorkflowInfo,
};
use lamplighter_contract::{TagChange, TagTriggered, TaggedRefusal, TaggedRun};

use crate::run::{AgentUsage, Owner, Run, RunStatus, StepRecord, StepStatus, Trigger};
use crate::signals::Signal;
use crate::snapshot::{JobSnapshot, TargetRef};
use crate::store::{Decided, JobOverview, NewRun, RunFilter, StepDecision, StoreError};

/// Errors callers branch on. Messages say what to do.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("job \"{name}\" not found; known jobs: {known}")]
    JobNotFound { name: String, known: String },
    #[error("run \"{id}\" not found")]
    RunNotFound { id: String },
    #[error("run \"{id}\" is already {status} and cannot be cancelled")]
    NotCancellable { id: String, status: RunStatus },
    #[error("job \"{name}\" is disabled: {reason}")]
    JobDisabled { name: String, reason: String },
    #[error("workflow \"{name}\" not found; known workflows: {known}")]
    WorkflowNotFound { name: String, known: String },
    #[error("agent \"{name}\" not found; known agents: {known}")]
    AgentNotFound { name: String, known: String },
    #[error("pipeline \"{name}\" not found; known pipelines: {known}")]
    PipelineNotFound { name: String, known: String },
    /// An agent the environment keeps from running here (its key unset, its plugin not loaded).
    #[error("agent \"{name}\" cannot run here: {reason}")]
    AgentDisabled { name: String, reason: String },
    /// A workflow that needs what the environment keeps from running here (an agent of a step).
    #[error("workflow \"{name}\" cannot run here: {reason}")]
    WorkflowDisabled { name: String, reason: String },
    /// A decision on a run or step that does not wait for one.
    #[error("{0}")]
    NotWaiting(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// `worker.mcp.manage_jobs.enabled` is off.
    #[error("managing jobs at runtime is off on this worker; its operator can turn it on with worker.mcp.manage_jobs.enabled: true")]
    ManagementOff,
    /// A change to a job of the config files.
    #[error("job \"{name}\" is defined in the config files{}; jobs from the files are read-only here (pause, resume and trigger work): change it there and reload", location.as_ref().map(|l| format!(" ({l})")).unwrap_or_default())]
    ReadOnly { name: String, location: Option<String> },
    /// A definition that does not compile or is not allowed here: every problem, each naming
    /// its field.
    #[error("job \"{name}\" was not saved:\n- {}", errors.join("\n- "))]
    InvalidDefinition { name: String, errors: Vec<String> },
    /// A change refused because of what is stored: a stale version, a name taken, a limit.
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Storage(#[from] StoreError),
}

/// A manual trigger's options.
#[derive(Debug, Clone, Default)]
pub struct TriggerRequest {
    pub input: Option<serde_json::Value>,
    pub parameters: Option<serde_json::Value>,
    pub idempotency_key: Option<String>,
    /// Who asks (recorded on the run).
    pub requested_by: Option<String>,
}

/// A decision to record with [`JobService::decide`].
#[derive(Debug, Clone)]
pub struct DecisionRequest {
    pub run_id: String,
    /// Which waiting step; may be left out when the run waits on one.
    pub step: Option<String>,
    pub approve: bool,
    pub comment: Option<String>,
    /// Who or what decided (recorded as `decided_by`).
    pub decided_by: String,
}

/// A trigger's parameters override the job's key by key; keys it does not name keep the job's
/// values (so `--param content=x` changes one parameter, not all of them).
fn merge_parameters(job: Option<serde_json::Value>, over: Option<serde_json::Value>) -> Option<serde_json::Value> {
    match (job, over) {
        (Some(serde_json::Value::Object(mut base)), Some(serde_json::Value::Object(over))) => {
            base.extend(over);
            Some(serde_json::Value::Object(base))
        }
        (base, over) => over.or(base),
    }
}

fn check_idempotency_key(key: Option<&str>) -> Result<(), ServiceError> {
    match key {
        Some(k) if k.is_empty() || k.len() > 200 => Err(ServiceError::InvalidArgument("idempotency key must be 1–200 characters".into())),
        _ => Ok(()),
    }
}

/// Names for a "not found" message: comma-separated, or `none`.
fn known_names<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let names: Vec<&str> = names.map(String::as_str).collect();
    if names.is_empty() { "none".into() } else { names.join(", ") }
}

fn quoted(names: &[String]) -> String {
    if names.is_empty() { "no step".into() } else { names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ") }
}

/// The steps in definition order, each with its record.
fn step_views(steps: &[Step], records: &std::collections::HashMap<String, StepRecord>) -> Vec<StepView> {
    steps
        .iter()
        .map(|s| {
            let r = records.get(&s.id);
            StepView {
                id: s.id.clone(),
                step_type: s.kind.step_type().as_str().to_string(),
                status: r.map(|r| r.status),
                attempt: r.map(|r| r.attempt),
                started_at: r.and_then(|r| r.started_at),
                finished_at: r.and_then(|r| r.finished_at),
                output: r.and_then(|r| r.output.clone()),
                error: r.and_then(|r| r.error.clone()),
                steps: match &s.kind {
                    StepKind::Parallel { steps } => step_views(steps, records),
                    _ => Vec::new(),
                },
            }
        })
        .collect()
}

/// The operations a person or a client asks for: list and inspect jobs and runs, pause, resume
/// and trigger jobs, follow, cancel and approve runs, and manage runtime definitions
/// (`manage.rs`). Built by the engine with the handles it needs (the store's traits it reads and
/// writes, the config in force, the executor to stop a run, the scheduler to hand a run over
/// at once); it starts nothing of its own. Cheap to clone.
#[derive(Clone)]
pub struct JobService {
    pub(crate) records: Arc<dyn Records>,
    pub(crate) listings: Arc<dyn Listings>,
    pub(crate) states: Arc<dyn JobStates>,
    pub(crate) definitions: Arc<dyn Definitions>,
    pub(crate) notices: Arc<dyn Notices>,
    pub(crate) deadlines: Arc<dyn crate::store::Deadlines>,
    pub(crate) missed: Arc<dyn crate::store::Missed>,
    pub(crate) ticks: Arc<dyn Ticks>,
    pub(crate) leases: Arc<dyn Leases>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) signals: Arc<dyn Signals>,
    pub(crate) observer: Arc<Observer>,
    pub(crate) config: Arc<InForce>,
    pub(crate) executor: Arc<Executor>,
    pub(crate) scheduler: Arc<Scheduler>,
    pub(crate) worker: WorkerFacts,
}

/// What `worker_status` says of this worker.
#[derive(Clone)]
pub(crate) struct WorkerFacts {
    pub(crate) name: String,
    pub(crate) storage: StorageKind,
    pub(crate) started_at: DateTime<Utc>,
}

impl JobService {
    pub(crate) fn signal(&self, signal: Signal) {
        self.signals.publish(signal);
    }

    /// Puts a runtime job saved (or deleted) here in force at once, and tells every worker.
    pub(crate) fn apply_runtime_job(&self, name: &str, stored: Option<crate::definitions::StoredJob>) {
        if let Some(changed) = self.config.set_runtime_job(name, stored) {
            self.signal(Signal::jobs_changed(changed));
        }
        self.signal(Signal::DefinitionChanged(name.to_owned()));
    }

    /// Tells when what `interest` names may have changed, so a caller can wait for a state
    /// without polling: take it, read, and wait for the next change only if what was read is
    /// not there yet (see [`Watch`]).
    pub fn watch(&self, interest: Interest) -> Watch {
        Watch::new(self.signals.subscribe(), interest)
    }

    pub(crate) fn job_or_err(&self, name: &str) -> Result<JobConfig, ServiceError> {
        self.config.job(name).ok_or_else(|| ServiceError::JobNotFound {
            name: name.to_string(),
            known: {
                let jobs = self.config.jobs();
                known_jobs(name, || jobs.keys(), "none")
            },
        })
    }

    fn summary(&self, job: &JobConfig, state: Option<&crate::store::JobState>, last: Option<RunBrief>, now: DateTime<Utc>) -> JobSummary {
        summary_in(&self.config.get(), job, state, last, now)
    }

    /// Every configured job, by name.
    pub async fn list_jobs(&self) -> Result<Vec<JobSummary>, ServiceError> {
        Ok(self.list_jobs_page(None, usize::MAX, None).await?.jobs)
    }

    /// What a listing of jobs is read from, besides the clock: the config in force and the
    /// store's [count of listing changes](crate::store::Listings::listing_changes). Taken before
    /// a listing, it lets a caller keep the listing and serve it again while an equal version is
    /// taken, from the instant the listing was read until the first `next_fire` in it. `None`
    /// when the store cannot tell (PostgreSQL, where other workers write).
    pub async fn listing_version(&self) -> Option<ListingVersion> {
        let config = self.config.get();
        let changes = self.listings.listing_changes().await?;
        Some(ListingVersion { config, changes })
    }

    /// The engine's clock.
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Jobs by name, `limit` at a time, starting after the job named `after` (the previous
    /// page's `next_cursor`).
    /// With `tag`, only the jobs that have it (a tag no job has is an error).
    pub async fn list_jobs_page(&self, after: Option<&str>, limit: usize, tag: Option<&str>) -> Result<JobPage, ServiceError> {
        let snapshot = self.config.get();
        let mut jobs = snapshot.jobs.after(after).map(|(_, j)| j).filter(|j| tag.is_none_or(|t| j.tags().iter().any(|x| x == t)));
        let page: Vec<&JobConfig> = jobs.by_ref().take(limit).collect();
        if let Some(tag) = tag.filter(|_| page.is_empty() && after.is_none()) {
            // No job has it: said so, with the tags in use.
            tagged(&snapshot, tag)?;
        }
        let more = jobs.next().is_some();
        let jobs = self.summaries(&snapshot, &page).await?;
        let next_cursor = if more { jobs.last().map(|j| j.name.clone()) } else { None };
        Ok(JobPage { jobs, next_cursor })
    }

    /// One job with its next `n` fire times, run counts by status and recent runs.
    pub async fn get_job(&self, name: &str, n: usize) -> Result<JobDetail, ServiceError> {
        self.get_job_with_history(name, n, 20).await
    }

    /// [`JobService::get_job`], with up to `history` of a runtime job's changes. A runtime job that
    /// was deleted is shown too, as deleted: its definition before the delete, its history and
    /// its runs.
    pub async fn get_job_with_history(&self, name: &str, n: usize, history: usize) -> Result<JobDetail, ServiceError> {
        let snapshot = self.config.get();
        let (job, origin, definition) = match self.job_or_err(name) {
            Ok(job) => {
                let runtime = snapshot.runtime.get(name).cloned();
                (job, None, runtime.map(|r| r.definition))
            }
            Err(not_found) => match self.definitions.job_history(name, 1).await?.into_iter().next() {
                Some(last) if last.action == "delete" => {
                    let before = last.before.clone().unwrap_or(serde_json::Value::Null);
                    let job = lamplighter_config::inert_job(name, &before, &snapshot.default_timezone);
                    let origin = JobOrigin::Deleted { version: last.version, deleted_by: last.actor, deleted_at: last.at };
                    (job, Some(origin), last.before)
                }
                _ => return Err(not_found),
            },
        };
        let history = if definition.is_some() { self.job_history(name, history.clamp(1, 1000)).await? } else { Vec::new() };
        let JobOverview { state, recent, counts } = self.listings.job_overview(name, 10).await?;
        let counts = counts.into_iter().map(|(k, v)| (k.as_str().to_string(), v)).collect();
        let now = self.clock.now();
        // On a calendar, one preview gives the fires and the days passed over on the way.
        let (next_fires, calendar_days) = match &job.schedule {
            Some(s) if origin.is_none() && s.calendar().is_some() => {
                // A sparse calendar passes over many days: the first few, and where to see all.
                const SHOWN: usize = 20;
                let preview = s.preview(now, n.clamp(1, 100));
                let mut days = preview.skipped;
                if days.len() > SHOWN {
                    days.truncate(SHOWN);
                    days.push(format!(
                        "… more days passed over: preview_schedule (lampctl schedule preview) with calendar \"{}\" and from shows them",
                        s.calendar().map(|c| c.name()).unwrap_or_default()
                    ));
                }
                (fire_times(s, preview.fires), days)
            }
            _ if origin.is_some() => (Vec::new(), Vec::new()),
            _ => (self.next_fires(&job, now, n.clamp(1, 100)), Vec::new()),
        };
        let mut summary = self.summary(&job, Some(&state), recent.first().cloned(), now);
        if let Some(JobOrigin::Deleted { version, deleted_by, deleted_at }) = &origin {
            summary.disabled =
                Some(format!("deleted by {deleted_by} at {} (version {version}); it no longer fires", deleted_at.to_rfc3339()));
            summary.next_fire = None;
        }
        if let Some(o) = origin {
            summary.origin = o;
        }
        let after = match job.after() {
            Some(after) => Some(after_view(after, self.notices.pending_after(name).await?, now)),
            None => None,
        };
        Ok(JobDetail {
            summary,
            next_fires,
            calendar_days,
            counts,
            recent_runs: recent,
            catch_up: format!("{:?}", job.catch_up).to_lowercase(),
            overlap: format!("{:?}", job.overlap).to_lowercase(),
            timeout_seconds: job.timeout.map(|t| t.as_secs()),
            max_retries: job.retries.max,
            definition,
            history,
            after,
            downstream: snapshot.downstream_names(name),
            last_missed: self.missed.last_missed(name).await?.map(|(m, told_at)| lamplighter_contract::MissedTicks {
                first_tick: m.first,
                last_tick: m.last,
                count: m.count as u64,
                caught_up: m.caught_up as u64,
                skipped: m.skipped as u64,
                outside_window: m.outside_window as u64,
                told_at,
            }),
        })
    }

    /// The next `n` fire times of a job (whether or not it is paused).
    pub fn next_fire_times(&self, name: &str, n: usize) -> Result<Vec<FireTime>, ServiceError> {
        let job = self.job_or_err(name)?;
        Ok(self.next_fires(&job, self.clock.now(), n.clamp(1, 1000)))
    }

    fn next_fires(&self, job: &JobConfig, now: DateTime<Utc>, n: usize) -> Vec<FireTime> {
        let Some(s) = &job.schedule else {
            return Vec::new();
        };
        fire_times(s, s.upcoming(now, n))
    }

    /// What a schedule would do, before any job uses it: its next `count` fire times from
    /// `from` (default now; in its zone and UTC), the daylight-saving changes they cross, the
    /// days `calendar` (a name of `scheduling.calendars`) passed over, and warnings (it fires
    /// very often, or never). `timezone` defaults to `scheduling.timezone`. An error names the
    /// field.
    pub fn preview_schedule(
        &self,
        spec: ScheduleSpec,
        timezone: Option<&str>,
        calendar: Option<(&str, Shift)>,
        from: Option<&str>,
        count: usize,
    ) -> Result<SchedulePreview, ServiceError> {
        let config = self.config.get();
        let tz = timezone.unwrap_or(&config.default_timezone);
        let bad = |field: &str, e: String| ServiceError::InvalidArgument(format!("{field}: {e}"));
        let mut schedule = lamplighter_config::parse_alone(spec, tz).map_err(|(field, e)| bad(field, e.to_string()))?;
        if let Some((name, shift)) = calendar {
            let zone = lamplighter_config::parse_zone(tz).map_err(|e| bad("timezone", e.to_string()))?;
            let calendars = &config.scope.calendars;
            let Some(found) = calendars.get(name) else {
                let hint = lamplighter_config::did_you_mean(name, calendars.keys().map(String::as_str));
                let known: Vec<String> = calendars.keys().map(|n| format!("\"{n}\"")).collect();
                let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
                return Err(bad("calendar", format!("\"{name}\" is not one of scheduling.calendars{hint} (defined calendars: {known})")));
            };
            schedule = schedule.on_calendar(found.clone(), zone, shift);
        }
        let from = match from {
            None => self.clock.now(),
            Some(f) => chrono::DateTime::parse_from_rfc3339(f.trim())
                .map_err(|e| bad("from", format!("\"{f}\" is not an RFC 3339 instant ({e}); write e.g. \"2026-12-20T00:00:00Z\"")))?
                .with_timezone(&Utc),
        };
        Ok(preview_of(&schedule, from, count.clamp(1, 1000)))
    }

    /// Pauses a job; persisted, survives restarts. Pausing a paused job updates the reason.
    pub async fn pause_job(&self, name: &str, reason: Option<&str>) -> Result<JobSummary, ServiceError> {
        self.job_or_err(name)?;
        self.states.set_paused(name, true, reason, self.clock.now()).await?;
        self.signal(Signal::jobs_changed(vec![name.to_owned()]));
        tracing::info!(job = name, reason = reason.unwrap_or(""), "job paused");
        self.summary_of(name).await
    }

    /// Resumes a job. Ticks missed while paused are not caught up.
    pub async fn resume_job(&self, name: &str) -> Result<JobSummary, ServiceError> {
        self.job_or_err(name)?;
        let now = self.clock.now();
        self.states.set_paused(name, false, None, now).await?;
        self.states.set_last_tick(name, now).await?;
        self.signal(Signal::jobs_changed(vec![name.to_owned()]));
        tracing::info!(job = name, "job resumed");
        self.summary_of(name).await
    }

    /// Pauses (with one reason) or resumes every job with `tag`, in one transaction; a job
    /// already so is left as it is (a paused one keeps its own reason). Ticks missed while
    /// paused are not caught up. Answers what it changed and every job of the tag.
    pub async fn set_tag_paused(&self, tag: &str, paused: bool, reason: Option<&str>) -> Result<TagChange, ServiceError> {
        let snapshot = self.config.get();
        let names = tagged(&snapshot, tag)?;
        let changed = self.states.set_paused_all(&names, paused, reason, self.clock.now()).await?;
        self.signal(Signal::jobs_changed(changed.clone()));
        tracing::info!(tag, paused, jobs = names.len(), changed = changed.len(), reason = reason.unwrap_or(""), "jobs of a tag changed");
        let page: Vec<&JobConfig> = names.iter().filter_map(|n| snapshot.jobs.get(n)).collect();
        Ok(TagChange { tag: tag.to_owned(), changed, jobs: self.summaries(&snapshot, &page).await? })
    }

    /// The summaries of `jobs`, with their state and last run read at once.
    async fn summaries(&self, snapshot: &JobsConfig, jobs: &[&JobConfig]) -> Result<Vec<JobSummary>, ServiceError> {
        let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
        let (states, mut last) = tokio::try_join!(self.states.job_states(), self.listings.last_runs(&names))?;
        let now = self.clock.now();
        Ok(jobs.iter().map(|j| summary_in(snapshot, j, states.get(&j.name), last.remove(&j.name), now)).collect())
    }

    /// Starts a run of every job with `tag` (paused or not), each as [`JobService::trigger_job`]
    /// would; a job that cannot be started (it cannot run here, it went away meanwhile, a
    /// write failed) is listed with why, and the others start. Only when none started and one
    /// failed for another reason than being unavailable is the call an error.
    pub async fn trigger_tag(&self, tag: &str, req: TriggerRequest) -> Result<TagTriggered, ServiceError> {
        let names = tagged(&self.config.get(), tag)?;
        let mut answer = TagTriggered { tag: tag.to_owned(), runs: Vec::new(), refused: Vec::new() };
        let mut failed = None;
        for job in names {
            let one = TriggerRequest { idempotency_key: None, ..req.clone() };
            match self.trigger_job(&job, one).await {
                Ok(t) => answer.runs.push(TaggedRun { job, run_id: t.run_id }),
                Err(ServiceError::JobDisabled { reason, .. }) => answer.refused.push(TaggedRefusal { job, reason }),
                Err(e) => {
                    answer.refused.push(TaggedRefusal { job, reason: e.to_string() });
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) if answer.runs.is_empty() => Err(e),
            _ => Ok(answer),
        }
    }

    async fn summary_of(&self, name: &str) -> Result<JobSummary, ServiceError> {
        let job = self.job_or_err(name)?;
        let state = self.states.job_state(name).await?;
        let last = self.listings.list_runs(&RunFilter { job: Some(name.into()), limit: Some(1), ..Default::default() }).await?;
        Ok(self.summary(&job, Some(&state), last.first().map(Run::brief), self.clock.now()))
    }

    /// Starts a run now, paused or not. Returns at once with the run id.
    pub async fn trigger_job(&self, name: &str, req: TriggerRequest) -> Result<Triggered, ServiceError> {
        let job = self.job_or_err(name)?;
        if let Some(reason) = self.config.get().unavailable.get(name) {
            return Err(ServiceError::JobDisabled { name: name.to_string(), reason: reason.clone() });
        }
        check_idempotency_key(req.idempotency_key.as_deref())?;
        if let Some(p) = &req.parameters
            && !p.is_object()
        {
            return Err(ServiceError::InvalidArgument(format!("parameters for job \"{name}\" must be an object of name → value")));
        }
        let now = self.clock.now();
        let snapshot = self.config.get().snapshot_of(&job);
        let run = NewRun {
            input: req.input.or(job.input.map(|i| *i)),
            parameters: merge_parameters(job.parameters.as_ref().map(JsonText::value), req.parameters),
            idempotency_key: req.idempotency_key,
            requested_by: req.requested_by,
            in_line: job.overlap != Overlap::Queue,
            ..NewRun::asked(Owner::Job(name.to_string()), Trigger::Manual, snapshot, now)
        };
        self.insert_and_dispatch(run, now).await
    }

    /// Waits until a run reaches a final status (or `timeout` passes) and returns it.
    pub async fn wait_run(&self, id: &str, timeout: Option<Duration>) -> Result<wire::Run, ServiceError> {
        // The run alone: its steps and calls are not what a wait for its end needs.
        let mut follow = self.follow::<wire::Run>(id);
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut last = None;
        loop {
            let next = match deadline {
                Some(d) => match tokio::time::timeout_at(d, follow.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
                None => follow.next().await,
            };
            match next {
                Some(run) => {
                    let run = run?;
                    if run.status.is_final() {
                        return Ok(run);
                    }
                    last = Some(run);
                }
                None => break,
            }
        }
        match last {
            Some(run) => Ok(run),
            None => self.get_run(id).await,
        }
    }

    /// The configured workflows: what each does step by step, and why one is disabled.
    pub fn list_workflows(&self) -> Vec<WorkflowInfo> {
        self.config.get().listing.workflows.clone()
    }

    /// The configured agents: model, provider, tools offered, and why one is disabled.
    pub fn list_agents(&self) -> Vec<AgentInfo> {
        self.config.get().listing.agents.clone()
    }

    /// The plugins this worker knows: actions with their parameter schemas, and why one cannot
    /// be used.
    pub fn list_plugins(&self) -> Vec<PluginView> {
        self.config.get().listing.plugins.clone()
    }

    /// Follows a run, reading `T` of it (see [`RunFollower`]). Tool waits, tasks and
    /// `wait_run` follow runs through it.
    pub fn follow<T: Followed>(&self, id: &str) -> RunFollower<T> {
        RunFollower {
            service: self.clone(),
            id: id.to_owned(),
            watch: self.watch(Interest::Run { id: id.to_owned(), progress: T::PROGRESS }),
            last: None,
            stale: true,
            done: false,
            reads: std::marker::PhantomData,
        }
    }

    pub async fn list_runs(&self, filter: RunFilter) -> Result<RunPage, ServiceError> {
        if let Some(j) = &filter.job
            && self.config.job(j).is_none()
        {
            // Runs of a removed job are still listed when they exist.
            let any = self.listings.list_runs(&RunFilter { job: Some(j.clone()), limit: Some(1), ..Default::default() }).await?;
            if any.is_empty() {
                self.job_or_err(j)?;
            }
        }
        let limit = filter.limit.unwrap_or(50).clamp(1, 1000);
        let runs = self.listings.list_runs(&RunFilter { limit: Some(limit), ..filter }).await?;
        let next_cursor = (runs.len() as u32 == limit).then(|| runs.last().map(|r| r.id.clone())).flatten();
        Ok(RunPage { runs: self.wire_runs(&runs).await, next_cursor })
    }

    pub async fn get_run(&self, id: &str) -> Result<wire::Run, ServiceError> {
        let run = self.load_run(id).await?;
        Ok(self.wire_runs(std::slice::from_ref(&run)).await.remove(0))
    }

    /// Runs as the contract shows them; a run waiting for a limit's slot says who holds the
    /// slots (read once for the lot).
    async fn wire_runs(&self, runs: &[Run]) -> Vec<wire::Run> {
        let mut out: Vec<wire::Run> = runs.iter().map(Run::to_wire).collect();
        if out.iter().all(|r| r.waiting_for.is_none()) {
            return out;
        }
        let pools = match self.listings.pools().await {
            Ok(p) => p,
            // The wait is still shown, without its holders.
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the limits' slots");
                return out;
            }
        };
        let sizes = self.config.get().limits.clone();
        for (run, wire) in runs.iter().zip(&mut out) {
            let Some(wait) = run.limit_wait.as_ref().filter(|_| wire.waiting_for.is_some()) else { continue };
            let holders = pools.iter().find(|p| p.pool == wait.pool).map(|p| p.holders.as_slice()).unwrap_or_default();
            wire.waiting_for = Some(crate::limits::waiting_text(&wait.pool, sizes.get(&wait.pool.name).copied(), holders));
        }
        out
    }

    /// Each limit: its slots, who holds them and who waits, per key.
    pub async fn list_limits(&self) -> Result<Vec<wire::LimitView>, ServiceError> {
        let sizes = self.config.get().limits.clone();
        let mut views: std::collections::BTreeMap<String, wire::LimitView> = sizes
            .iter()
            .map(|(name, n)| (name.clone(), wire::LimitView { name: name.clone(), slots: Some(*n), held: 0, waiting: 0, keys: Vec::new() }))
            .collect();
        for p in self.listings.pools().await? {
            let name = p.pool.name.clone();
            let view =
                views.entry(name.clone()).or_insert_with(|| wire::LimitView { name, slots: None, held: 0, waiting: 0, keys: Vec::new() });
            view.held += p.holders.len();
            view.waiting += p.waiting_count;
            view.keys.push(wire::LimitKeyView {
                key: p.pool.key,
                waiting_count: p.waiting_count,
                holders: p.holders.into_iter().take(crate::store::WAITING_SHOWN).collect(),
                waiting: p.waiting,
                waiting_since: p.oldest_wait,
            });
        }
        Ok(views.into_values().collect())
    }

    async fn load_run(&self, id: &str) -> Result<Run, ServiceError> {
        self.records.get_run(id).await?.ok_or_else(|| ServiceError::RunNotFound { id: id.to_string() })
    }

    /// A run with its workflow steps as a tree.
    pub async fn get_run_detail(&self, id: &str) -> Result<RunDetail, ServiceError> {
        let run = self.load_run(id).await?;
        let calls = self.records.calls(&run.root_id).await?;
        let usage = (!calls.is_empty()).then(|| AgentUsage::of(&calls));
        let records = self.records.steps(&run.root_id).await?;
        let (workflow, steps, own) = match self.definition_of(&run).await? {
            None => (None, Vec::new(), Vec::new()),
            Some((name, definition)) => {
                let by_id: std::collections::HashMap<String, StepRecord> = records.iter().map(|r| (r.step.clone(), r.clone())).collect();
                let own: Vec<String> =
                    definition.as_ref().map(|d| d.all_steps().iter().map(|s| s.id.clone()).collect()).unwrap_or_default();
                (Some(name), definition.as_ref().map(|d| step_views(&d.steps, &by_id)).unwrap_or_default(), own)
            }
        };
        let agent_waits = records.into_iter().filter(|r| !own.contains(&r.step)).collect();
        let notifications = self.notices.notifications(&run.root_id).await?;
        let deadlines_missed = self
            .deadlines
            .misses_of(&run.root_id)
            .await?
            .into_iter()
            .map(|m| {
                let told_at = m.told_at.unwrap_or(m.due_at);
                lamplighter_contract::DeadlineMissed {
                    deadline: m.which.as_str().to_string(),
                    due_at: m.due_at,
                    told_at,
                    late_seconds: (told_at - m.due_at).num_seconds().max(0),
                    tick: m.tick,
                    run_id: m.run_id,
                    action: if m.cancel { "cancel" } else { "notify" }.to_string(),
                }
            })
            .collect();
        let log = self.records.output(&run.id).await?;
        let wire = self.wire_runs(std::slice::from_ref(&run)).await.remove(0);
        Ok(RunDetail { run: wire, workflow, steps, agent_waits, calls, usage, notifications, deadlines_missed, log })
    }

    /// The workflow a run executes (name, and its definition as the run has it).
    async fn definition_of(&self, run: &Run) -> Result<Option<(String, Option<std::sync::Arc<Workflow>>)>, ServiceError> {
        let snapshot = self.records.run_snapshot(&run.id).await?;
        Ok(match snapshot.map(|s| s.target) {
            Some(TargetRef::Workflow { workflow, definition }) => {
                let definition = definition.or_else(|| self.config.workflow(&workflow));
                Some((workflow, definition))
            }
            Some(_) => None,
            // Rows from before snapshots: the job as configured now.
            None => match run.owner.job().and_then(|j| self.config.job(j)).map(|j| j.target) {
                Some(lamplighter_config::Target::Workflow(w)) => Some((w.clone(), self.config.workflow(&w))),
                _ => None,
            },
        })
    }

    /// Starts a run of a workflow by hand, without a job (recorded under the job name
    /// `workflow:<name>`, with a job's default policies). Returns at once with the run id.
    pub async fn run_workflow(
        &self,
        name: &str,
        input: Option<serde_json::Value>,
        idempotency_key: Option<String>,
        requested_by: Option<String>,
    ) -> Result<Triggered, ServiceError> {
        let Some(definition) = self.config.workflow(name) else {
            let known = known_names(self.config.get().workflows.keys());
            return Err(ServiceError::WorkflowNotFound { name: name.to_string(), known });
        };
        // Refused up front, as `run_agent` refuses a disabled agent, rather than accepted and
        // failed at the step that needs what is missing.
        {
            let config = self.config.get();
            let listed = config.listing.workflows.iter().find(|w| w.name == name).and_then(|w| w.disabled.clone());
            if let Some(reason) = listed.or_else(|| config.health.workflow_down(name).map(str::to_string)) {
                return Err(ServiceError::WorkflowDisabled { name: name.to_string(), reason });
            }
        }
        check_idempotency_key(idempotency_key.as_deref())?;
        let now = self.clock.now();
        let snapshot = JobSnapshot::of_target(TargetRef::Workflow { workflow: name.to_string(), definition: Some(definition) });
        let run = NewRun {
            input,
            idempotency_key,
            requested_by,
            ..NewRun::asked(Owner::Workflow(name.to_string()), Trigger::Manual, snapshot, now)
        };
        self.insert_and_dispatch(run, now).await
    }

    /// Starts a run of an agent by hand, the input its task (recorded under the job name
    /// `agent:<name>`, with a job's default policies). Returns at once with the run id.
    pub async fn run_agent(
        &self,
        name: &str,
        input: Option<serde_json::Value>,
        idempotency_key: Option<String>,
        requested_by: Option<String>,
    ) -> Result<Triggered, ServiceError> {
        self.agents_can_run(&[name.to_string()])?;
        let target = TargetRef::Agent { agent: name.to_string() };
        self.start_agents(Owner::Agent(name.to_string()), target, input, idempotency_key, requested_by).await
    }

    /// Starts a named pipeline by hand: its agents in order, each given the previous answer
    /// (recorded under `pipeline:<name>`).
    pub async fn run_pipeline(
        &self,
        name: &str,
        input: Option<serde_json::Value>,
        idempotency_key: Option<String>,
        requested_by: Option<String>,
    ) -> Result<Triggered, ServiceError> {
        let config = self.config.get();
        let Some(pipeline) = config.agents.pipelines.get(name) else {
            return Err(ServiceError::PipelineNotFound { name: name.to_string(), known: known_names(config.agents.pipelines.keys()) });
        };
        self.agents_can_run(&pipeline.agents)?;
        let target = TargetRef::Pipeline { pipeline: name.to_string(), agents: pipeline.agents.clone() };
        self.start_agents(Owner::Pipeline(name.to_string()), target, input, idempotency_key, requested_by).await
    }

    /// Starts a group chat by hand: `agents` in turn, `rounds` times (default 1), each given
    /// the previous answer (recorded under `group-chat:<a>,<b>,…`).
    pub async fn run_group_chat(
        &self,
        agents: &[String],
        rounds: Option<u32>,
        input: Option<serde_json::Value>,
        idempotency_key: Option<String>,
        requested_by: Option<String>,
    ) -> Result<Triggered, ServiceError> {
        let rounds = rounds.unwrap_or(1);
        if agents.is_empty() || agents.len() > MAX_CHAT_AGENTS {
            return Err(ServiceError::InvalidArgument(format!("agents: name 1 to {MAX_CHAT_AGENTS} agents, not {}", agents.len())));
        }
        if !(1..=MAX_CHAT_ROUNDS).contains(&rounds) {
            return Err(ServiceError::InvalidArgument(format!("max_iterations: 1 to {MAX_CHAT_ROUNDS}, not {rounds}")));
        }
        self.agents_can_run(agents)?;
        let target = TargetRef::GroupChat { agents: agents.to_vec(), rounds };
        self.start_agents(Owner::GroupChat(agents.to_vec()), target, input, idempotency_key, requested_by).await
    }

    /// Each of `agents` is defined and can run here.
    fn agents_can_run(&self, agents: &[String]) -> Result<(), ServiceError> {
        let config = self.config.get();
        for name in agents {
            if !config.agents.agents.contains_key(name) {
                return Err(ServiceError::AgentNotFound { name: name.clone(), known: known_names(config.agents.agents.keys()) });
            }
            if let Some(reason) = config.health.agent_down(name) {
                return Err(ServiceError::AgentDisabled { name: name.clone(), reason: reason.to_string() });
            }
        }
        Ok(())
    }

    async fn start_agents(
        &self,
        owner: Owner,
        target: TargetRef,
        input: Option<serde_json::Value>,
        idempotency_key: Option<String>,
        requested_by: Option<String>,
    ) -> Result<Triggered, ServiceError> {
        check_idempotency_key(idempotency_key.as_deref())?;
        let now = self.clock.now();
        let run =
            NewRun { input, idempotency_key, requested_by, ..NewRun::asked(owner, Trigger::Manual, JobSnapshot::of_target(target), now) };
        self.insert_and_dispatch(run, now).await
    }

    async fn insert_and_dispatch(&self, run: NewRun, now: DateTime<Utc>) -> Result<Triggered, ServiceError> {
        let (owner, trigger) = (run.owner.clone(), run.trigger);
        let (run_id, created) = self.records.insert_run(run, now).await?;
        if created {
            self.observer.run_created(&owner, trigger, &run_id);
            // It may be in the queue already, for any worker to take.
            if self.records.queued_by_insert() {
                self.signal(Signal::TasksPushed);
            }
            // It may wait in its limits' lines, which a hand-over reads only when asked to.
            self.scheduler.look_for_waiters();
        }
        if created && self.scheduler.dispatch_due(now).await {
            self.signal(Signal::Wake);
        }
        Ok(Triggered { run_id, created })
    }

    /// Steps waiting for a decision, oldest run first.
    pub async fn list_approvals(&self) -> Result<Vec<Approval>, ServiceError> {
        let filter = RunFilter { status: Some(RunStatus::WaitingApproval), limit: Some(1000), ..Default::default() };
        let mut runs = self.listings.list_runs(&filter).await?;
        runs.reverse();
        let mut out = Vec::new();
        for run in runs {
            let definition = self.definition_of(&run).await?.and_then(|(_, d)| d);
            for r in self.records.steps(&run.root_id).await? {
                if r.status != StepStatus::WaitingApproval || r.run_id != run.id {
                    continue;
                }
                let step = definition.as_ref().and_then(|d| d.all_steps().into_iter().find(|s| s.id == r.step).cloned());
                let (timeout, on_timeout) = match step.map(|s| s.kind) {
                    Some(StepKind::Approval { timeout, on_timeout, .. }) => (timeout, Some(on_timeout.as_str().to_string())),
                    Some(StepKind::Parallel { .. }) => continue,
                    _ => (None, None),
                };
                out.push(Approval {
                    run_id: run.id.clone(),
                    job: run.owner.to_string(),
                    question: r.output.as_ref().and_then(|o| o.get("question")).cloned(),
                    timeout_at: timeout.zip(r.started_at).map(|(t, s)| s + chrono::Duration::from_std(t).unwrap_or(chrono::Duration::MAX)),
                    on_timeout: on_timeout.filter(|_| timeout.is_some()),
                    waiting_since: r.started_at,
                    step: r.step,
                });
            }
        }
        Ok(out)
    }

    /// Records a decision on a waiting approval step. An approval resumes the run (unless other
    /// steps of it still wait); a rejection fails it, naming the step. Deciding a run that does
    /// not wait, or a step already decided, is an error that says what happened.
    pub async fn decide(&self, req: DecisionRequest) -> Result<Decision, ServiceError> {
        if req.decided_by.trim().is_empty() || req.decided_by.len() > 200 {
            return Err(ServiceError::InvalidArgument("decided_by must be 1–200 characters".into()));
        }
        if req.comment.as_ref().is_some_and(|c| c.len() > 10_000) {
            return Err(ServiceError::InvalidArgument("comment must be at most 10,000 characters".into()));
        }
        let now = self.clock.now();
        let d = StepDecision {
            run_id: &req.run_id,
            step: req.step.as_deref(),
            approve: req.approve,
            comment: req.comment.as_deref(),
            decided_by: &req.decided_by,
        };
        let id = &req.run_id;
        match self.records.record_decision(&d, now).await? {
            Decided::NoSuchRun => Err(ServiceError::RunNotFound { id: id.clone() }),
            Decided::NotWaiting(status) => Err(ServiceError::NotWaiting(self.not_waiting(id, req.step.as_deref(), status).await)),
            Decided::NotWaitingStep { waiting } => Err(ServiceError::NotWaiting(format!(
                "run \"{id}\" is not waiting on step \"{}\"; it waits on {}",
                req.step.as_deref().unwrap_or(""),
                quoted(&waiting)
            ))),
            Decided::WhichStep { waiting } => Err(ServiceError::InvalidArgument(format!(
                "run \"{id}\" waits on several steps ({}); say which one with `step`",
                quoted(&waiting)
            ))),
            Decided::Recorded { step, run } => {
                self.observer.approval_decided(id, &step.step, req.approve, &req.decided_by);
                match run {
                    RunStatus::Queued => {
                        if self.scheduler.dispatch_due(now).await {
                            self.signal(Signal::Wake);
                        }
                    }
                    // Its retention is asked for once the notifier has noticed it.
                    RunStatus::Failed => self.signal(Signal::RunFinished(id.clone())),
                    _ => self.signal(Signal::RunsChanged),
                }
                Ok(Decision { run_id: id.clone(), step: step.step.clone(), approved: req.approve, record: step, run_status: run })
            }
        }
    }

    /// Why a decision cannot be taken: says who decided before, when that is what happened.
    async fn not_waiting(&self, id: &str, step: Option<&str>, status: RunStatus) -> String {
        let run = self.get_run(id).await.ok();
        let decided = match &run {
            Some(run) => self.records.steps(&run.root_id).await.unwrap_or_default(),
            None => Vec::new(),
        };
        let earlier = decided
            .iter()
            .filter(|r| step.is_none_or(|s| s == r.step))
            .filter_map(|r| Some((r, r.output.as_ref()?.get("decided_by")?.as_str()?)))
            .max_by_key(|(r, _)| r.finished_at);
        match earlier {
            Some((r, by)) => {
                let verb = if r.status == StepStatus::Succeeded { "approved" } else { "rejected" };
                let at = r.finished_at.map(|t| format!(" at {}", t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))).unwrap_or_default();
                format!("step \"{}\" of run \"{id}\" was already {verb} by {by}{at}; the run is now {status}", r.step)
            }
            None => format!("run \"{id}\" is {status}, not waiting for approval"),
        }
    }

    /// Cancels a queued, running or waiting run.
    pub async fn cancel_run(&self, id: &str) -> Result<wire::Run, ServiceError> {
        let run = self.get_run(id).await?;
        if run.status.is_final() {
            return Err(ServiceError::NotCancellable { id: id.to_string(), status: run.status });
        }
        let now = self.clock.now();
        if self.executor.stop_run(id, "cancelled by request".into(), now).await {
            return self.wait_run(id, Some(Duration::from_secs(10))).await;
        }
        // Neither queued here nor running here: it may have just finished.
        let run = self.get_run(id).await?;
        if run.status.is_final() && run.status != RunStatus::Cancelled {
            return Err(ServiceError::NotCancellable { id: id.to_string(), status: run.status });
        }
        Ok(run)
    }

    pub async fn worker_status(&self) -> Result<WorkerStatus, ServiceError> {
        let now = self.clock.now();
        Ok(WorkerStatus {
            worker: self.worker.name.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: self.worker.started_at,
            uptime_seconds: (now - self.worker.started_at).num_seconds(),
            jobs: self.config.jobs().len(),
            running: self.executor.running_count(),
            queue_depth: self.listings.queue_depth().await?,
            storage: self.worker.storage.as_str().into(),
            workers: self.leases.workers(now).await?,
        })
    }
}

/// See [`JobService::listing_version`]. Equal versions: the same config (the same snapshot, not
/// an equal one) and no change to what a listing shows in between.
#[derive(Debug, Clone)]
pub struct ListingVersion {
    /// Held, so that its address is not reused by a later snapshot.
    config: Arc<JobsConfig>,
    changes: u64,
}

impl PartialEq for ListingVersion {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config) && self.changes == other.changes
    }
}

/// A job as listed, from the config `snapshot` it belongs to (read once per listing, not per job).
/// What a schedule does next, as `preview_schedule` and a saved job show it.
pub(crate) fn preview_of(schedule: &Schedule, now: DateTime<Utc>, count: usize) -> SchedulePreview {
    let preview = schedule.preview(now, count);
    let zone = schedule.timezone();
    SchedulePreview {
        schedule: schedule_text(schedule),
        timezone: zone.name().to_string(),
        next_fires: preview.fires.iter().map(|t| FireTime { utc: *t, local: t.with_timezone(&zone).to_rfc3339() }).collect(),
        // The days its calendar passed over first (`2026-12-25 skipped: in calendar "holidays"`).
        notes: preview.skipped.into_iter().chain(preview.notes).collect(),
        warnings: preview.warnings,
    }
}

/// `fires` as listings show them: UTC and the schedule's zone.
fn fire_times(s: &Schedule, fires: Vec<DateTime<Utc>>) -> Vec<FireTime> {
    let tz = s.timezone();
    fires.into_iter().map(|t| FireTime { utc: t, local: t.with_timezone(&tz).to_rfc3339() }).collect()
}

/// `cron: 30 6 * * *`, and `on calendar "business"` when it has one.
fn schedule_text(schedule: &Schedule) -> String {
    match (schedule.calendar(), schedule.shift().name()) {
        (Some(c), None) => format!("{} on calendar \"{}\"", schedule.spec(), c.name()),
        (Some(c), Some(shift)) => format!("{} on calendar \"{}\" (shift {shift})", schedule.spec(), c.name()),
        (None, _) => schedule.spec().to_string(),
    }
}

pub(crate) fn summary_in(
    snapshot: &JobsConfig,
    job: &JobConfig,
    state: Option<&crate::store::JobState>,
    last: Option<RunBrief>,
    now: DateTime<Utc>,
) -> JobSummary {
    let paused = state.is_some_and(|s| s.paused);
    let disabled = snapshot.unavailable.get(&job.name).cloned();
    let next_fire = if job.enabled && !paused && disabled.is_none() { job.schedule.as_ref().and_then(|s| s.next_after(now)) } else { None };
    JobSummary {
        name: job.name.clone(),
        description: job.description.clone(),
        target_type: job.target.kind().to_string(),
        target: job.target.describe(),
        schedule: match (job.schedule.as_deref().map(schedule_text), job.after()) {
            (Some(s), Some(after)) => Some(format!("{s}; {}", after_text(after))),
            (None, Some(after)) => Some(after_text(after)),
            (s, None) => s,
        },
        timezone: job.timezone.clone(),
        enabled: job.enabled,
        disabled,
        paused,
        pause_reason: state.and_then(|s| s.pause_reason.clone()),
        paused_at: state.and_then(|s| s.paused_at),
        next_fire,
        last_run: last,
        origin: origin_of(snapshot, &job.name),
        tags: job.tags().to_vec(),
    }
}

/// A job's `after` as `get_job` shows it: the outcomes pending, and the upstream jobs with none.
/// Outcomes past their window at `now` are shown apart: nothing runs for them (they are
/// dropped at the next pass that looks at this job).
fn after_view(after: &lamplighter_config::After, pending: Vec<crate::decide::PendingOutcome>, now: DateTime<Utc>) -> wire::AfterView {
    let within = after.within.and_then(|w| chrono::Duration::from_std(w).ok());
    let expired = crate::decide::fan_in(after, &pending, now).expired;
    let (gone, live): (Vec<_>, Vec<_>) = pending.into_iter().enumerate().partition(|(i, _)| expired.contains(i));
    let waiting_for = after.jobs.iter().filter(|j| !live.iter().any(|(_, p)| p.upstream == **j)).cloned().collect();
    let shown = |list: Vec<(usize, crate::decide::PendingOutcome)>| {
        list.into_iter()
            .map(|(_, p)| wire::UpstreamOutcome {
                expires_at: within.map(|w| p.finished_at + w),
                job: p.upstream,
                run_id: p.run_id,
                status: p.status.as_str().to_owned(),
                finished_at: p.finished_at,
            })
            .collect()
    };
    wire::AfterView {
        jobs: after.jobs.clone(),
        on: after.on.as_str().to_owned(),
        within_seconds: after.within.map(|w| w.as_secs()),
        pending: shown(live),
        expired: shown(gone),
        waiting_for,
    }
}

/// How a job's `after` reads in a listing: `after extract, load on failure within 12h`.
fn after_text(after: &lamplighter_config::After) -> String {
    let mut text = format!("after {}", after.jobs.join(", "));
    if after.on != lamplighter_config::AfterOn::Success {
        text.push_str(&format!(" on {}", after.on.as_str()));
    }
    if let Some(w) = after.within {
        text.push_str(&format!(" within {}", humantime::format_duration(w)));
    }
    text
}

/// The names of the jobs with `tag`, in name order; a tag no job has is an error that names
/// the tags in use.
fn tagged(snapshot: &JobsConfig, tag: &str) -> Result<Vec<String>, ServiceError> {
    let names: Vec<String> = snapshot.jobs.values().filter(|j| j.tags().iter().any(|t| t == tag)).map(|j| j.name.clone()).collect();
    if !names.is_empty() {
        return Ok(names);
    }
    let in_use: std::collections::BTreeSet<&str> = snapshot.jobs.values().flat_map(|j| j.tags().iter().map(String::as_str)).collect();
    let close = lamplighter_config::did_you_mean(tag, in_use.iter().copied());
    let known = if in_use.is_empty() {
        "no job has tags (set `tags: [...]` on a job)".to_owned()
    } else {
        format!("tags in use: {}", in_use.into_iter().collect::<Vec<_>>().join(", "))
    };
    Err(ServiceError::InvalidArgument(format!("no job has tag \"{tag}\"{close}; {known}")))
}

/// Where a job is defined: a runtime job's stored facts, else its place in the files.
fn origin_of(snapshot: &JobsConfig, name: &str) -> JobOrigin {
    match snapshot.runtime.get(name) {
        Some(r) => JobOrigin::Runtime {
            version: r.version,
            created_by: r.created_by.clone(),
            created_at: r.created_at,
            updated_by: r.updated_by.clone(),
            updated_at: r.updated_at,
        },
        None => JobOrigin::File { location: snapshot.locations.get(name).flatten().map(|l| l.to_string()) },
    }
}

/// What a [`RunFollower`] reads of its run: the run alone ([`wire::Run`], for a wait on its end) or
/// the run with its steps, agent calls and waits ([`RunDetail`], for whoever shows progress).
pub trait Followed: serde::Serialize + Send + Sized + 'static {
    /// A run's progress (a step or a call recorded) changes what is read; the run row alone
    /// does not change with it.
    const PROGRESS: bool;
    fn read(service: &JobService, id: &str) -> impl std::future::Future<Output = Result<Self, ServiceError>> + Send;
    fn run(&self) -> &wire::Run;
}

impl Followed for wire::Run {
    const PROGRESS: bool = false;
    async fn read(service: &JobService, id: &str) -> Result<Self, ServiceError> {
        service.get_run(id).await
    }
    fn run(&self) -> &wire::Run {
        self
    }
}

impl Followed for RunDetail {
    const PROGRESS: bool = true;
    async fn read(service: &JobService, id: &str) -> Result<Self, ServiceError> {
        service.get_run_detail(id).await
    }
    fn run(&self) -> &wire::Run {
        &self.run
    }
}

/// A run as it goes: [`RunFollower::next`] gives what it reads of the run now (`T`: see
/// [`Followed`]), then again each time that reads differently, until the run is final (the
/// last reading given). A read follows the signals that may change what it reads (the run's
/// end, runs started or resumed, and for a detail its progress; from other workers too on
/// PostgreSQL; anything after a lag); a burst of them is one read.
pub struct RunFollower<T> {
    service: JobService,
    id: String,
    watch: Watch,
    /// What was last given, as JSON (a read that shows nothing new gives nothing).
    last: Option<String>,
    /// A signal came (or nothing was read yet) and no read has answered it.
    stale: bool,
    done: bool,
    reads: std::marker::PhantomData<fn() -> T>,
}

impl<T: Followed> RunFollower<T> {
    /// The run's reading when it differs from the last one given; `None` after the final one,
    /// or after an error (given once). Cancel-safe: a signal taken by a call that is dropped is
    /// answered by the next call.
    pub async fn next(&mut self) -> Option<Result<T, ServiceError>> {
        if self.done {
            return None;
        }
        loop {
            if !self.stale {
                self.watch.changed().await;
                self.stale = true;
            }
            let reading = match T::read(&self.service, &self.id).await {
                Ok(r) => r,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            };
            self.stale = false;
            let text = serde_json::to_string(&reading).ok();
            if text.is_some() && text == self.last {
                continue;
            }
            self.last = text;
            self.done = reading.run().status.is_final();
            return Some(Ok(reading));
        }
    }
}

/// Most jobs an error lists by name; past that, the closest name and how many there are.
const KNOWN_LISTED: usize = 20;

/// The jobs an error about `name` says exist: every name up to [`KNOWN_LISTED`]; past that,
/// how many, the closest to `name` and the first few (a million jobs do not make an error of
/// megabytes). `none` when there are none.
pub(crate) fn known_jobs<'a, I: Iterator<Item = &'a String>>(name: &str, names: impl Fn() -> I, none: &str) -> String {
    let total = names().count();
    if total == 0 {
        return none.to_owned();
    }
    if total <= KNOWN_LISTED {
        return names().map(String::as_str).collect::<Vec<_>>().join(", ");
    }
    let close = lamplighter_config::did_you_mean(name, names().map(String::as_str));
    let first: Vec<&str> = names().take(5).map(String::as_str).collect();
    format!("{total} jobs{close}, the first {} …; list_jobs (lampctl jobs list) lists them all", first.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unknown job's error lists the jobs there are while they are few, and past that says
    /// how many, the closest name and how to list them: not a megabyte for a million jobs.
    #[test]
    fn an_unknown_jobs_error_names_the_closest_of_many_not_every_one() {
        let few: Vec<String> = ["a", "b"].map(String::from).to_vec();
        assert_eq!(known_jobs("x", || few.iter(), "none"), "a, b");
        assert_eq!(known_jobs("x", || [].iter(), "none"), "none");
        let many: Vec<String> = (0..100_000).map(|i| format!("job-{i:06}")).collect();
        let known = known_jobs("job-004200x", || many.iter(), "none");
        assert!(known.starts_with("100000 jobs (did you mean \"job-004200\"?)"), "{known}");
        assert!(known.contains("job-000000, job-000001") && known.ends_with("lists them all"), "{known}");
        assert!(known.len() < 200, "{} bytes", known.len());
    }

    /// `get_job` shows an outcome past its window apart from the pending ones, and its job as
    /// waited for again: nothing runs for it.
    #[test]
    fn an_outcome_past_its_window_is_shown_expired_and_its_job_waited_for_again() {
        use lamplighter_config::{After, AfterOn};
        let after = After { jobs: vec!["a".into(), "b".into()], on: AfterOn::Success, within: Some(Duration::from_secs(60)) };
        let at = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0).expect("instant");
        let outcome = |job: &str, run: &str, ended: i64| crate::decide::PendingOutcome {
            upstream: job.into(),
            run_id: run.into(),
            status: RunStatus::Succeeded,
            output: None,
            finished_at: at(ended),
        };
        let view = after_view(&after, vec![outcome("a", "a1", 0), outcome("a", "a2", 100)], at(120));
        assert_eq!(view.expired.iter().map(|o| o.run_id.as_str()).collect::<Vec<_>>(), ["a1"]);
        assert_eq!(view.pending.iter().map(|o| o.run_id.as_str()).collect::<Vec<_>>(), ["a2"]);
        assert_eq!(view.pending[0].expires_at, Some(at(160)));
        assert_eq!(view.waiting_for, ["b"]);
        // Past its window, and past the time an end within it takes to be written.
        let view = after_view(&after, vec![outcome("a", "a1", 0)], at(62));
        assert_eq!((view.pending.len(), view.expired.len(), view.waiting_for.clone()), (0, 1, vec!["a".to_owned(), "b".to_owned()]));
    }
}
