//! An assistant manages schedules over MCP, with the official Python SDK as its client: it
//! previews a schedule, creates a job and sees it fire, changes it with the right and a stale
//! version, finds it again after a restart, deletes it and backfills another; every bad input
//! is answered naming its field. `lampctl jobs export` gives YAML the files accept, and a
//! worker that does not allow management does not list the tools.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Worker, repo_root, run_cli};

/// The runtime jobs' target: a plugin action a runtime job may run by default.
const SAVE: &str = r#""plugin": "file-save", "action": "save", "parameters": {"path": "out.txt", "content": "x"}"#;

fn managed_worker(extra: &str) -> Worker {
    let w = Worker::new("");
    let jobs =
        "hourly:\n  type: plugin\n  plugin: file-save\n  action: save\n  cron: \"0 * * * *\"\n  parameters: {path: h.txt, content: h}";
    w.write_config(jobs, &format!("manage_jobs:\n  enabled: true\n{extra}"));
    w
}

/// The tools' answers to `calls`, through the official Python SDK: `[{"tools": …}, answer…]`.
fn sdk(w: &Worker, calls: Value) -> Vec<Value> {
    let python = lamplighter_tests::setup::python_mcp();
    let script = repo_root().join("tests/clients/mcp_calls.py");
    let mut child = std::process::Command::new(python)
        .arg(script)
        .arg(w.url())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python");
    std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), calls.to_string().as_bytes()).expect("write calls");
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("python runs");
    assert!(out.status.success(), "the SDK client failed:\n{}\nworker log:\n{}", String::from_utf8_lossy(&out.stderr), w.log());
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    v.as_array().expect("an array").clone()
}

fn ok(answer: &Value) -> &Value {
    assert_eq!(answer["is_error"], json!(false), "{answer:#}");
    &answer["structured"]
}

fn refused(answer: &Value) -> &str {
    assert_eq!(answer["is_error"], json!(true), "{answer:#}");
    answer["text"].as_str().expect("text")
}

fn def(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn an_mcp_client_previews_creates_changes_deletes_and_backfills_jobs() {
    let mut w = managed_worker("");
    w.start();
    let every_second = def(&format!(r#"{{"every": "1s", {SAVE}}}"#));
    let answers = sdk(
        &w,
        json!([
            ["preview_schedule", {"cron": "30 7 * * 1-5", "timezone": "Europe/Berlin", "count": 100}],
            ["create_job", {"name": "tick", "definition": every_second, "dry_run": true}],
            ["create_job", {"name": "tick", "definition": every_second}],
            ["create_job", {"name": "bad", "definition": {"cron": "61 * * * *", "timezone": "Mars/Olympus", "workflow": "nope"}}],
            ["create_job", {"name": "bad", "definition": def(r#"{"every": "1m", "plugin": "file-save", "action": "shred"}"#)}],
            ["create_job", {"name": "bad", "definition": def(r#"{"every": "1m", "plugin": "shell-exec", "action": "run", "parameters": {"command": "id"}}"#)}],
            ["create_job", {"name": "hourly", "definition": every_second}],
            ["create_job", {"name": "bad", "definition": {"every": "1m", "plugin": "file-save", "action": "save", "parameters": {"content": "x".repeat(70_000)}}}],
            ["create_job", {"name": "bad"}],
        ]),
    );
    let tools: Vec<&str> = answers[0]["tools"].as_array().expect("tools").iter().filter_map(Value::as_str).collect();
    for t in ["create_job", "update_job", "delete_job", "backfill_job", "preview_schedule"] {
        assert!(tools.contains(&t), "{t} listed: {tools:?}");
    }
    let preview = ok(&answers[1]);
    assert!(preview["notes"].as_array().expect("notes").iter().any(|n| n.as_str().unwrap_or("").contains("daylight-saving")), "{preview}");
    let dry = ok(&answers[2]);
    assert_eq!((dry["saved"].as_bool(), dry["version"].as_u64()), (Some(false), Some(1)));
    assert_eq!(dry["preview"]["next_fires"].as_array().expect("fires").len(), 10);
    let created = ok(&answers[3]);
    assert_eq!((created["saved"].as_bool(), created["version"].as_u64()), (Some(true), Some(1)));
    let bad = refused(&answers[4]);
    for field in ["\n- cron: ", "\n- timezone: ", "\n- workflow: "] {
        assert!(bad.contains(field), "{field}: {bad}");
    }
    assert!(refused(&answers[5]).contains("- action: plugin action \"file-save.shred\" does not exist"), "{}", answers[5]);
    assert!(refused(&answers[6]).contains("- action: runtime jobs may not run plugin shell-exec.run"), "{}", answers[6]);
    let taken = refused(&answers[7]);
    assert!(taken.contains("job \"hourly\" is defined in the config files (") && taken.contains("lamplighter.yaml:"), "{taken}");
    assert!(refused(&answers[8]).contains("- definition: is 700"), "{}", answers[8]);
    assert!(answers[9]["protocol_error"].as_str().is_some_and(|e| e.contains("definition")), "{}", answers[9]);

    // It fires, every second, from now on.
    let runs = w.wait_for("the runtime job to fire", Duration::from_secs(15), |r| {
        r.iter().filter(|r| r.job == "tick" && r.status == "succeeded").count() >= 2
    });
    let ticks: Vec<i64> = runs.iter().filter(|r| r.job == "tick").filter_map(|r| r.scheduled_at).collect();
    let mut unique = ticks.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ticks.len(), "once per tick: {runs:#?}");

    let hourly = def(&format!(r#"{{"cron": "0 3 * * *", "timezone": "Europe/Berlin", {SAVE}}}"#));
    let answers = sdk(
        &w,
        json!([
            ["update_job", {"name": "tick", "definition": hourly, "expected_version": 7}],
            ["update_job", {"name": "tick", "definition": hourly, "expected_version": 1}],
        ]),
    );
    assert!(refused(&answers[1]).contains("is at version 1, not 7"), "{}", answers[1]);
    assert_eq!(ok(&answers[2])["version"].as_u64(), Some(2));
    let fired = w.runs().iter().filter(|r| r.job == "tick").count();

    // After a restart it is still there, at its version, and no longer fires every second.
    w.signal("TERM");
    w.wait_exit(Duration::from_secs(10));
    w.start();
    let answers = sdk(
        &w,
        json!([["get_job", {"name": "tick"}], ["delete_job", {"name": "tick", "expected_version": 2}], ["get_job", {"name": "tick"}]]),
    );
    let job = ok(&answers[1]);
    assert_eq!(job["origin"]["kind"], "runtime", "{job}");
    assert_eq!(job["origin"]["version"], 2, "{job}");
    assert!(job["origin"]["created_by"].as_str().is_some_and(|b| b.starts_with("mcp client ")), "{job}");
    assert_eq!(job["schedule"], "cron: 0 3 * * *");
    // Planned as changed: its next fire is 03:00 in Berlin, not a second from now.
    let next = job["next_fires"][0]["local"].as_str().expect("a next fire");
    assert!(next.contains("T03:00:00+01:00") || next.contains("T03:00:00+02:00"), "{job}");
    let history: Vec<&str> = job["history"].as_array().expect("history").iter().filter_map(|h| h["action"].as_str()).collect();
    assert_eq!(history, ["update", "create"]);
    assert_eq!(w.runs().iter().filter(|r| r.job == "tick").count(), fired, "not every second any more");
    assert_eq!(ok(&answers[2])["version"].as_u64(), Some(3));
    let gone = ok(&answers[3]);
    assert_eq!(gone["origin"]["kind"], "deleted", "{gone}");
    assert!(gone["disabled"].as_str().is_some_and(|d| d.starts_with("deleted by mcp client ")), "{gone}");
    assert_eq!(gone["history"].as_array().map(Vec::len), Some(3), "its history stays readable: {gone}");

    // Backfill the file job's last three hours: once without runs, once with.
    let now = chrono::Utc::now();
    let (from, to) = ((now - chrono::Duration::hours(3)).to_rfc3339(), (now - chrono::Duration::seconds(1)).to_rfc3339());
    let answers = sdk(
        &w,
        json!([
            ["backfill_job", {"name": "hourly", "from": from, "to": to, "dry_run": true}],
            ["backfill_job", {"name": "hourly", "from": from, "to": to}],
        ]),
    );
    let dry = ok(&answers[1]);
    assert_eq!((dry["created"].as_u64(), dry["ticks"].as_array().expect("ticks").len()), (Some(3), 3), "{dry}");
    assert_eq!(ok(&answers[2])["created"].as_u64(), Some(3));
    let runs = w.wait_for("the backfill to run", Duration::from_secs(15), |r| {
        r.iter().filter(|r| r.job == "hourly" && r.trigger == "backfill" && r.status == "succeeded").count() == 3
    });
    let ticks: Vec<i64> = runs.iter().filter(|r| r.trigger == "backfill").filter_map(|r| r.scheduled_at).collect();
    assert!(ticks.iter().all(|t| t % 3_600_000 == 0), "on the hour: {ticks:?}");
    let again = sdk(&w, json!([["backfill_job", {"name": "hourly", "from": from, "to": to}]]));
    let again = ok(&again[1]);
    assert_eq!(again["created"].as_u64(), Some(0), "{again}");
    assert!(again["ticks"].as_array().expect("ticks").iter().all(|t| t["existing"] == json!(true)), "{again}");
}

/// `max_jobs` bounds the runtime jobs through MCP: the create past it is refused naming the
/// limit and the way out, nothing is written, and after a delete the next create goes through.
#[test]
fn a_create_past_max_jobs_is_refused_through_mcp_and_a_delete_makes_room() {
    let mut w = managed_worker("  max_jobs: 2\n");
    w.start();
    let job = def(&format!(r#"{{"cron": "0 3 * * *", {SAVE}}}"#));
    let answers = sdk(
        &w,
        json!([
            ["create_job", {"name": "one", "definition": job}],
            ["create_job", {"name": "two", "definition": job}],
            ["create_job", {"name": "three", "definition": job}],
            ["get_job", {"name": "three"}],
            ["delete_job", {"name": "one", "expected_version": 1}],
            ["create_job", {"name": "three", "definition": job}],
        ]),
    );
    assert_eq!(ok(&answers[1])["version"].as_u64(), Some(1));
    assert_eq!(ok(&answers[2])["version"].as_u64(), Some(1));
    let full = refused(&answers[3]);
    assert!(
        full.contains("there are already 2 runtime jobs")
            && full.contains("worker.mcp.manage_jobs.max_jobs")
            && full.contains("delete one"),
        "{full}"
    );
    assert!(refused(&answers[4]).contains("three"), "nothing was written: {}", answers[4]);
    ok(&answers[5]);
    assert_eq!(ok(&answers[6])["version"].as_u64(), Some(1), "room again after the delete");
}

#[test]
fn runtime_jobs_export_as_yaml_the_files_accept() {
    let mut w = managed_worker("");
    w.start();
    let file = w.dir.path().join("digest.yaml");
    std::fs::write(&file, "description: \"Weekday: digest\"\ncron: \"30 7 * * 1-5\"\ntimezone: Europe/Berlin\nplugin: file-save\naction: save\nparameters:\n  path: d.txt\n  content: \"a: b\"\nretries: {max: 2, backoff: fixed, initial: 30s}\n").expect("write");
    let (code, out, err) = w.ctl(&["jobs", "create", "digest", "-f", file.to_str().expect("path")]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("job \"digest\" saved, version 1"), "{out}");
    let (code, yaml, err) = w.ctl(&["jobs", "export"]);
    assert_eq!(code, 0, "{err}");
    assert!(yaml.contains("    digest:\n"), "{yaml}");
    // The exported jobs, alone in a config of their own, validate.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("lamplighter.yaml"), &yaml).expect("write");
    let (code, out, err) = run_cli(&["config", "validate", "--config", "lamplighter.yaml"], dir.path());
    assert_eq!(code, 0, "exported YAML validates:\n{yaml}\n{out}{err}");
    assert!(out.contains("1 jobs"), "{out}");
    // Edited in $VISUAL (here a sed that changes the zone), saved against the version opened.
    let out = std::process::Command::new(crate::support::ctl_bin())
        .args(["--url", &w.url(), "jobs", "edit", "digest"])
        .env("VISUAL", "sed -i s#Europe/Berlin#America/New_York#")
        .output()
        .expect("lampctl");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.starts_with("job \"digest\" saved, version 2") && stdout.contains("(America/New_York)"), "{stdout}");
    let (code, history, _) = w.ctl(&["jobs", "history", "digest"]);
    assert_eq!(code, 0);
    assert!(history.contains("create") && history.contains("mcp client lampctl"), "{history}");
    assert!(history.lines().nth(1).is_some_and(|l| l.contains("update") && l.ends_with("timezone")), "{history}");
    let (code, _, err) = w.ctl(&["jobs", "delete", "digest", "--expected-version", "9"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is at version 2, not 9"), "{err}");
}

#[test]
fn a_worker_that_does_not_allow_management_does_not_list_the_tools() {
    let mut w = Worker::new("hourly:\n  type: plugin\n  plugin: file-save\n  action: save\n  cron: \"0 * * * *\"");
    w.start();
    let answers = sdk(&w, json!([["create_job", {"name": "x", "definition": {"every": "1m", "workflow": "w"}}]]));
    let tools: Vec<&str> = answers[0]["tools"].as_array().expect("tools").iter().filter_map(Value::as_str).collect();
    assert!(
        tools.contains(&"list_jobs")
            && !tools.iter().any(|t| t.ends_with("_job") && ["create", "update", "delete", "backfill"].iter().any(|p| t.starts_with(p))),
        "{tools:?}"
    );
    assert!(refused(&answers[1]).contains("worker.mcp.manage_jobs.enabled: true"), "{}", answers[1]);
}

/// Tags make a group of file and runtime jobs: listed, paused with one reason, resumed and
/// triggered together, through lampctl and an MCP client; a tag no job has is named with the
/// tags in use, and a call that names a job and a tag is refused.
#[test]
fn tags_list_pause_resume_and_trigger_file_and_runtime_jobs_together() {
    let mut w = Worker::new("");
    let save = |path: &str| format!("  type: plugin\n  plugin: file-save\n  action: save\n  parameters: {{path: {path}, content: x}}\n");
    let jobs = format!(
        "ledger:\n  cron: \"0 3 * * *\"\n  tags: [finance, nightly]\n{}payroll:\n  cron: \"0 4 25 * *\"\n  tags: [finance]\n{}hourly:\n  cron: \"0 * * * *\"\n{}",
        save("l.txt"),
        save("p.txt"),
        save("h.txt")
    );
    w.write_config(jobs.trim_end(), "manage_jobs:\n  enabled: true\n");
    w.start();
    let file = w.dir.path().join("invoices.yaml");
    std::fs::write(&file, "cron: \"0 5 * * *\"\ntags: [finance]\nplugin: file-save\naction: save\nparameters: {path: i.txt, content: i}\n")
        .unwrap();
    let (code, out, err) = w.ctl(&["jobs", "create", "invoices", "-f", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");

    let (code, out, err) = w.ctl(&["jobs", "list", "--tag", "finance", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let names: Vec<String> = serde_json::from_str::<Value>(&out).unwrap()["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["invoices", "ledger", "payroll"], "file and runtime jobs of the tag: {out}");
    let (code, out, _) = w.ctl(&["jobs", "list"]);
    assert_eq!(code, 0);
    assert!(out.lines().next().is_some_and(|h| h.contains("TAGS")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("ledger") && l.trim_end().ends_with("finance,nightly")), "{out}");

    let (code, out, err) = w.ctl(&["jobs", "pause", "payroll", "--reason", "audit"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = w.ctl(&["jobs", "pause", "--tag", "finance", "--reason", "month end"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("paused 2 of 3 job(s) tagged \"finance\": invoices, ledger (paused already: payroll)\n"),
        "what changed, and what was paused before: {out}"
    );
    let (_, out, _) = w.ctl(&["jobs", "list", "--tag", "finance", "-o", "json"]);
    for job in serde_json::from_str::<Value>(&out).unwrap()["jobs"].as_array().unwrap() {
        // A job paused before keeps its own reason.
        let reason = if job["name"] == "payroll" { "audit" } else { "month end" };
        assert_eq!((&job["paused"], &job["pause_reason"], &job["next_fire"]), (&json!(true), &json!(reason), &Value::Null), "{job}");
    }
    let (_, out, _) = w.ctl(&["jobs", "show", "hourly", "-o", "json"]);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["paused"], json!(false), "a job without the tag is left alone: {out}");

    let (code, out, err) = w.ctl(&["jobs", "trigger", "--tag", "finance"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("triggered 3 job(s) tagged \"finance\"\n"), "paused jobs are triggered too: {out}");
    let runs = w.wait_for("the tag's three runs", Duration::from_secs(15), |r| {
        r.iter().filter(|r| r.trigger == "manual" && r.status == "succeeded").count() == 3
    });
    let mut ran: Vec<&str> = runs.iter().filter(|r| r.trigger == "manual").map(|r| r.job.as_str()).collect();
    ran.sort_unstable();
    assert_eq!(ran, ["invoices", "ledger", "payroll"]);

    let (code, out, err) = w.ctl(&["jobs", "resume", "--tag", "finance"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("resumed 3 of 3 job(s) tagged \"finance\": invoices, ledger, payroll\n"), "{out}");
    assert!(out.contains("  ledger: next fire "), "{out}");

    let (code, out, err) = w.ctl(&["jobs", "pause", "--tag", "finanse"]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("no job has tag \"finanse\" (did you mean \"finance\"?); tags in use: finance, nightly"), "{err}");
    let (code, _, err) = w.ctl(&["jobs", "trigger", "--tag", "finance", "--wait"]);
    assert_eq!(code, 2, "{err}");

    let answers = sdk(
        &w,
        json!([
            ["pause_job", {"tag": "nightly", "reason": "backup"}],
            ["pause_job", {"name": "ledger", "tag": "finance"}],
            ["trigger_job", {"tag": "finance", "wait": true}],
            ["resume_job", {}],
            ["list_jobs", {"tag": "nightly"}],
        ]),
    );
    let paused = ok(&answers[1]);
    assert_eq!((&paused["tag"], &paused["changed"]), (&json!("nightly"), &json!(["ledger"])), "{paused}");
    let protocol_error = |a: &Value| a["protocol_error"].as_str().unwrap_or_else(|| panic!("refused as invalid arguments: {a}")).to_owned();
    assert!(protocol_error(&answers[2]).contains("give `name` (one job) or `tag` (every job with the tag), not both"));
    assert!(protocol_error(&answers[3]).contains("`wait` is for one job's run"), "{}", answers[3]);
    assert!(protocol_error(&answers[4]).contains("missing `name` (one job) or `tag`"), "{}", answers[4]);
    let listed = ok(&answers[5]);
    assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed["jobs"][0]["tags"], json!(["finance", "nightly"]), "{listed}");
}
