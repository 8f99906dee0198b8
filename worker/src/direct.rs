//! Read-only tool calls answered outside rmcp (issue 14): `list_jobs`, `get_job`, `list_runs`
//! and `get_run` from a client at 2026-07-28, in the one shape such a client sends them.
//!
//! rmcp carries a structured result as a `serde_json::Value`: a listing of 1,000 jobs becomes
//! some 30,000 small allocations, is written out from that tree, then freed, which was most of
//! the call's time. Here the typed result is written straight into the answer's bytes.
//!
//! It sits inside every guard of `/mcp` (Host, Origin, token, body limit) and takes only
//! requests it recognizes whole; anything else, including anything rmcp would refuse, goes on
//! to rmcp untouched. So are calls whose arguments are refused or that fail: rmcp runs them
//! again (they only read) and words the error, so errors have one source. The answer is the
//! one rmcp gives, member for member, except that `structuredContent` comes before `content`.

use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::mcp::{Control, DIRECT_TOOLS, Read};
use crate::summary::summary;

/// The only protocol revision answered here: stateless, with the short text summary.
const VERSION: &str = "2026-07-28";

/// A bigger request is no read this path knows; rmcp takes it (and its body limit applies).
const MAX_BODY: usize = 64 * 1024;

/// The axum middleware: answers a recognized read, hands everything else to rmcp.
pub(crate) async fn answer(State(control): State<Control>, request: Request, next: Next) -> Response {
    if !wanted(request.method(), request.headers()) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    // `wanted` saw a Content-Length within MAX_BODY, so the body is small and whole.
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    if let Some(call) = recognize(&parts.headers, &bytes)
        && let Some(read) = control.read_directly(call.tool, call.arguments).await
        && let Some(answer) = encode(call.id, call.tool, &read)
    {
        return ([(header::CONTENT_TYPE, "application/json")], Bytes::from(answer)).into_response();
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// The headers of a stateless `tools/call` at [`VERSION`] for one of [`DIRECT_TOOLS`], with a
/// small body of JSON, from a client that accepts JSON and event streams (as rmcp requires),
/// without a session, and without `Mcp-Param-*` headers (none of these tools declares one).
fn wanted(method: &Method, headers: &HeaderMap) -> bool {
    let one = |name: &str| {
        let mut values = headers.get_all(name).iter();
        match (values.next(), values.next()) {
            (Some(v), None) => v.to_str().ok(),
            _ => None,
        }
    };
    let mut accepts = (false, false);
    for value in headers.get_all(header::ACCEPT) {
        // Only plain media types: a parameter (a weight of 0, say) is rmcp's to read.
        for entry in value.to_str().unwrap_or(";").split(',').map(str::trim) {
            accepts.0 |= entry.eq_ignore_ascii_case("application/json");
            accepts.1 |= entry.eq_ignore_ascii_case("text/event-stream");
        }
    }
    *method == Method::POST
        && accepts == (true, true)
        && one("content-type").is_some_and(|v| v.eq_ignore_ascii_case("application/json"))
        && one("content-length").and_then(|v| v.parse::<usize>().ok()).is_some_and(|n| n <= MAX_BODY)
        && one("mcp-protocol-version") == Some(VERSION)
        && one("mcp-method") == Some("tools/call")
        && one("mcp-name").is_some_and(|n| DIRECT_TOOLS.contains(&n))
        && !headers.contains_key("mcp-session-id")
        && !headers.keys().any(|k| k.as_str().starts_with("mcp-param-"))
}

/// A recognized call.
#[derive(Debug)]
struct Call<'a> {
    /// The request id as sent: an integer or a string.
    id: &'a RawValue,
    tool: &'static str,
    arguments: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Message<'a> {
    jsonrpc: &'a str,
    #[serde(borrow)]
    id: &'a RawValue,
    method: &'a str,
    #[serde(borrow)]
    params: Params<'a>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params<'a> {
    name: &'a str,
    #[serde(default)]
    arguments: Option<Map<String, Value>>,
    #[serde(rename = "_meta")]
    meta: Meta<'a>,
}

/// SEP-2575's per-request metadata, and nothing else (a progress token, say, is rmcp's).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta<'a> {
    #[serde(rename = "io.modelcontextprotocol/protocolVersion")]
    version: &'a str,
    /// Read only so that a malformed one stays rmcp's to refuse. A client that takes tasks
    /// gets them for waiting calls, never for these reads.
    #[serde(rename = "io.modelcontextprotocol/clientCapabilities")]
    _capabilities: rmcp::model::ClientCapabilities,
    #[serde(rename = "io.modelcontextprotocol/clientInfo", default)]
    _info: Option<rmcp::model::Implementation>,
}

/// The call in `body`, if it is exactly the one the headers announce: JSON-RPC 2.0, an integer
/// or string id, `tools/call` of the tool named in `Mcp-Name`, arguments an object, `_meta` at
/// [`VERSION`]. Any other field, anywhere in the envelope, leaves the request to rmcp.
fn recognize<'a>(headers: &HeaderMap, body: &'a [u8]) -> Option<Call<'a>> {
    let m: Message<'a> = serde_json::from_slice(body).ok()?;
    let id_ok = serde_json::from_str::<i64>(m.id.get()).is_ok() || serde_json::from_str::<&str>(m.id.get()).is_ok();
    let tool = DIRECT_TOOLS.into_iter().find(|t| *t == m.params.name)?;
    let named = headers.get("mcp-name").and_then(|v| v.to_str().ok()) == Some(tool);
    (m.jsonrpc == "2.0" && id_ok && m.method == "tools/call" && m.params.meta.version == VERSION && named).then(|| Call {
        id: m.id,
        tool,
        arguments: m.params.arguments.unwrap_or_default(),
    })
}

/// The size of the last answer to each tool, so that the next one is written without regrowing.
static LAST_SIZE: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// The JSON-RPC answer: the typed result written once, as `structuredContent`, then its
/// summary. `None` only for a result serde cannot write (a map with non-string keys, which no
/// contract type has); rmcp then reports it.
fn encode(id: &RawValue, tool: &str, read: &Read) -> Option<Vec<u8>> {
    fn write<T: Serialize>(id: &RawValue, tool: &str, result: &T, slot: &AtomicUsize) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(slot.load(Ordering::Relaxed) + 256);
        out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
        out.extend_from_slice(id.get().as_bytes());
        out.extend_from_slice(br#","result":{"resultType":"complete","structuredContent":"#);
        serde_json::to_writer(&mut out, result).ok()?;
        out.extend_from_slice(br#","content":[{"type":"text","text":"#);
        serde_json::to_writer(&mut out, &summary(tool, result)).ok()?;
        out.extend_from_slice(br#"}],"isError":false}}"#);
        slot.store(out.len(), Ordering::Relaxed);
        Some(out)
    }
    match read {
        Read::Jobs(r) => write(id, tool, r, &LAST_SIZE[0]),
        Read::Job(r) => write(id, tool, r, &LAST_SIZE[1]),
        Read::Runs(r) => write(id, tool, r, &LAST_SIZE[2]),
        Read::Run(r) => write(id, tool, r, &LAST_SIZE[3]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const BODY: &str = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_job","arguments":{"name":"nightly"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"lampctl","version":"1"}}}}"#;

    fn headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "get_job"),
            ("content-length", "300"),
        ] {
            h.insert(k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn the_call_lampctl_and_the_bench_send_is_recognized() {
        assert!(wanted(&Method::POST, &headers()));
        let call = recognize(&headers(), BODY.as_bytes()).expect("recognized");
        assert_eq!((call.id.get(), call.tool), ("7", "get_job"));
        assert_eq!(call.arguments.get("name"), Some(&Value::from("nightly")));
        let string_id = BODY.replace(r#""id":7"#, r#""id":"a-1""#);
        assert_eq!(recognize(&headers(), string_id.as_bytes()).expect("string id").id.get(), r#""a-1""#);
    }

    #[test]
    fn any_other_header_shape_is_left_to_rmcp() {
        assert!(!wanted(&Method::GET, &headers()));
        let changed: [(&str, Option<&'static str>); 11] = [
            ("accept", Some("application/json")),
            ("accept", Some("application/json;q=0, text/event-stream")),
            ("content-type", Some("text/plain")),
            ("content-length", None),
            ("content-length", Some("70000")),
            ("mcp-protocol-version", Some("2025-11-25")),
            ("mcp-protocol-version", None),
            ("mcp-method", Some("tools/list")),
            ("mcp-name", Some("trigger_job")),
            ("mcp-session-id", Some("abc")),
            ("mcp-param-name", Some("nightly")),
        ];
        for (name, value) in changed {
            let mut h = headers();
            match value {
                Some(v) => h.insert(name, HeaderValue::from_static(v)),
                None => h.remove(name),
            };
            assert!(!wanted(&Method::POST, &h), "{name}: {value:?} was taken");
        }
        let mut twice = headers();
        twice.append("mcp-protocol-version", HeaderValue::from_static("2026-07-28"));
        assert!(!wanted(&Method::POST, &twice), "a repeated version header was taken");
    }

    #[test]
    fn any_other_body_is_left_to_rmcp() {
        let variants = [
            BODY.replace(r#""id":7"#, r#""id":7.5"#),
            BODY.replace(r#""id":7"#, r#""id":null"#),
            BODY.replace(r#""2.0""#, r#""1.0""#),
            BODY.replace(r#""arguments":{"name":"nightly"}"#, r#""arguments":["nightly"]"#),
            BODY.replace(r#""_meta":{"#, r#""_meta":{"progressToken":1,"#),
            BODY.replace(r#""_meta":{"#, r#""task":{},"_meta":{"#),
            BODY.replace(r#"clientCapabilities":{}"#, r#"clientCapabilities":{"roots":5}"#),
            BODY.replace(r#"protocolVersion":"2026-07-28""#, r#"protocolVersion":"2025-11-25""#),
            BODY.replace(r#","io.modelcontextprotocol/clientCapabilities":{}"#, ""),
            BODY.replace(r#""name":"get_job""#, r#""name":"list_jobs""#),
            BODY.replace(r#""method":"tools/call""#, r#""method":"tools/list""#),
            BODY.replace(r#""jsonrpc":"2.0","#, r#""jsonrpc":"2.0","extra":1,"#),
            BODY[..BODY.len() - 1].to_string(),
        ];
        for body in variants {
            assert_ne!(body, BODY, "a variant that changes nothing");
            assert!(recognize(&headers(), body.as_bytes()).is_none(), "taken: {body}");
        }
        assert!(recognize(&headers(), BODY.replace(r#","arguments":{"name":"nightly"}"#, "").as_bytes()).is_some(), "no arguments");
    }

    #[test]
    fn the_answer_is_rmcps_with_the_structured_result_first() {
        let page = lamplighter_jobs::JobPage { jobs: Vec::new(), next_cursor: Some("b".into()) };
        let id = RawValue::from_string("\"x\"".into()).expect("raw");
        let body = encode(&id, "list_jobs", &Read::Jobs(page)).expect("written");
        let v: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(
            v,
            serde_json::json!({"jsonrpc": "2.0", "id": "x", "result": {
                "resultType": "complete",
                "content": [{"type": "text", "text": "list_jobs: 0 jobs, next_cursor b"}],
                "structuredContent": {"jobs": [], "next_cursor": "b"},
                "isError": false,
            }})
        );
    }
}
