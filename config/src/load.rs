//! Loading: find the root file, read it and its imports, substitute `${VAR}`, merge, add
//! agents from Markdown and convention folders, and deserialize item by item so that one bad
//! item does not hide the errors of the next.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use serde::de::DeserializeOwned;

use crate::KeepMerged;
use crate::diag::{Diagnostic, Location, display_path};
use crate::raw::{self, RawConfig};
use crate::yaml::{self, Keep, Mapping, PositionIndex, Seg, Value, YamlPath, path_string};

/// From this size on, a file keeps only its shallow positions while it loads (see
/// [`PositionIndex`]); the rest are found by parsing it again when an error needs one. Some
/// two thousand jobs: below it, the positions cost less than a file read and parse again.
const SHALLOW_POSITIONS_FROM: usize = 512 * 1024;

/// Top-level sections of the seed system that Lamplighter knows of and ignores.
const SEED_ONLY_SECTIONS: &[&str] = &["dataverse"];

/// Names that a config may not define twice, in two files.
const COLLECTIONS: &[&[&str]] = &[
    &["agents"],
    &["workflows"],
    &["pipelines"],
    &["scheduling", "jobs"],
    &["ai", "providers"],
    &["ai", "rate_limits"],
    &["rate_limits"],
    &["mcp", "servers"],
];

/// Where the root config file was found, in SPEC §3 order.
pub fn discover(explicit: Option<&Path>, cwd: &Path) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("LAMPLIGHTER_CONFIG").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let candidates = [
        "config/lamplighter.yaml",
        "config/lamplighter.yml",
        "lamplighter.yaml",
        "lamplighter.yml",
        "config/gantri.yaml",
        "config/gantri.yml",
        "gantri.yaml",
        "gantri.yml",
    ];
    for c in candidates {
        let p = cwd.join(c);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(format!(
        "no config file found: pass --config PATH, set $LAMPLIGHTER_CONFIG, or create one of {} in {}",
        candidates.join(", "),
        cwd.display()
    ))
}

/// Where the items of one collection are defined ([`SourceMap::item_locations`]). Packed, as
/// the engine keeps it for as long as the config is in force: the names one after the other in
/// one string, and per item, in name order, where its name is in it and where it is defined
/// (32 bytes an item and its name, where a map of names took 56 and an allocation each).
#[derive(Debug, Clone, Default)]
pub struct ItemLocations {
    files: Vec<PathBuf>,
    names: String,
    items: Vec<Item>,
}

/// (file number, line, column).
type At = (u32, u32, u32);

#[derive(Debug, Clone)]
struct Item {
    /// Where the item's name is in `names`.
    name: std::ops::Range<usize>,
    /// `None` for an item no file defines.
    at: Option<At>,
}

impl ItemLocations {
    fn new(files: Vec<PathBuf>, mut items: Vec<(&str, Option<At>)>) -> Self {
        items.sort_unstable_by(|a, b| a.0.cmp(b.0));
        items.dedup_by(|a, b| a.0 == b.0);
        let mut names = String::with_capacity(items.iter().map(|(n, _)| n.len()).sum());
        let items = items
            .into_iter()
            .map(|(name, at)| {
                let start = names.len();
                names.push_str(name);
                Item { name: start..names.len(), at }
            })
            .collect();
        ItemLocations { files, names, items }
    }

    fn find(&self, name: &str) -> Option<&Item> {
        let i = self.items.binary_search_by(|it| self.names[it.name.clone()].cmp(name)).ok()?;
        self.items.get(i)
    }

    /// Whether `name` is one of the items.
    pub fn contains(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    /// `None` when `name` is not one of the items; else where it is defined, when known.
    pub fn get(&self, name: &str) -> Option<Option<Location>> {
        let at = self.find(name)?.at;
        Some(at.and_then(|(file, line, col)| {
            Some(Location { file: self.files.get(file as usize)?.clone(), line: line as usize, col: col as usize })
        }))
    }
}

/// One source file and how its positions map into the merged document.
#[derive(Debug, Clone)]
pub(crate) struct SourceFile {
    pub(crate) path: PathBuf,
    index: PositionIndex,
    /// When `index` is shallow: the file's length and modification time as it was read, and
    /// its every position, parsed again the first time a deeper path is asked for (and kept:
    /// a broken config asks for many). Not parsed again if the file has changed since.
    again: Option<ParseAgain>,
    /// Where this file's root sits in the merged document (Markdown agents sit under
    /// `agents.<name>`).
    prefix: YamlPath,
    /// Lines before the parsed text (the `---` of front matter).
    line_offset: usize,
}

/// A file's length and modification time: whether it is still the file that was read.
type Stamp = (u64, SystemTime);

/// What finds the deeper positions of a file read with shallow ones.
#[derive(Debug, Clone)]
struct ParseAgain {
    /// The file as it was read.
    stamp: Stamp,
    /// Every position, once parsed again (`None`: the file has changed or does not parse).
    every: OnceLock<Option<Arc<PositionIndex>>>,
}

impl SourceFile {
    /// The line and column of `path` (from this file's root), or of its closest ancestor that
    /// has one (the file's first line at worst).
    fn position(&self, path: &[Seg]) -> (usize, usize) {
        let index = match &self.again {
            Some(again) if !self.index.reaches(path) => {
                again.every.get_or_init(|| self.every_position(again.stamp)).as_deref().unwrap_or(&self.index)
            }
            _ => &self.index,
        };
        let (line, col) = index.find(path).unwrap_or((1, 1));
        (line + self.line_offset, col)
    }

    /// Every position of the file, read and parsed again if it is still as it was loaded.
    fn every_position(&self, stamp: Stamp) -> Option<Arc<PositionIndex>> {
        if file_stamp(&self.path)? != stamp {
            return None;
        }
        let text = std::fs::read_to_string(&self.path).ok()?;
        yaml::every_position(&text).map(Arc::new)
    }
}

/// The [`Stamp`] of the file at `path` now.
fn file_stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

/// Maps paths of the merged document back to files and positions.
#[derive(Debug, Clone, Default)]
pub struct SourceMap {
    files: Vec<SourceFile>,
    owners: HashMap<YamlPath, usize>,
}

impl SourceMap {
    /// The `file:line:col` of a path in the merged document.
    pub fn locate(&self, path: &[Seg]) -> Option<Location> {
        let owner = self.owner(path)?;
        let (line, col) = self.position_in(owner, path);
        Some(Location { file: self.files[owner].path.clone(), line, col })
    }

    /// Where each of `names`, items of the mapping at `at`, is defined: the files named once,
    /// each item by the number of its file, its line and its column. For a collection of many
    /// items, kept after the source map is dropped: a [`Location`] each would name the file
    /// again for every item.
    pub fn item_locations<'n>(&self, at: &[&str], names: impl Iterator<Item = &'n String>) -> ItemLocations {
        let mut path = keys(at);
        let items = names
            .map(|name| {
                path.push(Seg::Key(name.clone()));
                let at = self.owner(&path).map(|owner| {
                    let (line, col) = self.position_in(owner, &path);
                    let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
                    (clamp(owner), clamp(line), clamp(col))
                });
                path.pop();
                (name.as_str(), at)
            })
            .collect();
        ItemLocations::new(self.files.iter().map(|f| f.path.clone()).collect(), items)
    }

    /// The file that defines `path`: the owner of its longest owned prefix.
    fn owner(&self, path: &[Seg]) -> Option<usize> {
        (0..=path.len()).rev().find_map(|n| self.owners.get(&path[..n]).copied())
    }

    /// The line and column of `path` in file `owner`.
    fn position_in(&self, owner: usize, path: &[Seg]) -> (usize, usize) {
        let f = &self.files[owner];
        let rel = path.strip_prefix(f.prefix.as_slice()).unwrap_or(path);
        f.position(rel)
    }

    /// Every file that went into the config.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }
}

/// A path built from `.`-separated keys, for call sites that know only keys.
pub fn keys(parts: &[&str]) -> YamlPath {
    parts.iter().map(|k| Seg::Key((*k).to_string())).collect()
}

/// The result of loading: raw config, the merged YAML (for `config show`), where everything
/// came from, and which paths still hold an unset `${VAR}`.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    pub(crate) raw: RawConfig,
    /// With [`KeepMerged::WithoutJobs`], the jobs' YAML, not yet read (`raw` has none): each
    /// is read and compiled in turn, so that the YAML, the raw and the compiled jobs are never
    /// all held at once. Their keys are checked as they are read ([`job_keys_known`]).
    pub(crate) unread_jobs: Vec<(String, Value)>,
    pub(crate) merged: Value,
    pub(crate) sources: SourceMap,
    pub(crate) unset_vars: Vec<(YamlPath, String)>,
    pub(crate) root: PathBuf,
}

/// Looks up an environment variable (tests pass a map).
type EnvLookup = Box<dyn Fn(&str) -> Option<String>>;

struct Loader {
    keep: KeepMerged,
    unread_jobs: Vec<(String, Value)>,
    diags: Vec<Diagnostic>,
    sources: SourceMap,
    merged: Value,
    unset: Vec<(YamlPath, String)>,
    seen: HashSet<PathBuf>,
    env: EnvLookup,
}

/// Loads the root file and everything it pulls in. `env` looks up variables (tests pass a map).
pub(crate) fn load_with_env(root: &Path, keep: KeepMerged, env: EnvLookup) -> (Option<Loaded>, Vec<Diagnostic>) {
    let mut l = Loader {
        keep,
        unread_jobs: Vec::new(),
        diags: Vec::new(),
        sources: SourceMap::default(),
        merged: Value::Mapping(Mapping::new()),
        unset: Vec::new(),
        seen: HashSet::new(),
        env,
    };
    if !root.is_file() {
        let msg = format!("config file {} does not exist or is not a file", display_path(root));
        return (None, vec![Diagnostic::error(None, msg)]);
    }
    l.load_file(root, &[]);
    if let Some(dir) = root.parent() {
        l.load_agent_files(&dir.join("agents"));
    }
    let unknown = yaml_unknown(&l.merged);
    for u in &unknown {
        let loc = l.sources.locate(&u.0);
        l.diags.push(Diagnostic { severity: u.2, location: loc, message: u.1.clone() });
    }
    let unknown: Vec<YamlPath> = unknown.into_iter().map(|u| u.0).collect();
    let raw = l.deserialize(&unknown);
    let unread_jobs = std::mem::take(&mut l.unread_jobs);
    let loaded = raw.map(|raw| Loaded {
        raw,
        unread_jobs,
        merged: std::mem::take(&mut l.merged),
        sources: std::mem::take(&mut l.sources),
        unset_vars: std::mem::take(&mut l.unset),
        root: root.to_path_buf(),
    });
    (loaded, l.diags)
}

/// Where the jobs are: their keys are walked each as it is read ([`job_keys_known`]), not with
/// the whole document's (a million jobs' walk is a second of the loader's critical path).
pub(crate) const JOBS: &[&str] = &["scheduling", "jobs"];

/// Reports the unknown keys of the job `name`, `yaml`: whether it has none, and is to be read.
pub(crate) fn job_keys_known(sources: &SourceMap, diags: &mut Vec<Diagnostic>, name: &str, yaml: &Value) -> bool {
    let unknown = crate::schema::unknown_keys_of_item(JOBS, name, yaml);
    let known = unknown.is_empty();
    for u in unknown {
        diags.push(Diagnostic { severity: crate::diag::Severity::Error, location: sources.locate(&u.path), message: u.message });
    }
    known
}

/// Unknown keys and seed-only sections, with severities (the jobs' own keys aside).
fn yaml_unknown(merged: &Value) -> Vec<(YamlPath, String, crate::diag::Severity)> {
    let mut out = Vec::new();
    for u in crate::schema::unknown_keys_but_items(merged, JOBS) {
        if let [Seg::Key(k)] = u.path.as_slice()
            && SEED_ONLY_SECTIONS.contains(&k.as_str())
        {
            out.push((
                u.path.clone(),
                format!("section \"{k}\" belongs to the seed system and is not used by Lamplighter; it is ignored"),
                crate::diag::Severity::Warning,
            ));
            continue;
        }
        out.push((u.path, u.message, crate::diag::Severity::Error));
    }
    out
}

impl Loader {
    fn load_file(&mut self, path: &Path, chain: &[PathBuf]) {
        let canon = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        if chain.contains(&canon) {
            self.diags.push(Diagnostic::error(
                None,
                format!(
                    "import cycle: {} imports itself through {}",
                    display_path(path),
                    chain.iter().map(|p| display_path(p)).collect::<Vec<_>>().join(" -> ")
                ),
            ));
            return;
        }
        if !self.seen.insert(canon.clone()) {
            return; // imported twice (e.g. by a literal and a glob): merge once
        }
        let stamp = file_stamp(path);
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                self.diags.push(Diagnostic::error(None, format!("cannot read {}: {e}", display_path(path))));
                return;
            }
        };
        // A large file keeps its shallow positions only, if it can be read again as it was
        // (its stamp taken before it was read, and of the length read).
        let again = stamp.filter(|s| text.len() >= SHALLOW_POSITIONS_FROM && s.0 == text.len() as u64);
        let Some(value) = self.parse_into_sources(path, &text, Vec::new(), 0, again) else {
            return;
        };
        let imports = value.get("framework").and_then(|f| f.get("imports")).and_then(Value::as_sequence).cloned().unwrap_or_default();
        let file_idx = self.sources.files.len() - 1;
        self.merge_file(value, file_idx);
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut chain = chain.to_vec();
        chain.push(canon);
        for (i, imp) in imports.iter().enumerate() {
            let ipath = keys(&["framework", "imports"]).into_iter().chain([Seg::Index(i)]).collect::<Vec<_>>();
            let loc = self.locate_in(file_idx, &ipath);
            let Some(pattern) = imp.as_str() else {
                self.diags.push(Diagnostic::error(loc, "framework.imports entries must be file paths or globs"));
                continue;
            };
            let full = dir.join(pattern);
            let is_glob = pattern.contains(['*', '?', '[']);
            let mut matches: Vec<PathBuf> = if is_glob {
                match glob::glob(&full.to_string_lossy()) {
                    Ok(paths) => paths.filter_map(Result::ok).filter(|p| p.is_file()).collect(),
                    Err(e) => {
                        self.diags.push(Diagnostic::error(loc, format!("import \"{pattern}\" is not a valid glob: {e}")));
                        continue;
                    }
                }
            } else if full.is_file() {
                vec![full.clone()]
            } else {
                self.diags.push(Diagnostic::error(
                    loc,
                    format!(
                        "import \"{pattern}\" not found (looked for {}); paths are relative to the importing file",
                        display_path(&full)
                    ),
                ));
                continue;
            };
            matches.sort();
            if matches.is_empty() {
                self.diags.push(Diagnostic::warning(loc, format!("import \"{pattern}\" matches no file")));
            }
            for m in matches {
                self.load_file(&m, &chain);
            }
        }
    }

    fn locate_in(&self, file_idx: usize, path: &[Seg]) -> Option<Location> {
        let f = &self.sources.files[file_idx];
        let (line, col) = f.position(path);
        Some(Location { file: f.path.clone(), line, col })
    }

    /// Parses text, records the file and its positions, substitutes variables. With `again`
    /// (the whole file's stamp), only the shallow positions are kept.
    fn parse_into_sources(&mut self, path: &Path, text: &str, prefix: YamlPath, line_offset: usize, again: Option<Stamp>) -> Option<Value> {
        let keep = if again.is_some() { Keep::Shallow } else { Keep::Every };
        let (mut value, index) = match yaml::parse(text, keep) {
            Ok(v) => v,
            Err(e) => {
                let loc = Location { file: path.to_path_buf(), line: e.line + line_offset, col: e.col };
                self.diags.push(Diagnostic::error(Some(loc), format!("invalid YAML: {}", e.message)));
                return None;
            }
        };
        let again = again.map(|stamp| ParseAgain { stamp, every: OnceLock::new() });
        self.sources.files.push(SourceFile { path: path.to_path_buf(), index, again, prefix: prefix.clone(), line_offset });
        if value.is_null() {
            value = Value::Mapping(Mapping::new());
        }
        if !value.is_mapping() {
            let loc = self.locate_in(self.sources.files.len() - 1, &[]);
            self.diags.push(Diagnostic::error(loc, "a config file must be a mapping of sections (e.g. `scheduling:`)"));
            return None;
        }
        if may_hold_variables(text) {
            self.substitute(&mut value, &prefix);
        }
        Some(value)
    }

    /// Substitutes `${VAR}` in every string under `v`, recording the unset variables' paths.
    fn substitute(&mut self, v: &mut Value, prefix: &[Seg]) {
        let mut found = Vec::new();
        substitute_in(v, &*self.env, &mut Vec::new(), &mut found);
        for (path, var) in found {
            self.unset.push(([prefix, &path[..]].concat(), var));
        }
    }

    /// Deep-merges one file's document into the merged document.
    fn merge_file(&mut self, value: Value, file_idx: usize) {
        let mut merged = std::mem::take(&mut self.merged);
        self.merge(&mut merged, value, &mut Vec::new(), file_idx);
        self.merged = merged;
    }

    fn merge(&mut self, dst: &mut Value, src: Value, path: &mut YamlPath, file_idx: usize) {
        let s = match src {
            Value::Mapping(s) if dst.is_mapping() => s,
            src => {
                *dst = src;
                self.sources.owners.insert(path.clone(), file_idx);
                return;
            }
        };
        let Value::Mapping(d) = dst else { return };
        let is_collection =
            COLLECTIONS.iter().any(|c| path.len() == c.len() && path.iter().zip(c.iter()).all(|(a, b)| *a == Seg::Key((*b).to_string())));
        for (k, v) in s {
            let key = k.as_str().unwrap_or_default().to_string();
            path.push(Seg::Key(key.clone()));
            match d.get_mut(&k) {
                Some(existing) if is_collection => {
                    let _ = existing;
                    let first = self.sources.locate(path);
                    let second = self.locate_in(file_idx, &self.rel_path(file_idx, path));
                    let what = collection_noun(&path[..path.len() - 1]);
                    self.diags.push(Diagnostic::error(
                        second.clone(),
                        format!(
                            "{what} \"{key}\" is defined twice: in {} and in {}; rename one or remove it",
                            first.map(|l| l.to_string()).unwrap_or_default(),
                            second.map(|l| l.to_string()).unwrap_or_default()
                        ),
                    ));
                }
                Some(existing) => self.merge(existing, v, path, file_idx),
                None => {
                    d.insert(k, v);
                    self.sources.owners.insert(path.clone(), file_idx);
                }
            }
            path.pop();
        }
    }

    fn rel_path(&self, file_idx: usize, path: &[Seg]) -> YamlPath {
        let f = &self.sources.files[file_idx];
        path.strip_prefix(f.prefix.as_slice()).unwrap_or(path).to_vec()
    }

    /// `agents/*.md` (front matter + prompt) and `agents/<name>/agent.yaml` (+ `prompt.md`).
    fn load_agent_files(&mut self, dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        for p in entries {
            if p.extension().is_some_and(|e| e == "md") && p.is_file() {
                let name = p.file_stem().unwrap_or_default().to_string_lossy().to_string();
                let text = match std::fs::read_to_string(&p) {
                    Ok(t) => t,
                    Err(e) => {
                        self.diags.push(Diagnostic::error(None, format!("cannot read {}: {e}", display_path(&p))));
                        continue;
                    }
                };
                let Some((front, body)) = yaml::split_front_matter(&text) else {
                    let loc = Location { file: p.clone(), line: 1, col: 1 };
                    self.diags.push(Diagnostic::error(Some(loc), format!("agent file for \"{name}\" has no YAML front matter: start it with a `---` line, the agent's fields, and another `---`")));
                    continue;
                };
                self.add_agent(&p, &name, front, 1, Some(body.trim().to_string()));
            } else if p.is_dir() {
                let def = p.join("agent.yaml");
                if !def.is_file() {
                    continue;
                }
                let name = p.file_name().unwrap_or_default().to_string_lossy().to_string();
                let text = match std::fs::read_to_string(&def) {
                    Ok(t) => t,
                    Err(e) => {
                        self.diags.push(Diagnostic::error(None, format!("cannot read {}: {e}", display_path(&def))));
                        continue;
                    }
                };
                let prompt = std::fs::read_to_string(p.join("prompt.md")).ok().map(|s| s.trim().to_string());
                self.add_agent(&def, &name, &text, 0, prompt);
            }
        }
    }

    fn add_agent(&mut self, file: &Path, stem: &str, text: &str, line_offset: usize, prompt: Option<String>) {
        let prefix = keys(&["agents", stem]);
        let Some(mut value) = self.parse_into_sources(file, text, prefix.clone(), line_offset, None) else {
            return;
        };
        let name = value.get("name").and_then(Value::as_str).unwrap_or(stem).to_string();
        if let (Some(prompt), Value::Mapping(m)) = (prompt, &mut value)
            && !prompt.is_empty()
            && !m.contains_key("system_prompt")
        {
            m.insert(Value::String("system_prompt".into()), Value::String(prompt));
        }
        let mut agents = Mapping::new();
        agents.insert(Value::String(name.clone()), value);
        let mut doc = Mapping::new();
        doc.insert(Value::String("agents".into()), Value::Mapping(agents));
        let idx = self.sources.files.len() - 1;
        if name != stem {
            self.sources.files[idx].prefix = keys(&["agents", &name]);
        }
        self.merge_file(Value::Mapping(doc), idx);
    }

    /// Deserializes the merged document, borrowing it (it is kept for `config show`; a copy of
    /// a large config would double the peak). Collections go item by item, so every bad item
    /// is reported; an item with unknown keys was already reported and is skipped.
    fn deserialize(&mut self, unknown: &[YamlPath]) -> Option<RawConfig> {
        let mut doc = std::mem::take(&mut self.merged);
        let agents = self.take_items::<raw::Agent>(&mut doc, &["agents"], unknown);
        let workflows = self.take_items::<raw::Workflow>(&mut doc, &["workflows"], unknown);
        let pipelines = self.take_items::<raw::Pipeline>(&mut doc, &["pipelines"], unknown);
        let jobs = match self.keep {
            KeepMerged::Whole => {
                let mut unknown = unknown.to_vec();
                if let Some(items) = JOBS.iter().try_fold(&doc, |v, k| v.get(*k)).and_then(Value::as_mapping) {
                    for (k, v) in items {
                        let name = item_name(k);
                        if !job_keys_known(&self.sources, &mut self.diags, &name, v) {
                            unknown.push(job_path(&name));
                        }
                    }
                }
                self.take_items::<raw::Job>(&mut doc, JOBS, &unknown)
            }
            KeepMerged::WithoutJobs => {
                self.unread_jobs = self.take_unread(&mut doc, JOBS);
                BTreeMap::new()
            }
        };
        let providers = self.take_items::<raw::Provider>(&mut doc, &["ai", "providers"], unknown);
        let servers = self.take_items::<raw::McpServer>(&mut doc, &["mcp", "servers"], unknown);
        let item_collections: [&[&str]; 6] =
            [&["agents"], &["workflows"], &["pipelines"], &["scheduling", "jobs"], &["ai", "providers"], &["mcp", "servers"]];
        let mut raw: RawConfig = RawConfig::default();
        if let Value::Mapping(m) = &doc {
            for (k, v) in m {
                let Some(section) = k.as_str() else { continue };
                if SEED_ONLY_SECTIONS.contains(&section) || item_collections.contains(&&[section][..]) {
                    continue;
                }
                // The rest of a section is small: copy it without its item collections and
                // without whatever has an unknown key (that cannot be read; already reported).
                let nested = |key: &Value| item_collections.iter().any(|c| c.len() == 2 && c[0] == section && key.as_str() == Some(c[1]));
                let v = match v {
                    Value::Mapping(inner) => {
                        Value::Mapping(inner.iter().filter(|(k, _)| !nested(k)).map(|(k, v)| (k.clone(), v.clone())).collect())
                    }
                    other => other.clone(),
                };
                let mut one = Mapping::new();
                one.insert(k.clone(), v);
                let mut one = Value::Mapping(one);
                for p in unknown.iter().filter(|p| p.first() == Some(&Seg::Key(section.to_string()))) {
                    remove_path(&mut one, p);
                }
                if let Some(part) = self.de::<RawConfig>(&one, &[]) {
                    merge_raw(&mut raw, part);
                }
            }
        }
        self.merged = doc;
        raw.agents = Some(agents);
        raw.workflows = Some(workflows);
        raw.pipelines = Some(pipelines);
        raw.scheduling.get_or_insert_with(Default::default).jobs = Some(jobs);
        raw.ai.get_or_insert_with(Default::default).providers = Some(providers);
        raw.mcp.get_or_insert_with(Default::default).servers = Some(servers);
        Some(raw)
    }

    /// Reads the items of the collection at `at`.
    fn take_items<T: DeserializeOwned>(&mut self, doc: &mut Value, at: &[&str], unknown: &[YamlPath]) -> BTreeMap<String, T> {
        let mut out = BTreeMap::new();
        let Some(items) = self.items_at(doc, at) else {
            return out;
        };
        let base = keys(at);
        for (k, v) in items.iter() {
            let (name, path) = item_path(&base, k);
            if !unknown.iter().any(|u| u.starts_with(&path))
                && let Some(item) = self.de::<T>(v, &path)
            {
                out.insert(name, item);
            }
        }
        out
    }

    /// Takes the YAML of the collection at `at` out of `doc`, item by item with its name. The
    /// whole document's walk for unknown keys left the items out: each is walked as it is read
    /// ([`job_keys_known`]).
    fn take_unread(&mut self, doc: &mut Value, at: &[&str]) -> Vec<(String, Value)> {
        let Some(items) = self.items_at(doc, at) else {
            return Vec::new();
        };
        std::mem::take(items).into_iter().map(|(k, v)| (item_name(&k), v)).collect()
    }

    /// The mapping at `at`: `None` when absent, null, or not a mapping (reported).
    fn items_at<'d>(&mut self, doc: &'d mut Value, at: &[&str]) -> Option<&'d mut Mapping> {
        let mut node = Some(doc);
        for k in at {
            node = node.and_then(|p| p.get_mut(*k));
        }
        match node? {
            Value::Mapping(m) => Some(m),
            Value::Null => None,
            _ => {
                let base = keys(at);
                let loc = self.sources.locate(&base);
                self.diags.push(Diagnostic::error(loc, format!("\"{}\" must be a mapping of names to definitions", path_string(&base))));
                None
            }
        }
    }

    /// Reads one item from its YAML.
    fn de<T: DeserializeOwned>(&mut self, v: &Value, base: &[Seg]) -> Option<T> {
        read_item(&self.sources, &mut self.diags, v, || base.to_vec())
    }
}

/// The name of an item, from its key (a key that is not a string names none).
///
/// A copy, not the key's own string moved out: the name is kept for the life of the config,
/// and the key's string was allocated among the parse's short-lived ones. Kept, a million of
/// them held 390 MB of the parse's freed pages resident (measured: 1,108 against 718 MB
/// after a load of a million jobs).
fn item_name(key: &Value) -> String {
    key.as_str().unwrap_or_default().to_owned()
}

/// The path of the item `name` of the collection at `base`.
fn item_at(base: &[Seg], name: &str) -> YamlPath {
    let mut path = base.to_vec();
    path.push(Seg::Key(name.to_owned()));
    path
}

/// The path of the job `name`.
pub(crate) fn job_path(name: &str) -> YamlPath {
    item_at(&keys(JOBS), name)
}

/// The name and path of an item of the collection at `base`.
fn item_path(base: &[Seg], key: &Value) -> (String, YamlPath) {
    let name = item_name(key);
    let path = item_at(base, &name);
    (name, path)
}

/// Reads `v` as a `T`, with where it did not read.
///
/// Read once without tracking where it is, and again, tracking, only if that fails: keeping
/// the path of every field read (a string for each key) was most of the cost of reading a job,
/// on the thread that bounds a large config's load.
pub(crate) fn deserialize_located<T: DeserializeOwned>(v: &Value) -> Result<T, serde_path_to_error::Error<serde_yaml::Error>> {
    match T::deserialize(v) {
        Ok(t) => Ok(t),
        Err(_) => serde_path_to_error::deserialize(v),
    }
}

/// Reads one item from its YAML; what does not read is reported at its position (`base`, the
/// item's path, is asked for only then).
pub(crate) fn read_item<T: DeserializeOwned>(
    sources: &SourceMap,
    diags: &mut Vec<Diagnostic>,
    v: &Value,
    base: impl FnOnce() -> YamlPath,
) -> Option<T> {
    match deserialize_located::<T>(v) {
        Ok(t) => Some(t),
        Err(e) => {
            let path = [base(), error_path(e.path())].concat();
            let loc = sources.locate(&path);
            let inner = e.into_inner().to_string();
            let inner = inner.split(" at line ").next().unwrap_or(&inner).to_string();
            diags.push(Diagnostic::error(loc, format!("\"{}\": {inner}", path_string(&path))));
            None
        }
    }
}

/// Where a value did not read, as the config's paths are written.
pub(crate) fn error_path(path: &serde_path_to_error::Path) -> Vec<Seg> {
    path.iter()
        .filter_map(|seg| match seg {
            serde_path_to_error::Segment::Map { key } => Some(Seg::Key(key.clone())),
            serde_path_to_error::Segment::Seq { index } => Some(Seg::Index(*index)),
            _ => None,
        })
        .collect()
}

fn collection_noun(path: &[Seg]) -> &'static str {
    match path.last() {
        Some(Seg::Key(k)) => match k.as_str() {
            "agents" => "agent",
            "workflows" => "workflow",
            "pipelines" => "pipeline",
            "jobs" => "job",
            "providers" => "provider",
            "servers" => "MCP server",
            _ => "rate limit",
        },
        _ => "item",
    }
}

/// Removes the value at `path` (a key of a mapping, an item of a sequence); whether it was
/// there.
pub(crate) fn remove_path(doc: &mut Value, path: &[Seg]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut cur = Some(doc);
    for seg in parents {
        cur = match (cur, seg) {
            (Some(Value::Mapping(m)), Seg::Key(k)) => m.get_mut(k.as_str()),
            (Some(Value::Sequence(s)), Seg::Index(i)) => s.get_mut(*i),
            _ => None,
        };
    }
    match (cur, last) {
        (Some(Value::Mapping(m)), Seg::Key(k)) => m.remove(k.as_str()).is_some(),
        (Some(Value::Sequence(s)), Seg::Index(i)) if *i < s.len() => {
            s.remove(*i);
            true
        }
        _ => false,
    }
}

/// Combines top-level sections deserialized one at a time (each part sets one section).
fn merge_raw(into: &mut RawConfig, part: RawConfig) {
    macro_rules! take {
        ($($f:ident),*) => { $( if part.$f.is_some() { into.$f = part.$f; } )* };
    }
    take!(framework, ai, rate_limits, agents, pipelines, workflows, scheduling, plugins, hooks, mcp, worker, telemetry, skills);
}

/// One step of the path [`substitute_in`] is at, borrowed from the document.
#[derive(Clone, Copy)]
enum Step<'v> {
    Key(&'v str),
    Index(usize),
}

/// Whether any string of the document parsed from `text` may hold `${`: only if the text
/// does, or escapes a character (`"\x24{"` in double quotes; folding a scalar's lines puts a
/// space or a line break between them, never nothing). A config without either — a million
/// generated jobs, say — is not walked for variables.
fn may_hold_variables(text: &str) -> bool {
    text.contains("${") || text.contains('\\')
}

/// [`Loader::substitute`]'s walk: the path is made of borrowed steps, and made into a
/// [`YamlPath`] only for a variable that is unset (most keys of a large config hold none).
fn substitute_in<'v>(
    v: &'v mut Value,
    env: &dyn Fn(&str) -> Option<String>,
    path: &mut Vec<Step<'v>>,
    found: &mut Vec<(YamlPath, String)>,
) {
    match v {
        Value::String(s) if s.contains("${") => {
            let (out, unset) = substitute_str(s, env);
            for var in unset {
                let owned = path
                    .iter()
                    .map(|step| match step {
                        Step::Key(k) => Seg::Key((*k).to_string()),
                        Step::Index(i) => Seg::Index(*i),
                    })
                    .collect();
                found.push((owned, var));
            }
            *s = out;
        }
        Value::Mapping(m) => {
            for (k, child) in m.iter_mut() {
                path.push(Step::Key(k.as_str().unwrap_or_default()));
                substitute_in(child, env, path, found);
                path.pop();
            }
        }
        Value::Sequence(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                path.push(Step::Index(i));
                substitute_in(child, env, path, found);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Substitutes `${VAR}` and `${VAR:-default}` in one string. Returns the new string and the
/// names of variables that were unset without a default (those stay as written).
pub(crate) fn substitute_str(s: &str, env: &dyn Fn(&str) -> Option<String>) -> (String, Vec<String>) {
    let mut out = String::with_capacity(s.len());
    let mut unset = Vec::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let inner = &after[..end];
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        let valid = !name.is_empty()
            && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !crate::template::ROOTS.contains(&name);
        if !valid {
            out.push_str(&rest[start..start + 2 + end + 1]);
        } else {
            match (env(name), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    unset.push(name.to_string());
                    out.push_str(&rest[start..start + 2 + end + 1]);
                }
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    (out, unset)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packed table finds every item, whatever order it was given in, names that are
    /// prefixes of others included, and nothing else.
    #[test]
    fn item_locations_find_every_item_and_only_those() {
        let names = ["b", "ab", "a", "abc", "z-last", "é"];
        let items = names.iter().enumerate().map(|(i, n)| (*n, (i != 1).then_some((0, i as u32 + 1, 3)))).collect();
        let l = ItemLocations::new(vec![PathBuf::from("jobs.yaml")], items);
        for (i, n) in names.iter().enumerate() {
            assert!(l.contains(n), "{n}");
            let want = (i != 1).then(|| format!("jobs.yaml:{}:3", i + 1));
            assert_eq!(l.get(n).map(|at| at.map(|at| at.to_string())), Some(want), "{n}");
        }
        for absent in ["", "aa", "abcd", "c", "z", "zz"] {
            assert!(!l.contains(absent) && l.get(absent).is_none(), "{absent}");
        }
        assert!(!ItemLocations::default().contains("a"));
    }

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME_DIR" => Some("/home/x".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn substitution_rules() {
        assert_eq!(substitute_str("${HOME_DIR}/a", &env), ("/home/x/a".into(), vec![]));
        assert_eq!(substitute_str("${NOPE:-dflt}", &env), ("dflt".into(), vec![]));
        assert_eq!(substitute_str("${NOPE}", &env), ("${NOPE}".into(), vec!["NOPE".into()]));
        assert_eq!(substitute_str("${EMPTY:-x}", &env), ("".into(), vec![]));
        // Workflow templates are not environment variables.
        for t in ["${input}", "${input.topic}", "${steps.a.output}", "${env.HOME}"] {
            assert_eq!(substitute_str(t, &env), (t.to_string(), vec![]));
        }
        assert_eq!(substitute_str("unterminated ${X", &env).0, "unterminated ${X");
    }

    /// A variable is substituted however the text writes its `${`, escaped included; a text
    /// that is not walked has no string with `${` in it, in every style a scalar can take.
    #[test]
    fn only_texts_without_variables_are_not_walked() {
        let loaded = |text: &str| {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("lamplighter.yaml");
            std::fs::write(&file, text).unwrap();
            let (loaded, diags) = load_with_env(&file, KeepMerged::Whole, Box::new(env));
            assert!(diags.is_empty(), "{text:?}: {diags:?}");
            loaded.expect("loads").merged
        };
        for (text, dir) in [
            ("framework:\n  data_dir: ${HOME_DIR}/d\n", "/home/x/d"),
            ("framework:\n  data_dir: \"\\x24{HOME_DIR}/d\"\n", "/home/x/d"),
            ("framework:\n  data_dir: \"\\u0024\\u007BHOME_DIR}/d\"\n", "/home/x/d"),
            ("framework:\n  data_dir: \"$\\\n    {HOME_DIR}/d\"\n", "/home/x/d"),
        ] {
            assert!(may_hold_variables(text), "{text:?}");
            assert_eq!(loaded(text)["framework"]["data_dir"].as_str(), Some(dir), "{text:?}");
        }
        for text in [
            "framework:\n  data_dir: $\n    {HOME_DIR}/d\n",
            "framework:\n  data_dir: \"$\n    {HOME_DIR}/d\"\n",
            "framework:\n  data_dir: '$\n    {HOME_DIR}/d'\n",
            "framework:\n  data_dir: >\n    $\n    {HOME_DIR}/d\n",
            "framework:\n  data_dir: |\n    $\n    {HOME_DIR}/d\n",
        ] {
            assert!(!may_hold_variables(text), "{text:?}");
            let dir = loaded(text)["framework"]["data_dir"].as_str().map(str::to_owned);
            assert!(dir.as_deref().is_some_and(|d| d.contains('$') && !d.contains("${")), "{text:?}: {dir:?}");
        }
    }
}
