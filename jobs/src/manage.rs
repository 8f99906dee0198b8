//! The job service's operations on job definitions: create, update and delete jobs at runtime
//! (stored in the database, scheduled by every worker from the moment they are committed), and
//! backfill a job's past ticks. Jobs of the config files are read-only here. Every operation
//! checks `worker.mcp.manage_jobs` first; every definition goes through the files' compiler
//! ([`crate::definitions::check_definition`]).

use chrono::{DateTime, Utc};
use lamplighter_config::{JobConfig, JsonText, Overlap};
pub use lamplighter_contract::{Backfill, BackfillTick, JobChange, JobDeleted, JobSaved};

use crate::definitions::{Change, ChangeRequest, Changed, JobChangeRecord, Refused, StoredJob, check_definition, decide_change};
use crate::in_force::JobsConfig;
use crate::run::{Owner, RunStatus, Trigger};
use crate::service::{JobService, ServiceError, preview_of, summary_in};
use crate::signals::Signal;
use crate::store::{Claim, NewRun, RunFilter};

/// A definition to save with [`JobService::create_job`] or [`JobService::update_job`].
#[derive(Debug, Clone)]
pub struct JobRequest {
    pub name: String,
    /// The job's entry as the files write it: an object, or YAML text.
    pub definition: serde_json::Value,
    /// `update_job`: the version the change was made from.
    pub expected_version: Option<u64>,
    /// Check and preview only.
    pub dry_run: bool,
    /// Who asks (recorded as `created_by`/`updated_by` and in the history).
    pub actor: String,
}

/// How many fire times a saved job's preview shows.
const PREVIEW_FIRES: usize = 10;

/// Ticks of a window a backfill looks at, at most: the bound on a window's size, whatever
/// share of its ticks already ran.
const BACKFILL_SCAN: usize = 100_000;

fn history_view(r: JobChangeRecord) -> JobChange {
    JobChange { version: r.version, action: r.action, actor: r.actor, at: r.at, before: r.before, after: r.after }
}

impl JobService {
    /// Whether this worker lets clients change jobs (`worker.mcp.manage_jobs.enabled`).
    pub fn manages_jobs(&self) -> bool {
        self.config.get().manage.enabled
    }

    fn managing(&self) -> Result<std::sync::Arc<JobsConfig>, ServiceError> {
        let config = self.config.get();
        if !config.manage.enabled {
            return Err(ServiceError::ManagementOff);
        }
        Ok(config)
    }

    /// Refuses a change to a job of the config files, saying where it is defined.
    fn not_from_files(config: &JobsConfig, name: &str) -> Result<(), ServiceError> {
        match config.locations.get(name) {
            Some(location) => Err(ServiceError::ReadOnly { name: name.to_owned(), location: location.map(|l| l.to_string()) }),
            None => Ok(()),
        }
    }

    /// Creates a job at runtime (see [`JobRequest`]); with `dry_run`, only says what would be
    /// saved.
    pub async fn create_job(&self, req: JobRequest) -> Result<JobSaved, ServiceError> {
        self.save_job(req, true).await
    }

    /// Replaces a runtime job's definition, whole.
    pub async fn update_job(&self, req: JobRequest) -> Result<JobSaved, ServiceError> {
        self.save_job(req, false).await
    }

    async fn save_job(&self, req: JobRequest, create: bool) -> Result<JobSaved, ServiceError> {
        let config = self.managing()?;
        Self::not_from_files(&config, &req.name)?;
        let registry = self.config.registry();
        let compiled = check_definition(&config.scope, registry, &config.manage, &req.name, &req.definition).and_then(|c| {
            // Jobs of a disabled workflow or agent would never run: refused as the files' are.
            match config.health.job_problem(&c.job, registry) {
                Some((field, crate::JobProblem::Unavailable { reason, .. })) => Err(vec![format!("{field}: {reason}")]),
                _ => Ok(c),
            }
        });
        // Its `after` among the jobs in force, with it in its new shape: every job named
        // exists, and no cycle goes through it.
        let compiled = compiled.and_then(|c| match c.job.after() {
            None => Ok(c),
            Some(after) => {
                let mistakes = lamplighter_config::after_mistakes(&req.name, after, &config.jobs);
                if mistakes.is_empty() { Ok(c) } else { Err(mistakes.into_iter().map(|m| format!("after: {m}")).collect()) }
            }
        });
        let compiled = compiled.map_err(|errors| ServiceError::InvalidDefinition { name: req.name.clone(), errors })?;
        let now = self.clock.now();
        let change = if create {
            Change::Create { definition: &compiled.definition, max_jobs: config.manage.max_jobs }
        } else {
            Change::Update { definition: &compiled.definition, expected: req.expected_version }
        };
        let (saved, stored) = if req.dry_run {
            // What the save would decide, from the facts as they are now.
            let current = self.definitions.runtime_job(&req.name).await?;
            let last = self.definitions.job_history(&req.name, 1).await?.first().map_or(0, |h| h.version);
            let version =
                decide_change(&change, current.as_ref(), last, config.runtime.len() as u64).map_err(|r| self.refused(&req.name, r))?;
            let stored = StoredJob {
                name: req.name.clone(),
                definition: compiled.definition.clone(),
                version,
                created_by: current.as_ref().map_or_else(|| req.actor.clone(), |c| c.created_by.clone()),
                created_at: current.as_ref().map_or(now, |c| c.created_at),
                updated_by: req.actor.clone(),
                updated_at: now,
            };
            (false, stored)
        } else {
            let request = ChangeRequest { name: &req.name, change, actor: &req.actor };
            match self.definitions.change_job(&request, now).await? {
                Ok(Changed::Saved(stored)) => {
                    self.apply_runtime_job(&req.name, Some(stored.clone()));
                    tracing::info!(job = %req.name, version = stored.version, actor = %req.actor, "job {}", if create { "created" } else { "updated" });
                    (true, stored)
                }
                Ok(Changed::Deleted { .. }) => unreachable!("a save saves"),
                Err(r) => return Err(self.refused(&req.name, r)),
            }
        };
        let job = crate::definitions::bounded(compiled.job, &config.manage, &config.data_dir);
        let mut view_config = JobsConfig::clone(&config);
        view_config.runtime = imbl::OrdMap::unit(req.name.clone(), stored.clone());
        let state = self.states.job_state(&req.name).await?;
        Ok(JobSaved {
            name: req.name,
            saved,
            version: stored.version,
            definition: stored.definition,
            preview: job.schedule.as_deref().map(|s| preview_of(s, now, PREVIEW_FIRES)),
            job: summary_in(&view_config, &job, Some(&state), None, now),
            warnings: compiled.warnings,
        })
    }

    fn refused(&self, name: &str, r: Refused) -> ServiceError {
        ServiceError::Conflict(match r {
            Refused::Exists { version } => {
                format!("runtime job \"{name}\" already exists (version {version}); change it with update_job, or pick another name")
            }
            Refused::Missing => return self.no_runtime_job(name),
            Refused::Stale { expected, current } => format!(
                "runtime job \"{name}\" is at version {current}, not {expected}: it changed since it was read; read it again (get_job) and retry with expected_version {current}"
            ),
            Refused::Full { max } => format!(
                "there are already {max} runtime jobs, the most worker.mcp.manage_jobs.max_jobs allows; delete one or raise the limit"
            ),
        })
    }

    fn no_runtime_job(&self, name: &str) -> ServiceError {
        let jobs = self.config.get();
        let known = crate::service::known_jobs(name, || jobs.runtime.keys(), "");
        ServiceError::JobNotFound {
            name: name.to_owned(),
            known: if known.is_empty() { "no runtime jobs".into() } else { format!("runtime jobs: {known}") },
        }
    }

    /// Deletes a runtime job: it stops firing on every worker; its runs and history stay. Runs
    /// in flight finish, unless `cancel_runs`.
    pub async fn delete_job(
        &self,
        name: &str,
        expected_version: Option<u64>,
        cancel_runs: bool,
        actor: &str,
    ) -> Result<JobDeleted, ServiceError> {
        let config = self.managing()?;
        // A runtime job the files took the name of (at a restart, or a reload on another
        // worker) is shadowed by the files' job; it can still be deleted.
        if config.locations.contains(name) && self.definitions.runtime_job(name).await?.is_none() {
            Self::not_from_files(&config, name)?;
        }
        let now = self.clock.now();
        let request = ChangeRequest { name, change: Change::Delete { expected: expected_version }, actor };
        let version = match self.definitions.change_job(&request, now).await? {
            Ok(Changed::Deleted { version }) => version,
            Ok(Changed::Saved(_)) => unreachable!("a delete deletes"),
            Err(r) => return Err(self.refused(name, r)),
        };
        self.apply_runtime_job(name, None);
        tracing::info!(job = %name, version, actor = %actor, cancel_runs, "job deleted");
        let mut cancelled_runs = Vec::new();
        if cancel_runs {
            let why = format!("its job \"{name}\" was deleted by {actor}");
            for status in [RunStatus::Queued, RunStatus::Running, RunStatus::WaitingApproval] {
                let filter = RunFilter { job: Some(name.to_owned()), status: Some(status), limit: Some(10_000), before: None };
                for run in self.listings.list_runs(&filter).await? {
                    if self.executor.stop_run(&run.id, why.clone(), now).await {
                        cancelled_runs.push(run.id);
                    }
                }
            }
        }
        Ok(JobDeleted { name: name.to_owned(), version, cancelled_runs })
    }

    /// A runtime job's changes, newest first; `limit` at most.
    pub(crate) async fn job_history(&self, name: &str, limit: usize) -> Result<Vec<JobChange>, ServiceError> {
        Ok(self.definitions.job_history(name, limit).await?.into_iter().map(history_view).collect())
    }

    /// Runs a job's ticks in `from..=to` that have no run yet, in order and one at a time (the
    /// tick keys make each run once, whoever else fires or backfills them); with `dry_run`,
    /// lists them. At most `worker.mcp.manage_jobs.max_backfill` runs.
    pub async fn backfill_job(&self, name: &str, from: DateTime<Utc>, to: DateTime<Utc>, dry_run: bool) -> Result<Backfill, ServiceError> {
        let config = self.managing()?;
        let job = self.job_or_err(name)?;
        if let Some(reason) = config.unavailable.get(name) {
            return Err(ServiceError::JobDisabled { name: name.to_owned(), reason: reason.clone() });
        }
        let Some(schedule) = job.schedule.clone() else {
            return Err(ServiceError::InvalidArgument(format!(
                "job \"{name}\" has no schedule, so no ticks to backfill; trigger it instead"
            )));
        };
        let now = self.clock.now();
        if from > to {
            return Err(ServiceError::InvalidArgument(format!("from ({from}) is after to ({to})")));
        }
        if to > now {
            return Err(ServiceError::InvalidArgument(format!(
                "to ({to}) is in the future; a backfill runs past ticks only (now is {now})"
            )));
        }
        if self.states.job_state(name).await?.paused {
            return Err(ServiceError::Conflict(format!(
                "job \"{name}\" is paused: its backfilled ticks would be recorded as skipped; resume it first (lampctl jobs resume {name})"
            )));
        }
        // Older than what retention keeps, a tick's run may have been deleted: whether it ran
        // cannot be told, and it must not run twice.
        if let Some(horizon) = self.retention_horizon(&job, now).await?
            && from < horizon
        {
            return Err(ServiceError::InvalidArgument(format!(
                "the window starts before what job \"{name}\"'s retention keeps (runs older than {} may have been deleted, so whether their ticks ran cannot be told); start it at or after that",
                horizon.to_rfc3339()
            )));
        }
        let mut ticks = Vec::new();
        let mut t = from - chrono::Duration::milliseconds(1);
        while let Some(next) = schedule.next_after(t).filter(|n| *n <= to) {
            if ticks.len() == BACKFILL_SCAN {
                return Err(ServiceError::InvalidArgument(format!(
                    "the window has more than {BACKFILL_SCAN} ticks of job \"{name}\"; narrow it"
                )));
            }
            ticks.push(next);
            t = next;
        }
        let existing = self.ticks.ticks_with_runs(name, from, to).await?;
        let new: Vec<DateTime<Utc>> = ticks.iter().copied().filter(|t| !existing.contains(&t.timestamp_millis())).collect();
        let max = config.manage.max_backfill as usize;
        if new.len() > max {
            return Err(ServiceError::InvalidArgument(format!(
                "the window holds {} ticks of job \"{name}\" without a run, more than the {max} worker.mcp.manage_jobs.max_backfill allows; narrow it (the first is {}, the last {})",
                new.len(),
                new[0].to_rfc3339(),
                new[new.len() - 1].to_rfc3339()
            )));
        }
        let mut runs: std::collections::HashMap<i64, Option<String>> = std::collections::HashMap::new();
        if !dry_run && !new.is_empty() {
            // The backfilled ticks are older than now: a job that never fired would otherwise
            // look as if its ticks since the newest of them were missed, and catch up.
            if self.states.job_state(name).await?.last_tick.is_none() {
                self.states.set_last_tick(name, now).await?;
            }
            let snapshot = config.snapshot_of(&job);
            // Due now, all of them: they go in id order (ids sort by creation, and are made in
            // tick order), each held until the one before it ends.
            let batch: Vec<(NewRun, Overlap)> =
                new.iter().map(|tick| (self.backfill_run(&job, &snapshot, *tick, now), Overlap::Queue)).collect();
            let outcomes = self.ticks.fire_ticks(batch, Claim { worker: &self.worker.name, slots: 0 }, now).await?;
            let mut pushed = false;
            for (tick, outcome) in new.iter().zip(outcomes) {
                if let Some(o) = &outcome {
                    self.observer.run_created(&Owner::Job(name.to_string()), Trigger::Backfill, &o.run_id);
                    pushed |= o.pushed;
                }
                runs.insert(tick.timestamp_millis(), outcome.map(|o| o.run_id));
            }
            self.signal(Signal::RunsChanged);
            if pushed {
                self.signal(Signal::TasksPushed);
            }
            // The rest are held until the one before them ends.
            self.signal(Signal::Wake);
            tracing::info!(job = %name, runs = runs.values().flatten().count(), %from, %to, "job backfilled");
        }
        let ticks: Vec<BackfillTick> = ticks
            .into_iter()
            .map(|t| {
                let ms = t.timestamp_millis();
                // A tick another caller recorded between the read and the write ran once, there.
                let run_id = runs.get(&ms).cloned().flatten();
                let existing = existing.contains(&ms) || (!dry_run && runs.get(&ms).is_some_and(Option::is_none));
                BackfillTick { scheduled_at: t, local: t.with_timezone(&schedule.timezone()).to_rfc3339(), run_id, existing }
            })
            .collect();
        let created = if dry_run { new.len() } else { ticks.iter().filter(|t| t.run_id.is_some()).count() };
        Ok(Backfill { name: name.to_owned(), dry_run, ticks, created })
    }

    /// The oldest instant a job's runs are all still kept from, when retention may have deleted
    /// older ones: `max_age` ago, or the oldest run kept once `max_runs` are there.
    async fn retention_horizon(&self, job: &JobConfig, now: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, ServiceError> {
        let by_age = job.retention.max_age.and_then(|a| chrono::Duration::from_std(a).ok()).map(|a| now - a);
        let by_count = match job.retention.max_runs {
            Some(max) => match self.ticks.run_span(&job.name).await? {
                (n, Some(oldest)) if n >= u64::from(max) => Some(oldest),
                _ => None,
            },
            None => None,
        };
        Ok(by_age.into_iter().chain(by_count).max())
    }

    fn backfill_run(&self, job: &JobConfig, snapshot: &crate::snapshot::JobSnapshot, tick: DateTime<Utc>, due: DateTime<Utc>) -> NewRun {
        NewRun {
            owner: Owner::Job(job.name.clone()),
            trigger: Trigger::Backfill,
            status: RunStatus::Queued,
            scheduled_at: Some(tick),
            due_at: due,
            attempt: 1,
            input: job.input.as_deref().cloned(),
            parameters: job.parameters.as_ref().map(JsonText::value),
            error: None,
            idempotency_key: None,
            retry_of: None,
            root_id: None,
            snapshot: Some(snapshot.clone()),
            requested_by: None,
            // A backfill's runs go one at a time, in tick order.
            in_line: false,
        }
    }
}
