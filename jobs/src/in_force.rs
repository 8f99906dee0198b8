//! The config in force: the part of the config the run core needs ([`JobsConfig`]), made of
//! the files' config and the jobs defined at runtime, and swapped whole when either changes
//! ([`InForce`]). A reader takes one snapshot and works from it, so one pass or one run never
//! sees two configs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use lamplighter_config::{Config, ItemLocations, JobConfig, JobScope, ManageJobs, NotifyOn, NotifyRule, RetryPolicy, Workflow};

use lamplighter_plugins::Registry;

use crate::catalog::Catalog;
use crate::definitions::{StoredJob, bounded, runtime_problems};
use crate::listing::Listing;
use crate::reaper::Reaper;
use crate::run::Owner;
use crate::snapshot::JobSnapshot;
use crate::{Checked, Health, JobProblem};

/// The jobs in force, by name: the files' (shared with the loaded config, never copied) and the
/// runtime ones (a persistent map: a change copies the path to its entry, not the map, so a
/// create among 100,000 runtime jobs costs what it costs among ten). Their names are apart: a
/// runtime job whose name the files take is left out.
#[derive(Debug, Clone, Default)]
pub(crate) struct JobMap {
    files: Arc<BTreeMap<String, JobConfig>>,
    runtime: imbl::OrdMap<String, JobConfig>,
}

impl JobMap {
    fn of_files(files: Arc<BTreeMap<String, JobConfig>>) -> Self {
        Self { files, runtime: imbl::OrdMap::new() }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&JobConfig> {
        self.files.get(name).or_else(|| self.runtime.get(name))
    }

    pub(crate) fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub(crate) fn len(&self) -> usize {
        self.files.len() + self.runtime.len()
    }

    /// Every job, in name order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &JobConfig)> {
        Merged { a: self.files.iter().peekable(), b: self.runtime.iter().peekable() }
    }

    /// The jobs named after `after` (all with `None`), in name order.
    pub(crate) fn after(&self, after: Option<&str>) -> impl Iterator<Item = (&String, &JobConfig)> {
        use std::ops::Bound::{Excluded, Unbounded};
        let from = || after.map_or(Unbounded, |a| Excluded(a.to_owned()));
        Merged { a: self.files.range::<String, _>((from(), Unbounded)).peekable(), b: self.runtime.range((from(), Unbounded)).peekable() }
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &String> {
        self.iter().map(|(k, _)| k)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &JobConfig> {
        self.iter().map(|(_, v)| v)
    }

    /// Whether `other` is this very set (not a copy that may differ).
    pub(crate) fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.files, &other.files) && self.runtime.ptr_eq(&other.runtime)
    }
}

impl lamplighter_config::JobsByName for JobMap {
    fn job(&self, name: &str) -> Option<&JobConfig> {
        self.get(name)
    }

    fn names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        Box::new(self.keys().map(String::as_str))
    }
}

/// Two iterators in name order, their names apart, as one in name order.
struct Merged<'a, A: Iterator<Item = (&'a String, &'a JobConfig)>, B: Iterator<Item = (&'a String, &'a JobConfig)>> {
    a: std::iter::Peekable<A>,
    b: std::iter::Peekable<B>,
}

impl<'a, A: Iterator<Item = (&'a String, &'a JobConfig)>, B: Iterator<Item = (&'a String, &'a JobConfig)>> Iterator for Merged<'a, A, B> {
    type Item = (&'a String, &'a JobConfig);

    fn next(&mut self) -> Option<Self::Item> {
        match (self.a.peek(), self.b.peek()) {
            (Some((x, _)), Some((y, _))) if y < x => self.b.next(),
            (Some(_), _) => self.a.next(),
            (None, _) => self.b.next(),
        }
    }
}

/// The part of the config the engine needs.
#[derive(Debug, Clone)]
pub(crate) struct JobsConfig {
    pub(crate) jobs: JobMap,
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
    /// Where each job of the files is defined (`file:line:col`).
    pub(crate) locations: Arc<ItemLocations>,
    /// The jobs defined at runtime, as stored (those that no longer compile included).
    pub(crate) runtime: imbl::OrdMap<String, StoredJob>,
    /// What a runtime job is compiled against.
    pub(crate) scope: Arc<JobScope>,
    /// `worker.mcp.manage_jobs`.
    pub(crate) manage: Arc<ManageJobs>,
    /// What cannot run here, for runtime jobs' checks.
    pub(crate) health: Arc<Health>,
    /// `scheduling.notify`: the rules of jobs that set none.
    pub(crate) notify: Arc<Vec<NotifyRule>>,
    /// `scheduling.limits`: each limit's slots, by name.
    pub(crate) limits: Arc<crate::limits::Sizes>,
    /// The jobs that run `after` each job (enabled and able to run here), by upstream name.
    downstream: Arc<HashMap<String, Vec<String>>>,
    /// Whether any rule is about waits for a decision: known once the jobs are put together,
    /// as the notifier asks on each pass (after runs end) and the answer walks every job.
    notifies_waits: bool,
}

/// The jobs that run after each job, by upstream name: those enabled and not unavailable.
fn downstream_of(jobs: &BTreeMap<String, JobConfig>, unavailable: &HashMap<String, String>) -> HashMap<String, Vec<String>> {
    let mut index = HashMap::new();
    add_downstream(&mut index, jobs.values(), unavailable);
    index
}

/// Adds `jobs` (those enabled and not unavailable) to the index of who runs after whom.
fn add_downstream<'a>(
    index: &mut HashMap<String, Vec<String>>,
    jobs: impl Iterator<Item = &'a JobConfig>,
    unavailable: &HashMap<String, String>,
) {
    for job in jobs.filter(|j| j.enabled && !unavailable.contains_key(&j.name)) {
        for up in job.after().map(|a| a.jobs.as_slice()).unwrap_or_default() {
            index.entry(up.clone()).or_default().push(job.name.clone());
        }
    }
}

/// Whether any of these rules, the default ones or a job's own, is about waits for a decision.
fn about_waits(default: &[NotifyRule], jobs: &BTreeMap<String, JobConfig>) -> bool {
    rules_about_waits(default) || jobs.values().any(|j| j.notify.as_deref().is_some_and(rules_about_waits))
}

fn rules_about_waits(rules: &[NotifyRule]) -> bool {
    rules.iter().any(|r| matches!(r.on, NotifyOn::ApprovalWaiting | NotifyOn::BudgetAsked))
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
        let downstream = downstream_of(&config.jobs, &unavailable);
        let locations = config.sources.item_locations(&["scheduling", "jobs"], config.jobs.keys());
        Self {
            locations: Arc::new(locations),
            runtime: imbl::OrdMap::new(),
            scope: Arc::new(JobScope::of(config)),
            manage: Arc::new(config.worker.manage_jobs.clone()),
            health: Arc::new(crate::health(config, registry, &mut Checked::default())),
            jobs: JobMap::of_files(config.jobs.clone()),
            workflows: Arc::new(config.workflows.iter().map(|(k, w)| (k.clone(), Arc::new(w.clone()))).collect()),
            unavailable: Arc::new(unavailable),
            data_dir: config.data_dir.clone(),
            agents: Arc::new(Catalog::of(config)),
            listing: Arc::new(Listing::of(config, registry)),
            default_timezone: config.default_timezone.clone(),
            notify: Arc::new(config.notify.clone()),
            limits: Arc::new(config.limits.clone()),
            notifies_waits: about_waits(&config.notify, &config.jobs),
            downstream: Arc::new(downstream),
        }
    }

    /// The jobs that run after `job`, each with the run it would start now (queued, trigger
    /// `after`, its snapshot, input and parameters).
    pub(crate) fn downstream(&self, job: &str, now: chrono::DateTime<chrono::Utc>) -> Vec<crate::store::Downstream> {
        let names = self.downstream.get(job).map(Vec::as_slice).unwrap_or_default();
        names
            .iter()
            .filter_map(|name| self.jobs.get(name))
            .filter_map(|j| {
                let after = j.after()?.clone();
                let run = crate::intake::NewRun {
                    input: j.input.as_deref().cloned(),
                    parameters: j.parameters.as_ref().map(lamplighter_config::JsonText::value),
                    in_line: j.overlap != lamplighter_config::Overlap::Queue,
                    ..crate::intake::NewRun::asked(Owner::Job(j.name.clone()), crate::run::Trigger::After, self.snapshot_of(j), now)
                };
                Some(crate::store::Downstream { after, run })
            })
            .collect()
    }

    /// The jobs that run after `job`, by name.
    pub(crate) fn downstream_names(&self, job: &str) -> Vec<String> {
        self.downstream.get(job).cloned().unwrap_or_default()
    }

    /// The `notify:` rules of runs recorded under `job`; `None` when it is no job's (a
    /// workflow or agent run by hand, a run a notification started).
    pub(crate) fn notify_rules(&self, job: &str) -> Option<Vec<NotifyRule>> {
        let job = self.jobs.get(job)?;
        Some(job.notify.clone().unwrap_or_else(|| self.notify.to_vec()))
    }

    /// Whether the end of `owner`'s run with `status` is also its outcome's notice
    /// ([`crate::decide::noticed_at_end`], by the rules and the jobs run after it in force).
    pub(crate) fn noticed_at_end(&self, owner: &Owner, status: crate::run::RunStatus) -> bool {
        let Owner::Job(name) = owner else { return false };
        let rules = self.jobs.get(name).map(|j| j.notify.as_deref().unwrap_or(self.notify.as_slice()));
        crate::decide::noticed_at_end(status, rules, self.downstream.get(name).is_some_and(|d| !d.is_empty()))
    }

    /// Whether any rule is about waits for a decision (a notice pass then reads the waits).
    pub(crate) fn notifies_waits(&self) -> bool {
        self.notifies_waits
    }

    /// What a run of `job` executes, as it is now (its workflow's definition included).
    pub(crate) fn snapshot_of(&self, job: &JobConfig) -> JobSnapshot {
        let workflow = match &job.target {
            lamplighter_config::Target::Workflow(w) => self.workflows.get(w),
            _ => None,
        };
        JobSnapshot::of(job, workflow)
    }

    /// The retry policy of `owner`'s runs: its job's; the default for runs without a job (a
    /// workflow, agent, pipeline or group chat run by hand, a run a notification started) while
    /// what they run is defined; none for a job that is no longer defined (its runs are not
    /// retried). Recovery after a crash goes by it too.
    pub(crate) fn retries_for(&self, owner: &Owner) -> Option<RetryPolicy> {
        let agent = |a: &String| self.agents.agents.contains_key(a);
        let defined = match owner {
            Owner::Job(name) => return self.jobs.get(name).map(|j| j.retries.clone()),
            Owner::Workflow(w) => self.workflows.contains_key(w),
            Owner::Agent(a) => agent(a),
            Owner::Pipeline(p) => self.agents.pipelines.contains_key(p),
            Owner::GroupChat(members) => members.iter().all(agent),
            Owner::Plugin { .. } => true,
        };
        defined.then(RetryPolicy::default)
    }
}

/// What the config in force is made of: the files' part, and the runtime jobs with what each
/// compiled to.
#[derive(Debug)]
struct Sources {
    files: Arc<JobsConfig>,
    runtime: BTreeMap<String, Compiled>,
    /// What the runtime jobs add to the config in force, kept up to date a job at a time.
    added: Added,
}

/// The runtime jobs' part of the config in force, changed a job at a time so that publishing
/// a change costs what its job costs, not what every job does. A runtime job whose name the
/// files take is not in it.
#[derive(Debug, Default)]
struct Added {
    /// Each runtime job in force (the inert form of one that cannot run).
    jobs: imbl::OrdMap<String, JobConfig>,
    stored: imbl::OrdMap<String, StoredJob>,
    /// Those that cannot run here, with why.
    broken: BTreeMap<String, String>,
    /// Those that run `after` other jobs.
    after: BTreeSet<String>,
    /// Those with a rule of their own about waits for a decision.
    waits: BTreeSet<String>,
}

impl Added {
    fn of(runtime: &BTreeMap<String, Compiled>, files: &JobsConfig) -> Self {
        let mut added = Self::default();
        runtime.values().for_each(|c| added.add(c, files));
        added
    }

    fn remove(&mut self, name: &str) {
        self.jobs.remove(name);
        self.stored.remove(name);
        self.broken.remove(name);
        self.after.remove(name);
        self.waits.remove(name);
    }

    fn add(&mut self, c: &Compiled, files: &JobsConfig) {
        let name = &c.stored.name;
        if files.jobs.contains_key(name) {
            // Only a restart with files that took the name gets here (a reload that does is
            // refused): the files' job runs, and this one is not scheduled.
            tracing::error!(job = %name, "a job of the config files takes the name of a runtime job; the runtime job is not scheduled until one of them is renamed or deleted");
            return;
        }
        let job = match &c.job {
            Ok(job) => job,
            Err((inert, why)) => {
                self.broken.insert(name.clone(), why.clone());
                inert
            }
        };
        if job.after().is_some() {
            self.after.insert(name.clone());
        }
        if job.notify.as_deref().is_some_and(rules_about_waits) {
            self.waits.insert(name.clone());
        }
        self.jobs.insert(name.clone(), job.clone());
        self.stored.insert(name.clone(), c.stored.clone());
    }
}

/// A runtime job, compiled against the files' config in force.
#[derive(Debug, Clone)]
struct Compiled {
    stored: StoredJob,
    /// The job, or why it cannot run here (it is then shown, inert, with the reason).
    job: Result<JobConfig, (JobConfig, String)>,
}

impl Compiled {
    fn of(stored: StoredJob, files: &JobsConfig, registry: &Registry) -> Self {
        let job = match lamplighter_config::compile_job(&files.scope, &stored.name, &stored.definition) {
            Ok(c) => {
                let mut problems = runtime_problems(&c.job, registry, &files.manage);
                if let Some((_, JobProblem::Unavailable { reason, .. })) = files.health.job_problem(&c.job, registry) {
                    problems.push(reason);
                }
                if problems.is_empty() { Ok(bounded(c.job, &files.manage, &files.data_dir)) } else { Err((c.job, problems.join("; "))) }
            }
            Err(errors) => Err((
                lamplighter_config::inert_job(&stored.name, &stored.definition, &files.default_timezone),
                format!("its definition does not compile against the config in force: {}", errors.join("; ")),
            )),
        };
        Self { stored, job }
    }
}

/// The config in force, swapped whole when the files are reloaded or a runtime job changes.
/// The lock of the snapshot guards a pointer swap only and is never held across `.await`; the
/// sources' lock orders rebuilds.
#[derive(Debug)]
pub(crate) struct InForce {
    current: RwLock<Arc<JobsConfig>>,
    sources: Mutex<Sources>,
    registry: Arc<Registry>,
    /// Frees the jobs a reload replaced once every pass and watcher that held them let go.
    reaper: Reaper,
}

impl InForce {
    pub(crate) fn new(config: JobsConfig, registry: Arc<Registry>) -> Self {
        let files = Arc::new(config);
        let sources = Sources { files: files.clone(), runtime: BTreeMap::new(), added: Added::default() };
        Self { current: RwLock::new(files), sources: Mutex::new(sources), registry, reaper: Reaper::default() }
    }

    /// The plugins the config in force was checked against.
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The config in force now, whole.
    pub(crate) fn get(&self) -> Arc<JobsConfig> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Swaps in the files' new config; the runtime jobs are compiled against it. Refused,
    /// changing nothing, when a job of the files takes a runtime job's name.
    pub(crate) fn reload(&self, files: JobsConfig) -> Result<(), String> {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let taken: Vec<String> = sources
            .runtime
            .values()
            .filter(|c| files.jobs.contains_key(&c.stored.name))
            .map(|c| {
                let at = files.locations.get(&c.stored.name).flatten().map(|l| format!(" ({l})")).unwrap_or_default();
                format!(
                    "job \"{}\"{at} takes the name of a runtime job (created by {} at {}, version {}); rename it, or delete the runtime job first (lampctl jobs delete {})",
                    c.stored.name, c.stored.created_by, c.stored.created_at.to_rfc3339(), c.stored.version, c.stored.name
                )
            })
            .collect();
        if !taken.is_empty() {
            return Err(taken.join("\n"));
        }
        let files = Arc::new(files);
        let registry = &self.registry;
        sources.runtime = std::mem::take(&mut sources.runtime)
            .into_values()
            .map(|c| (c.stored.name.clone(), Compiled::of(c.stored, &files, registry)))
            .collect();
        sources.added = Added::of(&sources.runtime, &files);
        let replaced = std::mem::replace(&mut sources.files, files);
        self.publish(&sources);
        // A million jobs take a tenth of a second or more to free: not on a runtime thread that
        // happens to let go of them last.
        self.reaper.free_when_last(replaced.jobs.files.clone());
        Ok(())
    }

    /// Replaces every runtime job with `jobs` (as read from the store). Whether anything changed.
    pub(crate) fn set_runtime(&self, jobs: Vec<StoredJob>) -> bool {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let mut old = std::mem::take(&mut sources.runtime);
        let mut changed = false;
        for stored in jobs {
            // A version already compiled against these files is kept, not compiled again.
            let compiled = match old.remove(&stored.name) {
                Some(c) if c.stored == stored => c,
                _ => {
                    changed = true;
                    Compiled::of(stored, &sources.files, &self.registry)
                }
            };
            sources.runtime.insert(compiled.stored.name.clone(), compiled);
        }
        changed |= !old.is_empty();
        if changed {
            sources.added = Added::of(&sources.runtime, &sources.files);
            self.publish(&sources);
        }
        changed
    }

    /// One runtime job as stored now: saved (`Some`), or deleted. An older version than the
    /// one in force is ignored (two changes heard out of order). The jobs to plan again: it,
    /// and the runtime jobs its change let run or stopped (an `after` that names it, or a
    /// cycle through it); `None` when nothing changed.
    pub(crate) fn set_runtime_job(&self, name: &str, stored: Option<StoredJob>) -> Option<Vec<String>> {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        match stored {
            Some(s) => {
                if sources.runtime.get(name).is_some_and(|c| c.stored.version >= s.version) {
                    return None;
                }
                let compiled = Compiled::of(s, &sources.files, &self.registry);
                sources.added.remove(name);
                let files = sources.files.clone();
                sources.added.add(&compiled, &files);
                sources.runtime.insert(name.to_owned(), compiled);
            }
            None => {
                sources.runtime.remove(name)?;
                sources.added.remove(name);
            }
        }
        let before = self.get();
        self.publish(&sources);
        let after = self.get();
        let mut changed = vec![name.to_owned()];
        changed.extend(
            sources
                .added
                .after
                .iter()
                .filter(|n| *n != name && before.unavailable.contains_key(*n) != after.unavailable.contains_key(*n))
                .cloned(),
        );
        Some(changed)
    }

    /// Builds the snapshot from the sources and swaps it in: the files' part as loaded, the
    /// runtime jobs' as kept in `added`. What is walked is only what the runtime jobs add that
    /// is not a job of its own: those that cannot run, and those that run `after` others.
    fn publish(&self, sources: &Sources) {
        let (files, added) = (&sources.files, &sources.added);
        let mut config = JobsConfig::clone(files);
        if !added.stored.is_empty() {
            let jobs = JobMap { files: files.jobs.files.clone(), runtime: added.jobs.clone() };
            let mut unavailable = HashMap::clone(&files.unavailable);
            unavailable.extend(added.broken.iter().map(|(k, v)| (k.clone(), v.clone())));
            // A runtime job whose `after` names a job that is gone (deleted, or taken out of
            // the files) or closes a cycle cannot run: shown, with why.
            for name in &added.after {
                let Some(after) = jobs.get(name).and_then(JobConfig::after) else { continue };
                if let Some(m) = lamplighter_config::after_mistakes(name, after, &jobs).into_iter().next() {
                    unavailable.entry(name.clone()).or_insert_with(|| format!("job \"{name}\": after {m}"));
                }
            }
            if !added.after.is_empty() {
                // The files' jobs cannot run after a runtime job (the files are checked alone).
                let mut downstream = HashMap::clone(&files.downstream);
                add_downstream(&mut downstream, added.after.iter().filter_map(|n| jobs.get(n)), &unavailable);
                // In name order, as for the files' jobs alone.
                downstream.values_mut().for_each(|d| d.sort_unstable());
                config.downstream = Arc::new(downstream);
            }
            config.notifies_waits = files.notifies_waits || !added.waits.is_empty();
            config.jobs = jobs;
            config.unavailable = Arc::new(unavailable);
            config.runtime = added.stored.clone();
        }
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }

    pub(crate) fn jobs(&self) -> JobMap {
        self.get().jobs.clone()
    }

    pub(crate) fn job(&self, name: &str) -> Option<JobConfig> {
        self.get().jobs.get(name).cloned()
    }

    pub(crate) fn workflow(&self, name: &str) -> Option<Arc<Workflow>> {
        self.get().workflows.get(name).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(dir: &std::path::Path, yaml: &str) -> Config {
        std::fs::write(dir.join("lamplighter.yaml"), yaml).expect("write");
        let opts =
            lamplighter_config::LoadOptions { path: Some(dir.join("lamplighter.yaml")), cwd: Some(dir.into()), ..Default::default() };
        lamplighter_config::load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}")).config
    }

    /// Whether a pass reads the waits for a decision is known once the jobs are put together:
    /// from the default rules, a job's own, and a runtime job's; and it goes when that job goes.
    #[test]
    fn whether_any_rule_is_about_waits_follows_the_jobs_in_force() {
        let dir = tempfile::tempdir().expect("tempdir");
        let job = "      every: 1h\n      type: plugin\n      plugin: file-save\n      action: save\n";
        let hook = "{ webhook: \"http://127.0.0.1:9/hook\" }";
        let managed = "worker:\n  mcp:\n    manage_jobs:\n      enabled: true\n";
        let cases = [
            (format!("{managed}scheduling:\n  jobs:\n    a:\n{job}      notify: [{{ on: failure, to: {hook} }}]\n"), false),
            (format!("scheduling:\n  jobs:\n    a:\n{job}      notify: [{{ on: approval_waiting, to: {hook} }}]\n"), true),
            (format!("scheduling:\n  notify: [{{ on: budget_asked, to: {hook} }}]\n  jobs:\n    a:\n{job}"), true),
        ];
        for (yaml, waits) in &cases {
            let config = load(dir.path(), yaml);
            assert_eq!(JobsConfig::of(&config, &Registry::builtin()).notifies_waits(), *waits, "{yaml}");
        }
        let config = load(dir.path(), &cases[0].0);
        let in_force = InForce::new(JobsConfig::of(&config, &Registry::builtin()), Arc::new(Registry::builtin()));
        let at = chrono::DateTime::<chrono::Utc>::MIN_UTC;
        let runtime = StoredJob {
            name: "r".into(),
            definition: serde_json::json!({"every": "1h", "plugin": "file-save", "action": "save",
                "notify": [{"on": "approval_waiting", "to": {"webhook": "http://127.0.0.1:9/hook"}}]}),
            version: 1,
            created_by: "t".into(),
            created_at: at,
            updated_by: "t".into(),
            updated_at: at,
        };
        assert!(in_force.set_runtime(vec![runtime]));
        assert!(in_force.get().unavailable.get("r").is_none(), "{:?}", in_force.get().unavailable);
        assert!(in_force.get().notifies_waits(), "the runtime job's rule");
        assert!(in_force.set_runtime(Vec::new()));
        assert!(!in_force.get().notifies_waits(), "gone with it");
    }

    /// Runtime jobs changed one at a time put in force what putting them all in at once does:
    /// the jobs in name order among the files', those that cannot run and why, who runs after
    /// whom, whether a rule is about waits.
    #[test]
    fn runtime_jobs_changed_one_at_a_time_publish_what_all_at_once_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let save = "type: plugin, plugin: file-save, action: save";
        let yaml = format!(
            "worker:\n  mcp:\n    manage_jobs:\n      enabled: true\nscheduling:\n  jobs:\n    b: {{every: 1h, {save}}}\n    m: {{after: [b], {save}}}\n"
        );
        let config = load(dir.path(), &yaml);
        let registry = Arc::new(Registry::builtin());
        let at = chrono::DateTime::<chrono::Utc>::MIN_UTC;
        let stored = |name: &str, version: u64, definition: serde_json::Value| StoredJob {
            name: name.into(),
            definition,
            version,
            created_by: "t".into(),
            created_at: at,
            updated_by: "t".into(),
            updated_at: at,
        };
        let job = |extra: serde_json::Value| {
            let mut d = serde_json::json!({"plugin": "file-save", "action": "save"});
            d.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
            d
        };
        let hook = serde_json::json!([{"on": "approval_waiting", "to": {"webhook": "http://127.0.0.1:9/hook"}}]);
        let last = vec![
            stored("a", 1, job(serde_json::json!({"every": "1h"}))),
            stored("c", 2, job(serde_json::json!({"after": ["b"]}))),
            stored("d", 1, job(serde_json::json!({"after": ["c", "m"]}))),
            stored("e", 1, job(serde_json::json!({"after": ["gone"]}))),
            stored("f", 1, job(serde_json::json!({"every": "1h", "notify": hook}))),
            stored("g", 1, serde_json::json!({"every": "1h", "plugin": "no-such-plugin", "action": "x"})),
            stored("n", 1, job(serde_json::json!({"after": ["d"]}))),
        ];
        let one_by_one = InForce::new(JobsConfig::of(&config, &registry), registry.clone());
        one_by_one.set_runtime_job("z", Some(stored("z", 1, job(serde_json::json!({"every": "1h"})))));
        one_by_one.set_runtime_job("c", Some(stored("c", 1, job(serde_json::json!({"every": "1h"})))));
        for s in &last {
            assert!(one_by_one.set_runtime_job(&s.name, Some(s.clone())).is_some(), "{} changed", s.name);
        }
        assert_eq!(one_by_one.set_runtime_job("z", None), Some(vec!["z".to_owned()]), "z deleted");
        // A job that runs after a runtime job is planned again when that job goes and comes
        // back: it could not run, then can.
        assert_eq!(one_by_one.set_runtime_job("c", None), Some(vec!["c".to_owned(), "d".to_owned()]));
        assert!(one_by_one.get().unavailable.contains_key("d"), "d runs after c, which is gone");
        let c = last.iter().find(|s| s.name == "c").cloned().map(|c| StoredJob { version: 3, ..c });
        assert_eq!(one_by_one.set_runtime_job("c", c.clone()), Some(vec!["c".to_owned(), "d".to_owned()]));
        assert!(!one_by_one.get().unavailable.contains_key("d"), "d runs again");
        let at_once = InForce::new(JobsConfig::of(&config, &registry), registry.clone());
        assert!(at_once.set_runtime(last));
        let (x, y) = (one_by_one.get(), at_once.get());
        let names = |c: &JobsConfig| c.jobs.keys().cloned().collect::<Vec<_>>();
        assert_eq!(names(&x), ["a", "b", "c", "d", "e", "f", "g", "m", "n"]);
        assert_eq!(names(&x), names(&y));
        assert_eq!(x.jobs.len(), 9);
        assert_eq!(x.runtime.keys().collect::<Vec<_>>(), y.runtime.keys().collect::<Vec<_>>());
        let mut unavailable: Vec<_> = x.unavailable.iter().collect();
        unavailable.sort();
        let mut expected: Vec<_> = y.unavailable.iter().collect();
        expected.sort();
        assert_eq!(unavailable, expected);
        assert_eq!(unavailable.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["e", "g"], "{unavailable:?}");
        assert!(x.unavailable["e"].contains("names job \"gone\""), "{}", x.unavailable["e"]);
        for up in ["a", "b", "c", "d", "m"] {
            assert_eq!(x.downstream_names(up), y.downstream_names(up), "after {up}");
        }
        assert_eq!(x.downstream_names("b"), ["c", "m"], "the files' and the runtime job's, in name order");
        assert_eq!(x.downstream_names("d"), ["n"]);
        assert!(x.notifies_waits() && y.notifies_waits());
        // The files' part is the loaded config's own, not a copy.
        assert!(Arc::ptr_eq(&x.jobs.files, &config.jobs));
        assert_eq!(x.jobs.after(Some("c")).map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["d", "e", "f", "g", "m", "n"]);
        assert_eq!(x.jobs.after(Some("a")).next().map(|(k, _)| k.as_str()), Some("b"));
    }

    /// A job of the files or a runtime job cannot take the name runs without a job are listed
    /// under.
    #[test]
    fn the_job_names_of_runs_without_a_job_are_refused_as_job_names() {
        for prefix in [Owner::WORKFLOW, Owner::AGENT, Owner::PIPELINE, Owner::GROUP_CHAT, Owner::PLUGIN] {
            let (reserved, _) =
                lamplighter_config::reserved_prefix(&format!("{prefix}x")).unwrap_or_else(|| panic!("{prefix} is not reserved"));
            assert_eq!(reserved, prefix);
        }
    }
}
