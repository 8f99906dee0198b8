//! A tool's answer, made once: the typed result written as JSON a single time, and both parts
//! of the MCP result taken from that text. `structuredContent` is that JSON; the text block is
//! the same JSON as text, for every protocol version, because many hosts hand a model only
//! `content[].text` (an assistant must be able to check the fire times it is about to save).
//!
//! rmcp carries `structuredContent` as a `serde_json::Value`, so the rmcp path parses the text
//! into one ([`Answer::into_result`]); the stateless transport in `direct.rs` writes the text
//! into its JSON-RPC answer as it is ([`Answer::envelope`]). Both give the same JSON.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock};
use serde::Serialize;
use serde_json::value::RawValue;

/// A successful tool result, written once. Cheap to clone (a kept listing is served again).
#[derive(Clone, Debug)]
pub(crate) struct Answer {
    json: Arc<String>,
}

impl Answer {
    /// Writes `result`. It fails only for a value serde cannot write as JSON (a map with
    /// non-string keys), which no contract type is.
    pub(crate) fn of(result: &impl Serialize) -> Result<Self, serde_json::Error> {
        Ok(Self { json: Arc::new(serde_json::to_string(result)?) })
    }

    /// The result's JSON.
    pub(crate) fn json(&self) -> &str {
        &self.json
    }

    /// The result as rmcp carries it. The text is the written JSON itself, moved (not copied)
    /// when no kept listing shares it.
    pub(crate) fn into_result(self) -> CallToolResult {
        // What serde_json wrote parses.
        let structured = serde_json::from_str(&self.json).unwrap_or_default();
        let text = Arc::try_unwrap(self.json).unwrap_or_else(|shared| (*shared).clone());
        let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
        result.structured_content = Some(structured);
        result
    }

    /// The whole JSON-RPC answer to request `id` (stateless, protocol 2026-07-28): the same
    /// members as rmcp writes for [`Answer::into_result`], the structured result first.
    pub(crate) fn envelope(&self, id: &RawValue) -> Vec<u8> {
        let json = self.json.as_str();
        let mut out = Vec::with_capacity(2 * json.len() + json.len() / 8 + id.get().len() + 128);
        out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
        out.extend_from_slice(id.get().as_bytes());
        out.extend_from_slice(br#","result":{"resultType":"complete","structuredContent":"#);
        out.extend_from_slice(json.as_bytes());
        out.extend_from_slice(br#","content":[{"type":"text","text":"#);
        // A string always serializes.
        let _ = serde_json::to_writer(&mut out, json);
        out.extend_from_slice(br#"}],"isError":false}}"#);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[derive(Serialize)]
    struct Page {
        jobs: Vec<&'static str>,
        next_cursor: Option<&'static str>,
        note: &'static str,
    }

    const PAGE: Page = Page { jobs: Vec::new(), next_cursor: Some("b"), note: "a \"quoted\" line\nand ünïcode" };

    #[test]
    fn the_text_carries_the_whole_result_as_the_structured_content_does() {
        let answer = Answer::of(&PAGE).expect("written");
        let result = answer.clone().into_result();
        let structured = result.structured_content.clone().expect("structured");
        assert_eq!(structured, json!({"jobs": [], "next_cursor": "b", "note": "a \"quoted\" line\nand ünïcode"}));
        let text = result.content[0].as_text().expect("a text block").text.clone();
        assert_eq!(serde_json::from_str::<Value>(&text).expect("the text is JSON"), structured);
        assert_eq!(text, answer.json(), "the text is the JSON written once");
    }

    #[test]
    fn the_envelope_is_the_answer_rmcp_writes_for_the_same_result() {
        let answer = Answer::of(&PAGE).expect("written");
        let id = RawValue::from_string("\"x\"".into()).expect("raw");
        let direct: Value = serde_json::from_slice(&answer.envelope(&id)).expect("JSON");
        let mut rmcp = serde_json::to_value(answer.clone().into_result()).expect("rmcp's result");
        rmcp["resultType"] = json!("complete");
        assert_eq!(direct, json!({"jsonrpc": "2.0", "id": "x", "result": rmcp}));
        let text = direct["result"]["content"][0]["text"].as_str().expect("text");
        assert_eq!(text, answer.json());
    }
}
