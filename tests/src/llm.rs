//! A scripted OpenAI-compatible server: the real wire format over real HTTP on loopback,
//! answering from a script the test writes. It serves Chat Completions
//! (`POST /v1/chat/completions`, and Azure OpenAI's
//! `POST /openai/deployments/{deployment}/chat/completions?api-version=…`) and the Responses API
//! (`POST /v1/responses`), and keeps every request it was sent, with its arrival time.
//!
//! The script is a function from the request to a [`Reply`], so concurrent conversations
//! (parallel agents) get answers that depend on what they said, not on arrival order.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// What the server answers to one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A final text answer.
    Text(String),
    /// Tool calls: (wire name, arguments as JSON text — which need not be valid JSON).
    Tools(Vec<(String, String)>),
    /// An HTTP error status, with an optional `Retry-After` value.
    Status { code: u16, retry_after: Option<String> },
    /// No reply at all: the request is held until the client gives up on it (its timeout,
    /// a cancelled run, a killed worker). An event, not a delay: nothing waits on a clock.
    Hang,
    /// The inner reply, held until `open` is true: the test acts (kills the client, say)
    /// knowing the call is in flight. An event, not a delay.
    Held(tokio::sync::watch::Receiver<bool>, Box<Reply>),
}

/// One request the server was sent.
#[derive(Debug, Clone)]
pub struct Seen {
    /// With the query, if any.
    pub path: String,
    pub body: Value,
    pub at: Instant,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// Azure's `api-key` header, if any.
    pub api_key: Option<String>,
}

type Script = dyn Fn(&Value) -> Reply + Send + Sync;

struct Inner {
    script: Box<Script>,
    seen: Mutex<Vec<Seen>>,
    /// Tokens each reply reports: (prompt, completion).
    usage: (u64, u64),
}

/// The running server; stops when dropped.
pub struct ScriptedLlm {
    addr: SocketAddr,
    inner: Arc<Inner>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl ScriptedLlm {
    /// Starts it on a free port. Every reply reports `usage` tokens (prompt, completion).
    pub async fn start(usage: (u64, u64), script: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Self {
        let inner = Arc::new(Inner { script: Box::new(script), seen: Mutex::new(Vec::new()), usage });
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/openai/deployments/{deployment}/chat/completions", post(chat))
            .route("/v1/responses", post(responses))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(async { drop(stopped.await) }).await;
        });
        Self { addr, inner, stop }
    }

    /// `http://127.0.0.1:PORT/v1`, the `base_url` of a provider.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `http://127.0.0.1:PORT`, the `endpoint` of an Azure OpenAI provider.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.inner.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops serving (connections in flight are dropped).
    pub fn stop(self) {
        let _ = self.stop.send(());
    }
}

fn record(inner: &Inner, path: &str, headers: &HeaderMap, body: &Value) {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    inner.seen.lock().unwrap_or_else(|e| e.into_inner()).push(Seen {
        path: path.into(),
        body: body.clone(),
        at: Instant::now(),
        authorization: header("authorization"),
        api_key: header("api-key"),
    });
}

async fn resolve(reply: Reply) -> Result<Reply, Response> {
    let mut reply = reply;
    while let Reply::Held(mut open, inner) = reply {
        // A sender gone counts as open: nothing will hold it any longer.
        let _ = open.wait_for(|o| *o).await;
        reply = *inner;
    }
    if let Reply::Hang = reply {
        // Dropped with the connection when the client goes away.
        std::future::pending::<()>().await;
    }
    if let Reply::Status { code, retry_after } = &reply {
        let status = StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = json!({"error": {"message": format!("scripted {code}"), "type": "scripted"}}).to_string();
        let mut resp = (status, [("content-type", "application/json")], body).into_response();
        if let Some(r) = retry_after {
            resp.headers_mut().insert("retry-after", r.parse().expect("header value"));
        }
        return Err(resp);
    }
    Ok(reply)
}

async fn chat(State(inner): State<Arc<Inner>>, uri: axum::http::Uri, headers: HeaderMap, body: axum::Json<Value>) -> Response {
    record(&inner, &uri.to_string(), &headers, &body);
    let reply = match resolve((inner.script)(&body)).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let n = inner.seen.lock().unwrap_or_else(|e| e.into_inner()).len();
    let (message, finish) = match reply {
        Reply::Text(t) => (json!({"role": "assistant", "content": t}), "stop"),
        Reply::Tools(calls) => {
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, (name, args))| json!({"id": format!("call_{n}_{i}"), "type": "function", "function": {"name": name, "arguments": args}}))
                .collect();
            (json!({"role": "assistant", "content": null, "tool_calls": calls}), "tool_calls")
        }
        Reply::Status { .. } | Reply::Hang | Reply::Held(..) => unreachable!("resolved above"),
    };
    let (p, c) = inner.usage;
    axum::Json(json!({
        "id": format!("chatcmpl-{n}"),
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": body.get("model").cloned().unwrap_or(Value::Null),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
    }))
    .into_response()
}

async fn responses(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: axum::Json<Value>) -> Response {
    record(&inner, "/v1/responses", &headers, &body);
    let reply = match resolve((inner.script)(&body)).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let n = inner.seen.lock().unwrap_or_else(|e| e.into_inner()).len();
    let output: Vec<Value> = match reply {
        Reply::Text(t) => vec![json!({
            "type": "message", "id": format!("msg_{n}"), "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": t, "annotations": []}]
        })],
        Reply::Tools(calls) => calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| {
                json!({"type": "function_call", "id": format!("fc_{n}_{i}"), "call_id": format!("call_{n}_{i}"), "name": name, "arguments": args, "status": "completed"})
            })
            .collect(),
        Reply::Status { .. } | Reply::Hang | Reply::Held(..) => unreachable!("resolved above"),
    };
    let (p, c) = inner.usage;
    axum::Json(json!({
        "id": format!("resp_{n}"), "object": "response", "created_at": 1_700_000_000, "status": "completed",
        "model": body.get("model").cloned().unwrap_or(Value::Null),
        "output": output,
        "usage": {"input_tokens": p, "output_tokens": c, "total_tokens": p + c,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
    }))
    .into_response()
}

/// The chat messages of a Chat Completions request.
pub fn messages(body: &Value) -> &[Value] {
    body.get("messages").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// The text of the last message of a chat request (a tool result or the user's input).
pub fn last_text(body: &Value) -> String {
    messages(body).last().and_then(|m| m.get("content")).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// How many tool results the conversation holds so far.
pub fn tool_results(body: &Value) -> usize {
    messages(body).iter().filter(|m| m.get("role").and_then(Value::as_str) == Some("tool")).count()
}

/// The system prompt of a chat request.
pub fn system(body: &Value) -> String {
    messages(body)
        .iter()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("system"))
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The first user message of a chat request (what the agent was asked).
pub fn user_input(body: &Value) -> String {
    messages(body)
        .iter()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

impl ScriptedLlm {
    /// An `ai:` section with one provider, `scripted`, at this server, and the model alias
    /// `default` every agent resolves to.
    pub fn ai_section(&self) -> String {
        format!(
            "ai:\n  default_model: default\n  providers:\n    scripted:\n      base_url: {}\n      models:\n        default: {{id: scripted-model}}\n",
            self.base_url()
        )
    }
}
