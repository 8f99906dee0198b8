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
        let http_timeout = match http.timeout.as_deref().map(duration) {
            None => Duration::from_secs(10),
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
            let bare = h.strip_prefix("*.").unwrap_or(h);
            if bare.is_empty() || bare.contains(['/', ':', '*', ' ']) {
                let loc = self.loaded.sources.locate(&[keys(&["plugins", "wasm", "http", "allowed_hosts"]), vec![Seg::Index(i)]].concat());
                self.diags.push(Diagnostic::error(
                    loc,
                    format!("plugins.wasm.http.allowed_hosts: \"{h}\" is not a host name (write api.example.com, or *.example.com for its subdomains)"),
                ));
            }
        }
        let granted = |c: &str| capabilities.iter().any(|x| x == c);
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
