//! The `lamplighter` binary: parses arguments and hands over to the worker library.

use std::process::ExitCode;

use clap::Parser;

/// jemalloc, configured at build time (`.cargo/config.toml`) to give freed pages back within
/// a second: loading ten thousand jobs leaves holes that glibc's allocator keeps resident.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = lamplighter_worker::Cli::parse();
    lamplighter_worker::main(cli)
}
