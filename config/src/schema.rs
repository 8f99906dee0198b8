//! The JSON Schema of the config, generated from the raw types, and the unknown-key pass that
//! uses it: one source of truth for which keys exist, so that the schema editors see and the
//! "did you mean" errors can never disagree.

use std::borrow::Cow;

use serde_json::Value as Json;

use crate::diag::did_you_mean;
use crate::raw::RawConfig;
use crate::yaml::{Seg, Value, YamlPath};

/// The JSON Schema for `lamplighter.yaml`, pretty-printed.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(RawConfig);
    serde_json::to_string_pretty(&schema).expect("a schema is always serializable")
}

/// An unknown key: where, and the message.
pub(crate) struct UnknownKey {
    pub(crate) path: YamlPath,
    pub(crate) message: String,
}

/// Walks `value` alongside the schema and reports every key the schema does not allow. The
/// schema is generated for the call and dropped: a config file is read once per load.
pub(crate) fn unknown_keys(value: &Value) -> Vec<UnknownKey> {
    unknown_keys_in(&schemars::schema_for!(RawConfig), value)
}

/// As [`unknown_keys`], against a schema generated once for the process: for runtime jobs,
/// which are read one by one (generating it took ~370 µs, most of a runtime job's compile,
/// 37 s of a restart with 100,000 of them). Generated at the first runtime job read.
pub(crate) fn unknown_keys_kept(value: &Value) -> Vec<UnknownKey> {
    static SCHEMA: std::sync::LazyLock<schemars::Schema> = std::sync::LazyLock::new(|| schemars::schema_for!(RawConfig));
    unknown_keys_in(&SCHEMA, value)
}

fn unknown_keys_in(schema: &schemars::Schema, value: &Value) -> Vec<UnknownKey> {
    let root = schema.as_value();
    let mut out = Vec::new();
    walk(root, root, value, &mut Vec::new(), &mut out);
    out
}

/// A step of [`walk`]'s path: borrowed from the value (a key that is not a string is written
/// out), made into a [`YamlPath`] only for an unknown key (a large config has millions of keys
/// and few or none unknown).
enum Step<'v> {
    Key(Cow<'v, str>),
    Index(usize),
}

fn owned(path: &[Step<'_>]) -> YamlPath {
    path.iter()
        .map(|step| match step {
            Step::Key(k) => Seg::Key(k.to_string()),
            Step::Index(i) => Seg::Index(*i),
        })
        .collect()
}

fn resolve<'a>(root: &'a Json, mut s: &'a Json) -> &'a Json {
    // Follow `$ref` and unwrap `Option<T>` (`anyOf: [T, null]`).
    for _ in 0..16 {
        if let Some(r) = s.get("$ref").and_then(Json::as_str) {
            let name = r.rsplit('/').next().unwrap_or_default();
            match root.get("$defs").and_then(|d| d.get(name)) {
                Some(t) => {
                    s = t;
                    continue;
                }
                None => return s,
            }
        }
        if let Some(alts) = s.get("anyOf").or_else(|| s.get("oneOf")).and_then(Json::as_array)
            && let Some(t) = alts.iter().find(|a| a.get("type").and_then(Json::as_str) != Some("null"))
        {
            s = t;
            continue;
        }
        return s;
    }
    s
}

fn walk<'v>(root: &Json, schema: &Json, value: &'v Value, path: &mut Vec<Step<'v>>, out: &mut Vec<UnknownKey>) {
    let schema = resolve(root, schema);
    match value {
        Value::Mapping(map) => {
            let props = schema.get("properties").and_then(Json::as_object);
            let additional = schema.get("additionalProperties");
            for (k, v) in map {
                let key = match k {
                    Value::String(s) => Cow::Borrowed(s.as_str()),
                    other => Cow::Owned(serde_yaml::to_string(other).unwrap_or_default().trim().to_string()),
                };
                path.push(Step::Key(key.clone()));
                if let Some(sub) = props.and_then(|p| p.get(key.as_ref())) {
                    walk(root, sub, v, path, out);
                } else if let Some(add) = additional.filter(|a| a.is_object()) {
                    walk(root, add, v, path, out);
                } else if additional == Some(&Json::Bool(false)) {
                    let known: Vec<&str> = props.map(|p| p.keys().map(String::as_str).collect()).unwrap_or_default();
                    let hint = did_you_mean(&key, known.iter().copied());
                    let path = owned(path);
                    let place = if path.len() == 1 {
                        "at the top level".to_string()
                    } else {
                        format!("in \"{}\"", crate::yaml::path_string(&path[..path.len() - 1]))
                    };
                    out.push(UnknownKey { path, message: format!("unknown key \"{key}\" {place}{hint}") });
                }
                path.pop();
            }
        }
        Value::Sequence(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    path.push(Step::Index(i));
                    walk(root, item_schema, v, path, out);
                    path.pop();
                }
            }
        }
        _ => {}
    }
}
