//! Guards for the `/mcp` endpoint, in the order they run: `Host` and `Origin` validation (so a
//! web page cannot reach the worker through DNS rebinding or a cross-site request), bearer-token
//! auth (static tokens, and OAuth access tokens checked by `oauth.rs`), and a request body
//! limit. `/healthz`, `/readyz` and the protected-resource metadata are not guarded.
//!
//! rmcp checks `Host` and `Origin` too; `http.rs` gives it the same lists as a second line, so
//! the service stays protected if it is ever mounted without these layers.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use lamplighter_config::{ApiToken, McpAuth, McpTls, Role, WorkerConfig};

use crate::oauth::OAuth;

/// The largest request body `/mcp` accepts; larger ones get 413.
pub(crate) const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Extra host names (comma-separated) the worker may be reached by, beyond loopback and
/// `worker.mcp.host`: e.g. `worker.example.com` when it listens on `0.0.0.0` behind that name.
pub(crate) const EXTRA_HOSTS_VAR: &str = "LAMPLIGHTER_ALLOWED_HOSTS";

/// Who a request comes from, as the guard admitted it: put in the request's extensions, read by
/// the MCP handler (what the caller may call, and the actor it records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    /// Who, as records name the actor: `token NAME` for a static token, `oauth SUBJECT` for an
    /// OAuth access token; none without auth (loopback, or stdio).
    pub(crate) actor: Option<String>,
    pub(crate) role: Role,
    /// The role came from an OAuth token's scopes: a call beyond it is a 403 the client can
    /// step up from.
    pub(crate) scoped: bool,
}

impl Caller {
    /// Without auth: whoever reaches the worker may do everything (loopback only, or stdio).
    pub(crate) const TRUSTED: Caller = Caller { actor: None, role: Role::Manage, scoped: false };
}

/// Who may talk to `/mcp`. Immutable after start; shared behind an `Arc`. (No `Debug`: it
/// holds the tokens.)
pub(crate) struct Guard {
    /// The bearer tokens, when auth is on (the config trims them); empty beside OAuth when
    /// only access tokens are accepted.
    tokens: Option<Vec<ApiToken>>,
    /// OAuth access tokens, with `auth.type: oauth`.
    oauth: Option<Arc<OAuth>>,
    /// Allowed host names, normalized: lowercase, IPv6 without brackets.
    hosts: Vec<String>,
}

impl Guard {
    /// Loopback names, the configured listen host, and `extra_hosts`.
    pub(crate) fn new(worker: &WorkerConfig, extra_hosts: &[String]) -> Self {
        let mut hosts: Vec<String> = Vec::new();
        let configured = ["localhost", "127.0.0.1", "::1", worker.host.as_str()];
        for h in configured.into_iter().chain(extra_hosts.iter().map(String::as_str)) {
            let h = normalize_host(h);
            if !h.is_empty() && !hosts.contains(&h) {
                hosts.push(h);
            }
        }
        let (tokens, oauth) = match &worker.auth {
            // A token read from a file often ends in a newline; what clients send is trimmed too.
            McpAuth::Bearer { tokens } => (Some(tokens.clone()), None),
            McpAuth::OAuth { oauth, tokens } => (Some(tokens.clone()), Some(Arc::new(OAuth::new(oauth.clone())))),
            McpAuth::None => (None, None),
        };
        Self { tokens, oauth, hosts }
    }

    /// The OAuth checker, with `auth.type: oauth`.
    pub(crate) fn oauth(&self) -> Option<&Arc<OAuth>> {
        self.oauth.as_ref()
    }

    /// [`Guard::new`] with `worker.mcp.allowed_hosts` and the names in `$LAMPLIGHTER_ALLOWED_HOSTS`.
    pub(crate) fn from_env(worker: &WorkerConfig) -> Self {
        let mut extra: Vec<String> = worker.allowed_hosts.clone();
        extra.extend(
            std::env::var(EXTRA_HOSTS_VAR)
                .map(|v| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect::<Vec<_>>())
                .unwrap_or_default(),
        );
        Self::new(worker, &extra)
    }

    /// The allowed hosts in rmcp's `allowed_hosts` form (any port; IPv6 in brackets).
    pub(crate) fn rmcp_allowed_hosts(&self) -> Vec<String> {
        self.hosts.iter().map(|h| bracketed(h)).collect()
    }

    /// The allowed origins in rmcp's `allowed_origins` form: `http` and `https`, any port.
    pub(crate) fn rmcp_allowed_origins(&self) -> Vec<String> {
        self.hosts.iter().flat_map(|h| ["http", "https"].map(|scheme| format!("{scheme}://{}:*", bracketed(h)))).collect()
    }

    fn host_allowed(&self, host: &str) -> bool {
        let host = normalize_host(host);
        self.hosts.contains(&host)
    }

    /// `Host` must name this worker; a foreign name is how DNS rebinding shows.
    fn check_host(&self, headers: &HeaderMap, uri: &Uri) -> Result<(), Refusal> {
        let host = match headers.get(header::HOST) {
            Some(value) => match value.to_str().ok().and_then(|s| s.parse::<Authority>().ok()) {
                Some(a) => a.host().to_string(),
                None => return Err(Refusal::BadHost("malformed Host header")),
            },
            // HTTP/2 carries the host in `:authority`.
            None => match uri.authority() {
                Some(a) => a.host().to_string(),
                None => return Err(Refusal::BadHost("missing Host header")),
            },
        };
        if self.host_allowed(&host) {
            return Ok(());
        }
        tracing::warn!(host = %host, allowed = %self.rmcp_allowed_hosts().join(", "), "refused an MCP request with a foreign Host header");
        Err(Refusal::ForeignHost { host })
    }

    /// A browser sends `Origin`; it must be a page of this worker (or of a loopback host).
    /// Clients that are not browsers send none, and that is fine.
    fn check_origin(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let Some(value) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        let origin = String::from_utf8_lossy(value.as_bytes()).into_owned();
        if self.origin_allowed(&origin) {
            return Ok(());
        }
        tracing::warn!(origin = %origin, "refused an MCP request from a foreign Origin");
        Err(Refusal::ForeignOrigin(origin))
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        let Ok(uri) = origin.trim().parse::<Uri>() else {
            return false;
        };
        let web = matches!(uri.scheme_str(), Some("http" | "https"));
        web && uri.authority().is_some_and(|a| self.host_allowed(a.host()))
    }

    /// `Authorization: Bearer <token>`, when auth is on: the caller it names. Every static
    /// token is compared, each in constant time, so the time taken tells neither which token
    /// nor how much of one a guess got right; a token that is none of them is checked as an
    /// OAuth access token when OAuth is on.
    async fn check_auth(&self, headers: &HeaderMap) -> Result<Caller, Refusal> {
        let Some(tokens) = &self.tokens else {
            return Ok(Caller::TRUSTED);
        };
        let metadata = || self.oauth.as_ref().map(|o| o.metadata_url().to_string());
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
        });
        let Some(given) = given else { return Err(Refusal::NoToken { metadata: metadata() }) };
        let mut found = None;
        for t in tokens {
            if tokens_match(given.as_bytes(), t.token.as_bytes()) {
                found = Some(Caller { actor: Some(format!("token {}", t.name)), role: t.role, scoped: false });
            }
        }
        if let Some(caller) = found {
            return Ok(caller);
        }
        let Some(oauth) = &self.oauth else {
            tracing::warn!("refused an MCP request with a wrong bearer token");
            return Err(Refusal::InvalidToken {
                why: "the bearer token is not one of worker.mcp.auth's tokens".into(),
                metadata: metadata(),
            });
        };
        match oauth.check(given).await {
            Ok(holder) => match holder.role {
                Some(role) => Ok(Caller { actor: Some(format!("oauth {}", holder.subject)), role, scoped: true }),
                None => {
                    let scope = oauth.settings().scope_of(Role::Read).to_string();
                    tracing::warn!(subject = %holder.subject, "refused an OAuth access token with none of this worker's scopes");
                    Err(Refusal::InsufficientScope { scope, what: "any call".into(), metadata: metadata() })
                }
            },
            Err(invalid) => {
                tracing::warn!("refused an OAuth access token: {}", invalid.0);
                Err(Refusal::InvalidToken { why: invalid.0, metadata: metadata() })
            }
        }
    }

    async fn admit(&self, headers: &HeaderMap, uri: &Uri) -> Result<Caller, Refusal> {
        self.check_host(headers, uri)?;
        self.check_origin(headers)?;
        self.check_auth(headers).await
    }

    /// With OAuth, a tool call the token's scopes do not reach is refused here, as HTTP 403
    /// `insufficient_scope` naming the scope that would (so that an OAuth client can ask its
    /// user for it and retry), rather than as a tool error. Reads the request's JSON-RPC
    /// `method` and tool `name` only; anything else passes on unread.
    fn check_scope(&self, caller: &Caller, body: &[u8]) -> Result<(), Refusal> {
        let Some(oauth) = &self.oauth else { return Ok(()) };
        #[derive(serde::Deserialize)]
        struct Call<'a> {
            #[serde(borrow)]
            method: Option<std::borrow::Cow<'a, str>>,
            params: Option<Params<'a>>,
        }
        #[derive(serde::Deserialize)]
        struct Params<'a> {
            #[serde(borrow)]
            name: Option<std::borrow::Cow<'a, str>>,
        }
        let Ok(call) = serde_json::from_slice::<Call>(body) else { return Ok(()) };
        if call.method.as_deref() != Some("tools/call") {
            return Ok(());
        }
        let Some(tool) = call.params.and_then(|p| p.name) else { return Ok(()) };
        let needs = crate::mcp::tool_role(&tool);
        if needs <= caller.role {
            return Ok(());
        }
        Err(Refusal::InsufficientScope {
            scope: oauth.settings().scope_of(needs).to_string(),
            what: format!("tool \"{tool}\""),
            metadata: Some(oauth.metadata_url().to_string()),
        })
    }
}

/// The middleware: refuses what [`Guard`] does not admit, passes the rest on with its
/// [`Caller`].
pub(crate) async fn check(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let caller = match guard.admit(request.headers(), request.uri()).await {
        Ok(caller) => caller,
        Err(refusal) => return closing(refusal.into_response()),
    };
    let mut request = match caller.scoped && caller.role < Role::Manage {
        // A call under an access token: its scope is checked against the tool it calls.
        true => {
            let (parts, body) = request.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
                return closing(
                    (StatusCode::PAYLOAD_TOO_LARGE, format!("the request body is over {MAX_BODY_BYTES} bytes\n")).into_response(),
                );
            };
            if let Err(refusal) = guard.check_scope(&caller, &bytes) {
                return refusal.into_response();
            }
            Request::from_parts(parts, axum::body::Body::from(bytes))
        }
        false => request,
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// The middleware for `/metrics`: a bearer token (any role), when auth is on.
pub(crate) async fn check_token(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    match guard.check_auth(request.headers()).await {
        Ok(_) => next.run(request).await,
        Err(refusal) => closing(refusal.into_response()),
    }
}

/// A refusal answered before its request's body was read says `Connection: close`. The
/// server closes such a connection once the answer is out (the unread body would be taken for
/// the next request), and a client that was not told would send its retry — an OAuth client
/// always does, with its new token — down a connection that is going away.
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Why a request was turned away; each becomes a short plain-text answer.
#[derive(Debug)]
enum Refusal {
    BadHost(&'static str),
    ForeignHost {
        host: String,
    },
    ForeignOrigin(String),
    /// No bearer token; `metadata`: the protected-resource metadata's URL, with OAuth.
    NoToken {
        metadata: Option<String>,
    },
    InvalidToken {
        why: String,
        metadata: Option<String>,
    },
    /// A valid token whose scopes do not reach `what`; `scope` would.
    InsufficientScope {
        scope: String,
        what: String,
        metadata: Option<String>,
    },
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::BadHost(what) => (StatusCode::BAD_REQUEST, format!("bad request: {what}\n")).into_response(),
            Refusal::ForeignHost { host } => (
                StatusCode::FORBIDDEN,
                // The allowed names go to the operator's log, not to an unauthenticated caller.
                format!(
                    "forbidden: Host \"{host}\" is not allowed; to reach the worker by this name, add it to worker.mcp.allowed_hosts in its config (or to ${EXTRA_HOSTS_VAR})\n"
                ),
            )
                .into_response(),
            Refusal::ForeignOrigin(origin) => {
                (StatusCode::FORBIDDEN, format!("forbidden: Origin \"{origin}\" is not allowed\n")).into_response()
            }
            Refusal::NoToken { metadata } => challenge(
                StatusCode::UNAUTHORIZED,
                &[],
                metadata.as_deref(),
                "unauthorized: this worker requires `Authorization: Bearer <token>` (lampctl: --token or $LAMPLIGHTER_TOKEN)".into(),
            ),
            Refusal::InvalidToken { why, metadata } => {
                challenge(StatusCode::UNAUTHORIZED, &[("error", "invalid_token")], metadata.as_deref(), format!("unauthorized: {why}"))
            }
            Refusal::InsufficientScope { scope, what, metadata } => challenge(
                StatusCode::FORBIDDEN,
                &[("error", "insufficient_scope"), ("scope", &scope)],
                metadata.as_deref(),
                format!("forbidden: {what} needs the scope \"{scope}\", which this token was not granted"),
            ),
        }
    }
}

/// A 401 or 403 with its `WWW-Authenticate: Bearer …` challenge (RFC 6750 §3; with OAuth, the
/// `resource_metadata` of RFC 9728 §5.1) and a one-line body saying the same for a person.
fn challenge(status: StatusCode, params: &[(&str, &str)], metadata: Option<&str>, body: String) -> Response {
    let mut value = String::from("Bearer realm=\"lamplighter\"");
    for (k, v) in params {
        value.push_str(&format!(", {k}=\"{v}\""));
    }
    if let Some(m) = metadata {
        value.push_str(&format!(", resource_metadata=\"{m}\""));
    }
    // The body is plain text; a quote or a control character in a value cannot reach the
    // header (scopes have no blanks, the metadata URL is the config's), but keep it safe anyway.
    let header = HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("Bearer realm=\"lamplighter\""));
    (status, [(header::WWW_AUTHENTICATE, header)], format!("{body}\n")).into_response()
}

/// Why the listener of `worker.mcp` would expose the worker unprotected: off loopback it needs auth, and
/// TLS in the worker or a TLS-terminating proxy stated in front. A config with this is refused,
/// by `run` and `config validate` alike.
pub(crate) fn exposure(worker: &WorkerConfig) -> Option<String> {
    // `worker.mcp.host` is an IP address, checked with the config.
    let host: std::net::IpAddr = worker.host.parse().ok()?;
    if host.is_loopback() {
        return None;
    }
    let no_auth = worker.auth == McpAuth::None;
    let no_tls = worker.tls == McpTls::Off;
    match (no_auth, no_tls) {
        (false, false) => None,
        (true, true) => Some(format!(
            "refusing to listen on {host} without auth and without TLS; set worker.mcp.auth (type: bearer or oauth) and worker.mcp.tls (cert_file and key_file, or terminated_by_proxy: true behind a TLS-terminating proxy), or listen on 127.0.0.1"
        )),
        (true, false) => {
            Some(format!("refusing to listen on {host} without auth; set worker.mcp.auth (type: bearer or oauth) or listen on 127.0.0.1"))
        }
        (false, true) => Some(format!(
            "refusing to listen on {host} without TLS: the bearer token would cross the network in clear text; set worker.mcp.tls (cert_file and key_file), or worker.mcp.tls.terminated_by_proxy: true when a TLS-terminating proxy is in front, or listen on 127.0.0.1 (and reach it through an SSH tunnel)"
        )),
    }
}

/// Lowercase, without a port and without the brackets of an IPv6 literal.
fn normalize_host(host: &str) -> String {
    let host = host.trim();
    let host = match host.strip_prefix('[') {
        // `[::1]:5100` → `::1`
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        // `name:8443` → `name`; a bare IPv6 literal (several colons) stays whole.
        None if host.matches(':').count() == 1 => host.split(':').next().unwrap_or_default(),
        None => host,
    };
    host.to_ascii_lowercase()
}

fn bracketed(host: &str) -> String {
    if host.contains(':') { format!("[{host}]") } else { host.to_string() }
}

/// Compares a presented token with the expected one in time that depends only on the expected
/// token's length, so response times do not tell an attacker how much of a guess was right.
fn tokens_match(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for (i, e) in expected.iter().enumerate() {
        diff |= given.get(i).copied().unwrap_or(0) ^ e;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(host: &str, auth: McpAuth) -> WorkerConfig {
        WorkerConfig {
            name: None,
            concurrency: 1,
            shutdown_grace: std::time::Duration::from_secs(1),
            lease: lamplighter_config::DEFAULT_LEASE,
            host: host.into(),
            port: 5100,
            transport: lamplighter_config::McpTransport::Http,
            auth,
            tls: lamplighter_config::McpTls::Off,
            allowed_hosts: Vec::new(),
            manage_jobs: lamplighter_config::ManageJobs::off(std::path::Path::new("data")),
        }
    }

    fn token(name: &str, token: &str, role: Role) -> lamplighter_config::ApiToken {
        lamplighter_config::ApiToken { name: name.into(), token: token.into(), role }
    }

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        h
    }

    fn status<T>(r: Result<T, Refusal>) -> Option<StatusCode> {
        r.err().map(|r| r.into_response().status())
    }

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(tokens_match(b"s3cret", b"s3cret"));
        assert!(!tokens_match(b"s3cre", b"s3cret"));
        assert!(!tokens_match(b"s3cret!", b"s3cret"));
        assert!(!tokens_match(b"s3creT", b"s3cret"));
        assert!(!tokens_match(b"", b"s3cret"));
    }

    #[test]
    fn host_must_name_this_worker() {
        let g = Guard::new(&worker("127.0.0.1", McpAuth::None), &["worker.example".into()]);
        let uri = Uri::from_static("/mcp");
        for ok in ["localhost:5100", "127.0.0.1", "[::1]:5100", "LOCALHOST", "worker.example:80"] {
            assert_eq!(status(g.check_host(&headers(&[(header::HOST, ok)]), &uri)), None, "{ok}");
        }
        assert_eq!(status(g.check_host(&headers(&[(header::HOST, "evil.example:5100")]), &uri)), Some(StatusCode::FORBIDDEN));
    }

    #[test]
    fn origin_if_present_must_be_local() {
        let g = Guard::new(&worker("127.0.0.1", McpAuth::None), &[]);
        assert_eq!(status(g.check_origin(&headers(&[]))), None);
        for ok in ["http://localhost:3000", "https://127.0.0.1", "http://[::1]:8080"] {
            assert_eq!(status(g.check_origin(&headers(&[(header::ORIGIN, ok)]))), None, "{ok}");
        }
        for bad in ["https://evil.example", "null", "file://localhost", "http://localhost.evil.example"] {
            assert_eq!(status(g.check_origin(&headers(&[(header::ORIGIN, bad)]))), Some(StatusCode::FORBIDDEN), "{bad}");
        }
    }

    #[tokio::test]
    async fn bearer_token_is_required_when_configured() {
        let g = Guard::new(&worker("127.0.0.1", McpAuth::Bearer { tokens: vec![token("token", "t0k", Role::Manage)] }), &[]);
        assert_eq!(status(g.check_auth(&headers(&[])).await), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(status(g.check_auth(&headers(&[(header::AUTHORIZATION, "Bearer nope")])).await), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(status(g.check_auth(&headers(&[(header::AUTHORIZATION, "Basic dDBr")])).await), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(status(g.check_auth(&headers(&[(header::AUTHORIZATION, "Bearer t0k")])).await), None);
        assert_eq!(status(g.check_auth(&headers(&[(header::AUTHORIZATION, "bearer t0k")])).await), None);
        let open = Guard::new(&worker("127.0.0.1", McpAuth::None), &[]);
        assert_eq!(open.check_auth(&headers(&[])).await.ok(), Some(Caller::TRUSTED));
    }

    #[tokio::test]
    async fn each_token_names_its_caller_and_role() {
        let tokens = vec![token("dashboard", "r34d", Role::Read), token("ops", "0per8", Role::Operate)];
        let g = Guard::new(&worker("127.0.0.1", McpAuth::Bearer { tokens }), &[]);
        let caller = async |t: &str| g.check_auth(&headers(&[(header::AUTHORIZATION, &format!("Bearer {t}"))])).await.ok();
        assert_eq!(caller("r34d").await, Some(Caller { actor: Some("token dashboard".into()), role: Role::Read, scoped: false }));
        assert_eq!(caller("0per8").await, Some(Caller { actor: Some("token ops".into()), role: Role::Operate, scoped: false }));
        assert_eq!(caller("r34").await, None);
    }

    #[test]
    fn rmcp_gets_the_same_lists() {
        let g = Guard::new(&worker("0.0.0.0", McpAuth::None), &[]);
        assert_eq!(g.rmcp_allowed_hosts(), ["localhost", "127.0.0.1", "[::1]", "0.0.0.0"]);
        assert!(g.rmcp_allowed_origins().contains(&"https://[::1]:*".to_string()));
    }
}
