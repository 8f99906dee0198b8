//! One agent run against a real model: SmolLM2-135M behind llama.cpp's OpenAI-compatible
//! server (`.ci/real-llm.sh`: built from PyPI on first use, then cached), an agent with
//! `file-save`, and the run's record of a real model call with real token usage. The model is
//! tiny: this checks the protocol (requests it accepts, replies and usage we read, tool calls
//! we answer), not the wording.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Worker, free_port, repo_root};

/// The model server on `port`, stopped when dropped.
struct RealLlm {
    port: u16,
    base_url: String,
}

impl RealLlm {
    fn start() -> Self {
        let port = free_port();
        let out = Command::new("bash").arg(repo_root().join(".ci/real-llm.sh")).args(["start", &port.to_string()]).output().unwrap();
        assert!(out.status.success(), "the real model server did not start:\n{}", String::from_utf8_lossy(&out.stderr));
        let base_url = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        RealLlm { port, base_url }
    }
}

impl Drop for RealLlm {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(repo_root().join(".ci/real-llm.sh")).args(["stop", &self.port.to_string()]).status();
    }
}

#[test]
fn an_agent_runs_against_a_real_small_model_and_records_its_usage() {
    let llm = RealLlm::start();
    let top = format!(
        "ai:\n  providers:\n    local:\n      base_url: {}\n      timeout: 120s\n      models:\n        small: {{id: smollm2, max_tokens: 96, default_temperature: 0}}\nagents:\n  noter:\n    model: small\n    max_iters: 3\n    plugins: [file-save]\n    system_prompt: You write notes to files with the file-save__save tool.\n",
        llm.base_url
    );
    let mut w = Worker::new("");
    w.write_full(&top, "note:\n  type: agent\n  agent: noter\n  input: \"Save the text hello to the file note.txt.\"\n", "");
    w.start();
    let (waited, wait_out, err) = w.ctl(&["jobs", "trigger", "note", "--wait", "--timeout", "300", "-o", "json"]);
    let runs = w.wait_for("the run to end", Duration::from_secs(300), |r| r.iter().any(|r| r.status != "running" && r.status != "queued"));
    let id = runs[0].id.clone();
    let (code, out, _) = w.ctl(&["runs", "show", &id, "-o", "json"]);
    assert_eq!(code, 0);
    let run: Value = serde_json::from_str(&out).unwrap();
    let calls = run["calls"].as_array().cloned().unwrap_or_default();
    let first = calls.first().unwrap_or_else(|| panic!("no call recorded: {run:#}\n{}", w.log()));
    assert_eq!((first["kind"].as_str(), first["name"].as_str()), (Some("model"), Some("smollm2")), "{run:#}");
    assert!(first["input_tokens"].as_u64().unwrap_or(0) > 0 && first["output_tokens"].as_u64().unwrap_or(0) > 0, "real usage: {first:#}");
    assert_eq!(first["request"]["tools"], serde_json::json!(["file-save.save"]), "the tool was offered");
    // Whatever the tiny model did with the tool, the loop ended by the rules: an answer, or
    // max_iters; never a provider error (a request the server refused or a reply we misread).
    // `--wait` said how it ended, by the README's codes: 0 succeeded, 4 failed.
    match run["status"].as_str() {
        Some("succeeded") => assert_eq!(waited, 0, "{wait_out}{err}"),
        Some("failed") => {
            assert_eq!(waited, 4, "{wait_out}{err}");
            let error = run["error"].as_str().unwrap_or_default();
            assert!(error.contains("gave no answer within max_iters (3)"), "{error}\n{run:#}");
        }
        other => panic!("unexpected status {other:?}: {run:#}"),
    }
    let waited_for: Value = serde_json::from_str(&wait_out).unwrap_or_else(|e| panic!("--wait -o json is JSON ({e}): {wait_out}{err}"));
    assert_eq!(waited_for["run_id"].as_str(), Some(id.as_str()), "{wait_out}");
    assert!(run["usage"]["input_tokens"].as_u64().unwrap_or(0) > 0);
}
