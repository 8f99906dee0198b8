//! The MCP control surface, driven by the real `lampctl` binary and by a plain rmcp client.

use std::time::Duration;

use chrono::Timelike;
use serde_json::Value;

use crate::support::{Worker, ctl_at, free_port, mcp_exchange, mcp_post};

const QUICK: &str = "report:\n  description: writes a report\n  cron: \"0 3 * * *\"\n  timezone: Europe/Berlin\n  type: plugin\n  plugin: file-save\n  action: save\n  parameters: { path: report.txt, content: hello }";
const SLOW: &str = "slow:\n  cron: \"0 4 * * *\"\n  type: plugin\n  plugin: shell-exec\n  action: run\n  parameters: { command: \"sleep 30\", timeout_seconds: 60 }";

fn worker() -> Worker {
    let mut w = Worker::new(&format!("{QUICK}\n{SLOW}"));
    w.start();
    w
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
}

/// Asserts exit 0 and returns stdout.
fn ok(w: &Worker, args: &[&str]) -> String {
    let (code, out, err) = w.ctl(args);
    assert_eq!(code, 0, "lampctl {args:?} exited {code}\nstdout: {out}\nstderr: {err}");
    out
}

#[test]
fn jobs_list_and_show_with_next_fire_times() {
    let w = worker();
    let table = ok(&w, &["jobs", "list"]);
    assert!(table.contains("report") && table.contains("slow"), "{table}");
    let list = json(&ok(&w, &["-o", "json", "jobs", "list"]));
    let names: Vec<&str> = list["jobs"].as_array().expect("jobs array").iter().filter_map(|j| j["name"].as_str()).collect();
    assert_eq!(names, ["report", "slow"]);

    let show = json(&ok(&w, &["-o", "json", "jobs", "show", "report"]));
    assert_eq!(show["name"], "report");
    assert_eq!(show["timezone"], "Europe/Berlin");
    let fires = show["next_fires"].as_array().expect("next_fires");
    assert!(!fires.is_empty());
    // 03:00 in Berlin is 01:00 or 02:00 UTC depending on the season.
    let at = fires[0]["utc"].as_str().expect("utc");
    assert!(at.contains("T01:00:00") || at.contains("T02:00:00"), "{at}");

    let next = ok(&w, &["jobs", "next", "report", "-n", "3"]);
    // Three fire times, shown in the job's zone: 03:00 Berlin time each.
    assert_eq!(next.matches("03:00").count(), 3, "{next}");
    assert!(ok(&w, &["jobs", "show", "report"]).contains("report"));
}

/// An assistant checks its translation of "weekdays at 7:30 Berlin time" before saving a job:
/// the fire times come back in the zone and in UTC, a daylight-saving change in between is
/// named, a schedule that fires far more often than meant is warned about, and a mistake
/// names its field.
#[test]
fn a_schedule_is_previewed_before_any_job_uses_it() {
    let w = worker();
    // A hundred weekdays from any day of the year reach a daylight-saving change in Berlin.
    let p = json(&ok(&w, &["-o", "json", "schedule", "preview", "--cron", "30 7 * * 1-5", "--timezone", "Europe/Berlin", "-n", "100"]));
    assert_eq!((p["schedule"].as_str(), p["timezone"].as_str()), (Some("cron: 30 7 * * 1-5"), Some("Europe/Berlin")));
    let fires = p["next_fires"].as_array().expect("next_fires");
    assert_eq!(fires.len(), 100);
    for f in fires {
        let local = f["local"].as_str().expect("local");
        assert!(local.contains("T07:30:00+01:00") || local.contains("T07:30:00+02:00"), "{local}");
    }
    let notes = p["notes"].as_array().expect("a daylight-saving change is named");
    assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.contains("daylight-saving change"))), "{notes:?}");
    assert!(p.get("warnings").is_none(), "{p}");

    // An hour that is at least an hour away, so that its first three minutes come next.
    let hour = (chrono::Utc::now().hour() + 2) % 24;
    let table = ok(&w, &["schedule", "preview", "--cron", &format!("* {hour} * * *"), "--timezone", "UTC", "-n", "3"]);
    assert!(table.contains("warning: this fires 60 times a day"), "{table}");
    let first_minutes = format!(" {hour:02}:0");
    assert_eq!(
        table.lines().filter(|l| l.contains(&first_minutes)).count(),
        3,
        "three fire times at {hour:02}:00–{hour:02}:02 UTC:\n{table}"
    );

    for (args, field) in [
        (vec!["--cron", "30 7 * *"], "cron: "),
        (vec!["--cron", "30 7 * * *", "--timezone", "Berlin"], "timezone: "),
        (vec!["--every", "soon"], "every: "),
    ] {
        let (code, _, err) = w.ctl(&[&["schedule", "preview"][..], &args].concat());
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(field), "{args:?} names {field}: {err}");
    }
    let (code, _, err) = w.ctl(&["schedule", "preview", "--timezone", "UTC"]);
    assert_eq!(code, 2, "no schedule given is a usage error: {err}");
}

#[test]
fn unknown_job_exits_1_and_names_the_known_jobs() {
    let w = worker();
    let (code, _, err) = w.ctl(&["jobs", "show", "nightly"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("\"nightly\" not found") && err.contains("report") && err.contains("slow"), "{err}");
}

#[test]
fn pause_survives_a_restart_and_resume_clears_it() {
    let mut w = worker();
    ok(&w, &["jobs", "pause", "report", "--reason", "disk full"]);
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(15)), Some(0));
    w.start();
    let show = json(&ok(&w, &["-o", "json", "jobs", "show", "report"]));
    assert_eq!(show["paused"], true, "{show}");
    assert_eq!(show["pause_reason"], "disk full");
    assert!(show["next_fire"].is_null(), "a paused job has no next fire: {show}");
    ok(&w, &["jobs", "resume", "report"]);
    let show = json(&ok(&w, &["-o", "json", "jobs", "show", "report"]));
    assert_eq!(show["paused"], false);
    assert!(show["next_fire"].is_string());
}

#[test]
fn trigger_wait_returns_the_finished_run_and_runs_list_and_show_find_it() {
    let w = worker();
    let out = json(&ok(&w, &["-o", "json", "jobs", "trigger", "report", "--param", "content=triggered", "--wait"]));
    let run = if out.get("run").is_some() { &out["run"] } else { &out };
    assert_eq!(run["status"], "succeeded", "{out}");
    assert_eq!(run["trigger"], "manual");
    let id = run["id"].as_str().expect("run id").to_string();
    assert_eq!(std::fs::read_to_string(w.dir.path().join("data/report.txt")).unwrap_or_default(), "triggered");

    let runs = json(&ok(&w, &["-o", "json", "runs", "list", "--job", "report"]));
    assert!(runs["runs"].as_array().expect("runs").iter().any(|r| r["id"] == id.as_str()), "{runs}");
    let table = ok(&w, &["runs", "list"]);
    assert!(table.contains(&id[..8]) || table.contains(&id), "{table}");
    let shown = json(&ok(&w, &["-o", "json", "runs", "show", &id]));
    assert_eq!(shown["status"], "succeeded");
    assert_eq!(shown["parameters"]["content"], "triggered");
    assert_eq!(shown["parameters"]["path"], "report.txt", "an override keeps the parameters it does not name");
}

#[test]
fn runs_list_pages_with_a_cursor() {
    let w = worker();
    for i in 0..3 {
        ok(&w, &["jobs", "trigger", "report", "--idempotency-key", &format!("k{i}"), "--wait"]);
    }
    let first = json(&ok(&w, &["-o", "json", "runs", "list", "--limit", "2"]));
    assert_eq!(first["runs"].as_array().expect("runs").len(), 2);
    let cursor = first["next_cursor"].as_str().expect("a next cursor on a full page");
    let second = json(&ok(&w, &["-o", "json", "runs", "list", "--limit", "2", "--cursor", cursor]));
    let ids: Vec<_> = second["runs"].as_array().expect("runs").iter().map(|r| r["id"].clone()).collect();
    assert_eq!(ids.len(), 1);
    assert!(!first["runs"].as_array().expect("runs").iter().any(|r| r["id"] == ids[0]));
}

#[test]
fn cancel_stops_a_long_run() {
    let w = worker();
    let out = json(&ok(&w, &["-o", "json", "jobs", "trigger", "slow"]));
    let id = out["run_id"].as_str().expect("run_id").to_string();
    w.wait_for("the slow run to start", Duration::from_secs(10), |r| r.iter().any(|r| r.id == id && r.status == "running"));
    ok(&w, &["runs", "cancel", &id]);
    let runs = w.wait_for("the run cancelled", Duration::from_secs(10), |r| r.iter().any(|r| r.id == id && r.status == "cancelled"));
    assert_eq!(runs.len(), 1, "no retry after a cancel");
}

#[test]
fn tools_list_and_seed_compatible_names() {
    let w = worker();
    let tools = ok(&w, &["tools", "list"]);
    for name in
        ["list_jobs", "get_job", "trigger_job", "list_runs", "cancel_run", "worker_status", "scheduler_list_jobs", "scheduler_trigger_job"]
    {
        assert!(tools.contains(name), "{name} missing from:\n{tools}");
    }
    let seed = json(&ok(&w, &["-o", "json", "tools", "call", "scheduler_list_jobs", "--json", "{}"]));
    assert!(seed.to_string().contains("report"), "{seed}");
    let (code, _, err) = w.ctl(&["tools", "call", "get_job", "--json", "{not json"]);
    assert_eq!(code, 2, "bad --json is a usage error: {err}");
    let (code, _, err) = w.ctl(&["tools", "call", "get_job", "--json", "{\"name\": 5}"]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("name"), "the error names the bad argument: {err}");
}

#[test]
fn an_unreachable_worker_exits_3_with_a_hint() {
    let url = format!("http://127.0.0.1:{}/mcp", free_port());
    let (code, _, err) = ctl_at(&url, None, &["jobs", "list"]);
    assert_eq!(code, 3, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("LAMPLIGHTER_URL") || err.contains("--url"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    let (code, _, _) = ctl_at("http://127.0.0.1:1/mcp", None, &["jobs", "frobnicate"]);
    assert_eq!(code, 2);
}

fn auth_worker() -> Worker {
    let mut w = Worker::new(QUICK);
    w.write_config(QUICK, "auth:\n  type: bearer\n  token: s3cret-token");
    w.start();
    w
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;

#[test]
fn bearer_auth_is_required_when_configured() {
    let w = auth_worker();
    assert_eq!(mcp_post(w.port, &[], INIT).0, 401, "no token");
    assert_eq!(mcp_post(w.port, &[("Authorization", "Bearer wrong")], INIT).0, 401, "wrong token");
    assert_eq!(mcp_post(w.port, &[("Authorization", "Bearer s3cret-token")], INIT).0, 200, "right token");
    let (code, _, err) = ctl_at(&w.url(), None, &["jobs", "list"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("LAMPLIGHTER_TOKEN") || err.contains("--token"), "{err}");
    let (code, _, err) = ctl_at(&w.url(), Some("wrong"), &["jobs", "list"]);
    assert_eq!(code, 3, "{err}");
    let (code, out, err) = ctl_at(&w.url(), Some("s3cret-token"), &["jobs", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("report"));
    // Health endpoints stay open for probes.
    assert_eq!(crate::support::http_get(w.port, "/healthz").map(|r| r.0), Some(200));
}

#[test]
fn foreign_origin_and_host_are_refused() {
    let w = worker();
    assert_eq!(mcp_post(w.port, &[("Origin", "https://evil.example")], INIT).0, 403, "foreign Origin");
    assert_eq!(mcp_post(w.port, &[("Host", "evil.example")], INIT).0, 403, "foreign Host");
    let local = format!("http://127.0.0.1:{}", w.port);
    assert_eq!(mcp_post(w.port, &[("Origin", local.as_str())], INIT).0, 200, "own Origin");
    assert_eq!(mcp_post(w.port, &[], INIT).0, 200, "no Origin (not a browser)");
}

/// A `tools/call` of `get_job` at 2026-07-28, as a plain HTTP client sends it.
const GET_JOB_CURRENT: &str = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_job","arguments":{"name":"report"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;

/// Many hosts hand a model only `content[].text`: the text carries the whole answer, for a
/// current client (in one JSON answer) and an older one (in an event stream) alike.
#[test]
fn every_client_finds_the_whole_answer_in_the_text() {
    let w = worker();
    let headers = [("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", "tools/call"), ("Mcp-Name", "get_job")];
    for (route, extra) in [("direct", ""), ("rmcp", OWN_META)] {
        let body = GET_JOB_CURRENT.replace(r#""_meta":{"#, &format!(r#""_meta":{{{extra}"#));
        let (status, head, body) = mcp_exchange(w.port, &headers, &body);
        assert_eq!(status, 200, "{route}: {head}\n{body}");
        // One plain JSON answer, not an event stream.
        assert!(head.contains("content-type: application/json"), "{route}: {head}");
        let result = &json(&body)["result"];
        assert_eq!(result["structuredContent"]["name"], "report", "{route}: {body}");
        assert!(result["structuredContent"]["next_fires"].as_array().is_some_and(|f| !f.is_empty()), "{route}: {body}");
        let text = result["content"][0]["text"].as_str().expect("text content");
        assert_eq!(json(text), result["structuredContent"], "{route}: the text is the whole result");
    }

    // A client at 2025-06-18.
    let (status, head, _) = mcp_exchange(w.port, &[], INIT);
    assert_eq!(status, 200);
    let session = head.lines().find_map(|l| l.strip_prefix("mcp-session-id:")).map(|s| s.trim().to_string()).expect("session id");
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let old = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-06-18")];
    assert_eq!(mcp_exchange(w.port, &old, initialized).0, 202);
    let call = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_job","arguments":{"name":"report"}}}"#;
    let (status, _, body) = mcp_exchange(w.port, &old, call);
    assert_eq!(status, 200, "{body}");
    // An event stream (after its empty priming event), in HTTP chunks.
    let data = body.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).find(|d| !d.is_empty()).map(json).expect("a data event");
    let text = data["result"]["content"][0]["text"].as_str().expect("text content");
    assert_eq!(json(text), data["result"]["structuredContent"], "the full JSON as text: {text}");
}

#[test]
fn an_oversized_request_is_refused() {
    let w = worker();
    let big = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#, "x".repeat(2 * 1024 * 1024));
    assert_eq!(mcp_post(w.port, &[], &big).0, 413);
}

#[test]
fn non_loopback_without_auth_refuses_to_start() {
    let w = Worker::new(QUICK);
    w.write_config(QUICK, "host: 0.0.0.0");
    let (code, _, err) = crate::support::run_cli(&["run", "--config", w.config_path().to_str().expect("utf-8")], w.dir.path());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("auth"), "{err}");
}

#[test]
fn lampctl_stays_small() {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["tree", "-p", "lamplighter-ctl", "-e", "normal", "--prefix", "none", "--offline"])
        .current_dir(crate::support::repo_root())
        .output()
        .expect("cargo tree");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.contains("rmcp"), "cargo tree output looks wrong:\n{tree}");
    for heavy in ["wasmtime", "sqlx", "async-openai", "lamplighter-jobs"] {
        assert!(!tree.lines().any(|l| l.starts_with(&format!("{heavy} "))), "lampctl depends on {heavy}");
    }
}

/// A plain rmcp client, not lampctl: tools, schemas, annotations, a call and a bad call.
#[test]
fn a_plain_rmcp_client_can_drive_the_worker() {
    use rmcp::ServiceExt;
    use rmcp::transport::StreamableHttpClientTransport;

    let w = worker();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let transport = StreamableHttpClientTransport::from_uri(w.url());
        let client = ().serve(transport).await.expect("connect");
        let tools = client.list_all_tools().await.expect("tools/list");
        let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
        assert_eq!(names[0], "worker_status", "stable order: {names:?}");
        let get_job = tools.iter().find(|t| t.name == "get_job").expect("get_job");
        assert!(get_job.output_schema.is_some(), "structured output declared");
        assert_eq!(get_job.annotations.as_ref().and_then(|a| a.read_only_hint), Some(true));
        let cancel = tools.iter().find(|t| t.name == "cancel_run").expect("cancel_run");
        assert_eq!(cancel.annotations.as_ref().and_then(|a| a.destructive_hint), Some(true));

        let args = serde_json::json!({"name": "report"}).as_object().cloned();
        let res = client
            .call_tool(rmcp::model::CallToolRequestParams::new("get_job").with_arguments(args.expect("object")))
            .await
            .expect("call get_job");
        assert_ne!(res.is_error, Some(true));
        assert_eq!(res.structured_content.as_ref().map(|v| v["name"].clone()), Some(Value::from("report")));

        let args = serde_json::json!({"name": "nope"}).as_object().cloned();
        let res = client
            .call_tool(rmcp::model::CallToolRequestParams::new("get_job").with_arguments(args.expect("object")))
            .await
            .expect("a tool error is a result, not a protocol error");
        assert_eq!(res.is_error, Some(true));
        let _ = client.cancel().await;
    });
}

/// `lamplighter run --mcp-stdio`, launched by a client as chat clients do.
#[test]
fn mcp_over_stdio_serves_the_same_tools() {
    use rmcp::ServiceExt;
    use rmcp::transport::TokioChildProcess;

    let w = Worker::new(QUICK);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut cmd = tokio::process::Command::new(crate::support::bin());
        cmd.args(["run", "--mcp-stdio", "--config"]).arg(w.config_path()).current_dir(w.dir.path()).env("RUST_LOG", "warn");
        let client = ().serve(TokioChildProcess::new(cmd).expect("spawn")).await.expect("connect over stdio");
        let tools = client.list_all_tools().await.expect("tools/list");
        assert_eq!(tools.len(), 28, "{:?}", tools.iter().map(|t| t.name.to_string()).collect::<Vec<_>>());
        let res = client
            .call_tool(rmcp::model::CallToolRequestParams::new("list_jobs").with_arguments(serde_json::Map::new()))
            .await
            .expect("list_jobs");
        assert_eq!(res.structured_content.as_ref().map(|v| v["jobs"][0]["name"].clone()), Some(Value::from("report")));
        let _ = client.cancel().await;
    });
}

/// Ctrl-C while `lampctl jobs trigger --wait` waits: lampctl stops waiting (exit 130), names the
/// run, and the run goes on in the worker.
#[test]
fn interrupting_a_wait_leaves_the_run_going_and_names_it() {
    use std::io::BufRead;
    let w = worker();
    let mut child = std::process::Command::new(crate::support::ctl_bin())
        .args(["--url", &w.url(), "jobs", "trigger", "slow", "--wait"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("lampctl");
    // lampctl shows the run's progress on stderr as it follows it: the first line names it.
    let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut first = String::new();
    stderr.read_line(&mut first).expect("a progress line");
    let id = first.strip_prefix("run ").and_then(|l| l.split_whitespace().next()).unwrap_or_else(|| panic!("{first}")).to_owned();
    w.wait_for("the slow run to start", Duration::from_secs(10), |r| r.iter().any(|r| r.id == id && r.status == "running"));
    let ok = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill").success();
    assert!(ok);
    let status = child.wait().expect("lampctl exits");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut err).expect("stderr");
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains(&format!("stopped waiting; run {id} goes on")), "names the run: {err}");
    let runs = w.runs();
    assert_eq!(runs.iter().find(|r| r.id == id).map(|r| r.status.as_str()), Some("running"), "the run goes on");
}

#[test]
fn a_wait_with_a_timeout_returns_the_run_still_going() {
    let w = worker();
    let (code, out, err) = w.ctl(&["-o", "json", "jobs", "trigger", "slow", "--wait", "--timeout", "1"]);
    assert_eq!(code, 0, "{err}");
    let out = json(&out);
    assert_eq!(out["run"]["status"], "running", "{out}");
    assert_eq!(out["finished"], false);
    assert!(out["note"].as_str().is_some_and(|n| n.contains("stopped waiting")), "{out}");
}

/// A plain rmcp client sees `trigger_job` `wait` progress, each naming the run in `_meta`.
#[test]
fn trigger_wait_sends_progress_naming_the_run() {
    use std::sync::{Arc, Mutex};

    use rmcp::RoleClient;
    use rmcp::model::ProgressNotificationParam;
    use rmcp::service::NotificationContext;
    use rmcp::{ClientHandler, ServiceExt};

    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<String>>>);
    impl ClientHandler for Recorder {
        async fn on_progress(&self, params: ProgressNotificationParam, _ctx: NotificationContext<RoleClient>) {
            self.0.lock().expect("lock").push(params.message.clone().unwrap_or_default());
        }
    }

    let w = worker();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let recorder = Recorder::default();
        let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(w.url());
        let client = recorder.clone().serve(transport).await.expect("connect");
        let args = serde_json::json!({"name": "slow", "wait": true, "timeout_seconds": 2}).as_object().cloned().expect("object");
        let res = client.call_tool(rmcp::model::CallToolRequestParams::new("trigger_job").with_arguments(args)).await.expect("call");
        let run_id = res.structured_content.as_ref().and_then(|v| v["run_id"].as_str().map(String::from)).expect("run_id");
        let seen = recorder.0.lock().expect("lock").clone();
        assert!(seen.len() >= 2, "a report at once and one per second: {seen:?}");
        // The message names the run. (The worker also puts it in `_meta.run_id`, seen on the
        // wire; rmcp 3.9's client does not hand notification `_meta` to the handler.)
        assert!(seen.iter().all(|m| m.starts_with(&format!("run {run_id} is "))), "{seen:?}");
        let _ = client.cancel().await;
    });
}

#[test]
fn list_jobs_pages_by_name_and_lampctl_follows_the_pages() {
    let w = worker();
    let first = json(&ok(&w, &["-o", "json", "tools", "call", "list_jobs", "--json", r#"{"limit": 1}"#]));
    assert_eq!(first["jobs"].as_array().map(Vec::len), Some(1));
    assert_eq!(first["jobs"][0]["name"], "report");
    assert_eq!(first["next_cursor"], "report");
    let second = json(&ok(&w, &["-o", "json", "tools", "call", "list_jobs", "--json", r#"{"limit": 1, "cursor": "report"}"#]));
    assert_eq!(second["jobs"][0]["name"], "slow");
    assert!(second["next_cursor"].is_null(), "last page: {second}");
    let (code, _, err) = w.ctl(&["tools", "call", "list_jobs", "--json", r#"{"limit": 0}"#]);
    assert_ne!(code, 0);
    assert!(err.contains("limit"), "{err}");
}

/// A `_meta` key rmcp ignores and `direct.rs` does not know, so that a call goes to rmcp.
const OWN_META: &str = r#""dev.lamplighter.test/route":"rmcp","#;

/// `list_jobs`, `get_job`, `list_runs` and `get_run` from a client at 2026-07-28 are answered
/// outside rmcp (`direct.rs`). The same call with a `_meta` key of its own, a shape only rmcp
/// takes, must get the same answer, refusals included; the direct answer is told apart by its
/// `structuredContent` coming before `content`.
#[test]
fn reads_answered_directly_match_rmcps_answers() {
    let w = worker();
    let out = json(&ok(&w, &["-o", "json", "jobs", "trigger", "report", "--wait"]));
    let run = if out.get("run").is_some() { &out["run"] } else { &out };
    let id = run["id"].as_str().expect("run id").to_string();
    let calls = [
        ("list_jobs", "{}".to_string(), true),
        ("list_jobs", r#"{"limit": 1, "cursor": "report"}"#.to_string(), true),
        ("get_job", r#"{"name": "report", "next": 3}"#.to_string(), true),
        ("list_runs", r#"{"job": "report", "status": "succeeded"}"#.to_string(), true),
        ("get_run", format!(r#"{{"id": "{id}"}}"#), true),
        // Refused or failing calls go on to rmcp, which words them.
        ("get_job", r#"{"name": "nope"}"#.to_string(), false),
        ("get_run", r#"{"id": "0193a0a0-0000-7000-8000-000000000000"}"#.to_string(), false),
        ("list_jobs", r#"{"limit": 0}"#.to_string(), false),
        ("list_runs", r#"{"status": "sleeping"}"#.to_string(), false),
    ];
    for (tool, args, direct) in calls {
        let headers = [("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", "tools/call"), ("Mcp-Name", tool)];
        let meta = r#""io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}"#;
        let body = |extra: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{tool}","arguments":{args},"_meta":{{{extra}{meta}}}}}}}"#
            )
        };
        // As rmcp's own client sends it: an integer id and a progress token.
        let (status, head, fast) = mcp_exchange(w.port, &headers, &body(r#""progressToken":3,"#));
        assert!(head.contains("content-type: application/json"), "{tool} {args}: {head}\n{fast}");
        let (rmcp_status, _, slow) = mcp_exchange(w.port, &headers, &body(OWN_META));
        assert_eq!(status, rmcp_status, "{tool} {args}: {fast}\n{slow}");
        assert_eq!(json(&fast), json(&slow), "{tool} {args}: the direct answer differs from rmcp's");
        let structured_first = |a: &str| a.find("\"structuredContent\"").is_some_and(|s| a.find("\"content\"").is_some_and(|c| s < c));
        assert_eq!(structured_first(&fast), direct, "{tool} {args}: answered directly? {fast}");
        assert!(!structured_first(&slow), "{tool} {args}: the call with a key of its own did not reach rmcp: {slow}");
    }
}

/// On SQLite, `list_jobs` answers are kept and served again while nothing changed
/// (`direct.rs`). After each kind of change the listing shows it, and it always equals rmcp's
/// own answer for the same call, which is read afresh every time.
#[test]
fn a_kept_job_listing_follows_every_change() {
    let w = worker();
    let listing = |what: &str| {
        let headers = [("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", "tools/call"), ("Mcp-Name", "list_jobs")];
        let body = |extra: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"list_jobs","arguments":{{}},"_meta":{{{extra}"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
            )
        };
        let kept = json(&mcp_exchange(w.port, &headers, &body("")).2)["result"]["structuredContent"].clone();
        let fresh = json(&mcp_exchange(w.port, &headers, &body(OWN_META)).2)["result"]["structuredContent"].clone();
        assert_eq!(kept, fresh, "{what}: the listing differs from a fresh read");
        kept
    };
    let job = |v: &Value, name: &str| v["jobs"].as_array().and_then(|j| j.iter().find(|j| j["name"] == name)).cloned().unwrap_or_default();

    let first = listing("first");
    assert_eq!(listing("nothing changed"), first);
    ok(&w, &["jobs", "pause", "report", "--reason", "disk full"]);
    let v = listing("after a pause");
    assert_eq!((&job(&v, "report")["paused"], &job(&v, "report")["pause_reason"]), (&Value::from(true), &Value::from("disk full")));
    assert!(job(&v, "report")["next_fire"].is_null(), "{v}");
    ok(&w, &["jobs", "resume", "report"]);
    ok(&w, &["jobs", "trigger", "report", "--wait"]);
    let v = listing("after a run");
    assert_eq!(job(&v, "report")["paused"], false, "{v}");
    assert_eq!(job(&v, "report")["last_run"]["status"], "succeeded", "{v}");

    // Another process's commit: the listing cannot have heard of it but by the database.
    let db = w.dir.path().join("data/lamplighter.db");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display())).await.expect("open the database");
        sqlx::query("INSERT INTO ll_job_state (job, paused, pause_reason) VALUES ('slow', 1, 'elsewhere') ON CONFLICT (job) DO UPDATE SET paused = 1, pause_reason = 'elsewhere'")
            .execute(&mut conn)
            .await
            .expect("write");
    });
    assert_eq!(job(&listing("after another process's commit"), "slow")["pause_reason"], "elsewhere");

    // The kept listing is what is served: a change its count does not see (its trigger
    // dropped for the moment) does not show until something else moves the count.
    let unseen = "DROP TRIGGER ll_listing_state_changed; UPDATE ll_job_state SET pause_reason = 'unseen' WHERE job = 'slow'";
    let restore = "CREATE TRIGGER ll_listing_state_changed AFTER UPDATE OF job, paused, pause_reason, paused_at ON ll_job_state \
                   BEGIN UPDATE ll_listing_changes SET n = n + 1 WHERE id = 1; END";
    let headers = [("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", "tools/call"), ("Mcp-Name", "list_jobs")];
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_jobs","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
    assert_eq!(job(&listing("before the unseen change"), "slow")["pause_reason"], "elsewhere");
    rt.block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display())).await.expect("open the database");
        sqlx::raw_sql(sqlx::AssertSqlSafe(unseen)).execute(&mut conn).await.expect("an unseen change");
        let kept = json(&mcp_exchange(w.port, &headers, call).2)["result"]["structuredContent"].clone();
        assert_eq!(job(&kept, "slow")["pause_reason"], "elsewhere", "the kept listing was not served: {kept}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(restore)).execute(&mut conn).await.expect("the trigger again");
    });
    ok(&w, &["jobs", "resume", "slow"]);
    assert_eq!(job(&listing("after a resume"), "slow")["paused"], false);

    // A reload that adds a job.
    w.write_config(&format!("{QUICK}\n{SLOW}\nlater:\n  cron: \"0 5 * * *\"\n  type: plugin\n  plugin: file-save\n  action: save\n  parameters: {{ path: l.txt, content: x }}"), "");
    ok(&w, &["config", "reload"]);
    assert_eq!(job(&listing("after a reload"), "later")["name"], "later");
}
