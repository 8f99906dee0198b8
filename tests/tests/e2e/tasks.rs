//! MCP tasks on the real worker, with an rmcp client that declares the tasks extension:
//! `run_workflow … wait` becomes a task that is `input_required` while the approval waits, is
//! answered through `tasks/update` (approve, and in another run reject), and ends as the run
//! ends; `tasks/cancel` cancels a running run; a client without the extension keeps the
//! plain waiting call. The client reads a task the way the protocol has it, with `tasks/get`,
//! woken by the worker's notifications that a job's runs changed.

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig, GetTaskParams, Implementation,
    InputRequest, ProtocolVersion, SubscriptionFilter, TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::{Value, json};

use crate::support::Worker;

const JOBS: &str = "publish:\n  type: workflow\n  workflow: publish\nslow:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  parameters: { command: \"sleep 30\", timeout_seconds: 60 }";

const WORKFLOW: &str = "workflows:
  publish:
    steps:
      - {id: draft, type: plugin, plugin: shell-exec, action: run, parameters: {command: \"printf draft\"}}
      - {id: gate, type: approval, input: \"Publish ${steps.draft.output.stdout}?\"}
      - {id: done, type: plugin, plugin: file-save, action: save, parameters: {path: published.txt, content: done}}
";

/// A client that declares the tasks extension.
struct WithTasks;

impl ClientHandler for WithTasks {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::builder().enable_tasks().build(), Implementation::new("task-test", "1"))
    }
}

type Client = RunningService<RoleClient, WithTasks>;

fn start() -> (Worker, tokio::runtime::Runtime) {
    let mut w = Worker::new("");
    w.write_full(WORKFLOW, JOBS, "");
    w.start();
    (w, tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime"))
}

async fn connect(w: &Worker) -> Client {
    let lifecycle = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::LATEST] };
    WithTasks.serve_with_lifecycle(StreamableHttpClientTransport::from_uri(w.url()), lifecycle).await.expect("connect")
}

/// Calls a tool that starts a run with `wait` and returns the task id it answers with.
async fn task_of(client: &Client, tool: &str, args: Value) -> String {
    let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args.as_object().cloned().expect("object"));
    match client.call_tool_once(params).await.expect("tools/call") {
        CallToolResponse::Task(created) => {
            assert_eq!(created.task.status, TaskStatus::Working);
            assert_eq!(created.task.task_id.len(), 36, "a random UUID: {}", created.task.task_id);
            created.task.task_id
        }
        other => panic!("not a task: {other:?}"),
    }
}

/// Reads the task with `tasks/get` until it is `status`, again each time the worker says a
/// job's runs changed (`lamplighter://jobs` over `subscriptions/listen`; rmcp 3.9 sends no task
/// notifications there). The task and that resource follow the same run change in no fixed
/// order, so a notification that came just before the task moved is backed by one more read
/// after 250 ms without news.
async fn until(client: &Client, id: &str, status: TaskStatus) -> TaskPayload {
    let filter = SubscriptionFilter::builder().resource_subscription("lamplighter://jobs").build();
    let mut changes = client.peer().listen(filter).await.expect("subscriptions/listen");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let got = client.get_task(GetTaskParams::new(id)).await.expect("tasks/get").task;
        if got.status() == status {
            return got.payload;
        }
        assert!(tokio::time::Instant::now() < deadline, "task {id} is {:?}, not {status:?}: {got:?}", got.status());
        let _ = tokio::time::timeout(Duration::from_millis(250), changes.next()).await;
    }
}

/// The one outstanding elicitation's key and message.
fn question(payload: &TaskPayload) -> (String, String) {
    let TaskPayload::InputRequired { input_requests } = payload else { panic!("{payload:?}") };
    assert_eq!(input_requests.len(), 1, "{input_requests:?}");
    let (key, request) = input_requests.iter().next().expect("one");
    let InputRequest::Elicitation(_) = request else { panic!("an elicitation: {request:?}") };
    let wire = serde_json::to_value(request).expect("JSON");
    (key.clone(), wire["params"]["message"].as_str().expect("message").to_owned())
}

fn answer(task: &str, key: &str, decision: &str, comment: &str) -> UpdateTaskParams {
    let response = json!({"action": "accept", "content": {"decision": decision, "comment": comment}});
    UpdateTaskParams::new(task, [(key.to_owned(), response)].into_iter().collect())
}

#[test]
fn an_approval_is_asked_as_an_input_request_and_answered_with_tasks_update() {
    let (w, rt) = start();
    rt.block_on(async {
        let client = connect(&w).await;
        let id = task_of(&client, "run_workflow", json!({"name": "publish", "wait": true})).await;
        let payload = until(&client, &id, TaskStatus::InputRequired).await;
        let (key, message) = question(&payload);
        assert!(message.contains("step \"gate\": Publish draft?"), "{message}");

        client.update_task(answer(&id, &key, "approve", "ship it")).await.expect("tasks/update");
        let TaskPayload::Completed { result } = until(&client, &id, TaskStatus::Completed).await else { unreachable!() };
        let outcome = &result["structuredContent"];
        assert_eq!((outcome["finished"].as_bool(), outcome["run"]["status"].as_str()), (Some(true), Some("succeeded")), "{result:?}");
        let run = outcome["run_id"].as_str().expect("run_id").to_owned();

        let (code, out, err) = w.ctl(&["-o", "json", "runs", "show", &run]);
        assert_eq!(code, 0, "{err}");
        let shown: Value = serde_json::from_str(&out).expect("JSON");
        let gate = &shown["steps"][1]["output"];
        assert_eq!((gate["approved"].as_bool(), gate["comment"].as_str()), (Some(true), Some("ship it")), "{shown}");
        assert_eq!(gate["decided_by"], "mcp client task-test (task)");
        assert_eq!(std::fs::read_to_string(w.dir.path().join("data/published.txt")).unwrap_or_default(), "done");

        // Another caller's credentials (here: a made-up id) find no task.
        let unknown = client.get_task(GetTaskParams::new("00000000-0000-4000-8000-000000000000")).await.expect_err("unknown");
        assert!(format!("{unknown:?}").contains("unknown task"), "{unknown:?}");
        let _ = client.cancel().await;
    });
}

#[test]
fn a_rejection_fails_the_task_and_a_decision_given_elsewhere_withdraws_the_question() {
    let (w, rt) = start();
    rt.block_on(async {
        let client = connect(&w).await;
        let rejected = task_of(&client, "run_workflow", json!({"name": "publish", "wait": true})).await;
        let (key, _) = question(&until(&client, &rejected, TaskStatus::InputRequired).await);
        client.update_task(answer(&rejected, &key, "reject", "not today")).await.expect("tasks/update");
        let TaskPayload::Failed { error } = until(&client, &rejected, TaskStatus::Failed).await else { unreachable!() };
        assert!(error["message"].as_str().is_some_and(|m| m.contains("failed") && m.contains("gate")), "{error:?}");
        assert_eq!(error["data"]["run"]["status"], "failed");

        // Approved with lampctl instead: the task stops asking and completes.
        let elsewhere = task_of(&client, "run_workflow", json!({"name": "publish", "wait": true})).await;
        until(&client, &elsewhere, TaskStatus::InputRequired).await;
        let waiting = tokio::task::block_in_place(|| {
            w.wait_for("a waiting run", Duration::from_secs(10), |r| r.iter().any(|r| r.status == "waiting_approval"))
        });
        let run = waiting.iter().find(|r| r.status == "waiting_approval").expect("one").id.clone();
        let (code, _, err) = w.ctl(&["approvals", "approve", &run]);
        assert_eq!(code, 0, "{err}");
        until(&client, &elsewhere, TaskStatus::Completed).await;
        let _ = client.cancel().await;
    });
}

#[test]
fn tasks_cancel_cancels_the_run() {
    let (w, rt) = start();
    rt.block_on(async {
        let client = connect(&w).await;
        let id = task_of(&client, "trigger_job", json!({"name": "slow", "wait": true})).await;
        let runs = tokio::task::block_in_place(|| {
            w.wait_for("the slow run to start", Duration::from_secs(10), |r| r.iter().any(|r| r.status == "running"))
        });
        client.cancel_task(CancelTaskParams::new(id.clone())).await.expect("tasks/cancel");
        until(&client, &id, TaskStatus::Cancelled).await;
        let run = &runs[0].id;
        tokio::task::block_in_place(|| {
            w.wait_for("the run cancelled", Duration::from_secs(10), |r| r.iter().any(|r| &r.id == run && r.status == "cancelled"))
        });

        // Without the extension the same call waits and answers with the run, as before.
        let plain = rmcp::ServiceExt::serve((), StreamableHttpClientTransport::from_uri(w.url())).await.expect("connect");
        let params = CallToolRequestParams::new("trigger_job")
            .with_arguments(json!({"name": "slow", "wait": true, "timeout_seconds": 1}).as_object().cloned().expect("object"));
        let result = plain.call_tool(params).await.expect("a result, not a task");
        assert_eq!(result.structured_content.as_ref().map(|v| v["run"]["status"].clone()), Some(Value::from("running")));
        let _ = plain.cancel().await;
        let _ = client.cancel().await;
    });
}

#[test]
fn run_agent_with_wait_is_a_task_whose_tool_approval_is_asked_and_answered() {
    use lamplighter_tests::llm::{Reply, ScriptedLlm, last_text, tool_results};
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let llm = rt.block_on(ScriptedLlm::start((3, 2), |req| match tool_results(req) {
        0 => Reply::Tools(vec![("file-save__save".into(), r#"{"path": "note.md", "content": "checked"}"#.into())]),
        _ => Reply::Text(format!("saved: {}", last_text(req))),
    }));
    let top = format!("{}agents:\n  careful:\n    plugins: [file-save]\n    tool_approval: ask\n", llm.ai_section());
    let mut w = Worker::new("");
    w.write_full(&top, "", "");
    w.start();
    rt.block_on(async {
        let client = connect(&w).await;
        let id = task_of(&client, "run_agent", json!({"name": "careful", "input": "save a note", "wait": true})).await;
        let payload = until(&client, &id, TaskStatus::InputRequired).await;
        let (key, message) = question(&payload);
        assert!(message.contains("file-save.save") && message.contains("note.md"), "{message}");
        client.update_task(answer(&id, &key, "approve", "fine")).await.expect("tasks/update");
        let TaskPayload::Completed { result } = until(&client, &id, TaskStatus::Completed).await else { unreachable!() };
        let run = &result["structuredContent"]["run"];
        assert_eq!((run["job"].as_str(), run["status"].as_str()), (Some("agent:careful"), Some("succeeded")), "{result:?}");
        assert_eq!(std::fs::read_to_string(w.dir.path().join("data/note.md")).unwrap_or_default(), "checked");
        let _ = client.cancel().await;
    });
}
