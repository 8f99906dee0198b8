//! The composition root: command-line interface, logging, and the life of the process (load
//! config → validate → open storage → start scheduler, queue worker, HTTP listener and MCP →
//! reload on SIGHUP or `reload_config` → drain on SIGTERM, or when the stdio MCP client leaves).

// Tool calls run under `catch_unwind` so that a panicking tool fails its call, not the worker.
#[cfg(panic = "abort")]
compile_error!("the worker needs panic = \"unwind\": build it with --release (the `lampctl` profile is for lampctl only)");

mod answer;
mod commands;
mod direct;
mod http;
mod mcp;
mod oauth;
mod prompts;
mod resources;
mod run;
mod security;
mod systemd;
mod tasks;
mod telemetry;
mod tls;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// Lamplighter: a headless scheduler worker.
#[derive(Debug, Parser)]
#[command(name = "lamplighter", version = lamplighter_contract::VERSION, about)]
pub struct Cli {
    /// Config file (default: $LAMPLIGHTER_CONFIG, then config/lamplighter.yaml, lamplighter.yaml,
    /// config/gantri.yaml, gantri.yaml in the working directory).
    #[arg(long, short, global = true)]
    pub config: Option<PathBuf>,
    /// Log format: `human` for terminals, `json` for journald and containers.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the worker.
    Run {
        /// Also serve MCP over stdin/stdout, for chat clients that launch their server (as
        /// `worker.mcp.transport: stdio` does). The worker stops, draining like SIGTERM, when
        /// stdin closes.
        #[arg(long)]
        mcp_stdio: bool,
        /// Write the run core's internal events (each tick burst with where its transaction's
        /// time went, each batch of run ends recorded) to FILE as JSON lines, as they happen:
        /// for benchmarks and for finding where the milliseconds of a burst go.
        #[arg(long, value_name = "FILE")]
        internal_events: Option<std::path::PathBuf>,
        /// Listen on PORT instead of `worker.mcp.port` (e.g. a second quickstart beside the
        /// first; point lampctl at it with --url or $LAMPLIGHTER_URL).
        #[arg(long, value_name = "PORT", env = "LAMPLIGHTER_PORT")]
        port: Option<u16>,
    },
    /// Check or print the configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Apply database migrations and exit.
    Migrate,
    /// Copy the live SQLite database to FILE, consistently, while the worker runs (README "Back
    /// up and restore" says how to restore it).
    Backup {
        /// The copy: a new file.
        file: PathBuf,
    },
    /// Exit 0 when the worker's `/healthz` answers 200 within 5 s, else 1: a container's
    /// HEALTHCHECK without curl in the image.
    Healthcheck {
        /// The endpoint to ask (http only: the worker's own listener).
        #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:5100/healthz")]
        url: String,
    },
    /// Print a shell completion script, e.g. `lamplighter completions bash >
    /// /usr/share/bash-completion/completions/lamplighter`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), or with --dir write one page per command there.
    Man {
        /// Write `lamplighter.1`, `lamplighter-run.1`, … into this directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Load and check the config; exit 0, or 2 with every error listed.
    Validate,
    /// Print the merged config with secrets redacted.
    Show,
    /// Print the JSON Schema of the config file.
    Schema,
}

/// Exit codes: 0 ok, 1 runtime failure, 2 bad config or usage.
pub fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Config(ConfigCommand::Validate) => commands::validate(cli.config),
        Command::Config(ConfigCommand::Show) => commands::show(cli.config),
        Command::Config(ConfigCommand::Schema) => {
            println!("{}", lamplighter_config::json_schema());
            ExitCode::SUCCESS
        }
        Command::Migrate => commands::migrate(cli.config, cli.log_format),
        Command::Backup { file } => commands::backup(cli.config, &file),
        Command::Run { mcp_stdio, internal_events, port } => run::run(cli.config, cli.log_format, mcp_stdio, internal_events, port),
        Command::Healthcheck { url } => commands::healthcheck(&url),
        Command::Completions { shell } => commands::completions(<Cli as clap::CommandFactory>::command(), shell),
        Command::Man { dir } => commands::man(<Cli as clap::CommandFactory>::command(), dir.as_deref()),
    }
}
