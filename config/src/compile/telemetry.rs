//! Compiles `telemetry`, `hooks` and `framework.log_level`.

use std::time::Duration;

use super::Compiler;
use crate::diag::Diagnostic;
use crate::load::keys;
use crate::observe::{DEFAULT_HOOK_PRIORITY, EventPattern, Exporter, HookBinding, OtlpProtocol, SignalConfig, TelemetryConfig};
use crate::raw;
use crate::yaml::Seg;

impl Compiler<'_> {
    pub(super) fn telemetry(&mut self, t: Option<&raw::Telemetry>) -> TelemetryConfig {
        let Some(t) = t else { return TelemetryConfig::default() };
        let signal = |c: &mut Self, name: &str, s: Option<&raw::Signal>| {
            let s = s.cloned().unwrap_or_default();
            let exporter = s.exporter.as_deref().and_then(|e| {
                if name == "metrics" && matches!(e.trim().to_ascii_lowercase().as_str(), "console" | "stdout") {
                    // The seed's own reference writes it; a warning, not an error, so that it loads.
                    c.warn(
                        &["telemetry", name, "exporter"],
                        format!(
                            "telemetry.metrics.exporter \"{e}\" would print metrics on the console, which is not built in: metrics are not \
                             pushed; scrape GET /metrics, or write exporter: otlp to push them"
                        ),
                    );
                    return Some(Exporter::None);
                }
                Exporter::parse(e, name).map_err(|e| c.err(&["telemetry", name, "exporter"], format!("telemetry.{name}.exporter {e}"))).ok()
            });
            if let Some(url) = &s.endpoint
                && !(url.starts_with("http://") || url.starts_with("https://"))
            {
                c.err(
                    &["telemetry", name, "endpoint"],
                    format!(
                        "telemetry.{name}.endpoint \"{url}\" is not an http(s) URL (e.g. http://localhost:4318/v1/{name}, or http://localhost:4317 over grpc)"
                    ),
                );
            }
            let protocol = s.protocol.as_deref().and_then(|p| {
                OtlpProtocol::parse(p).map_err(|e| c.err(&["telemetry", name, "protocol"], format!("telemetry.{name}.protocol {e}"))).ok()
            });
            SignalConfig { exporter, protocol, endpoint: s.endpoint }
        };
        let traces = signal(self, "traces", t.traces.as_ref());
        let metrics = signal(self, "metrics", t.metrics.as_ref());
        let logs = signal(self, "logs", t.logs.as_ref());
        let raw_traces = t.traces.clone().unwrap_or_default();
        let sample_ratio = raw_traces.sampling.as_ref().and_then(|s| match (s.strategy.as_deref(), s.ratio) {
            (None | Some("ratio" | "trace_id_ratio" | "traceidratio" | "parentbased_traceidratio"), Some(r))
                if (0.0..=1.0).contains(&r) =>
            {
                Some(r)
            }
            (None | Some("ratio" | "trace_id_ratio" | "traceidratio" | "parentbased_traceidratio"), r) => {
                self.err(
                    &["telemetry", "traces", "sampling", "ratio"],
                    format!("telemetry.traces.sampling.ratio must be between 0 and 1, not {r:?}"),
                );
                None
            }
            (Some("always_on"), _) => Some(1.0),
            (Some("always_off"), _) => Some(0.0),
            (Some(o), _) => {
                self.err(
                    &["telemetry", "traces", "sampling", "strategy"],
                    format!("telemetry.traces.sampling.strategy \"{o}\" is not one of always_on, always_off, trace_id_ratio"),
                );
                None
            }
        });
        let metrics_interval = t.metrics.as_ref().and_then(|m| m.export_interval_ms).map(|ms| {
            if ms < 100 {
                self.err(
                    &["telemetry", "metrics", "export_interval_ms"],
                    format!("telemetry.metrics.export_interval_ms must be at least 100, not {ms}"),
                );
            }
            Duration::from_millis(ms.max(100))
        });
        for (name, s) in [("traces", &t.traces), ("logs", &t.logs)] {
            if s.as_ref().is_some_and(|s| s.per_job.is_some()) {
                self.err(&["telemetry", name, "per_job"], format!("telemetry.{name}.per_job belongs under telemetry.metrics"));
            }
        }
        // Keys of one signal written under another: said, not dropped in silence.
        type IsSet = fn(&raw::Signal) -> bool;
        let misplaced: [(&str, &str, IsSet); 4] = [
            ("enable_sensitive_data", "traces", |s| s.enable_sensitive_data.is_some()),
            ("sampling", "traces", |s| s.sampling.is_some()),
            ("export_interval_ms", "metrics", |s| s.export_interval_ms.is_some()),
            ("min_level", "logs", |s| s.min_level.is_some()),
        ];
        for (key, home, set) in misplaced {
            for (name, s) in [("traces", &t.traces), ("metrics", &t.metrics), ("logs", &t.logs)] {
                if name != home && s.as_ref().is_some_and(set) {
                    self.warn(
                        &["telemetry", name, key],
                        format!("telemetry.{name}.{key} has no effect; it belongs under telemetry.{home}"),
                    );
                }
            }
        }
        let logs_min_level =
            t.logs.as_ref().and_then(|l| l.min_level.as_deref()).and_then(|l| self.level(&["telemetry", "logs", "min_level"], l));
        TelemetryConfig {
            enabled: t.enabled.unwrap_or(false),
            service_name: t.service_name.clone(),
            service_version: t.service_version.clone(),
            resource_attributes: t.resource_attributes.clone().unwrap_or_default(),
            traces,
            metrics,
            logs,
            sensitive_data: raw_traces.enable_sensitive_data.unwrap_or(false),
            sample_ratio,
            metrics_interval,
            metrics_per_job: t.metrics.as_ref().and_then(|m| m.per_job).unwrap_or(true),
            logs_min_level,
        }
    }

    /// Hook bindings, sorted by priority. Whether the plugin exports the hook is the worker's
    /// check: plugins are discovered at run time.
    pub(super) fn hooks(&mut self, h: Option<&raw::Hooks>) -> Vec<HookBinding> {
        let mut out = Vec::new();
        for (i, b) in h.and_then(|h| h.bindings.clone()).unwrap_or_default().into_iter().enumerate() {
            let at = |key: Option<&str>| {
                let mut p = [keys(&["hooks", "bindings"]), vec![Seg::Index(i)]].concat();
                p.extend(key.map(|k| Seg::Key(k.to_string())));
                p
            };
            let event = match EventPattern::parse(&b.event) {
                Ok(p) => p,
                Err(e) => {
                    let loc = self.loaded.sources.locate(&at(Some("event")));
                    self.diags.push(Diagnostic::error(loc, e));
                    continue;
                }
            };
            if b.plugin.trim().is_empty() || b.hook.trim().is_empty() {
                let loc = self.loaded.sources.locate(&at(None));
                self.diags.push(Diagnostic::error(loc, format!("hook binding for \"{}\" needs a plugin and a hook", b.event)));
                continue;
            }
            out.push(HookBinding { event, plugin: b.plugin, hook: b.hook, priority: b.priority.unwrap_or(DEFAULT_HOOK_PRIORITY) });
        }
        out.sort_by_key(|b| b.priority);
        out
    }

    /// The log output's level: `framework.log_level`; else, with the console exporter (the log
    /// output itself), `telemetry.logs.min_level` (the seed's console logs at that level). A
    /// minimum for OTLP (the exporter named, or left to the default) below the output's level
    /// is said: records below it are not made at all.
    pub(super) fn log_levels(&mut self, log_level: Option<String>, t: &TelemetryConfig) -> Option<String> {
        let Some(min) = t.logs_min_level.clone() else { return log_level };
        match t.logs.exporter {
            Some(Exporter::Console) => return log_level.or(Some(min)),
            Some(Exporter::None) => return log_level,
            Some(Exporter::Otlp) | None => {}
        }
        let rank = |l: &str| ["trace", "debug", "info", "warn", "error", "off"].iter().position(|x| *x == l);
        let output = log_level.clone().unwrap_or_else(|| "info".into());
        if rank(&min) < rank(&output) {
            self.warn(
                &["telemetry", "logs", "min_level"],
                format!(
                    "telemetry.logs.min_level \"{min}\" is below the log level \"{output}\" (framework.log_level): records below \
                     {output} are not made, so not exported either; lower framework.log_level too"
                ),
            );
        }
        log_level
    }

    /// A log level at `path`: tracing's names, or the seed's (.NET) ones.
    pub(super) fn level(&mut self, path: &[&str], l: &str) -> Option<String> {
        let v = match l.to_ascii_lowercase().as_str() {
            "trace" => "trace",
            "debug" => "debug",
            "info" | "information" => "info",
            "warn" | "warning" => "warn",
            "error" | "critical" => "error",
            "none" | "off" => "off",
            _ => {
                self.err(path, format!("log level \"{l}\" is not one of trace, debug, info, warn, error, off"));
                return None;
            }
        };
        Some(v.to_string())
    }
}
