//! What a workflow's `${…}` references stand for when a step runs, truthiness, and the cap on
//! recorded step outputs. Pure functions: the engine gathers the values, these render them.

use std::collections::HashMap;

use serde_json::Value;

use lamplighter_config::{Template, Templated, Var};

use crate::run::StepRecord;

/// Step outputs larger than this (as JSON text) are recorded, and passed to later steps, as a
/// string holding their first [`OUTPUT_CAP`] bytes and a note; a step must not be able to bloat
/// every later read of its run.
pub(crate) const OUTPUT_CAP: usize = 1 << 20;

/// The values references resolve to, for one step.
pub(crate) struct Scope<'a> {
    pub(crate) input: Option<&'a Value>,
    /// The recorded steps of the run (only finished ones have outputs).
    pub(crate) steps: &'a HashMap<String, StepRecord>,
    /// The run's identity (the first attempt's id, the same in every attempt).
    pub(crate) run_id: &'a str,
    pub(crate) attempt: u32,
}

impl Scope<'_> {
    /// The value of a reference; `None` leaves it as written.
    fn lookup(&self, var: &Var) -> Option<Value> {
        match var {
            Var::Input(path) => walk(self.input?, path),
            Var::StepOutput { step, path } => {
                let record = self.steps.get(step).filter(|r| r.status.is_done())?;
                walk(record.output.as_ref().unwrap_or(&Value::Null), path)
            }
            Var::Env(name) => std::env::var(name).ok().map(Value::String),
            Var::RunId => Some(Value::String(self.run_id.to_string())),
            Var::RunAttempt => Some(Value::from(self.attempt)),
        }
    }

    /// A template as text: strings as they are less their trailing newlines (as a shell's
    /// `$(…)` does: `${steps.count.output.stdout}` in a sentence is `5`, not `5\n`), other
    /// JSON as JSON text, null as nothing.
    pub(crate) fn text(&self, t: &Template) -> String {
        t.render(|v| self.lookup(v).map(|v| as_text(&v)))
    }

    /// A templated JSON value: every string rendered; a string that is exactly one reference
    /// takes the referenced JSON value itself (`count: "${input.n}"` stays a number).
    pub(crate) fn value(&self, t: &Templated) -> Value {
        match t {
            Templated::Text(t) => match t.as_single_var().and_then(|v| self.lookup(v)) {
                Some(v) => v,
                None => Value::String(self.text(t)),
            },
            Templated::List(items) => Value::Array(items.iter().map(|i| self.value(i)).collect()),
            Templated::Map(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), self.value(v))).collect()),
            Templated::Value(v) => v.clone(),
        }
    }
}

/// Follows keys (and array indices) into a value. A string that holds JSON is looked into (an
/// agent's answer is often JSON text); null stays null whatever the path (a skipped step's
/// `${steps.x.output.approved}` is empty, so false, not left as written).
fn walk(v: &Value, path: &[String]) -> Option<Value> {
    let Some((key, rest)) = path.split_first() else { return Some(v.clone()) };
    match v {
        Value::Null => Some(Value::Null),
        Value::Object(m) => walk(m.get(key)?, rest),
        Value::Array(a) => walk(a.get(key.parse::<usize>().ok()?)?, rest),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(parsed @ (Value::Object(_) | Value::Array(_))) => walk(&parsed, path),
            _ => None,
        },
        Value::Bool(_) | Value::Number(_) => None,
    }
}

fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.trim_end_matches(['\n', '\r']).to_owned(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// False for empty, `false`, `0` and `null` (after trimming, case-insensitive); true otherwise.
pub(crate) fn truthy(s: &str) -> bool {
    let t = s.trim();
    !(t.is_empty() || t == "0" || t.eq_ignore_ascii_case("false") || t.eq_ignore_ascii_case("null"))
}

/// The output as recorded: unchanged up to [`OUTPUT_CAP`] bytes of JSON, else cut (on a
/// character boundary) with a note saying how large it was.
pub(crate) fn cap(v: Value) -> Value {
    let text = match &v {
        Value::String(s) if s.len() <= OUTPUT_CAP => return v,
        Value::String(s) => s.clone(),
        other => {
            let t = other.to_string();
            if t.len() <= OUTPUT_CAP {
                return v;
            }
            t
        }
    };
    let mut cut = OUTPUT_CAP;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    Value::String(format!("{}\n… [output truncated: {} bytes in all, the first {cut} kept]", &text[..cut], text.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::StepStatus;
    use serde_json::json;

    fn done(step: &str, output: Value) -> (String, StepRecord) {
        let r = StepRecord {
            step: step.into(),
            status: StepStatus::Succeeded,
            attempt: 1,
            run_id: "r".into(),
            started_at: None,
            finished_at: None,
            output: Some(output),
            error: None,
            resumes_on_reject: false,
        };
        (step.into(), r)
    }

    #[test]
    fn references_render_text_json_and_stay_as_written_when_unknown() {
        let input = json!({"url": "https://x", "n": 3, "tags": ["a", "b"]});
        let mut steps: HashMap<String, StepRecord> = [
            done("fetch", json!({"status": 200, "content": "hello"})),
            done("agent", json!("{\"severity\": \"high\"}")),
            done("skipped", Value::Null),
            done("count", json!({"exit_code": 0, "stdout": "5\n"})),
        ]
        .into_iter()
        .collect();
        let (_, mut running) = done("later", json!("x"));
        running.status = StepStatus::Running;
        steps.insert("later".into(), running);
        let scope = Scope { input: Some(&input), steps: &steps, run_id: "root-1", attempt: 2 };
        let t = |s: &str| scope.text(&Template::parse(s));
        assert_eq!(t("${input.url} ${input.n} ${input.tags.1}"), "https://x 3 b");
        assert_eq!(t("${input}"), input.to_string());
        assert_eq!(t("${steps.fetch.output.status}/${steps.fetch.output}"), "200/{\"content\":\"hello\",\"status\":200}");
        assert_eq!(t("${steps.agent.output.severity}"), "high", "JSON text in a string output is looked into");
        assert_eq!(t("[${steps.skipped.output.approved}]"), "[]", "a skipped step's output is empty");
        assert_eq!(t("${steps.later.output}"), "${steps.later.output}", "a step that has not finished stays as written");
        assert_eq!(t("${steps.nope.output} ${input.missing} ${other}"), "${steps.nope.output} ${input.missing} ${other}");
        assert_eq!(t("${run.id}#${run.attempt}"), "root-1#2");
        assert_eq!(t("Publish ${steps.count.output.stdout} commits?"), "Publish 5 commits?", "trailing newlines go, as in $(…)");
        let whole = scope.value(&Templated::parse(&json!("${steps.count.output.stdout}")));
        assert_eq!(whole, json!("5\n"), "a value that is one reference is passed as it is");
        let v = scope.value(&Templated::parse(&json!({"n": "${input.n}", "s": "n=${input.n}", "l": ["${steps.fetch.output.status}"]})));
        assert_eq!(v, json!({"n": 3, "s": "n=3", "l": [200]}));
    }

    #[test]
    fn truthiness_follows_the_spec() {
        for f in ["", "  ", "false", "FALSE", " False ", "0", "null", "NULL"] {
            assert!(!truthy(f), "{f:?} is false");
        }
        for t in ["true", "1", "yes", "no", "0.0", "high", "{}"] {
            assert!(truthy(t), "{t:?} is true");
        }
    }

    #[test]
    fn large_outputs_are_capped_with_a_note() {
        let small = json!({"a": "b"});
        assert_eq!(cap(small.clone()), small);
        let big = Value::String("é".repeat(OUTPUT_CAP));
        let Value::String(s) = cap(big) else { panic!("a string") };
        assert!(s.len() < OUTPUT_CAP + 100);
        assert!(
            s.ends_with(&format!("[output truncated: {} bytes in all, the first {} kept]", 2 * OUTPUT_CAP, OUTPUT_CAP)),
            "{}",
            &s[s.len() - 80..]
        );
    }
}
