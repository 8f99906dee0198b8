//! A real OTLP/HTTP receiver: `POST /v1/traces`, `/v1/metrics` and `/v1/logs` with protobuf
//! bodies, decoded with the official OpenTelemetry proto definitions (`opentelemetry-proto`),
//! kept for tests to look at. It answers as a collector does (200 with an empty export
//! response), so the exporter under test sees a healthy collector.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use prost::Message;

/// A span as received, flattened.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    pub attributes: BTreeMap<String, String>,
    /// The OTLP status code: 0 unset, 1 ok, 2 error.
    pub status: i32,
    pub status_message: String,
    pub service_name: String,
}

/// One data point of a metric, flattened: sums and gauges carry `value`; histograms carry
/// their `count` and `sum` in `value`/`sum`.
#[derive(Debug, Clone)]
pub struct Point {
    pub name: String,
    pub attributes: BTreeMap<String, String>,
    pub value: f64,
    pub sum: f64,
    pub kind: &'static str,
}

#[derive(Debug, Default)]
struct Seen {
    spans: Vec<Span>,
    /// The points of the latest export that carried each metric.
    points: BTreeMap<String, Vec<Point>>,
    logs: Vec<String>,
}

/// The receiver; stops when dropped.
#[derive(Debug)]
pub struct Receiver {
    port: u16,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start() -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let app = Router::new()
            .route("/v1/traces", post(traces))
            .route("/v1/metrics", post(metrics))
            .route("/v1/logs", post(logs))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { port, seen, task }
    }

    /// `http://127.0.0.1:PORT`, the base an exporter appends `/v1/<signal>` to.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn spans(&self) -> Vec<Span> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).spans.clone()
    }

    /// The latest points of metric `name`.
    pub fn points(&self, name: &str) -> Vec<Point> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).points.get(name).cloned().unwrap_or_default()
    }

    pub fn metric_names(&self) -> Vec<String> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).points.keys().cloned().collect()
    }

    /// Log record bodies.
    pub fn logs(&self) -> Vec<String> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).logs.clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), text(&kv.value))).collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn traces(State(seen): State<Arc<Mutex<Seen>>>, body: Bytes) -> (StatusCode, Vec<u8>) {
    let Ok(req) = ExportTraceServiceRequest::decode(body) else { return (StatusCode::BAD_REQUEST, Vec::new()) };
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    for rs in req.resource_spans {
        let service = rs.resource.as_ref().map(|r| attrs(&r.attributes)).and_then(|a| a.get("service.name").cloned()).unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                let status = s.status.clone().unwrap_or_default();
                seen.spans.push(Span {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    name: s.name.clone(),
                    attributes: attrs(&s.attributes),
                    status: status.code,
                    status_message: status.message,
                    service_name: service.clone(),
                });
            }
        }
    }
    (StatusCode::OK, Vec::new())
}

async fn metrics(State(seen): State<Arc<Mutex<Seen>>>, body: Bytes) -> (StatusCode, Vec<u8>) {
    let Ok(req) = ExportMetricsServiceRequest::decode(body) else { return (StatusCode::BAD_REQUEST, Vec::new()) };
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    for rm in req.resource_metrics {
        for sm in rm.scope_metrics {
            for m in sm.metrics {
                let number = |v: &Option<number_data_point::Value>| match v {
                    Some(number_data_point::Value::AsDouble(d)) => *d,
                    Some(number_data_point::Value::AsInt(i)) => *i as f64,
                    None => f64::NAN,
                };
                let point = |attributes: &[KeyValue], value: f64, sum: f64, kind| Point {
                    name: m.name.clone(),
                    attributes: attrs(attributes),
                    value,
                    sum,
                    kind,
                };
                let points: Vec<Point> = match &m.data {
                    Some(metric::Data::Sum(s)) => {
                        s.data_points.iter().map(|p| point(&p.attributes, number(&p.value), 0.0, "sum")).collect()
                    }
                    Some(metric::Data::Gauge(g)) => {
                        g.data_points.iter().map(|p| point(&p.attributes, number(&p.value), 0.0, "gauge")).collect()
                    }
                    Some(metric::Data::Histogram(h)) => {
                        h.data_points.iter().map(|p| point(&p.attributes, p.count as f64, p.sum.unwrap_or(0.0), "histogram")).collect()
                    }
                    _ => Vec::new(),
                };
                seen.points.insert(m.name.clone(), points);
            }
        }
    }
    (StatusCode::OK, Vec::new())
}

async fn logs(State(seen): State<Arc<Mutex<Seen>>>, body: Bytes) -> (StatusCode, Vec<u8>) {
    let Ok(req) = ExportLogsServiceRequest::decode(body) else { return (StatusCode::BAD_REQUEST, Vec::new()) };
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    for rl in req.resource_logs {
        for sl in rl.scope_logs {
            for r in sl.log_records {
                seen.logs.push(text(&r.body));
            }
        }
    }
    (StatusCode::OK, Vec::new())
}
