//! Jobs defined at runtime: what the store keeps of them ([`StoredJob`], [`JobChangeRecord`]),
//! the change a client asks for ([`ChangeRequest`]) and why the store refuses one
//! ([`Refused`]), and the checks a definition passes before it is saved ([`check_definition`]):
//! the same compiler as the files' jobs, then what only the worker knows (plugins that loaded,
//! the operator's `worker.mcp.manage_jobs` bounds). Pure: the job service calls it, the store
//! writes what it decided.

use std::path::{Component, Path};

use chrono::{DateTime, Utc};
use lamplighter_config::{CompiledJob, JobConfig, JobScope, ManageJobs, Target};
use lamplighter_plugins::Registry;

/// A runtime job as stored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredJob {
    pub(crate) name: String,
    /// The definition, as JSON: a job's entry as the files write it.
    pub(crate) definition: serde_json::Value,
    pub(crate) version: u64,
    pub(crate) created_by: String,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_by: String,
    pub(crate) updated_at: DateTime<Utc>,
}

/// What a client asks the store to do to a runtime job.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Change<'a> {
    Create { definition: &'a serde_json::Value, max_jobs: u32 },
    Update { definition: &'a serde_json::Value, expected: Option<u64> },
    Delete { expected: Option<u64> },
}

impl Change<'_> {
    pub(crate) fn action(&self) -> &'static str {
        match self {
            Change::Create { .. } => "create",
            Change::Update { .. } => "update",
            Change::Delete { .. } => "delete",
        }
    }
}

/// A change, with who asks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChangeRequest<'a> {
    pub(crate) name: &'a str,
    pub(crate) change: Change<'a>,
    pub(crate) actor: &'a str,
}

/// Why the store refused a change (it changed nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// A create of a name a runtime job holds.
    Exists { version: u64 },
    /// An update or delete of a name no runtime job holds.
    Missing,
    /// The job changed since the version the caller read.
    Stale { expected: u64, current: u64 },
    /// There are as many runtime jobs as `max_jobs` allows.
    Full { max: u32 },
}

/// The version `change` makes to a job stored as `current` (none: no runtime job of the name),
/// whose history's last version is `last` and when `jobs` runtime jobs are stored; or why it is
/// refused. Decided from the facts the store read, in its transaction (or, for a dry run, as
/// they are now).
pub(crate) fn decide_change(change: &Change<'_>, current: Option<&StoredJob>, last: u64, jobs: u64) -> Result<u64, Refused> {
    match (change, current) {
        (Change::Create { .. }, Some(c)) => return Err(Refused::Exists { version: c.version }),
        (Change::Update { .. } | Change::Delete { .. }, None) => return Err(Refused::Missing),
        (Change::Update { expected: Some(e), .. } | Change::Delete { expected: Some(e) }, Some(c)) if *e != c.version => {
            return Err(Refused::Stale { expected: *e, current: c.version });
        }
        (Change::Create { max_jobs, .. }, None) if jobs >= u64::from(*max_jobs) => return Err(Refused::Full { max: *max_jobs }),
        _ => {}
    }
    Ok(last.max(current.map_or(0, |c| c.version)) + 1)
}

/// What a change left: the job as saved, or (a delete) the version the delete made.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Changed {
    Saved(StoredJob),
    Deleted { version: u64 },
}

/// One change as the history keeps it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JobChangeRecord {
    pub(crate) version: u64,
    pub(crate) action: String,
    pub(crate) before: Option<serde_json::Value>,
    pub(crate) after: Option<serde_json::Value>,
    pub(crate) actor: String,
    pub(crate) at: DateTime<Utc>,
}

/// Names a runtime job may take: what a shell, a URL and a YAML key take without quoting.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 100 {
        return Err(format!("name: must be 1–100 characters, not {}", name.chars().count()));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        return Err(format!("name: \"{name}\" has {c:?}; use letters, digits, '-', '_' and '.'"));
    }
    Ok(())
}

/// Compiles a definition against the config in force and checks it against the plugins this
/// worker loaded and the operator's bounds. Every problem is returned at once, each naming its
/// field.
pub(crate) fn check_definition(
    scope: &JobScope,
    registry: &Registry,
    policy: &ManageJobs,
    name: &str,
    definition: &serde_json::Value,
) -> Result<CompiledJob, Vec<String>> {
    let mut errors = Vec::new();
    if let Err(e) = check_name(name) {
        errors.push(e);
    }
    let size = serde_json::to_string(definition).map_or(usize::MAX, |s| s.len());
    if size > policy.max_definition_bytes {
        // Compiling a definition this large is what the limit is there to avoid.
        errors.push(format!(
            "definition: is {size} bytes of JSON, more than the {} bytes worker.mcp.manage_jobs.max_definition_bytes allows",
            policy.max_definition_bytes
        ));
        return Err(errors);
    }
    let compiled = match lamplighter_config::compile_job(scope, name, definition) {
        Ok(c) => Some(c),
        Err(e) => {
            errors.extend(e);
            None
        }
    };
    if let Some(c) = &compiled {
        errors.extend(runtime_problems(&c.job, registry, policy));
        // YAML aliases can make a small text a large definition.
        let size = serde_json::to_string(&c.definition).map_or(usize::MAX, |s| s.len());
        if size > policy.max_definition_bytes {
            errors.push(format!(
                "definition: is {size} bytes of JSON once parsed, more than the {} bytes worker.mcp.manage_jobs.max_definition_bytes allows",
                policy.max_definition_bytes
            ));
        }
    }
    match compiled {
        Some(c) if errors.is_empty() => Ok(c),
        _ => Err(errors),
    }
}

/// What keeps a compiled runtime job from running here: an action no plugin has or whose plugin
/// did not load, a target or a bound the operator does not allow. Checked when a job is saved
/// and whenever it is compiled again (a reload that tightens the bounds disables the jobs
/// outside them, visibly).
pub(crate) fn runtime_problems(job: &JobConfig, registry: &Registry, policy: &ManageJobs) -> Vec<String> {
    let mut out = Vec::new();
    if let Target::Plugin { plugin, action } = &job.target
        && registry.action_parameters(plugin, action).is_none()
    {
        let field = if registry.plugins().iter().any(|p| &p.name == plugin) { "action" } else { "plugin" };
        match registry.plugins().iter().find(|p| &p.name == plugin).and_then(|p| p.error.as_deref()) {
            Some(why) => out.push(format!("{field}: plugin \"{plugin}\" could not be loaded here: {why}")),
            None => out.push(format!(
                "{field}: plugin action \"{plugin}.{action}\" does not exist; known actions: {}",
                registry.action_names().join(", ")
            )),
        }
    }
    if !policy.allows(&job.target) {
        let field = match &job.target {
            Target::Workflow(_) => "workflow",
            Target::Agent(_) => "agent",
            Target::Plugin { .. } => "action",
        };
        out.push(format!(
            "{field}: runtime jobs may not run {} ({}); worker.mcp.manage_jobs.targets allows: {}",
            job.target.describe(),
            job.target.pattern_name(),
            policy.targets_text()
        ));
    }
    if !policy.allowed_commands.is_empty() {
        for c in &job.allowed_commands {
            if !policy.allowed_commands.contains(c) {
                out.push(format!(
                    "allowed_commands: \"{c}\" is not among the commands worker.mcp.manage_jobs.allowed_commands allows: {}",
                    policy.allowed_commands.join(", ")
                ));
            }
        }
    }
    if let Some(dir) = &job.working_directory {
        let escapes = dir.components().any(|c| matches!(c, Component::ParentDir));
        if escapes || !policy.working_directories.iter().any(|allowed| dir.starts_with(allowed)) {
            out.push(format!(
                "working_directory: \"{}\" is not inside a folder worker.mcp.manage_jobs.working_directories allows: {}",
                dir.display(),
                list_paths(&policy.working_directories)
            ));
        }
    }
    out
}

/// A compiled runtime job as it runs: with the operator's commands when it names none, and in
/// the first allowed folder when it names none and the data directory (where runs work by
/// default) is not allowed. A runtime job never runs with fewer bounds than the operator set.
pub(crate) fn bounded(mut job: JobConfig, policy: &ManageJobs, data_dir: &Path) -> JobConfig {
    if job.allowed_commands.is_empty() {
        job.allowed_commands = policy.allowed_commands.clone().into();
    }
    if job.working_directory.is_none() && !policy.working_directories.iter().any(|d| data_dir.starts_with(d)) {
        job.working_directory = policy.working_directories.first().cloned();
    }
    job
}

fn list_paths(paths: &[std::path::PathBuf]) -> String {
    if paths.is_empty() {
        return "none".into();
    }
    paths.iter().map(|p| Path::display(p).to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_words() {
        assert!(check_name("news-digest_v2.daily").is_ok());
        assert_eq!(check_name("").unwrap_err(), "name: must be 1–100 characters, not 0");
        assert_eq!(check_name("a b").unwrap_err(), "name: \"a b\" has ' '; use letters, digits, '-', '_' and '.'");
        assert!(check_name(&"x".repeat(101)).is_err());
    }

    #[test]
    fn target_patterns() {
        let mut p = ManageJobs::off(Path::new("/data"));
        let shell = Target::Plugin { plugin: "shell-exec".into(), action: "run".into() };
        let save = Target::Plugin { plugin: "file-save".into(), action: "write".into() };
        assert!(!p.allows(&shell), "shell-exec is not allowed by default");
        assert!(p.allows(&save) && p.allows(&Target::Workflow("w".into())) && p.allows(&Target::Agent("a".into())));
        p.targets = Some(vec!["workflow:*".into(), "agent:news-*".into(), "plugin:file-save.*".into()]);
        assert!(p.allows(&save) && p.allows(&Target::Workflow("any".into())));
        assert!(p.allows(&Target::Agent("news-berlin".into())) && !p.allows(&Target::Agent("research".into())));
        assert!(!p.allows(&shell));
        p.targets = Some(vec!["plugin:shell-exec.run".into()]);
        assert!(p.allows(&shell) && !p.allows(&Target::Workflow("w".into())));
        p.targets = Some(Vec::new());
        assert!(!p.allows(&save));
    }

    #[test]
    fn a_runtime_job_runs_within_the_operators_bounds_when_it_names_none() {
        let job = lamplighter_config::inert_job("j", &serde_json::json!({"plugin": "file-save", "action": "save"}), "UTC");
        let mut p = ManageJobs::off(Path::new("/var/lib/ll/data"));
        let kept = bounded(job.clone(), &p, Path::new("/var/lib/ll/data"));
        assert_eq!((kept.working_directory, kept.allowed_commands.len()), (None, 0), "the data directory is allowed");
        p.working_directories = vec!["/srv/sandbox".into()];
        p.allowed_commands = vec!["date".into()];
        let moved = bounded(job, &p, Path::new("/var/lib/ll/data"));
        assert_eq!(moved.working_directory, Some("/srv/sandbox".into()), "not the data directory, which is not allowed");
        assert_eq!(moved.allowed_commands[..], ["date"]);
    }

    #[test]
    fn a_change_is_decided_from_the_stored_facts() {
        let def = serde_json::json!({"every": "1h"});
        let at = DateTime::<Utc>::MIN_UTC;
        let stored = StoredJob {
            name: "j".into(),
            definition: def.clone(),
            version: 3,
            created_by: "a".into(),
            created_at: at,
            updated_by: "a".into(),
            updated_at: at,
        };
        let create = Change::Create { definition: &def, max_jobs: 2 };
        let update = |expected| Change::Update { definition: &def, expected };
        // (change, stored job, history's last version, runtime jobs) => version or refusal
        type Case<'a> = (Change<'a>, Option<&'a StoredJob>, u64, u64, Result<u64, Refused>);
        let cases: Vec<Case<'_>> = vec![
            (create, None, 0, 0, Ok(1)),
            // A name deleted at version 5 continues its count.
            (create, None, 5, 1, Ok(6)),
            (create, None, 0, 2, Err(Refused::Full { max: 2 })),
            (create, Some(&stored), 3, 1, Err(Refused::Exists { version: 3 })),
            (update(Some(3)), Some(&stored), 3, 0, Ok(4)),
            (update(None), Some(&stored), 3, 0, Ok(4)),
            (update(Some(2)), Some(&stored), 3, 0, Err(Refused::Stale { expected: 2, current: 3 })),
            (update(Some(1)), None, 0, 0, Err(Refused::Missing)),
            (Change::Delete { expected: Some(3) }, Some(&stored), 3, 0, Ok(4)),
            (Change::Delete { expected: None }, None, 4, 0, Err(Refused::Missing)),
        ];
        for (i, (change, current, last, jobs, want)) in cases.into_iter().enumerate() {
            assert_eq!(decide_change(&change, current, last, jobs), want, "case {i}");
        }
    }
}
