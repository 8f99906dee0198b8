//! The one-shot commands: `config validate`, `config show`, `migrate`.

use std::path::PathBuf;
use std::process::ExitCode;

use lamplighter_config::{Diagnostic, LoadOptions, Loaded};
use lamplighter_plugins::Registry;

use crate::LogFormat;

/// Loads and fully validates the config (including what only the scheduler and plugins know).
pub(crate) fn load_checked(path: Option<PathBuf>) -> Result<Loaded, Vec<Diagnostic>> {
    let (config, mut diags) = lamplighter_config::load_partial(&LoadOptions { path, cwd: None }, |n| std::env::var(n).ok());
    if let Some(c) = &config {
        diags.extend(lamplighter_jobs::validate(c, &Registry::builtin()));
    }
    lamplighter_config::finish(config, diags).map_err(|e| e.0)
}

pub(crate) fn print_diags(diags: &[Diagnostic]) {
    for d in diags {
        eprintln!("{d}");
    }
}

pub(crate) fn validate(path: Option<PathBuf>) -> ExitCode {
    match load_checked(path) {
        Ok(l) => {
            print_diags(&l.warnings);
            for (what, why) in &l.config.disabled {
                eprintln!("note: {what} is disabled: {why}");
            }
            let c = &l.config;
            println!(
                "config ok: {} ({} jobs, {} agents, {} workflows, {} warnings)",
                c.root.display(),
                c.jobs.len(),
                c.agents().len(),
                c.workflows().len(),
                l.warnings.len()
            );
            ExitCode::SUCCESS
        }
        Err(diags) => {
            print_diags(&diags);
            eprintln!("config invalid: {} error(s)", diags.iter().filter(|d| d.is_error()).count());
            ExitCode::from(2)
        }
    }
}

pub(crate) fn show(path: Option<PathBuf>) -> ExitCode {
    match load_checked(path) {
        Ok(l) => {
            print!("{}", lamplighter_config::show(&l.config));
            ExitCode::SUCCESS
        }
        Err(diags) => {
            print_diags(&diags);
            ExitCode::from(2)
        }
    }
}

pub(crate) fn migrate(path: Option<PathBuf>, format: LogFormat) -> ExitCode {
    let loaded = match load_checked(path) {
        Ok(l) => l,
        Err(diags) => {
            print_diags(&diags);
            return ExitCode::from(2);
        }
    };
    crate::logging::init(format, loaded.config.log_level.as_deref());
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(lamplighter_jobs::migrate(&loaded.config)) {
        Ok(p) => {
            println!("migrations applied: {}", p.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
