//! Compiles `plugins.wasm`.

use std::time::Duration;

use super::{Compiler, WASM_CAPABILITIES, WasmConfig, duration};
use crate::diag::{Diagnostic, did_you_mean};
use crate::load::keys;
use crate::raw;
use crate::yaml::Seg;

impl Compiler<'_> {
    pub(super) fn wasm(&mut self, w: Option<&raw::WasmPlugins>) -> WasmConfig {
        let path = |k: &'static str| ["plugins", "wasm", k];
        let w = w.cloned().unwrap_or_default();
        let timeout = match w.timeout.as_deref().map(duration) {
            None => Duration::from_secs(5),
            Some(Ok(d)) if !d.is_zero() => d,
            Some(Ok(_)) => {
                self.err(&path("timeout"), "plugins.wasm.timeout must be more than zero".to_string());
                Duration::from_secs(5)
            }
            Some(Err(e)) => {
                self.err(&path("timeout"), e);
                Duration::from_secs(5)
            }
        };
        if w.fuel == Some(0) {
            self.err(&path("fuel"), "plugins.wasm.fuel must be more than zero".to_string());
        }
        let memory_mb = w.memory_mb.unwrap_or(16);
        if !(1..=4096).contains(&memory_mb) {
            self.err(&path("memory_mb"), format!("plugins.wasm.memory_mb must be between 1 and 4096, not {memory_mb}"));
        }
        let capabilities = w.capabilities.unwrap_or_default();
        for cap in &capabilities {
            if !WASM_CAPABILITIES.contains(&cap.as_str()) {
                let hint = did_you_mean(cap, WASM_CAPABILITIES.iter().copied());
                self.err(&path("capabilities"), format!("unknown capability \"{cap}\"{hint}; known: {}", WASM_CAPABILITIES.join(", ")));
            }
        }
        let http = w.http.unwrap_or_default();
        // Unset: the call's own wall time, which bounds it anyway.
        let http_timeout = match http.timeout.as_deref().map(duration) {
            None => timeout,
            Some(Ok(d)) if !d.is_zero() => d,
            Some(Ok(_)) => {
                self.err(&["plugins", "wasm", "http", "timeout"], "plugins.wasm.http.timeout must be more than zero".to_string());
                Duration::from_secs(10)
            }
            Some(Err(e)) => {
                self.err(&["plugins", "wasm", "http", "timeout"], e);
                Duration::from_secs(10)
            }
        };
        let max_kb = http.max_response_kb.unwrap_or(1024);
        if !(1..=1024 * 1024).contains(&max_kb) {
            self.err(
                &["plugins", "wasm", "http", "max_response_kb"],
                format!("plugins.wasm.http.max_response_kb must be between 1 and 1048576, not {max_kb}"),
            );
        }
        let allowed_hosts = http.allowed_hosts.unwrap_or_default();
        for (i, h) in allowed_hosts.iter().enumerate() {
            if !host_entry_ok(h) {
                let loc = self.loaded.sources.locate(&[keys(&["plugins", "wasm", "http", "allowed_hosts"]), vec![Seg::Index(i)]].concat());
                self.diags.push(Diagnostic::error(
                    loc,
                    format!(
                        "plugins.wasm.http.allowed_hosts: \"{h}\" is not a host (write api.example.com, api.example.com:8443, *.example.com \
                         for its subdomains, or an IP address such as 127.0.0.1:9000)"
                    ),
                ));
            }
        }
        let granted = |c: &str| capabilities.iter().any(|x| x == c);
        if http.timeout.is_some() && http_timeout > timeout {
            self.warn(
                &["plugins", "wasm", "http", "timeout"],
                format!(
                    "plugins.wasm.http.timeout ({}) is longer than plugins.wasm.timeout ({}), which stops the whole call first",
                    humantime::format_duration(http_timeout),
                    humantime::format_duration(timeout)
                ),
            );
        }
        if (granted("ai") || granted("mcp")) && timeout < Duration::from_secs(30) {
            self.warn(
                &path("timeout"),
                format!(
                    "plugins.wasm.timeout ({}) bounds ai_complete and mcp_call too, and a model or tool call often takes longer: raise it \
                     (e.g. 2m) for plugins that call them",
                    humantime::format_duration(timeout)
                ),
            );
        }
        if granted("http-request") && allowed_hosts.is_empty() {
            self.warn(
                &path("capabilities"),
                "http-request is allowed but plugins.wasm.http.allowed_hosts is empty: every request will be refused".to_string(),
            );
        }
        let ai = w.ai.unwrap_or_default();
        if ai.max_tokens == Some(0) {
            self.err(&["plugins", "wasm", "ai", "max_tokens"], "plugins.wasm.ai.max_tokens must be more than zero".to_string());
        }
        let mcp_tools = w.mcp.and_then(|m| m.tools).unwrap_or_default();
        for (i, t) in mcp_tools.iter().enumerate() {
            if !t.contains('.') || t.starts_with('.') {
                let loc = self.loaded.sources.locate(&[keys(&["plugins", "wasm", "mcp", "tools"]), vec![Seg::Index(i)]].concat());
                self.diags.push(Diagnostic::error(loc, format!("plugins.wasm.mcp.tools: \"{t}\" is not server.tool or server.*")));
            }
        }
        if granted("mcp") && mcp_tools.is_empty() {
            self.warn(
                &path("capabilities"),
                "mcp is allowed but plugins.wasm.mcp.tools is empty: every MCP call will be refused".to_string(),
            );
        }
        WasmConfig {
            fuel: w.fuel.filter(|f| *f > 0).unwrap_or(1_000_000),
            memory_bytes: memory_mb.clamp(1, 4096) * 1024 * 1024,
            timeout,
            capabilities,
            plugin_config: w.config.unwrap_or_default(),
            http_allowed_hosts: allowed_hosts,
            http_timeout,
            http_max_response_bytes: usize::try_from(max_kb.clamp(1, 1024 * 1024) * 1024).unwrap_or(usize::MAX),
            ai_models: ai.models.unwrap_or_default(),
            ai_max_tokens: ai.max_tokens.filter(|t| *t > 0).unwrap_or(1024),
            mcp_tools,
        }
    }
}

/// An `allowed_hosts` entry: a host name, `*.` and a name of two labels or more, an IPv4
/// address, or `[IPv6]`, each with an optional `:port`.
fn host_entry_ok(e: &str) -> bool {
    let e = e.trim();
    let (host, port) = match e.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, after)) => return v6.parse::<std::net::Ipv6Addr>().is_ok() && (after.is_empty() || port_ok(after.strip_prefix(':'))),
            None => return false,
        },
        None => match e.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (e, None),
        },
    };
    if port.is_some() && !port_ok(port) {
        return false;
    }
    let host = host.trim_end_matches('.');
    let label_ok = |l: &str| !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    match host.strip_prefix("*.") {
        // A wildcard over a name, not over addresses or a whole top-level domain.
        Some(suffix) => {
            let labels: Vec<&str> = suffix.split('.').collect();
            labels.len() >= 2 && labels.iter().all(|l| label_ok(l)) && labels.last().is_some_and(|l| !l.chars().all(|c| c.is_ascii_digit()))
        }
        None => host.parse::<std::net::Ipv4Addr>().is_ok() || (!host.is_empty() && host.split('.').all(label_ok)),
    }
}

fn port_ok(p: Option<&str>) -> bool {
    p.is_some_and(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn allowed_host_entries() {
        for ok in [
            "api.example.com",
            "api.example.com:8443",
            "*.example.com",
            "127.0.0.1:9000",
            "[::1]:8080",
            "[2001:db8::1]",
            "localhost",
            "API.Example.com.",
        ] {
            assert!(super::host_entry_ok(ok), "{ok}");
        }
        for bad in [
            "",
            "*",
            "*.com",
            "*.0.0.1",
            "https://x.example",
            "x.example/path",
            "a b",
            "x.example:0",
            "x.example:99999",
            "[::1",
            "user@x.example",
            "*.",
            "x.*.example",
        ] {
            assert!(!super::host_entry_ok(bad), "{bad}");
        }
    }
}
