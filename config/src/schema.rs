//! The JSON Schema of the config, generated from the raw types, and the unknown-key pass that
//! uses it: one source of truth for which keys exist, so that the schema editors see and the
//! "did you mean" errors can never disagree.

use std::borrow::Cow;
use std::collections::HashMap;

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

/// Walks `value` alongside the schema and reports every key the schema does not allow,
/// leaving out the items of the collection at `items_at` (`scheduling.jobs`: each is walked
/// as it is read, by [`unknown_keys_of_item`], off the loader's critical path).
pub(crate) fn unknown_keys_but_items(value: &Value, items_at: &[&str]) -> Vec<UnknownKey> {
    let keys = Keys::get();
    let mut out = Vec::new();
    keys.walk(Keys::ROOT, value, &mut Vec::new(), Some(items_at), &mut out);
    out
}

/// The unknown keys of the item `name` of the collection at `at`, as
/// [`unknown_keys_but_items`] would find them there.
pub(crate) fn unknown_keys_of_item(at: &[&str], name: &str, value: &Value) -> Vec<UnknownKey> {
    let keys = Keys::get();
    let mut node = Keys::ROOT;
    for k in at {
        match keys.nodes[node].props.get(*k) {
            Some(&sub) => node = sub,
            None => return vec![UnknownKey { path: crate::load::keys(at), message: "the config's schema has no such collection".into() }],
        }
    }
    let Additional::Schema(item) = keys.nodes[node].additional else {
        return vec![UnknownKey { path: crate::load::keys(at), message: "the config's schema has no items here".into() }];
    };
    let mut path: Vec<Step<'_>> = at.iter().map(|k| Step::Key(Cow::Borrowed(*k))).collect();
    path.push(Step::Key(Cow::Borrowed(name)));
    let mut out = Vec::new();
    keys.walk(item, value, &mut path, None, &mut out);
    out
}

/// Which keys the schema allows where, read out of the JSON Schema once for the process: a
/// config has up to a million jobs, and looking each key up in the schema itself (following
/// its `$ref`s, comparing names along the way) took some 1.4 µs a job; generating the schema
/// took ~370 µs, most of a runtime job's compile.
struct Keys {
    nodes: Vec<Node>,
}

/// What the schema says of one place of the document.
#[derive(Default)]
struct Node {
    /// `properties`: a key's node.
    props: HashMap<String, usize>,
    /// The keys of `props` in the schema's order (for "did you mean").
    known: Vec<String>,
    /// What `additionalProperties` says of any other key.
    additional: Additional,
    /// `items`: the node of a sequence's items.
    items: Option<usize>,
}

/// What a key that is not a property is.
#[derive(Default, Clone, Copy)]
enum Additional {
    /// Allowed, not walked (the schema says nothing, or `true`).
    #[default]
    Any,
    /// Unknown (`false`).
    Refused,
    /// Walked against this node (a map of names to definitions).
    Schema(usize),
}

impl Keys {
    const ROOT: usize = 0;

    fn get() -> &'static Keys {
        static KEYS: std::sync::LazyLock<Keys> = std::sync::LazyLock::new(|| {
            let schema = schemars::schema_for!(RawConfig);
            let root = schema.as_value();
            let mut keys = Keys { nodes: Vec::new() };
            keys.node(root, root, &mut HashMap::new());
            keys
        });
        &KEYS
    }

    /// The node of `schema` (resolved), built once per schema object: a `$ref` that leads
    /// back into itself (a workflow's steps hold steps) is the same node.
    fn node(&mut self, root: &Json, schema: &Json, seen: &mut HashMap<*const Json, usize>) -> usize {
        let schema = resolve(root, schema);
        if let Some(&id) = seen.get(&std::ptr::from_ref(schema)) {
            return id;
        }
        let id = self.nodes.len();
        self.nodes.push(Node::default());
        seen.insert(std::ptr::from_ref(schema), id);
        let mut node = Node::default();
        if let Some(props) = schema.get("properties").and_then(Json::as_object) {
            for (k, sub) in props {
                let sub = self.node(root, sub, seen);
                node.props.insert(k.clone(), sub);
                node.known.push(k.clone());
            }
        }
        node.additional = match schema.get("additionalProperties") {
            Some(Json::Bool(false)) => Additional::Refused,
            Some(add) if add.is_object() => Additional::Schema(self.node(root, add, seen)),
            _ => Additional::Any,
        };
        node.items = schema.get("items").map(|items| self.node(root, items, seen));
        self.nodes[id] = node;
        id
    }

    /// Walks `value` at `path` against `node`; the items of the mapping at `skip`, if any,
    /// are left out.
    fn walk<'v>(&self, node: usize, value: &'v Value, path: &mut Vec<Step<'v>>, skip: Option<&[&str]>, out: &mut Vec<UnknownKey>) {
        let schema = &self.nodes[node];
        match value {
            Value::Mapping(_) if skip.is_some_and(|skip| at(path, skip)) => {}
            Value::Mapping(map) => {
                for (k, v) in map {
                    let key = match k {
                        Value::String(s) => Cow::Borrowed(s.as_str()),
                        other => Cow::Owned(serde_yaml::to_string(other).unwrap_or_default().trim().to_string()),
                    };
                    let sub = schema.props.get(key.as_ref()).copied();
                    path.push(Step::Key(key));
                    match (sub, schema.additional) {
                        (Some(sub), _) | (None, Additional::Schema(sub)) => self.walk(sub, v, path, skip, out),
                        (None, Additional::Refused) => out.push(unknown(path, &schema.known)),
                        (None, Additional::Any) => {}
                    }
                    path.pop();
                }
            }
            Value::Sequence(items) => {
                if let Some(item) = schema.items {
                    for (i, v) in items.iter().enumerate() {
                        path.push(Step::Index(i));
                        self.walk(item, v, path, skip, out);
                        path.pop();
                    }
                }
            }
            _ => {}
        }
    }
}

/// The unknown key at the end of `path`, where `known` are the keys allowed beside it.
fn unknown(path: &[Step<'_>], known: &[String]) -> UnknownKey {
    let path = owned(path);
    let key = match path.last() {
        Some(Seg::Key(k)) => k.as_str(),
        _ => "",
    };
    let hint = did_you_mean(key, known.iter().map(String::as_str));
    let place = if path.len() == 1 {
        "at the top level".to_string()
    } else {
        format!("in \"{}\"", crate::yaml::path_string(&path[..path.len() - 1]))
    };
    let message = format!("unknown key \"{key}\" {place}{hint}");
    UnknownKey { path, message }
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

/// Whether `path` is `keys`.
fn at(path: &[Step<'_>], keys: &[&str]) -> bool {
    path.len() == keys.len() && path.iter().zip(keys).all(|(step, k)| matches!(step, Step::Key(s) if s == k))
}
