//! The job service: the operations a person needs (list, inspect, pause, resume, trigger,
//! follow and cancel runs), with typed results and errors that name the job. The MCP layer
//! wraps these one to one; nothing here knows about the wire.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use lamplighter_config::JobConfig;

use crate::engine::Engine;
use crate::run::{Run, RunStatus, Trigger};
use crate::signals::Signal;
use crate::store::{NewRun, RunFilter, StoreError};
use crate::target::JobSnapshot;

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
    #[error("{0}")]
    InvalidArgument(String),
    #[error(transparent)]
    Storage(#[from] StoreError),
}

/// A job as listings show it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
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
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct FireTime {
    pub utc: DateTime<Utc>,
    /// RFC 3339 in the job's time zone.
    pub local: String,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct JobDetail {
    #[serde(flatten)]
    pub summary: JobSummary,
    pub next_fires: Vec<FireTime>,
    pub counts: BTreeMap<String, u64>,
    pub recent_runs: Vec<RunBrief>,
    pub catch_up: String,
    pub overlap: String,
    pub timeout_seconds: Option<u64>,
    pub max_retries: u32,
}

/// A manual trigger's options.
#[derive(Debug, Clone, Default)]
pub struct TriggerRequest {
    pub input: Option<serde_json::Value>,
    pub parameters: Option<serde_json::Value>,
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Triggered {
    pub run_id: String,
    /// False when the idempotency key matched an earlier trigger (its run is returned).
    pub created: bool,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct JobPage {
    pub jobs: Vec<JobSummary>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct RunPage {
    pub runs: Vec<Run>,
    /// Pass as `before` to get the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct WorkerStatus {
    pub worker: String,
    pub version: String,
    pub started_at: DateTime<Utc>,
    pub uptime_seconds: i64,
    pub jobs: usize,
    pub running: usize,
    pub queue_depth: u64,
    pub storage: String,
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

impl Engine {
    fn job_or_err(&self, name: &str) -> Result<JobConfig, ServiceError> {
        self.shared.job(name).ok_or_else(|| ServiceError::JobNotFound {
            name: name.to_string(),
            known: {
                let jobs = self.shared.jobs();
                if jobs.is_empty() { "none".into() } else { jobs.keys().cloned().collect::<Vec<_>>().join(", ") }
            },
        })
    }

    fn summary(&self, job: &JobConfig, state: Option<&crate::store::JobState>, last: Option<&Run>, now: DateTime<Utc>) -> JobSummary {
        let paused = state.is_some_and(|s| s.paused);
        let disabled = self.shared.snapshot().unavailable.get(&job.name).cloned();
        let next_fire =
            if job.enabled && !paused && disabled.is_none() { job.schedule.as_ref().and_then(|s| s.next_after(now)) } else { None };
        JobSummary {
            name: job.name.clone(),
            description: job.description.clone(),
            target_type: job.target.kind().to_string(),
            target: job.target.describe(),
            schedule: job.schedule.as_ref().map(|s| s.spec().to_string()),
            timezone: job.timezone.clone(),
            enabled: job.enabled,
            disabled,
            paused,
            pause_reason: state.and_then(|s| s.pause_reason.clone()),
            paused_at: state.and_then(|s| s.paused_at),
            next_fire,
            last_run: last.map(RunBrief::from),
        }
    }

    /// Every configured job, by name.
    pub async fn list_jobs(&self) -> Result<Vec<JobSummary>, ServiceError> {
        Ok(self.list_jobs_page(None, usize::MAX).await?.jobs)
    }

    /// Jobs by name, `limit` at a time, starting after the job named `after` (the previous
    /// page's `next_cursor`).
    pub async fn list_jobs_page(&self, after: Option<&str>, limit: usize) -> Result<JobPage, ServiceError> {
        let states = self.shared.store().job_states().await?;
        let last = self.shared.store().last_runs().await?;
        let now = self.shared.clock().now();
        let snapshot = self.shared.snapshot();
        let jobs = &snapshot.jobs;
        let start = match after {
            Some(a) => std::ops::Bound::Excluded(a.to_string()),
            None => std::ops::Bound::Unbounded,
        };
        let mut page: Vec<JobSummary> = Vec::new();
        let mut more = false;
        for j in jobs.range::<String, _>((start, std::ops::Bound::Unbounded)).map(|(_, j)| j) {
            if page.len() == limit {
                more = true;
                break;
            }
            page.push(self.summary(j, states.get(&j.name), last.get(&j.name), now));
        }
        let next_cursor = if more { page.last().map(|j| j.name.clone()) } else { None };
        Ok(JobPage { jobs: page, next_cursor })
    }

    /// One job with its next `n` fire times, run counts by status and recent runs.
    pub async fn get_job(&self, name: &str, n: usize) -> Result<JobDetail, ServiceError> {
        let job = self.job_or_err(name)?;
        let state = self.shared.store().job_state(name).await?;
        let recent =
            self.shared.store().list_runs(&RunFilter { job: Some(name.to_string()), limit: Some(10), ..Default::default() }).await?;
        let counts = self.shared.store().counts(name).await?.into_iter().map(|(k, v)| (k.as_str().to_string(), v)).collect();
        let now = self.shared.clock().now();
        let next_fires = self.next_fires(&job, now, n.clamp(1, 100));
        let summary = self.summary(&job, Some(&state), recent.first(), now);
        Ok(JobDetail {
            summary,
            next_fires,
            counts,
            recent_runs: recent.iter().map(RunBrief::from).collect(),
            catch_up: format!("{:?}", job.catch_up).to_lowercase(),
            overlap: format!("{:?}", job.overlap).to_lowercase(),
            timeout_seconds: job.timeout.map(|t| t.as_secs()),
            max_retries: job.retries.max,
        })
    }

    /// The next `n` fire times of a job (whether or not it is paused).
    pub fn next_fire_times(&self, name: &str, n: usize) -> Result<Vec<FireTime>, ServiceError> {
        let job = self.job_or_err(name)?;
        Ok(self.next_fires(&job, self.shared.clock().now(), n.clamp(1, 1000)))
    }

    fn next_fires(&self, job: &JobConfig, now: DateTime<Utc>, n: usize) -> Vec<FireTime> {
        let Some(s) = &job.schedule else {
            return Vec::new();
        };
        let tz = s.timezone();
        s.upcoming(now, n).into_iter().map(|t| FireTime { utc: t, local: t.with_timezone(&tz).to_rfc3339() }).collect()
    }

    /// Pauses a job; persisted, survives restarts. Pausing a paused job updates the reason.
    pub async fn pause_job(&self, name: &str, reason: Option<&str>) -> Result<JobSummary, ServiceError> {
        self.job_or_err(name)?;
        self.shared.store().set_paused(name, true, reason, self.shared.clock().now()).await?;
        self.shared.job_changed();
        tracing::info!(job = name, reason = reason.unwrap_or(""), "job paused");
        self.summary_of(name).await
    }

    /// Resumes a job. Ticks missed while paused are not caught up.
    pub async fn resume_job(&self, name: &str) -> Result<JobSummary, ServiceError> {
        self.job_or_err(name)?;
        let now = self.shared.clock().now();
        self.shared.store().set_paused(name, false, None, now).await?;
        self.shared.store().set_last_tick(name, now).await?;
        self.shared.job_changed();
        tracing::info!(job = name, "job resumed");
        self.summary_of(name).await
    }

    async fn summary_of(&self, name: &str) -> Result<JobSummary, ServiceError> {
        let job = self.job_or_err(name)?;
        let state = self.shared.store().job_state(name).await?;
        let last = self.shared.store().list_runs(&RunFilter { job: Some(name.into()), limit: Some(1), ..Default::default() }).await?;
        Ok(self.summary(&job, Some(&state), last.first(), self.shared.clock().now()))
    }

    /// Starts a run now, paused or not. Returns at once with the run id.
    pub async fn trigger_job(&self, name: &str, req: TriggerRequest) -> Result<Triggered, ServiceError> {
        let job = self.job_or_err(name)?;
        if let Some(reason) = self.shared.snapshot().unavailable.get(name) {
            return Err(ServiceError::JobDisabled { name: name.to_string(), reason: reason.clone() });
        }
        if let Some(k) = &req.idempotency_key
            && (k.is_empty() || k.len() > 200)
        {
            return Err(ServiceError::InvalidArgument("idempotency key must be 1–200 characters".into()));
        }
        if let Some(p) = &req.parameters
            && !p.is_object()
        {
            return Err(ServiceError::InvalidArgument(format!("parameters for job \"{name}\" must be an object of name → value")));
        }
        let now = self.shared.clock().now();
        let snapshot = JobSnapshot::of(&job);
        let run = NewRun {
            job: name.to_string(),
            trigger: Trigger::Manual,
            status: RunStatus::Queued,
            scheduled_at: None,
            due_at: now,
            attempt: 1,
            input: req.input.or(job.input),
            parameters: merge_parameters(job.parameters, req.parameters),
            error: None,
            idempotency_key: req.idempotency_key,
            retry_of: None,
            root_id: None,
            snapshot: Some(snapshot),
        };
        let (run_id, created) = self.shared.store().insert_run(run, now).await?;
        if created && crate::scheduler::dispatch_due(&self.shared, now).await {
            self.shared.wake_scheduler();
        }
        Ok(Triggered { run_id, created })
    }

    /// Waits until a run reaches a final status (or `timeout` passes) and returns it.
    pub async fn wait_run(&self, id: &str, timeout: Option<Duration>) -> Result<Run, ServiceError> {
        let mut rx = self.shared.subscribe();
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            let run = self.get_run(id).await?;
            if run.status.is_final() {
                return Ok(run);
            }
            let recv = async {
                loop {
                    match rx.recv().await {
                        Some(Signal::RunFinished(done)) if done == id => return,
                        Some(Signal::Lagged) => return,
                        Some(_) => {}
                        None => std::future::pending::<()>().await,
                    }
                }
            };
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d, recv).await.is_err() {
                        return self.get_run(id).await;
                    }
                }
                None => recv.await,
            }
        }
    }

    pub async fn list_runs(&self, filter: RunFilter) -> Result<RunPage, ServiceError> {
        if let Some(j) = &filter.job
            && self.shared.job(j).is_none()
        {
            // Runs of a removed job are still listed when they exist.
            let any = self.shared.store().list_runs(&RunFilter { job: Some(j.clone()), limit: Some(1), ..Default::default() }).await?;
            if any.is_empty() {
                self.job_or_err(j)?;
            }
        }
        let limit = filter.limit.unwrap_or(50).clamp(1, 1000);
        let runs = self.shared.store().list_runs(&RunFilter { limit: Some(limit), ..filter }).await?;
        let next_cursor = (runs.len() as u32 == limit).then(|| runs.last().map(|r| r.id.clone())).flatten();
        Ok(RunPage { runs, next_cursor })
    }

    pub async fn get_run(&self, id: &str) -> Result<Run, ServiceError> {
        self.shared.store().get_run(id).await?.ok_or_else(|| ServiceError::RunNotFound { id: id.to_string() })
    }

    /// Cancels a queued or running run.
    pub async fn cancel_run(&self, id: &str) -> Result<Run, ServiceError> {
        let run = self.get_run(id).await?;
        if run.status.is_final() {
            return Err(ServiceError::NotCancellable { id: id.to_string(), status: run.status });
        }
        let now = self.shared.clock().now();
        if self.shared.stop_run(id, "cancelled by request".into(), now).await {
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
        let now = self.shared.clock().now();
        Ok(WorkerStatus {
            worker: self.shared.worker_name().to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: self.shared.started_at(),
            uptime_seconds: (now - self.shared.started_at()).num_seconds(),
            jobs: self.shared.jobs().len(),
            running: self.running_count(),
            queue_depth: self.shared.store().queue_depth().await?,
            storage: "sqlite".into(),
        })
    }
}
