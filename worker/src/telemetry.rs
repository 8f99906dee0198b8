//! Telemetry (SPEC §10): the `tracing` subscriber (logs on standard error, human or JSON),
//! and OpenTelemetry — logs through `tracing`, spans and metrics through the tracer and meter
//! the job engine's [`Observer`] records on — exported over OTLP, over HTTP (protobuf, from the
//! SDK's threads with a blocking client) or gRPC (tonic, on the worker's runtime), as the
//! `telemetry` section and the standard `OTEL_*` variables say. The same metrics are kept for `GET
//! /metrics` whether or not they are pushed. The per-job gauges are the exception: `/metrics`
//! renders them from the observer's own table (every job), and OTLP gets them through a meter
//! provider of their own, bounded by [`OTLP_JOB_SERIES`].
//!
//! Telemetry never blocks or fails a run: spans and logs wait in bounded batch queues (8,192
//! spans, 2,048 log records; what comes while the queue is full is dropped) and are sent from
//! the SDK's own threads; an export that fails is reported at most once a minute per signal.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lamplighter_config::{Exporter, OtlpProtocol, SignalConfig, TelemetryConfig};
use lamplighter_jobs::events::Observer;
use lamplighter_plugins::Registry;
use opentelemetry::KeyValue;
use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::tonic_types::transport::ClientTlsConfig;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{
    Instrument, InstrumentKind, ManualReader, PeriodicReader, Pipeline, SdkMeterProvider, Stream, Temporality,
};
use opentelemetry_sdk::trace::{BatchConfig, BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer, Registry as Subscriber};

use crate::LogFormat;

/// What `lamplighter run` keeps of telemetry: the observer the engine reports to, the reader
/// behind `/metrics`, and the providers to flush at exit.
pub(crate) struct Telemetry {
    pub(crate) observer: Arc<Observer>,
    pub(crate) metrics: Arc<PullReader>,
    meters: SdkMeterProvider,
    job_meters: Option<SdkMeterProvider>,
    tracer: Option<SdkTracerProvider>,
    logger: Option<SdkLoggerProvider>,
}

/// Problems with the telemetry settings that only the environment shows (e.g. an OTLP
/// protocol this build does not speak). `config validate` reports them as errors; a running
/// worker exports nothing and says why, and everything else runs.
pub(crate) fn check(t: &TelemetryConfig, env: impl Fn(&str) -> Option<String>) -> Option<String> {
    if !t.enabled {
        return None;
    }
    for (signal, s) in [("traces", &t.traces), ("metrics", &t.metrics), ("logs", &t.logs)] {
        if let Err(e) = wire(s, signal, &env) {
            return Some(e);
        }
    }
    for (signal, var) in [("traces", "OTEL_TRACES_EXPORTER"), ("metrics", "OTEL_METRICS_EXPORTER"), ("logs", "OTEL_LOGS_EXPORTER")] {
        if let Some(v) = env(var)
            && let Err(e) = Exporter::parse(&v, signal)
        {
            return Some(format!("{var}: {e}"));
        }
    }
    None
}

/// The exporter for a signal: the config's, else `OTEL_<SIGNAL>_EXPORTER`, else OTLP; none when
/// telemetry is off (or `OTEL_SDK_DISABLED=true`).
fn exporter(t: &TelemetryConfig, s: &SignalConfig, signal: &str, env: &impl Fn(&str) -> Option<String>) -> Exporter {
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if !t.enabled || disabled {
        return Exporter::None;
    }
    s.exporter
        .or_else(|| env(&format!("OTEL_{}_EXPORTER", signal.to_ascii_uppercase())).and_then(|v| Exporter::parse(&v, signal).ok()))
        .unwrap_or(Exporter::Otlp)
}

/// A signal's OTLP wire: the config's `protocol`, else `OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL`,
/// else `OTEL_EXPORTER_OTLP_PROTOCOL`; with none set, the convention of the endpoint's port
/// (4317 is gRPC's, as in the seed's `telemetry.yaml`: HTTP sent there is lost without a
/// word), else http/protobuf. The endpoint is the signal's, else the variables'.
fn wire(s: &SignalConfig, signal: &str, env: &impl Fn(&str) -> Option<String>) -> Result<OtlpProtocol, String> {
    if let Some(p) = s.protocol {
        return Ok(p);
    }
    let upper = signal.to_ascii_uppercase();
    let specific = format!("OTEL_EXPORTER_OTLP_{upper}_PROTOCOL");
    for var in [specific.as_str(), "OTEL_EXPORTER_OTLP_PROTOCOL"] {
        if let Some(p) = env(var).filter(|p| !p.trim().is_empty()) {
            return OtlpProtocol::parse(&p).map_err(|e| format!("{var}: {e}"));
        }
    }
    let endpoint = s.endpoint.clone().or_else(|| {
        [format!("OTEL_EXPORTER_OTLP_{upper}_ENDPOINT"), "OTEL_EXPORTER_OTLP_ENDPOINT".to_string()]
            .iter()
            .find_map(|var| env(var).filter(|e| !e.trim().is_empty()))
    });
    Ok(match endpoint.as_deref().and_then(port_of) {
        Some(4317) => OtlpProtocol::Grpc,
        _ => OtlpProtocol::HttpProtobuf,
    })
}

/// The port written in a URL (`http://collector:4317/…` → 4317); none when it has none.
fn port_of(url: &str) -> Option<u16> {
    let rest = url.trim().split_once("://").map_or(url.trim(), |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next()?;
    let (_, port) = authority.rsplit_once(':')?;
    // `[::1]` alone has colons but no port after its bracket.
    if port.contains(']') { None } else { port.parse().ok() }
}

/// Builds a signal's OTLP exporter (`$builder`: `SpanExporter`, `MetricExporter` or
/// `LogExporter`) for its wire. Over gRPC the channel's task is spawned on `rt` (the worker's
/// runtime, which outlives every export); an `https` endpoint trusts the system's roots.
macro_rules! otlp_exporter {
    ($builder:ident, $signal:literal, $s:expr, $wire:expr, $rt:expr) => {
        match $wire {
            OtlpProtocol::HttpProtobuf => {
                let mut e = opentelemetry_otlp::$builder::builder().with_http().with_protocol(Protocol::HttpBinary);
                if let Some(url) = endpoint($s, $signal) {
                    e = e.with_endpoint(url);
                }
                e.build()
            }
            OtlpProtocol::Grpc => {
                let _on_the_runtime = $rt.enter();
                let mut e =
                    opentelemetry_otlp::$builder::builder().with_tonic().with_tls_config(ClientTlsConfig::new().with_native_roots());
                if let Some(url) = &$s.endpoint {
                    e = e.with_endpoint(url.trim_end_matches('/'));
                }
                e.build()
            }
        }
    };
}

/// The configured endpoint of a signal over HTTP; a bare `http://host:port` gets the signal's
/// path.
fn endpoint(s: &SignalConfig, signal: &str) -> Option<String> {
    let url = s.endpoint.as_ref()?.trim_end_matches('/');
    let path_start = url.find("://").map(|i| i + 3).and_then(|i| url[i..].find('/').map(|j| i + j));
    Some(match path_start {
        Some(_) => url.to_string(),
        None => format!("{url}/v1/{signal}"),
    })
}

impl Telemetry {
    /// Sets up logging and OpenTelemetry for `lamplighter run`. Call outside the async runtime
    /// (the OTLP/HTTP client is a blocking one, driven from the SDK's threads); `rt` is the
    /// worker's runtime, which gRPC exporters run on: shut this down before it. An exporter that
    /// cannot be built is reported and left out; nothing here stops the worker.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn init(
        t: &TelemetryConfig,
        format: LogFormat,
        level: Option<&str>,
        worker: &str,
        registry: Arc<Registry>,
        broken: Option<&str>,
        rt: &tokio::runtime::Handle,
    ) -> Telemetry {
        let env = |n: &str| std::env::var(n).ok();
        let resource = resource(t, worker, &env);
        let mut problems = Vec::new();
        let on = |signal: &str, s: &SignalConfig| if broken.is_some() { Exporter::None } else { exporter(t, s, signal, &env) };
        // `check` refused an unknown protocol (export is then off): http/protobuf is not used.
        let wire_of = |signal: &str, s: &SignalConfig| wire(s, signal, &env).unwrap_or(OtlpProtocol::HttpProtobuf);

        let metrics = Arc::new(PullReader::default());
        let mut meters = SdkMeterProvider::builder().with_resource(resource.clone()).with_reader(SharedReader(metrics.clone()));
        // The per-job gauges go to OTLP through a provider of their own, whose view lets them
        // have a series for each of many jobs; `/metrics` serves them from the observer.
        let mut job_meters = None;
        if on("metrics", &t.metrics) == Exporter::Otlp {
            let periodic = || -> Result<PeriodicReader<_>, opentelemetry_otlp::ExporterBuildError> {
                let e = otlp_exporter!(MetricExporter, "metrics", &t.metrics, wire_of("metrics", &t.metrics), rt)?;
                let mut r = PeriodicReader::builder(Warned::new(e, Exported::Metrics));
                if let Some(i) = t.metrics_interval {
                    r = r.with_interval(i);
                }
                Ok(r.build())
            };
            match periodic().and_then(|all| Ok((all, periodic()?))) {
                Ok((all, per_job)) => {
                    meters = meters.with_reader(all);
                    job_meters = Some(
                        SdkMeterProvider::builder()
                            .with_resource(resource.clone())
                            .with_reader(per_job)
                            .with_view(|_: &Instrument| Stream::builder().with_cardinality_limit(OTLP_JOB_SERIES).build().ok())
                            .build(),
                    );
                }
                Err(e) => problems.push(format!("cannot export metrics: {e}")),
            }
        }
        let meters = meters.build();

        let tracer = match on("traces", &t.traces) {
            Exporter::None => None,
            kind => {
                let sampler = match t.sample_ratio {
                    Some(r) => Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(r))),
                    None => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
                };
                let b = SdkTracerProvider::builder().with_resource(resource.clone()).with_sampler(sampler);
                let b = match kind {
                    Exporter::Console => Some(b.with_simple_exporter(ConsoleSpans)),
                    _ => match otlp_exporter!(SpanExporter, "traces", &t.traces, wire_of("traces", &t.traces), rt) {
                        Ok(e) => Some(b.with_span_processor(
                            BatchSpanProcessor::builder(Warned::new(e, Exported::Traces)).with_batch_config(batch_config(&env)).build(),
                        )),
                        Err(e) => {
                            problems.push(format!("cannot export traces: {e}"));
                            None
                        }
                    },
                };
                b.map(|b| b.build())
            }
        };

        let logger = match on("logs", &t.logs) {
            Exporter::Otlp => match otlp_exporter!(LogExporter, "logs", &t.logs, wire_of("logs", &t.logs), rt) {
                Ok(e) => {
                    Some(SdkLoggerProvider::builder().with_resource(resource).with_batch_exporter(Warned::new(e, Exported::Logs)).build())
                }
                Err(e) => {
                    problems.push(format!("cannot export logs: {e}"));
                    None
                }
            },
            // `console`: the log output itself.
            _ => None,
        };

        let export_from = t.logs_min_level.as_deref().and_then(|l| l.parse::<LevelFilter>().ok()).unwrap_or(LevelFilter::TRACE);
        init_subscriber(format, level, logger.as_ref().map(|l| (l, export_from)));
        if let Some(why) = broken {
            tracing::warn!("telemetry export is disabled: {why}");
        }
        for p in problems {
            tracing::warn!("{p}");
        }
        // Spans are made by the events module with this tracer directly (not through `tracing`
        // spans and a layer): nothing per poll but a thread-local context swap.
        let spans = tracer.as_ref().map(|t| BoxedTracer::new(Box::new(t.tracer("lamplighter"))));
        let meter = meters.meter("lamplighter");
        export_failures(&meter);
        let observer = Observer::new(&meter, spans, Some(registry));
        if let Some(p) = &job_meters {
            observer.export_job_gauges(&p.meter("lamplighter"), OTLP_JOB_SERIES);
        }
        let _ = metrics.observer.set(observer.clone());
        Telemetry { observer, metrics, meters, job_meters, tracer, logger }
    }

    /// Flushes and stops the exporters (outside the async runtime), all at once: with a
    /// collector gone, each waits for its own bound (3 s asked; the SDK's metric readers keep
    /// to their own 5 s), not one after the other.
    pub(crate) fn shutdown(self) {
        let Telemetry { tracer, logger, meters, job_meters, .. } = self;
        let bound = Duration::from_secs(3);
        std::thread::scope(|s| {
            if let Some(t) = &tracer {
                s.spawn(|| t.shutdown_with_timeout(bound));
            }
            if let Some(l) = &logger {
                s.spawn(|| l.shutdown_with_timeout(bound));
            }
            if let Some(p) = &job_meters {
                s.spawn(|| p.shutdown_with_timeout(bound));
            }
            let _ = meters.shutdown_with_timeout(bound);
        });
    }
}

/// The span batch queue: the SDK's `OTEL_BSP_*` variables where set; otherwise room for 8,192
/// spans (a burst of a thousand runs makes two to several spans each), sent 2,048 to a request,
/// so that a burst is exported after it, on the scheduled delay, rather than in 512-span
/// requests while its runs are still starting.
fn batch_config(env: &impl Fn(&str) -> Option<String>) -> BatchConfig {
    let mut b = BatchConfigBuilder::default();
    if env("OTEL_BSP_MAX_QUEUE_SIZE").is_none() {
        b = b.with_max_queue_size(8192);
    }
    if env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE").is_none() {
        b = b.with_max_export_batch_size(2048);
    }
    b.build()
}

fn resource(t: &TelemetryConfig, worker: &str, env: &impl Fn(&str) -> Option<String>) -> Resource {
    let name = t.service_name.clone().or_else(|| env("OTEL_SERVICE_NAME")).unwrap_or_else(|| "lamplighter".into());
    let version = t.service_version.clone().unwrap_or_else(|| env!("CARGO_PKG_VERSION").into());
    // The builder reads OTEL_RESOURCE_ATTRIBUTES; the config's own attributes win.
    Resource::builder()
        .with_service_name(name)
        .with_attribute(KeyValue::new("service.version", version))
        .with_attribute(KeyValue::new("service.instance.id", worker.to_string()))
        .with_attributes(t.resource_attributes.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())))
        .build()
}

/// The filter for logs: `RUST_LOG`, else the config's level, quiet for noisy dependencies.
fn log_filter(level: Option<&str>) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        let l = level.unwrap_or("info");
        // rmcp logs each session's start, end and notifications at INFO, with a debug dump of
        // the request: routine protocol traffic, not news for an operator.
        EnvFilter::new(format!("{l},sqlx=warn,apalis=warn,apalis_sqlite=warn,apalis_core=warn,rmcp=warn"))
    })
}

/// Drops rmcp's ERROR for a client that hung up before its answer was sent (`lampctl` after
/// its answer, a `curl` stopped with ^C): the client's doing, nothing an operator can act on.
/// Every other rmcp warning and error passes.
struct RoutineHangUps;

/// What rmcp says when the peer has gone while a response drains.
const HANG_UP: &str = "failed to send pending response during drain";

impl<S: tracing::Subscriber> Layer<S> for RoutineHangUps {
    fn event_enabled(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) -> bool {
        !is_hang_up(event.metadata().target(), *event.metadata().level(), |v| event.record(v))
    }
}

/// Whether an event is rmcp's hang-up error; `record` shows the event's fields to a visitor.
fn is_hang_up(target: &str, level: tracing::Level, record: impl FnOnce(&mut dyn tracing::field::Visit)) -> bool {
    struct Message(bool);
    impl tracing::field::Visit for Message {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}") == HANG_UP;
            }
        }
    }
    if level != tracing::Level::ERROR || !target.starts_with("rmcp") {
        return false;
    }
    let mut m = Message(false);
    record(&mut m);
    m.0
}

/// Logging only (the one-shot commands).
pub(crate) fn init_logging(format: LogFormat, level: Option<&str>) {
    init_subscriber(format, level, None);
}

/// `logger`: the OTLP log pipeline and the lowest level it exports (`telemetry.logs.min_level`).
fn init_subscriber(format: LogFormat, level: Option<&str>, logger: Option<(&SdkLoggerProvider, LevelFilter)>) {
    // Colours only for a person at a terminal, not for journald, a container log or a file.
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let fmt: Box<dyn Layer<Layered> + Send + Sync> = match format {
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
        LogFormat::Human => fmt.boxed(),
    };
    // Log records through the same pipeline; the exporters' own chatter stays out of it (their
    // HTTP client's events would otherwise be exported, and export more). The level filter is
    // one, for the whole subscriber: with an `EnvFilter` per layer, an event could vanish from
    // the log on standard error while the OTLP bridge handled it ("lamplighter ready" did, on
    // PostgreSQL with OTLP logs on; `tests/e2e/deploy.rs` runs that shape).
    let logs = logger.map(|(l, from)| {
        let exporters_own = Targets::new()
            .with_default(from)
            .with_target("opentelemetry", LevelFilter::OFF)
            .with_target("opentelemetry_sdk", LevelFilter::OFF)
            .with_target("opentelemetry_otlp", LevelFilter::OFF)
            .with_target("reqwest", LevelFilter::OFF)
            .with_target("hyper", LevelFilter::OFF)
            .with_target("hyper_util", LevelFilter::OFF)
            .with_target("h2", LevelFilter::OFF);
        opentelemetry_appender_tracing::layer::OpenTelemetryTracingBridge::new(l).with_filter(exporters_own)
    });
    let _ = tracing_subscriber::registry().with(log_filter(level)).with(fmt).with(logs).with(RoutineHangUps).try_init();
}

/// The registry under the global level filter: what the output layers sit on.
type Layered = tracing_subscriber::layer::Layered<EnvFilter, Subscriber>;

/// An exporter whose failures are reported at most once a minute per signal, however many
/// exporters carry it (an unreachable collector must not flood the log it may itself be
/// receiving).
#[derive(Debug)]
struct Warned<E> {
    inner: E,
    signal: Exported,
}

/// A signal exported over OTLP.
#[derive(Debug, Clone, Copy)]
enum Exported {
    Traces = 0,
    Metrics = 1,
    Logs = 2,
}

impl Exported {
    const ALL: [Exported; 3] = [Self::Traces, Self::Metrics, Self::Logs];

    fn as_str(self) -> &'static str {
        ["traces", "metrics", "logs"][self as usize]
    }

    /// How many of its exports failed (dropped what they carried), since the process began:
    /// what the warnings count, and `lamplighter.telemetry.export.failures`, for an outside
    /// alert to see telemetry being dropped.
    fn failures(self) -> &'static AtomicU64 {
        static FAILURES: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
        &FAILURES[self as usize]
    }

    /// When its last failure was logged (Unix seconds; 0: never).
    fn last_warned(self) -> &'static AtomicU64 {
        static LAST: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
        &LAST[self as usize]
    }
}

/// Registers the export failure counter on `meter` (every signal, 0 until one fails).
fn export_failures(meter: &opentelemetry::metrics::Meter) {
    meter
        .u64_observable_counter("lamplighter.telemetry.export.failures")
        .with_description("Telemetry exports that failed (what they carried was dropped), by signal")
        .with_callback(|o| {
            for signal in Exported::ALL {
                o.observe(signal.failures().load(Ordering::Relaxed), &[KeyValue::new("signal", signal.as_str())]);
            }
        })
        .build();
}

impl<E> Warned<E> {
    fn new(inner: E, signal: Exported) -> Self {
        Self { inner, signal }
    }

    fn report(&self, r: OTelSdkResult) -> OTelSdkResult {
        if let Err(e) = &r {
            let failures = self.signal.failures().fetch_add(1, Ordering::Relaxed) + 1;
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            let last_warned = self.signal.last_warned();
            let last = last_warned.load(Ordering::Relaxed);
            if now >= last + 60 && last_warned.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                tracing::warn!(target: "lamplighter::telemetry", signal = self.signal.as_str(), failures, error = %e, "cannot export telemetry; dropping it (next warning in a minute at the earliest)");
            }
        }
        r
    }
}

impl<E: SpanExporter> SpanExporter for Warned<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let r = self.inner.export(batch).await;
        self.report(r)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

impl<E: opentelemetry_sdk::metrics::exporter::PushMetricExporter> opentelemetry_sdk::metrics::exporter::PushMetricExporter for Warned<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let r = self.inner.export(metrics).await;
        self.report(r)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

impl<E: opentelemetry_sdk::logs::LogExporter> opentelemetry_sdk::logs::LogExporter for Warned<E> {
    async fn export(&self, batch: opentelemetry_sdk::logs::LogBatch<'_>) -> OTelSdkResult {
        let r = self.inner.export(batch).await;
        self.report(r)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// `traces.exporter: console`: one line per finished span on standard error (never standard
/// output, which MCP over stdio owns).
#[derive(Debug)]
struct ConsoleSpans;

impl SpanExporter for ConsoleSpans {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut out = String::new();
        for s in batch {
            let ms = s.end_time.duration_since(s.start_time).map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0);
            let _ = write!(
                out,
                "span {} trace={} id={} parent={} {ms:.1}ms",
                s.name,
                s.span_context.trace_id(),
                s.span_context.span_id(),
                s.parent_span_id
            );
            for kv in &s.attributes {
                let _ = write!(out, " {}={}", kv.key, kv.value);
            }
            out.push('\n');
        }
        eprint!("{out}");
        Ok(())
    }
}

/// How many jobs' per-job gauges an OTLP export carries, each gauge (OpenTelemetry's
/// cardinality limit: past it the SDK folds the rest into one `otel.metric.overflow` series,
/// and the worker says so; `/metrics` has them all). The SDK reserves a table for the limit
/// up front (16 Ki entries, 0.5 MB of address space a gauge) and keeps about 0.5 kB a series:
/// at most about 5 MB a gauge, and up to three gauges have a value for every job.
const OTLP_JOB_SERIES: usize = 10_000;

/// The reader behind `/metrics`: collects on demand, and adds the observer's per-job gauges
/// (every job's, read from its table: none of them kept by the SDK).
#[derive(Debug, Default)]
pub(crate) struct PullReader {
    reader: ManualReader,
    observer: std::sync::OnceLock<Arc<Observer>>,
}

/// About how much of a `/metrics` page is made before it is handed on.
const PAGE_PIECE: usize = 64 * 1024;

impl PullReader {
    /// Every metric, in the Prometheus text format (0.0.4), handed to `send` in pieces: the
    /// SDK's metrics first, whole, then the per-job gauges about [`PAGE_PIECE`] at a time, so
    /// that the page of a million jobs is never whole in memory. Stops when `send` says the
    /// reader has gone. An error, before anything is sent, when the SDK cannot collect.
    pub(crate) fn prometheus(&self, mut send: impl FnMut(String) -> bool) -> Result<(), String> {
        let mut rm = ResourceMetrics::default();
        self.reader.collect(&mut rm).map_err(|e| e.to_string())?;
        let mut out = render_prometheus(&rm);
        let read_all = self.observer.get().is_none_or(|observer| {
            observer.read_job_gauges(|kind, jobs| {
                let name = family_name(kind.name, kind.unit.unwrap_or(""));
                header(&mut out, &name, kind.description, "gauge");
                for (job, v) in jobs {
                    let _ = writeln!(out, "{name}{{job=\"{}\"}} {}", label_value(job), prom_value(v));
                    if out.len() >= PAGE_PIECE && !send(std::mem::take(&mut out)) {
                        return false;
                    }
                }
                true
            })
        });
        if read_all && !out.is_empty() {
            send(out);
        }
        Ok(())
    }
}

/// Hands the provider a reader it shares with `/metrics`.
#[derive(Debug)]
struct SharedReader(Arc<PullReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.reader.register_pipeline(pipeline);
    }

    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.reader.collect(rm)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.reader.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.reader.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.reader.temporality(kind)
    }
}

/// A Prometheus metric or label name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn prom_name(s: &str) -> String {
    let mut out: String = s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == ':' { c } else { '_' }).collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

fn prom_labels<'a>(attrs: impl Iterator<Item = &'a KeyValue>, extra: Option<(&str, String)>) -> String {
    let mut parts: Vec<String> =
        attrs.map(|kv| format!("{}=\"{}\"", prom_name(kv.key.as_str()), label_value(&kv.value.as_str()))).collect();
    parts.sort();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{v}\""));
    }
    if parts.is_empty() { String::new() } else { format!("{{{}}}", parts.join(",")) }
}

/// A label's value, escaped for the text format.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A family's name: the OpenTelemetry name made a Prometheus one, `_seconds` for seconds.
fn family_name(otel: &str, unit: &str) -> String {
    let mut name = prom_name(otel);
    if unit == "s" && !name.ends_with("_seconds") {
        name.push_str("_seconds");
    }
    name
}

fn prom_value(v: f64) -> String {
    if v.is_infinite() { if v > 0.0 { "+Inf".into() } else { "-Inf".into() } } else { v.to_string() }
}

/// Renders OpenTelemetry metrics as Prometheus text: dots become underscores, seconds get
/// `_seconds`, counters `_total`; up-down counters are gauges.
fn render_prometheus(rm: &ResourceMetrics) -> String {
    let mut out = String::new();
    for scope in rm.scope_metrics() {
        for m in scope.metrics() {
            let name = family_name(m.name(), m.unit());
            macro_rules! render {
                ($data:expr) => {
                    match $data {
                        MetricData::Gauge(g) => {
                            header(&mut out, &name, m.description(), "gauge");
                            for p in g.data_points() {
                                let _ = writeln!(out, "{name}{} {}", prom_labels(p.attributes(), None), prom_value(p.value() as f64));
                            }
                        }
                        MetricData::Sum(s) if s.is_monotonic() => {
                            let total = format!("{name}_total");
                            header(&mut out, &total, m.description(), "counter");
                            for p in s.data_points() {
                                let _ = writeln!(out, "{total}{} {}", prom_labels(p.attributes(), None), prom_value(p.value() as f64));
                            }
                        }
                        MetricData::Sum(s) => {
                            header(&mut out, &name, m.description(), "gauge");
                            for p in s.data_points() {
                                let _ = writeln!(out, "{name}{} {}", prom_labels(p.attributes(), None), prom_value(p.value() as f64));
                            }
                        }
                        MetricData::Histogram(h) => {
                            header(&mut out, &name, m.description(), "histogram");
                            for p in h.data_points() {
                                let mut cumulative = 0u64;
                                let bounds: Vec<f64> = p.bounds().collect();
                                for (i, n) in p.bucket_counts().enumerate() {
                                    cumulative += n;
                                    let le = bounds.get(i).copied().unwrap_or(f64::INFINITY);
                                    let labels = prom_labels(p.attributes(), Some(("le", prom_value(le))));
                                    let _ = writeln!(out, "{name}_bucket{labels} {cumulative}");
                                }
                                let labels = prom_labels(p.attributes(), None);
                                let _ = writeln!(out, "{name}_sum{labels} {}", prom_value(p.sum() as f64));
                                let _ = writeln!(out, "{name}_count{labels} {}", p.count());
                            }
                        }
                        MetricData::ExponentialHistogram(_) => {}
                    }
                };
            }
            match m.data() {
                AggregatedMetrics::F64(d) => render!(d),
                AggregatedMetrics::U64(d) => render!(d),
                AggregatedMetrics::I64(d) => render!(d),
            }
        }
    }
    out
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {}", help.replace('\\', "\\\\").replace('\n', "\\n"));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Writes the engine's internal events to `to` (created, or emptied) as JSON lines, from a
/// thread of its own, each flushed once no other waits behind it. Events it falls too far
/// behind on are missed, and said so in the log.
pub(crate) fn write_internal_events(observer: &Observer, to: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(to)?);
    let mut events = observer.internal_events();
    std::thread::Builder::new().name("internal-events".into()).spawn(move || {
        loop {
            match events.blocking_recv() {
                Ok(event) => {
                    let mut write = || -> std::io::Result<()> {
                        serde_json::to_writer(&mut out, &event)?;
                        out.write_all(b"\n")?;
                        if events.is_empty() { out.flush() } else { Ok(()) }
                    };
                    if let Err(e) = write() {
                        tracing::error!(error = %e, "cannot write internal events any more");
                        return;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "the internal-events file fell behind; events were missed");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A collection that fails sends nothing (the route answers 500, not a page that looks
    /// whole); one that works sends the SDK's metrics.
    #[test]
    fn metrics_that_cannot_be_collected_are_an_error_not_a_page() {
        let unregistered = PullReader::default();
        let mut pieces = Vec::new();
        let e = unregistered.prometheus(|p| {
            pieces.push(p);
            true
        });
        assert!(e.is_err_and(|e| e.contains("not registered")) && pieces.is_empty(), "{pieces:?}");
        let reader = Arc::new(PullReader::default());
        let provider = SdkMeterProvider::builder().with_reader(SharedReader(reader.clone())).build();
        provider.meter("t").u64_counter("lamplighter.test").build().add(2, &[]);
        reader
            .prometheus(|p| {
                pieces.push(p);
                true
            })
            .expect("collected");
        assert!(pieces.concat().contains("lamplighter_test_total 2\n"), "{pieces:?}");
    }

    /// The per-job gauges' OTLP exporter and the other metrics' one both fail when the
    /// collector is away: the log still hears of it once a minute for the signal, and the
    /// failure counter counts every failed export.
    #[test]
    fn export_failures_are_logged_once_a_minute_per_signal_however_many_exporters_carry_it() {
        use std::sync::Mutex;
        struct Warnings(Arc<Mutex<Vec<String>>>);
        impl<S: tracing::Subscriber> Layer<S> for Warnings {
            fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
                if *event.metadata().level() == tracing::Level::WARN {
                    self.0.lock().unwrap().push(event.metadata().target().to_string());
                }
            }
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        // Process-wide: no other test reports this signal's failures.
        Exported::Logs.last_warned().store(0, Ordering::Relaxed);
        let before = Exported::Logs.failures().load(Ordering::Relaxed);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(Warnings(seen.clone())), || {
            let (a, b) = (Warned::new((), Exported::Logs), Warned::new((), Exported::Logs));
            for w in [&a, &b, &a, &b] {
                let failed = opentelemetry_sdk::error::OTelSdkError::InternalFailure("connection refused".into());
                assert!(w.report(Err(failed)).is_err(), "the failure is passed on");
            }
        });
        assert_eq!(seen.lock().unwrap().len(), 1, "one warning for the signal: {:?}", seen.lock().unwrap());
        assert_eq!(Exported::Logs.failures().load(Ordering::Relaxed) - before, 4);
    }

    /// A client hanging up is not an operator's ERROR; rmcp's other errors still are, and its
    /// routine INFO lines are off by default.
    #[test]
    fn a_client_hanging_up_is_not_logged_as_an_error() {
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::layer::SubscriberExt;
        struct Seen(Arc<Mutex<Vec<String>>>);
        impl<S: tracing::Subscriber> Layer<S> for Seen {
            fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
                self.0.lock().unwrap().push(format!("{} {}", event.metadata().level(), event.metadata().target()));
            }
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(log_filter(None)).with(Seen(seen.clone())).with(RoutineHangUps);
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "rmcp::service", error = "broken pipe", "failed to send pending response during drain");
            tracing::info!(target: "rmcp::service", "Service initialized as server");
            tracing::error!(target: "rmcp::service", "transport failed");
            tracing::error!(target: "lamplighter_worker", "failed to send pending response during drain");
        });
        assert_eq!(*seen.lock().unwrap(), ["ERROR rmcp::service", "ERROR lamplighter_worker"]);
    }

    #[test]
    fn names_and_labels_follow_the_prometheus_rules() {
        assert_eq!(prom_name("lamplighter.run.duration"), "lamplighter_run_duration");
        assert_eq!(prom_name("gen_ai.client.token.usage"), "gen_ai_client_token_usage");
        assert_eq!(prom_name("9lives"), "_9lives");
        let kv = [KeyValue::new("job", "a\"b\\c\nd"), KeyValue::new("gen_ai.token.type", "input")];
        assert_eq!(prom_labels(kv.iter(), Some(("le", "0.5".into()))), r#"{gen_ai_token_type="input",job="a\"b\\c\nd",le="0.5"}"#);
    }

    #[test]
    fn endpoints_get_the_signal_path_only_when_they_have_none() {
        let s = |e: &str| SignalConfig { exporter: None, protocol: None, endpoint: Some(e.into()) };
        assert_eq!(endpoint(&s("http://collector:4318"), "traces").as_deref(), Some("http://collector:4318/v1/traces"));
        assert_eq!(endpoint(&s("http://collector:4318/"), "metrics").as_deref(), Some("http://collector:4318/v1/metrics"));
        assert_eq!(endpoint(&s("https://x.example/otlp/v1/traces"), "traces").as_deref(), Some("https://x.example/otlp/v1/traces"));
    }

    #[test]
    fn the_environment_can_break_export_but_only_when_it_is_on() {
        let on = TelemetryConfig { enabled: true, ..TelemetryConfig::default() };
        let env = |k: &'static str, v: &'static str| move |n: &str| (n == k).then(|| v.to_string());
        let json = check(&on, env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")).expect("http/json refused");
        assert_eq!(json, "OTEL_EXPORTER_OTLP_PROTOCOL: \"http/json\" is not built in: use http/protobuf (port 4318) or grpc (port 4317)");
        let odd = check(&on, env("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "carrier-pigeon")).expect("refused");
        assert!(odd.starts_with("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL: \"carrier-pigeon\" is not one of"), "{odd}");
        assert_eq!(check(&on, env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")), None);
        assert_eq!(check(&on, env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")), None);
        assert!(check(&on, env("OTEL_METRICS_EXPORTER", "console")).is_some());
        assert_eq!(check(&TelemetryConfig::default(), env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")), None);
        // The wire: the config's, else the signal's variable, else the general one.
        let grpc = SignalConfig { exporter: None, protocol: Some(OtlpProtocol::Grpc), endpoint: None };
        assert_eq!(wire(&grpc, "traces", &env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")), Ok(OtlpProtocol::Grpc));
        assert_eq!(wire(&on.traces, "traces", &env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")), Ok(OtlpProtocol::Grpc));
        assert_eq!(wire(&on.metrics, "metrics", &env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")), Ok(OtlpProtocol::HttpProtobuf));
        assert_eq!(wire(&on.logs, "logs", &env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")), Ok(OtlpProtocol::Grpc));
        // No protocol anywhere: the endpoint's port decides (the seed's `http://localhost:4317`
        // is gRPC), the signal's endpoint first, then the variables'.
        let at = |e: &str| SignalConfig { exporter: None, protocol: None, endpoint: Some(e.into()) };
        let none = |_: &str| None;
        assert_eq!(wire(&at("http://localhost:4317"), "traces", &none), Ok(OtlpProtocol::Grpc));
        assert_eq!(wire(&at("http://collector:4317/"), "logs", &none), Ok(OtlpProtocol::Grpc));
        assert_eq!(wire(&at("http://localhost:4318"), "traces", &none), Ok(OtlpProtocol::HttpProtobuf));
        assert_eq!(wire(&at("https://otlp.example/v1/traces"), "traces", &none), Ok(OtlpProtocol::HttpProtobuf));
        assert_eq!(wire(&on.traces, "traces", &env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4317")), Ok(OtlpProtocol::Grpc));
        assert_eq!(wire(&on.metrics, "metrics", &env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://[::1]:4317")), Ok(OtlpProtocol::Grpc));
        assert_eq!(
            wire(&at("http://localhost:4317"), "traces", &env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")),
            Ok(OtlpProtocol::HttpProtobuf)
        );
        assert_eq!(port_of("http://[::1]"), None);
        // The config's choice wins over the variable; the variable fills in.
        let t = TelemetryConfig { enabled: true, ..TelemetryConfig::default() };
        assert_eq!(exporter(&t, &t.traces, "traces", &env("OTEL_TRACES_EXPORTER", "none")), Exporter::None);
        let set = SignalConfig { exporter: Some(Exporter::Otlp), protocol: None, endpoint: None };
        assert_eq!(exporter(&t, &set, "traces", &env("OTEL_TRACES_EXPORTER", "none")), Exporter::Otlp);
        assert_eq!(exporter(&t, &set, "traces", &env("OTEL_SDK_DISABLED", "true")), Exporter::None);
    }
}
