//! Compiles `worker` (its MCP server included).

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use super::OAuthSettings;
use super::{ApiToken, Compiler, DEFAULT_LEASE, ManageJobs, McpAuth, McpTls, McpTransport, Role, WorkerConfig, duration};
use crate::raw;

impl Compiler<'_> {
    pub(super) fn worker(&mut self, w: Option<&raw::Worker>, data_dir: &Path, cwd: &Path) -> WorkerConfig {
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
        let auth = self.auth(mcp.auth.as_ref());
        let tls = self.tls(mcp.tls.as_ref(), cwd);
        let allowed_hosts = mcp.allowed_hosts.clone().unwrap_or_default();
        for h in &allowed_hosts {
            if h.trim().is_empty() || h.contains(['/', ' ', '@']) {
                self.err(
                    &["worker", "mcp", "allowed_hosts"],
                    format!("worker.mcp.allowed_hosts: \"{h}\" is not a host name (write e.g. lamplighter.example.com)"),
                );
            }
        }
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
            tls,
            allowed_hosts,
            manage_jobs: self.manage_jobs(mcp.manage_jobs.as_ref(), data_dir, cwd),
        }
    }

    fn auth(&mut self, auth: Option<&raw::Auth>) -> McpAuth {
        let at: &[&str] = &["worker", "mcp", "auth"];
        let Some(a) = auth else { return McpAuth::None };
        match a.kind.as_deref() {
            None | Some("none") => {
                if a.token.is_some() || a.tokens.is_some() {
                    self.err(at, "worker.mcp.auth has tokens but no type: add type: bearer".into());
                }
                McpAuth::None
            }
            Some(kind @ ("bearer" | "oauth")) => {
                let oauth = match (kind, &a.oauth) {
                    ("oauth", Some(o)) => self.oauth(o),
                    ("oauth", None) => {
                        self.err(at, "worker.mcp.auth of type oauth needs \"oauth: {issuer: URL, audience: URL}\"".into());
                        return McpAuth::None;
                    }
                    (_, Some(_)) => {
                        self.err(&["worker", "mcp", "auth", "oauth"], "worker.mcp.auth.oauth is read only with type: oauth".into());
                        None
                    }
                    (_, None) => None,
                };
                let usable = |t: &str| !t.trim().is_empty() && !t.contains("${");
                let mut tokens = Vec::new();
                match (&a.token, &a.tokens) {
                    // Beside OAuth, static tokens are optional.
                    (None, None) if kind == "oauth" => {}
                    (Some(_), Some(_)) => self.err(at, "worker.mcp.auth: give either \"token\" or \"tokens\", not both".into()),
                    (Some(t), None) if usable(t) => tokens.push(ApiToken { name: "token".into(), token: t.trim().to_owned(), role: Role::Manage }),
                    (None, Some(list)) if !list.is_empty() => {
                        for (i, t) in list.iter().enumerate() {
                            let which = t.name.clone().unwrap_or_else(|| format!("#{}", i + 1));
                            let name = t.name.clone().filter(|n| !n.trim().is_empty());
                            let token = t.token.clone().filter(|t| usable(t));
                            let role = match t.role.as_deref().map(str::parse::<Role>) {
                                Some(Ok(r)) => Some(r),
                                Some(Err(e)) => {
                                    self.err(at, format!("worker.mcp.auth.tokens: token {which}: role {e}"));
                                    None
                                }
                                None => {
                                    self.err(at, format!("worker.mcp.auth.tokens: token {which} needs a role (read, operate or manage)"));
                                    None
                                }
                            };
                            if name.is_none() {
                                self.err(at, format!("worker.mcp.auth.tokens: token {which} needs a name (recorded as who did what)"));
                            }
                            if token.is_none() {
                                self.err(
                                    at,
                                    format!("worker.mcp.auth.tokens: token {which} needs a non-empty \"token\" (e.g. token: ${{LAMPLIGHTER_TOKEN}})"),
                                );
                            }
                            if let (Some(name), Some(token), Some(role)) = (name, token, role) {
                                if tokens.iter().any(|o: &ApiToken| o.name == name) {
                                    self.err(at, format!("worker.mcp.auth.tokens: the name \"{name}\" is given twice"));
                                } else if tokens.iter().any(|o: &ApiToken| o.token == token.trim()) {
                                    self.err(at, format!("worker.mcp.auth.tokens: token \"{name}\" has the same token as another; each needs its own"));
                                } else {
                                    tokens.push(ApiToken { name, token: token.trim().to_owned(), role });
                                }
                            }
                        }
                    }
                    _ => self.err(
                        at,
                        "worker.mcp.auth of type bearer needs a non-empty \"token\" (e.g. token: ${LAMPLIGHTER_TOKEN}) or a list of \"tokens\" with name, token and role".into(),
                    ),
                }
                match (kind, oauth) {
                    ("oauth", Some(oauth)) => McpAuth::OAuth { oauth, tokens },
                    ("oauth", None) => McpAuth::None,
                    _ if tokens.is_empty() => McpAuth::None,
                    _ => McpAuth::Bearer { tokens },
                }
            }
            Some(o) => {
                let hint = crate::diag::did_you_mean(o, ["none", "bearer", "oauth"]);
                self.err(
                    &["worker", "mcp", "auth", "type"],
                    format!("worker.mcp.auth.type \"{o}\" is not one of none, bearer, oauth{hint}"),
                );
                McpAuth::None
            }
        }
    }

    /// `worker.mcp.auth.oauth`: an issuer and an audience that are URLs (`http` only on
    /// loopback: a token's keys and the clients' redirects must not cross a network in clear),
    /// three distinct scopes, a leeway.
    fn oauth(&mut self, o: &raw::OAuth) -> Option<OAuthSettings> {
        let at = |k: &'static str| ["worker", "mcp", "auth", "oauth", k];
        let mut ok = true;
        let mut url = |this: &mut Self, key: &'static str, v: &Option<String>, example: &str| -> String {
            let Some(v) = v.as_deref().map(str::trim).filter(|v| !v.is_empty() && !v.contains("${")) else {
                this.err(&at(key), format!("worker.mcp.auth.oauth needs \"{key}\" (e.g. {example})"));
                ok = false;
                return String::new();
            };
            match url_check(v) {
                Ok(()) => v.to_string(),
                Err(why) => {
                    this.err(&at(key), format!("worker.mcp.auth.oauth.{key} \"{v}\" {why}"));
                    ok = false;
                    String::new()
                }
            }
        };
        let issuer = url(self, "issuer", &o.issuer, "https://login.example.com/realms/ops");
        let audience = url(self, "audience", &o.audience, "https://lamplighter.example.com/mcp");
        let s = o.scopes.clone().unwrap_or_default();
        let scopes = [
            s.read.unwrap_or_else(|| "lamplighter:read".into()),
            s.operate.unwrap_or_else(|| "lamplighter:operate".into()),
            s.manage.unwrap_or_else(|| "lamplighter:manage".into()),
        ];
        for (i, sc) in scopes.iter().enumerate() {
            if sc.trim().is_empty() || sc.contains(char::is_whitespace) {
                self.err(
                    &at("scopes"),
                    format!("worker.mcp.auth.oauth.scopes.{}: \"{sc}\" must be one scope, without blanks", Role::ALL[i].as_str()),
                );
                ok = false;
            }
        }
        if scopes[0] == scopes[1] || scopes[1] == scopes[2] || scopes[0] == scopes[2] {
            self.err(&at("scopes"), "worker.mcp.auth.oauth.scopes: each role needs its own scope".into());
            ok = false;
        }
        let leeway = match o.leeway.as_deref() {
            None => Duration::from_secs(60),
            Some(l) => match humantime::parse_duration(l.trim()) {
                Ok(d) if d <= Duration::from_secs(600) => d,
                Ok(_) => {
                    self.err(&at("leeway"), format!("worker.mcp.auth.oauth.leeway \"{l}\" is more than 10m"));
                    ok = false;
                    Duration::ZERO
                }
                Err(e) => {
                    self.err(&at("leeway"), format!("worker.mcp.auth.oauth.leeway \"{l}\" is not a duration ({e}); write e.g. \"60s\""));
                    ok = false;
                    Duration::ZERO
                }
            },
        };
        let token_audiences: Vec<String> =
            o.token_audiences.clone().unwrap_or_default().into_iter().map(|a| a.trim().to_string()).collect();
        if token_audiences.iter().any(String::is_empty) {
            self.err(&at("token_audiences"), "worker.mcp.auth.oauth.token_audiences: an empty audience".into());
            ok = false;
        }
        ok.then_some(OAuthSettings { issuer, audience, scopes, leeway, token_audiences })
    }

    fn tls(&mut self, tls: Option<&raw::Tls>, cwd: &Path) -> McpTls {
        let at: &[&str] = &["worker", "mcp", "tls"];
        let Some(t) = tls else { return McpTls::Off };
        let proxy = t.terminated_by_proxy.unwrap_or(false);
        match (&t.cert_file, &t.key_file, proxy) {
            (None, None, true) => {
                if t.client_ca_file.is_some() {
                    self.err(at, "worker.mcp.tls: client_ca_file needs the worker to serve TLS itself, not a proxy".into());
                }
                McpTls::Proxy
            }
            (Some(_), Some(_), true) => {
                self.err(at, "worker.mcp.tls: give cert_file and key_file, or terminated_by_proxy: true, not both".into());
                McpTls::Off
            }
            (Some(cert), Some(key), false) => {
                let files = McpTls::Files {
                    cert_file: cwd.join(cert),
                    key_file: cwd.join(key),
                    client_ca_file: t.client_ca_file.as_ref().map(|c| cwd.join(c)),
                };
                if let McpTls::Files { cert_file, key_file, client_ca_file } = &files {
                    for (key, path) in
                        [("cert_file", Some(cert_file)), ("key_file", Some(key_file)), ("client_ca_file", client_ca_file.as_ref())]
                    {
                        if let Some(p) = path
                            && let Err(e) = std::fs::metadata(p)
                        {
                            self.err(&["worker", "mcp", "tls", key], format!("worker.mcp.tls.{key}: cannot read {}: {e}", p.display()));
                        }
                    }
                }
                files
            }
            (None, None, false) => {
                self.err(at, "worker.mcp.tls needs cert_file and key_file (PEM), or terminated_by_proxy: true".into());
                McpTls::Off
            }
            _ => {
                self.err(at, "worker.mcp.tls needs both cert_file and key_file".into());
                McpTls::Off
            }
        }
    }

    fn manage_jobs(&mut self, m: Option<&raw::ManageJobs>, data_dir: &Path, cwd: &Path) -> ManageJobs {
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
            out.working_directories = dirs.iter().map(|d| cwd.join(d)).collect();
        }
        out
    }
}

/// An `https` URL with a host, or `http` on a loopback address: why not, else nothing.
fn url_check(v: &str) -> Result<(), String> {
    let Some((scheme, rest)) = v.split_once("://") else {
        return Err("is not a URL (write https://…)".into());
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    if host.is_empty() {
        return Err("has no host".into());
    }
    match scheme.to_ascii_lowercase().as_str() {
        "https" => Ok(()),
        "http" => {
            let loopback = host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
            if loopback { Ok(()) } else { Err("is plain http off loopback; write https://".into()) }
        }
        other => Err(format!("has scheme \"{other}\"; write https://")),
    }
}
