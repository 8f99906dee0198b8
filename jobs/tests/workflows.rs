//! Workflows on the real engine and SQLite: branching, `when`, parallel join and fail-fast,
//! templates, durable retries, approvals (approve, reject, timeout, twice, at once, after a
//! restart), cancel while waiting, a run keeps its definition across a reload, workflows run by
//! hand, and an agent step whose provider is unreachable.
//! Plugin steps are `shell-exec` commands; time moves only on the manual clock.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lamplighter_config::Config;
use lamplighter_jobs::{DecisionRequest, Engine, ManualClock, RunDetail, RunStatus, ServiceError, StepStatus, StepView, TriggerRequest};
use serde_json::json;

use support::{config_with, detail, ended, minutes, slots_free, start, t0, until_run, waiting};

/// A job `j` running workflow `w` with these steps (YAML list items, indented as under `steps:`).
fn workflow(dir: &Path, steps: &str, job_extra: &str) -> Config {
    let steps: String = steps.lines().map(|l| format!("      {l}\n")).collect();
    let top = format!("workflows:\n  w:\n    steps:\n{steps}");
    config_with(dir, &top, &format!("type: workflow\nworkflow: w\n{job_extra}"))
}

fn sh(id: &str, command: &str) -> String {
    format!(
        "- id: {id}\n  type: plugin\n  plugin: shell-exec\n  action: run\n  parameters: {{command: {}}}\n",
        serde_json::to_string(command).expect("json")
    )
}

async fn trigger(engine: &Engine, input: serde_json::Value) -> String {
    engine.service().trigger_job("j", TriggerRequest { input: Some(input), ..Default::default() }).await.expect("trigger").run_id
}

fn flat(steps: &[StepView]) -> Vec<&StepView> {
    steps.iter().flat_map(|s| std::iter::once(s).chain(flat(&s.steps))).collect()
}

fn step<'a>(d: &'a RunDetail, id: &str) -> &'a StepView {
    flat(&d.steps).into_iter().find(|s| s.id == id).unwrap_or_else(|| panic!("no step {id} in {:#?}", d.steps))
}

fn statuses(d: &RunDetail) -> Vec<(String, Option<StepStatus>)> {
    flat(&d.steps).into_iter().map(|s| (s.id.clone(), s.status)).collect()
}

fn data(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join("data").join(file)).unwrap_or_default()
}

fn decision(run: &str, approve: bool, by: &str, comment: Option<&str>) -> DecisionRequest {
    DecisionRequest { run_id: run.into(), step: None, approve, comment: comment.map(Into::into), decided_by: by.into() }
}

const BRANCHING: &str = "\
- id: check
  type: condition
  condition: \"${input.go}\"
  then: [yes]
  else: [no]
- id: yes
  type: plugin
  plugin: shell-exec
  action: run
  parameters: {command: \"printf yes >> log\"}
- id: no
  type: plugin
  plugin: shell-exec
  action: run
  parameters: {command: \"printf no >> log\"}
- id: always
  when: \"${steps.yes.output.exit_code}\"
  type: plugin
  plugin: shell-exec
  action: run
  parameters: {command: \"printf ' after-yes' >> log\"}
";

#[tokio::test]
async fn a_condition_branches_both_ways_and_when_skips_a_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&workflow(dir.path(), BRANCHING, ""), &clock).await;

    let taken = trigger(&engine, json!({"go": true})).await;
    assert_eq!(ended(&engine, &taken).await.status, RunStatus::Succeeded);
    let d = detail(&engine, &taken).await;
    use StepStatus::*;
    let want =
        |a, b, c, e| vec![("check".to_string(), Some(a)), ("yes".into(), Some(b)), ("no".into(), Some(c)), ("always".into(), Some(e))];
    // exit_code 0 renders "0": false, so `always` is skipped even on the yes branch.
    assert_eq!(statuses(&d), want(Succeeded, Succeeded, Skipped, Skipped));
    assert_eq!(step(&d, "check").output, Some(json!({"result": true, "value": "true", "branch": "then"})));
    assert_eq!(step(&d, "no").error.as_deref(), Some("skipped: condition \"check\" took the then branch"));
    assert_eq!(data(dir.path(), "log"), "yes");

    let other = trigger(&engine, json!({"go": false})).await;
    assert_eq!(ended(&engine, &other).await.status, RunStatus::Succeeded);
    let d = detail(&engine, &other).await;
    assert_eq!(statuses(&d), want(Succeeded, Skipped, Succeeded, Skipped));
    assert!(step(&d, "always").error.as_deref().is_some_and(|e| e.contains("which is false")), "{:?}", step(&d, "always"));
    assert_eq!(data(dir.path(), "log"), "yesno");
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn parallel_children_join_and_templates_reach_their_outputs_and_json_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    let steps = format!(
        "- id: both\n  type: parallel\n  steps:\n{}{}{}",
        indent(&sh("json", "printf '{\"k\": {\"deep\": \"v\"}}'")),
        indent(&sh("text", "printf two")),
        sh(
            "join",
            "printf '%s-%s-%s-%s' '${steps.json.output.stdout.k.deep}' '${steps.text.output.stdout}' '${input.who}' '${steps.nope.output}' > joined"
        )
    );
    let engine = start(&workflow(dir.path(), &steps, ""), &clock).await;
    let id = trigger(&engine, json!({"who": "me"})).await;
    let run = ended(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(data(dir.path(), "joined"), "v-two-me-${steps.nope.output}", "an unknown step stays as written");
    let d = detail(&engine, &id).await;
    assert_eq!(d.steps.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["both", "join"]);
    assert_eq!(d.steps[0].steps.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["json", "text"], "children nest under their parallel");
    let out = step(&d, "both").output.clone().expect("parallel output");
    assert_eq!(out["text"]["stdout"], json!("two"), "a parallel's output is its children's, by id");
    engine.shutdown(Duration::from_secs(5)).await;
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}\n")).collect()
}

#[tokio::test]
async fn the_first_failed_step_fails_the_run_and_cancels_its_parallel_siblings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    let steps = format!(
        "- id: both\n  type: parallel\n  steps:\n{}{}{}",
        indent(&sh("slow", "sleep 30")),
        indent(&sh("broken", "exit 3")),
        sh("after", "printf after > after")
    );
    let engine = start(&workflow(dir.path(), &steps, "retries: {max: 0}"), &clock).await;
    let begun = std::time::Instant::now();
    let id = trigger(&engine, json!(null)).await;
    let run = ended(&engine, &id).await;
    assert!(begun.elapsed() < Duration::from_secs(20), "the sleeping sibling was not stopped");
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.expect("error");
    assert!(error.starts_with("step \"broken\" failed: ") && error.contains("code 3"), "{error}");
    let d = detail(&engine, &id).await;
    use StepStatus::*;
    assert_eq!(
        statuses(&d),
        [("both".to_string(), Some(Failed)), ("slow".into(), Some(Cancelled)), ("broken".into(), Some(Failed)), ("after".into(), None)]
    );
    assert_eq!(step(&d, "slow").error.as_deref(), Some("cancelled: step \"broken\" in the same parallel failed"));
    assert!(!dir.path().join("data/after").exists());
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_retry_resumes_at_the_failed_step_with_earlier_outputs_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    let steps = format!(
        "{}{}{}",
        sh("first", "printf 1 >> log; date +%s%N"),
        sh("flaky", "test -f flag && printf 2 >> log"),
        sh("last", "printf '3(${steps.first.output.stdout})' >> log")
    );
    let engine = start(&workflow(dir.path(), &steps, "retries: {max: 1, backoff: fixed, initial: 1m}"), &clock).await;
    let id = trigger(&engine, json!(null)).await;
    let failed = ended(&engine, &id).await;
    assert_eq!(failed.status, RunStatus::Failed);
    assert!(failed.error.as_deref().is_some_and(|e| e.starts_with("step \"flaky\" failed")), "{failed:?}");
    let first_output = step(&detail(&engine, &id).await, "first").output.clone().expect("first's output")["stdout"].clone();

    std::fs::write(dir.path().join("data/flag"), "").expect("flag");
    clock.advance(minutes(1));
    let retry = until_run(&engine, &id, "a retry", |r| r.next_run_id.is_some()).await.next_run_id.expect("retry id");
    let run = ended(&engine, &retry).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!((run.attempt, run.root_id.as_str()), (2, id.as_str()));
    // `first` ran once; `last` saw its output from the first attempt (less its newline, as `$(…)`).
    assert_eq!(data(dir.path(), "log"), format!("123({})", first_output.as_str().expect("stdout").trim_end()));
    let d = detail(&engine, &retry).await;
    assert_eq!((step(&d, "first").attempt, step(&d, "flaky").attempt, step(&d, "last").attempt), (Some(1), Some(2), Some(2)));
    engine.shutdown(Duration::from_secs(5)).await;
}

const GATED: &str = "\
- id: draft
  type: plugin
  plugin: shell-exec
  action: run
  parameters: {command: \"printf draft-1\"}
- id: gate
  type: approval
  input: \"Publish ${steps.draft.output.stdout}?\"
- id: publish
  when: \"${steps.gate.output.approved}\"
  type: plugin
  plugin: shell-exec
  action: run
  parameters: {command: \"printf published >> log\"}
";

#[tokio::test]
async fn an_approval_waits_without_a_slot_and_an_approval_resumes_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&workflow(dir.path(), GATED, ""), &clock).await;
    let id = trigger(&engine, json!(null)).await;
    let run = waiting(&engine, &id).await;
    assert_eq!(run.finished_at, None);
    slots_free(&engine, "a waiting run holds no executor slot").await;
    let approvals = engine.service().list_approvals().await.expect("approvals");
    assert_eq!(approvals.len(), 1);
    assert_eq!((approvals[0].run_id.as_str(), approvals[0].step.as_str()), (id.as_str(), "gate"));
    assert_eq!(approvals[0].question, Some(json!("Publish draft-1?")));
    assert!(!dir.path().join("data/log").exists());

    clock.advance(minutes(5));
    let decided = engine.service().decide(decision(&id, true, "ana", Some("looks good"))).await.expect("approve");
    assert_eq!(decided.run_status, RunStatus::Queued);
    let run = ended(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(run.started_at, Some(t0()), "a resumed run keeps its first start");
    assert_eq!(data(dir.path(), "log"), "published");
    let d = detail(&engine, &id).await;
    assert_eq!(
        step(&d, "gate").output,
        Some(json!({"approved": true, "comment": "looks good", "decided_by": "ana", "decided_at": "2026-03-02T10:05:00.000Z"}))
    );
    assert_eq!(step(&d, "draft").attempt, Some(1));

    // Twice: a clear error naming who decided.
    let again = engine.service().decide(decision(&id, true, "bo", None)).await.expect_err("decided twice");
    assert!(matches!(again, ServiceError::NotWaiting(_)), "{again:?}");
    assert_eq!(
        again.to_string(),
        format!("step \"gate\" of run \"{id}\" was already approved by ana at 2026-03-02T10:05:00Z; the run is now succeeded")
    );
    assert!(engine.service().list_approvals().await.expect("approvals").is_empty());
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_rejection_fails_the_run_naming_the_step_and_two_decisions_at_once_record_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&workflow(dir.path(), GATED, ""), &clock).await;
    let id = trigger(&engine, json!(null)).await;
    waiting(&engine, &id).await;
    let (a, b) = tokio::join!(
        engine.service().decide(decision(&id, false, "ana", Some("not now"))),
        engine.service().decide(decision(&id, true, "bo", None))
    );
    assert_eq!([a.is_ok(), b.is_ok()].iter().filter(|ok| **ok).count(), 1, "exactly one decision is recorded: {a:?} / {b:?}");
    let run = ended(&engine, &id).await;
    let d = detail(&engine, &id).await;
    if a.is_ok() {
        assert_eq!(run.status, RunStatus::Failed);
        assert_eq!(run.error.as_deref(), Some("step \"gate\" was rejected by ana: not now"));
        assert_eq!(step(&d, "gate").status, Some(StepStatus::Failed));
        assert_eq!(step(&d, "publish").status, None, "nothing after a rejection runs");
    } else {
        assert_eq!(run.status, RunStatus::Succeeded);
    }
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_timeout_applies_on_timeout_when_nobody_decides() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    let steps = GATED.replace("  input: \"Publish", "  timeout: 1h\n  on_timeout: approve\n  input: \"Publish");
    let rejecting = steps.replace("on_timeout: approve", "on_timeout: reject");
    let engine = start(&workflow(dir.path(), &steps, ""), &clock).await;
    let id = trigger(&engine, json!(null)).await;
    waiting(&engine, &id).await;
    let approvals = engine.service().list_approvals().await.expect("approvals");
    assert_eq!(approvals[0].timeout_at, Some(t0() + minutes(60)));
    assert_eq!(approvals[0].on_timeout.as_deref(), Some("approve"));
    clock.advance(minutes(59));
    engine.scheduled_through_now().await;
    assert_eq!(engine.service().get_run(&id).await.expect("run").status, RunStatus::WaitingApproval, "not before the timeout");
    clock.advance(minutes(1));
    let run = ended(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    let gate = step(&detail(&engine, &id).await, "gate").output.clone().expect("decision");
    assert_eq!(
        (gate["approved"].clone(), gate["decided_by"].clone(), gate["comment"].clone()),
        (json!(true), json!("timeout"), json!("no decision within 1h"))
    );
    engine.shutdown(Duration::from_secs(5)).await;

    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&workflow(dir.path(), &rejecting, "retries: {max: 3}"), &clock).await;
    let id = trigger(&engine, json!(null)).await;
    waiting(&engine, &id).await;
    clock.advance(minutes(61));
    let run = ended(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error.as_deref(), Some("step \"gate\" was rejected: no decision within 1h (on_timeout: reject)"));
    engine.scheduled_through_now().await;
    assert_eq!(
        engine.service().get_run(&id).await.expect("run").next_run_id.as_deref(),
        Some(""),
        "a rejection is not retried: no attempt follows"
    );
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_waiting_run_survives_a_restart_and_can_be_cancelled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    let config = workflow(dir.path(), GATED, "");
    let engine = start(&config, &clock).await;
    let a = trigger(&engine, json!(null)).await;
    let b = trigger(&engine, json!(null)).await;
    waiting(&engine, &a).await;
    waiting(&engine, &b).await;
    engine.shutdown(Duration::from_secs(5)).await;
    drop(engine);

    let engine = start(&config, &clock).await;
    assert_eq!(engine.service().get_run(&a).await.expect("run").status, RunStatus::WaitingApproval, "a restart does not interrupt a wait");
    assert_eq!(engine.service().list_approvals().await.expect("approvals").len(), 2);
    engine.service().decide(decision(&a, true, "ana", None)).await.expect("approve after restart");
    assert_eq!(ended(&engine, &a).await.status, RunStatus::Succeeded);
    assert_eq!(data(dir.path(), "log"), "published");

    let cancelled = engine.service().cancel_run(&b).await.expect("cancel a waiting run");
    assert_eq!(cancelled.status, RunStatus::Cancelled);
    assert_eq!(step(&detail(&engine, &b).await, "gate").status, Some(StepStatus::Cancelled));
    let late = engine.service().decide(decision(&b, true, "ana", None)).await.expect_err("decide a cancelled run");
    assert_eq!(late.to_string(), format!("run \"{b}\" is cancelled, not waiting for approval"));
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_workflow_runs_by_hand_and_an_unreachable_provider_fails_its_agent_step_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    let steps = format!(
        "{}- id: summarize\n  type: agent\n  agent: writer\n  input: \"${{steps.fetch.output.stdout}}\"\n",
        sh("fetch", "printf '${input}' > got")
    );
    let top = format!(
        "ai:\n  providers:\n    p:\n      base_url: http://127.0.0.1:9\n      max_retries: 0\n      models:\n        m: {{id: m}}\nagents:\n  writer:\n    model: m\n    provider: p\nworkflows:\n  w:\n    steps:\n{}",
        steps.lines().map(|l| format!("      {l}\n")).collect::<String>()
    );
    let config = config_with(dir.path(), &top, "type: plugin\nplugin: file-save\naction: save\nparameters: {path: x, content: y}");
    let engine = start(&config, &clock).await;
    let started = engine.service().run_workflow("w", Some(json!("hello")), Some("k1".into()), None).await.expect("run workflow");
    let again = engine.service().run_workflow("w", Some(json!("hello")), Some("k1".into()), None).await.expect("same key");
    assert_eq!((again.run_id.as_str(), again.created), (started.run_id.as_str(), false));
    let run = ended(&engine, &started.run_id).await;
    assert_eq!(run.job, "workflow:w");
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap_or_default();
    assert!(
        error.starts_with("step \"summarize\" failed: agent \"writer\": model call failed: provider \"p\": ")
            && error.contains("Connection refused")
            && error.ends_with("(gave up after 1 attempts)"),
        "{error}"
    );
    assert_eq!(data(dir.path(), "got"), "hello");
    let missing = engine.service().run_workflow("nope", None, None, None).await.expect_err("unknown workflow");
    assert_eq!(missing.to_string(), "workflow \"nope\" not found; known workflows: w");
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn an_approval_inside_a_parallel_is_the_only_wait_and_approving_it_finishes_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    let steps = format!(
        "- id: both\n  type: parallel\n  steps:\n{}{}- id: after\n  type: plugin\n  plugin: shell-exec\n  action: run\n  parameters: {{command: \"echo done >> log\"}}\n",
        sh("work", "echo work >> log").lines().map(|l| format!("    {l}\n")).collect::<String>(),
        "    - id: gate\n      type: approval\n",
    );
    let config = workflow(dir.path(), &steps, "");
    let engine = start(&config, &clock).await;
    let id = trigger(&engine, json!(null)).await;
    waiting(&engine, &id).await;
    engine.shutdown(Duration::from_secs(5)).await;
    drop(engine);
    // As the version before migration 0006 left the database: the parallel recorded as a
    // second wait (and that migration not applied yet). The upgrade repairs it.
    let db = dir.path().join("data/lamplighter.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display())).await.expect("open db");
    sqlx::query("UPDATE ll_steps SET status = 'waiting_approval' WHERE step = 'both'").execute(&pool).await.expect("old shape");
    sqlx::query("ALTER TABLE ll_steps DROP COLUMN resumes_on_reject").execute(&pool).await.expect("old columns");
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 6").execute(&pool).await.expect("before 0006");
    pool.close().await;
    let engine = start(&config, &clock).await;
    // The parallel itself is not a wait to decide: no step needs naming.
    let approvals = engine.service().list_approvals().await.expect("approvals");
    assert_eq!(approvals.iter().map(|a| a.step.as_str()).collect::<Vec<_>>(), ["gate"]);
    engine.service().decide(decision(&id, true, "ana", None)).await.expect("approve without naming the step");
    let run = ended(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(data(dir.path(), "log"), "work\ndone\n");
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_run_keeps_the_workflow_definition_it_started_with_across_a_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&workflow(dir.path(), GATED, ""), &clock).await;
    let id = trigger(&engine, json!(null)).await;
    waiting(&engine, &id).await;
    // The workflow changes while the run waits: another publish command, and a step more.
    let changed = format!("{}{}", GATED.replace("printf published >> log", "printf changed >> log"), sh("extra", "printf extra >> log"));
    engine.reload(&workflow(dir.path(), &changed, "")).expect("reload");
    engine.service().decide(decision(&id, true, "ana", None)).await.expect("approve");
    let run = ended(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(data(dir.path(), "log"), "published", "the run went on with the steps it started with");
    let d = detail(&engine, &id).await;
    assert!(flat(&d.steps).iter().all(|s| s.id != "extra"), "{:#?}", d.steps);

    // A run started after the reload follows the new definition.
    let id = trigger(&engine, json!(null)).await;
    waiting(&engine, &id).await;
    engine.service().decide(decision(&id, true, "ana", None)).await.expect("approve");
    assert_eq!(ended(&engine, &id).await.status, RunStatus::Succeeded);
    assert_eq!(data(dir.path(), "log"), "publishedchangedextra");
    engine.shutdown(Duration::from_secs(5)).await;
}
