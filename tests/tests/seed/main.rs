//! The seed system's own files, outside this repository (`../shared/reference/gantri-config`
//! and `../shared/seeds/gantri-architecture.md`), load and run unchanged.
//!
//! Not part of `cargo test --workspace`: a clone of the repository alone has no `../shared`,
//! and the repository's own tests cover the same shapes with `tests/fixtures/seed-shaped`.
//! `.ci/run` runs this target as its own step (`cargo test --workspace --test seed`);
//! a missing directory fails it, it never skips.

// They start the real binaries: that is their job, so they may spawn processes directly.
#![allow(clippy::disallowed_methods)]

#[path = "../e2e/support.rs"]
#[allow(dead_code)]
mod support;

use std::path::PathBuf;
use std::time::Duration;

use lamplighter_config::{Disabled, LoadOptions, ModelApi, StepKind, Templated, Var, load_with_env};
use lamplighter_tests::llm::{Reply, ScriptedLlm, system, user_input};
use serde_json::Value;

use support::{Worker, repo_root, run_cli};

/// A file or directory of `../shared`, which must be there.
fn shared(path: &str) -> PathBuf {
    let p = repo_root().join("../shared").join(path);
    assert!(p.exists(), "{} is not there: this target checks the seed's own files next to the repository", p.display());
    p
}

fn reference() -> PathBuf {
    shared("reference/gantri-config/gantri.yaml")
}

#[test]
fn the_seed_config_loads_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = LoadOptions { path: Some(reference()), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let loaded = load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}"));
    let c = &loaded.config;
    let nightly = c.jobs["daily-news-9pm"].schedule.as_ref().expect("a parsed schedule");
    assert_eq!(nightly.spec(), &lamplighter_config::ScheduleSpec::Cron("0 21 * * *".into()));
    assert_eq!((c.agents.len(), c.workflows.len()), (12, 6), "{:?}", c.agents.keys());
    // The unset key disables the provider and its agents, it does not stop the load.
    assert!(c.disabled[&Disabled::Provider("azure-openai".into())].contains("AZURE_OPENAI_API_KEY"));
    assert!(c.disabled.contains_key(&Disabled::Agent("news-summarizer".into())));
    assert!(loaded.warnings.iter().any(|w| w.message.contains("\"dataverse\"")));
    // `${input}` is a workflow template, not an environment variable.
    let implement = &c.workflows["code-implement"].steps[0];
    let StepKind::Agent { input: Some(Templated::Text(input)), .. } = &implement.kind else { panic!("{implement:?}") };
    assert_eq!(input.as_single_var(), Some(&Var::Input(vec![])));
    let coder = c.agents.values().find(|a| a.model.as_deref() == Some("default-coding")).expect("a coding agent");
    let resolved = coder.resolved.as_ref().expect("resolved model");
    assert_eq!((resolved.provider.as_str(), resolved.model.id.as_str()), ("azure-openai", "gpt-5.1-codex-mini"));
    assert_eq!(resolved.model.api, ModelApi::Responses);
    let t = &c.telemetry;
    assert!(t.enabled && !t.sensitive_data);
    assert_eq!(t.service_name.as_deref(), Some("gantri"));
    let shown = lamplighter_config::show(c);
    assert!(shown.contains("daily-news-9pm") && !shown.contains("${AZURE_OPENAI_API_KEY}"), "{shown}");
}

#[test]
fn the_seed_config_validates_once_its_keys_are_set() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference();
    let (code, out, err) = run_cli(&["config", "validate", "--config", reference.to_str().unwrap()], tmp.path());
    assert_eq!(code, 2, "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains("error: job \"daily-news-9pm\" runs workflow \"daily-news\": step \"fetch-and-summarize\" needs agent \"news-summarizer\", which is disabled: its provider \"azure-openai\" is disabled: ${AZURE_OPENAI_API_KEY} is not set"),
        "{err}"
    );
    let out = std::process::Command::new(support::bin())
        .args(["config", "validate", "--config", reference.to_str().unwrap()])
        .current_dir(tmp.path())
        .env("AZURE_OPENAI_API_KEY", "k")
        .env("BRAVE_API_KEY", "k")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("1 jobs, 12 agents, 6 workflows"), "{stdout}");
    assert!(stderr.contains("section \"dataverse\""), "{stderr}");
}

/// The repository's copy of the seed's "Full Configuration Reference" (which the config tests
/// walk key by key) is the seed document's, byte for byte.
#[test]
fn the_full_configuration_reference_is_the_seeds() {
    let doc = std::fs::read_to_string(shared("seeds/gantri-architecture.md")).unwrap();
    let (_, after) = doc.split_once("### Full Configuration Reference").expect("the section");
    let (_, block) = after.split_once("```yaml\n").expect("its YAML block");
    let (block, _) = block.split_once("```").expect("the block's end");
    let copy = std::fs::read_to_string(repo_root().join("tests/fixtures/seed-full-reference.yaml")).unwrap();
    assert_eq!(copy, block, "tests/fixtures/seed-full-reference.yaml drifted from the seed document");
}

/// The seed's `content-review` workflow and its three agents, from the seed's own files, run
/// against the scripted provider and wait for the approval with every step's output.
#[test]
fn the_seed_content_review_workflow_runs() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let llm = rt.block_on(ScriptedLlm::start((5, 5), |req| {
        let (who, input) = (system(req), user_input(req));
        if who.starts_with("You are an editor") {
            if input.starts_with("Incorporate") { Reply::Text("FINAL".into()) } else { Reply::Text(format!("grammar ok: {input}")) }
        } else if who.starts_with("You are a fact-checker") {
            Reply::Text(format!("facts ok: {input}"))
        } else {
            Reply::Text(format!("draft about {input}"))
        }
    }));
    let seed = shared("reference/gantri-config");
    let files =
        ["workflows/content-review-group-chat.yaml", "agents/content-writer.yaml", "agents/editor.yaml", "agents/fact-checker.yaml"];
    let imports: String = files.iter().map(|f| format!("    - {}\n", seed.join(f).display())).collect();
    let mut w = Worker::new("");
    w.write_full(&llm.ai_section(), "", "");
    let text = std::fs::read_to_string(w.config_path()).unwrap().replacen("framework:\n", &format!("framework:\n  imports:\n{imports}"), 1);
    std::fs::write(w.config_path(), text).unwrap();
    w.start();
    let (code, out, err) = w.ctl(&["workflows", "run", "content-review", "--input", "{\"topic\": \"tides\"}", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let started: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let run = started["run_id"].as_str().expect("the run's id").to_owned();
    w.wait_for("the run to wait for approval", Duration::from_secs(30), |r| r.iter().any(|r| r.status == "waiting_approval"));
    let (code, out, _) = w.ctl(&["runs", "show", &run, "-o", "json"]);
    assert_eq!(code, 0);
    let detail: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    fn find(steps: &Value, id: &str) -> Option<Value> {
        steps.as_array()?.iter().find_map(|s| if s["id"] == id { Some(s.clone()) } else { find(&s["steps"], id) })
    }
    let output = |id: &str| find(&detail["steps"], id).map(|s| s["output"].clone()).unwrap_or(Value::Null);
    assert_eq!(output("draft"), "draft about tides");
    assert_eq!(output("grammar-check"), "grammar ok: draft about tides");
    assert_eq!(output("fact-check"), "facts ok: draft about tides");
    assert_eq!(output("final-edit"), "FINAL");
    let (code, out, err) = w.ctl(&["approvals", "approve", &run, "--by", "ana"]);
    assert_eq!(code, 0, "{out}{err}");
    w.wait_for("the run to succeed", Duration::from_secs(30), |r| r.iter().any(|r| r.status == "succeeded"));
    drop(rt);
}
