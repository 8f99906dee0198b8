//! The config in force: the part of the config the run core needs ([`JobsConfig`]), swapped
//! whole on reload ([`InForce`]). A reader takes one snapshot and works from it, so one pass or
//! one run never sees two configs.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use lamplighter_config::{Config, JobConfig, RetryPolicy, Workflow};

use lamplighter_plugins::Registry;

use crate::catalog::Catalog;
use crate::listing::Listing;
use crate::snapshot::JobSnapshot;

/// Runs of a workflow started by hand (`run_workflow`), not by a job, are recorded under the
/// job name `workflow:<name>` (a prefix config refuses in job names). They have a job's default
/// policies: the default retry policy, no retention limit.
pub(crate) const WORKFLOW_RUNS: &str = "workflow:";

/// The part of the config the engine needs.
#[derive(Debug, Clone)]
pub(crate) struct JobsConfig {
    pub(crate) jobs: Arc<BTreeMap<String, JobConfig>>,
    pub(crate) workflows: Arc<BTreeMap<String, Arc<Workflow>>>,
    /// Jobs the environment broke (e.g. their plugin did not load), with the reason: not
    /// scheduled, not triggerable, shown with the reason.
    pub(crate) unavailable: Arc<HashMap<String, String>>,
    pub(crate) data_dir: PathBuf,
    /// Agents, providers, pipelines and MCP servers, for the agent runner.
    pub(crate) agents: Arc<Catalog>,
    /// What the catalog listings show.
    pub(crate) listing: Arc<Listing>,
    /// The zone of a schedule that names none (`scheduling.timezone`).
    pub(crate) default_timezone: String,
}

impl JobsConfig {
    pub(crate) fn of(config: &Config, registry: &Registry) -> Self {
        // The worker records them as `Disabled::Job` in the config's disabled items.
        let unavailable = config
            .disabled
            .iter()
            .filter_map(|(what, why)| Some((what.job()?.to_owned(), why.clone())))
            .filter(|(name, _)| config.jobs.contains_key(name))
            .collect();
        Self {
            jobs: Arc::new(config.jobs.clone()),
            workflows: Arc::new(config.workflows.iter().map(|(k, w)| (k.clone(), Arc::new(w.clone()))).collect()),
            unavailable: Arc::new(unavailable),
            data_dir: config.data_dir.clone(),
            agents: Arc::new(Catalog::of(config)),
            listing: Arc::new(Listing::of(config, registry)),
            default_timezone: config.default_timezone.clone(),
        }
    }

    /// What a run of `job` executes, as it is now (its workflow's definition included).
    pub(crate) fn snapshot_of(&self, job: &JobConfig) -> JobSnapshot {
        let workflow = match &job.target {
            lamplighter_config::Target::Workflow(w) => self.workflows.get(w),
            _ => None,
        };
        JobSnapshot::of(job, workflow)
    }

    /// The retry policy of runs recorded under `job`: the job's, the default for workflows run
    /// by hand, none for a job that is no longer defined (its runs are not retried).
    pub(crate) fn retries_for(&self, job: &str) -> Option<RetryPolicy> {
        match self.jobs.get(job) {
            Some(j) => Some(j.retries.clone()),
            None => job.strip_prefix(WORKFLOW_RUNS).and_then(|w| self.workflows.get(w)).map(|_| RetryPolicy::default()),
        }
    }
}

/// The config in force, swapped whole on reload. The lock guards a pointer swap only and is
/// never held across `.await`.
#[derive(Debug)]
pub(crate) struct InForce(RwLock<Arc<JobsConfig>>);

impl InForce {
    pub(crate) fn new(config: JobsConfig) -> Self {
        Self(RwLock::new(Arc::new(config)))
    }

    /// The config in force now, whole.
    pub(crate) fn get(&self) -> Arc<JobsConfig> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn set(&self, config: JobsConfig) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }

    pub(crate) fn jobs(&self) -> Arc<BTreeMap<String, JobConfig>> {
        self.get().jobs.clone()
    }

    pub(crate) fn job(&self, name: &str) -> Option<JobConfig> {
        self.get().jobs.get(name).cloned()
    }

    pub(crate) fn workflow(&self, name: &str) -> Option<Arc<Workflow>> {
        self.get().workflows.get(name).cloned()
    }
}
