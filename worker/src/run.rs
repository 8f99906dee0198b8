//! `lamplighter run`: start everything, then react to signals — SIGHUP reloads, SIGTERM and
//! SIGINT drain for `worker.shutdown_grace` and stop; a second SIGINT exits at once. The
//! `reload_config` tool reloads through the same path as SIGHUP, and with MCP over stdio the
//! client closing stdin stops the worker like SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use lamplighter_config::{Config, Disabled, McpTransport, TelemetryConfig, WorkerConfig};
use lamplighter_jobs::events::Observer;
use lamplighter_jobs::{BuiltinTargets, Engine, EngineOptions, SystemClock};
use lamplighter_plugins::Registry;

use crate::LogFormat;
use crate::commands::{Purpose, disabled_notes, load_checked, print_diags, reload_checked};
use crate::mcp::{Control, ReloadSummary};
use crate::systemd::{self, Notifier};
use crate::telemetry::{PullReader, Telemetry};

pub(crate) fn run(
    path: Option<PathBuf>,
    format: LogFormat,
    mcp_stdio: bool,
    internal_events: Option<PathBuf>,
    port: Option<u16>,
) -> ExitCode {
    let (mut loaded, registry) = match load_checked(path.clone(), Purpose::Run) {
        Ok(l) => l,
        Err(diags) => {
            print_diags(&diags);
            eprintln!("config invalid: not starting");
            return ExitCode::from(2);
        }
    };
    // `--port` / `$LAMPLIGHTER_PORT` over `worker.mcp.port`, for the life of the process.
    if let Some(p) = port {
        loaded.config.worker.port = p;
    }
    // Validated: the rest of the merged YAML is not needed to run (the jobs' part was freed as
    // the jobs were read, `Purpose::Run`).
    loaded.config.drop_merged();
    let config = &loaded.config;
    let name = worker_name(config.worker.name.as_deref());
    let broken = config.disabled.get(&Disabled::TelemetryExport).map(String::as_str);
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let telemetry = Telemetry::init(&config.telemetry, format, config.log_level.as_deref(), &name, registry.clone(), broken, rt.handle());
    for w in &loaded.warnings {
        tracing::warn!("{w}");
    }
    for (what, why) in disabled_notes(&loaded.config) {
        tracing::warn!("{what} is disabled: {why}");
    }
    let observer = telemetry.observer.clone();
    if let Some(to) = internal_events
        && let Err(e) = crate::telemetry::write_internal_events(&observer, &to)
    {
        eprintln!("error: cannot write internal events to {}: {e}", to.display());
        return ExitCode::from(2);
    }
    let code = rt.block_on(serve(loaded.config, registry, (path, port), mcp_stdio, name, observer, telemetry.metrics.clone()));
    // What the drain produced is flushed while the runtime, which gRPC exporters send on, runs.
    telemetry.shutdown();
    // A blocking read of stdin (MCP over stdio from a terminal or a file) cannot be cancelled;
    // do not let it hold the exit.
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

fn worker_name(configured: Option<&str>) -> String {
    if let Some(n) = configured {
        return n.to_string();
    }
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into());
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &rand[..6])
}

async fn serve(
    config: Config,
    registry: Arc<Registry>,
    (path, port_override): (Option<PathBuf>, Option<u16>),
    mcp_stdio: bool,
    name: String,
    observer: Arc<Observer>,
    metrics: Arc<PullReader>,
) -> ExitCode {
    let host: std::net::IpAddr = config.worker.host.parse().unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
    // Off loopback without protection was refused with the config (`security::exposure`).
    let tls = match crate::tls::Tls::load(&config.worker.tls) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // Handlers before anything else: a SIGTERM while storage does not answer (a database that
    // accepts connections and says nothing) stops the start instead of killing the process;
    // and a SIGHUP (`systemctl reload`) or SIGTERM that follows READY=1 at once must reload or
    // drain, not find the default action (exit).
    let mut signals = match signal_hook_tokio::Signals::new([SIGHUP, SIGTERM, SIGINT]) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Storage first: its lock says whether this worker may run at all, before it takes a port.
    tracing::info!(worker = %name, "opening storage");
    let targets = Arc::new(BuiltinTargets::new(registry.clone()));
    let options = EngineOptions {
        worker_name: name.clone(),
        clock: Arc::new(SystemClock),
        targets: targets.clone(),
        observer: observer.clone(),
        registry: registry.clone(),
    };
    let mut early_reload = false;
    let engine = {
        let start = Engine::start(&config, options);
        tokio::pin!(start);
        loop {
            tokio::select! {
                started = &mut start => match started {
                    Ok(e) => break e,
                    Err(e) => {
                        tracing::error!("cannot start: {e}");
                        return ExitCode::FAILURE;
                    }
                },
                sig = signals.next() => match sig {
                    Some(SIGHUP) => early_reload = true,
                    _ => {
                        // Nothing has run yet: whatever the start did is one transaction at a time,
                        // and the lease (if taken) runs out by itself.
                        tracing::info!("stopped while starting (storage not ready)");
                        return ExitCode::SUCCESS;
                    }
                },
            }
        }
    };
    let addr = std::net::SocketAddr::new(host, config.worker.port);
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("cannot listen on {addr}: {e}; change worker.mcp.port or stop what uses it");
            engine.shutdown(config.worker.shutdown_grace).await;
            return ExitCode::FAILURE;
        }
    };
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let stdio = mcp_stdio || config.worker.transport == McpTransport::Stdio;
    // "Ready" means what `/readyz` means: the scheduler has made its first pass. A stop asked
    // for while that pass hangs (a database that does not answer) is honoured at once; a
    // reload asked for then waits for the loop below.
    let first_pass = engine.first_pass();
    tokio::pin!(first_pass);
    loop {
        tokio::select! {
            () = &mut first_pass => break,
            sig = signals.next() => match sig {
                Some(SIGHUP) => early_reload = true,
                _ => {
                    tracing::info!("stopped before the first scheduler pass completed");
                    engine.shutdown(config.worker.shutdown_grace).await;
                    return ExitCode::SUCCESS;
                }
            },
        }
    }
    tracing::info!(worker = %name, listen = %local, mcp_stdio = stdio, jobs = config.jobs.len(), "lamplighter ready");
    let notifier = Notifier::from_env().map(Arc::new);
    let mut reloader = Reloader {
        notifier: notifier.clone(),
        path,
        engine: engine.clone(),
        registry: registry.clone(),
        observer: observer.clone(),
        listening: config.worker.clone(),
        port_override,
        tls: tls.clone(),
        telemetry: config.telemetry.clone(),
        grace: config.worker.shutdown_grace,
    };
    // The engine holds its own copy of the jobs; the loaded tree (merged YAML, source map) is
    // only needed to load, and a large config must not stay resident twice.
    let job_count = config.jobs.len();
    drop(config);

    // Cancelled once running work has drained: HTTP and MCP stop serving.
    let http_stop = CancellationToken::new();
    let (reload_requests, mut reloads) = mpsc::channel(4);
    let control = Control::new(engine.service().clone(), reload_requests, http_stop.clone(), observer);
    let app = crate::http::router(engine.clone(), Some((control.clone(), &reloader.listening)), metrics);
    let stop = http_stop.clone();
    let http = match tls {
        Some(tls) => {
            let listener = match crate::tls::TlsListener::new(listener, tls) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!("cannot serve TLS on {local}: {e}");
                    engine.shutdown(reloader.grace).await;
                    return ExitCode::FAILURE;
                }
            };
            tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await })
        }
        None => {
            // Answers are small and written in more than one piece: without TCP_NODELAY,
            // Nagle's algorithm holds the last piece until the client's delayed ACK (~40 ms).
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!("cannot set TCP_NODELAY on a connection: {e}");
                }
            });
            tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await })
        }
    };
    // Pings end when the drain starts: systemd stops expecting them at STOPPING=1.
    let watchdog_stop = CancellationToken::new();
    if let Some(n) = &notifier {
        n.ready(&format!("serving {} jobs on {local}", job_count));
        if let Some(every) = systemd::watchdog_interval() {
            tokio::spawn(systemd::watchdog(n.clone(), engine.clone(), every, watchdog_stop.clone()));
        }
    }
    // Cancelled when the stdio MCP session ends (the client closed stdin).
    let stdio_done = CancellationToken::new();
    let mut stdio_live = stdio;
    if stdio {
        let done = stdio_done.clone();
        let stop = http_stop.clone();
        tokio::spawn(async move {
            crate::mcp::serve_stdio(control, stop).await;
            done.cancel();
        });
    }

    if early_reload {
        let _ = reloader.reload();
    }
    loop {
        tokio::select! {
            sig = signals.next() => match sig {
                Some(SIGHUP) => {
                    let _ = reloader.reload();
                }
                _ => break,
            },
            Some(reply) = reloads.recv() => {
                // The caller may have gone; the reload stands either way.
                let _ = reply.send(reloader.reload());
            }
            () = stdio_done.cancelled(), if stdio_live => {
                // `--mcp-stdio` means a client launched this worker: it lives as long as that
                // client. `worker.mcp.transport: stdio` from a config (the seed's default) also
                // serves stdio, but a service with stdin on /dev/null must keep running.
                if mcp_stdio {
                    tracing::info!("MCP over stdio ended (stdin closed): shutting down");
                    break;
                }
                tracing::info!("MCP over stdio ended (stdin closed); still serving MCP over HTTP");
                stdio_live = false;
            }
        }
    }
    // Reload requests from now on (and any still queued) are answered "shutting down".
    drop(reloads);
    let grace = reloader.grace;
    tracing::info!(grace_s = grace.as_secs(), running = engine.running_count(), "shutting down: draining running work");
    watchdog_stop.cancel();
    if let Some(n) = &notifier {
        n.stopping(&format!("draining {} running runs for up to {} s", engine.running_count(), grace.as_secs()), grace);
    }
    // A second SIGINT or SIGTERM while draining exits at once.
    let drain = engine.shutdown(grace);
    tokio::select! {
        _ = drain => {}
        _ = signals.next() => {
            tracing::warn!("second signal: exiting now");
            return ExitCode::from(130);
        }
    }
    // MCP servers agents used: stopped once nothing runs that could call them.
    targets.shutdown().await;
    http_stop.cancel();
    let _ = http.await;
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

/// The one reload path after start: SIGHUP and the `reload_config` tool both call
/// [`Reloader::reload`]. A config that does not load is rejected whole; the running one stays.
struct Reloader {
    path: Option<PathBuf>,
    /// systemd hears of every reload (`RELOADING=1` … `READY=1`).
    notifier: Option<Arc<Notifier>>,
    engine: Engine,
    /// The plugins loaded at start; a reload checks jobs against them.
    registry: Arc<Registry>,
    observer: Arc<Observer>,
    /// `worker.mcp` as the listener was started with; changes there need a restart.
    listening: WorkerConfig,
    /// `--port`, which overrides the file's `worker.mcp.port`.
    port_override: Option<u16>,
    /// The TLS settings served, when the worker serves TLS itself: re-read on reload.
    tls: Option<Arc<crate::tls::Tls>>,
    /// `telemetry` as exporters were set up with; changes there need a restart.
    telemetry: TelemetryConfig,
    /// `worker.shutdown_grace` of the config in force.
    grace: Duration,
}

/// Lowers the calling thread's priority by 10 (threads it starts inherit it). A thread that
/// cannot is left as it is.
fn behind_the_runtime() {
    let me = Some(rustix::thread::gettid());
    let now = rustix::process::getpriority_process(me).unwrap_or(0);
    if let Err(e) = rustix::process::setpriority_process(me, (now + 10).min(19)) {
        tracing::debug!(error = %e, "cannot lower the reload's priority");
    }
}

impl Reloader {
    /// Reloads the config: the summary, or every diagnostic (`file:line:col: error: …`). On a
    /// thread of its own, behind the runtime's: at a million jobs the read keeps both cores
    /// busy for seconds, and the threads that fire ticks come first.
    fn reload(&mut self) -> Result<ReloadSummary, Vec<String>> {
        let done = std::thread::scope(|scope| {
            let reloading = std::thread::Builder::new().name("config-reload".into()).spawn_scoped(scope, || {
                behind_the_runtime();
                self.reload_here()
            });
            match reloading {
                Ok(r) => Some(r.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a thread for the reload; reloading here");
                    None
                }
            }
        });
        done.unwrap_or_else(|| self.reload_here())
    }

    fn reload_here(&mut self) -> Result<ReloadSummary, Vec<String>> {
        if let Some(n) = &self.notifier {
            n.reloading();
        }
        let result = self.reload_config();
        if let Some(n) = &self.notifier {
            n.ready(&match &result {
                Ok(s) => format!("reloaded: serving {} jobs", s.jobs),
                Err(e) => format!("reload rejected ({} diagnostics); the running config stays", e.len()),
            });
        }
        result
    }

    fn reload_config(&mut self) -> Result<ReloadSummary, Vec<String>> {
        match reload_checked(self.path.clone(), &self.registry) {
            Ok(loaded) => {
                for w in &loaded.warnings {
                    tracing::warn!("{w}");
                }
                let config = &loaded.config;
                if let Err(why) = self.engine.reload(config) {
                    tracing::error!("reload refused: {why}");
                    self.observer.config_reloaded(Err("a job takes a runtime job's name"));
                    return Err(why.lines().map(|l| format!("error: {l}")).collect());
                }
                self.grace = config.worker.shutdown_grace;
                if let Some(tls) = &self.tls {
                    match tls.reload(&config.worker.tls) {
                        Ok(()) => tracing::info!("TLS certificates read again"),
                        Err(e) => tracing::warn!("{e}; the certificates in use stay"),
                    }
                }
                let w = &config.worker;
                let l = &self.listening;
                // A port given by `--port` stays; the file's is not the one listened on.
                let port = self.port_override.unwrap_or(w.port);
                if (&w.host, port, &w.auth, w.transport) != (&l.host, l.port, &l.auth, l.transport) {
                    tracing::warn!("worker.mcp changed (host, port, auth or transport); that takes effect at the next restart");
                }
                let (t, l) = (&config.telemetry, &self.telemetry);
                if (t.enabled, &t.traces, &t.metrics, &t.logs, &t.service_name)
                    != (l.enabled, &l.traces, &l.metrics, &l.logs, &l.service_name)
                {
                    tracing::warn!(
                        "telemetry exporters changed; that takes effect at the next restart (hooks and enable_sensitive_data apply now)"
                    );
                }
                self.observer.config_reloaded(Ok(config.jobs.len()));
                Ok(ReloadSummary { jobs: config.jobs.len(), warnings: loaded.warnings.iter().map(ToString::to_string).collect() })
            }
            Err(diags) => {
                for d in &diags {
                    tracing::error!("{d}");
                }
                let errors = diags.iter().filter(|d| d.is_error()).count();
                self.observer.config_reloaded(Err(&format!("{errors} error(s)")));
                Err(diags.iter().map(ToString::to_string).collect())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// The reload's thread yields to the runtime's: its nice value is 10 more (at most 19), and
    /// the threads it starts (the config's loader) inherit it; the thread that started it is
    /// left as it was.
    #[test]
    fn a_reloads_thread_runs_behind_the_runtimes() {
        fn nice() -> i32 {
            rustix::process::getpriority_process(Some(rustix::thread::gettid())).expect("this thread's nice value")
        }
        let before = nice();
        let (own, started) = std::thread::spawn(move || {
            super::behind_the_runtime();
            (nice(), std::thread::spawn(nice).join().expect("a thread it starts"))
        })
        .join()
        .expect("the reload's thread");
        assert_eq!((own, started), ((before + 10).min(19), (before + 10).min(19)));
        assert_eq!(nice(), before, "the calling thread's priority changed");
    }
}
