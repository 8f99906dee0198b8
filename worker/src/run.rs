//! `lamplighter run`: start everything, then react to signals — SIGHUP reloads, SIGTERM and
//! SIGINT drain for `worker.shutdown_grace` and stop; a second SIGINT exits at once.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use futures::StreamExt;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use tokio_util::sync::CancellationToken;

use lamplighter_config::McpAuth;
use lamplighter_jobs::{Engine, EngineOptions, SystemClock};
use lamplighter_plugins::Registry;

use crate::LogFormat;
use crate::commands::{load_checked, print_diags};

pub(crate) fn run(path: Option<PathBuf>, format: LogFormat) -> ExitCode {
    let loaded = match load_checked(path.clone()) {
        Ok(l) => l,
        Err(diags) => {
            print_diags(&diags);
            eprintln!("config invalid: not starting");
            return ExitCode::from(2);
        }
    };
    crate::logging::init(format, loaded.config.log_level.as_deref());
    for w in &loaded.warnings {
        tracing::warn!("{w}");
    }
    for (what, why) in &loaded.config.disabled {
        tracing::warn!("{what} is disabled: {why}");
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(serve(loaded.config, path))
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

async fn serve(config: lamplighter_config::Config, path: Option<PathBuf>) -> ExitCode {
    let host: std::net::IpAddr = config.worker.host.parse().unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
    if !host.is_loopback() && config.worker.auth == McpAuth::None {
        eprintln!("error: refusing to listen on {host} without auth; set worker.mcp.auth (type: bearer) or listen on 127.0.0.1");
        return ExitCode::from(2);
    }
    let addr = std::net::SocketAddr::new(host, config.worker.port);
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("cannot listen on {addr}: {e}; change worker.mcp.port or stop what uses it");
            return ExitCode::FAILURE;
        }
    };
    let registry = Arc::new(Registry::builtin());
    let name = worker_name(config.worker.name.as_deref());
    let engine = match Engine::start(&config, EngineOptions { worker_name: name.clone(), clock: Arc::new(SystemClock), registry }).await {
        Ok(e) => e,
        Err(e) => {
            tracing::error!("cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(worker = %name, listen = %local, jobs = config.jobs.len(), "lamplighter ready");
    let http_stop = CancellationToken::new();
    let stop = http_stop.clone();
    let app = crate::http::router(engine.clone());
    let http = tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await });

    let mut signals = match signal_hook_tokio::Signals::new([SIGHUP, SIGTERM, SIGINT]) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut grace = config.worker.shutdown_grace;
    while let Some(sig) = signals.next().await {
        match sig {
            SIGHUP => match load_checked(path.clone()) {
                Ok(l) => {
                    for w in &l.warnings {
                        tracing::warn!("{w}");
                    }
                    grace = l.config.worker.shutdown_grace;
                    engine.reload(&l.config);
                    tracing::info!(jobs = l.config.jobs.len(), "config reloaded");
                }
                Err(diags) => {
                    for d in &diags {
                        tracing::error!("{d}");
                    }
                    tracing::error!("config reload rejected; the running config is kept");
                }
            },
            _ => break,
        }
    }
    tracing::info!(grace_s = grace.as_secs(), running = engine.running_count(), "shutting down: draining running work");
    // A second SIGINT or SIGTERM while draining exits at once.
    let drain = engine.shutdown(grace);
    tokio::select! {
        _ = drain => {}
        _ = signals.next() => {
            tracing::warn!("second signal: exiting now");
            return ExitCode::from(130);
        }
    }
    http_stop.cancel();
    let _ = http.await;
    tracing::info!("stopped");
    ExitCode::SUCCESS
}
