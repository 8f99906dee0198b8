//! Shared by the engine and run-core tests: a config with one job `j`, an engine on a manual
//! clock, and bounded waits on the job's runs.
#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use lamplighter_config::{Config, LoadOptions};
use lamplighter_contract::Run;
use lamplighter_jobs::events::Observer;
use lamplighter_jobs::{BuiltinTargets, Engine, EngineOptions, ManualClock, RunFilter, Targets};
use lamplighter_plugins::Registry;

/// 2026-03-02 10:00:00 UTC, a Monday.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 2, 10, 0, 0).single().expect("valid instant")
}

pub fn minutes(m: i64) -> chrono::Duration {
    chrono::Duration::minutes(m)
}

/// One job `j` with the given extra YAML lines, in its own data directory.
pub fn config(dir: &Path, job_yaml: &str) -> Config {
    config_with(dir, "", job_yaml)
}

/// As [`config`], with `top_yaml` added at the top level (e.g. a `worker:` section).
pub fn config_with(dir: &Path, top_yaml: &str, job_yaml: &str) -> Config {
    load_jobs(dir, top_yaml, &[("j", job_yaml)])
}

/// Several jobs, each `(name, its YAML lines)`, in one data directory.
pub fn config_jobs(dir: &Path, jobs: &[(&str, &str)]) -> Config {
    load_jobs(dir, "", jobs)
}

fn load_jobs(dir: &Path, top_yaml: &str, jobs: &[(&str, &str)]) -> Config {
    let body: String = jobs
        .iter()
        .map(|(name, yaml)| format!("    {name}:\n{}", yaml.lines().map(|l| format!("      {l}\n")).collect::<String>()))
        .collect();
    let text = format!("framework:\n  data_dir: {}\n{top_yaml}scheduling:\n  jobs:\n{body}", dir.join("data").display());
    let path = dir.join("lamplighter.yaml");
    std::fs::write(&path, text).expect("write config");
    match lamplighter_config::load(&LoadOptions { path: Some(path), cwd: Some(dir.to_path_buf()), ..Default::default() }) {
        Ok(l) => l.config,
        Err(e) => panic!("test config invalid: {e}"),
    }
}

pub async fn start(config: &Config, clock: &Arc<ManualClock>) -> Engine {
    start_with(config, clock, Arc::new(BuiltinTargets::new(Arc::new(Registry::builtin())))).await
}

/// Starts the engine with the given targets.
pub async fn start_with(config: &Config, clock: &Arc<ManualClock>, targets: Arc<dyn Targets>) -> Engine {
    start_observed(config, clock, targets, Observer::none()).await
}

/// Starts the engine with the given targets, reporting to `observer`.
pub async fn start_observed(config: &Config, clock: &Arc<ManualClock>, targets: Arc<dyn Targets>, observer: Arc<Observer>) -> Engine {
    let _ = tracing_subscriber::fmt().with_env_filter("lamplighter_jobs=info").with_test_writer().try_init();
    let opts =
        EngineOptions { worker_name: "test".into(), clock: clock.clone(), targets, observer, registry: Arc::new(Registry::builtin()) };
    let engine = Engine::start(config, opts).await.expect("engine starts");
    // Time may only move once the scheduler has planned from the start instant: wait for its
    // first pass.
    tokio::time::timeout(Duration::from_secs(10), engine.scheduled_through_now()).await.expect("no scheduler pass in 10 s");
    engine
}

pub async fn runs(engine: &Engine) -> Vec<Run> {
    runs_of(engine, "j").await
}

/// The runs of job `job`, as [`runs`] orders them.
pub async fn runs_of(engine: &Engine, job: &str) -> Vec<Run> {
    let mut runs =
        engine.service().list_runs(RunFilter { job: Some(job.into()), limit: Some(500), ..Default::default() }).await.expect("list").runs;
    runs.sort_by_key(|r| (r.scheduled_at, r.enqueued_at));
    runs
}

/// Waits (up to 10 s of real time) until `pred` holds for the job's runs: reads them again at
/// each change the engine announces, never on a timer.
pub async fn until(engine: &Engine, what: &str, pred: impl Fn(&[Run]) -> bool) -> Vec<Run> {
    until_of(engine, "j", what, pred).await
}

/// As [`until`], for the runs of job `job`.
pub async fn until_of(engine: &Engine, job: &str, what: &str, pred: impl Fn(&[Run]) -> bool) -> Vec<Run> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // Subscribed before the first read: a change after it is never missed.
    let mut changes = engine.service().watch(lamplighter_jobs::Interest::Anything);
    loop {
        let r = runs_of(engine, job).await;
        if pred(&r) {
            return r;
        }
        if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() {
            panic!("timed out waiting for {what}; runs: {r:#?}");
        }
    }
}

pub fn finished(runs: &[Run]) -> bool {
    runs.iter().all(|r| r.status.is_final())
}

/// Waits (up to 20 s of real time) until the run satisfies `pred`, reading it at each change.
pub async fn until_run(engine: &Engine, id: &str, what: &str, pred: impl Fn(&Run) -> bool) -> Run {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut changes = engine.service().watch(lamplighter_jobs::Interest::Anything);
    loop {
        let run = engine.service().get_run(id).await.expect("run");
        if pred(&run) {
            return run;
        }
        if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() {
            panic!("timed out waiting for {what}; run: {run:#?}");
        }
    }
}

pub async fn ended(engine: &Engine, id: &str) -> Run {
    until_run(engine, id, "the run to end", |r| r.status.is_final()).await
}

pub async fn waiting(engine: &Engine, id: &str) -> Run {
    until_run(engine, id, "the run to wait for approval", |r| r.status == lamplighter_jobs::RunStatus::WaitingApproval).await
}

/// Waits (up to 20 s of real time) until no run holds an executor slot. A run's task gives its
/// slot back just after its last write, so a reader that saw the write may still count it.
pub async fn slots_free(engine: &Engine, what: &str) {
    if tokio::time::timeout(Duration::from_secs(20), engine.idle()).await.is_err() {
        panic!("timed out: {what} ({} slots held)", engine.running_count());
    }
}

pub async fn detail(engine: &Engine, id: &str) -> lamplighter_jobs::RunDetail {
    engine.service().get_run_detail(id).await.expect("run detail")
}
