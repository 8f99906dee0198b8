//! The one place that parses YAML: one pass of `yaml-rust2`'s event parser builds the value
//! (a `serde_yaml::Value`, resolved by `serde_yaml`'s own rules) and the positions of its keys
//! together (every key's, or a large file's shallow ones: [`Keep`]). `serde_yaml` itself would
//! first buffer every event of the document (two and a half kilobytes a job) and keep no
//! positions; parsing once keeps the loader's peak small.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

pub(crate) use serde_yaml::Mapping;
pub(crate) use serde_yaml::Value;

use serde_yaml::value::{Tag, TaggedValue};
use yaml_rust2::parser::{Event, Parser, Tag as YamlTag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

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
///
/// A large file keeps only its shallow positions ([`Keep::Shallow`]): the sections, their
/// items, and the items' own keys are where most errors of a large file are found from, and
/// the positions of a million jobs' fields would cost the loader seconds and the worker a
/// hundred megabytes it never reads. A path deeper than that is found by parsing the file
/// again for every position, without its value ([`every_position`]; the loader does, when an
/// error needs it).
#[derive(Debug, Default, Clone)]
pub(crate) struct PositionIndex {
    map: Positions,
    /// The depth of the deepest paths kept; `None`: every path.
    depth: Option<usize>,
}

/// Which positions a parse keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Every key's and item's.
    Every,
    /// Only of the paths of up to [`SHALLOW_DEPTH`] steps (`scheduling.jobs.<name>`).
    Shallow,
}

/// How deep [`Keep::Shallow`] keeps positions: the items of a section's collection.
const SHALLOW_DEPTH: usize = 3;

/// Path hash → (line, col). The keys are hashes already: the map does not hash them again.
type Positions = HashMap<u64, (u32, u32), BuildHasherDefault<PathHash>>;

/// The identity "hasher" of [`Positions`].
#[derive(Default)]
struct PathHash(u64);

impl Hasher for PathHash {
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are u64); anything else is folded in.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A position as stored: lines and columns past 4 billion are clamped.
fn pos(line: usize, col: usize) -> (u32, u32) {
    (u32::try_from(line).unwrap_or(u32::MAX), u32::try_from(col).unwrap_or(u32::MAX))
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
///
/// Not SipHash: these hashes are of the file's own text, kept in memory only, and a large
/// config hashes every key of it on the loader's critical path. Eight bytes at a time, each
/// step multiplied in, and a final mix so that the map's low bits depend on every byte.
fn key_child(parent: u64, key: &str) -> u64 {
    let mut h = step(parent, KEY);
    let mut chunks = key.as_bytes().chunks_exact(8);
    for c in &mut chunks {
        h = step(h, u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]));
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = step(h, u64::from_le_bytes(last));
    avalanche(step(h, key.len() as u64))
}

fn index_child(parent: u64, index: usize) -> u64 {
    avalanche(step(step(parent, INDEX), index as u64))
}

/// What a step down is (nonzero: no child's hash is its parent's, the root's included).
const KEY: u64 = 0x9e37_79b9_7f4a_7c15;
const INDEX: u64 = 0xc2b2_ae3d_27d4_eb4f;

/// One step of the path hash (FxHash's).
fn step(h: u64, word: u64) -> u64 {
    (h.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95)
}

/// MurmurHash3's 64-bit finalizer.
fn avalanche(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

impl PositionIndex {
    /// The position of `path`, or of its closest ancestor that has one.
    pub(crate) fn find(&self, path: &[Seg]) -> Option<(usize, usize)> {
        let mut prefixes = Vec::with_capacity(path.len() + 1);
        prefixes.push(ROOT);
        for seg in path {
            prefixes.push(child(*prefixes.last().unwrap_or(&ROOT), seg));
        }
        prefixes.iter().rev().find_map(|h| self.map.get(h)).map(|&(line, col)| (line as usize, col as usize))
    }

    /// Whether `path` is no deeper than the paths this index keeps positions of: if it has
    /// none, the file has none for it either (else only an ancestor's is here).
    pub(crate) fn reaches(&self, path: &[Seg]) -> bool {
        self.depth.is_none_or(|depth| path.len() <= depth)
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

/// Every position of a document that parsed before, without building its value (a large file
/// parsed again for an error's position: the value would cost as much as the first parse's).
pub(crate) fn every_position(text: &str) -> Option<PositionIndex> {
    let text = without_bom(text);
    let mut b = Builder::for_text(text, None, false);
    let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| build(text, &mut b)));
    matches!(ended, Ok(Some(Ok(true)))).then_some(PositionIndex { map: b.map, depth: None })
}

/// A byte order mark is not content (libyaml skips it; yaml-rust2 would read it into the first
/// key).
fn without_bom(text: &str) -> &str {
    text.strip_prefix('\u{FEFF}').unwrap_or(text)
}

/// Parses `text` into `b`: how the stream ended (`Ok(true)`: at its end), `None` if the parser
/// stopped before it. The scanner and parser of a large text (`pipeline`) run on a thread of
/// their own and hand their events over in batches, while this thread builds: the two halves
/// of the work take about the same time, so a large config is read in about half of it. A
/// builder that stops early (an error) stops the parser.
fn build(text: &str, b: &mut Builder) -> Option<Result<bool, Refusal>> {
    let mut outcome = None;
    crate::pipeline::pipelined(
        text.len() >= PARSE_ON_A_THREAD_FROM,
        |send| parse_events(text, send),
        |parsed| match feed(b, parsed) {
            Ok(false) => true,
            ended => {
                outcome = Some(ended);
                false
            }
        },
    );
    outcome
}

/// Parses one document into a value and the positions of its keys (those `keep` says).
pub(crate) fn parse(text: &str, keep: Keep) -> Result<(Value, PositionIndex), ParseError> {
    // yaml-rust2 asserts its own invariants; a failed one on some input is a bug of the
    // parser, reported as this file's error rather than taking the worker down.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse_unguarded(text, keep))).unwrap_or_else(|panic| {
        Err(ParseError { line: 1, col: 1, message: format!("the YAML parser failed on this file: {}", panic_message(&*panic)) })
    })
}

fn parse_unguarded(text: &str, keep: Keep) -> Result<(Value, PositionIndex), ParseError> {
    let text = without_bom(text);
    refuse_control_characters(text)?;
    let depth = match keep {
        Keep::Every => None,
        Keep::Shallow => Some(SHALLOW_DEPTH),
    };
    let mut b = Builder::for_text(text, depth, true);
    match build(text, &mut b) {
        Some(Ok(_)) => {}
        Some(Err(Refusal::TakenBefore(e))) => return parse_as_before(text, e),
        Some(Err(Refusal::Error(e))) => return Err(e),
        // The parser ends every stream with `StreamEnd`, a refusal or a failure: not reached.
        None => return Err(ParseError { line: 1, col: 1, message: "the YAML parser stopped before the end of the file".into() }),
    }
    let mut root = b.root.unwrap_or(Value::Null);
    // A block scalar (`|`, `>`) whose last line of content ends the file without a line break
    // has no final line break; yaml-rust2 adds one. (A comment, a blank line or `...` after
    // the scalar is not its content: there the line break is the scalar's.)
    let last_line = text.rsplit(['\n', '\r']).next().unwrap_or(text).trim_start();
    if b.last_was_block
        && !last_line.is_empty()
        && let Some(Value::String(s)) = last_leaf(&mut root)
        && s.strip_suffix('\n').is_some_and(|content| content.ends_with(last_line))
    {
        s.pop();
    }
    Ok((root, PositionIndex { map: b.map, depth }))
}

/// What the parser thread hands over.
enum Parsed {
    /// The next events, in order.
    Events(Vec<(Event, Marker)>),
    /// The parser refused the text here (after the events before it).
    Refused(yaml_rust2::ScanError),
    /// yaml-rust2 failed one of its own assertions: a bug of the parser, this file's error.
    Panicked(String),
}

/// How events go over: enough to make the hand-over's cost small, few enough to keep little
/// of the document in flight.
const EVENTS_PER_BATCH: usize = 4096;

/// From this size on, a text is parsed on a thread of its own (see [`parse_unguarded`]).
const PARSE_ON_A_THREAD_FROM: usize = 64 * 1024;

/// Builds on with one hand-over: true once the stream has ended.
fn feed(b: &mut Builder, parsed: Parsed) -> Result<bool, Refusal> {
    match parsed {
        Parsed::Events(events) => {
            for (event, mark) in events {
                if b.on_event(event, mark)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Parsed::Refused(e) if e.info() == LIBYAML_TAKES_THIS => Err(Refusal::TakenBefore(e)),
        Parsed::Refused(e) => Err(ParseError::at(*e.marker(), e.info()).into()),
        Parsed::Panicked(why) => Err(ParseError { line: 1, col: 1, message: format!("the YAML parser failed on this file: {why}") }.into()),
    }
}

/// Parses `text` and hands its events to `send` in batches, then the refusal or the parser's
/// failure if there is one; stops early when `send` says no one listens any more. The events
/// parsed before a failure are handed over first: an error the builder finds in them is the
/// file's error, as when nothing failed after it.
fn parse_events(text: &str, send: &mut dyn FnMut(Parsed) -> bool) {
    let mut batch = Vec::with_capacity(EVENTS_PER_BATCH);
    let mut parser = Parser::new_from_str(text);
    let parsed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        loop {
            match parser.next_token() {
                Ok((event, mark)) => {
                    let end = matches!(event, Event::StreamEnd);
                    batch.push((event, mark));
                    if end {
                        return send(Parsed::Events(std::mem::take(&mut batch)));
                    }
                    if batch.len() == EVENTS_PER_BATCH
                        && !send(Parsed::Events(std::mem::replace(&mut batch, Vec::with_capacity(EVENTS_PER_BATCH))))
                    {
                        return false;
                    }
                }
                Err(e) => return send(Parsed::Events(std::mem::take(&mut batch))) && send(Parsed::Refused(e)),
            }
        }
    }));
    if let Err(panic) = parsed {
        let _ = send(Parsed::Events(batch)) && send(Parsed::Panicked(panic_message(&*panic).to_owned()));
    }
}

/// What a panic said, when it said it in text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str)).unwrap_or_default()
}

/// Why the builder stopped short.
enum Refusal {
    /// A refusal of yaml-rust2's that libyaml took: read the file as before.
    TakenBefore(yaml_rust2::ScanError),
    Error(ParseError),
}

impl From<ParseError> for Refusal {
    fn from(e: ParseError) -> Self {
        Refusal::Error(e)
    }
}

/// The one input found that libyaml (serde_yaml's parser, which read configs before) takes
/// and yaml-rust2 refuses: a quoted scalar continued on a line indented less than its key.
const LIBYAML_TAKES_THIS: &str = "invalid indentation in quoted scalar";

/// Such a file is read as before, by serde_yaml, so that a config that loaded keeps loading;
/// it has no key positions (its errors point at its first line).
fn parse_as_before(text: &str, refused: yaml_rust2::ScanError) -> Result<(Value, PositionIndex), ParseError> {
    match serde_yaml::from_str::<Value>(text) {
        Ok(value) => Ok((value, PositionIndex::default())),
        Err(_) => Err(ParseError::at(*refused.marker(), refused.info())),
    }
}

/// The node parsed last: the last item or value, all the way down.
fn last_leaf(v: &mut Value) -> Option<&mut Value> {
    match v {
        Value::Mapping(m) => last_leaf(m.values_mut().last()?),
        Value::Sequence(items) => last_leaf(items.last_mut()?),
        Value::Tagged(t) => last_leaf(&mut t.value),
        leaf => Some(leaf),
    }
}

/// YAML's printable characters only (as libyaml, which `serde_yaml` wraps): tab, line breaks
/// and the printable ranges of Unicode.
///
/// A config is mostly printable ASCII: sixteen bytes at a time are checked for that without a
/// branch a byte (a million jobs' 190 MB in some 30 ms rather than 400 by the characters), and
/// only a block holding anything else is looked at character by character.
fn refuse_control_characters(text: &str) -> Result<(), ParseError> {
    let Some((at, c)) = first_unprintable(text) else {
        return Ok(());
    };
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(before, |n| &before[n + 1..]).chars().count() + 1;
    Err(ParseError { line, col, message: format!("control characters are not allowed (U+{:04X})", u32::from(c)) })
}

/// The first character that is not YAML's printable, and where it is.
fn first_unprintable(text: &str) -> Option<(usize, char)> {
    let printable = |c: char| matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{7E}' | '\u{85}' | '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..);
    const BLOCK: usize = 16;
    let bytes = text.as_bytes();
    // Always a character's start: a plain block ends after an ASCII byte, and the characters
    // of any other are read whole.
    let mut at = 0;
    while at < bytes.len() {
        let end = (at + BLOCK).min(bytes.len());
        // `&` and `|`, not `&&` and `||`: no branch a byte, so that the block is vectorized.
        if bytes[at..end].iter().fold(true, |all, &b| all & ((b' '..=b'~').contains(&b) | (b == b'\n'))) {
            at = end;
            continue;
        }
        for c in text[at..].chars() {
            if !printable(c) {
                return Some((at, c));
            }
            at += c.len_utf8();
            if at >= end {
                break;
            }
        }
    }
    None
}

/// How deep collections may nest (as `serde_yaml`): deeper input is refused, not recursed into.
const MAX_DEPTH: usize = 128;

/// How many aliases may be followed, counting those inside what an alias copies, beyond a
/// hundred per node read so far (as `serde_yaml`'s repetition limit, which counts a hundred
/// per event of the document): a "billion laughs" document is refused, not expanded.
const ALIAS_ALLOWANCE: usize = 10_000;
const ALIASES_PER_NODE: usize = 100;
/// And how many nodes aliases may copy in all, whatever the text's size.
const MAX_COPIED: usize = 10_000_000;

/// A node's size: its nodes, its height (0 for a scalar), and the aliases it followed.
#[derive(Debug, Clone, Copy, Default)]
struct Size {
    nodes: usize,
    height: usize,
    aliases: usize,
}

impl ParseError {
    fn at(mark: Marker, message: impl Into<String>) -> Self {
        ParseError { line: mark.line(), col: mark.col() + 1, message: message.into() }
    }
}

/// Builds the value and the position index from parser events.
#[derive(Default)]
struct Builder {
    map: Positions,
    /// Positions are kept of paths up to this many steps.
    keep_depth: usize,
    /// Whether the value is built (else only the positions, each node a null left out of
    /// its parent).
    values: bool,
    open: Vec<Open>,
    /// Anchored values and their sizes.
    anchors: HashMap<usize, (Value, Size)>,
    root: Option<Value>,
    documents: usize,
    /// Nodes read, aliases followed (those inside what they copy included), nodes copied.
    nodes: usize,
    aliases: usize,
    copied: usize,
    /// The last node was a block scalar (`|`, `>`).
    last_was_block: bool,
}

/// A collection being built, with the hash of its path.
struct Open {
    path: u64,
    anchor: usize,
    tag: Option<String>,
    /// What is inside it so far: nodes (itself included), the greatest height, aliases.
    inside: Size,
    kind: OpenKind,
}

enum OpenKind {
    Seq(Vec<Value>),
    /// A mapping, and the key read for the pair in progress: its value, its path, where it was.
    Map(Mapping, Option<(Value, u64, Marker)>),
}

/// What a node is to its parent.
enum Place {
    Root,
    /// A mapping key, with the path of the value it names.
    Key(u64),
    /// A value at this path.
    At(u64),
}

impl Builder {
    /// A builder for `text`, keeping positions down to `depth` (`None`: all), building the
    /// value or not.
    fn for_text(text: &str, depth: Option<usize>, values: bool) -> Self {
        let mut b = Builder { keep_depth: depth.unwrap_or(usize::MAX), values, ..Builder::default() };
        // Every position: about one for every 20 bytes of a large config (a million jobs: 9.6
        // million in 190 MB); the map is sized once rather than doubled and copied along the
        // way. The shallow ones: about one a job, some two hundred bytes.
        b.map.reserve(if depth.is_none() { text.len() / 20 } else { text.len() / 200 });
        b
    }

    /// Handles one event; true once the stream ends.
    fn on_event(&mut self, event: Event, mark: Marker) -> Result<bool, ParseError> {
        match event {
            Event::StreamEnd => return Ok(true),
            Event::DocumentStart => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(ParseError::at(mark, "a config file holds one YAML document; this is a second one (`---`)"));
                }
            }
            Event::Scalar(text, style, anchor, tag) => {
                self.last_was_block = matches!(style, TScalarStyle::Literal | TScalarStyle::Folded);
                let place = self.enter(mark, Some(&text));
                let value = if self.values { scalar(text, style, tag.as_ref()).map_err(|m| ParseError::at(mark, m))? } else { Value::Null };
                self.finish(value, anchor, Size { nodes: 1, ..Size::default() }, place, mark)?;
            }
            Event::Alias(id) => {
                self.last_was_block = false;
                let place = self.enter(mark, None);
                let Some((value, size)) = self.anchors.get(&id) else {
                    return Err(ParseError::at(mark, "an alias to an anchor that is not defined"));
                };
                let size = Size { aliases: size.aliases + 1, ..*size };
                let value = value.clone();
                if self.open.len() + size.height > MAX_DEPTH {
                    return Err(ParseError::at(
                        mark,
                        format!("this alias nests collections deeper than {MAX_DEPTH} levels (recursion limit exceeded)"),
                    ));
                }
                self.aliases += size.aliases;
                self.copied += size.nodes;
                if self.aliases > ALIAS_ALLOWANCE + ALIASES_PER_NODE * self.nodes || self.copied > MAX_COPIED {
                    return Err(ParseError::at(mark, "aliases expand too far (repetition limit exceeded)"));
                }
                self.finish(value, 0, size, place, mark)?;
            }
            Event::SequenceStart(anchor, ref tag) | Event::MappingStart(anchor, ref tag) => {
                if self.open.len() >= MAX_DEPTH {
                    return Err(ParseError::at(
                        mark,
                        format!("collections nest deeper than {MAX_DEPTH} levels (recursion limit exceeded)"),
                    ));
                }
                self.last_was_block = false;
                let place = self.enter(mark, None);
                let path = match place {
                    Place::Root => ROOT,
                    Place::At(h) => h,
                    // A complex key's children: under a path of their own, which no lookup
                    // asks for and which cannot take a real key's position.
                    Place::Key(h) => index_child(h, usize::MAX),
                };
                let kind =
                    if matches!(event, Event::SequenceStart(..)) { OpenKind::Seq(Vec::new()) } else { OpenKind::Map(Mapping::new(), None) };
                let tag = tag.as_ref().map(full_tag).filter(|t| t.starts_with('!'));
                self.open.push(Open { path, anchor, tag, inside: Size { nodes: 1, ..Size::default() }, kind });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(open) = self.open.pop() else {
                    return Err(ParseError::at(mark, "a collection ends that never started"));
                };
                let value = match open.kind {
                    _ if !self.values => Value::Null,
                    OpenKind::Seq(items) => Value::Sequence(items),
                    OpenKind::Map(map, _) => Value::Mapping(map),
                };
                let value = if self.values { tagged(open.tag, value) } else { value };
                // The place was decided when the collection started: a key when the parent
                // mapping holds no pending key now.
                let place = match self.open.last() {
                    None => Place::Root,
                    Some(Open { kind: OpenKind::Map(_, None), path, .. }) => Place::Key(key_child(*path, "")),
                    Some(_) => Place::At(open.path),
                };
                let size = Size { height: open.inside.height + 1, ..open.inside };
                self.finish(value, open.anchor, size, place, mark)?;
            }
            Event::Nothing | Event::StreamStart | Event::DocumentEnd => {}
        }
        Ok(false)
    }

    /// A node starts: records its position and says where it goes.
    fn enter(&mut self, mark: Marker, scalar: Option<&str>) -> Place {
        self.nodes += 1;
        let pos = pos(mark.line(), mark.col() + 1);
        let deep = self.open.len() > self.keep_depth;
        let Some(parent) = self.open.last_mut() else {
            return Place::Root;
        };
        if deep {
            // No position kept, none of this node's path or below: no hash is worked out.
            return match &parent.kind {
                OpenKind::Map(_, None) => Place::Key(ROOT),
                _ => Place::At(ROOT),
            };
        }
        let parent_path = parent.path;
        match &mut parent.kind {
            OpenKind::Seq(items) => {
                let h = index_child(parent_path, items.len());
                self.map.entry(h).or_insert(pos);
                Place::At(h)
            }
            OpenKind::Map(_, None) => {
                let h = key_child(parent_path, scalar.unwrap_or(""));
                self.map.entry(h).or_insert(pos);
                Place::Key(h)
            }
            OpenKind::Map(_, Some((_, h, _))) => Place::At(*h),
        }
    }

    /// A node is complete: keeps it under its anchor and puts it in its parent.
    fn finish(&mut self, value: Value, anchor: usize, size: Size, place: Place, mark: Marker) -> Result<(), ParseError> {
        if anchor != 0 {
            self.anchors.insert(anchor, (value.clone(), size));
        }
        let Some(parent) = self.open.last_mut() else {
            self.root = Some(value);
            return Ok(());
        };
        parent.inside.nodes += size.nodes;
        parent.inside.height = parent.inside.height.max(size.height);
        parent.inside.aliases += size.aliases;
        let parent_path = parent.path;
        match (&mut parent.kind, place) {
            // Without values, the items are nulls: their count is what the positions need.
            (OpenKind::Seq(items), _) => items.push(value),
            (OpenKind::Map(_, pending @ None), place) => {
                let h = match place {
                    Place::Key(h) => h,
                    Place::Root | Place::At(_) => key_child(parent_path, ""),
                };
                *pending = Some((value, h, mark));
            }
            (OpenKind::Map(map, pending @ Some(_)), _) => {
                let Some((key, _, key_mark)) = pending.take() else {
                    return Ok(());
                };
                if !self.values {
                    return Ok(());
                }
                match map.entry(key) {
                    serde_yaml::mapping::Entry::Occupied(e) => return Err(ParseError::at(key_mark, duplicate_key(e.key()))),
                    serde_yaml::mapping::Entry::Vacant(e) => {
                        e.insert(value);
                    }
                }
            }
        }
        Ok(())
    }
}

/// `serde_yaml`'s words for a key written twice.
fn duplicate_key(key: &Value) -> String {
    match key {
        Value::Null => "duplicate entry with null key".into(),
        Value::Bool(b) => format!("duplicate entry with key `{b}`"),
        Value::Number(n) => format!("duplicate entry with key {n}"),
        Value::String(s) => format!("duplicate entry with key {s:?}"),
        _ => "duplicate entry in YAML map".into(),
    }
}

fn full_tag(tag: &YamlTag) -> String {
    format!("{}{}", tag.handle, tag.suffix)
}

/// A value under a local tag (`!name`), as `serde_yaml` keeps it.
fn tagged(tag: Option<String>, value: Value) -> Value {
    match tag {
        Some(t) => Value::Tagged(Box::new(TaggedValue { tag: Tag::new(t), value })),
        None => value,
    }
}

const CORE: &str = "tag:yaml.org,2002:";

/// A scalar's value by `serde_yaml`'s rules: plain scalars are resolved (null, bool, int,
/// float, else string), quoted and block scalars are strings, core tags force a type.
fn scalar(text: String, style: TScalarStyle, tag: Option<&YamlTag>) -> Result<Value, String> {
    let plain = style == TScalarStyle::Plain;
    let Some(tag) = tag.map(full_tag) else {
        return if plain { untagged(text) } else { Ok(Value::String(text)) };
    };
    let invalid = |what: &str| format!("invalid value: string {text:?}, expected {what}");
    match tag.strip_prefix(CORE) {
        Some("bool") => parse_bool(&text).map(Value::Bool).ok_or_else(|| invalid("a boolean")),
        Some("int") => match int(&text) {
            Some(v) => v,
            None => Err(invalid("an integer")),
        },
        Some("float") => parse_f64(&text).map(|f| Value::Number(f.into())).ok_or_else(|| invalid("a float")),
        Some("null") => match is_null(&text) {
            true => Ok(Value::Null),
            false => Err(invalid("null")),
        },
        Some(_) => Ok(Value::String(text)),
        None if tag.starts_with('!') => {
            let value = if plain { untagged(text)? } else { Value::String(text) };
            Ok(tagged(Some(tag), value))
        }
        None => Ok(Value::String(text)),
    }
}

// The scalar rules below follow serde_yaml 0.9.34 (`de.rs`, MIT or Apache-2.0), so that a
// config means what it meant when serde_yaml parsed it.

fn untagged(text: String) -> Result<Value, String> {
    if text.is_empty() || is_null(&text) {
        return Ok(Value::Null);
    }
    if let Some(b) = parse_bool(&text) {
        return Ok(Value::Bool(b));
    }
    // Most scalars of a config (every key) start with a letter: no integer does, and the only
    // floats that do (`inf`, `nan`) are not finite, which YAML reads as strings.
    if text.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Ok(Value::String(text));
    }
    if let Some(v) = int(&text) {
        return v;
    }
    if !digits_but_not_number(&text)
        && let Some(f) = parse_f64(&text)
    {
        return Ok(Value::Number(f.into()));
    }
    Ok(Value::String(text))
}

fn is_null(s: &str) -> bool {
    matches!(s, "null" | "Null" | "NULL" | "~")
}

fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// An integer, an error for one too large for 64 bits, `None` for no integer.
fn int(s: &str) -> Option<Result<Value, String>> {
    if let Some(n) = parse_unsigned_int(s, u64::from_str_radix) {
        return Some(Ok(Value::Number(n.into())));
    }
    if let Some(n) = parse_negative_int(s, i64::from_str_radix) {
        return Some(Ok(Value::Number(n.into())));
    }
    if parse_unsigned_int(s, u128::from_str_radix).is_some() || parse_negative_int(s, i128::from_str_radix).is_some() {
        return Some(Err(format!("the integer {s} does not fit in 64 bits")));
    }
    None
}

type Radix<T> = fn(&str, u32) -> Result<T, std::num::ParseIntError>;

fn parse_unsigned_int<T>(s: &str, from_str_radix: Radix<T>) -> Option<T> {
    let unpositive = s.strip_prefix('+').unwrap_or(s);
    for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(rest) = unpositive.strip_prefix(prefix) {
            if rest.starts_with(['+', '-']) {
                return None;
            }
            if let Ok(n) = from_str_radix(rest, radix) {
                return Some(n);
            }
        }
    }
    if unpositive.starts_with(['+', '-']) || digits_but_not_number(s) {
        return None;
    }
    from_str_radix(unpositive, 10).ok()
}

fn parse_negative_int<T>(s: &str, from_str_radix: Radix<T>) -> Option<T> {
    for (prefix, radix) in [("-0x", 16), ("-0o", 8), ("-0b", 2)] {
        if let Some(rest) = s.strip_prefix(prefix)
            && let Ok(n) = from_str_radix(&format!("-{rest}"), radix)
        {
            return Some(n);
        }
    }
    if digits_but_not_number(s) {
        return None;
    }
    from_str_radix(s, 10).ok()
}

fn parse_f64(s: &str) -> Option<f64> {
    let unpositive = match s.strip_prefix('+') {
        Some(rest) if rest.starts_with(['+', '-']) => return None,
        Some(rest) => rest,
        None => s,
    };
    if let ".inf" | ".Inf" | ".INF" = unpositive {
        return Some(f64::INFINITY);
    }
    if let "-.inf" | "-.Inf" | "-.INF" = s {
        return Some(f64::NEG_INFINITY);
    }
    if let ".nan" | ".NaN" | ".NAN" = s {
        return Some(f64::NAN.copysign(1.0));
    }
    unpositive.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// Leading zeros followed by digits is a string in YAML 1.2 (`0123`).
fn digits_but_not_number(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    s.len() > 1 && s.starts_with('0') && s[1..].bytes().all(|b| b.is_ascii_digit())
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
        let (_, idx) = parse(text, Keep::Every).unwrap();
        assert_eq!(idx.find(&key("a")), Some((1, 1)));
        assert_eq!(idx.find(&key("a.b")), Some((2, 3)));
        let mut p = key("a.c");
        p.push(Seg::Index(0));
        p.push(Seg::Key("y".into()));
        assert_eq!(idx.find(&p), Some((5, 7)));
        assert_eq!(idx.find(&key("d")), Some((8, 1)));
        assert!(!idx.contains(&key("a.c.folded")));
    }

    /// The shallow positions are those of paths of up to three steps; deeper ones find their
    /// closest kept ancestor and say they may be missing; the value is the same either way.
    #[test]
    fn shallow_positions_stop_at_three_steps() {
        let text = "s:\n  jobs:\n    a:\n      cron: x\n      p: {q: [1]}\n    b: [1, {c: 2}]\nt: 1\n";
        let (every_value, every) = parse(text, Keep::Every).unwrap();
        let (value, shallow) = parse(text, Keep::Shallow).unwrap();
        assert_eq!(value, every_value);
        for kept in ["s", "s.jobs", "s.jobs.a", "s.jobs.b", "t"] {
            assert_eq!(shallow.find(&key(kept)), every.find(&key(kept)), "{kept}");
            assert!(shallow.reaches(&key(kept)) && every.reaches(&key(kept)), "{kept}");
        }
        assert_eq!(every.find(&key("s.jobs.a.cron")), Some((4, 7)));
        assert_eq!(shallow.find(&key("s.jobs.a.cron")), Some((3, 5)), "the job's position");
        assert!(!shallow.contains(&key("s.jobs.a.cron")) && !shallow.contains(&key("s.jobs.a.p.q")));
        assert!(!shallow.reaches(&key("s.jobs.a.cron")) && every.reaches(&key("s.jobs.a.cron")));
        let mut item = key("s.jobs.b");
        item.push(Seg::Index(1));
        assert_eq!(every.find(&item), Some((6, 12)));
        assert_eq!(shallow.find(&item), Some((6, 5)));
    }

    /// The positions found without building the value are those a whole parse finds: keys,
    /// items, anchors and aliases, a complex key, a byte order mark, a document large enough
    /// for the parser's own thread.
    #[test]
    fn positions_without_the_value_are_a_whole_parses() {
        let texts = [
            "a:\n  b: 1\n  c:\n    - x: 1\n      y: >\n        folded\n    - [2, {z: 3}]\nd: &d {e: 1}\nf: *d\n".to_string(),
            "\u{FEFF}? {scheduling: 1}\n: x\nscheduling:\n  jobs:\n    a: {cron: x}\n".to_string(),
            long_document(20_000, "s:\n  - 1\n", "last: [1, 2]\n"),
        ];
        for text in &texts {
            let (_, whole) = parse(text, Keep::Every).unwrap();
            let every = every_position(text).expect("parses");
            assert_eq!(every.map, whole.map, "{}", &text[..40.min(text.len())]);
            assert!(every.reaches(&key("s.a.b.c.d")));
        }
        assert!(every_position("a: [1, 2\n").is_none(), "a text that does not parse has none");
    }

    /// A document of many events, each key a line of its own: `n` keys, then `tail`.
    fn long_document(n: usize, head: &str, tail: &str) -> String {
        let mut text = String::from(head);
        for i in 0..n {
            text.push_str(&format!("k{i}: {i}\n"));
        }
        text.push_str(tail);
        text
    }

    /// The builder stops at an error near the top while the parser thread is far ahead and
    /// blocked on a full channel: the error is the file's, and nothing waits for ever.
    #[test]
    fn an_early_error_in_a_long_document_stops_the_parser() {
        let text = long_document(50_000, "a: 1\na: 2\n", "");
        let err = parse(&text, Keep::Every).unwrap_err();
        assert_eq!((err.line, err.col), (2, 1), "{err:?}");
        assert!(err.message.contains("duplicate entry with key \"a\""), "{err:?}");
    }

    /// A refusal after many batches of events: the events before it are built (a duplicate
    /// key among them wins, as it is found first), else the refusal is the error, at its line.
    #[test]
    fn a_late_refusal_is_reported_where_it_is() {
        let err = parse(&long_document(20_000, "", "b: [1, 2\n"), Keep::Every).unwrap_err();
        assert!(err.line >= 20_001, "{err:?}");
        let err = parse(&long_document(20_000, "k7: twice\n", "b: [1, 2\n"), Keep::Every).unwrap_err();
        assert_eq!(err.line, 9, "the duplicate before the refusal: {err:?}");
    }

    #[test]
    fn a_long_document_reads_whole() {
        let (value, idx) = parse(&long_document(20_000, "", "last: yes\n"), Keep::Every).unwrap();
        assert_eq!(value.as_mapping().map(Mapping::len), Some(20_001));
        assert_eq!(value.get("k19999").and_then(Value::as_u64), Some(19_999));
        assert_eq!(idx.find(&key("last")), Some((20_001, 1)));
    }

    /// No step down hashes to its parent: an empty key at the top is not the root.
    #[test]
    fn a_child_never_shares_its_parents_hash() {
        assert_ne!(key_child(ROOT, ""), ROOT);
        assert_ne!(index_child(ROOT, 0), ROOT);
        assert_ne!(key_child(ROOT, "a"), index_child(ROOT, 0));
        let (_, idx) = parse("\"\": 1\n", Keep::Every).unwrap();
        assert_eq!(idx.find(&key("elsewhere")), None, "only the empty key's path has a position");
    }

    #[test]
    fn parse_error_has_position() {
        let err = parse("a:\n  b: [1, 2\n", Keep::Every).unwrap_err();
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

/// The one parse against `serde_yaml`, which parsed configs before it: every YAML file and
/// front matter of the repository, the fuzzing corpus, and the scalars whose type YAML decides.
#[cfg(test)]
mod same_as_serde_yaml {
    use std::path::{Path, PathBuf};

    use super::*;

    fn serde(text: &str) -> Result<Value, String> {
        serde_yaml::from_str::<Value>(text).map_err(|e| e.to_string())
    }

    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                files(&path, out);
            } else {
                out.push(path);
            }
        }
    }

    /// The YAML of a file: all of it, or a Markdown file's front matter.
    fn yaml_of(path: &Path) -> Option<String> {
        let text = std::fs::read_to_string(path).ok()?;
        match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => Some(text),
            Some("md") => split_front_matter(&text).map(|(front, _)| front.to_string()),
            // The fuzzing corpus has no extensions.
            None => Some(text),
            _ => None,
        }
    }

    #[test]
    fn every_file_of_the_repository_reads_the_same() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut all = Vec::new();
        for dir in ["tests/fixtures", "deploy", "tests/fuzz/corpus/config_load"] {
            files(&root.join(dir), &mut all);
        }
        let (mut same, mut both_refuse) = (0, 0);
        let mut differ = Vec::new();
        for path in &all {
            let Some(text) = yaml_of(path) else { continue };
            match (serde(&text), parse(&text, Keep::Every)) {
                (Ok(a), Ok((b, _))) if a == b => same += 1,
                (Err(_), Err(_)) => both_refuse += 1,
                (a, b) => differ.push(format!("{}:\n  serde_yaml: {a:?}\n  here: {:?}", path.display(), b.map(|(v, _)| v))),
            }
        }
        assert!(differ.is_empty(), "{} files read differently:\n{}", differ.len(), differ.join("\n"));
        assert!(same >= 50, "only {same} files parsed (and {both_refuse} refused by both)");
    }

    #[test]
    fn scalars_resolve_as_serde_yaml_resolves_them() {
        let scalars = [
            "",
            "~",
            "null",
            "Null",
            "NULL",
            "nULL",
            "true",
            "True",
            "TRUE",
            "tRUE",
            "false",
            "yes",
            "no",
            "on",
            "off",
            "y",
            "0",
            "1",
            "-1",
            "+1",
            "++1",
            "+-1",
            "0123",
            "-0123",
            "0x1F",
            "0x-1",
            "-0x1F",
            "+0x1F",
            "0o17",
            "-0o17",
            "0b101",
            "-0b101",
            "0b2",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "1.5",
            "-1.5",
            "+1.5",
            "1e3",
            "1E-3",
            ".5",
            "5.",
            "1_000",
            ".inf",
            ".Inf",
            "+.inf",
            "-.inf",
            "-.INF",
            ".nan",
            ".NaN",
            "inf",
            "nan",
            "infinity",
            "1e400",
            "0.0",
            "-0.0",
            "007.5",
            "12:30",
            "2024-01-01",
            "0 3 * * *",
            "'quoted'",
            "\"7\"",
            "'true'",
            "!!str 12",
            "!!int \"12\"",
            "!!float 1",
            "!!bool yes",
            "!!null ~",
            "!!bool true",
            "!Local plain",
            "!Local '1'",
            "!Local 1",
            "|\n  block\n",
            ">\n  folded\n  text\n",
            "\"\"",
            "''",
        ];
        let mut checked = 0;
        for s in scalars {
            let text = format!("v: {s}\n");
            match (serde(&text), parse(&text, Keep::Every)) {
                (Ok(a), Ok((b, _))) => {
                    let nan = |v: &Value| v.get("v").and_then(Value::as_f64).is_some_and(f64::is_nan);
                    assert!(a == b || nan(&a) && nan(&b), "{s:?}: serde_yaml {a:?}, here {b:?}");
                    checked += 1;
                }
                (Err(_), Err(_)) => {}
                (a, b) => panic!("{s:?}: serde_yaml {a:?}, here {b:?}"),
            }
        }
        assert!(checked > 70, "{checked}");
    }

    #[test]
    fn structures_resolve_as_serde_yaml_resolves_them() {
        let docs = [
            "a: &x {b: 1, c: [1, 2]}\nd: *x\ne: [*x, *x]\n",
            "? [1, 2]\n: complex key\n1: one\ntrue: yes\n~: nothing\n",
            "<<: {a: 1}\nb: 2\n",
            "a: !Tag {b: 1}\nc: !Tag [1]\n",
            "---\na: 1\n...\n",
            "",
            "# only a comment\n",
            "- 1\n- - 2\n  - 3\n- {a: [b, {c: d}]}\n",
            "a: \"line\\nbreak \\u00e9\"\nb: 'it''s'\nc: plain text # comment\n",
            "a: |\n  no break at the end",
            "a: >\n  folded, no break",
            "a: |+\n  kept",
            "a: |-\n  stripped\n",
            "a:\n- x\n- |\n  y",
            "a: |\n  x\nb: 1",
            "a: |\n  x\n# end",
            "a: |\n  x\n ",
            "a: |\n  x\n...",
            "a: |\n  one\n    two",
            "\u{FEFF}a: 1\n",
            "a:\n  ? {b: 1}\n  : complex\n  b: 2\n",
            "base: &b {x: 1}\nuses:\n- *b\n- *b\n",
        ];
        for text in docs {
            let a = serde(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            let (b, _) = parse(text, Keep::Every).unwrap_or_else(|e| panic!("{text:?}: {e:?}"));
            assert_eq!(a, b, "{text:?}");
        }
    }

    #[test]
    fn what_serde_yaml_refuses_is_refused_with_a_position() {
        let bad = [
            ("a: 1\na: 2\n", 2, "duplicate entry with key \"a\""),
            ("a: 1\n---\nb: 2\n", 2, "one YAML document"),
            ("a: *nowhere\n", 1, ""),
            ("a: [1, 2\n", 2, ""),
            ("v: !!int twelve\n", 1, "expected an integer"),
            ("v: 99999999999999999999\n", 1, "does not fit in 64 bits"),
            ("a: 1\nb: \u{7}bell\n", 2, "control characters"),
        ];
        for (text, line, words) in bad {
            assert!(serde(text).is_err(), "serde_yaml took {text:?}");
            let e = parse(text, Keep::Every).expect_err(text);
            assert_eq!(e.line, line, "{text:?}: {e:?}");
            assert!(e.message.contains(words), "{text:?}: {e:?}");
        }
    }

    /// The block-wise check finds what a look at every character finds, wherever the
    /// character falls against the blocks (across a block's end included), among characters of
    /// one to four bytes.
    #[test]
    fn unprintable_characters_are_found_wherever_they_fall() {
        let by_char = |t: &str| {
            t.char_indices().find(|(_, c)| {
                !matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{7E}' | '\u{85}' | '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
            })
        };
        let alphabet = ['a', ' ', '\n', '\t', '\r', 'é', '€', '😀', '\u{85}', '\u{7}', '\u{7F}', '\u{9F}', '\u{FFFE}', '\u{0}'];
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut found = 0;
        for _ in 0..5_000 {
            let len = (next() % 48) as usize;
            // Mostly printable, so that the bad character comes at any offset.
            let text: String = (0..len)
                .map(
                    |_| if next() % 8 == 0 { alphabet[(next() % alphabet.len() as u64) as usize] } else { alphabet[(next() % 9) as usize] },
                )
                .collect();
            let expected = by_char(&text);
            found += usize::from(expected.is_some());
            assert_eq!(first_unprintable(&text), expected, "{text:?}");
        }
        assert!(found > 1_000, "the texts held unprintable characters: {found}");
    }

    #[test]
    fn deep_nesting_and_alias_bombs_are_refused() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        assert!(parse(&deep, Keep::Every).expect_err("200 levels").message.contains("recursion limit"));
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 0..8 {
            let (prev, next) = (char::from(b'a' + i), char::from(b'b' + i));
            bomb.push_str(&format!(
                "{next}: &{next} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
        }
        assert!(parse(&bomb, Keep::Every).expect_err("10^9 nodes").message.contains("repetition limit"));
        // Depth through an alias counts as depth in the text.
        let deep = format!("a: &a {}1{}\nb: {}*a{}\n", "[".repeat(100), "]".repeat(100), "[".repeat(100), "]".repeat(100));
        assert!(serde(&deep).is_err(), "serde_yaml refuses 200 levels through an alias");
        assert!(parse(&deep, Keep::Every).expect_err("200 levels through an alias").message.contains("recursion limit"));
    }

    /// serde_yaml counts aliases followed, not nodes copied: a large anchor used by many jobs
    /// reads.
    #[test]
    fn a_large_anchor_used_many_times_reads() {
        let mut text = String::from("base: &base\n");
        for i in 0..1_000 {
            text.push_str(&format!("  k{i}: v\n"));
        }
        text.push_str("jobs:\n");
        for i in 0..300 {
            text.push_str(&format!("  j{i}: *base\n"));
        }
        let (a, (b, _)) = (serde(&text).expect("serde_yaml reads it"), parse(&text, Keep::Every).expect("reads it"));
        assert_eq!(a, b);
    }

    /// libyaml took a quoted scalar continued less indented than its key; YAML does not, nor
    /// does yaml-rust2. Such a config is read as before (without positions).
    #[test]
    fn a_quoted_scalar_continued_less_indented_reads_as_before() {
        let text = "jobs:\n  a:\n    description: \"one\ntwo\"\n    cron: \"0 3 * * *\"\n";
        let (value, idx) = parse(text, Keep::Every).expect("read as before");
        assert_eq!(value, serde(text).expect("serde_yaml reads it"));
        assert_eq!(value["jobs"]["a"]["description"], Value::String("one two".into()));
        assert_eq!(idx.find(&[Seg::Key("jobs".into())]), None, "no positions for such a file");
        let broken = "a: \"one\ntwo\n";
        assert!(parse(broken, Keep::Every).is_err(), "what neither reads is still refused");
    }

    #[test]
    fn the_position_of_a_key_is_not_taken_by_a_complex_key_before_it() {
        let (_, idx) = parse("? {scheduling: 1}\n: x\nscheduling: {}\n", Keep::Every).expect("reads");
        assert_eq!(idx.find(&[Seg::Key("scheduling".into())]), Some((3, 1)));
    }
}
