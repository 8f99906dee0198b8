//! Calling a model: one request to an OpenAI-compatible provider, with the per-call timeout,
//! retries with backoff on 429/5xx/timeouts (a `Retry-After` wins over the backoff), and the
//! provider's rate limits.
//!
//! Requests are async-openai's wire types (Chat Completions, or the Responses API for models
//! with `api_type: responses`); they are sent with reqwest so that the status and
//! `Retry-After` of a failed call are seen, and replies are read leniently (local servers
//! such as llama.cpp omit fields the official types require). The key goes only into the
//! request's header; no error message, log line or record carries it.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_openai::types::chat::{
    ChatCompletionMessageToolCall, ChatCompletionMessageToolCalls, ChatCompletionRequestAssistantMessage,
    ChatCompletionRequestAssistantMessageContent, ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestToolMessage, ChatCompletionRequestToolMessageContent, ChatCompletionRequestUserMessage, ChatCompletionTool,
    ChatCompletionTools, CreateChatCompletionRequest, FunctionCall, FunctionObject,
};
use async_openai::types::responses::{
    CreateResponse, EasyInputMessage, FunctionCallOutput, FunctionCallOutputItemParam, FunctionTool, FunctionToolCall, InputItem,
    InputParam, Item, Role, Tool as ResponsesTool,
};
use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use lamplighter_config::{ModelApi, Provider, ProviderApi, RateLimit};

/// A message of a conversation, provider-neutral.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Msg {
    System(String),
    User(String),
    Assistant { content: String, calls: Vec<ToolCall> },
    Tool { call_id: String, content: String },
}

/// A tool call as the model made it (`name` is the wire name).
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub(crate) struct ToolCall {
    pub(crate) id: String,
    pub(crate) name: String,
    /// JSON text, as the model wrote it (possibly not JSON at all).
    pub(crate) arguments: String,
}

/// A tool as offered.
#[derive(Debug, Clone)]
pub(crate) struct ToolSpec {
    pub(crate) wire: String,
    pub(crate) description: String,
    pub(crate) parameters: Value,
}

/// A model's answer to one call.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Reply {
    pub(crate) content: String,
    pub(crate) calls: Vec<ToolCall>,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) finish_reason: Option<String>,
    /// Calls made, retries included.
    pub(crate) attempts: u32,
}

/// Why one HTTP attempt failed.
#[derive(Debug)]
enum Failure {
    /// Worth another attempt (429, 5xx, timeout, connection): after `retry_after` if the
    /// provider said so.
    Transient { error: String, retry_after: Option<Duration> },
    /// Not (400, 401, 404, an unreadable reply): the run fails with it.
    Fatal(String),
}

/// A model call that did not return an answer. `retry`: whether a later attempt of the run
/// may succeed (the provider was unavailable, not refusing).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CallFailed {
    pub(crate) error: String,
    pub(crate) retry: bool,
}

impl CallFailed {
    fn new(error: String, retry: bool) -> Self {
        Self { error, retry }
    }
}

/// One model of one provider, ready to call.
#[derive(Debug)]
pub(crate) struct Endpoint {
    url: String,
    api: ModelApi,
    /// What the request's `model` says (the model id, or the Azure deployment).
    model: String,
    auth: Auth,
    /// Official OpenAI and Azure want `max_completion_tokens`; other servers `max_tokens`.
    completion_tokens_field: bool,
    pub(crate) max_tokens: Option<u32>,
    pub(crate) temperature: Option<f64>,
    timeout: Duration,
    max_retries: u32,
    provider: String,
}

#[derive(Clone)]
enum Auth {
    None,
    Bearer(String),
    AzureKey(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auth::None => "none",
            Auth::Bearer(_) => "bearer <redacted>",
            Auth::AzureKey(_) => "api-key <redacted>",
        })
    }
}

impl Endpoint {
    /// The endpoint for `model` of `provider`; an error says why it cannot be called.
    pub(crate) fn new(provider: &Provider, model: &lamplighter_config::Model) -> Result<Self, String> {
        let key = provider.api_key.as_ref().map(|k| k.expose().to_string()).filter(|k| !k.is_empty());
        let path = match model.api {
            ModelApi::Chat => "chat/completions",
            ModelApi::Responses => "responses",
        };
        let (url, auth, completion_tokens_field, name) = match &provider.api {
            ProviderApi::OpenAiCompatible { base_url } => {
                let official = base_url.contains("openai.com") || base_url.contains(".azure.com");
                (format!("{}/{path}", base_url.trim_end_matches('/')), key.map_or(Auth::None, Auth::Bearer), official, model.id.clone())
            }
            ProviderApi::AzureOpenAi { endpoint, api_version } => {
                let Some(key) = key else {
                    return Err(format!("provider \"{}\" (Azure OpenAI) has no api_key", provider.name));
                };
                let base = endpoint.trim_end_matches('/');
                let deployment = model.deployment_name.clone().unwrap_or_else(|| model.id.clone());
                let url = match model.api {
                    // Azure serves Responses on its v1 surface; the deployment goes in `model`.
                    ModelApi::Responses => format!("{base}/openai/v1/responses"),
                    ModelApi::Chat => {
                        let version = api_version.as_deref().unwrap_or("2024-10-21");
                        format!("{base}/openai/deployments/{deployment}/chat/completions?api-version={version}")
                    }
                };
                (url, Auth::AzureKey(key), true, deployment)
            }
            ProviderApi::Unspecified => {
                return Err(format!("provider \"{}\" has neither base_url nor endpoint", provider.name));
            }
        };
        Ok(Self {
            url,
            api: model.api,
            model: name,
            auth,
            completion_tokens_field,
            max_tokens: model.max_tokens,
            temperature: model.default_temperature,
            timeout: provider.timeout,
            max_retries: provider.max_retries,
            provider: provider.name.clone(),
        })
    }

    /// What the request's `model` says.
    pub(crate) fn model(&self) -> &str {
        &self.model
    }

    pub(crate) fn provider(&self) -> &str {
        &self.provider
    }

    /// One model call: retried on transient failures until `max_retries`, waiting for the
    /// rate limiter first each time. Cancelling `cancel` abandons it.
    pub(crate) async fn call(
        &self,
        http: &reqwest::Client,
        limiter: &Limiter,
        messages: &[Msg],
        tools: &[ToolSpec],
        cancel: &CancellationToken,
    ) -> Result<Reply, CallFailed> {
        let body = match self.api {
            ModelApi::Chat => serde_json::to_value(self.chat_request(messages, tools)),
            ModelApi::Responses => serde_json::to_value(self.responses_request(messages, tools)),
        }
        .map_err(|e| CallFailed::new(format!("cannot encode the request: {e}"), false))?;
        let cancelled = || CallFailed::new("cancelled".into(), false);
        let mut attempt = 0;
        loop {
            attempt += 1;
            tokio::select! {
                () = cancel.cancelled() => return Err(cancelled()),
                () = limiter.admit() => {}
            }
            let sent = tokio::select! {
                () = cancel.cancelled() => return Err(cancelled()),
                r = tokio::time::timeout(self.timeout, self.send(http, &body)) => r,
            };
            let failure = match sent {
                Ok(Ok(mut reply)) => {
                    limiter.spent(reply.input_tokens.saturating_add(reply.output_tokens));
                    reply.attempts = attempt;
                    return Ok(reply);
                }
                Ok(Err(f)) => f,
                Err(_) => {
                    Failure::Transient { error: format!("no reply within {}", humantime::format_duration(self.timeout)), retry_after: None }
                }
            };
            limiter.spent(0);
            match failure {
                Failure::Fatal(e) => return Err(CallFailed::new(format!("provider \"{}\": {e}", self.provider), false)),
                Failure::Transient { error, .. } if attempt > self.max_retries => {
                    let error = format!("provider \"{}\": {error} (gave up after {attempt} attempts)", self.provider);
                    return Err(CallFailed::new(error, true));
                }
                Failure::Transient { error, retry_after } => {
                    let wait = retry_after.unwrap_or_else(|| backoff(attempt));
                    tracing::warn!(provider = %self.provider, attempt, wait_ms = wait.as_millis() as u64, "model call failed, retrying: {error}");
                    tokio::select! {
                        () = cancel.cancelled() => return Err(cancelled()),
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    async fn send(&self, http: &reqwest::Client, body: &Value) -> Result<Reply, Failure> {
        let mut req = http.post(&self.url).json(body);
        req = match &self.auth {
            Auth::None => req,
            Auth::Bearer(k) => req.bearer_auth(k),
            Auth::AzureKey(k) => req.header("api-key", k),
        };
        let resp = req.send().await.map_err(|e| Failure::Transient { error: connection_error(&e), retry_after: None })?;
        let status = resp.status();
        let retry_after = resp.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(parse_retry_after);
        let text = resp.text().await.map_err(|e| Failure::Transient { error: connection_error(&e), retry_after: None })?;
        if !status.is_success() {
            let error = format!("HTTP {status}: {}", error_message(&text));
            return Err(if status.as_u16() == 429 || status.as_u16() == 408 || status.is_server_error() {
                Failure::Transient { error, retry_after }
            } else {
                Failure::Fatal(error)
            });
        }
        let parsed = match self.api {
            ModelApi::Chat => parse_chat(&text),
            ModelApi::Responses => parse_responses(&text),
        };
        parsed.map_err(|e| Failure::Fatal(format!("unreadable reply: {e}: {}", snippet(&text))))
    }

    #[allow(deprecated)] // `max_tokens`: what servers other than OpenAI's understand.
    fn chat_request(&self, messages: &[Msg], tools: &[ToolSpec]) -> CreateChatCompletionRequest {
        let messages = messages
            .iter()
            .map(|m| match m {
                Msg::System(s) => ChatCompletionRequestSystemMessage::from(s.as_str()).into(),
                Msg::User(s) => ChatCompletionRequestUserMessage::from(s.as_str()).into(),
                Msg::Assistant { content, calls } => ChatCompletionRequestMessage::Assistant(ChatCompletionRequestAssistantMessage {
                    // Some servers (llama.cpp) refuse an assistant message without content.
                    content: Some(ChatCompletionRequestAssistantMessageContent::Text(content.clone())),
                    tool_calls: (!calls.is_empty()).then(|| {
                        calls
                            .iter()
                            .map(|c| {
                                ChatCompletionMessageToolCalls::Function(ChatCompletionMessageToolCall {
                                    id: c.id.clone(),
                                    function: FunctionCall { name: c.name.clone(), arguments: c.arguments.clone() },
                                })
                            })
                            .collect()
                    }),
                    ..Default::default()
                }),
                Msg::Tool { call_id, content } => ChatCompletionRequestMessage::Tool(ChatCompletionRequestToolMessage {
                    content: ChatCompletionRequestToolMessageContent::Text(content.clone()),
                    tool_call_id: call_id.clone(),
                }),
            })
            .collect();
        let tools: Vec<ChatCompletionTools> = tools
            .iter()
            .map(|t| {
                ChatCompletionTools::Function(ChatCompletionTool {
                    function: FunctionObject {
                        name: t.wire.clone(),
                        description: Some(t.description.clone()),
                        parameters: Some(t.parameters.clone()),
                        strict: None,
                    },
                })
            })
            .collect();
        let mut req = CreateChatCompletionRequest {
            model: self.model.clone(),
            messages,
            temperature: self.temperature.map(|t| t as f32),
            ..Default::default()
        };
        if !tools.is_empty() {
            req.tools = Some(tools);
        }
        if self.completion_tokens_field {
            req.max_completion_tokens = self.max_tokens;
        } else {
            req.max_tokens = self.max_tokens;
        }
        req
    }

    fn responses_request(&self, messages: &[Msg], tools: &[ToolSpec]) -> CreateResponse {
        let mut instructions = Vec::new();
        let mut input: Vec<InputItem> = Vec::new();
        for m in messages {
            match m {
                Msg::System(s) => instructions.push(s.clone()),
                Msg::User(s) => input.push(EasyInputMessage { role: Role::User, content: s.as_str().into(), ..Default::default() }.into()),
                Msg::Assistant { content, calls } => {
                    if !content.is_empty() {
                        input.push(
                            EasyInputMessage { role: Role::Assistant, content: content.as_str().into(), ..Default::default() }.into(),
                        );
                    }
                    for c in calls {
                        input.push(
                            Item::FunctionCall(FunctionToolCall {
                                call_id: c.id.clone(),
                                name: c.name.clone(),
                                arguments: c.arguments.clone(),
                                ..Default::default()
                            })
                            .into(),
                        );
                    }
                }
                Msg::Tool { call_id, content } => input.push(
                    Item::FunctionCallOutput(FunctionCallOutputItemParam {
                        call_id: Some(call_id.clone()),
                        output: FunctionCallOutput::Text(content.clone()),
                        id: None,
                        status: None,
                        name: None,
                        namespace: None,
                        caller: None,
                    })
                    .into(),
                ),
            }
        }
        let tools: Vec<ResponsesTool> = tools
            .iter()
            .map(|t| {
                ResponsesTool::Function(FunctionTool {
                    name: t.wire.clone(),
                    description: Some(t.description.clone()),
                    parameters: Some(t.parameters.clone()),
                    strict: Some(false),
                    ..Default::default()
                })
            })
            .collect();
        CreateResponse {
            model: Some(self.model.clone()),
            instructions: (!instructions.is_empty()).then(|| instructions.join("\n\n")),
            input: InputParam::Items(input),
            tools: (!tools.is_empty()).then_some(tools),
            max_output_tokens: self.max_tokens,
            temperature: self.temperature.map(|t| t as f32),
            store: Some(false),
            ..Default::default()
        }
    }
}

/// 0.5 s, 1 s, 2 s, … up to 30 s.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(500u64.saturating_mul(1 << attempt.saturating_sub(1).min(6))).min(Duration::from_secs(30))
}

/// `Retry-After`: seconds, or an HTTP date. Capped at 10 minutes.
fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    let d = match v.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s.min(600.0)),
        _ => {
            let at = chrono::DateTime::parse_from_rfc2822(v).ok()?;
            (at.with_timezone(&chrono::Utc) - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO)
        }
    };
    Some(d.min(Duration::from_secs(600)))
}

/// A request that got no answer, with every cause (reqwest's Display names the URL: a caller
/// whose URL may hold a secret passes the error `without_url`).
pub(crate) fn connection_error(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// The provider's `error.message` if the body has one, else the start of the body.
fn error_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v.pointer("/error/message").or_else(|| v.get("error")).or_else(|| v.get("message")).cloned())
        .map(|m| m.as_str().map_or_else(|| m.to_string(), str::to_string))
        .unwrap_or_else(|| snippet(body))
}

fn snippet(s: &str) -> String {
    let s = s.trim();
    if s.len() <= 300 { s.to_string() } else { format!("{}…", &s[..s.floor_char_boundary(300)]) }
}

// Replies, read leniently: only what the loop needs, every field optional.

#[derive(Deserialize)]
struct ChatReply {
    #[serde(default)]
    choices: Vec<ChatChoice>,
    usage: Option<ChatUsage>,
}

#[derive(Deserialize)]
struct ChatChoice {
    message: Option<ChatMessage>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ChatMessage {
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ChatToolCall>>,
}

#[derive(Deserialize)]
struct ChatToolCall {
    id: Option<String>,
    function: Option<ChatFunction>,
}

#[derive(Deserialize)]
struct ChatFunction {
    name: Option<String>,
    /// A string by the spec; some servers send an object.
    arguments: Option<Value>,
}

#[derive(Deserialize)]
struct ChatUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

fn arguments_text(v: Option<Value>) -> String {
    match v {
        Some(Value::String(s)) => s,
        Some(Value::Null) | None => "{}".into(),
        Some(other) => other.to_string(),
    }
}

fn parse_chat(text: &str) -> Result<Reply, String> {
    let r: ChatReply = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let choice = r.choices.into_iter().next().ok_or("no choices")?;
    let message = choice.message.ok_or("no message")?;
    let calls = message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let f = c.function.unwrap_or(ChatFunction { name: None, arguments: None });
            ToolCall {
                id: c.id.filter(|s| !s.is_empty()).unwrap_or_else(|| format!("call_{i}")),
                name: f.name.unwrap_or_default(),
                arguments: arguments_text(f.arguments),
            }
        })
        .collect();
    let usage = r.usage.unwrap_or(ChatUsage { prompt_tokens: 0, completion_tokens: 0 });
    Ok(Reply {
        content: message.content.unwrap_or_default(),
        calls,
        input_tokens: usage.prompt_tokens,
        output_tokens: usage.completion_tokens,
        finish_reason: choice.finish_reason,
        attempts: 1,
    })
}

#[derive(Deserialize)]
struct ResponsesReply {
    #[serde(default)]
    output: Vec<Value>,
    usage: Option<ResponsesUsage>,
    status: Option<String>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ResponsesUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
}

fn parse_responses(text: &str) -> Result<Reply, String> {
    let r: ResponsesReply = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if let Some(e) = r.error.filter(|e| !e.is_null()) {
        return Err(format!("the response failed: {e}"));
    }
    let mut content = String::new();
    let mut calls = Vec::new();
    for item in r.output {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                for part in item.get("content").and_then(Value::as_array).into_iter().flatten() {
                    if let Some(t) = part.get("text").and_then(Value::as_str) {
                        content.push_str(t);
                    }
                }
            }
            Some("function_call") => calls.push(ToolCall {
                id: item.get("call_id").and_then(Value::as_str).unwrap_or_default().to_string(),
                name: item.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                arguments: arguments_text(item.get("arguments").cloned()),
            }),
            _ => {}
        }
    }
    let usage = r.usage.unwrap_or(ResponsesUsage { input_tokens: 0, output_tokens: 0 });
    Ok(Reply { content, calls, input_tokens: usage.input_tokens, output_tokens: usage.output_tokens, finish_reason: r.status, attempts: 1 })
}

/// A provider's `requests_per_minute` and `tokens_per_minute`, over a sliding minute. Tokens
/// are counted when a reply tells them, so a call waits for earlier calls' tokens to age out.
#[derive(Debug)]
pub(crate) struct Limiter {
    limit: RateLimit,
    window: Mutex<VecDeque<(Instant, u64)>>,
}

const MINUTE: Duration = Duration::from_secs(60);

impl Limiter {
    pub(crate) fn new(limit: RateLimit) -> Self {
        Self { limit, window: Mutex::new(VecDeque::new()) }
    }

    pub(crate) fn limit(&self) -> RateLimit {
        self.limit
    }

    /// Waits until a request fits, and counts it.
    async fn admit(&self) {
        if self.limit == RateLimit::default() {
            return;
        }
        loop {
            let wait = {
                let now = tokio::time::Instant::now().into_std();
                let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
                while w.front().is_some_and(|(t, _)| now.duration_since(*t) >= MINUTE) {
                    w.pop_front();
                }
                let requests_full = self.limit.requests_per_minute.is_some_and(|r| w.len() as u64 >= u64::from(r.max(1)));
                let tokens: u64 = w.iter().fold(0u64, |a, (_, n)| a.saturating_add(*n));
                let tokens_full = self.limit.tokens_per_minute.is_some_and(|t| tokens >= u64::from(t.max(1)));
                if !requests_full && !tokens_full {
                    w.push_back((now, 0));
                    return;
                }
                // Until the oldest entry leaves the window.
                w.front().map_or(Duration::ZERO, |(t, _)| MINUTE.saturating_sub(now.duration_since(*t)))
            };
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
        }
    }

    /// Puts the tokens of the call admitted last on its entry.
    fn spent(&self, tokens: u64) {
        if self.limit == RateLimit::default() || tokens == 0 {
            return;
        }
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(last) = w.iter_mut().rev().find(|(_, n)| *n == 0) {
            last.1 = tokens;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_leniently() {
        // llama.cpp-style: no id/object/created, arguments as an object, an odd finish reason.
        let r = parse_chat(
            r#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"t","arguments":{"a":1}}}]},"finish_reason":"eos"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}"#,
        )
        .expect("parse");
        assert_eq!(r.calls, [ToolCall { id: "call_0".into(), name: "t".into(), arguments: r#"{"a":1}"#.into() }]);
        assert_eq!((r.input_tokens, r.output_tokens, r.content.as_str()), (7, 3, ""));
        assert!(parse_chat(r#"{"choices":[]}"#).is_err());
        let r = parse_responses(
            r#"{"status":"completed","output":[{"type":"reasoning"},{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":5,"output_tokens":2}}"#,
        )
        .expect("parse");
        assert_eq!((r.content.as_str(), r.calls.len(), r.input_tokens, r.output_tokens), ("hi", 1, 5, 2));
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_and_backoff_grows_to_a_cap() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO), "a date in the past: now");
        assert_eq!(parse_retry_after("99999"), Some(Duration::from_secs(600)));
        assert_eq!(parse_retry_after("1e20"), Some(Duration::from_secs(600)), "a huge value is capped, not a panic");
        assert_eq!(parse_retry_after("soon"), None);
        assert_eq!((backoff(1), backoff(2), backoff(20)), (Duration::from_millis(500), Duration::from_secs(1), Duration::from_secs(30)));
    }

    #[test]
    fn keys_stay_out_of_debug_output_and_urls_follow_the_provider() {
        let provider = Provider {
            name: "az".into(),
            api: ProviderApi::AzureOpenAi { endpoint: "https://r.openai.azure.com/".into(), api_version: Some("2024-10-21".into()) },
            api_key: Some(lamplighter_config::Secret::new("sk-secret".into())),
            models: Default::default(),
            rate_limit: RateLimit::default(),
            timeout: Duration::from_secs(5),
            max_retries: 1,
        };
        let model = lamplighter_config::Model {
            alias: "gpt".into(),
            id: "gpt".into(),
            deployment_name: Some("dep".into()),
            description: None,
            api: ModelApi::Chat,
            max_tokens: Some(100),
            default_temperature: None,
            pricing: None,
        };
        let e = Endpoint::new(&provider, &model).expect("endpoint");
        assert_eq!(e.url, "https://r.openai.azure.com/openai/deployments/dep/chat/completions?api-version=2024-10-21");
        assert!(!format!("{e:?}").contains("sk-secret"));
        let body = serde_json::to_string(&e.chat_request(&[Msg::User("hi".into())], &[])).expect("json");
        assert!(body.contains(r#""max_completion_tokens":100"#), "Azure wants max_completion_tokens: {body}");
        assert!(!body.contains("sk-secret"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_limiter_holds_requests_over_the_minute() {
        let l = Limiter::new(RateLimit { requests_per_minute: Some(2), tokens_per_minute: None });
        let start = tokio::time::Instant::now();
        l.admit().await;
        l.admit().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        l.admit().await;
        assert_eq!(start.elapsed(), MINUTE, "the third waits for the first to leave the window");
        let t = Limiter::new(RateLimit { requests_per_minute: None, tokens_per_minute: Some(100) });
        t.admit().await;
        t.spent(150);
        let before = tokio::time::Instant::now();
        t.admit().await;
        assert_eq!(before.elapsed(), MINUTE, "over the token budget until the spent tokens age out");
    }
}
