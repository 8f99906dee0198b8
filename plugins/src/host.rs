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
use std::net::IpAddr;
use std::pin::Pin;
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
    /// Hosts `http_request` may reach, redirects included: `api.example.com`, or
    /// `*.example.com` for its subdomains. Empty: none.
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

impl HostPolicy {
    /// Whether `host` is one `http_request` may reach.
    pub fn host_allowed(&self, host: &str) -> bool {
        host_in(&self.allowed_hosts, host)
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
            if attempt.previous().len() >= MAX_REDIRECTS || !secure || !url.host_str().is_some_and(|h| host_in(&hosts, h)) {
                attempt.stop()
            } else {
                attempt.follow()
            }
        });
        reqwest::Client::builder().redirect(policy).timeout(self.http_timeout).build().map_err(|e| e.to_string())
    }
}

fn host_in(allowed: &[String], host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    allowed.iter().any(|a| {
        let a = a.to_ascii_lowercase();
        match a.strip_prefix("*.") {
            Some(suffix) => host.len() > suffix.len() && host.ends_with(suffix) && host[..host.len() - suffix.len()].ends_with('.'),
            None => host == a,
        }
    })
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
        if !policy.host_allowed(&host) {
            return Err(HostError::Denied(format!("host {host} is not in plugins.wasm.http.allowed_hosts")));
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
            allowed_hosts: vec!["api.example.com".into(), "*.corp.example".into(), "127.0.0.1".into()],
            mcp_tools: vec!["github.search".into(), "docs.*".into()],
            ai_models: vec!["small".into()],
            ..HostPolicy::default()
        }
    }

    #[test]
    fn hosts_models_and_tools_are_allowed_by_the_lists() {
        let p = policy();
        for (host, ok) in [
            ("api.example.com", true),
            ("API.example.com.", true),
            ("evil.api.example.com", false),
            ("wiki.corp.example", true),
            ("a.b.corp.example", true),
            ("corp.example", false),
            ("notcorp.example", false),
            ("example.com", false),
        ] {
            assert_eq!(p.host_allowed(host), ok, "{host}");
        }
        assert!(p.model_allowed(None) && p.model_allowed(Some("small")) && !p.model_allowed(Some("large")));
        assert!(p.tool_allowed("github", "search") && !p.tool_allowed("github", "delete_repo") && p.tool_allowed("docs", "read"));
        assert!(!HostPolicy::default().host_allowed("api.example.com"), "nothing is allowed by default");
    }

    #[test]
    fn requests_are_checked_before_anything_is_sent() {
        let p = policy();
        let parse = |v: Value| HttpRequest::parse(&v, &p).map(|r| (r.method.to_string(), r.host()));
        assert_eq!(parse(json!({"url": "https://api.example.com/x"})), Ok(("GET".into(), "api.example.com".into())));
        assert_eq!(parse(json!({"method": "post", "url": "http://127.0.0.1:9/x", "body": {"a": 1}})).map(|r| r.0), Ok("POST".into()));
        let err = |v: Value| parse(v).expect_err("refused");
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
