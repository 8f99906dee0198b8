//! The command line (SPEC §12): every command and flag, and the parsers for `--param`,
//! `--input` and `--json`. A bad value is a usage error (exit 2) reported by clap before
//! anything is sent to the worker.

use clap::{Args, Parser, Subcommand, ValueEnum};
use lamplighter_contract::RunStatus;
use serde_json::{Map, Value};

/// Where a worker serves MCP unless told otherwise.
pub(crate) const DEFAULT_URL: &str = "http://127.0.0.1:5100/mcp";

/// The run statuses a worker knows; `runs list --status` accepts exactly these.
/// `--status` takes the contract's run statuses, not a copy of them.
const RUN_STATUSES: [&str; RunStatus::ALL.len()] = {
    let mut names = [""; RunStatus::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = RunStatus::ALL[i].as_str();
        i += 1;
    }
    names
};

#[derive(Debug, Parser)]
#[command(name = "lampctl", version = lamplighter_contract::VERSION, about = "Control a lamplighter worker over MCP", propagate_version = true)]
pub(crate) struct Cli {
    /// The worker's MCP endpoint [default: the context's, else http://127.0.0.1:5100/mcp]
    #[arg(long, global = true, env = "LAMPLIGHTER_URL", value_name = "URL")]
    pub(crate) url: Option<String>,

    /// Bearer token for the worker (without the "Bearer " prefix)
    #[arg(long, global = true, env = "LAMPLIGHTER_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub(crate) token: Option<String>,

    /// The CA certificate (PEM) the worker's certificate must chain to, for a private CA
    #[arg(long, global = true, env = "LAMPLIGHTER_CA_CERT", value_name = "FILE")]
    pub(crate) ca_cert: Option<std::path::PathBuf>,

    /// A client certificate (PEM), for a worker that asks for one (mutual TLS)
    #[arg(long, global = true, env = "LAMPLIGHTER_CLIENT_CERT", value_name = "FILE", requires = "client_key")]
    pub(crate) client_cert: Option<std::path::PathBuf>,

    /// The client certificate's private key (PEM)
    #[arg(long, global = true, env = "LAMPLIGHTER_CLIENT_KEY", value_name = "FILE", requires = "client_cert")]
    pub(crate) client_key: Option<std::path::PathBuf>,

    /// A context from lampctl's config file (default: its current context); flags and
    /// environment variables win over what it says
    #[arg(long, global = true, env = "LAMPLIGHTER_CONTEXT", value_name = "NAME")]
    pub(crate) context: Option<String>,

    /// Output: tables for people, or the tool's structured content as JSON for scripts
    #[arg(short = 'o', long = "output", global = true, value_enum, default_value_t = Output::Table)]
    pub(crate) output: Output,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Show the worker: version, uptime, jobs, queue depth, storage
    Status,
    /// List, inspect, pause, resume and trigger jobs
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
    },
    /// Check a schedule before a job uses it: next fire times, daylight-saving changes, warnings
    Schedule {
        #[command(subcommand)]
        command: ScheduleCommand,
    },
    /// List, inspect and cancel runs
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// Workflow steps that wait for a person
    Approvals {
        #[command(subcommand)]
        command: ApprovalsCommand,
    },
    /// The limits jobs share (scheduling.limits): who holds their slots, who waits
    Limits {
        #[command(subcommand)]
        command: LimitsCommand,
    },
    /// The configured workflows; run one by hand
    Workflows {
        #[command(subcommand)]
        command: WorkflowsCommand,
    },
    /// The configured agents; run one, a pipeline or a group chat by hand
    Agents {
        #[command(subcommand)]
        command: AgentsCommand,
    },
    /// The loaded plugins and their actions
    Plugins {
        #[command(subcommand)]
        command: ListCommand,
    },
    /// The worker's configuration
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Any MCP tool of the worker, by name
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
    },
    /// Print a shell completion script, e.g. `lampctl completions bash > /usr/share/bash-completion/completions/lampctl`
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), or with --dir write one page per command there
    Man {
        /// Write `lampctl.1`, `lampctl-jobs.1`, … into this directory
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ListCommand {
    /// List them
    List,
}

#[derive(Debug, Subcommand)]
pub(crate) enum JobsCommand {
    /// List jobs with their schedule, state, next fire time and last run
    List {
        /// Only the jobs with this tag
        #[arg(long, value_name = "TAG")]
        tag: Option<String>,
    },
    /// Show one job: schedule, state, next fire times, run counts, recent runs
    Show {
        /// The job's name
        name: String,
    },
    /// Show a job's next fire times
    Next {
        /// The job's name
        name: String,
        /// How many fire times to show
        #[arg(short = 'n', long = "count", value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
        count: u32,
    },
    /// Stop a job (or every job of a tag) from firing on its schedule (kept across restarts)
    Pause {
        /// The job's name
        #[arg(required_unless_present = "tag", conflicts_with = "tag")]
        name: Option<String>,
        /// Every job with this tag instead, in one transaction with one reason
        #[arg(long, value_name = "TAG")]
        tag: Option<String>,
        /// Why, for whoever looks next
        #[arg(long, value_name = "REASON")]
        reason: Option<String>,
    },
    /// Let a paused job (or every job of a tag) fire on its schedule again
    Resume {
        /// The job's name
        #[arg(required_unless_present = "tag", conflicts_with = "tag")]
        name: Option<String>,
        /// Every job with this tag instead, in one transaction
        #[arg(long, value_name = "TAG")]
        tag: Option<String>,
    },
    /// Run a job now
    Trigger(TriggerArgs),
    /// Create a job at runtime from a definition file (a job's entry as in YAML, or JSON)
    Create {
        /// The new job's name
        name: String,
        /// The definition (`-` for stdin), e.g. a file holding `cron: "30 7 * * 1-5"` and `workflow: digest`
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: std::path::PathBuf,
        /// Check and show what would be saved (next fire times included); save nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Change a runtime job: from a file, or in $EDITOR when no file is given
    Edit {
        /// The runtime job's name
        name: String,
        /// The whole new definition (`-` for stdin); without it, the current one opens in $EDITOR
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: Option<std::path::PathBuf>,
        /// Refuse the change if the job is no longer at this version (with $EDITOR: the version opened)
        #[arg(long, value_name = "N")]
        expected_version: Option<u64>,
        /// Check and show what would be saved; save nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete a runtime job: it stops firing; its runs and history stay
    Delete {
        /// The runtime job's name
        name: String,
        /// Refuse if the job is no longer at this version
        #[arg(long, value_name = "N")]
        expected_version: Option<u64>,
        /// Also stop its queued and running runs (by default they finish)
        #[arg(long)]
        cancel_runs: bool,
    },
    /// Run a job's past ticks in a window that have no run yet, once each, in order
    Backfill {
        /// The job's name
        name: String,
        /// The window's start (RFC 3339, e.g. 2026-11-20T00:00:00Z)
        #[arg(long, value_name = "INSTANT")]
        from: String,
        /// The window's end (RFC 3339)
        #[arg(long, value_name = "INSTANT")]
        to: String,
        /// List the ticks that would run; create nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Print runtime jobs as YAML that `lamplighter config validate` accepts (to move them into the files)
    Export {
        /// Only these jobs (default: every runtime job)
        names: Vec<String>,
    },
    /// Show a runtime job's changes: who, when, what
    History {
        /// The job's name
        name: String,
        /// How many changes, newest first
        #[arg(short = 'n', long = "count", value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
        count: u32,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Show the next fire times of a cron expression, a period or an instant, in its zone and yours
    #[command(group(clap::ArgGroup::new("schedule").required(true).args(["cron", "every", "at"])))]
    Preview {
        /// A cron expression, as in a job's `cron:` (e.g. "30 7 * * 1-5")
        #[arg(long, value_name = "EXPR")]
        cron: Option<String>,
        /// A period, as in a job's `every:` (e.g. 15m)
        #[arg(long, value_name = "PERIOD")]
        every: Option<String>,
        /// One instant, as in a job's `at:` (RFC 3339)
        #[arg(long, value_name = "INSTANT")]
        at: Option<String>,
        /// The IANA zone a cron expression fires in (default: the worker's scheduling.timezone)
        #[arg(long, value_name = "ZONE")]
        timezone: Option<String>,
        /// Keep the fires to the days of this calendar of scheduling.calendars
        #[arg(long, value_name = "NAME")]
        calendar: Option<String>,
        /// With --calendar: move a fire on a day off the calendar to its day before (previous)
        /// or after (next) instead of skipping it
        #[arg(long, value_name = "previous|next", requires = "calendar", value_parser = ["previous", "next"])]
        shift: Option<String>,
        /// Preview from this instant (RFC 3339) instead of now
        #[arg(long, value_name = "INSTANT")]
        from: Option<String>,
        /// How many fire times to show
        #[arg(short = 'n', long = "count", value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
        count: u32,
    },
}

#[derive(Debug, Args)]
pub(crate) struct TriggerArgs {
    /// The job's name
    #[arg(required_unless_present = "tag", conflicts_with = "tag")]
    pub(crate) name: Option<String>,

    /// A run of every job with this tag instead (not with --wait or --idempotency-key)
    #[arg(long, value_name = "TAG", conflicts_with_all = ["wait", "idempotency_key"])]
    pub(crate) tag: Option<String>,

    /// A parameter for the run (repeatable); VALUE is JSON if it parses (42, true, {"a":1}), else a string
    #[arg(long = "param", value_name = "KEY=VALUE", allow_hyphen_values = true, value_parser = parse_param)]
    pub(crate) params: Vec<(String, Value)>,

    #[command(flatten)]
    pub(crate) start: StartArgs,
}

/// How a run is started by hand (`jobs trigger`, `workflows run`).
#[derive(Debug, Args)]
pub(crate) struct StartArgs {
    /// Input for the run (${input}): JSON if it parses as JSON, else the text as a string
    #[arg(long, value_name = "TEXT", allow_hyphen_values = true, value_parser = parse_input)]
    pub(crate) input: Option<Value>,

    /// Start at most once per key: repeating the command returns the first run
    #[arg(long, value_name = "KEY")]
    pub(crate) idempotency_key: Option<String>,

    /// Wait for the run to end (or to wait for approval), then print it; the exit code says how
    /// it ended: 0 succeeded, 4 failed, 5 timed out, 6 cancelled, 7 waits for approval, 8
    /// interrupted or skipped
    #[arg(long)]
    pub(crate) wait: bool,

    /// With --wait: stop waiting after this many seconds (the run goes on)
    #[arg(long, value_name = "SECONDS", requires = "wait", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) timeout: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum WorkflowsCommand {
    /// List them, with their steps
    List,
    /// Run a workflow now, without a job
    Run(RunWorkflowArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum AgentsCommand {
    /// List them, with their model and tools
    List,
    /// Run an agent now on a task (--input), without a job; listed under the job agent:NAME
    Run(RunAgentArgs),
    /// Run a named pipeline now: its agents in order, each given the previous one's answer
    Pipeline(RunAgentArgs),
    /// Run a group chat now: the agents speak in turn, each given the previous one's answer
    Chat(ChatArgs),
}

#[derive(Debug, Args)]
pub(crate) struct RunAgentArgs {
    /// The agent's (or pipeline's) name
    pub(crate) name: String,

    #[command(flatten)]
    pub(crate) start: StartArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    /// The agents, in the order they speak, separated by commas (a,b,c)
    #[arg(value_delimiter = ',', required = true)]
    pub(crate) agents: Vec<String>,

    /// How many times the agents go round (1-20; default 1)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=20))]
    pub(crate) max_iterations: Option<u32>,

    #[command(flatten)]
    pub(crate) start: StartArgs,
}

#[derive(Debug, Args)]
pub(crate) struct RunWorkflowArgs {
    /// The workflow's name
    pub(crate) name: String,

    #[command(flatten)]
    pub(crate) start: StartArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RunsCommand {
    /// List runs, newest first
    List {
        /// Only this job's runs
        #[arg(long, value_name = "JOB")]
        job: Option<String>,
        /// Only runs with this status
        #[arg(long, value_name = "STATUS", value_parser = RUN_STATUSES)]
        status: Option<String>,
        /// At most this many runs
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=200))]
        limit: Option<u32>,
        /// Continue after the previous page (the cursor it printed)
        #[arg(long, value_name = "CURSOR")]
        cursor: Option<String>,
    },
    /// Show one run: times, input, output, error, steps, agent usage
    Show {
        /// The run's id
        id: String,
        /// Also print the agent transcript: every model call and tool call, in order
        #[arg(long)]
        transcript: bool,
    },
    /// Follow a run until it ends, through its approvals: its status, each step, model and tool
    /// call and each line of output as they come (the worker notifies lampctl; nothing polls).
    /// Exits with how it ended: 0 succeeded, 4 failed, 5 timed out, 6 cancelled, 8 interrupted
    /// or skipped
    Follow {
        /// The run's id
        id: String,
    },
    /// Cancel a queued or running run
    Cancel {
        /// The run's id
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum LimitsCommand {
    /// Each limit: its slots, the runs holding them and the runs waiting, per key
    List,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ApprovalsCommand {
    /// List the steps waiting for approval
    List,
    /// Approve a waiting step, so the workflow goes on
    Approve(DecisionArgs),
    /// Reject a waiting step
    Reject(DecisionArgs),
}

#[derive(Debug, Args)]
pub(crate) struct DecisionArgs {
    /// The id of the run that waits
    pub(crate) run: String,
    /// The step, when the run waits on more than one
    #[arg(long, value_name = "STEP")]
    pub(crate) step: Option<String>,
    /// A comment recorded with the decision
    #[arg(long, value_name = "TEXT")]
    pub(crate) comment: Option<String>,
    /// Who decides, recorded with the decision (default: $USER via lampctl)
    #[arg(long, value_name = "NAME")]
    pub(crate) by: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Reload the worker's configuration (an invalid one is refused and the old one kept)
    Reload,
    /// Make a context the current one (lampctl's config file)
    UseContext {
        /// The context's name
        name: String,
    },
    /// List the contexts in lampctl's config file
    GetContexts,
    /// Create a context, or change it: it keeps the --url, --token, --ca-cert and
    /// --client-cert/--client-key given with this command (or their environment variables)
    SetContext {
        /// The context's name
        name: String,
        /// A command that prints the token, run each time the context is used (instead of
        /// storing the token)
        #[arg(long, value_name = "COMMAND")]
        token_command: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ToolsCommand {
    /// List the worker's MCP tools
    List,
    /// Call any tool with JSON arguments and print its result
    Call {
        /// The tool's name, as `tools list` shows it
        name: String,
        /// The arguments, a JSON object such as '{"name": "nightly"}'
        #[arg(long, value_name = "JSON", value_parser = parse_json_object)]
        json: Option<Map<String, Value>>,
    },
}

/// `KEY=VALUE`, the value read as JSON when it parses (so `n=3` is a number and
/// `tags=["a"]` a list) and as a string otherwise (`name=nightly`).
pub(crate) fn parse_param(text: &str) -> Result<(String, Value), String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!("expected KEY=VALUE, e.g. --param limit=10 (got \"{text}\")"));
    };
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("the key before \"=\" is missing in \"{text}\""));
    }
    Ok((key.to_owned(), json_or_string(value)))
}

/// `--input`: JSON when the text parses as JSON, else the text itself.
pub(crate) fn parse_input(text: &str) -> Result<Value, String> {
    Ok(json_or_string(text))
}

/// `--json`: must be a JSON object, the shape of every tool's arguments.
pub(crate) fn parse_json_object(text: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!("tool arguments must be a JSON object such as '{{\"name\": \"nightly\"}}', not {}", json_kind(&other))),
        Err(error) => Err(format!("not valid JSON ({error})")),
    }
}

fn json_or_string(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use serde_json::json;

    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn param_values_are_json_when_they_parse_else_strings() {
        let cases = [
            ("limit=10", ("limit", json!(10))),
            ("dry=true", ("dry", json!(true))),
            ("name=nightly", ("name", json!("nightly"))),
            ("opts={\"a\":[1,2]}", ("opts", json!({"a": [1, 2]}))),
            ("quoted=\"7\"", ("quoted", json!("7"))),
            ("empty=", ("empty", json!(""))),
            ("expr=a=b", ("expr", json!("a=b"))),
            ("nothing=null", ("nothing", Value::Null)),
            (" spaced =x", ("spaced", json!("x"))),
        ];
        for (text, (key, value)) in cases {
            assert_eq!(parse_param(text), Ok((key.to_owned(), value)), "{text}");
        }
    }

    #[test]
    fn params_without_a_key_or_equals_sign_are_usage_errors() {
        assert!(parse_param("novalue").unwrap_err().contains("KEY=VALUE"));
        assert!(parse_param("=3").unwrap_err().contains("key"));
    }

    #[test]
    fn input_is_json_when_it_parses_else_text() {
        assert_eq!(parse_input("42"), Ok(json!(42)));
        assert_eq!(parse_input("{\"pr\": 12}"), Ok(json!({"pr": 12})));
        assert_eq!(parse_input("review the diff"), Ok(json!("review the diff")));
    }

    #[test]
    fn tool_arguments_must_be_a_json_object() {
        assert_eq!(parse_json_object("{\"name\":\"x\"}").unwrap().get("name"), Some(&json!("x")));
        assert!(parse_json_object("[1]").unwrap_err().contains("not an array"));
        assert!(parse_json_object("{oops").unwrap_err().starts_with("not valid JSON"));
    }

    #[test]
    fn trigger_collects_repeated_params_and_flags() {
        let cli = Cli::try_parse_from([
            "lampctl",
            "jobs",
            "trigger",
            "nightly",
            "--param",
            "limit=3",
            "--param",
            "who=me",
            "--input",
            "-5",
            "--idempotency-key",
            "k1",
            "--wait",
            "-o",
            "json",
        ])
        .unwrap();
        assert_eq!(cli.output, Output::Json);
        let Command::Jobs { command: JobsCommand::Trigger(args) } = cli.command else { panic!("not parsed as jobs trigger") };
        assert_eq!(args.name.as_deref(), Some("nightly"));
        assert_eq!(args.params, vec![("limit".to_owned(), json!(3)), ("who".to_owned(), json!("me"))]);
        assert_eq!(args.start.input, Some(json!(-5)));
        assert_eq!(args.start.idempotency_key.as_deref(), Some("k1"));
        assert!(args.start.wait);
    }

    #[test]
    fn bad_values_exit_with_the_usage_code() {
        for argv in [
            &["lampctl", "jobs", "trigger", "x", "--param", "oops"][..],
            &["lampctl", "tools", "call", "list_jobs", "--json", "[1]"],
            &["lampctl", "runs", "list", "--status", "exploded"],
            &["lampctl", "runs", "list", "--limit", "0"],
            &["lampctl", "jobs", "trigger", "x", "--timeout", "5"],
            &["lampctl", "jobs", "frobnicate"],
            &["lampctl", "-o", "yaml", "status"],
        ] {
            let error = Cli::try_parse_from(argv.iter().copied()).unwrap_err();
            assert_eq!(error.exit_code(), 2, "{argv:?}: {error}");
        }
    }

    #[test]
    fn global_flags_are_accepted_after_the_subcommand() {
        let cli = Cli::try_parse_from(["lampctl", "jobs", "list", "--url", "http://h:1/mcp", "--token", "t", "-o", "json"]).unwrap();
        assert_eq!(cli.url.as_deref(), Some("http://h:1/mcp"));
        assert_eq!(cli.token.as_deref(), Some("t"));
        assert_eq!(cli.output, Output::Json);
    }
}
