//! A real OTLP receiver, over HTTP (`POST /v1/traces`, `/v1/metrics` and `/v1/logs` with
//! protobuf bodies) or over gRPC (the collector's three services, served by tonic), decoded with
//! the official OpenTelemetry proto definitions (`opentelemetry-proto`) and kept for tests to
//! look at. It answers as a collector does (an empty export response), so the exporter under
//! test sees a healthy collector.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{LogsService, LogsServiceServer};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{MetricsService, MetricsServiceServer};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
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
    /// How many points each export that carried a metric had, in the order they came.
    carried: BTreeMap<String, Vec<usize>>,
    /// Each log record's severity number (OTLP: 9 info, 13 warn, 17 error) and body.
    logs: Vec<(i32, String)>,
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

    /// The same receiver speaking OTLP over gRPC: the exporter's endpoint is [`Self::base_url`].
    pub async fn start_grpc() -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let services = Grpc(seen.clone());
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(services.clone()))
                .add_service(MetricsServiceServer::new(services.clone()))
                .add_service(LogsServiceServer::new(services))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await;
        });
        Self { port, seen, task }
    }

    /// `http://127.0.0.1:PORT`: over HTTP the base an exporter appends `/v1/<signal>` to; over
    /// gRPC the endpoint.
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

    /// How many points of metric `name` each export that carried it had, oldest first.
    pub fn point_counts(&self, name: &str) -> Vec<usize> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).carried.get(name).cloned().unwrap_or_default()
    }

    pub fn metric_names(&self) -> Vec<String> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).points.keys().cloned().collect()
    }

    /// Log record bodies.
    pub fn logs(&self) -> Vec<String> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).logs.iter().map(|(_, b)| b.clone()).collect()
    }

    /// Log records' severity numbers (9 info, 13 warn, 17 error) and bodies.
    pub fn log_records(&self) -> Vec<(i32, String)> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).logs.clone()
    }
}

/// The collector's gRPC services, recording what they are sent as the HTTP handlers do.
#[derive(Clone)]
struct Grpc(Arc<Mutex<Seen>>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        record_traces(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        record_metrics(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl LogsService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        record_logs(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportLogsServiceResponse::default()))
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
    record_traces(&seen, req);
    (StatusCode::OK, Vec::new())
}

fn record_traces(seen: &Mutex<Seen>, req: ExportTraceServiceRequest) {
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
}

async fn metrics(State(seen): State<Arc<Mutex<Seen>>>, body: Bytes) -> (StatusCode, Vec<u8>) {
    let Ok(req) = ExportMetricsServiceRequest::decode(body) else { return (StatusCode::BAD_REQUEST, Vec::new()) };
    record_metrics(&seen, req);
    (StatusCode::OK, Vec::new())
}

fn record_metrics(seen: &Mutex<Seen>, req: ExportMetricsServiceRequest) {
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
                seen.carried.entry(m.name.clone()).or_default().push(points.len());
                seen.points.insert(m.name.clone(), points);
            }
        }
    }
}

async fn logs(State(seen): State<Arc<Mutex<Seen>>>, body: Bytes) -> (StatusCode, Vec<u8>) {
    let Ok(req) = ExportLogsServiceRequest::decode(body) else { return (StatusCode::BAD_REQUEST, Vec::new()) };
    record_logs(&seen, req);
    (StatusCode::OK, Vec::new())
}

fn record_logs(seen: &Mutex<Seen>, req: ExportLogsServiceRequest) {
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    for rl in req.resource_logs {
        for sl in rl.scope_logs {
            for r in sl.log_records {
                seen.logs.push((r.severity_number, text(&r.body)));
            }
        }
    }
}
