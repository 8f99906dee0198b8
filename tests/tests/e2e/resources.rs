//! Resources and subscriptions on the real worker: a current client (2026-07-28) reads the
//! jobs and a run as resources and hears, over `subscriptions/listen`, a run moving on, a pause
//! and a reload that adds a job; an older client does the same with `resources/subscribe`;
//! `lampctl runs follow` shows a workflow step by step until its approval is given.

use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ErrorCode, ProtocolVersion, ReadResourceRequestParams, ResourceContents, ResourceUpdatedNotificationParam,
    ServerNotification, SubscribeRequestParams, SubscriptionFilter,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::support::{Worker, ctl_bin};

const JOBS: &str = "report:\n  description: writes a report\n  cron: \"0 3 * * *\"\n  type: plugin\n  plugin: file-save\n  action: save\n  parameters: { path: report.txt, content: hello }\npublish:\n  type: workflow\n  workflow: publish";

const WORKFLOW: &str = "workflows:
  publish:
    steps:
      - {id: draft, type: plugin, plugin: shell-exec, action: run, parameters: {command: \"printf draft\"}}
      - {id: gate, type: approval, input: \"Publish?\"}
      - {id: done, type: plugin, plugin: file-save, action: save, parameters: {path: published.txt, content: done}}
";

fn worker() -> Worker {
    let mut w = Worker::new("");
    w.write_full(WORKFLOW, JOBS, "");
    w.start();
    w
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime")
}

/// A client at 2026-07-28 (no session; `subscriptions/listen`).
async fn current(w: &Worker) -> RunningService<RoleClient, ()> {
    let lifecycle = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::LATEST] };
    ().serve_with_lifecycle(StreamableHttpClientTransport::from_uri(w.url()), lifecycle).await.expect("connect")
}

async fn call(client: &RunningService<RoleClient, impl rmcp::Service<RoleClient>>, tool: &str, args: Value) -> Value {
    let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args.as_object().cloned().expect("an object"));
    let result = client.call_tool(params).await.expect("call");
    assert_ne!(result.is_error, Some(true), "{tool}: {result:?}");
    result.structured_content.expect("structured content")
}

async fn read(client: &RunningService<RoleClient, impl rmcp::Service<RoleClient>>, uri: &str) -> (Value, Option<u64>) {
    let result = client.read_resource(ReadResourceRequestParams::new(uri)).await.expect("resources/read");
    let ResourceContents::TextResourceContents { text, mime_type, .. } = &result.contents[0] else { panic!("text contents") };
    assert_eq!(mime_type.as_deref(), Some("application/json"));
    (serde_json::from_str(text).expect("JSON"), result.ttl_ms)
}

/// Starts the workflow and returns its run id once it waits for approval.
fn waiting_run(w: &Worker) -> String {
    let (code, out, err) = w.ctl(&["-o", "json", "workflows", "run", "publish"]);
    assert_eq!(code, 0, "{err}");
    let id = serde_json::from_str::<Value>(&out).expect("JSON")["run_id"].as_str().expect("run_id").to_owned();
    w.wait_for("the workflow to wait", Duration::from_secs(20), |r| r.iter().any(|r| r.id == id && r.status == "waiting_approval"));
    id
}

#[test]
fn a_current_client_reads_resources_and_hears_a_run_a_pause_and_a_reload() {
    let w = worker();
    let run = waiting_run(&w);
    let rt = runtime();
    rt.block_on(async {
        let client = current(&w).await;
        let uris: Vec<String> = client.list_all_resources().await.expect("resources/list").into_iter().map(|r| r.uri).collect();
        assert_eq!(uris, ["lamplighter://jobs", "lamplighter://jobs/publish", "lamplighter://jobs/report"]);
        let templates = client.list_resource_templates(None).await.expect("templates").resource_templates;
        let templates: Vec<&str> = templates.iter().map(|t| t.uri_template.as_str()).collect();
        assert_eq!(templates, ["lamplighter://jobs/{name}", "lamplighter://runs/{id}"]);
        let (job, ttl) = read(&client, "lamplighter://jobs/report").await;
        assert_eq!((job["name"].as_str(), job["paused"].as_bool(), ttl), (Some("report"), Some(false), Some(0)));
        let missing = client.read_resource(ReadResourceRequestParams::new("lamplighter://jobs/nope")).await.expect_err("no such job");
        // 2026-07-28 reports an unknown resource as invalid params (older versions: -32002).
        assert!(matches!(&missing, rmcp::ServiceError::McpError(e) if e.code == ErrorCode::INVALID_PARAMS && e.message.contains("\"nope\" not found")), "{missing:?}");

        let run_uri = format!("lamplighter://runs/{run}");
        let filter = SubscriptionFilter::builder()
            .resource_subscriptions([run_uri.as_str(), "lamplighter://jobs/report", "lamplighter://nothing"])
            .resources_list_changed()
            .build();
        let mut sub = client.peer().listen(filter).await.expect("subscriptions/listen");
        let accepted = sub.acknowledged().clone();
        assert_eq!(accepted.resource_subscriptions, Some(vec![run_uri.clone(), "lamplighter://jobs/report".to_owned()]), "an unknown URI is not accepted");
        assert_eq!(accepted.resources_list_changed, Some(true));

        let mut next = async || match tokio::time::timeout(Duration::from_secs(20), sub.next()).await {
            Ok(Ok(Some(n))) => n,
            other => panic!("no notification: {other:?}"),
        };
        // The approval lets the run go on: its resource changes until it has succeeded.
        call(&client, "approve_step", json!({"run_id": run, "comment": "ok"})).await;
        loop {
            let ServerNotification::ResourceUpdatedNotification(n) = next().await else { continue };
            assert_eq!(n.params.uri, run_uri);
            let (detail, ttl) = read(&client, &run_uri).await;
            if detail["status"] == "succeeded" {
                assert_eq!(ttl, Some(24 * 60 * 60 * 1000), "a finished run may be cached");
                break;
            }
        }
        call(&client, "pause_job", json!({"name": "report"})).await;
        let paused = next().await;
        assert!(matches!(&paused, ServerNotification::ResourceUpdatedNotification(n) if n.params.uri == "lamplighter://jobs/report"), "{paused:?}");

        w.write_full(WORKFLOW, &format!("{JOBS}\nextra:\n  type: plugin\n  plugin: file-save\n  action: save\n  parameters: {{path: x.txt, content: x}}"), "");
        call(&client, "reload_config", json!({})).await;
        loop {
            if let ServerNotification::ResourceListChangedNotification(_) = next().await {
                break;
            }
        }
        let uris: Vec<String> = client.list_all_resources().await.expect("resources/list").into_iter().map(|r| r.uri).collect();
        assert!(uris.contains(&"lamplighter://jobs/extra".to_owned()), "{uris:?}");
        let _ = sub.cancel().await;
        let _ = client.cancel().await;
    });
}

/// A subscription acknowledged before the worker's watch has read the run could miss the
/// run's end (it changes no more after it), and a follower would wait for ever: a run already
/// finished when the watch begins is announced at once. Here the run finished long before.
#[test]
fn a_run_already_finished_when_followed_is_announced_at_once() {
    let w = worker();
    let (code, out, err) = w.ctl(&["-o", "json", "jobs", "trigger", "report", "--wait"]);
    assert_eq!(code, 0, "{err}");
    let run = serde_json::from_str::<Value>(&out).expect("JSON")["run_id"].as_str().expect("run_id").to_owned();
    let rt = runtime();
    rt.block_on(async {
        let client = current(&w).await;
        let run_uri = format!("lamplighter://runs/{run}");
        let filter = SubscriptionFilter::builder().resource_subscriptions([run_uri.as_str(), "lamplighter://jobs/report"]).build();
        let mut sub = client.peer().listen(filter).await.expect("subscriptions/listen");
        let first = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("announced within 10 s").expect("open");
        assert!(matches!(&first, Some(ServerNotification::ResourceUpdatedNotification(n)) if n.params.uri == run_uri), "{first:?}");
        let (detail, _) = read(&client, &run_uri).await;
        assert_eq!(detail["status"], "succeeded");
        // Only what is final: a job that may still change is not announced without a change.
        let quiet = tokio::time::timeout(Duration::from_millis(1500), sub.next()).await;
        assert!(quiet.is_err(), "nothing else changed: {quiet:?}");
        let _ = sub.cancel().await;
        let _ = client.cancel().await;
    });
}

/// The triage prompt, and job names completed for it and for `lamplighter://jobs/{name}`.
#[test]
fn the_triage_prompt_names_the_job_and_job_names_complete() {
    use rmcp::model::{ArgumentInfo, CompleteRequestParams, GetPromptRequestParams, PromptReference, Reference, ResourceTemplateReference};
    let w = worker();
    runtime().block_on(async {
        let client = current(&w).await;
        let prompts: Vec<String> = client.list_all_prompts().await.expect("prompts/list").into_iter().map(|p| p.name).collect();
        assert_eq!(prompts, ["triage-failures"]);
        let mut ask = GetPromptRequestParams::new("triage-failures");
        ask.arguments = json!({"job": "report"}).as_object().cloned();
        let prompt = client.get_prompt(ask).await.expect("prompts/get");
        let text = serde_json::to_value(&prompt.messages[0]).expect("JSON")["content"]["text"].as_str().unwrap_or_default().to_owned();
        assert!(text.contains("of the job \"report\"") && text.contains("`list_runs` with status \"failed\" and job \"report\""), "{text}");
        let mut unknown = GetPromptRequestParams::new("triage-failures");
        unknown.arguments = json!({"job": "nope"}).as_object().cloned();
        let e = client.get_prompt(unknown).await.expect_err("an unknown job");
        assert!(format!("{e:?}").contains("job \\\"nope\\\" not found"), "{e:?}");

        let complete = |r: Reference, arg: &str, value: &str| CompleteRequestParams::new(r, ArgumentInfo::new(arg, value));
        let by_template = client
            .complete(complete(Reference::Resource(ResourceTemplateReference::new("lamplighter://jobs/{name}")), "name", "re"))
            .await
            .expect("completion/complete");
        assert_eq!(by_template.completion.values, ["report"]);
        let by_prompt =
            client.complete(complete(Reference::Prompt(PromptReference::new("triage-failures")), "job", "")).await.expect("completion");
        assert_eq!(by_prompt.completion.values, ["publish", "report"]);
        let other = client.complete(complete(Reference::Prompt(PromptReference::new("other")), "x", "")).await.expect("completion");
        assert!(other.completion.values.is_empty());
        let _ = client.cancel().await;
    });
}

/// An older client's session: `resources/subscribe`, notifications through its handler.
struct Older(tokio::sync::mpsc::UnboundedSender<String>);

impl ClientHandler for Older {
    async fn on_resource_updated(&self, params: ResourceUpdatedNotificationParam, _context: NotificationContext<RoleClient>) {
        let _ = self.0.send(params.uri);
    }
}

#[test]
#[allow(deprecated, reason = "resources/subscribe is what clients before 2026-07-28 send")]
fn an_older_client_subscribes_to_a_run_and_hears_it_finish() {
    let w = worker();
    let run = waiting_run(&w);
    let rt = runtime();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let client = Older(tx).serve(StreamableHttpClientTransport::from_uri(w.url())).await.expect("connect (initialize)");
        let uri = format!("lamplighter://runs/{run}");
        client.subscribe(SubscribeRequestParams::new(uri.clone())).await.expect("resources/subscribe");
        let bad = client.subscribe(SubscribeRequestParams::new("lamplighter://runs/")).await.expect_err("no such resource");
        assert!(matches!(&bad, rmcp::ServiceError::McpError(e) if e.code == ErrorCode::RESOURCE_NOT_FOUND), "{bad:?}");
        call(&client, "approve_step", json!({"run_id": run})).await;
        loop {
            let got = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await.expect("a notification").expect("open");
            assert_eq!(got, uri);
            let (detail, _) = read(&client, &uri).await;
            if detail["status"] == "succeeded" {
                break;
            }
        }
        client.unsubscribe(rmcp::model::UnsubscribeRequestParams::new(uri)).await.expect("resources/unsubscribe");
        let _ = client.cancel().await;
    });
}

/// `lampctl runs follow`: the run as it stands, then each step as it moves, the hint to
/// approve, and the end; exit 0 when it succeeded.
#[test]
fn runs_follow_shows_each_step_and_the_approval_until_the_run_ends() {
    let w = worker();
    let run = waiting_run(&w);
    let mut child = std::process::Command::new(ctl_bin())
        .args(["--url", &w.url(), "runs", "follow", &run])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("lampctl");
    let (lines, seen) = mpsc::channel();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut out = Vec::new();
    // Until it shows the approval it waits for: an event on the pipe, not a poll.
    while !out.iter().any(|l: &String| l.contains("approve it with")) {
        out.push(seen.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("lampctl printed: {out:#?}")));
    }
    let (code, _, err) = w.ctl(&["approvals", "approve", &run]);
    assert_eq!(code, 0, "{err}");
    let status = child.wait().expect("lampctl exits");
    // Every line it printed: the reader ends at the pipe's end, after the process has exited
    // (lines still on their way when it exited were lost to `try_iter`).
    out.extend(seen.iter());
    let text = out.join("\n");
    assert_eq!(status.code(), Some(0), "{text}");
    assert!(out[0].starts_with(&format!("run {run} (job workflow:publish, manual trigger): waiting_approval")), "{text}");
    for expected in
        ["  step draft: succeeded after 0s", "  step gate: waiting_approval", "  step gate: succeeded", "  step done: succeeded"]
    {
        assert!(out.iter().any(|l| l.starts_with(expected)), "no line {expected:?} in:\n{text}");
    }
    assert!(out.last().is_some_and(|l| l.starts_with(&format!("run {run} succeeded after "))), "{text}");

    // A run that does not exist: the worker says so (exit 1).
    let (code, _, err) = w.ctl(&["runs", "follow", "00000000-0000-0000-0000-000000000000"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not found"), "{err}");
}
