//! What each command asks of the worker (one MCP tool call, or `tools/list`) and how the
//! answer is shown: a table or block for people, or the tool's structured content with
//! `-o json`. Data goes to stdout; hints and errors go to stderr.

use std::io::{ErrorKind, Write};
use std::time::Duration;

use chrono::{DateTime, Utc};
use lamplighter_contract::{JobDetail, JobList, JobOrigin, JobSummary, Run, RunDetail, RunStatus, TriggerOutcome};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::cli::{
    AgentsCommand, ApprovalsCommand, Cli, Command, ConfigCommand, DecisionArgs, JobsCommand, LimitsCommand, ListCommand, Output,
    RunsCommand, ScheduleCommand, StartArgs, ToolsCommand, WorkflowsCommand,
};
use crate::client::{Client, Connection};
use crate::error::{CtlError, Failure, RunEnd};
use crate::render;

/// Runs one command to completion on a single-threaded runtime (lampctl does one thing at a
/// time; starting worker threads would only cost start-up time).
pub(crate) fn run(cli: Cli) -> Result<(), CtlError> {
    let Cli { url, token, ca_cert, client_cert, client_key, context, output, command } = cli;
    // The contexts are lampctl's own: no worker is asked.
    match &command {
        Command::Config { command: ConfigCommand::UseContext { name } } => return emit(&crate::contexts::use_context(name)?),
        Command::Config { command: ConfigCommand::GetContexts } => return emit(&crate::contexts::get_contexts()?),
        Command::Config { command: ConfigCommand::SetContext { name, token_command } } => {
            let set = crate::contexts::Context {
                url,
                token: token.filter(|t| !t.trim().is_empty()),
                token_command: token_command.clone(),
                ca_cert,
                client_cert,
                client_key,
            };
            return emit(&crate::contexts::set_context(name, set)?);
        }
        _ => {}
    }
    let action = match plan(command)? {
        Action::Local(local) => return local.run(),
        action => action,
    };
    let given = Connection { url: url.unwrap_or_default(), token, ca_cert, client_cert, client_key };
    let conn = crate::contexts::resolve(given, context.as_deref())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| CtlError::new(Failure::Local, format!("cannot start the I/O runtime: {error}")))?;
    runtime.block_on(execute(&conn, output, action))
}

/// One request to the worker.
enum Action {
    Call {
        tool: String,
        arguments: Map<String, Value>,
        view: View,
    },
    ListTools,
    Follow {
        id: String,
    },
    /// `jobs edit` without a file: read the job, edit it in $EDITOR, save it.
    Edit {
        name: String,
        expected_version: Option<u64>,
        dry_run: bool,
    },
    /// `jobs export`: read every runtime job (or those named), print them as YAML.
    Export {
        names: Vec<String>,
    },
    /// Answered without the worker.
    Local(Local),
}

/// What lampctl knows by itself: its own completions and manual.
enum Local {
    Completions(clap_complete::Shell),
    Man(Option<std::path::PathBuf>),
}

impl Local {
    fn run(self) -> Result<(), CtlError> {
        let cmd = <Cli as clap::CommandFactory>::command();
        let failed = |error: std::io::Error| CtlError::new(Failure::Local, format!("cannot write: {error}"));
        // Into a buffer first: clap_complete panics on a failed write (a closed pipe).
        let mut text = Vec::new();
        match self {
            Local::Completions(shell) => clap_complete::generate(shell, &mut cmd.clone(), "lampctl", &mut text),
            Local::Man(None) => clap_mangen::Man::new(cmd).render(&mut text).map_err(failed)?,
            Local::Man(Some(dir)) => {
                return std::fs::create_dir_all(&dir).and_then(|()| clap_mangen::generate_to(cmd, &dir)).map_err(failed);
            }
        }
        emit(&String::from_utf8_lossy(&text))
    }
}

/// How an answer is shown in table mode, with what the command line knew.
enum View {
    Status,
    Jobs,
    Job,
    NextFires { job: String },
    SchedulePreview,
    Paused,
    Resumed,
    TagChanged,
    TagTriggered,
    Triggered { job: String, idempotency_key: Option<String> },
    WaitedRun { timeout: Option<u64> },
    Runs,
    Run { transcript: bool },
    Cancelled,
    Approvals,
    Limits,
    Decision,
    Workflows,
    Agents,
    Plugins,
    Reloaded,
    Saved,
    Deleted,
    Backfill,
    History,
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

/// A definition from a file (`-`: stdin): a JSON object as it is, anything else as YAML text
/// for the worker to parse (lampctl carries no YAML parser).
fn definition_from(file: &std::path::Path) -> Result<Value, CtlError> {
    let text = if file == std::path::Path::new("-") { std::io::read_to_string(std::io::stdin()) } else { std::fs::read_to_string(file) }
        .map_err(|error| CtlError::new(Failure::Usage, format!("cannot read {}: {error}", file.display())))?;
    Ok(match serde_json::from_str::<Value>(&text) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::String(text),
    })
}

fn plan(command: Command) -> Result<Action, CtlError> {
    let none = Arguments::default;
    Ok(match command {
        Command::Status => call("worker_status", none(), View::Status),
        Command::Jobs { command } => match command {
            JobsCommand::List { tag } => call("list_jobs", none().maybe("tag", tag), View::Jobs),
            JobsCommand::Show { name } => call("get_job", none().with("name", name), View::Job),
            JobsCommand::Next { name, count } => {
                call("get_job", none().with("name", name.clone()).with("next", count), View::NextFires { job: name })
            }
            JobsCommand::Pause { name, tag, reason } => {
                let view = if tag.is_some() { View::TagChanged } else { View::Paused };
                call("pause_job", none().maybe("name", name).maybe("tag", tag).maybe("reason", reason), view)
            }
            JobsCommand::Resume { name, tag } => {
                let view = if tag.is_some() { View::TagChanged } else { View::Resumed };
                call("resume_job", none().maybe("name", name).maybe("tag", tag), view)
            }
            JobsCommand::Trigger(trigger) => {
                let parameters: Option<Map<String, Value>> = (!trigger.params.is_empty()).then(|| trigger.params.into_iter().collect());
                match (trigger.name, trigger.tag) {
                    (Some(name), _) => start(
                        "trigger_job",
                        Arguments::default().with("name", name.clone()).maybe("parameters", parameters),
                        name,
                        trigger.start,
                    ),
                    (None, tag) => call(
                        "trigger_job",
                        Arguments::default().maybe("tag", tag).maybe("parameters", parameters).maybe("input", trigger.start.input),
                        View::TagTriggered,
                    ),
                }
            }
            JobsCommand::Create { name, file, dry_run } => call(
                "create_job",
                none().with("name", name).with("definition", definition_from(&file)?).with("dry_run", dry_run),
                View::Saved,
            ),
            JobsCommand::Edit { name, file: Some(file), expected_version, dry_run } => call(
                "update_job",
                none()
                    .with("name", name)
                    .with("definition", definition_from(&file)?)
                    .maybe("expected_version", expected_version)
                    .with("dry_run", dry_run),
                View::Saved,
            ),
            JobsCommand::Edit { name, file: None, expected_version, dry_run } => Action::Edit { name, expected_version, dry_run },
            JobsCommand::Delete { name, expected_version, cancel_runs } => call(
                "delete_job",
                none().with("name", name).maybe("expected_version", expected_version).with("cancel_runs", cancel_runs),
                View::Deleted,
            ),
            JobsCommand::Backfill { name, from, to, dry_run } => {
                call("backfill_job", none().with("name", name).with("from", from).with("to", to).with("dry_run", dry_run), View::Backfill)
            }
            JobsCommand::Export { names } => Action::Export { names },
            JobsCommand::History { name, count } => call("get_job", none().with("name", name).with("history", count), View::History),
        },
        Command::Schedule { command: ScheduleCommand::Preview { cron, every, at, timezone, calendar, shift, from, count } } => call(
            "preview_schedule",
            none()
                .maybe("cron", cron)
                .maybe("every", every)
                .maybe("at", at)
                .maybe("timezone", timezone)
                .maybe("calendar", calendar)
                .maybe("shift", shift)
                .maybe("from", from)
                .with("count", count),
            View::SchedulePreview,
        ),
        Command::Runs { command } => match command {
            RunsCommand::List { job, status, limit, cursor } => call(
                "list_runs",
                none().maybe("job", job).maybe("status", status).maybe("limit", limit).maybe("cursor", cursor),
                View::Runs,
            ),
            RunsCommand::Show { id, transcript } => call("get_run", none().with("id", id), View::Run { transcript }),
            RunsCommand::Follow { id } => Action::Follow { id },
            RunsCommand::Cancel { id } => call("cancel_run", none().with("id", id), View::Cancelled),
        },
        Command::Limits { command: LimitsCommand::List } => call("list_limits", none(), View::Limits),
        Command::Approvals { command } => match command {
            ApprovalsCommand::List => call("list_approvals", none(), View::Approvals),
            ApprovalsCommand::Approve(decision) => decide("approve_step", decision),
            ApprovalsCommand::Reject(decision) => decide("reject_step", decision),
        },
        Command::Workflows { command: WorkflowsCommand::List } => call("list_workflows", none(), View::Workflows),
        // Runs of a workflow started by hand are listed under the job `workflow:<name>`.
        Command::Workflows { command: WorkflowsCommand::Run(run) } => {
            start("run_workflow", Arguments::default().with("name", run.name.clone()), format!("workflow:{}", run.name), run.start)
        }
        Command::Agents { command: AgentsCommand::List } => call("list_agents", none(), View::Agents),
        // Runs of agents, pipelines and group chats started by hand are listed under
        // `agent:<name>`, `pipeline:<name>` and `group-chat:<a>,<b>,…`.
        Command::Agents { command: AgentsCommand::Run(run) } => {
            start("run_agent", Arguments::default().with("name", run.name.clone()), format!("agent:{}", run.name), run.start)
        }
        Command::Agents { command: AgentsCommand::Pipeline(run) } => {
            start("run_pipeline", Arguments::default().with("name", run.name.clone()), format!("pipeline:{}", run.name), run.start)
        }
        Command::Agents { command: AgentsCommand::Chat(chat) } => {
            let job = format!("group-chat:{}", chat.agents.join(","));
            let arguments = Arguments::default().with("agents", chat.agents).maybe("max_iterations", chat.max_iterations);
            start("run_group_chat", arguments, job, chat.start)
        }
        Command::Plugins { command: ListCommand::List } => call("list_plugins", none(), View::Plugins),
        Command::Config { command: ConfigCommand::Reload } => call("reload_config", none(), View::Reloaded),
        Command::Config { command: ConfigCommand::UseContext { .. } | ConfigCommand::GetContexts | ConfigCommand::SetContext { .. } } => {
            unreachable!("answered in `run` without a worker")
        }
        Command::Tools { command } => match command {
            ToolsCommand::List => Action::ListTools,
            ToolsCommand::Call { name, json } => Action::Call { tool: name, arguments: json.unwrap_or_default(), view: View::Raw },
        },
        Command::Completions { shell } => Action::Local(Local::Completions(shell)),
        Command::Man { dir } => Action::Local(Local::Man(dir)),
    })
}

/// `jobs trigger`, `workflows run` and `agents run|pipeline|chat`: `arguments` say what to
/// start (`name`, …), `job` what its runs are listed under.
fn start(tool: &str, arguments: Arguments, job: String, start: StartArgs) -> Action {
    let arguments = arguments.maybe("input", start.input).maybe("idempotency_key", start.idempotency_key.clone());
    // `--wait` starts the run, then follows it (see `start_and_follow`), rather than asking the
    // tool to wait: lampctl then shows each step as the worker notifies it.
    let view = if start.wait {
        View::WaitedRun { timeout: start.timeout }
    } else {
        View::Triggered { job, idempotency_key: start.idempotency_key }
    };
    call(tool, arguments, view)
}

fn decide(tool: &str, decision: DecisionArgs) -> Action {
    let by = decision.by.unwrap_or_else(|| match std::env::var("USER") {
        Ok(user) if !user.is_empty() => format!("{user} via lampctl"),
        _ => "lampctl".to_owned(),
    });
    let arguments = Arguments::default()
        .with("run_id", decision.run)
        .maybe("step", decision.step)
        .maybe("comment", decision.comment)
        .with("decided_by", by);
    call(tool, arguments, View::Decision)
}

async fn execute(conn: &Connection, output: Output, action: Action) -> Result<(), CtlError> {
    let client = Client::connect(conn).await?;
    let outcome = match action {
        Action::ListTools => list_tools(&client, output).await,
        Action::Follow { id } => follow_interruptibly(&client, output, &id).await,
        Action::Edit { name, expected_version, dry_run } => edit(&client, output, &name, expected_version, dry_run).await,
        Action::Export { names } => export(&client, names).await,
        Action::Call { tool, mut arguments, view } => match with_version(&client, &tool, &mut arguments).await {
            Ok(()) => perform(&client, output, &tool, arguments, &view).await,
            Err(e) => Err(e),
        },
        Action::Local(local) => local.run(),
    };
    client.close().await;
    outcome
}

async fn list_tools(client: &Client, output: Output) -> Result<(), CtlError> {
    let tools = client.list_tools().await?;
    emit(&match output {
        Output::Json => render::json(&serde_json::json!({ "tools": tools })),
        Output::Table => render::tools(&tools),
    })
}

/// Every job, following `list_jobs`'s cursor to the end, each page read straight into `T` (the
/// contract's type for a table, a JSON value for `-o json`).
async fn job_pages<T: serde::de::DeserializeOwned>(client: &Client, arguments: Map<String, Value>) -> Result<Vec<T>, CtlError> {
    #[derive(Deserialize)]
    struct Page<T> {
        jobs: Vec<T>,
        next_cursor: Option<String>,
    }
    let mut jobs = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut page_args = arguments.clone();
        page_args.insert("limit".to_owned(), Value::from(1000));
        if let Some(c) = &cursor {
            page_args.insert("cursor".to_owned(), Value::from(c.as_str()));
        }
        let raw = client.read_listing("list_jobs", page_args).await?;
        let page: Page<T> = serde_json::from_str(raw.get()).map_err(|error| unreadable("list_jobs", error))?;
        jobs.extend(page.jobs);
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(jobs);
        }
    }
}

/// `list_jobs` pages; `jobs list` shows every job, so it follows the cursor to the end and
/// prints one table, or one `{"jobs": […]}` with each job as sent (fields this lampctl does
/// not know included). Each page is read straight into what is shown: the contract's types
/// for the table, JSON values for `-o json`.
async fn list_all_jobs(client: &Client, output: Output, arguments: Map<String, Value>) -> Result<(), CtlError> {
    emit(&match output {
        Output::Json => render::json(&serde_json::json!({ "jobs": job_pages::<Value>(client, arguments).await? })),
        Output::Table => render::jobs(&job_pages::<JobSummary>(client, arguments).await?, Utc::now()),
    })
}

async fn perform(client: &Client, output: Output, tool: &str, arguments: Map<String, Value>, view: &View) -> Result<(), CtlError> {
    let value = match view {
        View::WaitedRun { timeout } => start_and_follow(client, output, tool, arguments, *timeout).await?,
        View::Jobs => return list_all_jobs(client, output, arguments).await,
        _ => client.call(tool, arguments).await?,
    };
    emit(&match output {
        Output::Json => render::json(&value),
        Output::Table => show(view, tool, &value, Utc::now())?,
    })?;
    match view {
        View::WaitedRun { .. } => waited_outcome(&answer(tool, &value)?),
        View::Runs if output == Output::Table => {
            if let Some(cursor) = value.get("next_cursor").and_then(Value::as_str) {
                eprintln!("lampctl: more runs: repeat with --cursor {cursor}");
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn show(view: &View, tool: &str, value: &Value, now: DateTime<Utc>) -> Result<String, CtlError> {
    Ok(match view {
        View::Status => render::status(&answer(tool, value)?, now),
        View::Jobs => render::jobs(&answer::<JobList>(tool, value)?.jobs, now),
        View::Job => render::job(&answer(tool, value)?, now),
        View::NextFires { job } => render::next_fires(&answer(tool, value)?, job, now),
        View::SchedulePreview => render::schedule_preview(&answer(tool, value)?, now),
        View::Paused => render::paused(&answer(tool, value)?),
        View::Resumed => render::resumed(&answer(tool, value)?, now),
        View::TagChanged => render::tag_changed(&answer(tool, value)?, tool == "pause_job", now),
        View::TagTriggered => render::tag_triggered(&answer(tool, value)?),
        View::Triggered { job, idempotency_key } => render::triggered(&answer(tool, value)?, job, idempotency_key.as_deref()),
        View::WaitedRun { .. } => match answer::<TriggerOutcome>(tool, value)?.run {
            Some(run) => render::run(&render::bare(run), now),
            None => return Err(unreadable(tool, "no `run` although it waited")),
        },
        View::Run { transcript } => {
            let detail: RunDetail = answer(tool, value)?;
            let text = render::run(&detail, now);
            if *transcript { format!("{text}\n{}", render::transcript(&detail)) } else { text }
        }
        View::Runs => render::runs(&answer(tool, value)?, now),
        View::Cancelled => render::cancelled(&answer(tool, value)?),
        View::Approvals => render::approvals(&answer(tool, value)?, now),
        View::Limits => render::limits(&answer(tool, value)?, now),
        View::Decision => render::decision(&answer(tool, value)?),
        View::Workflows => render::workflows(&answer(tool, value)?),
        View::Agents => render::agents(&answer(tool, value)?),
        View::Plugins => render::plugins(&answer(tool, value)?),
        View::Reloaded => render::reloaded(&answer(tool, value)?),
        View::Saved => render::saved(&answer(tool, value)?, now),
        View::Deleted => render::deleted(&answer(tool, value)?),
        View::Backfill => render::backfill(&answer(tool, value)?, now),
        View::History => render::history(&answer(tool, value)?, now),
        View::Raw => render::raw(value),
    })
}

/// `update_job` and `delete_job` take the version the change was made from. Given none, lampctl
/// reads it first: the change is then refused if another lands between the read and the change.
async fn with_version(client: &Client, tool: &str, arguments: &mut Map<String, Value>) -> Result<(), CtlError> {
    if !matches!(tool, "update_job" | "delete_job") || arguments.contains_key("expected_version") {
        return Ok(());
    }
    let mut get = Map::new();
    get.insert("name".into(), arguments.get("name").cloned().unwrap_or_default());
    let detail: JobDetail = answer("get_job", &client.call("get_job", get).await?)?;
    // A job of the files has no version: the worker refuses the change, saying where it is.
    let version = match detail.summary.origin {
        JobOrigin::Runtime { version, .. } => version,
        _ => 0,
    };
    arguments.insert("expected_version".into(), Value::from(version));
    Ok(())
}

/// `jobs edit NAME` without a file: the job's definition, as the files write it, in $EDITOR
/// (or $VISUAL, else `vi`); saved if it changed, against the version opened.
#[allow(clippy::disallowed_methods, reason = "the user's editor, in the foreground; the rule is about the worker's processes")]
async fn edit(client: &Client, output: Output, name: &str, expected: Option<u64>, dry_run: bool) -> Result<(), CtlError> {
    let mut arguments = Map::new();
    arguments.insert("name".into(), Value::from(name));
    let detail: JobDetail = answer("get_job", &client.call("get_job", arguments).await?)?;
    let (Some(definition), JobOrigin::Runtime { version, .. }) = (&detail.definition, &detail.summary.origin) else {
        return Err(CtlError::new(
            Failure::Usage,
            format!("job \"{name}\" is defined in the config files; edit it there and reload (lampctl config reload)"),
        ));
    };
    let text = render::export(&[(String::new(), definition.clone())]);
    // Only the definition's own lines, unindented: what `jobs create -f` takes.
    let body: String = text.lines().skip(4).map(|l| l.strip_prefix("      ").unwrap_or(l)).collect::<Vec<_>>().join("\n") + "\n";
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let path = std::env::temp_dir().join(format!("lampctl-{}-{nanos}.yaml", std::process::id()));
    let local = |error: std::io::Error| CtlError::new(Failure::Local, format!("cannot edit {}: {error}", path.display()));
    // A new file only this user can read: never one planted there, nor a link to another.
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&path).map_err(local)?;
    file.write_all(body.as_bytes()).map_err(local)?;
    drop(file);
    let editor = std::env::var("VISUAL").or_else(|_| std::env::var("EDITOR")).unwrap_or_else(|_| "vi".to_owned());
    let status = std::process::Command::new("sh").arg("-c").arg(format!("{editor} \"$1\"")).arg("sh").arg(&path).status().map_err(local)?;
    let edited = std::fs::read_to_string(&path).map_err(local);
    let _ = std::fs::remove_file(&path);
    let edited = edited?;
    if !status.success() {
        return Err(CtlError::new(Failure::Usage, format!("the editor ({editor}) failed; nothing was saved")));
    }
    if edited == body {
        eprintln!("lampctl: no change; nothing was saved");
        return Ok(());
    }
    let mut arguments = Map::new();
    arguments.insert("name".into(), Value::from(name));
    arguments.insert("definition".into(), Value::String(edited));
    arguments.insert("expected_version".into(), Value::from(expected.unwrap_or(*version)));
    arguments.insert("dry_run".into(), Value::from(dry_run));
    perform(client, output, "update_job", arguments, &View::Saved).await
}

/// `jobs export`: every runtime job (or those named) as YAML under `scheduling.jobs`.
async fn export(client: &Client, names: Vec<String>) -> Result<(), CtlError> {
    let names = if names.is_empty() {
        let all: Vec<JobSummary> = job_pages(client, Map::new()).await?;
        all.into_iter().filter(|j| matches!(j.origin, JobOrigin::Runtime { .. })).map(|j| j.name).collect()
    } else {
        names
    };
    let mut jobs = Vec::with_capacity(names.len());
    for name in names {
        let mut arguments = Map::new();
        arguments.insert("name".into(), Value::from(name.as_str()));
        let detail: JobDetail = answer("get_job", &client.call("get_job", arguments).await?)?;
        match detail.definition {
            Some(d) => jobs.push((name, d)),
            None => {
                return Err(CtlError::new(
                    Failure::Usage,
                    format!("job \"{name}\" is defined in the config files already; nothing to export"),
                ));
            }
        }
    }
    emit(&render::export(&jobs))
}

/// A tool's answer as the contract type lampctl shows.
fn answer<'a, T: Deserialize<'a>>(tool: &str, value: &'a Value) -> Result<T, CtlError> {
    T::deserialize(value).map_err(|error| unreadable(tool, error))
}

/// An answer that does not fit the contract came from a worker of another version (or not a
/// Lamplighter worker): said so, with the way to see it.
fn unreadable(tool: &str, why: impl std::fmt::Display) -> CtlError {
    CtlError::new(
        Failure::Unreachable,
        format!(
            "the worker's answer to {tool} is not what this lampctl reads ({why}); it may be another version of Lamplighter: \
             compare `lampctl status` with `lampctl --version`, or see the answer with -o json"
        ),
    )
}

/// `jobs trigger --wait` and `workflows run --wait`: starts the run, then follows it until it
/// ends, the timeout passes (the run goes on) or Ctrl-C; in table mode each change goes to
/// stderr as `runs follow` shows it. Answers as the tool's own `wait` would.
async fn start_and_follow(
    client: &Client,
    output: Output,
    tool: &str,
    arguments: Map<String, Value>,
    timeout: Option<u64>,
) -> Result<Value, CtlError> {
    let started: TriggerOutcome = answer(tool, &client.call(tool, arguments).await?)?;
    let id = started.run_id.as_str();
    // Through its retries: an attempt that failed with a retry scheduled is not the outcome;
    // the attempt after it is followed, each attempt's end printed as it comes.
    let followed = async {
        let mut attempt_id = id.to_string();
        loop {
            let detail = follow_run(client, &attempt_id, Until::EndsOrWaits, |before, detail, _| {
                if output == Output::Table {
                    eprint!("{}", render::progress(before, detail, Utc::now()));
                }
                Ok(())
            })
            .await?;
            match detail.run.next_run_id.clone().filter(|n| !n.is_empty() && detail.run.status.is_final()) {
                Some(next) => {
                    if output == Output::Table {
                        eprintln!("{}", render::retrying(&detail.run, &next));
                    }
                    attempt_id = next;
                }
                None => return Ok::<RunDetail, CtlError>(detail),
            }
        }
    };
    let limit = async {
        match timeout {
            Some(seconds) => tokio::time::sleep(Duration::from_secs(seconds)).await,
            None => std::future::pending().await,
        }
    };
    let (run, note) = tokio::select! {
        detail = followed => (detail?.run, None),
        () = limit => {
            let run = answer::<RunDetail>("get_run", &client.call("get_run", Arguments::default().with("id", id).0).await?)?.run;
            let note = format!("stopped waiting after {} s; the run is still {}", timeout.unwrap_or_default(), run.status);
            (run, Some(note))
        }
        () = interrupted() => return Err(CtlError::new(
            Failure::Interrupted,
            format!("stopped waiting; run {id} goes on on the worker; follow it with: lampctl runs follow {id}"),
        )),
    };
    let outcome =
        TriggerOutcome { run_id: started.run_id.clone(), created: started.created, finished: run.status.is_final(), run: Some(run), note };
    serde_json::to_value(outcome).map_err(|error| CtlError::new(Failure::Local, format!("cannot show the run: {error}")))
}

/// After `--wait`: the run's end as the exit code ([`ended`]), so that scripts can rely on
/// it; a run still going (the wait timed out) is pointed at, not failed.
fn waited_outcome(outcome: &TriggerOutcome) -> Result<(), CtlError> {
    let id = &outcome.run_id;
    let Some(run) = &outcome.run else { return Ok(()) };
    match run.status {
        status @ (RunStatus::Queued | RunStatus::Running) => {
            eprintln!("lampctl: stopped waiting while run {id} is {status}; follow it with: lampctl runs follow {id}");
            Ok(())
        }
        _ => ended(run),
    }
}

/// A followed run's end as an exit code (README "Exit codes"): 0 when it succeeded; else its
/// own code, with its error or what to do next.
fn ended(run: &Run) -> Result<(), CtlError> {
    let id = &run.id;
    let reason = run.error.as_ref().map(|error| format!(": {error}")).unwrap_or_default();
    let (end, message) = match run.status {
        RunStatus::Succeeded => return Ok(()),
        RunStatus::WaitingApproval => (
            RunEnd::WaitingApproval,
            format!("run {id} waits for approval; see it with: lampctl approvals list, then lampctl approvals approve {id}"),
        ),
        RunStatus::Failed => (RunEnd::Failed, format!("run {id} failed{reason}")),
        RunStatus::TimedOut => (RunEnd::TimedOut, format!("run {id} timed out{reason}")),
        RunStatus::Cancelled => (RunEnd::Cancelled, format!("run {id} was cancelled{reason}")),
        status => {
            let next = run.next_run_id.as_deref().filter(|n| !n.is_empty()).map(|n| format!("; its retry is run {n}")).unwrap_or_default();
            (RunEnd::Other, format!("run {id} {status}{reason}{next}"))
        }
    };
    Err(CtlError::new(Failure::Run(end), message))
}

/// `runs follow`, unless Ctrl-C comes first (the run goes on).
async fn follow_interruptibly(client: &Client, output: Output, id: &str) -> Result<(), CtlError> {
    tokio::select! {
        followed = follow(client, output, id) => followed,
        () = interrupted() => Err(CtlError::new(Failure::Interrupted, format!("stopped following; run {id} goes on on the worker"))),
    }
}

/// `runs follow`: the run, then what changes, on stdout; `-o json` prints the run, one JSON
/// line per change.
async fn follow(client: &Client, output: Output, id: &str) -> Result<(), CtlError> {
    let detail = follow_run(client, id, Until::Ends, |before, detail, value| {
        emit(&match output {
            Output::Json => format!("{}\n", serde_json::to_string(value).unwrap_or_default()),
            Output::Table => render::progress(before, detail, Utc::now()),
        })
    })
    .await?;
    ended(&detail.run)
}

/// How long a follow lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// Until the run ends: `runs follow`, which a person watches through an approval.
    Ends,
    /// Until it ends or waits for a decision: `--wait`, so that a script is not held until a
    /// person acts.
    EndsOrWaits,
}

/// Subscribes to the run's resource, then reads the run, and again at each change the worker
/// notifies, handing each reading (with the one before) to `show`, `until` it ends (or waits).
async fn follow_run(
    client: &Client,
    id: &str,
    until: Until,
    mut show: impl FnMut(Option<&RunDetail>, &RunDetail, &Value) -> Result<(), CtlError>,
) -> Result<RunDetail, CtlError> {
    // Subscribed before the first read: nothing that happens in between is missed.
    let mut updates = client.updates(&format!("lamplighter://runs/{id}")).await?;
    let mut shown: Option<RunDetail> = None;
    // A failed attempt's retry is recorded just after its end: until then (`next_run_id`
    // unset) the failure may not be the outcome. A live worker decides within milliseconds;
    // one that stopped in between never does, so the wait for it is bounded.
    let mut undecided_since: Option<std::time::Instant> = None;
    let mut last: Option<Value> = None;
    loop {
        let value = client.call("get_run", Arguments::default().with("id", id).0).await?;
        let detail: RunDetail = answer("get_run", &value)?;
        // A reading like the last one (looked at again while a retry is undecided) is not shown twice.
        if last.as_ref() != Some(&value) {
            show(shown.as_ref(), &detail, &value)?;
        }
        last = Some(value);
        let undecided = matches!(detail.run.status, RunStatus::Failed | RunStatus::TimedOut) && detail.run.next_run_id.is_none();
        if !undecided {
            undecided_since = None;
        }
        let settled = !undecided || undecided_since.get_or_insert_with(std::time::Instant::now).elapsed() >= RETRY_DECIDED_WITHIN;
        if (detail.run.status.is_final() && settled) || (until == Until::EndsOrWaits && detail.run.status == RunStatus::WaitingApproval) {
            return Ok(detail);
        }
        shown = Some(detail);
        if undecided {
            // The link's write may come without an update of its own: looked at again soon.
            if let Ok(next) = tokio::time::timeout(Duration::from_millis(200), updates.next()).await {
                next?;
            }
        } else {
            updates.next().await?;
        }
    }
}

/// How long a failed attempt is watched for its retry to be recorded before its failure is
/// taken as the outcome (the worker stopped between the end and the retry).
const RETRY_DECIDED_WITHIN: Duration = Duration::from_secs(10);

/// Resolves at Ctrl-C; never, if no handler can be installed (Ctrl-C then ends the process).
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
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
        match plan(cli.command).unwrap_or_else(|e| panic!("{argv:?}: {e}")) {
            Action::Call { tool, arguments, .. } => (tool, Value::Object(arguments)),
            Action::ListTools => ("tools/list".to_owned(), Value::Null),
            Action::Follow { id } => ("subscriptions/listen".to_owned(), Value::from(id)),
            Action::Edit { name, .. } => ("edit".to_owned(), Value::from(name)),
            Action::Export { names } => ("export".to_owned(), Value::from(names)),
            Action::Local(_) => ("local".to_owned(), Value::Null),
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
                json!({"name": "nightly", "input": {"pr": 7}, "parameters": {"n": 2, "who": "me"}, "idempotency_key": "k"}),
            ),
            (
                &["runs", "list", "--job", "nightly", "--status", "failed", "--limit", "5"],
                "list_runs",
                json!({"job": "nightly", "status": "failed", "limit": 5}),
            ),
            (&["runs", "list", "--cursor", "c1"], "list_runs", json!({"cursor": "c1"})),
            (&["runs", "show", "r1"], "get_run", json!({"id": "r1"})),
            (&["runs", "cancel", "r1"], "cancel_run", json!({"id": "r1"})),
            (&["runs", "follow", "r1"], "subscriptions/listen", json!("r1")),
            (&["approvals", "list"], "list_approvals", json!({})),
            (&["limits", "list"], "list_limits", json!({})),
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
                json!({"name": "publish", "input": {"url": "u"}, "idempotency_key": "k"}),
            ),
            (&["agents", "list"], "list_agents", json!({})),
            (&["agents", "run", "scout", "--input", "find news", "--wait"], "run_agent", json!({"name": "scout", "input": "find news"})),
            (&["agents", "pipeline", "review", "--input", "draft"], "run_pipeline", json!({"name": "review", "input": "draft"})),
            (
                &["agents", "chat", "writer,checker,editor", "--input", "AI agents", "--max-iterations", "2", "--idempotency-key", "k"],
                "run_group_chat",
                json!({"agents": ["writer", "checker", "editor"], "input": "AI agents", "max_iterations": 2, "idempotency_key": "k"}),
            ),
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

    /// What `trigger_job … wait` answers, through the contract type.
    fn waited(status: &str, error: Option<&str>) -> TriggerOutcome {
        let at = "2026-05-04T12:00:00Z";
        let run = json!({"id": "r1", "job": "j", "trigger": "manual", "status": status, "due_at": at, "enqueued_at": at, "attempt": 1, "root_id": "r1", "error": error});
        serde_json::from_value(json!({"run_id": "r1", "created": true, "finished": true, "run": run})).unwrap()
    }

    #[test]
    fn a_waited_run_exits_with_how_it_ended() {
        assert!(waited_outcome(&waited("succeeded", None)).is_ok());
        assert!(waited_outcome(&waited("running", None)).is_ok(), "still going: pointed at, not failed");
        let failed = waited_outcome(&waited("failed", Some("exit status 2"))).unwrap_err();
        assert_eq!((failed.exit_code(), failed.to_string().as_str()), (4, "run r1 failed: exit status 2"));
        let ended = |status| waited_outcome(&waited(status, None)).unwrap_err();
        assert_eq!((ended("timed_out").exit_code(), ended("timed_out").to_string().as_str()), (5, "run r1 timed out"));
        assert_eq!(ended("cancelled").exit_code(), 6);
        let waiting = ended("waiting_approval");
        assert_eq!(waiting.exit_code(), 7);
        assert!(waiting.to_string().contains("lampctl approvals approve r1"), "{waiting}");
        assert_eq!(ended("interrupted").exit_code(), 8);
    }

    #[test]
    fn an_answer_of_another_shape_is_named_not_shown_as_dashes() {
        let error = answer::<lamplighter_contract::JobDetail>("get_job", &json!({"name": "x"})).unwrap_err();
        assert_eq!(error.exit_code(), 3);
        assert!(error.to_string().starts_with("the worker's answer to get_job is not what this lampctl reads (missing field"), "{error}");
    }
}
