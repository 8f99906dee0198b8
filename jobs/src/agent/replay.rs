//! An agent's conversation read back from its records, as pure functions: the messages the
//! model is shown, and what comes next — the answer, the tool calls still owed a result, or
//! another model call. A resumed run (after a crash, a restart or an approval) replays its
//! records through these and continues exactly where it stopped: nothing recorded is asked
//! again, nothing unrecorded is taken as done.

use std::collections::HashSet;

use serde_json::Value;

use super::model::{Msg, ToolCall};
use crate::run::{CallKind, CallRecord};

/// What a conversation does next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Next {
    /// The last model reply asked for no tool: it is the answer.
    Answer(String),
    /// Tool calls of the last model reply without a recorded result, in the order the model
    /// made them, each with its place (`seq`) in the conversation.
    Tools(Vec<(u32, ToolCall)>),
    /// Ask the model, at this place.
    Model { seq: u32 },
}

/// A conversation read back.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Replay {
    /// The messages so far: the system prompt, the input, then every recorded reply and result.
    pub(crate) messages: Vec<Msg>,
    /// Model calls recorded (for `max_iters`).
    pub(crate) model_calls: u32,
    pub(crate) next: Next,
}

/// Reads a conversation's records (in order) back.
pub(crate) fn replay(records: &[CallRecord], system: Option<&str>, input: &str) -> Replay {
    let mut messages = Vec::with_capacity(records.len() + 2);
    if let Some(system) = system {
        messages.push(Msg::System(system.to_owned()));
    }
    messages.push(Msg::User(input.to_owned()));
    let mut model_calls = 0;
    // The last model reply and the tool calls it asked for.
    let mut last: Option<(u32, Vec<ToolCall>, String)> = None;
    for r in records {
        match r.kind {
            CallKind::Model => {
                model_calls += 1;
                let (content, calls) = reply_of(r);
                messages.push(Msg::Assistant { content: content.clone(), calls: calls.clone() });
                last = Some((r.seq, calls, content));
            }
            CallKind::Tool => messages.push(Msg::Tool {
                call_id: r.call_id.clone().unwrap_or_default(),
                content: r.response.as_ref().and_then(Value::as_str).unwrap_or_default().to_string(),
            }),
        }
    }
    let next = match last {
        None => Next::Model { seq: 0 },
        Some((_, calls, content)) if calls.is_empty() => Next::Answer(content),
        Some((seq, calls, _)) => {
            let done: HashSet<u32> = records.iter().filter(|r| r.kind == CallKind::Tool).map(|r| r.seq).collect();
            let owed: Vec<(u32, ToolCall)> =
                calls.iter().enumerate().map(|(i, c)| (seq + 1 + i as u32, c.clone())).filter(|(s, _)| !done.contains(s)).collect();
            if owed.is_empty() { Next::Model { seq: seq + 1 + calls.len() as u32 } } else { Next::Tools(owed) }
        }
    };
    Replay { messages, model_calls, next }
}

/// Gives every tool call of a new model reply (to be recorded at `seq`) an id of its own in
/// the conversation — the results refer to it — replacing a missing or repeated one, before
/// it is recorded and replayed.
pub(crate) fn unique_call_ids(records: &[CallRecord], calls: &mut [ToolCall], seq: u32) {
    let mut used: HashSet<String> =
        records.iter().filter(|r| r.kind == CallKind::Model).flat_map(|r| reply_of(r).1).map(|c| c.id).collect();
    for (i, c) in calls.iter_mut().enumerate() {
        if c.id.is_empty() || !used.insert(c.id.clone()) {
            c.id = format!("call_{seq}_{i}");
            used.insert(c.id.clone());
        }
    }
}

/// A recorded model call's reply: its text and the tool calls (by wire name) it made.
pub(crate) fn reply_of(r: &CallRecord) -> (String, Vec<ToolCall>) {
    let resp = r.response.clone().unwrap_or_default();
    let content = resp.get("content").and_then(Value::as_str).unwrap_or_default().to_string();
    let calls = resp
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|c| ToolCall {
                    id: c.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                    name: c.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                    arguments: c.get("arguments").and_then(Value::as_str).unwrap_or("{}").to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    (content, calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};
    use serde_json::json;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("instant")
    }

    fn record(seq: u32, kind: CallKind, call_id: Option<&str>, response: Value) -> CallRecord {
        CallRecord {
            conversation: "c".into(),
            seq,
            kind,
            name: "n".into(),
            call_id: call_id.map(str::to_owned),
            request: None,
            response: Some(response),
            error: None,
            input_tokens: 0,
            output_tokens: 0,
            cost: None,
            run_id: "r".into(),
            attempt: 1,
            started_at: at(),
            finished_at: at(),
        }
    }

    /// A model reply at `seq` asking for tools `(id, name)`.
    fn model(seq: u32, content: &str, calls: &[(&str, &str)]) -> CallRecord {
        let calls: Vec<Value> = calls.iter().map(|(id, name)| json!({"id": id, "name": name, "arguments": "{}"})).collect();
        record(seq, CallKind::Model, None, json!({"content": content, "tool_calls": calls}))
    }

    fn tool(seq: u32, id: &str, result: &str) -> CallRecord {
        record(seq, CallKind::Tool, Some(id), json!(result))
    }

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall { id: id.into(), name: name.into(), arguments: "{}".into() }
    }

    #[test]
    fn what_comes_next_by_the_table() {
        let cases: Vec<(&str, Vec<CallRecord>, Next, u32)> = vec![
            ("nothing recorded: ask the model first", vec![], Next::Model { seq: 0 }, 0),
            ("a reply without tools is the answer", vec![model(0, "done", &[])], Next::Answer("done".into()), 1),
            (
                "tools asked, none answered: both, in order",
                vec![model(0, "", &[("a", "ls"), ("b", "cat")])],
                Next::Tools(vec![(1, call("a", "ls")), (2, call("b", "cat"))]),
                1,
            ),
            (
                "a crash after the first result: only the second is owed",
                vec![model(0, "", &[("a", "ls"), ("b", "cat")]), tool(1, "a", "x")],
                Next::Tools(vec![(2, call("b", "cat"))]),
                1,
            ),
            (
                "every result recorded: ask the model after them",
                vec![model(0, "", &[("a", "ls"), ("b", "cat")]), tool(1, "a", "x"), tool(2, "b", "y")],
                Next::Model { seq: 3 },
                1,
            ),
            (
                "a second round answered",
                vec![model(0, "", &[("a", "ls")]), tool(1, "a", "x"), model(2, "the end", &[])],
                Next::Answer("the end".into()),
                2,
            ),
        ];
        for (what, records, next, model_calls) in cases {
            let r = replay(&records, Some("be brief"), "go");
            assert_eq!((&r.next, r.model_calls), (&next, model_calls), "{what}");
            assert_eq!(r.messages.len(), 2 + records.len(), "{what}: the system prompt, the input, then each record");
        }
    }

    #[test]
    fn messages_replay_replies_and_results_in_order() {
        let records = vec![model(0, "looking", &[("a", "ls")]), tool(1, "a", "file.txt")];
        let r = replay(&records, None, "list");
        assert_eq!(
            r.messages,
            vec![
                Msg::User("list".into()),
                Msg::Assistant { content: "looking".into(), calls: vec![call("a", "ls")] },
                Msg::Tool { call_id: "a".into(), content: "file.txt".into() },
            ]
        );
    }

    #[test]
    fn tool_calls_get_ids_of_their_own() {
        let records = vec![model(0, "", &[("a", "ls")]), tool(1, "a", "x")];
        let mut calls = vec![call("a", "ls"), call("", "cat"), call("z", "cat"), call("z", "cat")];
        unique_call_ids(&records, &mut calls, 2);
        let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["call_2_0", "call_2_1", "z", "call_2_3"], "a repeated or missing id is replaced; a fresh one kept");
    }
}
