//! `compile`: raw config → resolved, validated config. Collects every error with its location;
//! checks names across sections; decides what is disabled (e.g. an agent whose provider key is
//! unset) and why.
//!
//! This file runs the sections in order; each section's checks live in a file of its own.

mod ai;
mod jobs;
mod notify;
mod skills;
mod storage;
mod telemetry;
mod types;
mod wasm;
mod worker;
mod workflows;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::diag::Diagnostic;
use crate::load::{Loaded, SourceMap, keys};
use crate::raw;
use crate::schedule::{self, Schedule, ScheduleSpec};

pub use jobs::{JobsByName, RESERVED_JOB_PREFIXES, after_mistakes, after_problems, check_tag, reserved_prefix};
pub use types::{After, AfterOn, Deadline, LimitUse, OnMiss};
pub use types::{
    ApiToken, Backoff, CatchUp, Config, DEFAULT_LEASE, DEFAULT_PG_POOL_SIZE, DEFAULT_PG_STATEMENT_TIMEOUT, Disabled, JobConfig, JsonText,
    ManageJobs, McpAuth, McpTls, McpTransport, OAuthSettings, Overlap, Retention, RetryPolicy, Role, StorageConfig, Target, Together,
    WASM_CAPABILITIES, WasmConfig, WorkerConfig,
};

struct Compiler<'a> {
    loaded: &'a Loaded,
    diags: Vec<Diagnostic>,
    disabled: BTreeMap<Disabled, String>,
    /// Name the field in each message (a definition given as JSON has no file to point into):
    /// `cron: …` for an error at `scheduling.jobs.<name>.cron`.
    fields: bool,
    /// Each distinct schedule, built once and shared by the jobs that write it (a parsed cron
    /// schedule takes half a kilobyte; nightly configs repeat a handful of times of day).
    schedules: std::collections::HashMap<(schedule::ScheduleSpec, chrono_tz::Tz), std::sync::Arc<schedule::Schedule>>,
}

/// Consumes the loaded tree: the merged YAML and source map move into the result (a large
/// config must not be held twice); the raw tree is dropped once compiled.
pub(crate) fn compile(mut loaded: Loaded, cwd: &Path) -> (Option<Config>, Vec<Diagnostic>) {
    // The jobs are moved, not copied: with thousands of jobs a copy doubles the peak.
    let sched = loaded.raw.scheduling.take().unwrap_or_default();
    let unread = std::mem::take(&mut loaded.unread_jobs);
    let (mut config, diags) = compile_borrowed(&loaded, sched, unread, cwd);
    config.sources = loaded.sources;
    config.merged = loaded.merged;
    config.root = loaded.root;
    (Some(config), diags)
}

/// How many jobs the reader hands over at a time (see [`read_jobs`]).
const JOBS_PER_BATCH: usize = 256;

/// Reads each unread job from its YAML (its keys checked first), freeing the YAML as it goes,
/// and hands the jobs read to `compile` in order, a batch at a time; returns the errors of
/// those that do not read.
/// With many jobs the reading runs on a thread of its own, a batch ahead of `compile` here:
/// the two take about as long, and a worker has the cores for both while it starts.
fn read_jobs(
    sources: &crate::SourceMap,
    unread: Vec<(String, serde_yaml::Value)>,
    compile: &mut dyn FnMut(String, raw::Job),
) -> Vec<Diagnostic> {
    // A few batches are not worth a thread (a file's few jobs, a reload's).
    let on_a_thread = unread.len() >= 4 * JOBS_PER_BATCH;
    crate::pipeline::pipelined(
        on_a_thread,
        move |send| {
            let mut diags = Vec::new();
            let mut batch = Vec::with_capacity(JOBS_PER_BATCH);
            for (name, yaml) in unread {
                if !crate::load::job_keys_known(sources, &mut diags, &name, &yaml) {
                    continue;
                }
                let job = crate::load::read_item::<raw::Job>(sources, &mut diags, &yaml, || crate::load::job_path(&name));
                batch.extend(job.map(|job| (name, job)));
                if batch.len() == JOBS_PER_BATCH && !send(std::mem::replace(&mut batch, Vec::with_capacity(JOBS_PER_BATCH))) {
                    return diags;
                }
            }
            send(batch);
            diags
        },
        |batch: Vec<(String, raw::Job)>| {
            for (name, job) in batch {
                compile(name, job);
            }
            true
        },
    )
}

fn compile_borrowed(
    loaded: &Loaded,
    sched: raw::Scheduling,
    unread: Vec<(String, serde_yaml::Value)>,
    cwd: &Path,
) -> (Config, Vec<Diagnostic>) {
    let mut c = Compiler { loaded, diags: Vec::new(), disabled: BTreeMap::new(), fields: false, schedules: Default::default() };
    let raw = &loaded.raw;
    let fw = raw.framework.clone().unwrap_or_default();
    let data_dir = cwd.join(fw.data_dir.as_deref().unwrap_or("./data"));
    let log_level = fw.log_level.as_deref().and_then(|l| c.level(&["framework", "log_level"], l));
    let default_timezone = sched.timezone.clone().unwrap_or_else(|| "UTC".to_string());
    let default_tz = schedule::parse_tz(&default_timezone);
    if let Err(e) = &default_tz {
        c.err(&["scheduling", "timezone"], e.to_string());
    }
    let storage = c.storage(sched.storage.as_ref(), &data_dir, cwd);
    c.check_unset_vars();
    let ai = raw.ai.clone().unwrap_or_default();
    let providers = c.providers();
    let mcp_servers = c.mcp_servers();
    let skills = c.skills(cwd);
    let agents = c.agents(&providers, ai.default_model.as_deref(), &skills, cwd);
    let limits = c.limits(sched.limits.as_ref());
    let calendars = c.calendars(sched.calendars.as_ref(), cwd);
    let deadline = sched.deadline.as_ref().and_then(|d| c.deadline(&["scheduling", "deadline"], "scheduling.deadline", d));
    let workflows = c.workflows(&limits.keys().map(String::as_str).collect());
    let pipelines = c.pipelines();
    let runnable = jobs::Runnable::of(raw.workflows.iter().flat_map(|w| w.keys()), raw.agents.iter().flat_map(|a| a.keys()))
        .with_limits(limits.keys())
        .with_calendars(&calendars, sched.calendars.iter().flat_map(|c| c.keys().cloned()))
        .with_deadline(deadline);
    let mut jobs = Vec::with_capacity(sched.jobs.as_ref().map_or(0, BTreeMap::len) + unread.len());
    let mut compile_one = |name: String, mut job: raw::Job| {
        if let Some(j) = c.job(&name, &mut job, &runnable, (&default_timezone, &default_tz), cwd) {
            jobs.push((name, j));
        }
    };
    for (name, job) in sched.jobs.into_iter().flatten() {
        compile_one(name, job);
    }
    let read_diags = read_jobs(&loaded.sources, unread, &mut compile_one);
    c.diags.extend(read_diags);
    // Built from the list at once (sorted first): a map built by inserting in order leaves its
    // nodes half full (measured: 870 bytes a job against 470, for ten thousand jobs).
    let jobs: BTreeMap<String, JobConfig> = jobs.into_iter().collect();
    for (job, problem) in jobs::after_problems(&jobs) {
        c.err(&["scheduling", "jobs", &job, "after"], problem);
    }
    let notify = match &sched.notify {
        Some(rules) => c.notify(&["scheduling", "notify"], "scheduling.notify", rules, &runnable).unwrap_or_default(),
        None => Vec::new(),
    };
    let worker = c.worker(raw.worker.as_ref(), &data_dir, cwd);
    let telemetry = c.telemetry(raw.telemetry.as_ref());
    let log_level = c.log_levels(log_level, &telemetry);
    let hooks = c.hooks(raw.hooks.as_ref());
    let wasm = c.wasm(raw.plugins.as_ref().and_then(|p| p.wasm.as_ref()));
    let plugin_dirs = raw.plugins.as_ref().and_then(|p| p.dirs.clone()).unwrap_or_default().iter().map(|d| cwd.join(d)).collect();
    let config = Config {
        root: PathBuf::new(),
        base_dir: cwd.to_path_buf(),
        name: fw.name.unwrap_or_else(|| "lamplighter".to_string()),
        version: fw.version,
        data_dir,
        log_level,
        default_timezone,
        storage,
        jobs: std::sync::Arc::new(jobs),
        notify,
        limits,
        calendars,
        deadline,
        default_model: ai.default_model,
        providers,
        agents,
        pipelines,
        workflows,
        skills,
        mcp_servers,
        plugin_dirs,
        wasm,
        worker,
        telemetry,
        hooks,
        disabled: c.disabled,
        sources: SourceMap::default(),
        merged: serde_yaml::Value::Null,
    };
    (config, c.diags)
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("\"{s}\" is not a duration ({e}); write e.g. \"90s\", \"15m\", \"24h\""))
}

/// A job defined at runtime (an MCP client's, say), checked as it is written.
#[derive(Debug, Clone)]
pub struct CompiledJob {
    pub job: JobConfig,
    /// The definition as JSON (a definition given as YAML text, parsed).
    pub definition: serde_json::Value,
    /// What compiles but looks wrong, each naming its field.
    pub warnings: Vec<String>,
}

/// A job definition given as JSON — the same object as the job's entry in YAML — compiled by
/// the same compiler as the files' jobs, against the config in force: the workflows and agents
/// it names must be defined there, its zone defaults to `scheduling.timezone`, a relative
/// `working_directory` is read from the config's folder. Every error is returned at once, each
/// naming its field (`cron: …`, `workflow: …`; `definition: …` for one that is not a job
/// entry at all).
pub fn compile_job(scope: &JobScope, name: &str, definition: &serde_json::Value) -> Result<CompiledJob, Vec<String>> {
    if let Some((prefix, whose)) = jobs::reserved_prefix(name) {
        return Err(vec![format!("name: job names cannot start with \"{prefix}\" ({whose} are listed under it)")]);
    }
    let definition = definition_json(definition).map_err(|e| vec![e])?;
    let (read, mut errors) = read_definition(name, &definition);
    let Some(mut job) = read else { return Err(errors) };
    // Nothing to locate: the definition is not in a file.
    let loaded = Loaded {
        raw: raw::RawConfig::default(),
        unread_jobs: Vec::new(),
        merged: serde_yaml::Value::Null,
        sources: SourceMap::default(),
        unset_vars: Vec::new(),
        root: scope.root.clone(),
    };
    let mut c = Compiler { loaded: &loaded, diags: Vec::new(), disabled: BTreeMap::new(), fields: true, schedules: Default::default() };
    let default_tz = schedule::parse_tz(&scope.default_timezone);
    let cwd = scope.base_dir.as_path();
    let runnable = jobs::Runnable::of(scope.workflows.iter(), scope.agents.iter())
        .with_limits(scope.limits.iter())
        .with_calendars(&scope.calendars, [])
        .with_deadline(scope.deadline);
    let compiled = c.job(name, &mut job, &runnable, (&scope.default_timezone, &default_tz), cwd);
    let (compile_errors, warnings): (Vec<Diagnostic>, Vec<Diagnostic>) =
        c.diags.into_iter().partition(|d| d.severity == crate::diag::Severity::Error);
    errors.extend(compile_errors.into_iter().map(|d| d.message));
    match compiled {
        Some(job) if errors.is_empty() => Ok(CompiledJob { job, definition, warnings: warnings.into_iter().map(|d| d.message).collect() }),
        _ => Err(errors),
    }
}

/// Reads a runtime definition as the files' reader does, but collecting: every unknown key
/// (with a did-you-mean, from the config's schema) and every value of the wrong type, each
/// naming its field, and removed so that the rest still reads and compiles — a bad `max`
/// does not hide a bad cron. The job read is `None` only when nothing readable is left.
fn read_definition(name: &str, definition: &serde_json::Value) -> (Option<raw::Job>, Vec<String>) {
    use crate::load::{JOBS, deserialize_located, error_path, remove_path};
    use crate::yaml::{Seg, path_string};
    let field = |path: &[Seg]| if path.is_empty() { "definition".to_string() } else { path_string(path) };
    let mut errors = Vec::new();
    let Ok(mut job) = serde_yaml::to_value(definition) else { return (None, vec!["definition: does not read as YAML".into()]) };
    // The schema knows the job's keys as those of `scheduling.jobs.<name>`.
    for unknown in crate::schema::unknown_keys_of_item(JOBS, name, &job) {
        let below = &unknown.path[JOBS.len() + 1..];
        let Some((Seg::Key(key), parent)) = below.split_last() else { continue };
        let hint = unknown.message.find(" (did you mean").map_or("", |i| &unknown.message[i..]);
        errors.push(format!("{}: unknown key \"{key}\"{hint}", field(parent)));
        remove_path(&mut job, below);
    }
    // A bounded number of rounds: each removes the field that did not read.
    for _ in 0..64 {
        match deserialize_located::<raw::Job>(&job) {
            Ok(read) => return (Some(read), errors),
            Err(e) => {
                let path = error_path(e.path());
                errors.push(format!("{}: {}", field(&path), e.into_inner()));
                if !remove_path(&mut job, &path) {
                    return (None, errors);
                }
            }
        }
    }
    (None, errors)
}

/// What a job defined at runtime is compiled against: the names it may run and the defaults it
/// takes from the config in force (a small part of it, kept while the rest is dropped).
#[derive(Debug, Clone, Default)]
pub struct JobScope {
    /// The root config file.
    pub root: PathBuf,
    /// What relative paths are read from, as for the files' jobs.
    pub base_dir: PathBuf,
    pub default_timezone: String,
    pub workflows: std::collections::BTreeSet<String>,
    pub agents: std::collections::BTreeSet<String>,
    /// The names of `scheduling.limits`.
    pub limits: std::collections::BTreeSet<String>,
    /// `scheduling.calendars`, resolved.
    pub calendars: BTreeMap<String, std::sync::Arc<crate::Calendar>>,
    /// `scheduling.deadline`.
    pub deadline: Option<Deadline>,
}

impl JobScope {
    pub fn of(config: &Config) -> Self {
        Self {
            root: config.root.clone(),
            base_dir: config.base_dir.clone(),
            default_timezone: config.default_timezone.clone(),
            workflows: config.workflows.keys().cloned().collect(),
            agents: config.agents.keys().cloned().collect(),
            limits: config.limits.keys().cloned().collect(),
            calendars: config.calendars.clone(),
            deadline: config.deadline,
        }
    }
}

/// A job that cannot run: what a stored definition that no longer compiles (its workflow was
/// removed from the files, say) is shown as, with its target as far as it can be read. It has
/// no schedule and is not enabled.
pub fn inert_job(name: &str, definition: &serde_json::Value, default_timezone: &str) -> JobConfig {
    let field = |k: &str| definition.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let target = match (field("workflow"), field("agent"), field("plugin")) {
        (Some(w), _, _) => Target::Workflow(w),
        (None, Some(a), _) => Target::Agent(a),
        (None, None, p) => Target::Plugin { plugin: p.unwrap_or_default(), action: field("action").unwrap_or_default() },
    };
    JobConfig {
        name: name.to_owned(),
        description: field("description"),
        target,
        input: None,
        parameters: None,
        // Its last schedule, for the record (`schedule: cron 0 3 * * *`, not "manual"); it
        // never fires: the job is not enabled and no scheduler holds it.
        schedule: schedule_of(definition, &field("timezone").unwrap_or_else(|| default_timezone.to_owned())),
        timezone: field("timezone").unwrap_or_else(|| default_timezone.to_owned()),
        enabled: false,
        catch_up: CatchUp::default(),
        catch_up_window: Duration::ZERO,
        overlap: Overlap::default(),
        retries: RetryPolicy::default(),
        timeout: None,
        jitter: None,
        retention: Retention::default(),
        working_directory: None,
        allowed_commands: Box::default(),
        budget: Default::default(),
        notify: None,
        // Its tags as far as they read: pausing a tag still reaches it.
        together: definition
            .get("tags")
            .and_then(|t| t.as_array())
            .map(|t| t.iter().filter_map(|v| v.as_str()).filter(|t| jobs::check_tag(t).is_ok()).map(str::to_owned).collect::<Vec<_>>())
            .filter(|t| !t.is_empty())
            .map(|tags| Box::new(Together { tags, after: None, limits: Vec::new(), deadline: None })),
    }
}

/// The schedule a definition gives (`cron`, `every` or `at`), when it reads.
fn schedule_of(definition: &serde_json::Value, timezone: &str) -> Option<Arc<Schedule>> {
    let text = |k: &str| definition.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let spec = text("cron")
        .map(ScheduleSpec::Cron)
        .or_else(|| text("every").map(ScheduleSpec::Every))
        .or_else(|| text("at").map(ScheduleSpec::At))?;
    schedule::parse_alone(spec, timezone).ok().map(Arc::new)
}

/// A definition as JSON: an object as it is, or YAML text (a job's entry as the files write
/// it) parsed.
fn definition_json(definition: &serde_json::Value) -> Result<serde_json::Value, String> {
    let parsed = match definition {
        serde_json::Value::String(text) => serde_yaml::from_str::<serde_json::Value>(text).map_err(|e| {
            let at = e.location().map(|l| format!(" at line {}, column {}", l.line(), l.column())).unwrap_or_default();
            format!("definition: the YAML text does not parse{at}: {e}")
        })?,
        other => other.clone(),
    };
    if !parsed.is_object() {
        return Err(format!(
            "definition: must be a job's entry (an object such as {{\"cron\": \"0 7 * * *\", \"workflow\": \"digest\"}}), not {}",
            kind_of(&parsed)
        ));
    }
    Ok(parsed)
}

fn kind_of(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

impl Compiler<'_> {
    fn err(&mut self, path: &[&str], msg: String) {
        let loc = self.loaded.sources.locate(&keys(path));
        let msg = self.named(path, msg);
        self.diags.push(Diagnostic::error(loc, msg));
    }

    fn warn(&mut self, path: &[&str], msg: String) {
        let loc = self.loaded.sources.locate(&keys(path));
        let msg = self.named(path, msg);
        self.diags.push(Diagnostic::warning(loc, msg));
    }

    /// `msg`, with its field first when the compiler names fields: the path below the job
    /// (`scheduling.jobs.<name>.retries.max` → `retries.max: …`).
    fn named(&self, path: &[&str], msg: String) -> String {
        match (self.fields, path) {
            (true, ["scheduling", "jobs", _, rest @ ..]) if !rest.is_empty() => format!("{}: {msg}", rest.join(".")),
            (true, _) => format!("definition: {msg}"),
            (false, _) => msg,
        }
    }
}
