//! Compiles `plugins.wasm`.

use std::time::Duration;

use super::{Compiler, WASM_CAPABILITIES, WasmConfig, duration};
use crate::diag::did_you_mean;
use crate::raw;

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
        WasmConfig {
            fuel: w.fuel.filter(|f| *f > 0).unwrap_or(1_000_000),
            memory_bytes: memory_mb.clamp(1, 4096) * 1024 * 1024,
            timeout,
            capabilities,
            plugin_config: w.config.unwrap_or_default(),
        }
    }
}
