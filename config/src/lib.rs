//! Lamplighter configuration: the YAML model (seed-compatible), loading with imports and
//! `${VAR}` substitution, validation that reports every error with `file:line:col`, and the
//! generated JSON Schema.
//!
//! Entry point: [`load`]. It never panics on input; it returns either a [`Config`] with
//! warnings, or every error it found.

mod ai;
mod calendar;
mod compile;
mod diag;
mod ics;
mod load;
mod notify;
mod observe;
mod pipeline;
mod raw;
mod schedule;
mod schema;
mod template;
mod workflow;
mod yaml;

use std::path::{Path, PathBuf};

pub use ai::{
    Agent, ApprovalMode, Budget, DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_ITERS, DEFAULT_MAX_RETRIES, McpServer, Model, ModelApi, ModelRef,
    OnBudget, Pipeline, Pricing, Provider, ProviderApi, RateLimit, Secret, Skill, SystemPrompt, ToolApproval, name_matches, resolve_model,
};
pub use calendar::Calendar;
pub use compile::{
    After, AfterOn, ApiToken, Backoff, CatchUp, CompiledJob, Config, DEFAULT_LEASE, DEFAULT_PG_POOL_SIZE, DEFAULT_PG_STATEMENT_TIMEOUT,
    Deadline, Disabled, JobConfig, JobScope, JobsByName, JsonText, LimitUse, ManageJobs, McpAuth, McpTls, McpTransport, OAuthSettings,
    OnMiss, Overlap, RESERVED_JOB_PREFIXES, Retention, RetryPolicy, Role, StorageConfig, Target, Together, WASM_CAPABILITIES, WasmConfig,
    WorkerConfig, after_mistakes, after_problems, check_tag, compile_job, inert_job, reserved_prefix,
};
pub use diag::{ConfigErrors, Diagnostic, Location, Severity, did_you_mean};

/// The days of an iCalendar file as a calendar's `ics:` reads them, each with the summary of
/// the event on it; a mistake as its line (as written) and what to do.
pub fn ics_days(text: &str) -> Result<std::collections::BTreeMap<chrono::NaiveDate, String>, (usize, String)> {
    ics::days(text).map_err(|e| (e.line, e.message))
}
pub use load::{ItemLocations, SourceMap, discover, keys};
pub use notify::{NotifyOn, NotifyRule, NotifyTarget, Webhook, WebhookFormat};
pub use observe::{DEFAULT_HOOK_PRIORITY, EventPattern, Exporter, HookBinding, OtlpProtocol, SignalConfig, TelemetryConfig, Timing};
pub use schedule::{Preview, Schedule, ScheduleError, ScheduleSpec, Shift, local_instant, parse_alone, parse_zone};
pub use schema::json_schema;
pub use template::{Part, Template, Templated, Var};
pub use workflow::{Decision, Step, StepKind, StepType, Workflow};
pub use yaml::{Seg, YamlPath, split_front_matter};

/// How to find and read the config.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// `--config PATH`, if given.
    pub path: Option<PathBuf>,
    /// The directory that relative paths (`data_dir`, `working_directory`) resolve against and
    /// where discovery looks; the process working directory by default.
    pub cwd: Option<PathBuf>,
    /// Whether the merged YAML keeps the jobs (for `config show`).
    pub merged: KeepMerged,
}

/// How much of the merged YAML a load keeps in [`Config::merged`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KeepMerged {
    /// All of it, for `config show`.
    #[default]
    Whole,
    /// All but `scheduling.jobs`: each job's YAML is consumed as it is read, so that a config
    /// of many jobs is not held twice while it loads (a worker and `config validate` load this
    /// way).
    WithoutJobs,
}

/// A loaded, validated config and the warnings found on the way.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub warnings: Vec<Diagnostic>,
}

/// Finds, reads, merges and validates the config, reading variables from the environment.
pub fn load(opts: &LoadOptions) -> Result<Loaded, ConfigErrors> {
    load_with_env(opts, |name| std::env::var(name).ok())
}

/// Like [`load`] with a custom variable lookup (tests).
pub fn load_with_env(opts: &LoadOptions, env: impl Fn(&str) -> Option<String> + 'static) -> Result<Loaded, ConfigErrors> {
    let (config, diags) = load_partial(opts, env);
    finish(config, diags)
}

/// Loads as far as possible: the config built despite errors (so that later checks can add
/// their findings to the same list) and every finding. Use [`load`] to run anything.
pub fn load_partial(opts: &LoadOptions, env: impl Fn(&str) -> Option<String> + 'static) -> (Option<Config>, Vec<Diagnostic>) {
    let cwd = match &opts.cwd {
        Some(c) => c.clone(),
        None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    };
    let root = match discover(opts.path.as_deref(), &cwd) {
        Ok(r) => r,
        Err(m) => return (None, vec![Diagnostic::error(None, m)]),
    };
    let root = if root.is_absolute() { root } else { cwd.join(root) };
    let (loaded, mut diags) = load::load_with_env(&root, opts.merged, Box::new(env));
    let config = loaded.and_then(|l| {
        let (config, more) = compile::compile(l, &cwd);
        diags.extend(more);
        config
    });
    (config, diags)
}

/// Turns a partial load into a result: the config only when no finding is an error.
pub fn finish(config: Option<Config>, mut diags: Vec<Diagnostic>) -> Result<Loaded, ConfigErrors> {
    sort_diags(&mut diags);
    match config {
        Some(config) if !diags.iter().any(Diagnostic::is_error) => Ok(Loaded { config, warnings: diags }),
        _ => Err(ConfigErrors(diags)),
    }
}

/// Sorts findings by file, line and column so that output is stable.
pub fn sort_diags(diags: &mut [Diagnostic]) {
    diags.sort_by(|a, b| {
        let key = |d: &Diagnostic| d.location.as_ref().map(|l| (l.file.clone(), l.line, l.col));
        key(a).cmp(&key(b)).then_with(|| a.message.cmp(&b.message))
    });
}

/// The merged config as YAML with every secret replaced by `<redacted>`.
pub fn show(config: &Config) -> String {
    let mut v = config.merged.clone();
    redact(&mut v, false);
    serde_yaml::to_string(&v).unwrap_or_default()
}

const SECRET_WORDS: &[&str] = &["key", "token", "secret", "password", "credential", "authorization"];

fn redact(v: &mut serde_yaml::Value, all: bool) {
    match v {
        serde_yaml::Value::Mapping(m) => {
            for (k, child) in m.iter_mut() {
                let key = k.as_str().unwrap_or_default().to_ascii_lowercase();
                // Values of `env` and `headers` maps are secrets by nature (API keys, auth).
                let secret_map = key == "env" || key == "headers";
                if (!secret_map && SECRET_WORDS.iter().any(|w| key.contains(w)) || all) && (child.is_string() || child.is_number()) {
                    *child = serde_yaml::Value::String("<redacted>".into());
                    continue;
                }
                if let serde_yaml::Value::String(text) = child
                    && let Some(masked) = mask_url_password(text)
                {
                    *text = masked;
                    continue;
                }
                redact(child, all || secret_map);
            }
        }
        serde_yaml::Value::Sequence(items) => items.iter_mut().for_each(|c| redact(c, all)),
        _ => {}
    }
}

/// `scheme://user:password@host…` with the password replaced by `<redacted>`; `None` when the
/// text holds no such URL.
pub fn mask_url_password(text: &str) -> Option<String> {
    let scheme_end = text.find("://")? + 3;
    let rest = &text[scheme_end..];
    let at = rest.find('@')?;
    let userinfo = &rest[..at];
    if userinfo.contains('/') {
        return None;
    }
    let colon = userinfo.find(':')?;
    Some(format!("{}{}:<redacted>{}", &text[..scheme_end], &userinfo[..colon], &rest[at..]))
}

/// Where a relative path in the config resolves.
pub fn resolve_path(cwd: &Path, p: &str) -> PathBuf {
    cwd.join(p)
}

#[cfg(test)]
mod tests {
    use super::mask_url_password;

    #[test]
    fn only_the_password_of_a_url_is_masked() {
        assert_eq!(mask_url_password("postgres://u:p@h/db").as_deref(), Some("postgres://u:<redacted>@h/db"));
        assert_eq!(mask_url_password("postgres://u@h/db"), None, "no password, nothing to hide");
        assert_eq!(mask_url_password("https://h/a:b@c"), None, "an @ after the host is not userinfo");
        assert_eq!(mask_url_password("plain text"), None);
    }
}
