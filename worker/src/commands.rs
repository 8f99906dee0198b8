//! The one-shot commands: `config validate`, `config show`, `migrate`.

use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;
use std::time::Duration;

use lamplighter_config::{Config, Diagnostic, Disabled, KeepMerged, LoadOptions, Loaded};
use lamplighter_plugins::{HostPolicy, Registry, WasmOptions};

use crate::LogFormat;

/// What a config is loaded for: checking it (every problem is an error), or running it (a job
/// the environment breaks, such as one whose plugin did not load, is disabled with the reason
/// and the rest runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    Check,
    Run,
    /// As `Run`, keeping the whole merged YAML to print it.
    Show,
}

impl Purpose {
    /// What of the merged YAML is kept: running and checking need none of the jobs' (a worker
    /// drops the rest once the config is checked), so they are freed as they are read (a lean
    /// load reports the same jobs and errors, `config/tests/load.rs`); only printing keeps all
    /// (a million jobs' YAML is gigabytes: BENCHMARKS.md).
    fn merged(self) -> KeepMerged {
        match self {
            Purpose::Run | Purpose::Check => KeepMerged::WithoutJobs,
            Purpose::Show => KeepMerged::Whole,
        }
    }
}

/// Loads and fully validates the config (including what only the scheduler and plugins know),
/// and loads the plugins it names.
pub(crate) fn load_checked(path: Option<PathBuf>, purpose: Purpose) -> Result<(Loaded, Arc<Registry>), Vec<Diagnostic>> {
    let (config, mut diags) = load(path, purpose.merged());
    let registry = Arc::new(config.as_ref().map_or_else(Registry::builtin, registry_for));
    if let Some(c) = &config {
        // The seed's validate checks that each folder exists. A missing one is a warning (a
        // worker runs without its plugins, and the seed's own reference names a folder it
        // does not ship); what needs a plugin from it is an error of its own.
        for (_, why) in registry.dir_problems() {
            diags.push(Diagnostic::warning(c.locate(&["plugins", "dirs"]), why.clone()));
        }
        for p in registry.plugins() {
            if let Some(e) = &p.error {
                diags.push(Diagnostic::warning(None, format!("plugin \"{}\" is not available: {e}", p.name)));
            }
        }
    }
    check(config, diags, &registry, purpose).map(|l| (l, registry))
}

/// As [`load_checked`], against the plugins already loaded (a reload keeps the worker's
/// plugins; changing `plugins.dirs` needs a restart).
pub(crate) fn reload_checked(path: Option<PathBuf>, registry: &Registry) -> Result<Loaded, Vec<Diagnostic>> {
    let (config, diags) = load(path, Purpose::Run.merged());
    check(config, diags, registry, Purpose::Run)
}

fn load(path: Option<PathBuf>, merged: KeepMerged) -> (Option<Config>, Vec<Diagnostic>) {
    lamplighter_config::load_partial(&LoadOptions { path, cwd: None, merged }, |n| std::env::var(n).ok())
}

/// Adds what the scheduler and the plugins find wrong, then decides.
fn check(mut config: Option<Config>, mut diags: Vec<Diagnostic>, registry: &Registry, purpose: Purpose) -> Result<Loaded, Vec<Diagnostic>> {
    if let Some(c) = &mut config {
        let checked = lamplighter_jobs::check(c, registry);
        diags.extend(checked.errors);
        for u in checked.unavailable {
            match purpose {
                Purpose::Check => diags.push(u.diagnostic(c)),
                Purpose::Run | Purpose::Show => {
                    c.disabled.insert(Disabled::Job(u.job), u.reason);
                }
            }
        }
        for (what, why, diagnostic) in checked.disabled {
            match purpose {
                Purpose::Check => diags.push(diagnostic),
                Purpose::Run | Purpose::Show => {
                    c.disabled.insert(what, why);
                }
            }
        }
        // A one-word pattern once allowed any arguments; the seed's rule (kept now) is exact.
        let patterns = c.jobs.values().map(|j| (["scheduling", "jobs", j.name.as_str()], &j.allowed_commands[..]));
        let patterns = patterns.chain(c.agents.values().map(|a| (["agents", a.name.as_str(), ""], &a.allowed_commands[..])));
        let patterns = patterns.chain(std::iter::once((["worker", "mcp", "manage_jobs"], &c.worker.manage_jobs.allowed_commands[..])));
        let mut loose = Vec::new();
        for (at, list) in patterns {
            for p in list {
                if let Some(why) = lamplighter_plugins::loose_pattern_warning(p) {
                    let at: Vec<&str> = at.iter().copied().filter(|s| !s.is_empty()).chain(["allowed_commands"]).collect();
                    loose.push(Diagnostic::warning(c.locate(&at), why));
                }
            }
        }
        diags.extend(loose);
        if let Some(why) = crate::security::exposure(&c.worker) {
            diags.push(Diagnostic::error(c.locate(&["worker", "mcp", "host"]), why));
        }
        if let Err(why) = crate::tls::check(&c.worker.tls) {
            diags.push(Diagnostic::error(c.locate(&["worker", "mcp", "tls"]), why));
        }
        if let Some(why) = crate::telemetry::check(&c.telemetry, |n| std::env::var(n).ok()) {
            match purpose {
                Purpose::Check => diags.push(Diagnostic::error(c.locate(&["telemetry"]), format!("telemetry: {why}"))),
                Purpose::Run | Purpose::Show => {
                    c.disabled.insert(Disabled::TelemetryExport, why);
                }
            }
        }
    }
    lamplighter_config::finish(config, diags).map_err(|e| e.0)
}

/// Built-ins plus the plugins in `plugins.dirs`, with the `plugins.wasm` limits. Compiles
/// WASM modules, so it is done once, at start.
fn registry_for(config: &Config) -> Registry {
    let w = &config.wasm;
    let opts = WasmOptions {
        fuel: w.fuel,
        memory_bytes: usize::try_from(w.memory_bytes).unwrap_or(usize::MAX),
        wall_time: w.timeout,
        allowed_capabilities: w.capabilities.clone(),
        data_dir: config.data_dir.clone(),
        plugin_config: w.plugin_config.clone(),
        host: HostPolicy {
            allowed_hosts: w.http_allowed_hosts.clone(),
            http_timeout: w.http_timeout,
            max_response_bytes: w.http_max_response_bytes,
            ai_models: w.ai_models.clone(),
            ai_max_tokens: w.ai_max_tokens,
            mcp_tools: w.mcp_tools.clone(),
        },
    };
    Registry::load(&config.plugin_dirs, opts)
}

/// The config's disabled items as `(what, why)`, ordered by the text of `what`: the order they
/// were always reported in.
pub(crate) fn disabled_notes(config: &Config) -> Vec<(String, &str)> {
    let mut notes: Vec<(String, &str)> = config.disabled.iter().map(|(what, why)| (what.to_string(), why.as_str())).collect();
    notes.sort_by(|a, b| a.0.cmp(&b.0));
    notes
}

pub(crate) fn print_diags(diags: &[Diagnostic]) {
    for d in diags {
        eprintln!("{d}");
    }
}

pub(crate) fn validate(path: Option<PathBuf>) -> ExitCode {
    match load_checked(path, Purpose::Check) {
        Ok((l, _)) => {
            print_diags(&l.warnings);
            for (what, why) in disabled_notes(&l.config) {
                eprintln!("note: {what} is disabled: {why}");
            }
            let c = &l.config;
            // `framework.name` and `framework.version` say which config this is.
            let named = match &c.version {
                Some(v) => format!("{} {v}, ", c.name),
                None if c.name != "lamplighter" => format!("{}, ", c.name),
                None => String::new(),
            };
            println!(
                "config ok: {} ({named}{} jobs, {} agents, {} workflows, {} warnings)",
                c.root.display(),
                c.jobs.len(),
                c.agents.len(),
                c.workflows.len(),
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

/// The merged config as a worker would run it: what the environment breaks (an unset key, a
/// plugin that did not load) is disabled, not an error; `validate` reports those.
pub(crate) fn show(path: Option<PathBuf>) -> ExitCode {
    match load_checked(path, Purpose::Show) {
        Ok((l, _)) => {
            print!("{}", lamplighter_config::show(&l.config));
            ExitCode::SUCCESS
        }
        Err(diags) => {
            print_diags(&diags);
            ExitCode::from(2)
        }
    }
}

pub(crate) fn backup(path: Option<PathBuf>, to: &std::path::Path) -> ExitCode {
    let loaded = match load_checked(path, Purpose::Run) {
        Ok((l, _)) => l,
        Err(diags) => {
            print_diags(&diags);
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(lamplighter_jobs::backup(&loaded.config, to)) {
        Ok(bytes) => {
            println!("backed up to {} ({bytes} bytes)", to.display());
            ExitCode::SUCCESS
        }
        Err(lamplighter_jobs::BackupError::Refused(why)) => {
            eprintln!("error: {why}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: backup failed: {e}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) fn migrate(path: Option<PathBuf>, format: LogFormat) -> ExitCode {
    let loaded = match load_checked(path, Purpose::Run) {
        Ok((l, _)) => l,
        Err(diags) => {
            print_diags(&diags);
            return ExitCode::from(2);
        }
    };
    crate::telemetry::init_logging(format, loaded.config.log_level.as_deref());
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(lamplighter_jobs::migrate(&loaded.config)) {
        Ok(p) => {
            println!("migrations applied: {p}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `completions`: the script for `shell` on standard output.
pub(crate) fn completions(mut cmd: clap::Command, shell: clap_complete::Shell) -> ExitCode {
    // Into a buffer first: clap_complete panics on a failed write (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "lamplighter", &mut script);
    match std::io::Write::write_all(&mut std::io::stdout().lock(), &script) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write the completion script: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `man`: the page of `cmd` on standard output, or every command's page written into `dir`.
pub(crate) fn man(cmd: clap::Command, dir: Option<&std::path::Path>) -> ExitCode {
    let name = cmd.get_name().to_owned();
    let written = match dir {
        None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout().lock()),
        Some(dir) => std::fs::create_dir_all(dir).and_then(|()| clap_mangen::generate_to(cmd, dir)),
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write the manual pages of {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `healthcheck`: 0 when `url` answers `200` within 5 s; 1 with the reason when it does not;
/// 2 for a URL it cannot ask.
pub(crate) fn healthcheck(url: &str) -> ExitCode {
    let Some((authority, path)) = url.strip_prefix("http://").map(|rest| match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    }) else {
        eprintln!("error: --url must be an http:// URL of the worker's listener, e.g. http://127.0.0.1:5100/healthz (not {url:?})");
        return ExitCode::from(2);
    };
    match probe(authority, path, Duration::from_secs(5)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("unhealthy: {url}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One `GET path` to `authority` (`host:port`); `Ok` for a 200.
fn probe(authority: &str, path: &str, within: Duration) -> Result<(), String> {
    use std::io::{BufRead, Write};
    use std::net::ToSocketAddrs;
    let addr = authority.to_socket_addrs().map_err(|e| format!("cannot resolve {authority}: {e}"))?.next();
    let addr = addr.ok_or_else(|| format!("{authority} has no address"))?;
    let stream = std::net::TcpStream::connect_timeout(&addr, within).map_err(|e| format!("cannot connect: {e}"))?;
    stream.set_read_timeout(Some(within)).and_then(|()| stream.set_write_timeout(Some(within))).map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    (&stream).write_all(request.as_bytes()).map_err(|e| format!("cannot send: {e}"))?;
    let mut status = String::new();
    std::io::BufReader::new(&stream).read_line(&mut status).map_err(|e| format!("no answer: {e}"))?;
    match status.split_whitespace().nth(1) {
        Some("200") => Ok(()),
        Some(code) => Err(format!("answered {code}")),
        None => Err(format!("not an HTTP answer: {:?}", status.trim())),
    }
}
