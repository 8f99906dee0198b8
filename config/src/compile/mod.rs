//! `compile`: raw config → resolved, validated config. Collects every error with its location;
//! checks names across sections; decides what is disabled (e.g. an agent whose provider key is
//! unset) and why.
//!
//! This file runs the sections in order; each section's checks live in a file of its own.

mod ai;
mod jobs;
mod storage;
mod telemetry;
mod types;
mod wasm;
mod worker;
mod workflows;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::diag::Diagnostic;
use crate::load::{Loaded, SourceMap, keys};
use crate::raw;
use crate::schedule;

pub use types::{
    Backoff, CatchUp, Config, DEFAULT_LEASE, DEFAULT_PG_POOL_SIZE, DEFAULT_PG_STATEMENT_TIMEOUT, Disabled, JobConfig, McpAuth,
    McpTransport, Overlap, Retention, RetryPolicy, StorageConfig, Target, WASM_CAPABILITIES, WasmConfig, WorkerConfig,
};

struct Compiler<'a> {
    loaded: &'a Loaded,
    diags: Vec<Diagnostic>,
    disabled: BTreeMap<Disabled, String>,
}

/// Consumes the loaded tree: the merged YAML and source map move into the result (a large
/// config must not be held twice); the raw tree is dropped once compiled.
pub(crate) fn compile(mut loaded: Loaded, cwd: &Path) -> (Option<Config>, Vec<Diagnostic>) {
    // The jobs are moved, not copied: with thousands of jobs a copy doubles the peak.
    let sched = loaded.raw.scheduling.take().unwrap_or_default();
    let (mut config, diags) = compile_borrowed(&loaded, sched, cwd);
    config.sources = loaded.sources;
    config.merged = loaded.merged;
    config.root = loaded.root;
    (Some(config), diags)
}

fn compile_borrowed(loaded: &Loaded, sched: raw::Scheduling, cwd: &Path) -> (Config, Vec<Diagnostic>) {
    let mut c = Compiler { loaded, diags: Vec::new(), disabled: BTreeMap::new() };
    let raw = &loaded.raw;
    let fw = raw.framework.clone().unwrap_or_default();
    let data_dir = cwd.join(fw.data_dir.as_deref().unwrap_or("./data"));
    let log_level = fw.log_level.as_deref().and_then(|l| c.log_level(l));
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
    let agents = c.agents(&providers, ai.default_model.as_deref(), cwd);
    let workflows = c.workflows();
    let pipelines = c.pipelines();
    let mut jobs = BTreeMap::new();
    for (name, mut job) in sched.jobs.into_iter().flatten() {
        if let Some(j) = c.job(&name, &mut job, (&default_timezone, &default_tz), cwd) {
            jobs.insert(name.clone(), j);
        }
    }
    let worker = c.worker(raw.worker.as_ref());
    let telemetry = c.telemetry(raw.telemetry.as_ref());
    let hooks = c.hooks(raw.hooks.as_ref());
    let wasm = c.wasm(raw.plugins.as_ref().and_then(|p| p.wasm.as_ref()));
    let plugin_dirs = raw.plugins.as_ref().and_then(|p| p.dirs.clone()).unwrap_or_default().iter().map(|d| cwd.join(d)).collect();
    let config = Config {
        root: PathBuf::new(),
        name: fw.name.unwrap_or_else(|| "lamplighter".to_string()),
        data_dir,
        log_level,
        default_timezone,
        storage,
        jobs,
        default_model: ai.default_model,
        providers,
        agents,
        pipelines,
        workflows,
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

impl Compiler<'_> {
    fn err(&mut self, path: &[&str], msg: String) {
        let loc = self.loaded.sources.locate(&keys(path));
        self.diags.push(Diagnostic::error(loc, msg));
    }

    fn warn(&mut self, path: &[&str], msg: String) {
        let loc = self.loaded.sources.locate(&keys(path));
        self.diags.push(Diagnostic::warning(loc, msg));
    }
}
