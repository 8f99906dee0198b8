//! `web-fetch.fetch`: GETs an http(s) URL and returns its text, with HTML reduced to plain text
//! ("stripping HTML tags for clean text output", as the seed's manifest says).
//!
//! Bounded three ways: a wall-clock limit over the whole exchange (connect, headers, body), a cap
//! on the bytes read from the body (the stream is dropped once it is reached, so an endless
//! response cannot fill memory), and `max_length` characters of output (default 50,000, as in
//! the seed). Redirects are followed up to [`MAX_REDIRECTS`] times.
//!
//! As the seed says, `http://` is upgraded to `https://`, except for loopback hosts
//! (`localhost`, `127.0.0.0/8`, `::1`): they rarely have certificates and the traffic never
//! leaves the machine. Other schemes are refused. Addresses are not otherwise filtered: like the
//! seed's plugin, this one reaches whatever the worker's network reaches, so grant it only to
//! jobs that may.
//!
//! The HTML reduction is deliberately small (drop `script`/`style`-like elements and comments,
//! break lines at block elements, decode common entities, collapse blanks): enough for an agent
//! to read a page, with no HTML parser dependency.

use std::net::IpAddr;
use std::sync::LazyLock;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::params::Params;
use crate::{ActionContext, ActionError};

const DEFAULT_MAX_LENGTH: u64 = 50_000;
const MAX_MAX_LENGTH: u64 = 5_000_000;
const MAX_REDIRECTS: usize = 5;
const USER_AGENT: &str = concat!("lamplighter/", env!("CARGO_PKG_VERSION"), " (web-fetch)");

/// What one fetch may cost. Fixed for the action (the seed's parameters have no timeout); tests
/// call [`fetch_with`] with smaller ones.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// For the whole exchange, from connecting to the last body byte.
    timeout: Duration,
    /// Most body bytes read; the rest is never received.
    max_body_bytes: usize,
}

const LIMITS: Limits = Limits { timeout: Duration::from_secs(30), max_body_bytes: 8 * 1024 * 1024 };

pub(crate) async fn fetch(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let raw_url = params.required_str("url")?;
    let max_length = params.int_in("max_length", DEFAULT_MAX_LENGTH, 1, MAX_MAX_LENGTH)?;
    let url = target_url(raw_url).map_err(|problem| params.invalid("url", problem))?;
    let max_chars = usize::try_from(max_length).unwrap_or(usize::MAX);
    match fetch_with(&url, max_chars, LIMITS, &ctx.cancel).await {
        Ok(page) => Ok(json!({
            "url": page.url,
            "status": page.status,
            "content_type": page.content_type,
            "content": page.content,
            "truncated": page.truncated,
        })),
        Err(e) => Err(e.into_action_error(params, url.as_str(), LIMITS)),
    }
}

#[derive(Debug)]
struct Page {
    /// After redirects.
    url: String,
    status: u16,
    content_type: String,
    content: String,
    /// True when the body was longer than the byte cap or the text longer than `max_length`.
    truncated: bool,
}

#[derive(Debug)]
enum FetchError {
    Timeout,
    Cancelled,
    Client(String),
    Request(String),
    /// A status outside 2xx, as `404 Not Found`.
    Status(String),
    /// A content type that is not text, e.g. `image/png`.
    NotText(String),
}

impl FetchError {
    fn into_action_error(self, params: &Params, url: &str, limits: Limits) -> ActionError {
        let action = params.action().to_owned();
        match self {
            Self::Timeout => ActionError::Timeout { action, seconds: limits.timeout.as_secs() },
            Self::Cancelled => ActionError::Cancelled { action },
            Self::Client(e) => params.failed(format!("cannot set up the HTTP client: {e}")),
            Self::Request(e) => params.failed(format!("cannot fetch \"{url}\": {e}")),
            Self::Status(status) => params.failed(format!("\"{url}\" answered HTTP {status}")),
            Self::NotText(content_type) => {
                params.failed(format!("\"{url}\" is \"{content_type}\", not text; web-fetch returns text and HTML only"))
            }
        }
    }
}

/// Parses the URL, refuses schemes other than http(s), and upgrades http to https for hosts
/// that are not loopback. The error is the problem, for a message about the `url` parameter.
fn target_url(raw: &str) -> Result<reqwest::Url, String> {
    let mut url = reqwest::Url::parse(raw.trim()).map_err(|e| format!("is not a valid URL ({e}): \"{raw}\""))?;
    let scheme = url.scheme().to_owned();
    match scheme.as_str() {
        "https" => {}
        "http" if is_loopback(&url) => {}
        "http" => url.set_scheme("https").map_err(|()| format!("cannot be upgraded to https: \"{raw}\""))?,
        other => return Err(format!("must be an http or https URL, not \"{other}:\"")),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("has no host: \"{raw}\""));
    }
    Ok(url)
}

fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.to_ascii_lowercase().ends_with(".localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// At most [`MAX_REDIRECTS`] hops, and never to plain `http://` except on loopback: a redirect
/// must not undo the upgrade to https.
fn redirect_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        if attempt.previous().len() >= MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else if attempt.url().scheme() == "https" || (attempt.url().scheme() == "http" && is_loopback(attempt.url())) {
            attempt.follow()
        } else {
            let to = attempt.url().to_string();
            attempt.error(format!("redirect to {to} refused: only https (or http on loopback) is followed"))
        }
    })
}

/// The body as received, before it becomes text.
struct Received {
    url: String,
    status: u16,
    content_type: String,
    body: Vec<u8>,
    truncated: bool,
}

/// Built once (loading the TLS roots is not free); the whole exchange, connecting included,
/// is bounded by [`Limits::timeout`] around each call.
static CLIENT: LazyLock<Result<reqwest::Client, String>> = LazyLock::new(|| build_client(false));
static LOOPBACK_CLIENT: LazyLock<Result<reqwest::Client, String>> = LazyLock::new(|| build_client(true));

fn build_client(loopback: bool) -> Result<reqwest::Client, String> {
    let builder = reqwest::Client::builder().user_agent(USER_AGENT).redirect(redirect_policy());
    let builder = if loopback { builder.no_proxy() } else { builder };
    builder.build().map_err(|e| error_chain(&e))
}

async fn fetch_with(url: &reqwest::Url, max_chars: usize, limits: Limits, cancel: &CancellationToken) -> Result<Page, FetchError> {
    // A proxy from the environment has no business with this machine's own ports.
    let client = if is_loopback(url) { &*LOOPBACK_CLIENT } else { &*CLIENT };
    let client = client.as_ref().map_err(|e| FetchError::Client(e.clone()))?;
    let exchange = async {
        let mut response = client.get(url.clone()).send().await.map_err(|e| FetchError::Request(error_chain(&e)))?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Status(status.to_string()));
        }
        let content_type =
            response.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().trim().to_owned();
        if !is_textual(&content_type) {
            return Err(FetchError::NotText(content_type));
        }
        let final_url = response.url().to_string();
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = response.chunk().await.map_err(|e| FetchError::Request(error_chain(&e)))? {
            let room = limits.max_body_bytes - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        Ok::<_, FetchError>(Received { url: final_url, status: status.as_u16(), content_type, body, truncated })
    };
    let received = tokio::select! {
        result = tokio::time::timeout(limits.timeout, exchange) => match result {
            Ok(received) => received?,
            Err(_) => return Err(FetchError::Timeout),
        },
        () = cancel.cancelled() => return Err(FetchError::Cancelled),
    };

    let text = String::from_utf8_lossy(&received.body);
    let text = if is_html(&received.content_type, &text) { html_to_text(&text) } else { text.into_owned() };
    let (content, cut) = cut_chars(text, max_chars);
    Ok(Page {
        url: received.url,
        status: received.status,
        content_type: received.content_type,
        content,
        truncated: received.truncated || cut,
    })
}

/// The media type, lowercased, without parameters.
fn media_type(content_type: &str) -> String {
    content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase()
}

/// Text, markup and data formats; a missing content type is given the benefit of the doubt.
fn is_textual(content_type: &str) -> bool {
    let media = media_type(content_type);
    media.is_empty()
        || media.starts_with("text/")
        || media.ends_with("+json")
        || media.ends_with("+xml")
        || matches!(
            media.as_str(),
            "application/json"
                | "application/xml"
                | "application/javascript"
                | "application/x-javascript"
                | "application/ecmascript"
                | "application/yaml"
                | "application/x-yaml"
                | "application/toml"
                | "application/x-ndjson"
        )
}

fn is_html(content_type: &str, text: &str) -> bool {
    let media = media_type(content_type);
    if !media.is_empty() {
        return media == "text/html" || media == "application/xhtml+xml";
    }
    let start = text.trim_start().chars().take(20).collect::<String>().to_ascii_lowercase();
    start.starts_with("<!doctype html") || start.starts_with("<html")
}

/// Elements whose content is not text for a reader.
const SKIPPED_ELEMENTS: &[&str] = &["script", "style", "noscript", "template", "svg", "iframe", "object"];
/// Elements that start a new line.
const BLOCK_ELEMENTS: &[&str] = &[
    "address",
    "article",
    "aside",
    "blockquote",
    "br",
    "dd",
    "div",
    "dl",
    "dt",
    "figcaption",
    "figure",
    "footer",
    "form",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hr",
    "li",
    "main",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "table",
    "title",
    "tr",
    "ul",
];
/// Elements separated from their neighbours by a space.
const CELL_ELEMENTS: &[&str] = &["td", "th"];

/// Reduces an HTML document to readable text: one line per block, blanks collapsed.
fn html_to_text(html: &str) -> String {
    // ASCII lowercasing keeps every byte offset, so `lower` is searched and `html` sliced.
    let lower = html.to_ascii_lowercase();
    let mut raw = String::with_capacity(html.len() / 2);
    let mut i = 0;
    while let Some(offset) = lower[i..].find('<') {
        let lt = i + offset;
        push_text(&mut raw, &html[i..lt]);
        let rest = &lower[lt..];
        if rest.starts_with("<!--") {
            i = rest.find("-->").map_or(html.len(), |end| lt + end + 3);
            continue;
        }
        let name_start = if rest.starts_with("</") { lt + 2 } else { lt + 1 };
        let name_len = lower[name_start..].bytes().take_while(u8::is_ascii_alphanumeric).count();
        if name_len == 0 && !rest.starts_with("<!") && !rest.starts_with("<?") {
            // A bare `<` in text, as in `a < b`.
            raw.push('<');
            i = lt + 1;
            continue;
        }
        let Some(end) = tag_end(&lower, lt) else {
            // An unterminated tag: the rest is not text.
            i = html.len();
            break;
        };
        i = end;
        let name = &lower[name_start..name_start + name_len];
        let opening = name_start == lt + 1;
        if opening && SKIPPED_ELEMENTS.contains(&name) {
            let close = format!("</{name}");
            let body_start = i;
            i = lower[body_start..].find(&close).and_then(|at| tag_end(&lower, body_start + at)).unwrap_or(html.len());
            continue;
        }
        if BLOCK_ELEMENTS.contains(&name) {
            raw.push('\n');
        } else if CELL_ELEMENTS.contains(&name) {
            raw.push(' ');
        }
    }
    push_text(&mut raw, &html[i..]);
    let decoded = decode_entities(&raw);
    let mut out = String::with_capacity(decoded.len());
    for line in decoded.split('\n') {
        let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if !line.is_empty() {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&line);
        }
    }
    out
}

/// Source whitespace, line breaks included, is one space in HTML; lines come from elements.
fn push_text(out: &mut String, text: &str) {
    out.extend(text.chars().map(|c| if c.is_whitespace() { ' ' } else { c }));
}

/// The offset just past the `>` that closes the tag starting at `start`.
fn tag_end(lower: &str, start: usize) -> Option<usize> {
    lower[start..].find('>').map(|at| start + at + 1)
}

fn decode_entities(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        // Only the next few bytes can close an entity: searching the whole rest for `;` made a
        // body of `&`s quadratic.
        let entity = rest.as_bytes()[1..]
            .iter()
            .take(11)
            .position(|&b| b == b';')
            .filter(|&len| (1..=10).contains(&len))
            .and_then(|len| decode_entity(&rest[1..=len]).map(|c| (c, len)));
        match entity {
            Some((c, len)) => {
                out.push(c);
                rest = &rest[len + 2..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `amp` → `&`, `#233` → `é`, `#x41` → `A`; `None` for names this does not know.
fn decode_entity(name: &str) -> Option<char> {
    if let Some(number) = name.strip_prefix('#') {
        let code = match number.strip_prefix(['x', 'X']) {
            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
            None => number.parse::<u32>().ok()?,
        };
        return char::from_u32(code).filter(|c| !c.is_control() || c.is_whitespace());
    }
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        "nbsp" => ' ',
        "ndash" => '–',
        "mdash" => '—',
        "hellip" => '…',
        "lsquo" => '‘',
        "rsquo" => '’',
        "ldquo" => '“',
        "rdquo" => '”',
        "laquo" => '«',
        "raquo" => '»',
        "middot" => '·',
        "bull" => '•',
        "copy" => '©',
        "reg" => '®',
        "trade" => '™',
        "euro" => '€',
        "pound" => '£',
        "deg" => '°',
        "times" => '×',
        _ => return None,
    })
}

/// The first `max_chars` characters, and whether anything was cut.
fn cut_chars(mut text: String, max_chars: usize) -> (String, bool) {
    let cut_at = text.char_indices().nth(max_chars).map(|(at, _)| at);
    match cut_at {
        Some(at) => {
            text.truncate(at);
            (text, true)
        }
        None => (text, false),
    }
}

/// An error with its causes, since reqwest's own message ("error sending request") hides them.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    #[test]
    fn urls_are_checked_and_upgraded() {
        let ok = |raw: &str| target_url(raw).map(|u| u.to_string());
        assert_eq!(ok("https://example.com/a?b=c"), Ok("https://example.com/a?b=c".to_owned()));
        assert_eq!(ok("http://example.com/page"), Ok("https://example.com/page".to_owned()));
        assert_eq!(ok("HTTP://Example.com"), Ok("https://example.com/".to_owned()));
        assert_eq!(ok("http://127.0.0.1:8080/x"), Ok("http://127.0.0.1:8080/x".to_owned()));
        assert_eq!(ok("http://localhost:3000/"), Ok("http://localhost:3000/".to_owned()));
        assert_eq!(ok("http://[::1]:3000/"), Ok("http://[::1]:3000/".to_owned()));
        assert_eq!(ok("ftp://example.com/x"), Err("must be an http or https URL, not \"ftp:\"".to_owned()));
        assert_eq!(ok("file:///etc/passwd"), Err("must be an http or https URL, not \"file:\"".to_owned()));
        assert_eq!(ok("javascript:alert(1)"), Err("must be an http or https URL, not \"javascript:\"".to_owned()));
        assert!(ok("not a url").is_err_and(|e| e.starts_with("is not a valid URL")));
        assert!(ok("example.com").is_err_and(|e| e.starts_with("is not a valid URL")));
    }

    #[test]
    fn html_becomes_readable_text() {
        let html = "<!DOCTYPE html><html><head><title>The  Title</title><style>p { color: red }</style>\
                    <script>var x = '<p>not text</p>';</script></head>\n<body><!-- a comment <p>hidden</p> -->\
                    <h1>Heading</h1><p>One\n   paragraph &amp; more &lt;here&gt; &#233;&#x41;&nbsp;!</p>\
                    <ul><li>first</li><li>second</li></ul><table><tr><td>a</td><td>b</td></tr></table>\
                    <p>a < b</p><SCRIPT type=x>ignored()</SCRIPT><p>&unknown; &amp</p></body></html>";
        assert_eq!(html_to_text(html), "The Title\nHeading\nOne paragraph & more <here> éA !\nfirst\nsecond\na b\na < b\n&unknown; &amp");
        assert_eq!(html_to_text("text with <unterminated"), "text with");
    }

    #[test]
    fn content_types_decide_text_and_html() {
        assert!(is_textual("text/plain; charset=utf-8") && is_textual("application/json") && is_textual("application/ld+json"));
        assert!(is_textual("") && !is_textual("image/png") && !is_textual("application/octet-stream"));
        assert!(is_html("text/html; charset=UTF-8", "") && !is_html("text/plain", "<html>"));
        assert!(is_html("", "  <!DOCTYPE html><html>") && !is_html("", "plain"));
    }

    #[test]
    fn cut_counts_characters() {
        assert_eq!(cut_chars("héllo".to_owned(), 2), ("hé".to_owned(), true));
        assert_eq!(cut_chars("héllo".to_owned(), 5), ("héllo".to_owned(), false));
    }

    /// A server that answers every request with a head and then body bytes without end.
    async fn endless_server() -> reqwest::Url {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = stream.read(&mut buf).await;
                    let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n";
                    if stream.write_all(head).await.is_err() {
                        return;
                    }
                    let chunk = vec![b'a'; 16 * 1024];
                    while stream.write_all(&chunk).await.is_ok() {}
                });
            }
        });
        reqwest::Url::parse(&format!("http://{addr}/endless")).expect("url")
    }

    #[tokio::test]
    async fn body_is_read_up_to_the_byte_cap_and_no_further() {
        let url = endless_server().await;
        let limits = Limits { timeout: Duration::from_secs(10), max_body_bytes: 100_000 };
        let started = Instant::now();
        let page = fetch_with(&url, usize::MAX, limits, &CancellationToken::new()).await.expect("fetched");
        assert!(page.truncated);
        assert_eq!(page.content.len(), 100_000);
        assert!(page.content.bytes().all(|b| b == b'a'));
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());

        let page = fetch_with(&url, 10, limits, &CancellationToken::new()).await.expect("fetched");
        assert_eq!((page.content.as_str(), page.truncated), ("aaaaaaaaaa", true));
    }

    #[tokio::test]
    async fn a_server_that_never_answers_times_out() {
        // Bound but never accepting: the kernel completes the connection, nobody replies.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = reqwest::Url::parse(&format!("http://{}/", listener.local_addr().expect("addr"))).expect("url");
        let limits = Limits { timeout: Duration::from_millis(300), max_body_bytes: 1024 };
        let started = Instant::now();
        let err = fetch_with(&url, 100, limits, &CancellationToken::new()).await.expect_err("no answer");
        assert!(matches!(err, FetchError::Timeout), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
        drop(listener);
    }
}
