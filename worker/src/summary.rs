//! The one-line summary that goes with a structured tool result as its text, for clients at
//! 2026-07-28, which read `structuredContent`: the size of each list and the identifying fields,
//! e.g. `list_jobs: 12 jobs` or `get_run: id 0193…, status running`.
//!
//! It reads the top level of any `Serialize` value through serde, so the typed result
//! (answered directly, `direct.rs`) and the `Value` rmcp carries (every other answer) give the
//! same line: fields in name order, as a `Value`'s map holds them, at most six.

use std::fmt::Display;

use serde::Serialize;
use serde::ser::{self, Impossible};

/// Fields worth naming in a summary.
const FIELDS: [&str; 9] = ["name", "job", "run_id", "id", "status", "paused", "decision", "step", "next_cursor"];

/// A short human summary of `result`, the answer of `tool`.
pub(crate) fn summary(tool: &str, result: &impl Serialize) -> String {
    let mut top = Top::default();
    if result.serialize(&mut top).is_err() || top.parts.is_empty() {
        return format!("{tool}: done");
    }
    top.parts.sort_by(|a, b| a.0.cmp(&b.0));
    let parts: Vec<String> = top.parts.into_iter().take(6).map(|(_, part)| part).collect();
    format!("{tool}: {}", parts.join(", "))
}

/// What a field's value is, as far as the summary cares.
enum Kind {
    List(usize),
    Text(String),
    Scalar(String),
    Other,
}

/// The summary's part for field `key`, if it has one.
fn part(key: &str, kind: Kind) -> Option<String> {
    match kind {
        Kind::List(n) => Some(format!("{n} {key}")),
        Kind::Text(s) | Kind::Scalar(s) if FIELDS.contains(&key) => Some(format!("{key} {s}")),
        _ => None,
    }
}

/// Anything but an object at the top level: the summary is just "done".
#[derive(Debug)]
struct NotAnObject;

impl Display for NotAnObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not an object")
    }
}

impl std::error::Error for NotAnObject {}

impl ser::Error for NotAnObject {
    fn custom<T: Display>(_: T) -> Self {
        NotAnObject
    }
}

/// Reads the top-level object: a struct, a map (a `Value`'s object, or a struct with a
/// flattened field), or either behind a newtype or `Some`.
#[derive(Default)]
struct Top {
    parts: Vec<(String, String)>,
    key: Option<String>,
}

impl Top {
    fn field(&mut self, key: &str, value: &(impl Serialize + ?Sized)) {
        if let Ok(kind) = value.serialize(KindOf)
            && let Some(p) = part(key, kind)
        {
            self.parts.push((key.to_string(), p));
        }
    }
}

macro_rules! refuse {
    ($($f:ident($($t:ty),*)),* $(,)?) => {
        $(fn $f(self, $(_: $t),*) -> Result<Self::Ok, Self::Error> { Err(NotAnObject) })*
    };
}

/// Numbers and booleans, as their text.
macro_rules! scalar {
    ($($f:ident($t:ty)),* $(,)?) => {
        $(fn $f(self, v: $t) -> Result<Kind, NotAnObject> { Ok(Kind::Scalar(v.to_string())) })*
    };
}

macro_rules! refuse_compound {
    ($($f:ident($($t:ty),*) -> $out:ident),* $(,)?) => {
        $(fn $f(self, $(_: $t),*) -> Result<Self::$out, Self::Error> { Err(NotAnObject) })*
    };
}

impl ser::Serializer for &mut Top {
    type Ok = ();
    type Error = NotAnObject;
    type SerializeSeq = Impossible<(), NotAnObject>;
    type SerializeTuple = Impossible<(), NotAnObject>;
    type SerializeTupleStruct = Impossible<(), NotAnObject>;
    type SerializeTupleVariant = Impossible<(), NotAnObject>;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Impossible<(), NotAnObject>;

    refuse!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    );

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), NotAnObject> {
        value.serialize(self)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), NotAnObject> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(self, _: &'static str, _: u32, _: &'static str, _: &T) -> Result<(), NotAnObject> {
        Err(NotAnObject)
    }
    refuse_compound!(
        serialize_seq(Option<usize>) -> SerializeSeq,
        serialize_tuple(usize) -> SerializeTuple,
        serialize_tuple_struct(&'static str, usize) -> SerializeTupleStruct,
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> SerializeTupleVariant,
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> SerializeStructVariant,
    );
    fn serialize_map(self, _: Option<usize>) -> Result<Self, NotAnObject> {
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, NotAnObject> {
        Ok(self)
    }
}

impl ser::SerializeStruct for &mut Top {
    type Ok = ();
    type Error = NotAnObject;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), NotAnObject> {
        self.field(key, value);
        Ok(())
    }
    fn end(self) -> Result<(), NotAnObject> {
        Ok(())
    }
}

impl ser::SerializeMap for &mut Top {
    type Ok = ();
    type Error = NotAnObject;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), NotAnObject> {
        // A `Value`'s keys are strings, and so are a struct's field names; a key is small, so
        // serde_json's own `Value` serializer reads it.
        match serde_json::to_value(key) {
            Ok(serde_json::Value::String(k)) => self.key = Some(k),
            _ => return Err(NotAnObject),
        }
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotAnObject> {
        let key = self.key.take().ok_or(NotAnObject)?;
        self.field(&key, value);
        Ok(())
    }
    fn end(self) -> Result<(), NotAnObject> {
        Ok(())
    }
}

/// A field's [`Kind`], as `serde_json` would write it: a list counts its items (without
/// looking at them), an enum's unit variant is its name, `null` and objects are `Other`.
struct KindOf;

/// Counts a list's items.
struct Count(usize);

/// Passes over an object.
struct Skip;

impl ser::Serializer for KindOf {
    type Ok = Kind;
    type Error = NotAnObject;
    type SerializeSeq = Count;
    type SerializeTuple = Count;
    type SerializeTupleStruct = Count;
    type SerializeTupleVariant = Skip;
    type SerializeMap = Skip;
    type SerializeStruct = Skip;
    type SerializeStructVariant = Skip;

    scalar!(serialize_bool(bool), serialize_i8(i8), serialize_i16(i16), serialize_i32(i32), serialize_i64(i64));
    scalar!(serialize_u8(u8), serialize_u16(u16), serialize_u32(u32), serialize_u64(u64));
    fn serialize_f32(self, v: f32) -> Result<Kind, NotAnObject> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<Kind, NotAnObject> {
        // As a `Value` holds it: a finite number, or `null`.
        Ok(serde_json::Number::from_f64(v).map_or(Kind::Other, |n| Kind::Scalar(n.to_string())))
    }
    fn serialize_char(self, v: char) -> Result<Kind, NotAnObject> {
        Ok(Kind::Text(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<Kind, NotAnObject> {
        Ok(Kind::Text(v.to_string()))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Kind, NotAnObject> {
        Ok(Kind::List(v.len()))
    }
    fn serialize_none(self) -> Result<Kind, NotAnObject> {
        Ok(Kind::Other)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Kind, NotAnObject> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Kind, NotAnObject> {
        Ok(Kind::Other)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Kind, NotAnObject> {
        Ok(Kind::Other)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<Kind, NotAnObject> {
        Ok(Kind::Text(variant.to_string()))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<Kind, NotAnObject> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Kind, NotAnObject> {
        Ok(Kind::Other)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Count, NotAnObject> {
        Ok(Count(0))
    }
    fn serialize_tuple(self, _: usize) -> Result<Count, NotAnObject> {
        Ok(Count(0))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Count, NotAnObject> {
        Ok(Count(0))
    }
    fn serialize_tuple_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Skip, NotAnObject> {
        Ok(Skip)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Skip, NotAnObject> {
        Ok(Skip)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Skip, NotAnObject> {
        Ok(Skip)
    }
    fn serialize_struct_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Skip, NotAnObject> {
        Ok(Skip)
    }
}

macro_rules! count {
    ($($trait:ident::$f:ident),*) => {
        $(impl ser::$trait for Count {
            type Ok = Kind;
            type Error = NotAnObject;
            fn $f<T: Serialize + ?Sized>(&mut self, _: &T) -> Result<(), NotAnObject> {
                self.0 += 1;
                Ok(())
            }
            fn end(self) -> Result<Kind, NotAnObject> {
                Ok(Kind::List(self.0))
            }
        })*
    };
}
count!(SerializeSeq::serialize_element, SerializeTuple::serialize_element, SerializeTupleStruct::serialize_field);

impl ser::SerializeTupleVariant for Skip {
    type Ok = Kind;
    type Error = NotAnObject;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &T) -> Result<(), NotAnObject> {
        Ok(())
    }
    fn end(self) -> Result<Kind, NotAnObject> {
        Ok(Kind::Other)
    }
}

impl ser::SerializeMap for Skip {
    type Ok = Kind;
    type Error = NotAnObject;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, _: &T) -> Result<(), NotAnObject> {
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, _: &T) -> Result<(), NotAnObject> {
        Ok(())
    }
    fn end(self) -> Result<Kind, NotAnObject> {
        Ok(Kind::Other)
    }
}

macro_rules! skip_fields {
    ($($trait:ident),*) => {
        $(impl ser::$trait for Skip {
            type Ok = Kind;
            type Error = NotAnObject;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, _: &T) -> Result<(), NotAnObject> {
                Ok(())
            }
            fn end(self) -> Result<Kind, NotAnObject> {
                Ok(Kind::Other)
            }
        })*
    };
}
skip_fields!(SerializeStruct, SerializeStructVariant);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Status {
        Running,
    }

    #[derive(Serialize)]
    struct Inner {
        name: &'static str,
        paused: bool,
    }

    #[derive(Serialize)]
    struct Detail {
        #[serde(flatten)]
        inner: Inner,
        status: Status,
        runs: Vec<u8>,
        counts: std::collections::BTreeMap<String, u64>,
        id: Option<String>,
        next_cursor: Option<String>,
        ratio: f64,
    }

    #[test]
    fn a_typed_result_and_its_value_give_the_same_line() {
        let detail = Detail {
            inner: Inner { name: "nightly", paused: false },
            status: Status::Running,
            runs: vec![1, 2, 3],
            counts: [("ok".to_string(), 2)].into(),
            id: None,
            next_cursor: Some("b".into()),
            ratio: 0.5,
        };
        let typed = summary("get_job", &detail);
        assert_eq!(typed, "get_job: name nightly, next_cursor b, paused false, 3 runs, status running");
        assert_eq!(summary("get_job", &serde_json::to_value(&detail).expect("value")), typed);
    }

    #[test]
    fn lists_are_counted_and_at_most_six_parts_are_named() {
        let v = json!({"a": [], "b": [1], "c": [1, 2], "d": [], "e": [], "f": [], "g": [], "name": "x"});
        assert_eq!(summary("t", &v), "t: 0 a, 1 b, 2 c, 0 d, 0 e, 0 f");
    }

    #[test]
    fn anything_but_an_object_or_an_object_without_such_fields_is_done() {
        assert_eq!(summary("t", &json!([1, 2])), "t: done");
        assert_eq!(summary("t", &json!("text")), "t: done");
        assert_eq!(summary("t", &json!({"other": "x", "nested": {"name": "n"}, "status": null})), "t: done");
    }
}
