//! What an agent is offered as tools, and under which names.
//!
//! A tool is known by its configured name — `{plugin}.{action}`, `{server}.{tool}`, or one of
//! the delegation tools — which is what `allowed_actions`, `tool_approval` and the transcript
//! use. Providers accept only `^[a-zA-Z0-9_-]{1,64}$`, so each tool also has a wire name: the
//! configured one with `.` as `__` and anything else outside the set as `_`, cut to fit and
//! made unique with a short hash when that was not enough. The mapping back is this module's
//! business only.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use lamplighter_config::{Pipeline, name_matches};

/// Where a tool's calls go.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Source {
    Plugin {
        plugin: String,
        action: String,
    },
    Mcp {
        server: String,
        tool: String,
    },
    Delegate(Delegation),
    /// `load_skill`: a skill's instructions or files (`skills.rs`).
    Skill,
}

/// The tools an agent with `delegates` gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delegation {
    /// `delegate_to_agent {agent, task}`.
    One,
    /// `delegate_to_multiple_agents {tasks: [{agent, task}]}`, concurrently.
    Many,
    /// `run_pipeline {pipeline, input}`.
    Pipeline,
}

/// One tool as offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tool {
    /// As configured: `file-save.save`, `brave.brave_news_search`, `delegate_to_agent`.
    pub(crate) name: String,
    /// As sent to the provider.
    pub(crate) wire: String,
    pub(crate) description: String,
    /// JSON Schema of the arguments (an object schema).
    pub(crate) parameters: Value,
    pub(crate) source: Source,
}

/// The tools of one agent, by configured and by wire name.
#[derive(Debug, Default)]
pub(crate) struct Toolbox {
    tools: Vec<Tool>,
    by_wire: HashMap<String, usize>,
}

/// The longest name providers accept.
const MAX_WIRE: usize = 64;

impl Toolbox {
    /// Adds a tool unless `allowed` (an agent's `allowed_actions`; empty = everything) rules it
    /// out; delegation and skill tools are not subject to it.
    pub(crate) fn add(&mut self, name: String, description: String, parameters: Value, source: Source, allowed: &[String]) {
        let filtered = !matches!(source, Source::Delegate(_) | Source::Skill);
        if filtered && !allowed.is_empty() && !allowed.iter().any(|p| name_matches(p, &name)) {
            return;
        }
        if self.tools.iter().any(|t| t.name == name) {
            return;
        }
        let wire = self.unique_wire(&name);
        self.by_wire.insert(wire.clone(), self.tools.len());
        self.tools.push(Tool { name, wire, description, parameters: object_schema(parameters), source });
    }

    pub(crate) fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// The tool a model named (by wire name; a configured name is accepted too, since models
    /// copy names from their prompts).
    pub(crate) fn by_wire(&self, wire: &str) -> Option<&Tool> {
        self.by_wire.get(wire).map(|&i| &self.tools[i]).or_else(|| self.tools.iter().find(|t| t.name == wire))
    }

    /// The wire name of a configured name, if the tool is offered.
    #[cfg(test)]
    pub(crate) fn wire_of(&self, name: &str) -> Option<&str> {
        self.tools.iter().find(|t| t.name == name).map(|t| t.wire.as_str())
    }

    fn unique_wire(&self, name: &str) -> String {
        let base = wire_name(name);
        if base.len() <= MAX_WIRE && !self.by_wire.contains_key(&base) {
            return base;
        }
        // Cut, and tell apart by a hash of the configured name (stable across restarts).
        let tag = format!("_{:08x}", fnv1a(name) as u32);
        let mut cut: String = base.chars().take(MAX_WIRE - tag.len()).collect();
        cut.push_str(&tag);
        let mut n = 2;
        let mut wire = cut.clone();
        while self.by_wire.contains_key(&wire) {
            let suffix = format!("_{n}");
            wire = format!("{}{suffix}", &cut[..cut.len() - suffix.len()]);
            n += 1;
        }
        wire
    }
}

/// `file-save.save` → `file-save__save`; anything outside `[a-zA-Z0-9_-]` → `_`.
fn wire_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    for c in name.chars() {
        match c {
            '.' => out.push_str("__"),
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => out.push(c),
            _ => out.push('_'),
        }
    }
    if out.is_empty() {
        out.push('_');
    }
    out
}

fn fnv1a(s: &str) -> u64 {
    crate::share::fnv1a(s.bytes())
}

/// Providers want an object schema for function parameters: anything else (a manifest
/// without one, a boolean schema) becomes an open object.
fn object_schema(v: Value) -> Value {
    match v {
        Value::Object(mut m) => {
            if !m.contains_key("type") && !m.contains_key("properties") {
                m.insert("type".into(), json!("object"));
                m.insert("properties".into(), json!({}));
            }
            Value::Object(m)
        }
        _ => json!({"type": "object", "properties": {}}),
    }
}

/// The delegation tools of an agent whose `delegates` are `agents` (and the pipelines there
/// are, each with its description, which the model reads to choose one).
pub(crate) fn delegation_tools(agents: &[String], pipelines: &BTreeMap<String, Pipeline>) -> Vec<(String, String, Value, Source)> {
    let agent_enum = json!(agents);
    let mut out = vec![
        (
            "delegate_to_agent".to_string(),
            format!("Give a task to another agent and get its answer. Agents: {}.", agents.join(", ")),
            json!({
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "enum": agent_enum, "description": "Which agent"},
                    "task": {"type": "string", "description": "What it should do, with everything it needs to know"}
                },
                "required": ["agent", "task"]
            }),
            Source::Delegate(Delegation::One),
        ),
        (
            "delegate_to_multiple_agents".to_string(),
            "Give tasks to several agents at once; each answer comes back labelled with its agent. One failing does not stop the others."
                .to_string(),
            json!({
                "type": "object",
                "properties": {
                    "tasks": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "agent": {"type": "string", "enum": agent_enum},
                                "task": {"type": "string"}
                            },
                            "required": ["agent", "task"]
                        }
                    }
                },
                "required": ["tasks"]
            }),
            Source::Delegate(Delegation::Many),
        ),
    ];
    if !pipelines.is_empty() {
        let listed: Vec<String> = pipelines
            .iter()
            .map(|(name, p)| match &p.description {
                Some(d) => format!("{name} ({})", d.trim()),
                None => name.clone(),
            })
            .collect();
        let pipelines: Vec<&String> = pipelines.keys().collect();
        out.push((
            "run_pipeline".to_string(),
            format!(
                "Run a named pipeline of agents: each gets the previous one's answer; the last answer comes back. Pipelines: {}.",
                listed.join(", ")
            ),
            json!({
                "type": "object",
                "properties": {
                    "pipeline": {"type": "string", "enum": pipelines},
                    "input": {"type": "string", "description": "The first agent's input"}
                },
                "required": ["pipeline", "input"]
            }),
            Source::Delegate(Delegation::Pipeline),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(name: &str) -> Source {
        let (p, a) = name.split_once('.').unwrap_or((name, ""));
        Source::Plugin { plugin: p.into(), action: a.into() }
    }

    fn valid(wire: &str) -> bool {
        (1..=MAX_WIRE).contains(&wire.len()) && wire.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn wire_names_satisfy_provider_rules_and_map_back() {
        let mut b = Toolbox::default();
        let long = format!("{}.{}", "p".repeat(40), "a".repeat(40));
        for name in ["file-save.save", "brave.brave_news_search", "weird server.tool/with:chars", long.as_str(), "x.y", "x__y"] {
            b.add(name.into(), String::new(), json!({}), plugin(name), &[]);
        }
        assert_eq!(b.wire_of("file-save.save"), Some("file-save__save"));
        for t in b.tools() {
            assert!(valid(&t.wire), "{} → {}", t.name, t.wire);
            assert_eq!(b.by_wire(&t.wire).map(|t| t.name.as_str()), Some(t.name.as_str()));
        }
        // `x.y` and `x__y` would both be `x__y`: the second is told apart.
        assert_ne!(b.wire_of("x.y"), b.wire_of("x__y"));
        // A model that copies the configured name from its prompt still reaches the tool.
        assert_eq!(b.by_wire("file-save.save").map(|t| t.wire.as_str()), Some("file-save__save"));
        assert!(b.by_wire("nope").is_none());
    }

    #[test]
    fn allowed_actions_filter_exact_and_prefix_but_not_delegation() {
        let allowed = vec!["file-save.save".to_string(), "brave.*".to_string()];
        let mut b = Toolbox::default();
        for name in ["file-save.save", "file-save.append", "brave.search", "brave.news", "shell-exec.run"] {
            b.add(name.into(), String::new(), json!({}), plugin(name), &allowed);
        }
        for (name, d, p, s) in delegation_tools(&["a".into()], &BTreeMap::new()) {
            b.add(name, d, p, s, &allowed);
        }
        let names: Vec<&str> = b.tools().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["file-save.save", "brave.search", "brave.news", "delegate_to_agent", "delegate_to_multiple_agents"]);
        // Nothing listed: everything offered.
        let mut open = Toolbox::default();
        open.add("shell-exec.run".into(), String::new(), json!(true), plugin("shell-exec.run"), &[]);
        assert_eq!(open.tools()[0].parameters, json!({"type": "object", "properties": {}}), "schemas become object schemas");
    }
}
