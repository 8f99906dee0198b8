//! `lampctl`: command-line control for a lamplighter worker, through the worker's MCP tools.
//!
//! This file only parses the command line, runs it, and turns the outcome into an exit code:
//! 0 ok, 1 the worker said no, 2 usage, 3 cannot reach or authenticate, 130 interrupted.

mod app;
mod cli;
mod client;
mod contexts;
mod error;
#[cfg(test)]
mod footprint;
mod render;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Usage errors (including a bad --param or --json) are printed by clap, which exits with 2.
    let cli = cli::Cli::parse();
    match app::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("lampctl: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
