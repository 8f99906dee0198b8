//! What each command asks of the worker (one MCP tool call, or `tools/list`) and how the
//! answer is shown: a table or block for people, or the tool's structured content with
//! `-o json`. Data goes to stdout; hints and errors go to stderr.

use std::io::{ErrorKind, IsTerminal, Write};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use crate::cli::{
    ApprovalsCommand, Cli, Command, ConfigCommand, DecisionArgs, JobsCommand, ListCommand, Output, RunsCommand, StartArgs, ToolsCommand,
    WorkflowsCommand,
};
use crate::client::{Client, Progress};
use crate::error::{CtlError, Failure};
use crate::render;

/// Runs one command to completion on a single-threaded runtime (lampctl does one thing at a
/// time; starting worker threads would only cost start-up time).
pub(crate) fn run(cli: Cli) -> Result<(), CtlError> {
    let Cli { url, token, output, command } = cli;
    // An empty $LAMPLIGHTER_TOKEN means no token, not an empty one.
    let token = token.filter(|token| !token.trim().is_empty());
    let action = plan(command);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| CtlError::new(Failure::Local, format!("cannot start the I/O runtime: {error}")))?;
    runtime.block_on(execute(&url, token.as_deref(), output, action))
}

/// One request to the worker.
enum Action {
    Call { tool: String, arguments: Map<String, Value>, view: View },
    ListTools,
}

/// How an answer is shown in table mode, with what the command line knew.
enum View {
    Status,
    Jobs,
    Job,
    NextFires { job: String },
    Paused { job: String },
    Resumed { job: String },
    Triggered { job: String, idempotency_key: Option<String> },
    WaitedRun { job: String },
    Runs,
    Run { transcript: bool },
    Cancelled { id: String },
    Approvals,
    Decision { approved: bool, run: String, step: Option<String> },
    Workflows,
    Agents,
    Plugins,
    Reloaded,
    Raw,
}

/// Tool arguments, leaving out what the command line did not set.
#[derive(Default)]
struct Arguments(Map<String, Value>);

impl Arguments {
    fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.0.insert(key.to_owned(), value.into());
        self
    }

    fn maybe(self, key: &str, value: Option<impl Into<Value>>) -> Self {
        match value {
            Some(value) => self.with(key, value),
            None => self,
        }
    }
}

fn call(tool: &str, arguments: Arguments, view: View) -> Action {
    Action::Call { tool: tool.to_owned(), arguments: arguments.0, view }
}

fn plan(command: Command) -> Action {
    let none = Arguments::default;
    match command {
        Command::Status => call("worker_status", none(), View::Status),
        Command::Jobs { command } => match command {
            JobsCommand::List => call("list_jobs", none(), View::Jobs),
            JobsCommand::Show { name } => call("get_job", none().with("name", name), View::Job),
            JobsCommand::Next { name, count } => {
                call("get_job", none().with("name", name.clone()).with("next", count), View::NextFires { job: name })
            }
            JobsCommand::Pause { name, reason } => {
                call("pause_job", none().with("name", name.clone()).maybe("reason", reason), View::Paused { job: name })
            }
            JobsCommand::Resume { name } => call("resume_job", none().with("name", name.clone()), View::Resumed { job: name }),
            JobsCommand::Trigger(trigger) => {
                let parameters: Option<Map<String, Value>> = (!trigger.params.is_empty()).then(|| trigger.params.into_iter().collect());
                start("trigger_job", trigger.name.clone(), trigger.name, trigger.start, parameters)
            }
        },
        Command::Runs { command } => match command {
            RunsCommand::List { job, status, limit, cursor } => call(
                "list_runs",
                none().maybe("job", job).maybe("status", status).maybe("limit", limit).maybe("cursor", cursor),
                View::Runs,
            ),
            RunsCommand::Show { id, transcript } => call("get_run", none().with("id", id), View::Run { transcript }),
            RunsCommand::Cancel { id } => call("cancel_run", none().with("id", id.clone()), View::Cancelled { id }),
        },
        Command::Approvals { command } => match command {
            ApprovalsCommand::List => call("list_approvals", none(), View::Approvals),
            ApprovalsCommand::Approve(decision) => decide("approve_step", true, decision),
            ApprovalsCommand::Reject(decision) => decide("reject_step", false, decision),
        },
        Command::Workflows { command: WorkflowsCommand::List } => call("list_workflows", none(), View::Workflows),
        // Runs of a workflow started by hand are listed under the job `workflow:<name>`.
        Command::Workflows { command: WorkflowsCommand::Run(run) } => {
            start("run_workflow", run.name.clone(), format!("workflow:{}", run.name), run.start, None)
        }
        Command::Agents { command: ListCommand::List } => call("list_agents", none(), View::Agents),
        Command::Plugins { command: ListCommand::List } => call("list_plugins", none(), View::Plugins),
        Command::Config { command: ConfigCommand::Reload } => call("reload_config", none(), View::Reloaded),
        Command::Tools { command } => match command {
            ToolsCommand::List => Action::ListTools,
            ToolsCommand::Call { name, json } => Action::Call { tool: name, arguments: json.unwrap_or_default(), view: View::Raw },
        },
    }
}

/// `jobs trigger` and `workflows run`: `name` is the tool's argument, `job` what runs are listed under.
fn start(tool: &str, name: String, job: String, start: StartArgs, parameters: Option<Map<String, Value>>) -> Action {
    let arguments = Arguments::default()
        .with("name", name)
        .maybe("input", start.input)
        .maybe("parameters", parameters)
        .maybe("idempotency_key", start.idempotency_key.clone())
        .maybe("wait", start.wait.then_some(true))
        .maybe("timeout_seconds", start.timeout);
    let view = if start.wait { View::WaitedRun { job } } else { View::Triggered { job, idempotency_key: start.idempotency_key } };
    call(tool, arguments, view)
}

fn decide(tool: &str, approved: bool, decision: DecisionArgs) -> Action {
    let by = decision.by.unwrap_or_else(|| match std::env::var("USER") {
        Ok(user) if !user.is_empty() => format!("{user} via lampctl"),
        _ => "lampctl".to_owned(),
    });
    let arguments = Arguments::default()
        .with("run_id", decision.run.clone())
        .maybe("step", decision.step.clone())
        .maybe("comment", decision.comment)
        .with("decided_by", by);
    call(tool, arguments, View::Decision { approved, run: decision.run, step: decision.step })
}

async fn execute(url: &str, token: Option<&str>, output: Output, action: Action) -> Result<(), CtlError> {
    let progress = Arc::new(Progress::new(std::io::stderr().is_terminal()));
    let client = Client::connect(url, token, progress.clone()).await?;
    let outcome = match action {
        Action::ListTools => list_tools(&client, output).await,
        Action::Call { tool, arguments, view } => perform(&client, &progress, output, &tool, arguments, &view).await,
    };
    client.close().await;
    outcome
}

async fn list_tools(client: &Client, output: Output) -> Result<(), CtlError> {
    let tools = client.list_tools().await?;
    emit(&match output {
        Output::Json => render::json(&tools),
        Output::Table => render::tools(&tools),
    })
}

/// `list_jobs` pages; `jobs list` shows every job, so it follows the cursor to the end and
/// prints one `{"jobs": […]}`.
async fn all_jobs(client: &Client, arguments: Map<String, Value>) -> Result<Value, CtlError> {
    let mut jobs: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut page_args = arguments.clone();
        page_args.insert("limit".to_owned(), Value::from(1000));
        if let Some(c) = &cursor {
            page_args.insert("cursor".to_owned(), Value::from(c.as_str()));
        }
        let page = client.call("list_jobs", page_args).await?;
        match page.get("jobs").and_then(Value::as_array) {
            Some(list) => jobs.extend(list.iter().cloned()),
            // A bare list (an older worker): that is all of them.
            None => return Ok(page),
        }
        cursor = page.get("next_cursor").and_then(Value::as_str).map(str::to_owned);
        if cursor.is_none() {
            return Ok(serde_json::json!({ "jobs": jobs }));
        }
    }
}

async fn perform(
    client: &Client,
    progress: &Progress,
    output: Output,
    tool: &str,
    arguments: Map<String, Value>,
    view: &View,
) -> Result<(), CtlError> {
    let value = match view {
        View::WaitedRun { job } => wait_interruptibly(client, progress, tool, arguments, job).await?,
        View::Jobs => all_jobs(client, arguments).await?,
        _ => client.call(tool, arguments).await?,
    };
    emit(&match output {
        Output::Json => render::json(&value),
        Output::Table => show(view, &value, Utc::now()),
    })?;
    match view {
        View::Runs if output == Output::Table => {
            if let Some(cursor) = value.get("next_cursor").and_then(Value::as_str) {
                eprintln!("lampctl: more runs: repeat with --cursor {cursor}");
            }
            Ok(())
        }
        View::WaitedRun { .. } => waited_outcome(&value),
        _ => Ok(()),
    }
}

fn show(view: &View, value: &Value, now: DateTime<Utc>) -> String {
    match view {
        View::Status => render::status(value, now),
        View::Jobs => render::jobs(value, now),
        View::Job => render::job(value, now),
        View::NextFires { job } => render::next_fires(value, job, now),
        View::Paused { job } => render::paused(value, job),
        View::Resumed { job } => render::resumed(value, job, now),
        View::Triggered { job, idempotency_key } => render::triggered(value, job, idempotency_key.as_deref()),
        View::WaitedRun { .. } | View::Run { transcript: false } => render::run(value, now),
        View::Run { transcript: true } => format!("{}\n{}", render::run(value, now), render::transcript(value)),
        View::Runs => render::runs(value, now),
        View::Cancelled { id } => render::cancelled(value, id),
        View::Approvals => render::approvals(value, now),
        View::Decision { approved, run, step } => render::decision(value, *approved, run, step.as_deref()),
        View::Workflows => render::workflows(value, now),
        View::Agents => render::agents(value, now),
        View::Plugins => render::plugins(value, now),
        View::Reloaded => render::reloaded(value, now),
        View::Raw => render::raw(value),
    }
}

/// `jobs trigger --wait`: the call, unless Ctrl-C comes first. Then lampctl stops waiting
/// (dropping the call tells the worker to stop waiting too); the run itself goes on.
async fn wait_interruptibly(
    client: &Client,
    progress: &Progress,
    tool: &str,
    arguments: Map<String, Value>,
    job: &str,
) -> Result<Value, CtlError> {
    let interrupted = async {
        // Without a signal handler Ctrl-C keeps its default effect: the process ends.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        answer = client.call_unbounded(tool, arguments) => answer,
        () = interrupted => Err(CtlError::new(Failure::Interrupted, match progress.run_id() {
            Some(id) => format!("stopped waiting; run {id} goes on on the worker; follow it with: lampctl runs show {id}"),
            None => format!(
                "stopped waiting; the run goes on on the worker, but its id had not arrived yet; find it with: lampctl runs list --job {job}"
            ),
        })),
    }
}

/// After `--wait`: exit 1 when the run ended without succeeding, so that scripts can rely on
/// the exit code; a run still going (the wait timed out) is pointed at, not failed.
fn waited_outcome(value: &Value) -> Result<(), CtlError> {
    let run = render::run_of(value);
    let id = render::run_id(value).unwrap_or_else(|| render::NONE.to_owned());
    let Some(status) = run.get("status").and_then(Value::as_str) else { return Ok(()) };
    match status {
        "succeeded" => Ok(()),
        "waiting_approval" => {
            eprintln!("lampctl: run {id} waits for approval; see it with: lampctl approvals list, then lampctl approvals approve {id}");
            Ok(())
        }
        "queued" | "running" => {
            eprintln!("lampctl: stopped waiting while run {id} is {status}; follow it with: lampctl runs show {id}");
            Ok(())
        }
        ended => {
            let reason = run.get("error").and_then(Value::as_str).map(|error| format!(": {error}")).unwrap_or_default();
            Err(CtlError::new(Failure::WorkerSaidNo, format!("run {id} {ended}{reason}")))
        }
    }
}

/// Writes to stdout; a reader that went away (`lampctl runs list | head`) is not an error.
fn emit(text: &str) -> Result<(), CtlError> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == ErrorKind::BrokenPipe => Ok(()),
        Err(error) => Err(CtlError::new(Failure::Local, format!("cannot write to stdout: {error}"))),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use serde_json::json;

    use super::*;

    fn planned(argv: &[&str]) -> (String, Value) {
        let cli = Cli::try_parse_from(std::iter::once("lampctl").chain(argv.iter().copied())).unwrap();
        match plan(cli.command) {
            Action::Call { tool, arguments, .. } => (tool, Value::Object(arguments)),
            Action::ListTools => ("tools/list".to_owned(), Value::Null),
        }
    }

    #[test]
    fn commands_become_tool_calls_with_only_the_arguments_given() {
        let cases: Vec<(&[&str], &str, Value)> = vec![
            (&["status"], "worker_status", json!({})),
            (&["jobs", "list"], "list_jobs", json!({})),
            (&["jobs", "show", "nightly"], "get_job", json!({"name": "nightly"})),
            (&["jobs", "next", "nightly", "-n", "3"], "get_job", json!({"name": "nightly", "next": 3})),
            (&["jobs", "pause", "nightly", "--reason", "db move"], "pause_job", json!({"name": "nightly", "reason": "db move"})),
            (&["jobs", "resume", "nightly"], "resume_job", json!({"name": "nightly"})),
            (&["jobs", "trigger", "nightly"], "trigger_job", json!({"name": "nightly"})),
            (
                &[
                    "jobs",
                    "trigger",
                    "nightly",
                    "--input",
                    "{\"pr\":7}",
                    "--param",
                    "n=2",
                    "--param",
                    "who=me",
                    "--idempotency-key",
                    "k",
                    "--wait",
                    "--timeout",
                    "60",
                ],
                "trigger_job",
                json!({"name": "nightly", "input": {"pr": 7}, "parameters": {"n": 2, "who": "me"}, "idempotency_key": "k", "wait": true, "timeout_seconds": 60}),
            ),
            (
                &["runs", "list", "--job", "nightly", "--status", "failed", "--limit", "5"],
                "list_runs",
                json!({"job": "nightly", "status": "failed", "limit": 5}),
            ),
            (&["runs", "list", "--cursor", "c1"], "list_runs", json!({"cursor": "c1"})),
            (&["runs", "show", "r1"], "get_run", json!({"id": "r1"})),
            (&["runs", "cancel", "r1"], "cancel_run", json!({"id": "r1"})),
            (&["approvals", "list"], "list_approvals", json!({})),
            (
                &["approvals", "approve", "r1", "--step", "review", "--comment", "ok", "--by", "ana"],
                "approve_step",
                json!({"run_id": "r1", "step": "review", "comment": "ok", "decided_by": "ana"}),
            ),
            (&["approvals", "reject", "r1", "--by", "bo"], "reject_step", json!({"run_id": "r1", "decided_by": "bo"})),
            (&["workflows", "list"], "list_workflows", json!({})),
            (
                &["workflows", "run", "publish", "--input", "{\"url\":\"u\"}", "--idempotency-key", "k", "--wait", "--timeout", "9"],
                "run_workflow",
                json!({"name": "publish", "input": {"url": "u"}, "idempotency_key": "k", "wait": true, "timeout_seconds": 9}),
            ),
            (&["agents", "list"], "list_agents", json!({})),
            (&["plugins", "list"], "list_plugins", json!({})),
            (&["config", "reload"], "reload_config", json!({})),
            (&["tools", "call", "get_job", "--json", "{\"name\":\"x\"}"], "get_job", json!({"name": "x"})),
            (&["tools", "call", "list_jobs"], "list_jobs", json!({})),
            (&["tools", "list"], "tools/list", Value::Null),
        ];
        for (argv, tool, arguments) in cases {
            assert_eq!(planned(argv), (tool.to_owned(), arguments), "{argv:?}");
        }
    }

    #[test]
    fn a_waited_run_that_did_not_succeed_exits_1() {
        assert!(waited_outcome(&json!({"id": "r1", "status": "succeeded"})).is_ok());
        assert!(waited_outcome(&json!({"id": "r1", "status": "running"})).is_ok());
        let failed = waited_outcome(&json!({"run": {"id": "r1", "status": "failed", "error": "exit status 2"}})).unwrap_err();
        assert_eq!(failed.exit_code(), 1);
        assert_eq!(failed.to_string(), "run r1 failed: exit status 2");
        assert_eq!(waited_outcome(&json!({"id": "r2", "status": "timed_out"})).unwrap_err().to_string(), "run r2 timed_out");
    }
}
