//! What a WASM plugin's call gave back: its return code and the output it left in its memory,
//! read and parsed into the action's result or a failure that says why. Guest-controlled from
//! end to end (pointer, length, bytes), so it is fuzzed: this file has no dependency beyond
//! std and serde_json, and `tests/fuzz` includes it as it is (target `wasm_output`).

use serde_json::Value;

/// Largest output a plugin may return.
pub(crate) const MAX_OUTPUT_BYTES: usize = 4 * 1024 * 1024;
/// Most text of a failed call's output that goes into the error message.
pub(crate) const MAX_ERROR_TEXT: usize = 2000;

/// The result of a call to plugin `plugin` that returned `code`, with its output at `ptr`,
/// `len` bytes long (the guest's i32 values) in `memory`: the output's JSON, or the message of
/// the failure.
pub(crate) fn read(plugin: &str, code: i32, ptr: i32, len: i32, memory: &[u8]) -> Result<Value, String> {
    // Guest pointers and lengths are unsigned 32-bit values that wasm passes as i32.
    let (start, len) = (ptr as u32 as usize, len as u32 as usize);
    if len > MAX_OUTPUT_BYTES {
        return Err(format!("plugin \"{plugin}\" returned {len} bytes of output; the limit is {}", bytes(MAX_OUTPUT_BYTES)));
    }
    let Some(output) = memory.get(start..).and_then(|rest| rest.get(..len)) else {
        return Err(format!(
            "plugin \"{plugin}\" returned an out-of-bounds output: {len} bytes at {start}, but its memory is {} bytes",
            memory.len()
        ));
    };
    if code != 0 {
        return Err(guest_failure(plugin, code, output));
    }
    serde_json::from_slice(output).map_err(|e| format!("plugin \"{plugin}\" returned invalid JSON: {e}"))
}

/// The message of a call that returned non-zero: the guest's own words when it gave any.
fn guest_failure(plugin: &str, code: i32, output: &[u8]) -> String {
    let from_json = match serde_json::from_slice::<Value>(output) {
        Ok(Value::Object(map)) => map.get("error").or_else(|| map.get("message")).and_then(Value::as_str).map(str::to_owned),
        Ok(Value::String(text)) => Some(text),
        _ => None,
    };
    let text = from_json.or_else(|| std::str::from_utf8(output).ok().map(|s| s.trim().to_owned())).filter(|s| !s.is_empty());
    match text {
        Some(text) => format!("plugin \"{plugin}\" returned error code {code}: {}", cut(&text, MAX_ERROR_TEXT)),
        None => format!("plugin \"{plugin}\" returned error code {code}"),
    }
}

/// `text` cut to `max` characters (on a character boundary), with `…` when cut.
pub(crate) fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// A size for messages: `4 MiB (4194304 bytes)`, or `123 bytes`.
pub(crate) fn bytes(n: usize) -> String {
    const MIB: usize = 1024 * 1024;
    if n >= MIB && n.is_multiple_of(MIB) { format!("{} MiB ({n} bytes)", n / MIB) } else { format!("{n} bytes") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_char_boundaries() {
        assert_eq!(cut("héllo", 2), "hé…");
        assert_eq!(cut("hi", 2), "hi");
    }

    #[test]
    fn output_is_read_from_memory_checked_and_parsed() {
        let memory = b"....{\"ok\":true}....".to_vec();
        assert_eq!(read("p", 0, 4, 11, &memory), Ok(serde_json::json!({"ok": true})));
        // A negative i32 is a large unsigned pointer or length: out of bounds, not a panic.
        let e = read("p", 0, -1, 4, &memory).unwrap_err();
        assert!(e.contains("out-of-bounds output: 4 bytes at 4294967295"), "{e}");
        assert!(read("p", 0, 4, -1, &memory).unwrap_err().contains("bytes of output; the limit is 4 MiB"));
        assert!(read("p", 0, 0, 4, &memory).unwrap_err().contains("invalid JSON"));
        // A failure in the guest's own words, cut to length.
        let words = br#"{"error":"disk full"}"#;
        assert_eq!(read("p", 3, 0, words.len() as i32, words).unwrap_err(), "plugin \"p\" returned error code 3: disk full");
        let long = "x".repeat(5000);
        let e = read("p", 1, 0, long.len() as i32, long.as_bytes()).unwrap_err();
        assert!(e.ends_with('…') && e.chars().count() < MAX_ERROR_TEXT + 60, "{}", e.len());
    }
}
