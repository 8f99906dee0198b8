//! `file-glob.search`: the files under a directory whose path matches a glob, optionally with
//! the lines that contain a search term. The output follows the seed's `file-search` agent: one
//! path per line (relative to the working directory, so it can be passed to `file-read`), or
//! `path:line: text` lines when `search_term` is given (case-insensitive), or `No matches found`.
//!
//! Patterns are relative to `directory` (default: the working directory): `*.md` matches the top
//! level only, `**/*.md` any depth, `{a,b}` either alternative (expanded here; the `glob` crate
//! has no braces). The walk is our own, using `glob::Pattern` to match, rather than
//! `glob::glob`, because `glob::glob` follows symlinked directories (a link to `/` would walk the
//! whole disk) and lets `.*` match `..`. So:
//! - a pattern with a `..` component, or an absolute pattern outside the directory, is refused;
//! - symlinked directories are never entered, and a symlinked file is listed only when its target
//!   is a file inside the working directory;
//! - hidden names (starting with `.`) are skipped unless the pattern itself names one, so
//!   `**/*.md` does not wander through `.git`;
//! - the walk stops at [`MAX_RESULTS`] files or [`MAX_VISITED`] entries, with a note saying so.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::confine;
use super::params::Params;
use crate::{ActionContext, ActionError};

const DEFAULT_PATTERN: &str = "*.md";
/// Most files one search lists (or searches in).
const MAX_RESULTS: usize = 1000;
/// Most directory entries one search looks at.
const MAX_VISITED: usize = 200_000;
/// How deep `**` goes.
const MAX_DEPTH: usize = 64;
/// Most patterns `{…}` may expand to.
const MAX_ALTERNATIVES: usize = 64;
/// Expansion work allowed for one pattern (each group visited, duplicates included).
const MAX_EXPANSION_STEPS: usize = 4 * MAX_ALTERNATIVES;
/// Longest pattern accepted; brace matching is quadratic in it.
const MAX_PATTERN_BYTES: usize = 4096;
/// Most `path:line: text` lines one search returns.
const MAX_MATCH_LINES: usize = 2000;
/// Files larger than this are listed but not searched for `search_term`.
const MAX_SEARCH_FILE_BYTES: u64 = 8 * 1024 * 1024;
/// A matching line longer than this is cut.
const MAX_LINE_CHARS: usize = 500;

const MATCH: glob::MatchOptions =
    glob::MatchOptions { case_sensitive: true, require_literal_separator: true, require_literal_leading_dot: false };

pub(crate) async fn search(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let action = params.action();
    let root = confine::resolve(action, &ctx.working_directory, ".")?;
    let dir = confine::resolve_dir(action, &ctx.working_directory, params.str("directory"))?;
    if !dir.is_dir() {
        let shown = params.str("directory").unwrap_or(".");
        return Err(params.failed(format!("\"{shown}\" is not a directory")));
    }
    let pattern = params.str("pattern").unwrap_or(DEFAULT_PATTERN);
    if pattern.trim().is_empty() {
        return Err(params.invalid("pattern", "is empty; give a glob such as \"**/*.md\""));
    }
    // An absolute pattern may name the directory as given or as resolved.
    let given_dir = ctx.working_directory.join(params.str("directory").unwrap_or_default());
    let mut patterns = Vec::new();
    let mut texts = Vec::new();
    for alternative in expand_braces(pattern).map_err(|problem| params.invalid("pattern", problem))? {
        let relative = relative_pattern(action, pattern, &alternative, &[dir.as_path(), given_dir.as_path()])?;
        let compiled = glob::Pattern::new(&relative).map_err(|e| params.invalid("pattern", format!("is not a valid glob: {e}")))?;
        patterns.push(compiled);
        texts.push(relative);
    }
    let include_hidden = texts.iter().any(|t| t.split('/').any(|part| part.starts_with('.')));
    let max_depth =
        if texts.iter().any(|t| t.contains("**")) { MAX_DEPTH } else { texts.iter().map(|t| t.split('/').count()).max().unwrap_or(1) };
    let term = params.str("search_term").filter(|t| !t.is_empty()).map(str::to_lowercase);
    let prefix = match dir.strip_prefix(&root) {
        Ok(p) if p.as_os_str().is_empty() => String::new(),
        Ok(p) => format!("{}/", p.to_string_lossy()),
        Err(_) => String::new(),
    };

    let mut walk =
        Walk { patterns, include_hidden, max_depth, root, prefix, files: Vec::new(), visited: 0, skipped_outside: 0, stop: None };
    let cancel = ctx.cancel.clone();
    let action = action.to_owned();
    let result = tokio::task::spawn_blocking(move || {
        walk.dir(&dir, "", 1, &cancel);
        let out = walk.report(term.as_deref(), &cancel);
        (out, cancel.is_cancelled())
    })
    .await;
    match result {
        Ok((_, true)) => Err(ActionError::Cancelled { action }),
        Ok((out, false)) => Ok(Value::String(out)),
        Err(e) => Err(ActionError::Failed { action, message: format!("search task failed: {e}") }),
    }
}

/// Makes one alternative relative to the searched directory, refusing `..` and absolute
/// patterns elsewhere; errors name the pattern as the caller wrote it.
fn relative_pattern(action: &str, pattern: &str, alternative: &str, dirs: &[&Path]) -> Result<String, ActionError> {
    let reject =
        |problem: &str| ActionError::PathNotAllowed { action: action.to_owned(), path: pattern.to_owned(), problem: problem.to_owned() };
    if alternative.contains('\0') {
        return Err(reject("contains a NUL byte"));
    }
    let relative = if alternative.starts_with('/') {
        let absolute = Path::new(alternative);
        let Some(rest) = dirs.iter().find_map(|dir| absolute.strip_prefix(dir).ok()) else {
            return Err(reject("is an absolute pattern outside the directory searched"));
        };
        rest.to_string_lossy().into_owned()
    } else {
        alternative.to_owned()
    };
    let mut parts = Vec::new();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(reject("goes up with \"..\"; patterns must stay inside the directory searched")),
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        return Err(reject("names the directory itself, not files in it; use a glob such as \"**/*\""));
    }
    Ok(parts.join("/"))
}

/// Expands `{a,b}` alternatives, nested ones too, into plain glob patterns. A brace group with
/// no top-level comma is left as literal text, as `sh` leaves it.
fn expand_braces(pattern: &str) -> Result<Vec<String>, String> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(format!("is longer than {MAX_PATTERN_BYTES} bytes"));
    }
    let mut out: Vec<String> = Vec::new();
    let mut todo = vec![pattern.to_owned()];
    // Every expansion step counts, duplicates too: `{a,a}{a,a}…` must not run forever.
    let mut steps = 0usize;
    while let Some(current) = todo.pop() {
        steps += 1;
        if steps > MAX_EXPANSION_STEPS || todo.len() > MAX_EXPANSION_STEPS {
            return Err(format!("has more than {MAX_ALTERNATIVES} {{…}} alternatives"));
        }
        match first_group(&current) {
            None => {
                if !out.contains(&current) {
                    out.push(current);
                }
                if out.len() > MAX_ALTERNATIVES {
                    return Err(format!("has more than {MAX_ALTERNATIVES} {{…}} alternatives"));
                }
            }
            Some((open, close, commas)) => {
                let mut variants = Vec::with_capacity(commas.len() + 1);
                let mut start = open + 1;
                for end in commas.into_iter().chain([close]) {
                    variants.push(format!("{}{}{}", &current[..open], &current[start..end], &current[close + 1..]));
                    start = end + 1;
                }
                // Reversed so that alternatives come out in the order they were written.
                todo.extend(variants.into_iter().rev());
            }
        }
    }
    Ok(out)
}

/// The first `{…}` group with a top-level comma: the byte offsets of its braces and commas.
fn first_group(pattern: &str) -> Option<(usize, usize, Vec<usize>)> {
    let bytes = pattern.as_bytes();
    for (open, _) in bytes.iter().enumerate().filter(|(_, b)| **b == b'{') {
        let mut depth = 0usize;
        let mut commas = Vec::new();
        for (i, &b) in bytes.iter().enumerate().skip(open) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        if !commas.is_empty() {
                            return Some((open, i, commas));
                        }
                        break;
                    }
                }
                b',' if depth == 1 => commas.push(i),
                _ => {}
            }
        }
    }
    None
}

struct Walk {
    patterns: Vec<glob::Pattern>,
    include_hidden: bool,
    max_depth: usize,
    /// The canonical working directory; symlinked files must lead inside it.
    root: PathBuf,
    /// The searched directory relative to the working directory, with a trailing `/`, or empty.
    prefix: String,
    /// Matching files: the path shown, and the path to read.
    files: Vec<(String, PathBuf)>,
    visited: usize,
    skipped_outside: usize,
    /// Why the walk stopped early, if it did.
    stop: Option<String>,
}

impl Walk {
    /// Visits `dir` (whose path relative to the searched directory is `relative`) in name order.
    fn dir(&mut self, dir: &Path, relative: &str, depth: usize, cancel: &CancellationToken) {
        let mut children: Vec<_> = match std::fs::read_dir(dir) {
            Ok(entries) => entries.filter_map(Result::ok).collect(),
            Err(_) => return,
        };
        children.sort_by_key(|e| e.file_name());
        for child in children {
            if cancel.is_cancelled() || self.stop.is_some() {
                return;
            }
            self.visited += 1;
            if self.visited > MAX_VISITED {
                self.stop = Some(format!("(search stopped after {MAX_VISITED} entries; use a narrower pattern or directory)"));
                return;
            }
            let os_name = child.file_name();
            // A name that is not UTF-8 cannot match a pattern given as a string.
            let Some(name) = os_name.to_str() else {
                continue;
            };
            if !self.include_hidden && name.starts_with('.') {
                continue;
            }
            let Ok(kind) = child.file_type() else {
                continue;
            };
            let path_in_dir = if relative.is_empty() { name.to_owned() } else { format!("{relative}/{name}") };
            if kind.is_dir() {
                if depth < self.max_depth {
                    self.dir(&child.path(), &path_in_dir, depth + 1, cancel);
                }
                continue;
            }
            if !self.patterns.iter().any(|p| p.matches_with(&path_in_dir, MATCH)) {
                continue;
            }
            let path = child.path();
            if kind.is_symlink() {
                match path.canonicalize() {
                    Ok(real) if !real.starts_with(&self.root) => {
                        self.skipped_outside += 1;
                        continue;
                    }
                    Ok(real) if real.is_file() => {}
                    // A link to a directory, or a dangling one.
                    _ => continue,
                }
            }
            if self.files.len() == MAX_RESULTS {
                self.stop = Some(format!("(results cut at {MAX_RESULTS} files; use a narrower pattern)"));
                return;
            }
            self.files.push((format!("{}{path_in_dir}", self.prefix), path));
        }
    }

    fn report(&self, term: Option<&str>, cancel: &CancellationToken) -> String {
        let mut out = String::new();
        match term {
            None => {
                for (shown, _) in &self.files {
                    let _ = writeln!(out, "{shown}");
                }
            }
            Some(term) => {
                let mut lines = 0;
                'files: for (shown, path) in &self.files {
                    if cancel.is_cancelled() {
                        break;
                    }
                    let Some(text) = searchable_text(path) else {
                        continue;
                    };
                    for (number, line) in text.lines().enumerate() {
                        if !line.to_lowercase().contains(term) {
                            continue;
                        }
                        if lines == MAX_MATCH_LINES {
                            let _ = writeln!(out, "(matches cut at {MAX_MATCH_LINES} lines; use a narrower pattern or search term)");
                            break 'files;
                        }
                        lines += 1;
                        let _ = writeln!(out, "{shown}:{}: {}", number + 1, cut_line(line.trim()));
                    }
                }
            }
        }
        if out.is_empty() {
            out.push_str("No matches found");
        }
        let mut notes = Vec::new();
        if self.skipped_outside > 0 {
            notes.push(format!("({} symlinked files leading outside the working directory were skipped)", self.skipped_outside));
        }
        notes.extend(self.stop.clone());
        for note in notes {
            if !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&note);
        }
        out
    }
}

/// The file's text, or `None` for a file too large to search or one that looks binary.
fn searchable_text(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.len() > MAX_SEARCH_FILE_BYTES {
        return None;
    }
    let bytes = std::fs::read(path).ok()?;
    if bytes.iter().take(8192).any(|b| *b == 0) {
        return None;
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

fn cut_line(line: &str) -> String {
    match line.char_indices().nth(MAX_LINE_CHARS) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_expand_in_order_and_nest() {
        assert_eq!(expand_braces("*.md").expect("plain"), ["*.md"]);
        assert_eq!(expand_braces("**/*.{yaml,json}").expect("two"), ["**/*.yaml", "**/*.json"]);
        assert_eq!(expand_braces("{src,tests}/*.{rs,toml}").expect("product"), ["src/*.rs", "src/*.toml", "tests/*.rs", "tests/*.toml"]);
        assert_eq!(expand_braces("a{b,c{d,e}}").expect("nested"), ["ab", "acd", "ace"]);
        assert_eq!(expand_braces("{x}/{,a}").expect("literal group, empty alternative"), ["{x}/", "{x}/a"]);
        assert_eq!(expand_braces("{a,a}").expect("duplicates"), ["a"]);
        assert_eq!(expand_braces("{unclosed,x").expect("unclosed"), ["{unclosed,x"]);
        let bomb = "{a,b}".repeat(7);
        assert!(expand_braces(&bomb).expect_err("too many").starts_with("has more than 64"));
    }

    #[test]
    fn patterns_are_made_relative_or_refused() {
        let dir = Path::new("/work/dir");
        let rel = |p: &str| relative_pattern("g.s", p, p, &[dir]);
        assert_eq!(rel("**/*.rs"), Ok("**/*.rs".to_owned()));
        assert_eq!(rel("./src//*.rs"), Ok("src/*.rs".to_owned()));
        assert_eq!(rel("/work/dir/docs/*.md"), Ok("docs/*.md".to_owned()));
        for bad in ["../*.md", "src/../../x", "**/../*", "/etc/*", "/work/other/*.md", "/work/dir/../x/*", ".", "/work/dir", "a\0b"] {
            match rel(bad) {
                Err(ActionError::PathNotAllowed { path, .. }) => assert_eq!(path, bad),
                other => panic!("{bad:?} should be refused, got {other:?}"),
            }
        }
    }
}
