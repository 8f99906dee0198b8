//! Workflows on the real binaries: a worker killed with SIGKILL in the middle of a five-step
//! workflow finishes it after a restart without repeating a finished step; approvals through
//! `lampctl`; `lampctl workflows run --wait`; the seed's `review-and-triage` shape with plugin
//! steps; `config validate` on workflow mistakes.

use std::time::Duration;

use serde_json::Value;

use crate::support::{Worker, run_cli};

fn sh(id: &str, command: &str) -> String {
    format!(
        "- id: {id}\n  type: plugin\n  plugin: shell-exec\n  action: run\n  parameters: {{command: {}}}\n",
        serde_json::to_string(command).unwrap()
    )
}

/// A `workflows:` section with one workflow of these steps.
fn workflows(name: &str, steps: &str) -> String {
    let steps: String = steps.lines().map(|l| format!("      {l}\n")).collect();
    format!("workflows:\n  {name}:\n    steps:\n{steps}")
}

fn data(w: &Worker, file: &str) -> String {
    std::fs::read_to_string(w.dir.path().join("data").join(file)).unwrap_or_default()
}

/// Opens a FIFO the way `what` needs it (`read`: until a writer closes it; else writes a line)
/// and returns when the other end did its part: an event from the step's shell, not a poll.
fn fifo(path: std::path::PathBuf, read: bool, what: &str) {
    use std::io::{Read, Write};
    let (done, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let ok = if read {
            std::fs::File::open(&path).and_then(|mut f| f.read_to_end(&mut Vec::new())).is_ok()
        } else {
            std::fs::OpenOptions::new().write(true).open(&path).and_then(|mut f| f.write_all(b"go\n")).is_ok()
        };
        let _ = done.send(ok);
    });
    // A blocked open is left to the thread if it times out; the test fails either way.
    assert_eq!(wait.recv_timeout(Duration::from_secs(20)), Ok(true), "timed out waiting for {what}");
}

fn mkfifo(path: &std::path::Path) {
    assert!(std::process::Command::new("mkfifo").arg(path).status().unwrap().success(), "mkfifo {}", path.display());
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[test]
fn a_worker_killed_mid_workflow_finishes_it_after_restart_without_repeating_finished_steps() {
    let steps = [
        sh("one", "printf 1 >> log"),
        sh("two", "printf 2 >> log"),
        // Says it started (through the FIFO `started`), then waits for a line on the FIFO `go`:
        // the worker is killed while it waits.
        sh("three", "echo $$ > three.pid; printf x >> started-three; printf x > started; read line < go; printf 3 >> log"),
        sh("four", "printf 4 >> log"),
        sh("five", "printf 5 >> log"),
    ]
    .concat();
    let mut w = Worker::new("");
    w.write_full(&workflows("five", &steps), "nightly:\n  type: workflow\n  workflow: five\n", "");
    let data_dir = w.dir.path().join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    mkfifo(&data_dir.join("started"));
    mkfifo(&data_dir.join("go"));
    w.start();
    let (code, out, err) = w.ctl(&["jobs", "trigger", "nightly"]);
    assert_eq!(code, 0, "{out}{err}");
    fifo(data_dir.join("started"), true, "step three to start");
    w.signal("KILL");
    w.wait_exit(Duration::from_secs(10));
    // What the service manager does with the rest of the worker's processes (systemd's
    // KillMode=control-group, a container's end): the step's own process group goes too.
    let pgid = data(&w, "three.pid").trim().to_owned();
    let _ = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{pgid}")]).status();
    assert_eq!(data(&w, "log"), "12", "killed in the middle of step three");

    w.start();
    // The recovered run starts step three again; let it go on.
    fifo(data_dir.join("started"), true, "step three to start again");
    fifo(data_dir.join("go"), false, "step three to read its go");
    let runs = w.wait_for("the recovered run to succeed", Duration::from_secs(20), |r| r.iter().any(|r| r.status == "succeeded"));
    assert_eq!(data(&w, "log"), "12345", "every finished step's side effect happened once: {runs:#?}");
    assert_eq!(data(&w, "started-three"), "xx", "the step that was running when the worker died ran again");
    let statuses: Vec<(&str, &str)> = runs.iter().map(|r| (r.trigger.as_str(), r.status.as_str())).collect();
    assert_eq!(statuses, [("manual", "interrupted"), ("retry", "succeeded")]);

    // The run's record shows every step, and which attempt finished it.
    let (code, out, err) = w.ctl(&["runs", "list", "--job", "nightly", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let retry = json_of(&out)["runs"][0]["id"].as_str().unwrap().to_owned();
    let (code, out, _) = w.ctl(&["runs", "show", &retry, "-o", "json"]);
    assert_eq!(code, 0);
    let steps: Vec<(String, String, u64)> = json_of(&out)["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["id"].as_str().unwrap().into(), s["status"].as_str().unwrap().into(), s["attempt"].as_u64().unwrap()))
        .collect();
    let want: Vec<(String, String, u64)> = [("one", 1), ("two", 1), ("three", 2), ("four", 2), ("five", 2)]
        .iter()
        .map(|(s, a)| (s.to_string(), "succeeded".into(), *a))
        .collect();
    assert_eq!(steps, want);
}

const GATED: &str = "\
- id: draft
  type: plugin
  plugin: shell-exec
  action: run
  parameters: {command: \"printf 'draft for ${input}'\"}
- id: gate
  type: approval
  input: \"Publish ${steps.draft.output.stdout}?\"
- id: publish
  type: plugin
  plugin: file-save
  action: save
  parameters: {path: published.txt, content: \"${steps.draft.output.stdout} (${steps.gate.output.comment})\"}
";

#[test]
fn approvals_through_lampctl_survive_a_restart() {
    let mut w = Worker::new("");
    w.write_full(&workflows("post", GATED), "", "");
    w.start();
    let (code, out, err) = w.ctl(&["workflows", "run", "post", "--input", "the news", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let run = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    w.wait_for("the run to wait", Duration::from_secs(20), |r| r.iter().any(|r| r.status == "waiting_approval"));

    let (code, out, _) = w.ctl(&["approvals", "list"]);
    assert_eq!(code, 0);
    assert!(out.contains(&run) && out.contains("gate") && out.contains("Publish draft for the news?"), "{out}");
    let (code, out, _) = w.ctl(&["runs", "show", &run]);
    assert_eq!(code, 0);
    assert!(out.contains("waiting_approval") && out.contains("pending"), "the tree shows where the run is: {out}");

    // Restarted while it waits: the wait and the question are still there.
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(15)), Some(0));
    w.start();
    let (code, out, err) = w.ctl(&["approvals", "approve", &run, "--comment", "ship it", "--by", "ana"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("approved step \"gate\" of run {run}; the run is now queued")), "{out}");
    w.wait_for("the run to succeed", Duration::from_secs(20), |r| r.iter().any(|r| r.status == "succeeded"));
    assert_eq!(data(&w, "published.txt"), "draft for the news (ship it)");

    let (code, _, err) = w.ctl(&["approvals", "reject", &run]);
    assert_eq!(code, 1, "deciding twice is refused");
    assert!(err.contains("was already approved by ana"), "{err}");
    let (code, out, _) = w.ctl(&["runs", "show", &run, "-o", "json"]);
    assert_eq!(code, 0);
    let gate = &json_of(&out)["steps"][1];
    assert_eq!((gate["output"]["approved"].clone(), gate["output"]["decided_by"].clone()), (Value::Bool(true), Value::from("ana")));
}

#[test]
fn the_seed_review_and_triage_shape_runs_with_plugin_steps_and_waits_with_lampctl() {
    let steps = [
        sh("review", "printf 'reviewed: %s' '${input.text}'"),
        sh("triage", "printf '{\"severity\": \"high\", \"summary\": \"%s\"}' '${steps.review.output.stdout}'"),
        "- id: check-severity\n  type: condition\n  condition: \"${steps.triage.output.stdout.severity}\"\n  then: [parallel-notify]\n".to_owned(),
        "- id: parallel-notify\n  type: parallel\n  steps:\n".to_owned(),
        "    - {id: notify-slack, type: plugin, plugin: file-save, action: save, parameters: {path: slack.txt, content: \"${steps.triage.output.stdout.summary}\"}}\n".to_owned(),
        "    - {id: notify-email, type: plugin, plugin: file-save, action: save, parameters: {path: email.txt, content: \"${steps.triage.output.stdout.severity} ${run.id}\"}}\n".to_owned(),
    ]
    .concat();
    let mut w = Worker::new("");
    w.write_full(&workflows("review-and-triage", &steps), "", "");
    w.start();
    let (code, out, err) = w.ctl(&["workflows", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("review → triage → check-severity → [notify-slack | notify-email]"), "{out}");
    let (code, out, err) = w.ctl(&["workflows", "run", "review-and-triage", "--input", "{\"text\": \"PR 7\"}", "--wait"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("succeeded") && out.contains("notify-email"), "{out}");
    assert_eq!(data(&w, "slack.txt"), "reviewed: PR 7");
    let run = w.runs().into_iter().next().unwrap();
    assert_eq!(run.job, "workflow:review-and-triage");
    assert!(data(&w, "email.txt").starts_with("high "), "{}", data(&w, "email.txt"));
}

#[test]
fn config_validate_reports_workflow_mistakes() {
    let dir = tempfile::tempdir().unwrap();
    let steps = [
        "- id: early\n  type: plugin\n  plugin: shell-exec\n  action: run\n  input: \"${steps.late.output}\"\n".to_owned(),
        sh("late", "echo ${steps.missing.output}"),
    ]
    .concat();
    let text = format!("{}scheduling:\n  jobs: {{}}\n", workflows("w", &steps));
    std::fs::write(dir.path().join("lamplighter.yaml"), text).unwrap();
    let (code, out, err) = run_cli(&["config", "validate", "--config", "lamplighter.yaml"], dir.path());
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("error: workflow \"w\": step \"early\" runs plugin action \"shell-exec.run\", which takes no \"input\" parameter"),
        "{err}"
    );
    assert!(
        err.contains(
            "warning: workflow \"w\": step \"early\" uses ${steps.late.output}, but step \"late\" has not finished when \"early\" runs"
        ),
        "{err}"
    );
    assert!(
        err.contains("warning: workflow \"w\": step \"late\" uses ${steps.missing.output}, but step \"missing\" does not exist"),
        "{err}"
    );
}
