//! A stateless transport for four reads: `list_jobs`, `get_job`, `list_runs` and `get_run`
//! from a client at 2026-07-28, in the one shape such a client sends them (issue 14). The
//! answer is the tool's own ([`Answer`], the same functions rmcp's tools call); only the way it
//! reaches the wire differs.
//!
//! rmcp carries a structured result as a `serde_json::Value`: a listing of 1,000 jobs becomes
//! some 30,000 small allocations, is written out from that tree, then freed, which was most of
//! the call's time. Here the answer's bytes are written into the JSON-RPC answer as they are.
//!
//! It sits inside every guard of `/mcp` (Host, Origin, token, body limit) and takes only
//! requests it recognizes whole; anything else, including anything rmcp would refuse, goes on
//! to rmcp untouched. So are calls whose arguments are refused or that fail: rmcp runs them
//! again (they only read) and words the error, so errors have one source. The answer is JSON-
//! equal to rmcp's; the members come in another order (`structuredContent` before `content`,
//! and a result's fields in their declared order where rmcp's `Value` sorts them).
//!
//! On SQLite, `list_jobs` answers are kept ([`Listings`]) and served again while they are
//! still the answer: the same config, no change to what a listing shows since (a count kept by
//! triggers on runs and job state, migration 0010, which counts other processes' writes too;
//! heartbeats and ticks' bookkeeping do not move it), and no job's next fire reached. A
//! dashboard or `lampctl` polling a listing between runs then costs one read of one row
//! instead of a thousand jobs' worth.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use lamplighter_contract::args::{self, ListJobsArgs};
use lamplighter_jobs::ListingVersion;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::answer::Answer;
use crate::mcp::{Control, DIRECT_TOOLS, Read};

/// The only protocol revision answered here: stateless.
const VERSION: &str = "2026-07-28";

/// A bigger request is no read this path knows; rmcp takes it (and its body limit applies).
const MAX_BODY: usize = 64 * 1024;

/// The direct path's state: the control surface, and the job listings it keeps.
#[derive(Clone)]
pub(crate) struct Direct {
    control: Control,
    listings: Arc<Listings>,
}

impl Direct {
    pub(crate) fn new(control: Control) -> Self {
        Self { control, listings: Arc::default() }
    }

    /// The answer to `call`, or `None` to leave it to rmcp.
    async fn call(&self, call: Call<'_>) -> Option<Vec<u8>> {
        if call.tool == "list_jobs" {
            return self.list_jobs(call).await;
        }
        let read = self.control.read_directly(call.tool, call.arguments).await?;
        Some(read.answer()?.envelope(call.id))
    }

    /// `list_jobs`, from [`Listings`] when a kept answer is still the answer.
    async fn list_jobs(&self, call: Call<'_>) -> Option<Vec<u8>> {
        let service = self.control.service();
        let key = args::from_arguments::<ListJobsArgs>(call.tool, call.arguments.clone())
            .ok()
            // A listing of one tag is not kept (it is rare, and the key is the page alone).
            .filter(|a| a.tag.is_none())
            .and_then(|a| Some((a.page_size().ok()?, a.cursor)));
        // Taken before the read: a change after it makes the next version differ.
        let version = if key.is_some() { service.listing_version().await } else { None };
        if let (Some(key), Some(version)) = (&key, &version)
            && let Some(answer) = self.listings.find(key, version, service.now())
        {
            self.control.observe_kept(call.tool);
            return Some(answer.envelope(call.id));
        }
        let read = self.control.read_directly(call.tool, call.arguments).await?;
        // Taken after the read, so that no fire falls between the read's clock and this.
        let read_at = service.now();
        let answer = read.answer()?;
        if let (Some(key), Some(version), Read::Jobs(page)) = (key, version, &read) {
            let until = page.jobs.iter().filter_map(|j| j.next_fire).min();
            // A listing whose first fire has already come could never be served.
            if until.is_none_or(|u| read_at < u) {
                self.listings.keep(Listing { key, version, read_at, until, answer: answer.clone() });
            }
        }
        Some(answer.envelope(call.id))
    }
}

/// How many listings are kept, and at most how many bytes of them.
const KEPT: usize = 8;
const KEPT_BYTES: usize = 8 << 20;

/// The last few `list_jobs` answers, newest first. See the module doc.
#[derive(Default)]
struct Listings(Mutex<VecDeque<Listing<ListingVersion>>>);

/// One kept answer: its page (`limit`, `cursor`), what it was read at, and until when the
/// clock alone leaves it true (its first `next_fire`; none: no job in it fires).
struct Listing<V> {
    key: (usize, Option<String>),
    version: V,
    read_at: DateTime<Utc>,
    until: Option<DateTime<Utc>>,
    answer: Answer,
}

impl<V: PartialEq> Listing<V> {
    fn serves(&self, key: &(usize, Option<String>), version: &V, now: DateTime<Utc>) -> bool {
        self.key == *key && self.version == *version && self.read_at <= now && self.until.is_none_or(|u| now < u)
    }
}

impl Listings {
    fn find(&self, key: &(usize, Option<String>), version: &ListingVersion, now: DateTime<Utc>) -> Option<Answer> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.iter().find(|l| l.serves(key, version, now)).map(|l| l.answer.clone())
    }

    fn keep(&self, listing: Listing<ListingVersion>) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        keep_in(&mut kept, listing);
    }
}

/// Puts `listing` first, in place of an older answer to the same page, and drops the oldest
/// beyond [`KEPT`] listings or [`KEPT_BYTES`].
fn keep_in<V>(kept: &mut VecDeque<Listing<V>>, listing: Listing<V>) {
    kept.retain(|l| l.key != listing.key);
    kept.push_front(listing);
    kept.truncate(KEPT);
    while kept.len() > 1 && kept.iter().map(|l| l.answer.json().len()).sum::<usize>() > KEPT_BYTES {
        kept.pop_back();
    }
}

/// The axum middleware: answers a recognized read, hands everything else to rmcp.
pub(crate) async fn answer(State(direct): State<Direct>, request: Request, next: Next) -> Response {
    if !wanted(request.method(), request.headers()) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    // `wanted` saw a Content-Length within MAX_BODY, so the body is small and whole.
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    if let Some(call) = recognize(&parts.headers, &bytes)
        && let Some(answer) = direct.call(call).await
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
        // Only plain media types: a parameter (a weight of 0, say) or a quoted string (which
        // may hide a comma) is rmcp's to read.
        let value = value.to_str().ok().filter(|v| !v.contains('"')).unwrap_or(";");
        for entry in value.split(',').map(str::trim) {
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

/// SEP-2575's per-request metadata and a progress token (rmcp's client sends one with every
/// request; these reads report no progress, so it changes nothing), and nothing else: any other
/// key may mean something to rmcp.
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
    #[serde(rename = "progressToken", default)]
    _progress: Option<rmcp::model::ProgressToken>,
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
        let changed: [(&str, Option<&'static str>); 12] = [
            ("accept", Some("application/json")),
            ("accept", Some(r#"x/y;a=",application/json,", text/event-stream"#)),
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
            BODY.replace(r#""_meta":{"#, r#""_meta":{"progressToken":1.5,"#),
            BODY.replace(r#""_meta":{"#, r#""_meta":{"io.modelcontextprotocol/logLevel":"debug","#),
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
        for token in ["3", r#""p-1""#] {
            let body = BODY.replace(r#""_meta":{"#, &format!(r#""_meta":{{"progressToken":{token},"#));
            assert!(recognize(&headers(), body.as_bytes()).is_some(), "a progress token, as rmcp's client sends");
        }
    }

    fn listing(key: (usize, Option<&str>), version: u32, bytes: usize) -> Listing<u32> {
        let t = DateTime::from_timestamp(1_800_000_000, 0).expect("instant");
        Listing {
            key: (key.0, key.1.map(String::from)),
            version,
            read_at: t,
            until: Some(t + chrono::Duration::minutes(1)),
            answer: Answer::of(&" ".repeat(bytes.saturating_sub(2))).expect("a string"),
        }
    }

    #[test]
    fn a_kept_listing_serves_its_page_at_its_version_until_its_first_fire() {
        let l = listing((100, None), 7, 10);
        let (t, until) = (l.read_at, l.until.expect("until"));
        assert!(l.serves(&(100, None), &7, t));
        assert!(l.serves(&(100, None), &7, until - chrono::Duration::milliseconds(1)));
        assert!(!l.serves(&(100, None), &7, until), "the first fire changes that job's next fire");
        assert!(!l.serves(&(100, None), &7, t - chrono::Duration::milliseconds(1)), "a clock set back");
        assert!(!l.serves(&(100, None), &8, t), "a commit, or another config");
        assert!(!l.serves(&(1000, None), &7, t), "another page size");
        assert!(!l.serves(&(100, Some("a".into())), &7, t), "another page");
        let timeless = Listing { until: None, ..listing((100, None), 7, 10) };
        assert!(timeless.serves(&(100, None), &7, t + chrono::Duration::days(3650)), "no job in it fires");
    }

    #[test]
    fn listings_are_kept_newest_first_one_per_page_within_their_bounds() {
        let mut kept = VecDeque::new();
        for i in 0..KEPT + 3 {
            keep_in(&mut kept, listing((i, None), 1, 10));
        }
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept.front().map(|l| l.key.0), Some(KEPT + 2));
        keep_in(&mut kept, listing((KEPT + 1, None), 2, 10));
        assert_eq!(kept.len(), KEPT, "a newer answer to a kept page replaces it");
        assert_eq!(kept.iter().filter(|l| l.key.0 == KEPT + 1).map(|l| l.version).collect::<Vec<_>>(), [2]);
        keep_in(&mut kept, listing((0, None), 1, KEPT_BYTES / 2));
        keep_in(&mut kept, listing((1, None), 1, KEPT_BYTES / 2 + 1));
        assert_eq!(kept.len(), 1, "bytes bound the kept answers, but the newest is always kept");
    }
}
