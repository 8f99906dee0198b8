//! Compiles `worker` (its MCP server included).

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use super::{Compiler, DEFAULT_LEASE, ManageJobs, McpAuth, McpTransport, WorkerConfig, duration};
use crate::raw;

impl Compiler<'_> {
    pub(super) fn worker(&mut self, w: Option<&raw::Worker>, data_dir: &Path) -> WorkerConfig {
        let w = w.cloned().unwrap_or_default();
        let mcp = w.mcp.clone().unwrap_or_default();
        let shutdown_grace = match &w.shutdown_grace {
            None => Duration::from_secs(30),
            Some(s) => duration(s).unwrap_or_else(|e| {
                self.err(&["worker", "shutdown_grace"], format!("worker.shutdown_grace {e}"));
                Duration::from_secs(30)
            }),
        };
        let lease = match w.lease.as_deref().map(duration) {
            None => DEFAULT_LEASE,
            Some(Ok(d)) if d >= Duration::from_secs(1) => d,
            Some(Ok(_)) => {
                self.err(&["worker", "lease"], "worker.lease must be at least 1s".into());
                DEFAULT_LEASE
            }
            Some(Err(e)) => {
                self.err(&["worker", "lease"], format!("worker.lease {e}"));
                DEFAULT_LEASE
            }
        };
        let transport = match mcp.transport.as_deref() {
            None | Some("http") | Some("streamable-http") | Some("streamable_http") => McpTransport::Http,
            Some("stdio") => McpTransport::Stdio,
            Some(o) => {
                self.err(&["worker", "mcp", "transport"], format!("worker.mcp.transport \"{o}\" is not one of http, stdio"));
                McpTransport::Http
            }
        };
        let auth = match mcp.auth.as_ref().and_then(|a| a.kind.clone()).as_deref() {
            None | Some("none") => McpAuth::None,
            Some("bearer") => match mcp.auth.as_ref().and_then(|a| a.token.clone()) {
                Some(t) if !t.is_empty() && !t.contains("${") => McpAuth::Bearer { token: t },
                _ => {
                    self.err(
                        &["worker", "mcp", "auth"],
                        "worker.mcp.auth of type bearer needs a non-empty \"token\" (e.g. token: ${LAMPLIGHTER_TOKEN})".into(),
                    );
                    McpAuth::None
                }
            },
            Some(o) => {
                self.err(&["worker", "mcp", "auth", "type"], format!("worker.mcp.auth.type \"{o}\" is not one of none, bearer"));
                McpAuth::None
            }
        };
        let host = mcp.host.clone().unwrap_or_else(|| "127.0.0.1".into());
        let host = if host == "localhost" { "127.0.0.1".to_string() } else { host };
        if host.parse::<IpAddr>().is_err() {
            self.err(
                &["worker", "mcp", "host"],
                format!("worker.mcp.host \"{host}\" is not an IP address (use 127.0.0.1, ::1 or 0.0.0.0)"),
            );
        }
        let concurrency = w.concurrency.unwrap_or(4) as usize;
        if concurrency == 0 {
            self.err(&["worker", "concurrency"], "worker.concurrency must be at least 1".into());
        }
        if let Some(n) = &w.name
            && n.trim().is_empty()
        {
            self.warn(&["worker", "name"], "worker.name is empty; a unique name is generated".into());
        }
        WorkerConfig {
            name: w.name.filter(|n| !n.trim().is_empty()),
            concurrency: concurrency.max(1),
            shutdown_grace,
            lease,
            host,
            port: mcp.port.unwrap_or(5100),
            transport,
            auth,
            manage_jobs: self.manage_jobs(mcp.manage_jobs.as_ref(), data_dir),
        }
    }

    fn manage_jobs(&mut self, m: Option<&raw::ManageJobs>, data_dir: &Path) -> ManageJobs {
        let mut out = ManageJobs::off(data_dir);
        let Some(m) = m else { return out };
        let at = |k: &'static str| ["worker", "mcp", "manage_jobs", k];
        out.enabled = m.enabled.unwrap_or(false);
        if let Some(targets) = &m.targets {
            for t in targets {
                let kind = t.split_once(':').map(|(k, _)| k);
                if !matches!(kind, Some("workflow" | "agent" | "plugin")) {
                    self.err(
                        &at("targets"),
                        format!(
                            "worker.mcp.manage_jobs.targets: \"{t}\" does not start with workflow:, agent: or plugin: (e.g. workflow:*, agent:news-*, plugin:file-save.*)"
                        ),
                    );
                }
            }
            out.targets = Some(targets.clone());
        }
        let positive = |c: &mut Self, key: &'static str, v: Option<u32>, default: u32| match v {
            Some(0) => {
                c.err(&at(key), format!("worker.mcp.manage_jobs.{key} must be at least 1"));
                default
            }
            Some(n) => n,
            None => default,
        };
        out.max_jobs = positive(self, "max_jobs", m.max_jobs, ManageJobs::DEFAULT_MAX_JOBS);
        out.max_backfill = positive(self, "max_backfill", m.max_backfill, ManageJobs::DEFAULT_MAX_BACKFILL);
        out.max_definition_bytes =
            positive(self, "max_definition_bytes", m.max_definition_bytes, ManageJobs::DEFAULT_MAX_DEFINITION_BYTES as u32) as usize;
        out.allowed_commands = m.allowed_commands.clone().unwrap_or_default();
        if let Some(dirs) = &m.working_directories {
            let cwd = self.loaded.root.parent().unwrap_or(Path::new(".")).to_path_buf();
            out.working_directories = dirs.iter().map(|d| cwd.join(d)).collect();
        }
        out
    }
}
