//! What a WASM plugin's host functions reach outside its sandbox (SPEC §9): the network
//! (`http_request`, made here, limited by [`HostPolicy`]), and the run's models and MCP servers
//! (`ai_complete`, `mcp_call`), which the plugins crate knows nothing of: the caller hands a
//! [`HostServices`] with each action call (the job engine's, per run). Every such call is an
//! operation of the run ([`HostServices::observed`]: span, metric, hooks).
//!
//! The guest sees JSON in, JSON out: a negative code means the host did not try (denied by the
//! policy or a hook, a malformed request, no services here); an answer may still be
//! `{"error": "…"}` when it tried and the network, provider or server failed.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

/// A boxed future, as [`HostServices`] returns (the crate has no async-trait).
pub type HostFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a host call was not answered with a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostError {
    /// Refused before it was tried: not allowed, over the run's budget, cancelled by a hook.
    Denied(String),
    /// A request the host cannot make sense of.
    Invalid(String),
    /// Tried, and it failed: the guest gets `{"error": …}`.
    Failed(String),
    /// Not available where it was called (`ai_complete` and `mcp_call` in a hook).
    Unavailable(String),
}

/// The run's side of the host functions that reach models and MCP servers, and the operation
/// every outgoing call is.
pub trait HostServices: Send + Sync {
    /// Runs `call` (a call of `plugin`'s host function `function` to `target`: a host, a model,
    /// `server.tool`) as an operation of the run; hooks may refuse it.
    fn observed<'a>(
        &'a self,
        plugin: &'a str,
        function: &'static str,
        target: String,
        call: HostFuture<'a, Result<Value, HostError>>,
    ) -> HostFuture<'a, Result<Value, HostError>>;

    /// A completion (`{"model"?, "system"?, "prompt"? | "messages", "max_tokens"?,
    /// "temperature"?}`) through the run's providers, rate limits and budget, recorded with the
    /// run's usage: `{"content", "model", "input_tokens", "output_tokens", "finish_reason"}`.
    fn complete<'a>(&'a self, plugin: &'a str, request: Value) -> HostFuture<'a, Result<Value, HostError>>;

    /// A tool of one of the run's MCP servers: `{"text", "is_error"}`.
    fn mcp_call<'a>(
        &'a self,
        plugin: &'a str,
        server: &'a str,
        tool: &'a str,
        arguments: Value,
    ) -> HostFuture<'a, Result<Value, HostError>>;
}

/// What the operator allows WASM plugins beyond their capabilities (`plugins.wasm.http`, `.ai`,
/// `.mcp`).
#[derive(Debug, Clone)]
pub struct HostPolicy {
    /// Hosts `http_request` may reach, redirects included: `api.example.com` (on its scheme's
    /// port), `api.example.com:8443`, or `*.example.com` for its subdomains; an IP address as
    /// written (`127.0.0.1:9000`). A name must resolve to public addresses only (loopback,
    /// private and link-local ones are refused: list the IP to reach one). Empty: none.
    pub allowed_hosts: Vec<String>,
    /// The whole HTTP exchange.
    pub http_timeout: Duration,
    /// The most of a response body a plugin gets; the rest is cut (`"truncated": true`).
    pub max_response_bytes: usize,
    /// Model aliases `ai_complete` may name; leaving `model` out asks for the default model,
    /// which is always allowed.
    pub ai_models: Vec<String>,
    /// The most tokens one completion may produce (a larger `max_tokens` is lowered).
    pub ai_max_tokens: u32,
    /// `server.tool` or `server.*` patterns `mcp_call` may call. Empty: none.
    pub mcp_tools: Vec<String>,
}

impl Default for HostPolicy {
    fn default() -> Self {
        Self {
            allowed_hosts: Vec::new(),
            http_timeout: Duration::from_secs(10),
            max_response_bytes: 1024 * 1024,
            ai_models: Vec::new(),
            ai_max_tokens: 1024,
            mcp_tools: Vec::new(),
        }
    }
}

/// At most this many redirects are followed, each to an allowed host.
const MAX_REDIRECTS: usize = 5;

/// Headers a plugin may not set: where the request goes and how it is framed are the host's.
const HOST_SET_HEADERS: [&str; 9] =
    ["host", "connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "content-length", "expect"];

impl HostPolicy {
    /// Whether `http_request` may reach `port` of `host` (a URL's host, as `url` gives it).
    pub fn host_allowed(&self, host: &str, port: u16, default_port: u16) -> bool {
        host_in(&self.allowed_hosts, host, port, default_port)
    }

    /// Whether `ai_complete` may use `model` (`None`: the default model).
    pub(crate) fn model_allowed(&self, model: Option<&str>) -> bool {
        model.is_none_or(|m| self.ai_models.iter().any(|a| a == m))
    }

    /// Whether `mcp_call` may call `tool` of `server`.
    pub(crate) fn tool_allowed(&self, server: &str, tool: &str) -> bool {
        let name = format!("{server}.{tool}");
        self.mcp_tools.iter().any(|p| match p.strip_suffix(".*") {
            Some(s) => s == server,
            None => *p == name,
        })
    }

    /// The client `http_request` uses: redirects followed only to allowed hosts, over https
    /// (or http on loopback), at most [`MAX_REDIRECTS`]; a refused redirect is answered as the
    /// redirect response itself.
    pub(crate) fn client(&self) -> Result<reqwest::Client, String> {
        let hosts = self.allowed_hosts.clone();
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            let url = attempt.url();
            let secure = url.scheme() == "https" || (url.scheme() == "http" && is_loopback(url));
            let listed = url.host_str().is_some_and(|h| {
                host_in(&hosts, h, url.port_or_known_default().unwrap_or(0), if url.scheme() == "https" { 443 } else { 80 })
            });
            if attempt.previous().len() >= MAX_REDIRECTS || !secure || !listed { attempt.stop() } else { attempt.follow() }
        });
        reqwest::Client::builder()
            .redirect(policy)
            .timeout(self.http_timeout)
            .dns_resolver(Arc::new(PublicOnly))
            .no_proxy()
            .build()
            .map_err(|e| e.to_string())
    }
}

/// An `allowed_hosts` entry: its host (lowercase, `*.` kept) and its port, if it names one.
fn entry(e: &str) -> (String, Option<u16>) {
    let e = e.trim().to_ascii_lowercase();
    if let Some(rest) = e.strip_prefix('[') {
        // [v6] or [v6]:port
        let (host, after) = rest.split_once(']').unwrap_or((rest, ""));
        return (format!("[{host}]"), after.strip_prefix(':').and_then(|p| p.parse().ok()));
    }
    match e.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(p) => (host.trim_end_matches('.').to_owned(), Some(p)),
            Err(_) => (e.clone(), None),
        },
        _ => (e.trim_end_matches('.').to_owned(), None),
    }
}

/// Whether `host:port` is listed; an entry without a port allows the scheme's own.
fn host_in(allowed: &[String], host: &str, port: u16, default_port: u16) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    allowed.iter().any(|a| {
        let (pattern, listed_port) = entry(a);
        let host_ok = match pattern.strip_prefix("*.") {
            Some(suffix) => host.len() > suffix.len() && host.ends_with(suffix) && host[..host.len() - suffix.len()].ends_with('.'),
            None => host == pattern,
        };
        host_ok && port == listed_port.unwrap_or(default_port)
    })
}

/// Resolves names to public addresses only: a listed name must not lead to this machine or
/// a private network (an IP address the operator lists is connected to as written, without
/// resolving).
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> = found.iter().copied().filter(|a| is_public(a.ip())).collect();
            if public.is_empty() {
                let why = format!("{name} resolves to no public address ({} found): list the IP address to reach it", found.len());
                return Err(why.into());
            }
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.octets()[0] == 100 && (v4.octets()[1] & 0xc0) == 64)
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            !(v6.is_loopback() || v6.is_unspecified() || v6.is_multicast() || (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80)
                && v6.to_ipv4_mapped().is_none_or(|v4| is_public(IpAddr::V4(v4)))
        }
    }
}

fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else { return false };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// An `http_request` checked against the policy: what to send, and the host it goes to (for the
/// operation's name).
pub(crate) struct HttpRequest {
    method: reqwest::Method,
    url: reqwest::Url,
    headers: Vec<(String, String)>,
    body: Option<String>,
}

impl HttpRequest {
    /// `{"method"?: "GET", "url", "headers"?: {name: value}, "body"?: "text"}`, checked.
    pub(crate) fn parse(request: &Value, policy: &HostPolicy) -> Result<Self, HostError> {
        let invalid = |m: &str| HostError::Invalid(m.to_owned());
        if policy.allowed_hosts.is_empty() {
            return Err(HostError::Denied("plugins.wasm.http.allowed_hosts is empty: no host may be reached".into()));
        }
        let Value::Object(r) = request else { return Err(invalid("the request must be a JSON object")) };
        let method = match r.get("method").map(Value::as_str) {
            None => reqwest::Method::GET,
            Some(Some(m)) if ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"].contains(&m.to_ascii_uppercase().as_str()) => {
                reqwest::Method::from_bytes(m.to_ascii_uppercase().as_bytes()).map_err(|_| invalid("bad method"))?
            }
            Some(_) => return Err(invalid("method must be one of GET, HEAD, POST, PUT, PATCH, DELETE")),
        };
        let raw = r.get("url").and_then(Value::as_str).ok_or_else(|| invalid("url is missing"))?;
        let url = reqwest::Url::parse(raw).map_err(|e| HostError::Invalid(format!("url \"{raw}\" is not a URL: {e}")))?;
        let host = url.host_str().unwrap_or_default().to_owned();
        match url.scheme() {
            "https" => {}
            "http" if is_loopback(&url) => {}
            "http" => return Err(HostError::Denied(format!("plain http to {host} is refused: use https"))),
            other => return Err(HostError::Invalid(format!("url must be http(s), not {other}:"))),
        }
        let default_port = if url.scheme() == "https" { 443 } else { 80 };
        let port = url.port_or_known_default().unwrap_or(default_port);
        if !policy.host_allowed(&host, port, default_port) {
            return Err(HostError::Denied(format!("{host}:{port} is not in plugins.wasm.http.allowed_hosts")));
        }
        let mut headers = Vec::new();
        match r.get("headers") {
            None | Some(Value::Null) => {}
            Some(Value::Object(h)) => {
                for (k, v) in h {
                    let Some(v) = v.as_str() else { return Err(invalid("header values must be strings")) };
                    if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() || reqwest::header::HeaderValue::from_str(v).is_err()
                    {
                        return Err(HostError::Invalid(format!("header \"{k}\" is not a valid HTTP header")));
                    }
                    let lower = k.to_ascii_lowercase();
                    if HOST_SET_HEADERS.contains(&lower.as_str()) || lower.starts_with("proxy-") {
                        return Err(HostError::Invalid(format!("header \"{k}\" is the host's to set")));
                    }
                    headers.push((k.clone(), v.to_owned()));
                }
            }
            Some(_) => return Err(invalid("headers must be an object of name → value")),
        }
        let body = match r.get("body") {
            None | Some(Value::Null) => None,
            Some(Value::String(b)) => Some(b.clone()),
            Some(other) => Some(other.to_string()),
        };
        for key in r.keys() {
            if !["method", "url", "headers", "body"].contains(&key.as_str()) {
                return Err(HostError::Invalid(format!("unknown field \"{key}\" (method, url, headers, body)")));
            }
        }
        Ok(Self { method, url, headers, body })
    }

    pub(crate) fn host(&self) -> String {
        self.url.host_str().unwrap_or_default().to_owned()
    }

    /// Sends it: `{"status", "headers", "body", "truncated"}` (and `"binary": true` when the body
    /// is not UTF-8: it is then given lossily). Any status is an answer; a transport failure is
    /// [`HostError::Failed`].
    pub(crate) async fn send(self, client: &reqwest::Client, max_body: usize) -> Result<Value, HostError> {
        let mut req = client.request(self.method, self.url);
        for (k, v) in self.headers {
            req = req.header(k, v);
        }
        if let Some(b) = self.body {
            req = req.body(b);
        }
        let mut response = req.send().await.map_err(|e| HostError::Failed(error_chain(e)))?;
        let status = response.status().as_u16();
        let mut headers = Map::new();
        for (k, v) in response.headers() {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
            match headers.get_mut(k.as_str()) {
                Some(Value::String(prev)) => {
                    prev.push_str(", ");
                    prev.push_str(&v);
                }
                _ => {
                    headers.insert(k.as_str().to_owned(), Value::String(v));
                }
            }
        }
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = response.chunk().await.map_err(|e| HostError::Failed(error_chain(e)))? {
            let room = max_body.saturating_sub(body.len());
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let mut answer = json!({"status": status, "headers": headers, "truncated": truncated});
        match String::from_utf8(body) {
            Ok(text) => answer["body"] = Value::String(text),
            Err(e) => {
                answer["body"] = Value::String(String::from_utf8_lossy(e.as_bytes()).into_owned());
                answer["binary"] = Value::Bool(true);
            }
        }
        Ok(answer)
    }
}

/// An error with its causes, without the URL (a request's URL may carry a secret).
fn error_chain(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> HostPolicy {
        HostPolicy {
            allowed_hosts: vec!["api.example.com".into(), "*.corp.example".into(), "127.0.0.1:9".into(), "API.other.example.:8443".into()],
            mcp_tools: vec!["github.search".into(), "docs.*".into()],
            ai_models: vec!["small".into()],
            ..HostPolicy::default()
        }
    }

    #[test]
    fn hosts_models_and_tools_are_allowed_by_the_lists() {
        let p = policy();
        for (host, port, ok) in [
            ("api.example.com", 443, true),
            ("API.example.com.", 443, true),
            ("api.example.com", 8443, false),
            ("evil.api.example.com", 443, false),
            ("wiki.corp.example", 443, true),
            ("a.b.corp.example", 443, true),
            ("corp.example", 443, false),
            ("notcorp.example", 443, false),
            ("example.com", 443, false),
            ("127.0.0.1", 9, true),
            ("127.0.0.1", 8080, false),
            ("api.other.example", 8443, true),
            ("api.other.example", 443, false),
        ] {
            assert_eq!(p.host_allowed(host, port, 443), ok, "{host}:{port}");
        }
        assert!(p.model_allowed(None) && p.model_allowed(Some("small")) && !p.model_allowed(Some("large")));
        assert!(p.tool_allowed("github", "search") && !p.tool_allowed("github", "delete_repo") && p.tool_allowed("docs", "read"));
        assert!(!HostPolicy::default().host_allowed("api.example.com", 443, 443), "nothing is allowed by default");
        for (ip, public) in [
            ("8.8.8.8", true),
            ("127.0.0.1", false),
            ("10.1.2.3", false),
            ("169.254.169.254", false),
            ("100.64.0.1", false),
            ("::1", false),
            ("fd00::1", false),
            ("::ffff:127.0.0.1", false),
            ("2001:4860::8888", true),
        ] {
            assert_eq!(is_public(ip.parse().expect("ip")), public, "{ip}");
        }
    }

    #[test]
    fn requests_are_checked_before_anything_is_sent() {
        let p = policy();
        let parse = |v: Value| HttpRequest::parse(&v, &p).map(|r| (r.method.to_string(), r.host()));
        assert_eq!(parse(json!({"url": "https://api.example.com/x"})), Ok(("GET".into(), "api.example.com".into())));
        assert_eq!(parse(json!({"method": "post", "url": "http://127.0.0.1:9/x", "body": {"a": 1}})).map(|r| r.0), Ok("POST".into()));
        let err = |v: Value| parse(v).expect_err("refused");
        assert!(matches!(err(json!({"url": "http://127.0.0.1:5100/mcp"})), HostError::Denied(_)), "another port of an allowed IP");
        assert!(matches!(err(json!({"url": "https://api.example.com@evil.example/"})), HostError::Denied(_)));
        for header in ["Host", "Transfer-Encoding", "Proxy-Authorization", "connection"] {
            let headers: Map<String, Value> = [(header.to_owned(), json!("x"))].into_iter().collect();
            let refused = err(json!({"url": "https://api.example.com/", "headers": headers}));
            assert!(matches!(&refused, HostError::Invalid(m) if m.contains("the host's to set")), "{header}: {refused:?}");
        }
        assert!(
            matches!(err(json!({"url": "https://other.example/"})), HostError::Denied(m) if m.contains("not in plugins.wasm.http.allowed_hosts"))
        );
        assert!(matches!(err(json!({"url": "http://api.example.com/"})), HostError::Denied(m) if m.contains("plain http")));
        assert!(matches!(err(json!({"url": "ftp://api.example.com/"})), HostError::Invalid(_)));
        assert!(matches!(err(json!({"url": "not a url"})), HostError::Invalid(_)));
        assert!(matches!(err(json!({"method": "BREW", "url": "https://api.example.com/"})), HostError::Invalid(_)));
        assert!(matches!(err(json!({"url": "https://api.example.com/", "headers": {"bad header": "x"}})), HostError::Invalid(_)));
        assert!(
            matches!(err(json!({"url": "https://api.example.com/", "timeout": 5})), HostError::Invalid(m) if m.contains("unknown field"))
        );
        assert!(matches!(err(json!("https://api.example.com/")), HostError::Invalid(_)));
    }
}
