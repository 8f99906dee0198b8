//! Checks an action's parameters against the manifest's JSON Schema (the subset the built-ins
//! use: an object of string, integer, boolean and array-of-string properties) and reads them.

use serde_json::{Map, Value};

use crate::ActionError;

/// Parameters that passed validation; the getters only fail on values out of range.
#[derive(Debug)]
pub(crate) struct Params {
    action: String,
    values: Map<String, Value>,
}

impl Params {
    /// `null` counts as no parameters, so actions without required ones can be called bare.
    pub(crate) fn validate(action: &str, schema: &Value, params: Value) -> Result<Self, ActionError> {
        let invalid = |parameter: &str, problem: String| ActionError::InvalidParameter {
            action: action.to_owned(),
            parameter: parameter.to_owned(),
            problem,
        };
        let values = match params {
            Value::Null => Map::new(),
            Value::Object(map) => map,
            other => {
                return Err(invalid("(parameters)", format!("must be an object, not {}", type_name(&other))));
            }
        };
        // A schema that declares no properties (some WASM plugins' manifests) takes any object.
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
            return Ok(Self { action: action.to_owned(), values });
        };
        for (name, value) in &values {
            let Some(property) = properties.get(name) else {
                let known = properties.keys().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(", ");
                return Err(invalid(name, format!("is not a parameter of {action}; known: {known}")));
            };
            check_type(property, value).map_err(|problem| invalid(name, problem))?;
        }
        let required = schema.get("required").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        for name in required.iter().filter_map(Value::as_str) {
            if !values.contains_key(name) {
                return Err(invalid(name, "is required".to_owned()));
            }
        }
        Ok(Self { action: action.to_owned(), values })
    }

    /// The validated parameters as a JSON object, for plugins that take them as JSON (WASM).
    pub(crate) fn into_value(self) -> Value {
        Value::Object(self.values)
    }

    pub(crate) fn action(&self) -> &str {
        &self.action
    }

    pub(crate) fn invalid(&self, parameter: &str, problem: impl Into<String>) -> ActionError {
        ActionError::InvalidParameter { action: self.action.clone(), parameter: parameter.to_owned(), problem: problem.into() }
    }

    pub(crate) fn failed(&self, message: impl Into<String>) -> ActionError {
        ActionError::Failed { action: self.action.clone(), message: message.into() }
    }

    pub(crate) fn str(&self, name: &str) -> Option<&str> {
        self.values.get(name).and_then(Value::as_str)
    }

    /// A required string; validation already checked presence, this guards against a manifest
    /// that does not list it as required.
    pub(crate) fn required_str(&self, name: &str) -> Result<&str, ActionError> {
        self.str(name).ok_or_else(|| self.invalid(name, "is required"))
    }

    pub(crate) fn bool_or(&self, name: &str, default: bool) -> bool {
        self.values.get(name).and_then(Value::as_bool).unwrap_or(default)
    }

    /// An integer in `min..=max`, or `default` when absent.
    pub(crate) fn int_in(&self, name: &str, default: u64, min: u64, max: u64) -> Result<u64, ActionError> {
        let Some(value) = self.values.get(name) else {
            return Ok(default);
        };
        match value.as_i64() {
            Some(n) if n >= 0 && (n as u64) >= min && (n as u64) <= max => Ok(n as u64),
            _ => Err(self.invalid(name, format!("must be between {min} and {max}, not {value}"))),
        }
    }

    pub(crate) fn strings(&self, name: &str) -> Vec<&str> {
        self.values.get(name).and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
    }
}

fn check_type(property: &Value, value: &Value) -> Result<(), String> {
    let Some(expected) = property.get("type").and_then(Value::as_str) else {
        return Ok(());
    };
    let ok = match expected {
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => {
            let Some(items) = value.as_array() else {
                return Err(format!("must be an array, not {}", type_name(value)));
            };
            if let Some(item_schema) = property.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_type(item_schema, item).map_err(|problem| format!("item {i} {problem}"))?;
                }
            }
            true
        }
        _ => true,
    };
    if ok { Ok(()) } else { Err(format!("must be {} {expected}, not {}", article(expected), type_name(value))) }
}

fn article(type_name: &str) -> &'static str {
    if type_name.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": { "type": "string" },
                "count": { "type": "integer" },
                "flag": { "type": "boolean" },
                "paths": { "type": "array", "items": { "type": "string" } }
            },
            "required": ["path"]
        })
    }

    fn problem(params: Value) -> (String, String) {
        match Params::validate("p.a", &schema(), params) {
            Err(ActionError::InvalidParameter { action, parameter, problem }) => {
                assert_eq!(action, "p.a");
                (parameter, problem)
            }
            other => panic!("expected InvalidParameter, got {other:?}"),
        }
    }

    #[test]
    fn accepts_valid_parameters() {
        let p = Params::validate("p.a", &schema(), json!({"path": "x", "count": 3, "flag": true, "paths": ["a", "b"]})).expect("valid");
        assert_eq!(p.str("path"), Some("x"));
        assert_eq!(p.int_in("count", 10, 1, 5), Ok(3));
        assert!(p.bool_or("flag", false));
        assert_eq!(p.strings("paths"), ["a", "b"]);
    }

    #[test]
    fn rejects_each_kind_of_bad_parameter() {
        assert_eq!(problem(json!({})), ("path".into(), "is required".into()));
        assert_eq!(problem(Value::Null), ("path".into(), "is required".into()));
        assert_eq!(problem(json!({"path": 1})), ("path".into(), "must be a string, not an integer".into()));
        assert_eq!(problem(json!({"path": "x", "count": "3"})), ("count".into(), "must be an integer, not a string".into()));
        assert_eq!(problem(json!({"path": "x", "count": 1.5})), ("count".into(), "must be an integer, not a number".into()));
        assert_eq!(problem(json!({"path": "x", "flag": "yes"})), ("flag".into(), "must be a boolean, not a string".into()));
        assert_eq!(problem(json!({"path": "x", "paths": "a"})), ("paths".into(), "must be an array, not a string".into()));
        assert_eq!(problem(json!({"path": "x", "paths": ["a", 2]})), ("paths".into(), "item 1 must be a string, not an integer".into()));
        assert_eq!(
            problem(json!({"path": "x", "colour": "red"})),
            ("colour".into(), "is not a parameter of p.a; known: \"count\", \"flag\", \"path\", \"paths\"".into())
        );
        assert_eq!(problem(json!(["x"])), ("(parameters)".into(), "must be an object, not an array".into()));
    }

    #[test]
    fn integer_range_is_checked() {
        let p = Params::validate("p.a", &schema(), json!({"path": "x", "count": -1})).expect("valid types");
        let err = p.int_in("count", 10, 1, 100).expect_err("out of range");
        assert_eq!(err.to_string(), "p.a: parameter \"count\" must be between 1 and 100, not -1");
    }
}
