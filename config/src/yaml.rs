//! The one place that parses YAML. Values come from `serde_yaml`; source positions come from
//! `yaml-rust2`'s event parser, because `serde_yaml::Value` keeps none. Switching to
//! `serde_yaml_ng` is a change to this file only.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

pub(crate) use serde_yaml::Mapping;
pub(crate) use serde_yaml::Value;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// One step into a YAML document.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// A path from the document root, e.g. `scheduling.jobs.nightly.cron`.
pub type YamlPath = Vec<Seg>;

pub(crate) fn path_string(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// Where each key (and sequence item) of a document starts: (line, col), 1-based.
///
/// Keyed by a 64-bit hash of the path, built one segment at a time, not by the path itself: a
/// config with ten thousand jobs has some hundred thousand keys, and their paths would cost
/// more memory than the rest of the config. Two paths of one document sharing a hash (odds of
/// about 10⁻¹⁰ for such a file) would only misplace an error's position.
#[derive(Debug, Default, Clone)]
pub(crate) struct PositionIndex {
    map: HashMap<u64, (usize, usize)>,
}

/// The hash of the empty path.
const ROOT: u64 = 0;

/// The hash of `parent`'s path extended by `seg`.
fn child(parent: u64, seg: &Seg) -> u64 {
    match seg {
        Seg::Key(k) => key_child(parent, k),
        Seg::Index(i) => index_child(parent, *i),
    }
}

/// [`child`] for a key, without building a [`Seg`] (the parser sees every key of the file).
fn key_child(parent: u64, key: &str) -> u64 {
    let mut h = DefaultHasher::new();
    (parent, 0u8, key).hash(&mut h);
    h.finish()
}

fn index_child(parent: u64, index: usize) -> u64 {
    let mut h = DefaultHasher::new();
    (parent, 1u8, index).hash(&mut h);
    h.finish()
}

impl PositionIndex {
    /// The position of `path`, or of its closest ancestor that has one.
    pub(crate) fn find(&self, path: &[Seg]) -> Option<(usize, usize)> {
        let mut prefixes = Vec::with_capacity(path.len() + 1);
        prefixes.push(ROOT);
        for seg in path {
            prefixes.push(child(*prefixes.last().unwrap_or(&ROOT), seg));
        }
        prefixes.iter().rev().find_map(|h| self.map.get(h).copied())
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, path: &[Seg]) -> bool {
        self.map.contains_key(&path.iter().fold(ROOT, child))
    }
}

/// A YAML parse error with its 1-based position.
#[derive(Debug)]
pub(crate) struct ParseError {
    pub(crate) line: usize,
    pub(crate) col: usize,
    pub(crate) message: String,
}

/// Parses one document into a value and the positions of its keys.
pub(crate) fn parse(text: &str) -> Result<(Value, PositionIndex), ParseError> {
    let value: Value = match serde_yaml::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let (line, col) = e.location().map(|l| (l.line(), l.column())).unwrap_or((1, 1));
            return Err(ParseError { line, col, message: e.to_string() });
        }
    };
    let mut rec = Recorder::default();
    let mut parser = Parser::new_from_str(text);
    // serde_yaml accepted the text, so yaml-rust2 failing here would only cost positions.
    let _ = parser.load(&mut rec, false);
    Ok((value, PositionIndex { map: rec.map }))
}

/// Builds the position index from parser events.
#[derive(Default)]
struct Recorder {
    map: HashMap<u64, (usize, usize)>,
    stack: Vec<Frame>,
    /// The hash of each path prefix, one per open node.
    path: Vec<u64>,
}

impl Recorder {
    fn top(&self) -> u64 {
        self.path.last().copied().unwrap_or(ROOT)
    }
}

enum Frame {
    /// In a mapping; `Some(hash of the key's path)` once the key of the current pair was read.
    Map {
        key: Option<u64>,
    },
    Seq {
        next: usize,
    },
}

impl Recorder {
    /// Called before a node (scalar or collection start) is consumed: decides what path the
    /// node lives at. Returns false when the node is a mapping key.
    fn enter_node(&mut self, mark: Marker, scalar: Option<&str>) -> bool {
        let top = self.top();
        match self.stack.last_mut() {
            Some(Frame::Map { key }) => {
                if key.is_none() {
                    // This node is a key.
                    let h = key_child(top, scalar.unwrap_or(""));
                    self.map.entry(h).or_insert((mark.line(), mark.col() + 1));
                    *key = Some(h);
                    return false;
                }
                let h = key.take().unwrap_or(ROOT);
                self.path.push(h);
                true
            }
            Some(Frame::Seq { next }) => {
                let i = *next;
                *next += 1;
                let h = index_child(top, i);
                self.path.push(h);
                self.map.entry(h).or_insert((mark.line(), mark.col() + 1));
                true
            }
            None => true,
        }
    }

    fn leave_node(&mut self) {
        if !self.stack.is_empty() {
            self.path.pop();
        }
    }
}

impl MarkedEventReceiver for Recorder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(ref s, ..) if self.enter_node(mark, Some(s)) => {
                self.leave_node();
            }
            Event::Alias(_) if self.enter_node(mark, None) => {
                self.leave_node();
            }
            Event::MappingStart(..) => {
                let pushed = self.enter_node(mark, None);
                self.stack.push(Frame::Map { key: None });
                let _ = pushed;
            }
            Event::SequenceStart(..) => {
                self.enter_node(mark, None);
                self.stack.push(Frame::Seq { next: 0 });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
                self.leave_node();
            }
            _ => {}
        }
    }
}

/// Splits Markdown with YAML front matter into (front matter, body).
pub fn split_front_matter(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n"))?;
    let end = rest.find("\n---")?;
    let front = &rest[..end + 1];
    let after = &rest[end + 4..];
    let body = after.strip_prefix('\n').or_else(|| after.strip_prefix("\r\n")).unwrap_or(after);
    Some((front, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(path: &str) -> YamlPath {
        path.split('.').map(|k| Seg::Key(k.to_string())).collect()
    }

    #[test]
    fn positions_of_keys_and_items() {
        let text = "a:\n  b: 1\n  c:\n    - x: 1\n      y: >\n        folded: not a key\n    - 2\nd: [1, 2]\n";
        let (_, idx) = parse(text).unwrap();
        assert_eq!(idx.find(&key("a")), Some((1, 1)));
        assert_eq!(idx.find(&key("a.b")), Some((2, 3)));
        let mut p = key("a.c");
        p.push(Seg::Index(0));
        p.push(Seg::Key("y".into()));
        assert_eq!(idx.find(&p), Some((5, 7)));
        assert_eq!(idx.find(&key("d")), Some((8, 1)));
        assert!(!idx.contains(&key("a.c.folded")));
    }

    #[test]
    fn parse_error_has_position() {
        let err = parse("a:\n  b: [1, 2\n").unwrap_err();
        assert!(err.line >= 2, "{err:?}");
    }

    #[test]
    fn front_matter() {
        let (fm, body) = split_front_matter("---\nname: x\n---\nYou are x.\n").unwrap();
        assert_eq!(fm, "name: x\n");
        assert_eq!(body, "You are x.\n");
        assert!(split_front_matter("no front matter").is_none());
    }
}
