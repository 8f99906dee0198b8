//! The `lamplighter` binary: parses arguments and hands over to the worker library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = lamplighter_worker::Cli::parse();
    lamplighter_worker::main(cli)
}
