//! Hooks (SPEC §7) on the real engine and SQLite with a real WASM plugin
//! (`fixtures/plugins/gate`: `veto` cancels; other hooks write the event they were given to a
//! file of the plugin's sandbox): a `before` hook cancels a run with its reason recorded, only
//! the bindings that match fire, in priority order, `onerror` fires on a failure and not on a
//! success, and a hook that fails does not break the run.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lamplighter_config::Config;
use lamplighter_jobs::events::Observer;
use lamplighter_jobs::{BuiltinTargets, Engine, ManualClock, RunStatus, TriggerRequest};
use lamplighter_plugins::{Registry, WasmOptions};
use serde_json::Value;

use support::{config_with, ended, start_observed, t0};

const SAVE: &str = "type: plugin\nplugin: file-save\naction: save\nparameters: { path: out.txt, content: x }";
const FAIL: &str = "type: plugin\nplugin: file-read\naction: read\nparameters: { path: missing.txt }";

fn registry(dir: &Path) -> Arc<Registry> {
    let plugins = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/plugins");
    let opts = WasmOptions { allowed_capabilities: vec!["fs-write".into()], data_dir: dir.join("data"), ..WasmOptions::default() };
    let registry = Registry::load(&[plugins], opts);
    let gate = registry.plugins().iter().find(|p| p.name == "gate").expect("gate fixture found");
    assert_eq!(gate.error, None, "gate fixture loads");
    Arc::new(registry)
}

/// Job `j` (`job_yaml`) with these hook bindings (YAML list items).
fn config(dir: &Path, bindings: &str, job_yaml: &str) -> Config {
    let bindings: String = bindings.lines().map(|l| format!("    {l}\n")).collect();
    config_with(dir, &format!("hooks:\n  bindings:\n{bindings}"), job_yaml)
}

async fn start(dir: &Path, config: &Config) -> Engine {
    let registry = registry(dir);
    let observer = Observer::new(&opentelemetry::global::meter("test"), None, Some(registry.clone()));
    let clock = Arc::new(ManualClock::new(t0()));
    start_observed(config, &clock, Arc::new(BuiltinTargets::new(registry)), observer).await
}

async fn run_once(engine: &Engine) -> lamplighter_jobs::Run {
    let id = engine.trigger_job("j", TriggerRequest::default()).await.expect("trigger").run_id;
    ended(engine, &id).await
}

/// The event a recording hook was last given, if it was called.
fn recorded(dir: &Path, hook: &str) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join("data/plugins/gate").join(hook)).ok()?;
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("hook {hook} got JSON ({e}): {text}")))
}

#[tokio::test]
async fn a_before_hook_cancels_the_run_with_its_reason_and_later_hooks_do_not_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bindings = "\
- {event: \"scheduler:*:job-execute:before\", plugin: gate, hook: record, priority: 900}
- {event: \"scheduler:j:job-execute:before\", plugin: gate, hook: veto, priority: 100}";
    let engine = start(dir.path(), &config(dir.path(), bindings, SAVE)).await;
    let run = run_once(&engine).await;
    assert_eq!(run.status, RunStatus::Cancelled);
    assert_eq!(run.error.as_deref(), Some("cancelled by hook gate.veto: change freeze"));
    assert!(!dir.path().join("data/out.txt").exists(), "the job's action did not run");
    assert_eq!(recorded(dir.path(), "record"), None, "priority 100 ran first and stopped the rest");
    engine.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test]
async fn hooks_get_the_event_in_priority_order_and_onerror_only_on_failure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bindings = "\
- {event: \"plugin:file-save:action:after\", plugin: gate, hook: record}
- {event: \"plugin:*:action:onerror\", plugin: gate, hook: record-error}
- {event: \"scheduler:j:job-execute:*\", plugin: gate, hook: record-step, priority: 10}";
    let engine = start(dir.path(), &config(dir.path(), bindings, SAVE)).await;
    let run = run_once(&engine).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{:?}", run.error);
    let after = recorded(dir.path(), "record").expect("the after hook ran");
    assert_eq!(after["event"], "plugin:file-save:action:after");
    assert_eq!(
        (after["domain"].as_str(), after["component"].as_str(), after["timing"].as_str()),
        (Some("plugin"), Some("file-save"), Some("after"))
    );
    assert_eq!(after["run"]["id"], run.id.as_str());
    assert_eq!(after["run"]["job"], "j");
    assert_eq!(after["data"], serde_json::json!({"plugin": "file-save", "action": "save"}));
    assert_eq!(after["outcome"], "succeeded");
    assert_eq!(recorded(dir.path(), "record-error"), None, "no onerror on success");
    // `*` timing: before and after both fired; the after came last.
    let job = recorded(dir.path(), "record-step").expect("job-execute hooks ran");
    assert_eq!((job["event"].as_str(), job["outcome"].as_str()), (Some("scheduler:j:job-execute:after"), Some("succeeded")));
    engine.shutdown(std::time::Duration::from_secs(5)).await;

    // The same hooks on a job whose action fails.
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = start(dir.path(), &config(dir.path(), bindings, FAIL)).await;
    let run = run_once(&engine).await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = recorded(dir.path(), "record-error").expect("the onerror hook ran");
    assert_eq!(error["event"], "plugin:file-read:action:onerror");
    assert_eq!(error["outcome"], "failed");
    assert!(error["error"].as_str().is_some_and(|e| e.contains("missing.txt")), "{error}");
    assert_eq!(recorded(dir.path(), "record"), None, "the after binding names file-save only");
    let job = recorded(dir.path(), "record-step").expect("job-execute hooks ran");
    assert_eq!(job["event"], "scheduler:j:job-execute:onerror");
    engine.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_hook_that_fails_is_logged_and_the_run_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bindings = "\
- {event: \"plugin:*:action:before\", plugin: gate, hook: crash, priority: 1}
- {event: \"scheduler:j:job-execute:after\", plugin: gate, hook: veto}";
    let engine = start(dir.path(), &config(dir.path(), bindings, SAVE)).await;
    let run = run_once(&engine).await;
    // A trapping `before` hook does not cancel; an `after` hook cannot cancel what happened.
    assert_eq!(run.status, RunStatus::Succeeded, "{:?}", run.error);
    assert_eq!(std::fs::read_to_string(dir.path().join("data/out.txt")).ok().as_deref(), Some("x"));
    engine.shutdown(std::time::Duration::from_secs(5)).await;
}
