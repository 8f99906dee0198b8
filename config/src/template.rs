//! Workflow templates (SPEC §6): a string with `${input…}`, `${steps.<id>.output…}`,
//! `${env.VAR}` and `${run.…}` references, parsed once at load so that the engine only
//! substitutes values and validation can see which steps and variables a template uses.
//!
//! Parsing is infallible: anything inside `${…}` that is not one of the known forms, and a `${`
//! without a closing `}`, stays text exactly as written ("an unknown variable is left as
//! written"). Rendering with no values therefore gives back the source.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// The template roots that `${VAR}` environment substitution in load.rs must leave alone.
pub(crate) const ROOTS: &[&str] = &["input", "steps", "env"];

/// A string parsed into text and references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
}

/// One piece of a template. Adjacent text is merged, so two `Text` parts never follow each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Literal text, including unknown `${…}` written by the user.
    Text(String),
    /// A known reference.
    Ref {
        /// What the reference names.
        var: Var,
        /// The reference as written, `${` and `}` included.
        text: String,
    },
}

/// What a reference names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Var {
    /// `${input}` (empty path) or `${input.a.b}`.
    Input(Vec<String>),
    /// `${steps.<id>.output}` or `${steps.<id>.output.a.b}`.
    StepOutput {
        /// The step id.
        step: String,
        /// The path into the step's JSON output; empty for the whole output.
        path: Vec<String>,
    },
    /// `${env.VAR}`.
    Env(String),
    /// `${run.id}`.
    RunId,
    /// `${run.attempt}`.
    RunAttempt,
}

impl Template {
    /// Parses a template; never fails, unknown references stay text.
    pub fn parse(s: &str) -> Template {
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(start) = rest.find("${") {
            let after = &rest[start + 2..];
            // Unterminated: the rest, from before `${`, is pushed as text after the loop.
            let Some(end) = after.find('}') else { break };
            push_text(&mut parts, &rest[..start]);
            let text = &rest[start..start + 2 + end + 1];
            match classify(&after[..end]) {
                Some(var) => parts.push(Part::Ref { var, text: text.to_string() }),
                None => push_text(&mut parts, text),
            }
            rest = &after[end + 1..];
        }
        push_text(&mut parts, rest);
        Template { source: s.to_string(), parts }
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The text and references, in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The references, in order (repeats included).
    pub fn vars(&self) -> impl Iterator<Item = &Var> {
        self.parts.iter().filter_map(|p| match p {
            Part::Ref { var, .. } => Some(var),
            Part::Text(_) => None,
        })
    }

    /// Renders: each reference is replaced by `f(var)`; `None` leaves the reference as written.
    pub fn render(&self, mut f: impl FnMut(&Var) -> Option<String>) -> String {
        let mut out = String::with_capacity(self.source.len());
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Ref { var, text } => match f(var) {
                    Some(v) => out.push_str(&v),
                    None => out.push_str(text),
                },
            }
        }
        out
    }

    /// The single reference when the whole template is exactly one `${…}`, so that a caller can
    /// substitute a JSON value rather than a string.
    pub fn as_single_var(&self) -> Option<&Var> {
        match self.parts.as_slice() {
            [Part::Ref { var, .. }] => Some(var),
            _ => None,
        }
    }
}

/// Stored as written (a run's definition snapshot); read back by parsing again.
impl serde::Serialize for Template {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

impl<'de> serde::Deserialize<'de> for Template {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Template::parse(&String::deserialize(d)?))
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Appends text, merging it into a preceding text part.
fn push_text(parts: &mut Vec<Part>, s: &str) {
    if s.is_empty() {
        return;
    }
    if let Some(Part::Text(t)) = parts.last_mut() {
        t.push_str(s);
    } else {
        parts.push(Part::Text(s.to_string()));
    }
}

/// The reference named by the inside of `${…}`, if it is one of the known forms. No trimming:
/// `${ input }` is not a reference.
fn classify(inner: &str) -> Option<Var> {
    let segs: Vec<&str> = inner.split('.').collect();
    match segs.as_slice() {
        ["input", path @ ..] => keys(path).map(Var::Input),
        ["steps", step, "output", path @ ..] if is_key(step) => keys(path).map(|path| Var::StepOutput { step: (*step).to_string(), path }),
        ["env", name] if is_env_name(name) => Some(Var::Env((*name).to_string())),
        ["run", "id"] => Some(Var::RunId),
        ["run", "attempt"] => Some(Var::RunAttempt),
        _ => None,
    }
}

/// A path of keys, or `None` if one of them is not a key.
fn keys(path: &[&str]) -> Option<Vec<String>> {
    path.iter().map(|s| is_key(s).then(|| (*s).to_string())).collect()
}

/// A step id or a key into JSON: letters, digits, `_` and `-` (no `.`, no whitespace).
fn is_key(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-')
}

/// `[A-Za-z_][A-Za-z0-9_]*`.
fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A JSON value whose strings are templates (step `input`, plugin `parameters`).
#[derive(Debug, Clone, PartialEq)]
pub enum Templated {
    /// A string.
    Text(Template),
    /// An array.
    List(Vec<Templated>),
    /// An object.
    Map(BTreeMap<String, Templated>),
    /// A number, boolean or null.
    Value(Value),
}

/// Stored as the JSON value written; read back by parsing again.
impl serde::Serialize for Templated {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.as_written().serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Templated {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Templated::parse(&Value::deserialize(d)?))
    }
}

impl Templated {
    /// Parses every string in `v` as a template.
    pub fn parse(v: &Value) -> Self {
        match v {
            Value::String(s) => Self::Text(Template::parse(s)),
            Value::Array(items) => Self::List(items.iter().map(Templated::parse).collect()),
            Value::Object(map) => Self::Map(map.iter().map(|(k, v)| (k.clone(), Templated::parse(v))).collect()),
            other => Self::Value(other.clone()),
        }
    }

    /// The JSON value as written; `Templated::parse(v).as_written() == v`.
    pub fn as_written(&self) -> Value {
        match self {
            Self::Text(t) => Value::String(t.as_str().to_string()),
            Self::List(items) => Value::Array(items.iter().map(Templated::as_written).collect()),
            Self::Map(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), v.as_written())).collect()),
            Self::Value(v) => v.clone(),
        }
    }

    /// Every reference, in order (object keys sorted).
    pub fn vars(&self) -> Vec<&Var> {
        let mut out = Vec::new();
        self.collect_vars(&mut out);
        out
    }

    fn collect_vars<'a>(&'a self, out: &mut Vec<&'a Var>) {
        match self {
            Self::Text(t) => out.extend(t.vars()),
            Self::List(items) => {
                for item in items {
                    item.collect_vars(out);
                }
            }
            Self::Map(map) => {
                for v in map.values() {
                    v.collect_vars(out);
                }
            }
            Self::Value(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parts(s: &str) -> Vec<Part> {
        Template::parse(s).parts().to_vec()
    }

    fn text(s: &str) -> Part {
        Part::Text(s.to_string())
    }

    fn r(var: Var, text: &str) -> Part {
        Part::Ref { var, text: text.to_string() }
    }

    fn path(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    fn step(id: &str, p: &[&str]) -> Var {
        Var::StepOutput { step: id.to_string(), path: path(p) }
    }

    #[test]
    fn every_reference_form() {
        let cases = [
            ("${input}", Var::Input(vec![])),
            ("${input.key}", Var::Input(path(&["key"]))),
            ("${input.a.b}", Var::Input(path(&["a", "b"]))),
            ("${steps.grammar-check.output}", step("grammar-check", &[])),
            ("${steps.fact_check.output}", step("fact_check", &[])),
            ("${steps.a.output.x}", step("a", &["x"])),
            ("${steps.a.output.x.y}", step("a", &["x", "y"])),
            ("${env.HOME}", Var::Env("HOME".into())),
            ("${env._X1}", Var::Env("_X1".into())),
            ("${run.id}", Var::RunId),
            ("${run.attempt}", Var::RunAttempt),
        ];
        for (s, var) in cases {
            let t = Template::parse(s);
            assert_eq!(t.parts(), &[r(var.clone(), s)], "{s}");
            assert_eq!(t.as_single_var(), Some(&var), "{s}");
            assert_eq!(t.vars().collect::<Vec<_>>(), vec![&var], "{s}");
            assert_eq!(t.render(|_| Some("V".into())), "V", "{s}");
            assert_eq!(t.render(|_| None), s, "{s}");
        }
    }

    #[test]
    fn unknown_references_stay_as_written() {
        let unknown = [
            "${foo}",
            "${INPUT}",
            "${steps}",
            "${steps.x}",
            "${steps.x.result}",
            "${steps.a.b.output}",
            "${steps..output}",
            "${steps.a.b.output.c}",
            "${env}",
            "${env.}",
            "${env.1X}",
            "${env.A-B}",
            "${env.A.B}",
            "${run}",
            "${run.other}",
            "${run.id.x}",
            "${ input }",
            "${input }",
            "${input.}",
            "${input..a}",
            "${input.a b}",
            "${}",
        ];
        for s in unknown {
            let t = Template::parse(s);
            assert_eq!(t.parts(), &[text(s)], "{s}");
            assert_eq!(t.vars().count(), 0, "{s}");
            assert_eq!(t.as_single_var(), None, "{s}");
            assert_eq!(t.render(|_| Some("V".into())), s, "{s}");
        }
    }

    #[test]
    fn text_around_and_between_references() {
        let s = "Review: ${input.topic} and ${steps.draft.output}!";
        let t = Template::parse(s);
        assert_eq!(
            t.parts(),
            &[
                text("Review: "),
                r(Var::Input(path(&["topic"])), "${input.topic}"),
                text(" and "),
                r(step("draft", &[]), "${steps.draft.output}"),
                text("!"),
            ]
        );
        let rendered = t.render(|v| match v {
            Var::Input(_) => Some("T".into()),
            Var::StepOutput { .. } => Some("D".into()),
            _ => None,
        });
        assert_eq!(rendered, "Review: T and D!");
        assert_eq!(t.as_single_var(), None);

        assert_eq!(parts("${input}${run.id}"), [r(Var::Input(vec![]), "${input}"), r(Var::RunId, "${run.id}")]);
        // Unknown references merge with the text around them.
        assert_eq!(parts("a ${foo} b ${input}"), [text("a ${foo} b "), r(Var::Input(vec![]), "${input}")]);
        assert_eq!(parts("${foo}${bar}"), [text("${foo}${bar}")]);
    }

    #[test]
    fn render_leaves_unresolved_references_as_written() {
        let t = Template::parse("${run.id}-${run.attempt} ${env.NOPE}");
        let out = t.render(|v| match v {
            Var::RunId => Some("r1".into()),
            _ => None,
        });
        assert_eq!(out, "r1-${run.attempt} ${env.NOPE}");
    }

    #[test]
    fn unterminated_reference_is_text() {
        assert_eq!(parts("${input"), [text("${input")]);
        assert_eq!(parts("x ${input"), [text("x ${input")]);
        assert_eq!(parts("${input} ${input.a"), [r(Var::Input(vec![]), "${input}"), text(" ${input.a")]);
        assert_eq!(Template::parse("x ${input").render(|_| Some("V".into())), "x ${input");
    }

    #[test]
    fn leftover_env_variable_is_text() {
        // An unset `${VAR}` that load.rs left as written.
        let t = Template::parse("${NOPE}/x");
        assert_eq!(t.parts(), &[text("${NOPE}/x")]);
        assert_eq!(t.render(|_| Some("V".into())), "${NOPE}/x");
    }

    #[test]
    fn single_var() {
        assert_eq!(Template::parse("${input.a}").as_single_var(), Some(&Var::Input(path(&["a"]))));
        assert_eq!(Template::parse("${steps.s.output}").as_single_var(), Some(&step("s", &[])));
        for s in [" ${input}", "${input} ", "${input}${input}", "x", "", "${foo}", "${input"] {
            assert_eq!(Template::parse(s).as_single_var(), None, "{s}");
        }
    }

    #[test]
    fn source_is_kept() {
        let s = "a ${input.x} ${foo} ${";
        let t = Template::parse(s);
        assert_eq!(t.as_str(), s);
        assert_eq!(t.to_string(), s);
        assert_eq!(Template::parse("").parts(), &[] as &[Part]);
    }

    #[test]
    fn odd_strings_do_not_panic() {
        assert_eq!(parts("${"), [text("${")]);
        assert_eq!(parts("}"), [text("}")]);
        assert_eq!(parts("$${input}"), [text("$"), r(Var::Input(vec![]), "${input}")]);
        assert_eq!(parts("ü${input.ä}"), [text("ü"), r(Var::Input(path(&["ä"])), "${input.ä}")]);
        assert_eq!(parts("${input}}"), [r(Var::Input(vec![]), "${input}"), text("}")]);
        assert_eq!(parts("${{input}}"), [text("${{input}}")]);
        assert_eq!(parts("${steps.x.output.${input}}"), [text("${steps.x.output.${input}}")]);
        let odd = [
            "${",
            "}",
            "$",
            "$$",
            "${}",
            "$${input}",
            "ü${input.ä}",
            "${input.ä}ü",
            "${ü",
            "ü}",
            "{$}",
            "${{input}}",
            "日本${env.X}語",
            "${env.é}",
        ];
        for s in odd {
            let t = Template::parse(s);
            assert_eq!(t.as_str(), s);
            // With no values, rendering gives back the source.
            assert_eq!(t.render(|_| None), s, "{s}");
            let _ = t.render(|_| Some("ü".into()));
        }
    }

    #[test]
    fn templated_round_trip() {
        let v = json!({
            "prompt": "Summarise ${input.topic}",
            "n": 3,
            "ratio": 0.5,
            "neg": -7,
            "flag": true,
            "off": false,
            "none": null,
            "list": ["${steps.a.output}", 1, [null, "plain"]],
            "nested": {"env": "${env.HOME}", "empty": {}, "arr": []}
        });
        let t = Templated::parse(&v);
        assert_eq!(t.as_written(), v);
        assert_eq!(t.vars(), vec![&step("a", &[]), &Var::Env("HOME".into()), &Var::Input(path(&["topic"]))]);

        assert_eq!(Templated::parse(&json!("x ${input}")), Templated::Text(Template::parse("x ${input}")));
        assert_eq!(Templated::parse(&json!(5)), Templated::Value(json!(5)));
        assert_eq!(Templated::parse(&json!(null)).vars(), Vec::<&Var>::new());
    }

    #[test]
    fn env_substitution_leaves_template_roots_alone() {
        fn any(_: &str) -> Option<String> {
            Some("X".into())
        }
        for root in ROOTS {
            let s = format!("${{{root}}}");
            assert_eq!(crate::load::substitute_str(&s, &any), (s.clone(), vec![]));
        }
    }
}
