//! hello-wasm: an example Lamplighter plugin in Rust for `wasm32-unknown-unknown`, with no
//! dependencies. Action `greet` takes `{"name": "Ada"}` and returns
//! `{"greeting": "Hello, Ada!"}`; action `fetch` takes `{"url": "https://…"}` and returns what
//! the host's `http_request` answered (`{"status", "headers", "body", "truncated"}`); hook
//! `audit` logs the event it is given.
//!
//! It implements the ABI described in `../README.md`: the host calls `allocate` twice (for the
//! action name and the input JSON), writes into those buffers, calls `execute`, then reads the
//! output through `get_output_ptr`/`get_output_len`. Every call gets a fresh instance, so
//! nothing here needs freeing and no state survives between calls.
//!
//! Raw pointers cross the ABI, so a few lines need `unsafe`; each says why it is sound. A real
//! plugin would parse and write JSON with `serde_json` (it works on this target); this one
//! hand-rolls the little it needs to stay dependency-free.

use std::cell::RefCell;

// Host functions live in module "env". `log` is always there; the others need a capability
// (see the manifest's "capabilities" and ../README.md).
#[link(wasm_import_module = "env")]
unsafe extern "C" {
    /// Writes one line of UTF-8 text to the worker's log, tagged with the plugin's name.
    fn log(ptr: *const u8, len: usize);
    /// Makes an HTTP request (JSON at `req`) to a host the operator allows, and writes the
    /// answer (JSON) at `out` when it fits in `out_cap` bytes. Returns the answer's length (when
    /// it is more than `out_cap`, nothing was written: call again with a buffer that large; the
    /// request is not sent twice), or a negative code: -2 not allowed, -3 too large, -5 not a
    /// request. Needs the `http-request` capability.
    fn http_request(req: *const u8, req_len: usize, out: *mut u8, out_cap: usize) -> i32;
}

thread_local! {
    /// The output of the last `execute`; the host reads it right after the call.
    static OUTPUT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Hands the host a buffer of `size` bytes. It is leaked on purpose: the instance is thrown
/// away after the call.
#[unsafe(no_mangle)]
pub extern "C" fn allocate(size: i32) -> i32 {
    let mut buffer = Vec::<u8>::with_capacity(size.max(0) as usize);
    let ptr = buffer.as_mut_ptr();
    std::mem::forget(buffer);
    ptr as usize as i32
}

/// Runs `action` on `input` (JSON). Returns 0 on success; otherwise the output holds
/// `{"error": "..."}`, which the host turns into the action's error message.
#[unsafe(no_mangle)]
pub extern "C" fn execute(action_ptr: i32, action_len: i32, input_ptr: i32, input_len: i32) -> i32 {
    // SAFETY: the host wrote exactly `len` bytes at each pointer, into buffers that `allocate`
    // returned and nothing else uses; they stay valid for the whole call.
    let action = unsafe { std::slice::from_raw_parts(action_ptr as usize as *const u8, action_len as usize) };
    // SAFETY: as above.
    let input = unsafe { std::slice::from_raw_parts(input_ptr as usize as *const u8, input_len as usize) };
    let (code, output) = match run(action, input) {
        Ok(json) => (0, json),
        Err(message) => (1, format!("{{\"error\":{}}}", json_string(&message))),
    };
    OUTPUT.with(|out| *out.borrow_mut() = output.into_bytes());
    code
}

#[unsafe(no_mangle)]
pub extern "C" fn get_output_ptr() -> i32 {
    OUTPUT.with(|out| out.borrow().as_ptr() as usize as i32)
}

#[unsafe(no_mangle)]
pub extern "C" fn get_output_len() -> i32 {
    OUTPUT.with(|out| out.borrow().len() as i32)
}

fn run(action: &[u8], input: &[u8]) -> Result<String, String> {
    let input = std::str::from_utf8(input).map_err(|_| "the input is not UTF-8".to_owned())?;
    match action {
        b"greet" => {
            let name = name_parameter(input)?.unwrap_or_else(|| "World".to_owned());
            log_line(&format!("greeting {name}"));
            Ok(format!("{{\"greeting\":{}}}", json_string(&format!("Hello, {name}!"))))
        }
        b"fetch" => {
            let url = string_parameter(input, "url")?.ok_or_else(|| "\"url\" is required".to_owned())?;
            fetch(&format!("{{\"url\":{}}}", json_string(&url)))
        }
        // Hooks arrive through `execute` as "hook:<name>", with the event as input.
        b"hook:audit" => {
            log_line(&format!("audit: {input}"));
            Ok("{}".to_owned())
        }
        other => Err(format!("unknown action \"{}\"", String::from_utf8_lossy(other))),
    }
}

/// `http_request` with `request`: the answer as JSON text, asking again with a buffer of the
/// size the host names when the first one is too small.
fn fetch(request: &str) -> Result<String, String> {
    let mut buffer = vec![0u8; 4096];
    for _ in 0..2 {
        // SAFETY: the host reads `request.len()` bytes of `request` and writes at most
        // `buffer.len()` bytes into `buffer`, both of which live for the whole call.
        let n = unsafe { http_request(request.as_ptr(), request.len(), buffer.as_mut_ptr(), buffer.len()) };
        match usize::try_from(n) {
            Err(_) => return Err(format!("http_request refused the request (code {n})")),
            Ok(len) if len <= buffer.len() => {
                buffer.truncate(len);
                return String::from_utf8(buffer).map_err(|_| "the answer is not UTF-8".to_owned());
            }
            Ok(len) => buffer = vec![0u8; len],
        }
    }
    Err("the answer did not fit twice".to_owned())
}

fn log_line(text: &str) {
    // SAFETY: `log` only reads `len` bytes at `ptr`, which `text` owns for the whole call.
    unsafe { log(text.as_ptr(), text.len()) }
}

/// The host checks the input against the manifest's schema before the call and sends compact
/// JSON, so for `greet` it is `{}` or `{"name":"<string>"}`.
fn name_parameter(input: &str) -> Result<Option<String>, String> {
    string_parameter(input, "name")
}

/// The string parameter `key` of an input that has only that one (`{"key":"…"}`), or none.
fn string_parameter(input: &str, key: &str) -> Result<Option<String>, String> {
    match input.strip_prefix(&format!("{{\"{key}\":")) {
        None => Ok(None),
        Some(rest) => parse_string(rest).map(Some).ok_or_else(|| format!("cannot read \"{key}\" from {input}")),
    }
}

/// Decodes the JSON string at the start of `text`.
fn parse_string(text: &str) -> Option<String> {
    let mut chars = text.strip_prefix('"')?.chars();
    let mut out = String::new();
    loop {
        match chars.next()? {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    let unit = u32::from_str_radix(&hex, 16).ok()?;
                    // A lone surrogate cannot be a char; a pair is rare enough here to be
                    // replaced too.
                    out.push(char::from_u32(unit).unwrap_or('\u{fffd}'));
                }
                other => out.push(other), // '"', '\\', '/'
            },
            c => out.push(c),
        }
    }
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
