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

async fn run_once(engine: &Engine) -> lamplighter_contract::Run {
    let id = engine.service().trigger_job("j", TriggerRequest::default()).await.expect("trigger").run_id;
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

#[tokio::test]
async fn an_around_hook_wraps_a_plugin_action_and_may_replace_its_parameters_which_a_before_hook_may_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bindings = "\
- {event: \"plugin:file-save:action:before\", plugin: gate, hook: record, priority: 10}
- {event: \"plugin:file-save:action:around\", plugin: gate, hook: wrap-save, priority: 20}
- {event: \"plugin:file-save:action:*\", plugin: gate, hook: record-step, priority: 30}";
    let engine = start(dir.path(), &config(dir.path(), bindings, SAVE)).await;
    let run = run_once(&engine).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{:?}", run.error);
    assert_eq!(std::fs::read_to_string(dir.path().join("data/hooked.txt")).ok().as_deref(), Some("from the hook"));
    assert!(!dir.path().join("data/out.txt").exists(), "the action ran with the around hook's parameters");
    let before = recorded(dir.path(), "record").expect("the before hook ran");
    assert_eq!((before["timing"].as_str(), &before["input"]), (Some("before"), &serde_json::json!({"path": "out.txt", "content": "x"})));
    // The around hook is called again after the action, with its outcome.
    let after = recorded(dir.path(), "wrap-save").expect("the around hook ran");
    assert_eq!(after["event"], "plugin:file-save:action:around");
    assert_eq!((after["phase"].as_str(), after["outcome"].as_str()), (Some("after"), Some("succeeded")));
    // A `*` binding is not called as `around`: its last call is the `after` side.
    assert_eq!(recorded(dir.path(), "record-step").expect("called")["timing"], "after");
    engine.shutdown(std::time::Duration::from_secs(5)).await;

    // The same hook bound `before` replaces nothing.
    let dir = tempfile::tempdir().expect("tempdir");
    let bindings = "- {event: \"plugin:file-save:action:before\", plugin: gate, hook: wrap-save}";
    let engine = start(dir.path(), &config(dir.path(), bindings, SAVE)).await;
    assert_eq!(run_once(&engine).await.status, RunStatus::Succeeded);
    assert!(dir.path().join("data/out.txt").exists() && !dir.path().join("data/hooked.txt").exists());
    engine.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test]
async fn an_around_hook_on_session_start_gives_an_agent_its_first_message_and_may_stop_it() {
    use lamplighter_tests::llm::{Reply, ScriptedLlm, user_input};
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((1, 1), |req| Reply::Text(format!("did: {}", user_input(req)))).await;
    let top = format!(
        "ai:\n  default_model: m\n  providers:\n    p:\n      base_url: {}\n      models:\n        m: {{id: m}}\nagents:\n  a: {{}}\n  b: {{}}\n\
         hooks:\n  bindings:\n    - {{event: \"agent:a:session-start:around\", plugin: gate, hook: swap-task}}\n    \
         - {{event: \"agent:b:session-start:around\", plugin: gate, hook: veto}}\n    - {{event: \"agent:*:session-start:before\", plugin: gate, hook: record}}\n",
        llm.base_url()
    );
    let config = config_with(dir.path(), &top, "type: agent\nagent: a\ninput: the task as scheduled");
    let engine = start(dir.path(), &config).await;
    let run = run_once(&engine).await;
    assert_eq!((run.status, run.output.clone()), (RunStatus::Succeeded, Some(serde_json::json!("did: the task the hook gave"))));
    let event = recorded(dir.path(), "record").expect("the session-start event");
    assert_eq!(event["event"], "agent:a:session-start:before");
    assert_eq!((event["input"].as_str(), event["data"]["depth"].as_u64()), (Some("the task as scheduled"), Some(0)));
    // The replaced message is the recorded one (a resumed conversation reads it back).
    let detail = engine.service().get_run_detail(&run.id).await.expect("detail");
    assert_eq!(detail.calls[0].request.as_ref().map(|r| r["input"].clone()), Some(serde_json::json!("the task the hook gave")));

    let stopped = engine.service().run_agent("b", None, None, None).await.expect("run_agent").run_id;
    let run = ended(&engine, &stopped).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error.as_deref(), Some("agent \"b\": the conversation was not started: cancelled by hook gate.veto: change freeze"));
    assert_eq!(llm.seen().len(), 1, "the stopped conversation called no model");
    engine.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_replaced_first_message_survives_a_resume_and_a_tool_call_is_asked_as_the_model_wrote_it() {
    use lamplighter_tests::llm::{Reply, ScriptedLlm, tool_results, user_input};
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((1, 1), |req| match tool_results(req) {
        0 => Reply::Tools(vec![("file-save__save".into(), r#"{"path": "asked.txt", "content": "as asked"}"#.into())]),
        _ => Reply::Text(format!("task was: {}", user_input(req))),
    })
    .await;
    let top = format!(
        "ai:\n  default_model: m\n  providers:\n    p:\n      base_url: {}\n      models:\n        m: {{id: m}}\n\
         agents:\n  a: {{plugins: [file-save], tool_approval: ask}}\n\
         hooks:\n  bindings:\n    - {{event: \"agent:a:session-start:around\", plugin: gate, hook: swap-task}}\n    \
         - {{event: \"plugin:file-save:action:around\", plugin: gate, hook: wrap-save}}\n",
        llm.base_url()
    );
    let config = config_with(dir.path(), &top, "type: agent\nagent: a\ninput: the task as scheduled");
    let engine = start(dir.path(), &config).await;
    let id = engine.service().trigger_job("j", TriggerRequest::default()).await.expect("trigger").run_id;
    support::waiting(&engine, &id).await;
    // Asked as the model wrote it; nothing ran, no action hook was called, while it waited.
    let approvals = engine.service().list_approvals().await.expect("approvals");
    assert!(approvals[0].question.as_ref().is_some_and(|q| q.to_string().contains("asked.txt")), "{approvals:?}");
    assert_eq!(recorded(dir.path(), "wrap-save"), None);
    let decision =
        lamplighter_jobs::DecisionRequest { run_id: id.clone(), step: None, approve: true, comment: None, decided_by: "ana".into() };
    engine.service().decide(decision).await.expect("approve");
    let run = ended(&engine, &id).await;
    // Resumed: the conversation's first message is the one the hook gave, read back from its
    // records; the approved action ran with its around hook's parameters.
    assert_eq!((run.status, run.output.clone()), (RunStatus::Succeeded, Some(serde_json::json!("task was: the task the hook gave"))));
    assert_eq!(llm.seen().iter().map(|s| user_input(&s.body)).collect::<Vec<_>>(), ["the task the hook gave", "the task the hook gave"]);
    assert_eq!(std::fs::read_to_string(dir.path().join("data/hooked.txt")).ok().as_deref(), Some("from the hook"));
    engine.shutdown(std::time::Duration::from_secs(5)).await;
}
