//! The MCP connection to a worker: connect, call a tool, list the tools, close. Every failure
//! leaves here as a [`CtlError`] of the right kind: the worker saying no (exit 1) is told
//! apart from a worker that cannot be reached or refuses the token (exit 3) by the types rmcp
//! and reqwest return, never by matching message text (with one documented exception, see
//! [`status_in`]).

use std::error::Error as StdError;
use std::io::ErrorKind;
use std::net::IpAddr;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ErrorCode, Implementation, ProtocolVersion,
    ServerNotification, SubscriptionFilter, Tool,
};
use rmcp::service::{ClientInitializeError, RunningService, Subscription};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{StreamableHttpClientTransportConfig, StreamableHttpError};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceError};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::cli::DEFAULT_URL;
use crate::error::{CtlError, Failure, one_line};

/// How long a TCP (and TLS) connection may take before the worker counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the MCP handshake may take in all. rmcp waits up to 10 s for `server/discover`
/// before it tries the older `initialize`, so this leaves room for both.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long closing may take; the worker sees the connection end when lampctl exits anyway.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// A call that is not a `--wait` gets this long: a worker that stalls after the handshake
/// must not hang a script.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest quoted detail (an HTTP body, an error chain) in a one-line message.
const MAX_DETAIL: usize = 160;

type HttpError = StreamableHttpError<reqwest::Error>;

/// A connected worker.
pub(crate) struct Client {
    service: RunningService<RoleClient, Handler>,
    target: Target,
    /// The same HTTP client the transport uses, and the token, for [`Client::read_listing`].
    http: reqwest::Client,
    token: Option<String>,
}

/// Where and how to reach a worker: from flags, the environment, or a context.
#[derive(Debug, Clone, Default)]
pub(crate) struct Connection {
    pub(crate) url: String,
    pub(crate) token: Option<String>,
    /// The CA (PEM) the worker's certificate must chain to, instead of the system's roots.
    pub(crate) ca_cert: Option<std::path::PathBuf>,
    /// A client certificate and its key (PEM), for a worker that asks for one (mutual TLS).
    pub(crate) client_cert: Option<std::path::PathBuf>,
    pub(crate) client_key: Option<std::path::PathBuf>,
}

impl Client {
    /// Connects and completes the MCP handshake: `server/discover` for a current worker (one
    /// round trip, no session), falling back to `initialize` for an older one.
    pub(crate) async fn connect(conn: &Connection) -> Result<Self, CtlError> {
        let (url, token) = (conn.url.as_str(), conn.token.as_deref());
        let target = Target { url: url.to_owned(), token_given: token.is_some(), ca: conn.ca_cert.clone() };
        let http = http_client(conn)?;
        let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
        if let Some(token) = token {
            config = config.auth_header(token.to_owned());
        }
        let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
        let lifecycle = ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::LATEST],
            legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
        };
        let handshake = Handler.serve_with_lifecycle(transport, lifecycle);
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(service)) => Ok(Self { service, target, http, token: token.map(str::to_owned) }),
            Ok(Err(error)) => Err(target.explain(init_problem(&error))),
            Err(_elapsed) => Err(target.explain(Problem::TimedOut)),
        }
    }

    /// Calls `tool` and returns its structured content (or, from a worker that sends only
    /// text, the text parsed as JSON, or the text itself).
    pub(crate) async fn call(&self, tool: &str, arguments: Map<String, Value>) -> Result<Value, CtlError> {
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        match tokio::time::timeout(CALL_TIMEOUT, self.service.call_tool(params)).await {
            Ok(Ok(result)) => tool_value(result),
            Ok(Err(error)) => Err(call_failure(&self.target, error)),
            Err(_elapsed) => Err(self.target.explain(Problem::TimedOut)),
        }
    }

    /// A read-only listing tool's structured content, as the JSON text the worker sent.
    ///
    /// A worker at 2026-07-28 takes every request on its own (no session), so this posts the
    /// `tools/call` itself and lifts the structured content out of the answer unparsed: the
    /// answer to `list_jobs` of 1,000 jobs is ~400 KB, and reading it through rmcp's
    /// untagged result type (buffered, cloned, then a `Value`) cost lampctl more CPU than
    /// the worker spent on it. Failures are told apart as [`Client::call`] tells them. An
    /// answer this does not read (an event stream, another content type) and an older worker
    /// go through [`Client::call`]: `tool` only reads, so asking again changes nothing.
    pub(crate) async fn read_listing(&self, tool: &str, arguments: Map<String, Value>) -> Result<Box<RawValue>, CtlError> {
        if let Some(version) = self.service.peer_info().map(|info| info.protocol_version.clone())
            && version >= ProtocolVersion::V_2026_07_28
        {
            match tokio::time::timeout(CALL_TIMEOUT, self.post_call(&version, tool, &arguments)).await {
                Ok(Ok(Some(raw))) => return Ok(raw),
                Ok(Ok(None)) => {}
                Ok(Err(error)) => return Err(error),
                Err(_elapsed) => return Err(self.target.explain(Problem::TimedOut)),
            }
        }
        let value = self.call(tool, arguments).await?;
        to_raw(&value)
    }

    /// One stateless `tools/call` (SEP-2575: the version, client and capabilities in `_meta`,
    /// the method and tool name in headers too, as rmcp's client sends them). `None` for an
    /// answer that is not a plain JSON body.
    async fn post_call(
        &self,
        version: &ProtocolVersion,
        tool: &str,
        arguments: &Map<String, Value>,
    ) -> Result<Option<Box<RawValue>>, CtlError> {
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": tool,
                "arguments": arguments,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": version,
                    "io.modelcontextprotocol/clientInfo": Handler.get_info().client_info,
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        });
        let mut request = self
            .http
            .post(&self.target.url)
            .header(reqwest::header::ACCEPT, "application/json, text/event-stream")
            .header("MCP-Protocol-Version", version.to_string())
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", tool)
            .json(&body);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|error| self.target.explain(reqwest_problem(&error)))?;
        let status = response.status().as_u16();
        match status {
            200 => {}
            401 | 403 => return Err(self.target.explain(Problem::Unauthorized { status })),
            404 => return Err(self.target.explain(Problem::NoEndpoint)),
            // A JSON-RPC error the worker sends with a 4xx (bad headers, an unknown method):
            // rmcp's path reads and words those.
            400..=499 if status != 429 => return Ok(None),
            _ => return Err(self.target.explain(Problem::Http { status })),
        }
        let json = response.headers().get(reqwest::header::CONTENT_TYPE).is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
        if !json {
            return Ok(None);
        }
        let bytes = response.bytes().await.map_err(|error| self.target.explain(reqwest_problem(&error)))?;
        read_answer(&self.target, &bytes).map(Some)
    }

    /// All tools the worker offers.
    pub(crate) async fn list_tools(&self) -> Result<Vec<Tool>, CtlError> {
        self.service.list_all_tools().await.map_err(|error| call_failure(&self.target, error))
    }

    /// Opens a `subscriptions/listen` stream for the resource at `uri`; [`Updates::next`]
    /// resolves each time the worker says it changed.
    pub(crate) async fn updates(&self, uri: &str) -> Result<Updates, CtlError> {
        let filter = SubscriptionFilter::builder().resource_subscription(uri).build();
        let subscription = match tokio::time::timeout(CALL_TIMEOUT, self.service.peer().listen(filter)).await {
            Ok(Ok(subscription)) => subscription,
            Ok(Err(ServiceError::McpError(data))) if data.code == ErrorCode::METHOD_NOT_FOUND => {
                return Err(CtlError::new(
                    Failure::WorkerSaidNo,
                    "this worker cannot be followed (it has no subscriptions/listen); use: lampctl runs show ID",
                ));
            }
            Ok(Err(error)) => return Err(call_failure(&self.target, error)),
            Err(_elapsed) => return Err(self.target.explain(Problem::TimedOut)),
        };
        if !subscription.acknowledged().resource_subscriptions.iter().flatten().any(|u| u == uri) {
            return Err(CtlError::new(Failure::WorkerSaidNo, format!("the worker does not serve {uri}")));
        }
        Ok(Updates { subscription, uri: uri.to_owned(), target: self.target.clone() })
    }

    /// Ends the connection. Best effort: an unfinished request is abandoned, which tells the
    /// worker to stop waiting for it.
    pub(crate) async fn close(self) {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.service.cancel()).await;
    }
}

/// A subscription to one resource's changes.
pub(crate) struct Updates {
    subscription: Subscription,
    uri: String,
    target: Target,
}

impl Updates {
    /// Resolves when the worker notifies that the resource changed; an error when the stream
    /// ends (the worker stopped or the connection broke).
    pub(crate) async fn next(&mut self) -> Result<(), CtlError> {
        loop {
            match self.subscription.next().await {
                Ok(Some(ServerNotification::ResourceUpdatedNotification(n))) if n.params.uri == self.uri => return Ok(()),
                Ok(Some(_)) => {}
                Ok(None) => return Err(self.target.explain(Problem::Lost)),
                Err(error) => return Err(call_failure(&self.target, error)),
            }
        }
    }
}

/// lampctl's side of the MCP session: it names itself.
struct Handler;

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("lampctl", env!("CARGO_PKG_VERSION")))
    }
}

/// The HTTP client under the MCP transport. Built here rather than by rmcp so that a plain
/// `http://` URL does not load (or fail on a missing) system CA store, a dead address fails
/// within [`CONNECT_TIMEOUT`], and a loopback worker is not sent through `$HTTP_PROXY`.
fn http_client(conn: &Connection) -> Result<reqwest::Client, CtlError> {
    let url = conn.url.as_str();
    let parsed = reqwest::Url::parse(url)
        .map_err(|error| CtlError::new(Failure::Usage, format!("--url \"{url}\" is not a URL ({error}); the default is {DEFAULT_URL}")))?;
    let mut builder = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        // One request per connection, as rmcp's own client does: a reused loopback connection
        // can stall ~40 ms on delayed ACKs.
        .pool_max_idle_per_host(0)
        // A redirect would resend the token somewhere else; report it instead.
        .redirect(reqwest::redirect::Policy::none());
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|error| CtlError::new(Failure::Usage, format!("cannot read the {what} {}: {error}", path.display())))
    };
    match parsed.scheme() {
        "http" => builder = builder.tls_certs_only(std::iter::empty::<reqwest::Certificate>()),
        "https" => {
            if let Some(ca) = &conn.ca_cert {
                let pem = read("CA certificate (--ca-cert)", ca)?;
                let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|error| {
                    CtlError::new(
                        Failure::Usage,
                        format!("--ca-cert {}: not PEM certificates: {}", ca.display(), one_line(&chain(&error), MAX_DETAIL)),
                    )
                })?;
                builder = builder.tls_certs_only(certs);
            }
            match (&conn.client_cert, &conn.client_key) {
                (Some(cert), Some(key)) => {
                    let mut pem = read("client certificate (--client-cert)", cert)?;
                    pem.push(b'\n');
                    pem.extend(read("client key (--client-key)", key)?);
                    let identity = reqwest::Identity::from_pem(&pem).map_err(|error| {
                        CtlError::new(
                            Failure::Usage,
                            format!("--client-cert/--client-key: not a PEM certificate and key: {}", one_line(&chain(&error), MAX_DETAIL)),
                        )
                    })?;
                    builder = builder.identity(identity);
                }
                (None, None) => {}
                _ => return Err(CtlError::new(Failure::Usage, "--client-cert and --client-key go together".to_owned())),
            }
        }
        other => {
            return Err(CtlError::new(
                Failure::Usage,
                format!("--url must start with http:// or https://, not {other}://; the default is {DEFAULT_URL}"),
            ));
        }
    }
    if is_loopback(&parsed) {
        builder = builder.no_proxy();
    }
    builder.build().map_err(|error| {
        CtlError::new(Failure::Unreachable, format!("cannot set up a connection to {url}: {}", one_line(&chain(&error), MAX_DETAIL)))
    })
}

fn is_loopback(url: &reqwest::Url) -> bool {
    match url.host_str() {
        Some(host) if host.eq_ignore_ascii_case("localhost") => true,
        Some(host) => host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

/// A plain JSON answer to `tools/call`: its structured content unparsed, or the failure it
/// reports, as [`Client::call`] would report it.
fn read_answer(target: &Target, body: &[u8]) -> Result<Box<RawValue>, CtlError> {
    #[derive(Deserialize)]
    struct Answer<'a> {
        #[serde(borrow)]
        result: Option<&'a RawValue>,
        error: Option<rmcp::ErrorData>,
    }
    let answer: Answer<'_> =
        serde_json::from_slice(body).map_err(|error| target.explain(Problem::NotMcp(format!("the answer is not JSON-RPC: {error}"))))?;
    match (answer.result, answer.error) {
        (_, Some(error)) => Err(call_failure(target, ServiceError::McpError(error))),
        (Some(result), None) => match structured_content(result) {
            Some(raw) => Ok(raw),
            // An `isError` result, or one with text only: read whole, as `call` reads it.
            None => {
                let result: CallToolResult = serde_json::from_str(result.get())
                    .map_err(|error| target.explain(Problem::NotMcp(format!("not a tool result: {error}"))))?;
                to_raw(&tool_value(result)?)
            }
        },
        (None, None) => Err(target.explain(Problem::NotMcp("an answer with neither a result nor an error".to_owned()))),
    }
}

/// The structured content of a successful tool result, unparsed; `None` for an `isError`
/// result or one without structured content.
fn structured_content(result: &RawValue) -> Option<Box<RawValue>> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Outcome<'a> {
        #[serde(borrow)]
        structured_content: Option<&'a RawValue>,
        is_error: Option<bool>,
    }
    let outcome: Outcome<'_> = serde_json::from_str(result.get()).ok()?;
    if outcome.is_error == Some(true) {
        return None;
    }
    outcome.structured_content.map(RawValue::to_owned)
}

fn to_raw(value: &Value) -> Result<Box<RawValue>, CtlError> {
    serde_json::value::to_raw_value(value).map_err(|error| CtlError::new(Failure::Local, format!("cannot hold the answer: {error}")))
}

/// The worker's answer to a tool call: an `isError` result is the worker saying no.
fn tool_value(result: CallToolResult) -> Result<Value, CtlError> {
    let text = result.content.iter().filter_map(|block| block.as_text()).map(|block| block.text.as_str()).collect::<Vec<_>>().join("\n");
    if result.is_error == Some(true) {
        let from_structured = result
            .structured_content
            .as_ref()
            .and_then(|value| value.get("error").or_else(|| value.get("message")))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let message = match text.trim() {
            "" => from_structured.unwrap_or_else(|| "the worker reported an error but gave no reason".to_owned()),
            text => text.to_owned(),
        };
        return Err(CtlError::new(Failure::WorkerSaidNo, message));
    }
    Ok(match result.structured_content {
        Some(value) => value,
        None => serde_json::from_str(&text).unwrap_or(Value::String(text)),
    })
}

/// A failed request on an established connection.
fn call_failure(target: &Target, error: ServiceError) -> CtlError {
    match error {
        // A JSON-RPC error: the worker answered and refused (unknown tool, bad arguments).
        ServiceError::McpError(data) if data.code == ErrorCode::INVALID_PARAMS => CtlError::new(
            Failure::WorkerSaidNo,
            format!("{}; list the tools and their arguments with: lampctl tools list -o json", data.message),
        ),
        ServiceError::McpError(data) => CtlError::new(Failure::WorkerSaidNo, data.message.into_owned()),
        ServiceError::TransportSend(error) => target.explain(transport_problem(&*error.error)),
        ServiceError::TransportClosed => target.explain(Problem::Lost),
        ServiceError::Timeout { .. } => target.explain(Problem::TimedOut),
        other => CtlError::new(Failure::WorkerSaidNo, format!("unexpected answer from the worker: {other}")),
    }
}

/// Why the worker could not be used, before it is put into words.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Problem {
    /// Nothing answered at the address: connection refused, unknown host, no route.
    Unreachable(String),
    /// Something accepted the connection (or not) but did not answer in time.
    TimedOut,
    /// HTTP 401 or 403: the token is missing, wrong, or not enough.
    Unauthorized { status: u16 },
    /// HTTP 404: a server answers, but serves no MCP at this path.
    NoEndpoint,
    /// Another HTTP failure: 429, 5xx, a redirect.
    Http { status: u16 },
    /// Plain HTTP sent to a worker's TLS port (it says so in a plain 400).
    SpeaksHttps,
    /// The answer was not MCP: a web page, an unparsable body, a refused handshake.
    NotMcp(String),
    /// The connection ended before the answer arrived.
    Lost,
    /// The worker's TLS certificate is not trusted (the detail says why).
    Untrusted(String),
    /// Anything else, in rmcp's words.
    Other(String),
}

/// Where lampctl connects, to put problems into words.
#[derive(Clone)]
struct Target {
    url: String,
    token_given: bool,
    /// `--ca-cert`, if given (else the system's roots were used).
    ca: Option<std::path::PathBuf>,
}

impl Target {
    fn explain(&self, problem: Problem) -> CtlError {
        let url = &self.url;
        let message = match problem {
            Problem::Unreachable(detail) => format!(
                "cannot reach the worker at {url} ({}); is lamplighter running? set --url or $LAMPLIGHTER_URL",
                one_line(&detail, MAX_DETAIL)
            ),
            Problem::TimedOut => {
                format!("the worker at {url} did not answer in time; is it running and reachable? set --url or $LAMPLIGHTER_URL")
            }
            Problem::Unauthorized { status: 401 } if !self.token_given => {
                "the worker requires a token (401); set --token or $LAMPLIGHTER_TOKEN".to_owned()
            }
            Problem::Unauthorized { status: 401 } => "the worker refused the token (401); set --token or $LAMPLIGHTER_TOKEN".to_owned(),
            Problem::Unauthorized { status } => format!(
                "the worker refused the request ({status}); check --token or $LAMPLIGHTER_TOKEN, and that the host name in {url} is in the worker's worker.mcp.allowed_hosts (or $LAMPLIGHTER_ALLOWED_HOSTS)"
            ),
            Problem::NoEndpoint => {
                format!(
                    "nothing serves MCP at {url} (HTTP 404); set --url or $LAMPLIGHTER_URL to the worker's MCP endpoint, e.g. {DEFAULT_URL}"
                )
            }
            Problem::Http { status } => {
                format!("the worker at {url} answered HTTP {status}; check the worker's log, or set --url or $LAMPLIGHTER_URL")
            }
            Problem::SpeaksHttps => {
                let https = url.strip_prefix("http://").map_or_else(|| url.clone(), |rest| format!("https://{rest}"));
                format!("this worker speaks https: use --url {https} (with --ca-cert for a private CA)")
            }
            Problem::NotMcp(detail) => format!(
                "{url} did not answer like a lamplighter worker ({}); set --url or $LAMPLIGHTER_URL to its MCP endpoint",
                one_line(&detail, MAX_DETAIL)
            ),
            Problem::Lost => {
                format!("lost the connection to the worker at {url} before it answered; check that it is still running, then retry")
            }
            Problem::Other(detail) => format!("cannot talk to the worker at {url}: {}", one_line(&detail, MAX_DETAIL)),
            Problem::Untrusted(detail) => {
                let checked = match &self.ca {
                    Some(ca) => format!("the CA in {} (--ca-cert)", ca.display()),
                    None => "the system's trusted CAs".to_owned(),
                };
                format!(
                    "the worker at {url} presented a TLS certificate lampctl does not trust ({}), checked against {checked}; if a private CA signed it, pass that CA with --ca-cert FILE (or ca_cert in the context)",
                    one_line(&detail, MAX_DETAIL)
                )
            }
        };
        CtlError::new(Failure::Unreachable, message)
    }
}

fn init_problem(error: &ClientInitializeError) -> Problem {
    match error {
        ClientInitializeError::TransportError { error, .. } => transport_problem(&*error.error),
        // `server/discover` was refused like an older worker would, then `initialize` failed
        // too: the second failure says what is wrong (for a wrong path, both are a 404).
        ClientInitializeError::LegacyFallbackFailed { fallback, .. } => init_problem(fallback),
        ClientInitializeError::ConnectionClosed(_) => Problem::Lost,
        ClientInitializeError::JsonRpcError(data) => Problem::NotMcp(format!("the handshake was refused: {}", data.message)),
        ClientInitializeError::NoCompatibleProtocolVersion { server_supported, .. } => Problem::NotMcp(format!(
            "no MCP protocol version in common; the worker speaks {}",
            server_supported.iter().map(|version| version.to_string()).collect::<Vec<_>>().join(", ")
        )),
        other => Problem::Other(other.to_string()),
    }
}

/// A transport error as rmcp hands it over: a boxed `StreamableHttpError<reqwest::Error>`.
fn transport_problem(error: &(dyn StdError + Send + Sync + 'static)) -> Problem {
    match error.downcast_ref::<HttpError>() {
        Some(http) => http_problem(http),
        None => Problem::Other(chain(error)),
    }
}

fn http_problem(error: &HttpError) -> Problem {
    match error {
        StreamableHttpError::Client(error) => reqwest_problem(error),
        StreamableHttpError::Io(error) => Problem::Unreachable(error.to_string()),
        StreamableHttpError::AuthRequired(_) => Problem::Unauthorized { status: 401 },
        StreamableHttpError::InsufficientScope(_) => Problem::Unauthorized { status: 403 },
        StreamableHttpError::HttpStatus(status) => Problem::Http { status: status.status },
        StreamableHttpError::UnexpectedServerResponse(text) => match status_in(text) {
            Some(status @ (401 | 403)) => Problem::Unauthorized { status },
            Some(404) => Problem::NoEndpoint,
            Some(400) if text.contains("this worker speaks https") => Problem::SpeaksHttps,
            Some(status) => Problem::Http { status },
            None => Problem::NotMcp(text.to_string()),
        },
        StreamableHttpError::UnexpectedContentType(content_type) => {
            Problem::NotMcp(format!("content type {}", content_type.as_deref().unwrap_or("missing")))
        }
        StreamableHttpError::Deserialize(error) => Problem::NotMcp(error.to_string()),
        StreamableHttpError::UnexpectedEndOfStream | StreamableHttpError::TransportChannelClosed => Problem::Lost,
        other => Problem::Other(other.to_string()),
    }
}

/// The HTTP status in rmcp's `UnexpectedServerResponse`. rmcp keeps the status of a 4xx
/// answer (a 401 or 403 without `WWW-Authenticate`, a 404) only as the text
/// `HTTP {status}: {body}` (rmcp 3.9 `transport/common/reqwest/streamable_http_client.rs`,
/// `post_message_with_max_sse_event_size`), so the leading code is read from it.
fn status_in(text: &str) -> Option<u16> {
    let rest = text.strip_prefix("HTTP ")?;
    let code = rest.get(..3)?;
    let status: u16 = code.parse().ok()?;
    (100..=599).contains(&status).then_some(status)
}

fn reqwest_problem(error: &reqwest::Error) -> Problem {
    if let Some(detail) = untrusted(error) {
        Problem::Untrusted(detail)
    } else if error.is_timeout() {
        Problem::TimedOut
    } else if error.is_connect() {
        Problem::Unreachable(connect_detail(error))
    } else {
        Problem::Other(chain(error))
    }
}

/// The certificate error in `error`'s chain, if the worker's certificate was refused. rustls
/// reports it inside an I/O error; where the error arrives as rustls's own type it is told by
/// type, and otherwise by rustls's wording of a refused certificate ("invalid peer
/// certificate"), the second documented exception to telling failures apart by type (reqwest
/// hands over the I/O error's inner error as a type lampctl cannot name).
fn untrusted(error: &(dyn StdError + 'static)) -> Option<String> {
    let mut current = Some(error);
    while let Some(cause) = current {
        if let Some(e @ (rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented)) =
            cause.downcast_ref::<rustls::Error>()
        {
            return Some(e.to_string());
        }
        if let Some(inner) = cause.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            let text = inner.to_string();
            if text.starts_with("invalid peer certificate") {
                return Some(text);
            }
        }
        current = cause.source();
    }
    None
}

/// "connection refused" when that is what happened, else the innermost cause (for an
/// unknown host: "failed to lookup address information: …").
fn connect_detail(error: &(dyn StdError + 'static)) -> String {
    let mut innermost = error;
    let mut current = Some(error);
    while let Some(cause) = current {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            match io.kind() {
                ErrorKind::ConnectionRefused => return "connection refused".to_owned(),
                ErrorKind::TimedOut => return "timed out".to_owned(),
                _ => {}
            }
        }
        innermost = cause;
        current = cause.source();
    }
    innermost.to_string()
}

/// An error and its causes, "outer: inner: innermost", without repeats.
fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current = Some(error);
    while let Some(cause) = current {
        let text = cause.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        current = cause.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use std::any::TypeId;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    use rmcp::ErrorData;
    use rmcp::model::ContentBlock;
    use rmcp::transport::DynamicTransportError;
    use rmcp::transport::streamable_http_client::{AuthRequiredError, HttpStatusError};
    use serde_json::json;

    use super::*;

    const URL: &str = "http://127.0.0.1:5100/mcp";

    fn at(url: &str, token: Option<&str>) -> Connection {
        Connection { url: url.to_owned(), token: token.map(str::to_owned), ..Default::default() }
    }

    fn target(token_given: bool) -> Target {
        Target { url: URL.to_owned(), token_given, ca: None }
    }

    fn transport_error(error: HttpError) -> ClientInitializeError {
        ClientInitializeError::TransportError {
            error: DynamicTransportError::from_parts("streamable-http", TypeId::of::<()>(), Box::new(error)),
            context: "send discover request".into(),
        }
    }

    #[test]
    fn a_listing_is_lifted_out_of_the_answer_as_sent_and_failures_read_as_call_reads_them() {
        let answer = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"list_jobs: 1 jobs"}],"structuredContent":{"jobs":[{"name":"a","new_field":[1, 2]}],"next_cursor":null},"isError":false}}"#;
        let raw = read_answer(&target(false), answer).expect("a structured result");
        assert_eq!(raw.get(), r#"{"jobs":[{"name":"a","new_field":[1, 2]}],"next_cursor":null}"#, "byte for byte");
        let text_only = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"{\"jobs\":[]}"}]}}"#;
        assert_eq!(read_answer(&target(false), text_only).expect("text parsed as JSON").get(), r#"{"jobs":[]}"#);
        let refusals: [(&[u8], Failure, &str); 4] = [
            (
                br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"no such job"}],"isError":true}}"#,
                Failure::WorkerSaidNo,
                "no such job",
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"bad arguments"}}"#,
                Failure::WorkerSaidNo,
                "bad arguments; list the tools",
            ),
            (br#"<html>not mcp</html>"#, Failure::Unreachable, "did not answer like a lamplighter worker"),
            (br#"{"jsonrpc":"2.0","id":1}"#, Failure::Unreachable, "neither a result nor an error"),
        ];
        for (body, failure, words) in refusals {
            let error = read_answer(&target(false), body).expect_err("a failure");
            assert_eq!(error.exit_code(), failure.exit_code(), "{}", String::from_utf8_lossy(body));
            assert!(error.to_string().contains(words), "{error}");
        }
    }

    #[test]
    fn http_failures_are_classified_by_type() {
        let cases: Vec<(HttpError, Problem)> = vec![
            (StreamableHttpError::AuthRequired(AuthRequiredError::new("Bearer".to_owned())), Problem::Unauthorized { status: 401 }),
            (StreamableHttpError::UnexpectedServerResponse("HTTP 401 Unauthorized: ".into()), Problem::Unauthorized { status: 401 }),
            (StreamableHttpError::UnexpectedServerResponse("HTTP 403 Forbidden: bad origin".into()), Problem::Unauthorized { status: 403 }),
            (StreamableHttpError::UnexpectedServerResponse("HTTP 404 Not Found: ".into()), Problem::NoEndpoint),
            (StreamableHttpError::UnexpectedServerResponse("HTTP 307 Temporary Redirect: ".into()), Problem::Http { status: 307 }),
            (StreamableHttpError::HttpStatus(HttpStatusError::new(503, None)), Problem::Http { status: 503 }),
            (
                StreamableHttpError::UnexpectedContentType(Some("text/html".to_owned())),
                Problem::NotMcp("content type text/html".to_owned()),
            ),
            (StreamableHttpError::UnexpectedServerResponse("garbage".into()), Problem::NotMcp("garbage".to_owned())),
            (StreamableHttpError::UnexpectedEndOfStream, Problem::Lost),
        ];
        for (error, expected) in cases {
            let shown = error.to_string();
            assert_eq!(init_problem(&transport_error(error)), expected, "{shown}");
        }
    }

    #[test]
    fn a_failed_legacy_fallback_is_judged_by_its_second_failure() {
        let error = ClientInitializeError::LegacyFallbackFailed {
            discover: Box::new(ClientInitializeError::JsonRpcError(ErrorData::invalid_request("server/discover rejected", None))),
            fallback: Box::new(transport_error(StreamableHttpError::UnexpectedServerResponse("HTTP 404 Not Found: ".into()))),
        };
        assert_eq!(init_problem(&error), Problem::NoEndpoint);
    }

    #[test]
    fn connection_and_auth_problems_exit_3_with_what_to_do() {
        let refused = target(false).explain(Problem::Unreachable("connection refused".to_owned()));
        assert_eq!(refused.exit_code(), 3);
        assert_eq!(
            refused.to_string(),
            "cannot reach the worker at http://127.0.0.1:5100/mcp (connection refused); is lamplighter running? set --url or $LAMPLIGHTER_URL"
        );
        let wrong_token = target(true).explain(Problem::Unauthorized { status: 401 });
        assert_eq!(wrong_token.exit_code(), 3);
        assert_eq!(wrong_token.to_string(), "the worker refused the token (401); set --token or $LAMPLIGHTER_TOKEN");
        let no_token = target(false).explain(Problem::Unauthorized { status: 401 });
        assert_eq!(no_token.to_string(), "the worker requires a token (401); set --token or $LAMPLIGHTER_TOKEN");
        for problem in [Problem::TimedOut, Problem::NoEndpoint, Problem::Http { status: 502 }, Problem::Lost, Problem::Other("x\ny".into())]
        {
            let error = target(true).explain(problem);
            assert_eq!(error.exit_code(), 3);
            assert!(!error.to_string().contains('\n'), "{error}");
        }
    }

    #[test]
    fn the_worker_saying_no_exits_1_with_its_message() {
        let unknown_job =
            tool_value(CallToolResult::error(vec![ContentBlock::text("job \"nightly\" not found; known jobs: a, b")])).unwrap_err();
        assert_eq!(unknown_job.exit_code(), 1);
        assert_eq!(unknown_job.to_string(), "job \"nightly\" not found; known jobs: a, b");

        let unknown_tool = call_failure(
            &target(false),
            ServiceError::McpError(ErrorData::new(ErrorCode::METHOD_NOT_FOUND, "tool \"nope\" not found", None)),
        );
        assert_eq!(unknown_tool.exit_code(), 1);
        assert_eq!(unknown_tool.to_string(), "tool \"nope\" not found");

        let bad_arguments =
            call_failure(&target(false), ServiceError::McpError(ErrorData::new(ErrorCode::INVALID_PARAMS, "missing field `name`", None)));
        assert_eq!(bad_arguments.exit_code(), 1);
        assert!(bad_arguments.to_string().starts_with("missing field `name`; list the tools"));

        assert_eq!(call_failure(&target(false), ServiceError::TransportClosed).exit_code(), 3);
    }

    #[test]
    fn tool_results_prefer_structured_content_then_json_text() {
        assert_eq!(tool_value(CallToolResult::structured(json!({"jobs": []}))).unwrap(), json!({"jobs": []}));
        assert_eq!(tool_value(CallToolResult::success(vec![ContentBlock::text("[1,2]")])).unwrap(), json!([1, 2]));
        assert_eq!(tool_value(CallToolResult::success(vec![ContentBlock::text("done")])).unwrap(), json!("done"));
    }

    #[test]
    fn status_is_read_only_from_the_leading_code() {
        assert_eq!(status_in("HTTP 404 Not Found: <html>"), Some(404));
        assert_eq!(status_in("HTTP 4"), None);
        assert_eq!(status_in("not HTTP 404"), None);
        assert_eq!(status_in("HTTP abc"), None);
    }

    #[test]
    fn bad_urls_are_usage_errors() {
        for url in ["127.0.0.1:5100/mcp", "ftp://host/mcp", "not a url"] {
            let error = http_client(&Connection { url: url.to_owned(), ..Default::default() }).unwrap_err();
            assert_eq!(error.exit_code(), 2, "{url}: {error}");
        }
        assert!(is_loopback(&reqwest::Url::parse("http://[::1]:5100/mcp").unwrap()));
        assert!(is_loopback(&reqwest::Url::parse("http://LOCALHOST/mcp").unwrap()));
        assert!(!is_loopback(&reqwest::Url::parse("http://worker.internal/mcp").unwrap()));
    }

    // The tests below connect for real, through rmcp and reqwest, to a closed port or to a
    // tiny canned HTTP server, so a change in rmcp's error shapes shows up here.

    /// An HTTP server on a free loopback port that reads each request and answers `response`.
    fn canned_server(response: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { break };
                read_request(&mut stream);
                let _ = stream.write_all(response.as_bytes());
            }
        });
        url
    }

    fn read_request(stream: &mut TcpStream) {
        let mut buffer = Vec::new();
        let mut chunk = [0_u8; 4096];
        let body_start = loop {
            let Ok(read @ 1..) = stream.read(&mut chunk) else { return };
            buffer.extend_from_slice(&chunk[..read]);
            if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
                break end + 4;
            }
        };
        let head = String::from_utf8_lossy(&buffer[..body_start]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0_usize);
        while buffer.len() < body_start + length {
            let Ok(read @ 1..) = stream.read(&mut chunk) else { return };
            buffer.extend_from_slice(&chunk[..read]);
        }
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_with_connection_refused() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}/mcp");
        let error = Client::connect(&at(&url, None)).await.err().expect("nothing listens there");
        assert_eq!(error.exit_code(), 3);
        assert_eq!(
            error.to_string(),
            format!("cannot reach the worker at {url} (connection refused); is lamplighter running? set --url or $LAMPLIGHTER_URL")
        );
    }

    #[tokio::test]
    async fn a_401_with_a_challenge_is_a_refused_token() {
        let url = canned_server("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let error = Client::connect(&at(&url, Some("wrong"))).await.err().expect("401");
        assert_eq!(error.exit_code(), 3);
        assert_eq!(error.to_string(), "the worker refused the token (401); set --token or $LAMPLIGHTER_TOKEN");
    }

    #[tokio::test]
    async fn a_401_without_a_challenge_asks_for_a_token() {
        let url = canned_server("HTTP/1.1 401 Unauthorized\r\nContent-Length: 12\r\nConnection: close\r\n\r\nunauthorized");
        let error = Client::connect(&at(&url, None)).await.err().expect("401");
        assert_eq!(error.exit_code(), 3);
        assert_eq!(error.to_string(), "the worker requires a token (401); set --token or $LAMPLIGHTER_TOKEN");
    }

    #[tokio::test]
    async fn a_403_names_the_token_and_the_host() {
        let url = canned_server("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let error = Client::connect(&at(&url, Some("t"))).await.err().expect("403");
        assert_eq!(error.exit_code(), 3);
        assert!(error.to_string().starts_with("the worker refused the request (403)"), "{error}");
        assert!(error.to_string().contains("worker.mcp.allowed_hosts"), "names the setting to change: {error}");
    }

    #[tokio::test]
    async fn a_404_is_a_wrong_url() {
        let url = canned_server("HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found");
        let error = Client::connect(&at(&url, None)).await.err().expect("404");
        assert_eq!(error.exit_code(), 3);
        assert!(error.to_string().starts_with(&format!("nothing serves MCP at {url} (HTTP 404)")), "{error}");
    }
}
