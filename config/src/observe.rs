//! The `telemetry` and `hooks` sections, resolved: where traces, metrics and logs go (SPEC §10),
//! and hook bindings with their event patterns (SPEC §7). Patterns are parsed and matched here
//! so that validation and the runtime share one rule.

use std::collections::BTreeMap;
use std::time::Duration;

/// Where one signal goes (`telemetry.<signal>.exporter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exporter {
    /// OTLP to the signal's endpoint, over HTTP (protobuf) or gRPC ([`OtlpProtocol`]).
    Otlp,
    /// One line per span on standard error (traces); the log output itself (logs).
    Console,
    None,
}

impl Exporter {
    /// An exporter name for `signal` (`traces`, `metrics`, `logs`); the error says what is
    /// allowed, for the caller to put after where the name came from.
    pub fn parse(s: &str, signal: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "otlp" => Ok(Self::Otlp),
            "console" | "stdout" if signal != "metrics" => Ok(Self::Console),
            "console" | "stdout" => Err("\"console\" is not supported for metrics: use otlp, or scrape GET /metrics".to_string()),
            "none" => Ok(Self::None),
            seed @ ("zipkin" | "jaeger") => Err(format!(
                "\"{seed}\" is not built in: Jaeger and Zipkin both take OTLP (Jaeger natively, Zipkin through an OpenTelemetry \
                 collector); write otlp and point the endpoint at them"
            )),
            other => Err(format!("\"{other}\" is not one of otlp, console, none")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Otlp => "otlp",
            Self::Console => "console",
            Self::None => "none",
        }
    }
}

/// OTLP's wire (`telemetry.<signal>.protocol`, `OTEL_EXPORTER_OTLP_[<SIGNAL>_]PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `http/protobuf`: `POST <endpoint>/v1/<signal>`, port 4318 by convention.
    HttpProtobuf,
    /// `grpc`: the collector services on one endpoint, port 4317 by convention.
    Grpc,
}

impl OtlpProtocol {
    /// A protocol name as OpenTelemetry spells it; the error says what is allowed.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "http/protobuf" => Ok(Self::HttpProtobuf),
            "grpc" => Ok(Self::Grpc),
            "http/json" => Err("\"http/json\" is not built in: use http/protobuf (port 4318) or grpc (port 4317)".into()),
            other => Err(format!("\"{other}\" is not one of http/protobuf, grpc")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::HttpProtobuf => "http/protobuf",
            Self::Grpc => "grpc",
        }
    }
}

/// One signal's settings. `exporter: None` in the YAML leaves the choice to `OTEL_*_EXPORTER`.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalConfig {
    pub exporter: Option<Exporter>,
    /// `None`: the `OTEL_EXPORTER_OTLP_*PROTOCOL` variables, then http/protobuf.
    pub protocol: Option<OtlpProtocol>,
    /// A URL (`http://host:4318/v1/traces`, or `http://host:4318`, which gets the signal's path;
    /// over gRPC `http://host:4317`); unset: `OTEL_EXPORTER_OTLP_*_ENDPOINT`, then localhost.
    pub endpoint: Option<String>,
}

/// The `telemetry` section.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// `telemetry.enabled` (default false): nothing is exported when false; `/metrics` still
    /// serves the same metrics.
    pub enabled: bool,
    pub service_name: Option<String>,
    pub service_version: Option<String>,
    pub resource_attributes: BTreeMap<String, String>,
    pub traces: SignalConfig,
    pub metrics: SignalConfig,
    pub logs: SignalConfig,
    /// Prompts and completions on model-call spans (`traces.enable_sensitive_data`).
    pub sensitive_data: bool,
    /// The share of traces kept (`traces.sampling`: always_on, always_off, ratio).
    pub sample_ratio: Option<f64>,
    /// How often metrics are pushed (`metrics.export_interval_ms`).
    pub metrics_interval: Option<Duration>,
    /// `metrics.per_job` (default true): the per-job gauges (last success, next fire,
    /// consecutive failures, oldest running run, oldest wait for a decision), one series per
    /// job each. Off for very large job counts: the other metrics keep their `job` label,
    /// these are left out.
    pub metrics_per_job: bool,
    /// `logs.min_level`: the lowest level of the log records exported over OTLP (tracing's
    /// names: `trace` … `error`, `off`). With the console exporter it is the log output's level
    /// where `framework.log_level` is not set.
    pub logs_min_level: Option<String>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        let off = SignalConfig { exporter: None, protocol: None, endpoint: None };
        Self {
            enabled: false,
            service_name: None,
            service_version: None,
            resource_attributes: BTreeMap::new(),
            traces: off.clone(),
            metrics: off.clone(),
            logs: off,
            sensitive_data: false,
            sample_ratio: None,
            metrics_interval: None,
            metrics_per_job: true,
            logs_min_level: None,
        }
    }
}

/// When a hook runs relative to its operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Timing {
    /// Before the operation; a hook may cancel it.
    Before,
    /// After it succeeded.
    After,
    /// After it failed.
    OnError,
    /// Wraps the operation: called before it (with `phase: before`; may cancel it, or replace
    /// its input with `{"input": …}`) and after it, whatever the outcome (`phase: after`).
    Around,
}

impl Timing {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Before => "before",
            Self::After => "after",
            Self::OnError => "onerror",
            Self::Around => "around",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "before" => Self::Before,
            "after" => Self::After,
            "onerror" => Self::OnError,
            "around" => Self::Around,
            _ => return None,
        })
    }
}

/// An event name or pattern: `{domain}:{component}:{action}:{timing}`, `*` matching any one
/// segment. A pattern of three segments matches every timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPattern {
    segments: Vec<String>,
}

impl EventPattern {
    pub fn parse(s: &str) -> Result<Self, String> {
        let segments: Vec<String> = s.split(':').map(str::to_string).collect();
        if !(3..=4).contains(&segments.len()) || segments.iter().any(|p| p.is_empty() || p.contains(char::is_whitespace)) {
            return Err(format!(
                "hook event \"{s}\" is not domain:component:action:timing (e.g. \"agent:*:model-call:before\"; `*` matches one segment)"
            ));
        }
        if let Some(t) = segments.get(3)
            && t != "*"
            && Timing::parse(t).is_none()
        {
            return Err(format!("hook event \"{s}\": timing \"{t}\" is not one of before, after, onerror, around, *"));
        }
        Ok(Self { segments })
    }

    /// Whether the event `domain:component:action` at `timing` matches. `around` is called
    /// only for bindings that name it (on both sides of the operation); a pattern of three
    /// segments or `*` matches `before`, `after` and `onerror`.
    pub fn matches(&self, event: [&str; 3], timing: Timing) -> bool {
        let seg = |i: usize, v: &str| self.segments[i] == "*" || self.segments[i] == v;
        let timing_ok = match self.segments.get(3).map(String::as_str) {
            None | Some("*") => timing != Timing::Around,
            Some(t) => Timing::parse(t) == Some(timing),
        };
        timing_ok && (0..3).all(|i| seg(i, event[i]))
    }

    /// The timing the pattern names, if it names one.
    pub fn timing(&self) -> Option<Timing> {
        self.segments.get(3).and_then(|t| Timing::parse(t))
    }
}

impl std::fmt::Display for EventPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.segments.join(":"))
    }
}

/// The default hook priority; lower runs first.
pub const DEFAULT_HOOK_PRIORITY: i32 = 500;

/// One `hooks.bindings` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookBinding {
    pub event: EventPattern,
    pub plugin: String,
    pub hook: String,
    pub priority: i32,
}

impl HookBinding {
    /// `plugin.hook`, as logs and errors name it.
    pub fn label(&self) -> String {
        format!("{}.{}", self.plugin, self.hook)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_segment_by_segment() {
        let cases = [
            ("agent:*:model-call:before", ["agent", "writer", "model-call"], Timing::Before, true),
            ("agent:*:model-call:before", ["agent", "writer", "model-call"], Timing::After, false),
            ("agent:*:model-call:before", ["agent", "writer", "tool-use"], Timing::Before, false),
            ("*:*:*:*", ["plugin", "file-read", "action"], Timing::OnError, true),
            ("plugin:file-read:action:onerror", ["plugin", "file-read", "action"], Timing::OnError, true),
            ("plugin:file-read:action:onerror", ["plugin", "file-save", "action"], Timing::OnError, false),
            ("orchestration:group-chat:start", ["orchestration", "group-chat", "start"], Timing::Before, true),
            ("orchestration:group-chat:end", ["orchestration", "group-chat", "start"], Timing::After, false),
            // `around` is called as itself, on both sides, only for bindings that name it.
            ("scheduler:nightly:job-execute:around", ["scheduler", "nightly", "job-execute"], Timing::Around, true),
            ("scheduler:nightly:job-execute:around", ["scheduler", "nightly", "job-execute"], Timing::Before, false),
            ("scheduler:nightly:job-execute:around", ["scheduler", "nightly", "job-execute"], Timing::After, false),
            ("scheduler:nightly:job-execute:*", ["scheduler", "nightly", "job-execute"], Timing::Around, false),
            ("scheduler:nightly:job-execute", ["scheduler", "nightly", "job-execute"], Timing::Around, false),
            // No partial-segment globbing: `*` is a whole segment.
            ("agent:writ*:model-call:before", ["agent", "writer", "model-call"], Timing::Before, false),
        ];
        for (pattern, event, timing, want) in cases {
            let p = EventPattern::parse(pattern).expect(pattern);
            assert_eq!(p.matches(event, timing), want, "{pattern} vs {event:?} {timing:?}");
        }
    }

    #[test]
    fn bad_patterns_are_refused_with_the_form() {
        for bad in ["", "agent", "agent:x", "a:b:c:d:e", "a::c:before", "a:b:c:later", "a:b c:d:before"] {
            let e = EventPattern::parse(bad).expect_err(bad);
            assert!(e.contains(bad), "{e}");
        }
    }
}
